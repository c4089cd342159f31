//! The documents behind the filesystem: what the index holds after real
//! operations, checked with the store's own queries (the ones search and
//! rename rely on). Drives `Fs` directly, without FUSE, so large directories
//! are cheap to build.

use esfs::data::LocalDataStore;
use esfs::fs::{Ctx, Fs, FsConfig, NewNode};
use esfs::model::{Entry, ROOT_INO, encode_bytes};
use esfs::store::cache::CachedStore;
use esfs::store::embedded::EmbeddedStore;
use esfs::store::{Idx, MetaStore, Query, SearchRequest, Sort, scan};
use serde_json::json;
use std::collections::BTreeSet;
use std::sync::Arc;

struct T {
    _dir: tempfile::TempDir,
    fs: Fs,
    store: Arc<EmbeddedStore>,
}

/// A filesystem over `store`, its contents under `dir`.
fn fs_over(store: Arc<CachedStore>, dir: &std::path::Path) -> Fs {
    let data = Arc::new(LocalDataStore::open(&dir.join("data")).unwrap());
    Fs::new(
        store,
        data,
        FsConfig {
            label: "test".into(),
            ..Default::default()
        },
    )
    .unwrap()
}

/// `n` entries `f<i>` in directory `d` (at `/<dname>`), written straight to
/// the store in one bulk (what the filesystem, or another mount, would
/// write for `n` creates), with cookies from 1,000,000.
fn bulk_entries(store: &dyn MetaStore, d: u64, dname: &str, n: u64, kind: &str) {
    let ops = (0..n)
        .map(|i| {
            let name = format!("f{i:06}");
            esfs::store::BulkOp::Create {
                index: Idx::Entries,
                id: esfs::model::entry_id(d, name.as_bytes()),
                source: json!({
                    "parent": d, "name": name, "path": format!("/{dname}/{name}"),
                    "dir": format!("/{dname}"), "ino": d, "kind": kind,
                    "cookie": 1_000_000 + i, "size": 0, "mtime": 0, "mode": 0o755,
                    "uid": 0, "gid": 0
                }),
            }
        })
        .collect();
    for r in store.bulk(ops).unwrap() {
        r.unwrap();
    }
}

fn setup() -> T {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(EmbeddedStore::open(&dir.path().join("store")).unwrap());
    // Claimed as a mount claims it: this filesystem is its only writer.
    store.defer_commits().unwrap();
    // No cache: the tests also write straight to the store.
    let fs = fs_over(Arc::new(CachedStore::off(store.clone())), dir.path());
    T {
        _dir: dir,
        fs,
        store,
    }
}

impl T {
    fn mkdir(&self, parent: u64, name: &str) -> u64 {
        self.fs
            .make_node(Ctx::ROOT, parent, name.as_bytes(), NewNode::Dir, 0o755, 0)
            .unwrap()
            .ino
    }
    fn file(&self, parent: u64, name: &[u8], content: &[u8]) -> u64 {
        let (inode, fh) = self.fs.create(Ctx::ROOT, parent, name, 0o644, 0).unwrap();
        self.fs.write(inode.ino, fh, 0, content).unwrap();
        self.fs.release(inode.ino, fh).unwrap();
        inode.ino
    }
    /// Full paths of the entries matching `q`, sorted.
    fn paths(&self, q: Query) -> Vec<String> {
        let mut out = Vec::new();
        scan(
            &*self.store,
            Idx::Entries,
            q,
            vec![Sort::asc("cookie")],
            100,
            |hits| {
                out.extend(
                    hits.into_iter()
                        .map(|h| h.doc.source["path"].as_str().unwrap().to_string()),
                );
                Ok(true)
            },
        )
        .unwrap();
        out.sort();
        out
    }
    fn all_entries(&self) -> Vec<Entry> {
        let mut out = Vec::new();
        scan(
            &*self.store,
            Idx::Entries,
            Query::MatchAll,
            vec![Sort::asc("cookie")],
            1000,
            |hits| {
                out.extend(hits.into_iter().map(|h| h.doc.parse().unwrap()));
                Ok(true)
            },
        )
        .unwrap();
        out
    }
}

