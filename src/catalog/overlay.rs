//! Changes to a catalog not merged into it yet ([`Overlay`]: what a batch
//! plans against), and the in-place merge of sorted records.
//!
//! Pure data structure work on records in memory; no text, no I/O.

use super::model::{Catalog, OutputRecord};
use std::collections::BTreeMap;
use time::OffsetDateTime;

/// A catalog plus changes not merged into it yet: what a batch plans
/// against. Recording a bundle's changes costs O(changes · log), not a pass
/// over every record, and the merge happens once at the end.
#[derive(Debug)]
pub struct Overlay {
    base: Catalog,
    /// Upserted records (`Some`) and removed paths (`None`), by path.
    changes: BTreeMap<String, Option<OutputRecord>>,
}

impl Overlay {
    pub fn new(base: Catalog) -> Overlay {
        Overlay {
            base,
            changes: BTreeMap::new(),
        }
    }

    /// The catalog before any change was recorded.
    pub fn base(&self) -> &Catalog {
        &self.base
    }

    /// The record at `path` with the changes applied.
    pub fn get(&self, path: &str) -> Option<&OutputRecord> {
        match self.changes.get(path) {
            Some(change) => change.as_ref(),
            None => self.base.get(path),
        }
    }

    /// The first record (changes applied) whose path is `key` or after it.
    pub fn first_from(&self, key: &str) -> Option<&OutputRecord> {
        let from_base = self.base.outputs[self.base.first_index_from(key)..]
            .iter()
            .find(|r| !matches!(self.changes.get(r.path.as_str()), Some(None)));
        let from_changes = self
            .changes
            .range::<str, _>((std::ops::Bound::Included(key), std::ops::Bound::Unbounded))
            .find_map(|(_, change)| change.as_ref());
        match (from_base, from_changes) {
            (Some(b), Some(c)) if c.path.as_str() <= b.path.as_str() => Some(c),
            (Some(b), _) => Some(b),
            (None, c) => c,
        }
    }

    /// Every record (changes applied), sorted by path.
    pub fn iter(&self) -> impl Iterator<Item = &OutputRecord> {
        let mut base = self.base.outputs.iter().peekable();
        let mut changes = self.changes.iter().peekable();
        std::iter::from_fn(move || {
            loop {
                let take_change = match (base.peek(), changes.peek()) {
                    (None, None) => return None,
                    (Some(_), None) => false,
                    (None, Some(_)) => true,
                    (Some(b), Some((path, _))) => path.as_str() <= b.path.as_str(),
                };
                if !take_change {
                    return base.next();
                }
                let (path, change) = changes.next()?;
                if base
                    .peek()
                    .is_some_and(|b| b.path.as_str() == path.as_str())
                {
                    base.next();
                }
                if let Some(record) = change {
                    return Some(record);
                }
            }
        })
    }

    /// Records upserts (each replacing any record at its path) and removals.
    pub fn record(&mut self, upserts: &[OutputRecord], removes: &[String]) {
        for path in removes {
            self.changes.insert(path.clone(), None);
        }
        for r in upserts {
            self.changes
                .insert(r.path.as_str().to_owned(), Some(r.clone()));
        }
    }

    /// Merges the changes in one pass; `now` becomes `updated_at`.
    pub fn into_catalog(self, now: OffsetDateTime) -> Catalog {
        self.merge(now)
    }

    fn merge(self, now: OffsetDateTime) -> Catalog {
        let Overlay { mut base, changes } = self;
        // In place: replaced records swapped, removed ones dropped in one
        // pass, new ones merged in (merge_by_path). A large tree's catalog
        // is tens of MiB and never held twice; a small change into it
        // moves few records.
        let records = &mut base.outputs;
        let mut added = Vec::new();
        let mut gone = Vec::new();
        for (path, change) in changes {
            let at = records.binary_search_by(|r| r.path.as_str().cmp(path.as_str()));
            match (at, change) {
                (Ok(i), Some(r)) => records[i] = r,
                (Ok(i), None) => gone.push(i),
                (Err(_), Some(r)) => added.push(r),
                (Err(_), None) => {}
            }
        }
        if !gone.is_empty() {
            let mut gone = gone.into_iter().peekable();
            let mut i = 0;
            records.retain(|_| {
                let keep = gone.next_if_eq(&i).is_none();
                i += 1;
                keep
            });
        }
        merge_by_path(records, added);
        base.updated_at = now;
        base.distributor_version = Some(env!("CARGO_PKG_VERSION").to_owned());
        base
    }
}

/// Merges `added` into `records`, both sorted by path (no path in both),
/// in place: from the last added record back, the old records after its
/// place move right by the number of added records still to place, each
/// old record at most once (none before the first added one's place), and
/// no second array of records is made (a small change into a large
/// catalog moves a few records, or none; a large one never holds the
/// records twice).
pub fn merge_by_path(records: &mut Vec<OutputRecord>, added: Vec<OutputRecord>) {
    debug_assert!(added.is_sorted_by(|a, b| a.path.as_str() < b.path.as_str()));
    let Some(first) = added.first() else {
        return;
    };
    // All after the last record (or none there): appended, nothing moves.
    if records
        .last()
        .is_none_or(|last| last.path.as_str() < first.path.as_str())
    {
        records.extend(added);
        return;
    }
    let filler = first.clone();
    let n = records.len();
    records.reserve_exact(added.len());
    // Places for the added records, at the end; `records[i..i + holes]`
    // are the places still free, `records[..i]` the old records not moved.
    records.resize(n + added.len(), filler);
    let mut i = n;
    for (holes, a) in added.into_iter().enumerate().map(|(j, a)| (j + 1, a)).rev() {
        let at = records[..i].partition_point(|r| r.path.as_str() < a.path.as_str());
        for old in (at..i).rev() {
            records.swap(old, old + holes);
        }
        records[at + holes - 1] = a;
        i = at;
    }
}
