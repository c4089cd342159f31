//! A directory rename inside the overlay: decided on the syscall path
//! ([`Overlay::rebase`]), its subtree rewritten after the rename answered
//! ([`Overlay::settle`]), the lock records decided meanwhile held back
//! until then ([`Overlay::hold_back`]). See docs/delegations.md, "The
//! rewrite after the answer".

use std::sync::Arc;

use serde_json::Value;

use super::{Encoded, Idx, Key, Overlay, Record, Slot, State, next_local, slot_weight};

impl Overlay {
    /// A directory rename's path rewrite (see `MetaStore::rebase_paths`),
    /// decided here when the moved directory (its entry already at `new`)
    /// and every directory below it were made under the delegation: then
    /// every document below `old` has a slot. Returns the ids of the
    /// entries below `old`, whose `path` and `dir` [`Overlay::settle`]
    /// rewrites once the rename has answered; `None`, nothing changed, the
    /// cluster's way.
    ///
    /// O(subtree) in the check, a range of the path index (`old/` up to
    /// `old0`, '0' following '/'), and the ids; the rewrite, two thirds of
    /// a 300-file rename's CPU with its op-log records, comes after.
    pub(crate) fn rebase(&mut self, old: &str, new: &str) -> Option<Vec<String>> {
        debug_assert!(self.moved.is_none(), "settled first");
        // Packed entries are unpacked to be rewritten, and stay so until
        // flushed: only if that fits the budget (about four times their
        // packed weight), else the cluster's way (pages passing, a few
        // thousand unpacked at a time). Unpacking 100 000 took the mount
        // from 821 to 1137 MiB.
        let moved = self.paths.range((new.to_string(), String::new())..);
        let moved = moved.take_while(|(p, _)| p == new);
        let packed: Vec<(Key, usize)> = (moved.chain(self.paths.range(Self::below(old))))
            .map(|(_, id)| (Idx::Entries, id.clone()))
            .filter_map(|k| match &self.slots[&k] {
                s @ Slot {
                    state: State::Packed { .. },
                    ..
                } => Some((k, s.weight)),
                _ => None,
            })
            .collect();
        let growth = 3 * packed.iter().map(|(_, w)| w).sum::<usize>();
        if !packed.is_empty() && self.budget.held + growth > self.budget.bytes {
            return None;
        }
        for (key, _) in &packed {
            self.unpack(key);
        }
        if !self.rebase_check(old, new) {
            return None;
        }
        let ids = self
            .paths
            .range(Self::below(old))
            .map(|(_, id)| id.clone())
            .collect();
        self.moved = Some((old.to_string(), new.to_string()));
        Some(ids)
    }

    /// Every read of an entry, every write but a lock document's, every
    /// flush comes after the rewrite of a rename decided before it.
    pub(super) fn assert_settled(&self) {
        debug_assert!(
            self.moved.is_none(),
            "an access before the rename's rewrite"
        );
    }

    /// Whether a directory rename waits to be rewritten ([`Overlay::settle`]).
    pub(crate) fn unsettled(&self) -> bool {
        self.moved.is_some()
    }

    /// Keep the records of lock documents decided while a rename waits to
    /// be rewritten, for [`Overlay::settle`] to hand to the log after the
    /// rewrite's: logged now, a crash before the rewrite is logged would
    /// replay the rename's release without its paths. Unlogged, it replays
    /// as a rename whose owner died under its tree locks, whose intent the
    /// next mount rolls forward.
    pub(crate) fn hold_back(&mut self, records: Vec<Record>) {
        self.held_back.extend(records);
    }

