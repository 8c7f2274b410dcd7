//! The catalog this process last wrote to each local root, kept in memory
//! so that the root's next publication does not read and parse it again.
//!
//! Reading and parsing the catalog was most of a small publication's own
//! work once a root held a few hundred outputs (a tenth of a millisecond
//! per hundred records, every bundle). A remembered catalog is used only
//! when the root's `.distributor.json` is still the very file this process
//! wrote: the same device, inode, size and change time ([`Look`]). Every
//! writer of a catalog replaces it by a rename (a new inode), and any
//! write, truncation or rename gives a file a newer change time, so another
//! process's catalog, an operator's edit or a restored backup is read from
//! disk as before.
//!
//! Recalling takes the catalog out (the publication turns it into the next
//! one, so memory holds one copy, as when it is parsed); a successful
//! commit puts the new one back. Catalogs of [`LARGEST`] bytes in all are
//! kept (a root of 100,000 records writes about 57 MB), so that a small
//! publication into a big root costs writing its catalog, not reading and
//! parsing it too; an agent serving more large roots than that re-reads
//! the ones it published into longest ago.
//!
//! With the catalog goes the text of its records as this process wrote
//! them, or read them ahead of a small publication ([`RecordTexts`]), so
//! that the next catalog is written without
//! formatting again the records that did not change. That text is right for
//! any equal record, whatever the file on disk holds now.

use crate::backend::local::hash_cache::Look;
use crate::catalog::{Catalog, RecordTexts};
use crate::fs::storage::Root;
use std::sync::{Arc, Mutex};

/// Catalog files up to this many bytes in all (about 450,000 records) are
/// remembered, across every root of the process; remembering one takes
/// about twice its file's size in memory. When a new catalog does not fit,
/// the roots remembered longest ago are forgotten first.
pub const LARGEST: u64 = 256 << 20;

struct Kept {
    /// Device and inode of the root folder.
    root: (u64, u64),
    /// The catalog file as written, and the catalog (until recalled).
    catalog: Option<(Look, Catalog)>,
    texts: Option<Arc<RecordTexts>>,
}

/// What a process remembers of the local roots it published into: their
/// catalogs and the state of their tops. Held by the process's
/// [`crate::runtime::process_state::ProcessState`] and reached through it, so that
/// tests each have their own (docs/architecture.md, "What a process
/// keeps").
#[derive(Default)]
pub struct CatalogCache {
    catalogs: Mutex<Vec<Kept>>,
    tops: Mutex<Vec<Top>>,
    /// Catalog files read ahead of a lock and found not to be a v4 catalog
    /// (or not readable), newest last: not read ahead again while they are
    /// the same file ([`Self::not_read_ahead`]).
    not_catalogs: Mutex<Vec<Look>>,
}

/// How many files [`CatalogCache::not_read_ahead`] remembers.
const NOT_CATALOGS: usize = 8;

fn root_key(root: &Root) -> Option<(u64, u64)> {
    let st = rustix::fs::fstat(root.dir()).ok()?;
    Some((st.st_dev, st.st_ino))
}