/// Every entry's `path`/`dir` must equal the path derived from the parent chain.
fn assert_paths_consistent(t: &T) {
    for e in t.all_entries() {
        let dir = t.fs.dir_path(e.parent).unwrap();
        assert_eq!(e.dir, dir, "dir of {e:?}");
        let want = if dir == "/" {
            format!("/{}", e.name)
        } else {
            format!("{dir}/{}", e.name)
        };
        assert_eq!(e.path, want, "path of {e:?}");
    }
}

fn range(field: &str, gte: Option<i64>, lt: Option<i64>) -> Query {
    Query::Range {
        field: field.into(),
        gte: gte.map(Into::into),
        gt: None,
        lte: None,
        lt: lt.map(Into::into),
    }
}

#[test]
fn documents_are_queryable_by_subtree_name_kind_size_and_mtime() {
    let t = setup();
    let clinton = t.mkdir(ROOT_INO, "clinton");
    let projects = t.mkdir(clinton, "projects");
    let es = t.mkdir(projects, "elasticsearch");
    t.file(es, b"README.txt", b"hello world");
    t.file(projects, b"big.bin", &vec![7u8; 100_000]);
    let other = t.mkdir(ROOT_INO, "clintonx");
    t.file(other, b"README.txt", b"");

    // One term on path.tree selects the whole subtree, and only it.
    assert_eq!(
        t.paths(Query::tree("path", "/clinton")),
        [
            "/clinton",
            "/clinton/projects",
            "/clinton/projects/big.bin",
            "/clinton/projects/elasticsearch",
            "/clinton/projects/elasticsearch/README.txt"
        ]
    );
    assert_eq!(
        t.paths(Query::term("name", "README.txt")),
        [
            "/clinton/projects/elasticsearch/README.txt",
            "/clintonx/README.txt"
        ]
    );
    assert_eq!(
        t.paths(Query::and(vec![
            Query::tree("path", "/clinton"),
            Query::term("kind", "dir")
        ])),
        [
            "/clinton",
            "/clinton/projects",
            "/clinton/projects/elasticsearch"
        ]
    );
    // Sizes and times are copied into entries when a file is closed.
    assert_eq!(
        t.paths(range("size", Some(1000), None)),
        ["/clinton/projects/big.bin"]
    );
    assert_eq!(
        t.paths(Query::and(vec![
            Query::term("kind", "file"),
            range("size", None, Some(1))
        ])),
        ["/clintonx/README.txt"]
    );
    let now_ms = esfs::model::now_ns() / 1_000_000;
    let recent = t.paths(Query::and(vec![
        Query::term("kind", "file"),
        range("mtime", Some(now_ms - 60_000), Some(now_ms + 1)),
    ]));
    assert_eq!(recent.len(), 3);
    assert!(
        t.paths(range("mtime", None, Some(now_ms - 60_000)))
            .is_empty()
    );
}

#[test]
fn directory_rename_rewrites_every_path_below_it() {
    let t = setup();
    let a = t.mkdir(ROOT_INO, "a");
    let b = t.mkdir(a, "b");
    let mut expect = BTreeSet::new();
    for i in 0..2500 {
        // More than two bulk pages.
        t.file(b, format!("f{i}").as_bytes(), b"x");
        expect.insert(format!("/z/b/f{i}"));
    }
    let c = t.mkdir(b, "c");
    t.file(c, b"deep", b"");
    t.file(ROOT_INO, b"ab", b""); // shares a string prefix, not a path prefix
    t.fs.rename(ROOT_INO, b"a", ROOT_INO, b"z", 0).unwrap();

    assert!(t.paths(Query::tree("path", "/a")).is_empty());
    let moved: BTreeSet<String> = t.paths(Query::tree("path", "/z/b")).into_iter().collect();
    expect.extend(["/z/b".to_string(), "/z/b/c".into(), "/z/b/c/deep".into()]);
    assert_eq!(moved, expect);
    assert_eq!(t.paths(Query::term("name", "ab")), ["/ab"]);
    assert_paths_consistent(&t);
    // Lookups by (parent, name) did not depend on paths and still work.
    assert_eq!(t.fs.lookup(c, b"deep").unwrap().size, 0);
}