    /// Carry out the directory rename [`Overlay::rebase`] decided: the
    /// entries below its old path get `path` and `dir` below the new one,
    /// each a new local version and a place in the next flush, as a
    /// partial update would. Returns their keys (to log with
    /// [`Overlay::moved_paths`]) and the records held back meanwhile
    /// ([`Overlay::hold_back`]), to log after them; `None` if nothing
    /// waited. Every access but a lock document's decision and a few
    /// questions that read no entry settles first (`DelegatedStore`), so
    /// the rewrite finds the subtree as the decision checked it.
    pub(crate) fn settle(&mut self) -> Option<(Vec<Key>, Vec<Record>)> {
        let (old, new) = self.moved.take()?;
        let (old, new) = (old.as_str(), new.as_str());
        // Taken out of the index whole (owned, no copy of either string),
        // rewritten in place, put back: per entry the work is its two
        // strings and its slot.
        let below: Vec<(String, String)> =
            self.paths.extract_if(Self::below(old), |_| true).collect();
        // Both strings of each entry grow by this many bytes (as do the
        // path index's copy); see `slot_weight`.
        let grown = new.len() as isize - old.len() as isize;
        let mut keys = Vec::with_capacity(below.len());
        for (mut path, id) in below {
            path.replace_range(..old.len(), new);
            let key = (Idx::Entries, id);
            let slot = self.slots.get_mut(&key).expect("checked");
            let State::Doc(d) = &mut slot.state else {
                unreachable!("checked")
            };
            let doc = Arc::make_mut(d).as_object_mut().expect("checked");
            if let Some(Value::String(dir)) = doc.get_mut("dir") {
                dir.replace_range(..old.len(), new);
            }
            if let Some(Value::String(p)) = doc.get_mut("path") {
                p.clone_from(&path);
            }
            // Its document's `path` and `dir` (counted twice, see
            // `slot_weight`) and the index's path.
            let weight = slot.weight.saturating_add_signed(5 * grown);
            self.budget.held = self.budget.held - slot.weight + weight;
            slot.weight = weight;
            debug_assert_eq!(slot.weight, slot_weight(&key, slot));
            slot.stamp = 0;
            slot.local = Some(next_local(&mut self.next, slot.base));
            if !slot.dirty {
                slot.dirty = true;
                self.dirty.push(key.clone());
            }
            self.paths.insert((path, key.1.clone()));
            keys.push(key);
        }
        Some((keys, std::mem::take(&mut self.held_back)))
    }

    /// The path index's range of everything strictly below `old` (`old/`
    /// up to `old0`, '0' following '/').
    fn below(old: &str) -> std::ops::Range<(String, String)> {
        (format!("{old}/"), String::new())..(format!("{old}0"), String::new())
    }

    /// [`Overlay::rebase`]'s preconditions, checked before anything
    /// changes: the moved directory's entry is at `new`, and every entry
    /// below `old` has a slot written here, its `dir` below `old`, and is
    /// a directory whose every name is here or a file.
    fn rebase_check(&self, old: &str, new: &str) -> bool {
        let entry = |id: &str| match self.slots.get(&(Idx::Entries, id.to_string())) {
            Some(Slot {
                state: State::Doc(d),
                local: Some(_),
                ..
            }) => Some(d),
            _ => None,
        };
        let complete = |d: &Value| {
            d["ino"]
                .as_u64()
                .is_some_and(|i| self.complete.contains(&i))
        };
        // The moved directory: its entry, already at `new`.
        let moved = self
            .paths
            .range((new.to_string(), String::new())..)
            .take_while(|(p, _)| p == new)
            .filter_map(|(_, id)| entry(id))
            .any(|d| d["kind"] == "dir" && complete(d));
        // A document passing to the cluster (the indexer's text) is not
        // rewritten here: its slot's next flush would be conditional on
        // the version from before the passing write, and be refused.
        let passing = |id: &str| {
            !self.passing.is_empty() && self.passing.contains(&(Idx::Entries, id.to_string()))
        };
        moved
            && self.paths.range(Self::below(old)).all(|(_, id)| {
                !passing(id)
                    && entry(id).is_some_and(|d| {
                        let dir_ok = d["dir"].as_str().is_some_and(|p| p.starts_with(old));
                        let path_ok = d["path"].is_string();
                        dir_ok && path_ok && (d["kind"] != "dir" || complete(d))
                    })
            })
    }

    /// The log records of a rebase of `keys` ([`Overlay::rebase`]): their
    /// new `path` and `dir` only, borrowed from the slots. A whole state
    /// per entry took more of a directory rename's time than the rename.
    pub(crate) fn moved_paths<'a>(&'a self, keys: &'a [Key]) -> Vec<Encoded<'a>> {
        keys.iter()
            .filter_map(|key| {
                let slot = self.slots.get(key)?;
                let State::Doc(d) = &slot.state else {
                    return None;
                };
                let (path, dir) = (d["path"].as_str()?, d["dir"].as_str()?);
                Some(Encoded::paths(key.0, &key.1, path, dir, slot.base))
            })
            .collect()
    }
}