impl CatalogCache {
    /// Forgets every catalog without freeing its memory, in a process
    /// about to exit: the system reclaims it whole.
    pub fn forget_for_exit(&self) {
        std::mem::forget(std::mem::take(&mut *self.entries()));
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, Vec<Kept>> {
        // An entry is only ever replaced whole: a panic elsewhere while the
        // lock was held leaves nothing half-done.
        self.catalogs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The catalog remembered for `root`, taken out, if `file` (the root's
    /// `.distributor.json`, as just opened) is the file it was written as.
    pub fn recall(&self, root: &Root, file: Look) -> Option<Catalog> {
        let key = root_key(root)?;
        let mut entries = self.entries();
        let entry = entries.iter_mut().find(|e| e.root == key)?;
        let (written, catalog) = entry.catalog.take()?;
        (written == file).then_some(catalog)
    }

    /// Remembers that the file `file`, read ahead of a lock, is not a v4
    /// catalog (or could not be read): a publication does not read it ahead
    /// again, nor prepare a batch's bundles while it is read
    /// ([`crate::backend::local::journal::worth_reading_ahead`]), while it is that file.
    pub fn not_read_ahead(&self, file: Look) {
        let mut known = self.not_catalogs.lock().unwrap_or_else(|e| e.into_inner());
        known.retain(|l| *l != file);
        if known.len() == NOT_CATALOGS {
            known.remove(0);
        }
        known.push(file);
    }

    /// Whether `file` was found not to be a v4 catalog when read ahead
    /// ([`Self::not_read_ahead`]).
    pub fn is_no_catalog(&self, file: Look) -> bool {
        let known = self.not_catalogs.lock().unwrap_or_else(|e| e.into_inner());
        known.contains(&file)
    }

    /// Whether the catalog remembered for `root` is the file `file` (without
    /// taking it out).
    pub fn knows(&self, root: &Root, file: Look) -> bool {
        let Some(key) = root_key(root) else {
            return false;
        };
        self.entries().iter().any(|e| {
            e.root == key
                && e.catalog
                    .as_ref()
                    .is_some_and(|(written, _)| *written == file)
        })
    }

    /// The text of the records of the catalog last written to `root`, if
    /// remembered.
    pub fn texts(&self, root: &Root) -> Option<Arc<RecordTexts>> {
        let key = root_key(root)?;
        self.entries()
            .iter()
            .find(|e| e.root == key)
            .and_then(|e| e.texts.clone())
    }

    /// Keeps the text of the records of the catalog just read from `root`'s
    /// file, for writing its next catalog ([`CatalogCache::texts`]); replaces
    /// any texts remembered for it (right for equal records whatever the
    /// file holds, but these are the ones the next catalog shares most
    /// records with).
    pub fn read_texts(&self, root: &Root, texts: RecordTexts) {
        let Some(key) = root_key(root) else { return };
        let mut entries = self.entries();
        match entries.iter_mut().find(|e| e.root == key) {
            Some(entry) => entry.texts = Some(Arc::new(texts)),
            None => entries.push(Kept {
                root: key,
                catalog: None,
                texts: Some(Arc::new(texts)),
            }),
        }
    }

    /// Forgets the texts kept for `root` (its catalog, if remembered, is
    /// kept).
    pub fn drop_texts(&self, root: &Root) {
        let Some(key) = root_key(root) else { return };
        let mut entries = self.entries();
        if let Some(entry) = entries.iter_mut().find(|e| e.root == key) {
            entry.texts = None;
        }
        entries.retain(|e| e.catalog.is_some() || e.texts.is_some());
    }

    /// Remembers `catalog` as what `root`'s `.distributor.json` holds while it
    /// is the file `file` (as it was once renamed into place), with the text
    /// of its records when known.
    pub fn remember(&self, root: &Root, file: Look, catalog: Catalog, texts: Option<RecordTexts>) {
        let Some(key) = root_key(root) else { return };
        let mut entries = self.entries();
        entries.retain(|e| e.root != key);
        if file.size > LARGEST {
            return;
        }
        // Oldest first: forget the longest remembered until this one fits.
        let mut total: u64 = entries.iter().map(Kept::size).sum::<u64>() + file.size;
        while total > LARGEST && !entries.is_empty() {
            total -= entries.remove(0).size();
        }
        entries.push(Kept {
            root: key,
            catalog: Some((file, catalog)),
            texts: texts.map(Arc::new),
        });
    }
}

impl Kept {
    /// The size of the catalog file remembered (0 once recalled), or of
    /// the texts alone, kept from a read.
    fn size(&self) -> u64 {
        match (&self.catalog, &self.texts) {
            (Some((look, _)), _) => look.size,
            (None, Some(texts)) => texts.held_bytes(),
            (None, None) => 0,
        }
    }
}

/// How long after its last sweep a root's top is taken as this process
/// left it: the backstop for a change the folder's change time missed (a
/// coarse clock tick on older kernels; see [`Look::settled`]).
const TOP_TRUSTED_FOR: std::time::Duration = std::time::Duration::from_secs(60);

/// A root (device and inode of its folder), the folder's look as this
/// process last left it with no temporary file at its top, and when its
/// top was last swept.
type Top = ((u64, u64), Look, std::time::Instant);

fn folder_look(root: &Root) -> Option<((u64, u64), Look)> {
    let st = rustix::fs::fstat(root.dir()).ok()?;
    let look = Look {
        dev: st.st_dev,
        ino: st.st_ino,
        size: u64::try_from(st.st_size).ok()?,
        ctime: st.st_ctime,
        ctime_nsec: i64::try_from(st.st_ctime_nsec).ok()?,
    };
    Some(((st.st_dev, st.st_ino), look))
}

impl CatalogCache {
    fn tops(&self) -> std::sync::MutexGuard<'_, Vec<Top>> {
        self.tops.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records that this process, holding `root`'s lock, has just removed
    /// every stale temporary file from its top.
    pub fn top_swept(&self, root: &Root) {
        let Some((key, look)) = folder_look(root) else {
            return;
        };
        let mut tops = self.tops();
        tops.retain(|(k, ..)| *k != key);
        tops.push((key, look, std::time::Instant::now()));
    }

    /// Records that this process, holding `root`'s lock, leaves no temporary
    /// file at its top (a publication committed, a journal settled). Counts
    /// only once the top has been swept ([`Self::top_swept`]).
    pub fn top_left_clean(&self, root: &Root) {
        let Some((key, look)) = folder_look(root) else {
            return;
        };
        if let Some(entry) = self.tops().iter_mut().find(|(k, ..)| *k == key) {
            entry.1 = look;
        }
    }

    /// Whether `root`'s top is still as this process left it clean, within
    /// [`TOP_TRUSTED_FOR`] of its last sweep: nobody has created or removed an
    /// entry there since (that changes the folder's change time), so no stale
    /// temporary file can be there and the sweep can be skipped. A root
    /// holding thousands of top-level folders (a `{source_id}/` prefix) is then
    /// not listed by every publication.
    pub fn top_still_clean(&self, root: &Root) -> bool {
        let Some((key, look)) = folder_look(root) else {
            return false;
        };
        self.tops()
            .iter()
            .any(|(k, left, swept)| *k == key && *left == look && swept.elapsed() < TOP_TRUSTED_FOR)
    }

    /// Forgets whatever is remembered for `root`. Not needed outside tests: a
    /// catalog written by anyone else is a new file, which nothing matches.
    #[cfg(test)]
    fn forget(&self, root: &Root) {
        let Some(key) = root_key(root) else { return };
        self.entries().retain(|e| e.root != key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::clock::now_millis;

    fn look(ino: u64, ctime_nsec: i64) -> Look {
        Look {
            dev: 1,
            ino,
            size: 10,
            ctime: 1_700_000_000,
            ctime_nsec,
        }
    }

    #[test]
    fn a_catalog_is_recalled_once_and_only_for_the_file_it_was_written_as() {
        let tmp = tempfile::tempdir().unwrap();
        let root = Root::create(tmp.path()).unwrap();
        let memory = CatalogCache::default();
        let catalog = Catalog::new(now_millis());
        memory.remember(&root, look(7, 1), catalog.clone(), None);
        assert_eq!(memory.recall(&root, look(7, 1)), Some(catalog.clone()));
        assert_eq!(
            memory.recall(&root, look(7, 1)),
            None,
            "taken out when recalled"
        );

        for other in [
            look(8, 1),
            look(7, 2),
            Look {
                size: 11,
                ..look(7, 1)
            },
        ] {
            memory.remember(&root, look(7, 1), catalog.clone(), None);
            assert_eq!(memory.recall(&root, other), None, "{other:?}");
            assert_eq!(memory.recall(&root, look(7, 1)), None, "a miss forgets it");
        }

        memory.remember(&root, look(7, 1), catalog.clone(), None);
        memory.forget(&root);
        assert_eq!(memory.recall(&root, look(7, 1)), None);

        let huge = Look {
            size: LARGEST + 1,
            ..look(7, 1)
        };
        memory.remember(&root, huge, catalog.clone(), Some(RecordTexts::default()));
        assert_eq!(memory.recall(&root, huge), None, "too large to keep");
        assert!(memory.texts(&root).is_none());

        // Texts dropped, the catalog is still recalled; texts read alone
        // leave nothing behind once dropped.
        memory.remember(
            &root,
            look(7, 1),
            catalog.clone(),
            Some(RecordTexts::default()),
        );
        memory.drop_texts(&root);
        assert!(memory.texts(&root).is_none());
        assert_eq!(memory.recall(&root, look(7, 1)), Some(catalog));
        memory.read_texts(&root, RecordTexts::default());
        assert!(memory.texts(&root).is_some());
        memory.drop_texts(&root);
        assert!(memory.texts(&root).is_none());
        assert!(memory.entries().is_empty());
    }

    #[test]
    fn a_root_top_is_trusted_clean_only_while_nobody_changed_it() {
        let tmp = tempfile::tempdir().unwrap();
        let root = Root::create(tmp.path()).unwrap();
        let memory = CatalogCache::default();
        assert!(!memory.top_still_clean(&root), "never swept");
        memory.top_left_clean(&root);
        assert!(
            !memory.top_still_clean(&root),
            "left clean counts only after a sweep"
        );
        memory.top_swept(&root);
        assert!(memory.top_still_clean(&root));
        // Another process's temporary file (or any entry) at the top.
        crate::backend::local::hash_cache::wait_for_a_newer_change_time(tmp.path());
        std::fs::write(tmp.path().join(".distributor-tmp-1-0"), b"x").unwrap();
        assert!(!memory.top_still_clean(&root));
        memory.top_left_clean(&root);
        assert!(memory.top_still_clean(&root));
        crate::backend::local::hash_cache::wait_for_a_newer_change_time(tmp.path());
        std::fs::remove_file(tmp.path().join(".distributor-tmp-1-0")).unwrap();
        assert!(!memory.top_still_clean(&root), "a removal changes it too");
        // A folder made anew at the same path is another folder.
        memory.top_swept(&root);
        drop(root);
        std::fs::remove_dir(tmp.path()).unwrap();
        std::fs::create_dir(tmp.path()).unwrap();
        let again = Root::open(tmp.path()).unwrap().unwrap();
        assert!(!memory.top_still_clean(&again));
    }
}