#[test]
fn exchange_of_two_directories_swaps_their_subtrees() {
    let t = setup();
    let x = t.mkdir(ROOT_INO, "x");
    let y = t.mkdir(ROOT_INO, "y");
    let xs = t.mkdir(x, "sub");
    t.file(xs, b"from_x", b"1");
    t.file(y, b"from_y", b"2");
    t.fs.rename(ROOT_INO, b"x", ROOT_INO, b"y", libc::RENAME_EXCHANGE)
        .unwrap();
    assert_eq!(
        t.paths(Query::tree("path", "/y")),
        ["/y", "/y/sub", "/y/sub/from_x"]
    );
    assert_eq!(t.paths(Query::tree("path", "/x")), ["/x", "/x/from_y"]);
    assert_paths_consistent(&t);
}

#[test]
fn non_utf8_names_are_stored_losslessly_and_found_by_subtree() {
    let t = setup();
    let d =
        t.fs.make_node(Ctx::ROOT, ROOT_INO, b"caf\xe9", NewNode::Dir, 0o755, 0)
            .unwrap()
            .ino;
    t.file(d, b"\xff\xfe", b"");
    let enc_dir = format!("/{}", encode_bytes(b"caf\xe9"));
    let under = t.paths(Query::tree("path", &enc_dir));
    assert_eq!(
        under,
        [
            enc_dir.clone(),
            format!("{enc_dir}/{}", encode_bytes(b"\xff\xfe"))
        ]
    );
    // The JSON documents are valid UTF-8 and decode back to the bytes.
    let items = list(&t, d, 0);
    let names: Vec<&[u8]> = items.iter().map(|i| i.name.as_slice()).collect();
    assert_eq!(names, [&b"."[..], b"..", b"\xff\xfe"]);
}

/// One readdir call's items (no open handle: straight from the store).
fn list(t: &T, d: u64, offset: u64) -> Vec<esfs::fs::DirItem> {
    let mut items = Vec::new();
    t.fs.readdir(d, 0, offset, false, |it| {
        items.push(esfs::fs::DirItem {
            offset: it.offset,
            ino: it.ino,
            kind: it.kind,
            name: it.name.to_vec(),
            attr: it.attr.cloned(),
        });
        false
    })
    .unwrap();
    items
}

#[test]
fn directory_of_100k_entries_lists_completely_in_bounded_pages() {
    let t = setup();
    let d = t.mkdir(ROOT_INO, "big");
    // Write the documents in bulk so the test stays fast; then list
    // through Fs.
    let n = 100_000u64;
    bulk_entries(&*t.store, d, "big", n, "dir");
    let mut seen = BTreeSet::new();
    let mut offset = 2; // after "." and ".."
    let mut largest_page = 0;
    loop {
        let page = list(&t, d, offset);
        if page.is_empty() {
            break;
        }
        largest_page = largest_page.max(page.len());
        for it in &page {
            assert!(seen.insert(it.name.clone()), "duplicate {:?}", it.name);
        }
        offset = page.last().unwrap().offset;
    }
    assert_eq!(seen.len() as u64, n);
    assert!(
        largest_page <= 1024,
        "pages are bounded, got {largest_page}"
    );
}

#[test]
fn entry_ids_are_realtime_gets_and_searchable_fields_match_inodes() {
    let t = setup();
    let ino = t.file(ROOT_INO, b"f", b"12345");
    let e = t
        .store
        .get(Idx::Entries, &esfs::model::entry_id(ROOT_INO, b"f"))
        .unwrap()
        .unwrap();
    assert_eq!(e.source["ino"], json!(ino));
    assert_eq!(e.source["size"], json!(5));
    let i = t.store.get(Idx::Inodes, &ino.to_string()).unwrap().unwrap();
    assert_eq!(i.source["links"], json!([{"p": ROOT_INO, "n": "f"}]));
    // A search over readdir's field sorted by the readdir cookie.
    let hits = t
        .store
        .search(&SearchRequest {
            past_own_writes: false,
            index: Idx::Entries,
            query: Query::term("parent", ROOT_INO),
            sort: vec![Sort::asc("cookie")],
            search_after: None,
            size: 10,
        })
        .unwrap();
    assert_eq!(hits.len(), 1);
}

