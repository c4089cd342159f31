//! The indices and their searchable fields, declared once for every backend:
//! the embedded store turns each field into an indexed column, the
//! Elasticsearch backend into a mapping. Only declared fields can be queried
//! or sorted on; everything else in a document is stored but not indexed.
//!
//! Document layout (see `crate::model` for the code that builds them):
//! - `entries`: one document per name in the tree; `_id` = `<parent ino>/<name>`
//!   (or `<parent ino>//<base64url(name)>` when the name is not UTF-8), so the
//!   (parent, name) lookup is a realtime get by id and always under 512 bytes.
//!   `path` is the full path (`path.tree` selects a subtree), `dir` the parent
//!   directory's path (the `path` of the file-system example in Elasticsearch:
//!   The Definitive Guide, chapter "Handling Relationships"), plus copies of the searchable
//!   attributes of the inode.
//! - `inodes`: one document per inode (`_id` = inode number): attributes,
//!   xattrs, symlink target, content key and back-links to its names.
//! - `texts`: the text of a regular file, for content search (`_id` = inode
//!   number), written only by the content indexer: apart from the entries,
//!   so that renaming a directory (which rewrites its subtree's entries) and
//!   the attribute copies every close writes do not analyse the text again.
//! - `locks`: lock documents (global, per-document, tree locks) and intents.
//! - `meta`: the superblock and the id allocator.
//! - `chunks`: file contents in fixed-size chunks (`_id` = `<key>:<n>`), when
//!   contents live in the cluster rather than a data directory.

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Idx {
    Entries,
    Inodes,
    Locks,
    Meta,
    /// File contents as chunk documents (Elasticsearch mode without --data).
    Chunks,
    /// Files' text for content search (last: the embedded store's redo
    /// log names indices by their discriminant).
    Texts,
}

impl Idx {
    pub const ALL: [Idx; 6] = [
        Idx::Entries,
        Idx::Inodes,
        Idx::Locks,
        Idx::Meta,
        Idx::Chunks,
        Idx::Texts,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Idx::Entries => "entries",
            Idx::Inodes => "inodes",
            Idx::Locks => "locks",
            Idx::Meta => "meta",
            Idx::Chunks => "chunks",
            Idx::Texts => "texts",
        }
    }

    /// Whether its documents have `Text` fields (which brief reads leave out).
    pub fn has_text(self) -> bool {
        self.fields().iter().any(|f| f.ty == FieldType::Text)
    }

    /// The names of its `Text` fields.
    pub fn text_fields(self) -> impl Iterator<Item = &'static str> {
        self.fields()
            .iter()
            .filter(|f| f.ty == FieldType::Text)
            .map(|f| f.name)
    }

    pub fn fields(self) -> &'static [Field] {
        match self {
            Idx::Entries => ENTRY_FIELDS,
            Idx::Inodes => INODE_FIELDS,
            Idx::Locks => LOCK_FIELDS,
            Idx::Meta => &[],
            Idx::Chunks => CHUNK_FIELDS,
            Idx::Texts => TEXT_FIELDS,
        }
    }

    pub fn field(self, name: &str) -> Option<&'static Field> {
        self.fields().iter().find(|f| f.name == name)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldType {
    /// Exact string (ES `keyword`).
    Keyword,
    /// Exact string plus a full-text sub-field `<name>.text`.
    KeywordText,
    /// Full path: keyword plus `<name>.tree` (path_hierarchy tokenizer).
    Path,
    /// Signed 64-bit integer (ES `long`).
    Long,
    /// Milliseconds since the epoch (ES `date`, format `epoch_millis`).
    Date,
    Bool,
    /// Full text (a file's contents): indexed by trigrams, so a query can ask
    /// for any substring of 3+ characters (`Query::Text`), case-folded.
    /// Stored apart from the metadata and left out of "brief" reads
    /// (`MetaStore::get_brief`/`search_brief`). Not sortable.
    Text,
    /// Multi-valued exact strings: an array of keywords (a single string is
    /// one value). Term/terms/prefix/exists queries match any value. Not sortable.
    Keywords,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    pub name: &'static str,
    pub ty: FieldType,
}

const fn f(name: &'static str, ty: FieldType) -> Field {
    Field { name, ty }
}

use FieldType::*;

pub(crate) const ENTRY_FIELDS: &[Field] = &[
    f("parent", Long),
    f("name", KeywordText),
    f("path", Path),
    f("dir", Keyword),
    f("ino", Long),
    f("kind", Keyword),
    f("cookie", Long),
    f("size", Long),
    f("mtime", Date),
    f("uid", Long),
    f("gid", Long),
    f("mode", Long),
    // Content search (`esfs search`): what the indexer made of the file
    // ("text": its text is in `texts`, "binary", "too_large"; absent = not
    // indexed yet), and its xattrs as "name=value" / "name" keywords. (The
    // text itself lived here as `contents` before the `texts` index; an
    // entry's `indexed` field from then is not read.)
    f("text_state", Keyword),
    // The inode's mtime (ns) the text was taken at: a column so a brief
    // read of an entry from the index's columns has it (Elasticsearch
    // reads a brief listing from doc values, see `store::es::query`).
    f("text_mtime_ns", Long),
    f("xattrs", Keywords),
];

pub(crate) const INODE_FIELDS: &[Field] = &[f("kind", Keyword), f("orphan", Bool)];

pub(crate) const LOCK_FIELDS: &[Field] = &[
    f("type", Keyword),
    f("owner", Keyword),
    f("path", Keyword),
    f("since", Date),
    f("expires", Date),
];

/// A file's text (`_id` = inode number): `ino` to page through them, the
/// inode's mtime (ns) the text was read at.
pub(crate) const TEXT_FIELDS: &[Field] =
    &[f("ino", Long), f("contents", Text), f("mtime_ns", Long)];

pub(crate) const CHUNK_FIELDS: &[Field] = &[f("file", Keyword), f("n", Long)];