/// The listings the write-through cache keeps in memory follow every kind
/// of namespace change exactly: after thousands of random creates, mkdirs,
/// links, renames (plain, over a name, NOREPLACE, EXCHANGE, across
/// directories), unlinks and rmdirs, each directory's cached listing and
/// readdir through `Fs` equal the store's own search. A tiny budget runs
/// the same with directories evicted all the time.
#[test]
fn cached_listings_match_the_store_after_random_namespace_changes() {
    use esfs::fs::{RENAME_EXCHANGE, RENAME_NOREPLACE};
    // The shared mode (as on Elasticsearch, with a TTL longer than the
    // test) also fills listings from readdir's searches and drops them on
    // conflicts, so it may not know every directory.
    for (budget, shared) in [(64 << 20, false), (4 << 10, false), (64 << 20, true)] {
        let dir = tempfile::tempdir().unwrap();
        let inner = Arc::new(EmbeddedStore::open(&dir.path().join("store")).unwrap());
        inner.defer_commits().unwrap();
        let cached = Arc::new(if shared {
            CachedStore::shared(
                inner.clone(),
                8 << 20,
                budget,
                std::time::Duration::from_secs(600),
            )
        } else {
            CachedStore::new(inner.clone(), 8 << 20, budget)
        });
        let fs = fs_over(cached.clone(), dir.path());
        // xorshift: deterministic, no dependency.
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        let names: Vec<Vec<u8>> = ["a", "b", "c", "d", "e", "f"]
            .iter()
            .map(|s| s.as_bytes().to_vec())
            .chain([b"\xff\xfe".to_vec()])
            .collect();
        let mut dirs = vec![ROOT_INO];
        let mut ok = 0;
        let mut verified = 0;
        for step in 0..3000 {
            let d = dirs[rnd(dirs.len())];
            let n = &names[rnd(names.len())];
            let r = match rnd(8) {
                0 | 1 => fs.create(Ctx::ROOT, d, n, 0o644, 0).map(|(i, fh)| {
                    fs.release(i.ino, fh).unwrap();
                }),
                2 => fs
                    .make_node(Ctx::ROOT, d, n, NewNode::Dir, 0o755, 0)
                    .map(|i| dirs.push(i.ino)),
                3 => fs
                    .lookup(d, n)
                    .and_then(|i| fs.link(i.ino, dirs[rnd(dirs.len())], &names[rnd(names.len())]))
                    .map(drop),
                4 | 5 => {
                    let flags = [0, 0, RENAME_NOREPLACE, RENAME_EXCHANGE][rnd(4)];
                    let (d2, n2) = (dirs[rnd(dirs.len())], &names[rnd(names.len())]);
                    fs.rename(d, n, d2, n2, flags)
                }
                6 => fs.unlink(d, n),
                _ => fs.rmdir(d, n),
            };
            ok += r.is_ok() as u32;
            if step % 500 != 499 {
                continue;
            }
            for &d in &dirs {
                let truth: Vec<(String, u64, String, u64)> = t_search(&*inner, d);
                let mut mem = Vec::new();
                let known = cached.cached_children(d, 0, &mut |c| {
                    mem.push((c.name.to_string(), c.ino, c.kind.to_string(), c.cookie));
                    false
                });
                if known.is_some() {
                    assert_eq!(mem, truth, "cached listing of {d} at step {step}");
                    verified += !mem.is_empty() as u32;
                } else {
                    let removed = fs.getattr(d).map_or(true, |i| i.nlink == 0);
                    assert!(
                        budget < 1 << 20 || shared || removed,
                        "directory {d} not cached"
                    );
                }
                // readdir through Fs, from an open handle, in small steps.
                let Some(listed) = read_by_handle(&fs, d, 3, &|| {}) else {
                    assert!(truth.is_empty(), "removed directory {d} has entries");
                    continue;
                };
                let want: Vec<Vec<u8>> = [b".".to_vec(), b"..".to_vec()]
                    .into_iter()
                    .chain(truth.iter().map(|t| esfs::model::decode_bytes(&t.0)))
                    .collect();
                assert_eq!(listed, want, "readdir of {d} at step {step}");
            }
        }
        assert!(ok > 1000, "only {ok} operations succeeded");
        assert!(
            budget < 1 << 20 || verified > 20,
            "only {verified} listings checked"
        );
    }
}

/// A directory another mount filled, bigger than one search page, read
/// whole through an open handle in the kernel's reply-sized steps: the
/// pages together become the mount's listing (shared mode, as on
/// Elasticsearch), which then follows this mount's writes; a write under the
/// directory while the pages are read keeps them from becoming one.
#[test]
fn a_directory_read_whole_in_pages_becomes_a_listing() {
    let dir = tempfile::tempdir().unwrap();
    let inner = Arc::new(EmbeddedStore::open(&dir.path().join("store")).unwrap());
    inner.defer_commits().unwrap();
    let ttl = std::time::Duration::from_secs(2);
    let cached = Arc::new(CachedStore::shared(inner.clone(), 8 << 20, 64 << 20, ttl));
    let fs = fs_over(cached.clone(), dir.path());
    let d = fs
        .make_node(Ctx::ROOT, ROOT_INO, b"big", NewNode::Dir, 0o755, 0)
        .unwrap()
        .ino;
    // 2500 names written behind this mount's back (another mount's).
    bulk_entries(&*inner, d, "big", 2500, "file");
    let memory = || {
        let mut mem = Vec::new();
        cached.cached_children(d, 0, &mut |c| {
            mem.push((c.name.to_string(), c.ino, c.kind.to_string(), c.cookie));
            false
        })?;
        Some(mem)
    };
    // Read through a handle, 500 names per reply.
    let read_all = |between: &dyn Fn()| read_by_handle(&fs, d, 500, between).unwrap().len() - 2;
    // This mount's listing from the mkdir is empty: it lists the 2500 only
    // once that copy expired.
    assert_eq!(read_all(&|| {}), 0, "trusted for the TTL");
    std::thread::sleep(ttl + std::time::Duration::from_millis(100));
    assert!(memory().is_none());
    // A create under it while the pages are read: not kept.
    let create = |name: &[u8]| {
        let (i, fh) = fs.create(Ctx::ROOT, d, name, 0o644, 0).unwrap();
        fs.release(i.ino, fh).unwrap();
    };
    // (The new name's cookie may fall before the pages' cursor: a name
    // created during a listing may or may not be listed.)
    assert!((2500..=2501).contains(&read_all(&|| create(b"during"))));
    assert!(
        memory().is_none(),
        "a write landed while the pages were read"
    );
    // Read whole with nothing written meanwhile: kept, exact, and it
    // follows this mount's writes.
    assert_eq!(read_all(&|| {}), 2501);
    assert_eq!(memory().expect("kept as a listing"), t_search(&*inner, d));
    create(b"after");
    fs.unlink(d, b"during").unwrap();
    assert_eq!(memory().unwrap(), t_search(&*inner, d));
    assert_eq!(read_all(&|| {}), 2501);
}

/// `d`'s names (dots included) through an open handle, `reply` per
/// readdir call as the kernel asks for them; `between` runs after the
/// first call. `None`: it cannot be opened.
fn read_by_handle(fs: &Fs, d: u64, reply: usize, between: &dyn Fn()) -> Option<Vec<Vec<u8>>> {
    let fh = fs.opendir(d).ok()?;
    let (mut names, mut offset) = (Vec::new(), 0);
    loop {
        let mut page = Vec::new();
        fs.readdir(d, fh, offset, false, |it| {
            page.push((it.name.to_vec(), it.offset));
            page.len() == reply
        })
        .unwrap();
        let Some(last) = page.last() else { break };
        if offset == 0 {
            between();
        }
        offset = last.1;
        names.extend(page.into_iter().map(|p| p.0));
    }
    fs.releasedir(fh);
    Some(names)
}

/// A directory's children by the store's search: (name, ino, kind, cookie).
fn t_search(store: &dyn MetaStore, d: u64) -> Vec<(String, u64, String, u64)> {
    store
        .search_fields(
            &SearchRequest {
                past_own_writes: false,
                index: Idx::Entries,
                query: Query::term("parent", d),
                sort: vec![Sort::asc("cookie")],
                search_after: None,
                size: 10_000,
            },
            &["name", "ino", "kind", "cookie"],
        )
        .unwrap()
        .into_iter()
        .map(|r| {
            (
                r[0].as_str().unwrap().to_string(),
                r[1].as_u64().unwrap(),
                r[2].as_str().unwrap().to_string(),
                r[3].as_u64().unwrap(),
            )
        })
        .collect()
}
