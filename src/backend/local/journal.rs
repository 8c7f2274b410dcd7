//! The intent journal that makes a publication crash-safe.
//!
//! Before a publication changes anything in a root outside its top, it
//! makes `.distributor-journal.json` durable, listing what it will write
//! and delete (`backend::local::stage`). Whoever next takes the root lock and
//! finds a journal finishes the story from the bytes on disk: every
//! journaled path is recorded as what it really holds now (the new output,
//! the old one, or nothing), stray temporary files and folders the
//! publication created are removed, and the catalog is rewritten. Renames
//! are atomic, so each path holds either the old or the new bytes, never a
//! mix. A journal cut short was being written when its publication stopped,
//! before it was durable, so before anything moved: it is dropped. A
//! journal found beside the catalog it names belongs to a publication that
//! was in force and had only its deletions left (they come after the
//! catalog is durable): recovery finishes them, each only where the path
//! still holds what the publication deleted.

use crate::backend::local::catalog_cache::CatalogCache;
use crate::backend::local::hash_cache::Look;
use crate::catalog::{Catalog, OutputRecord, RecordTexts, STATE_FILE, State, format_time};
use crate::fs::storage::{Entry, Root, is_temp_name};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::ops::Bound;
use time::OffsetDateTime;

/// Name of the journal at the top of a root.
pub const JOURNAL_FILE: &str = ".distributor-journal.json";

/// One planned write: the record it will have, and the record it replaces.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JournalWrite {
    pub new: OutputRecord,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old: Option<OutputRecord>,
}

/// What a publication is about to do to a root.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Journal {
    pub writes: Vec<JournalWrite>,
    /// Paths deleted after the catalog (or cleared before the writes).
    pub deletes: Vec<String>,
    /// Folders the publication may create, shallowest first.
    pub created_dirs: Vec<String>,
    /// True when the root had no state file before the publication.
    pub state_was_absent: bool,
    /// The `updated_at` of the catalog the publication writes (RFC 3339):
    /// found in place, that catalog is in force and only the deletions may
    /// be left to finish. Absent from the journals of versions that
    /// deleted before writing the catalog.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catalog: Option<String>,
    /// What each deletion after the catalog removes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deleted: Vec<JournalDelete>,
}

/// One deletion after the catalog, and what recovery may take for the
/// output it deletes: the bytes its record names, else (an unrecorded file
/// of a legacy root) the file's look when it was journaled, or an empty
/// folder. Anything else found there is left alone.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JournalDelete {
    pub path: String,
    /// The record dropped, put back when recovery cannot delete its file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old: Option<OutputRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub look: Option<JournalLook>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub folder: bool,
}

/// A [`Look`] as the journal keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalLook {
    dev: u64,
    ino: u64,
    size: u64,
    ctime: i64,
    ctime_nsec: i64,
}

impl From<Look> for JournalLook {
    fn from(l: Look) -> JournalLook {
        JournalLook {
            dev: l.dev,
            ino: l.ino,
            size: l.size,
            ctime: l.ctime,
            ctime_nsec: l.ctime_nsec,
        }
    }
}

/// A journal written from records borrowed from the catalog being built,
/// so a large publication does not copy every record to journal it. It is
/// written exactly as [`Journal`] is read.
#[derive(Debug, Serialize)]
pub struct JournalRef<'a> {
    pub writes: Vec<JournalWriteRef<'a>>,
    pub deletes: Vec<&'a str>,
    pub created_dirs: Vec<String>,
    pub state_was_absent: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub catalog: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub deleted: Vec<JournalDeleteRef<'a>>,
}

/// A [`JournalDelete`] by reference.
#[derive(Debug, Serialize)]
pub struct JournalDeleteRef<'a> {
    pub path: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub old: Option<&'a OutputRecord>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub look: Option<JournalLook>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub folder: bool,
}

/// A [`JournalWrite`] by reference.
#[derive(Debug, Serialize)]
pub struct JournalWriteRef<'a> {
    pub new: &'a OutputRecord,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub old: Option<&'a OutputRecord>,
}

impl JournalRef<'_> {
    /// Streams the journal as JSON into `w` through a buffer (a journal of
    /// a large tree is tens of MiB; it is never held in memory as text).
    pub fn write_json(&self, w: &mut dyn std::io::Write) -> io::Result<()> {
        let mut buffered = std::io::BufWriter::with_capacity(1 << 16, w);
        serde_json::to_writer(&mut buffered, self).map_err(io::Error::from)?;
        std::io::Write::flush(&mut buffered)
    }
}

#[cfg(test)]
impl Journal {
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// Reads the state file of a root into a [`State`]. A state file that is a
/// symlink or cannot be read is invalid state, not a crash.
pub fn read_state(root: &Root, memory: &CatalogCache) -> io::Result<State> {
    read_state_or(root, None, memory)
}

/// A catalog read before the root's lock was taken ([`read_ahead`]), with
/// the look of the file it was read from and the text of its records.
pub struct ReadAhead {
    look: Look,
    catalog: Catalog,
    texts: Option<RecordTexts>,
}

/// The texts of a catalog are read ahead only when it is at least this
/// many times the size of the bundles' manifests: a manifest takes about
/// 100 bytes a file and a catalog about 570 bytes a record, so a bundle
/// of one file for 8 records has a manifest about 1/45 of the catalog
/// (the publication still drops them once it knows its change is too
/// large for its catalog write to copy them).
pub const CATALOG_FOR_ONE_MANIFEST_BYTE: u64 = 45;

/// Catalog files from this size on are read ahead of the lock: parsing one
/// takes long enough (about 5 ms a MiB) to be worth doing while the bundle
/// is inspected. Smaller ones are read under the lock (a live agent
/// remembers them anyway, see [`crate::backend::local::catalog_cache`]).
pub const READ_AHEAD_FROM: u64 = 1 << 20;

/// `root`'s catalog file, open, if it is worth reading ahead of the lock
/// ([`read_ahead`]): at least [`READ_AHEAD_FROM`] bytes, not the catalog
/// this process remembers writing, and not a file it already found to be
/// no v4 catalog when it read it ahead.
pub fn worth_reading_ahead(root: &Root, memory: &CatalogCache) -> Option<std::fs::File> {
    let file = root.open_reserved(STATE_FILE).ok()??;
    let look = Look::of(&file.metadata().ok()?);
    (look.size >= READ_AHEAD_FROM && !memory.knows(root, look) && !memory.is_no_catalog(look))
        .then_some(file)
}

/// Reads a root's catalog (`file`, from [`worth_reading_ahead`]) without
/// its lock, so that a publication can parse a large one while it inspects
/// the bundle. Whoever takes the lock uses it only if the root's file is
/// still the one read (same device, inode, size and change time: every
/// writer replaces the file, and an edit in place changes its change time),
/// else reads the file again. `None` for anything but a v4 catalog. With
/// the text of its records when the publication's manifests take
/// `manifest_bytes` and the catalog is [`CATALOG_FOR_ONE_MANIFEST_BYTE`]
/// times that or more, and no larger than a process remembers
/// ([`crate::backend::local::catalog_cache::LARGEST`]). A file that is not a v4 catalog is
/// remembered as such in `memory` ([`CatalogCache::not_read_ahead`]).
pub fn read_ahead(
    file: std::fs::File,
    manifest_bytes: u64,
    memory: &CatalogCache,
) -> Option<ReadAhead> {
    let look = Look::of(&file.metadata().ok()?);
    let small = manifest_bytes.saturating_mul(CATALOG_FOR_ONE_MANIFEST_BYTE) <= look.size
        && look.size <= crate::backend::local::catalog_cache::LARGEST;
    match State::read_file(&file, small) {
        Ok((State::Catalog(catalog), texts)) => Some(ReadAhead {
            look,
            catalog,
            texts,
        }),
        _ => {
            memory.not_read_ahead(look);
            None
        }
    }
}

/// [`read_state`], taking the catalog read ahead when the file is still the
/// one it was read from.
fn read_state_or(
    root: &Root,
    ahead: Option<ReadAhead>,
    memory: &CatalogCache,
) -> io::Result<State> {
    match root.open_reserved(STATE_FILE) {
        Ok(Some(file)) => {
            let look = Look::of(&file.metadata()?);
            if let Some(ahead) = ahead.filter(|a| a.look == look) {
                if let Some(texts) = ahead.texts {
                    memory.read_texts(root, texts);
                }
                return Ok(State::Catalog(ahead.catalog));
            }
            if let Some(catalog) = memory.recall(root, look) {
                return Ok(State::Catalog(catalog));
            }
            // Not with the text of its records: the size of the
            // publication is not known yet (only a catalog read ahead keeps
            // them, see read_ahead).
            State::read_file(&file, false).map(|(state, _)| state)
        }
        Ok(None) => Ok(State::Absent),
        Err(e) if e.kind() == io::ErrorKind::Other => Ok(State::Invalid {
            reason: e.to_string(),
        }),
        Err(e) => Err(e),
    }
}

/// Finishes an interrupted publication if the root holds a journal.
///
/// Returns the state to plan against. With `apply` false (dry runs) nothing
/// is changed on disk and the returned state is what applying would leave.
pub fn recover(
    root: &Root,
    apply: bool,
    now: OffsetDateTime,
    memory: &CatalogCache,
) -> io::Result<State> {
    recover_with(root, apply, now, None, memory)
}

/// [`recover`], starting from a catalog read ahead of the lock when the
/// root's file is still that one ([`read_ahead`]).
pub fn recover_with(
    root: &Root,
    apply: bool,
    now: OffsetDateTime,
    ahead: Option<ReadAhead>,
    memory: &CatalogCache,
) -> io::Result<State> {
    if apply && !memory.top_still_clean(root) {
        // A process killed while staging a small publication, or writing a
        // catalog, leaves temporary files at the top of the root and
        // perhaps no journal. Every temporary file is created under the
        // lock, which the caller holds, so any found now is stale. Not
        // listed again while the top is as this process left it clean.
        remove_temps_in(root, "")?;
        memory.top_swept(root);
    }
    let current = read_state_or(root, ahead, memory)?;
    let Some(journal) = read_journal(root, apply, memory)? else {
        return Ok(current);
    };
    log::warn!(
        "{}: settling an unfinished publication from its journal ({} writes, {} deletes journaled)",
        root.path().display(),
        journal.writes.len(),
        journal.deletes.len()
    );

    // A journaled path whose folder is now a symlink or a file cannot be
    // judged (its real folder may come back); settling now would drop the
    // records of files the tool wrote. Keep the journal and say why.
    let journaled = journal
        .writes
        .iter()
        .map(|w| w.new.path.as_str())
        .chain(journal.deletes.iter().map(String::as_str));
    for path in journaled {
        if let Some(blocked) = blocked_folder(root, path)? {
            return Err(io::Error::other(format!(
                "{}/{blocked} is not a real folder any more (a symlink or a file took its place), but an unfinished publication recorded in {JOURNAL_FILE} wrote below it. Put the folder back, then rerun; the journal is kept until then",
                root.path().display()
            )));
        }
    }
    // The interrupted run stopped before its last barrier: what it renamed
    // or deleted may not be durable yet. Made durable first, the catalog
    // written below never records bytes that a power cut could still undo.
    if apply {
        root.sync()?;
    }
    let mut base = match &current {
        State::Catalog(c) => c.clone(),
        _ => Catalog::new(now),
    };
    let mut records: BTreeMap<String, OutputRecord> = std::mem::take(&mut base.outputs)
        .into_iter()
        .map(|r| (r.path.as_str().to_owned(), r))
        .collect();
    // Its catalog in place (and durable, after the sync), the publication
    // had only deletions left: they are finished (a dry run only tells).
    let finished = if catalog_written(&journal, &current) {
        finish_deletions(root, &journal, apply, &mut records)?
    } else {
        0
    };
    settle_records(root, &journal, &mut records)?;
    if apply {
        remove_temps(root, &journal)?;
        for dir in journal.created_dirs.iter().rev() {
            root.remove_dir_if_empty(dir)?;
        }
    }

    let recovered: Vec<OutputRecord> = records.into_values().collect();
    // Rewrite the catalog only when the bytes on disk say something new:
    // a failure while staging changed nothing, and must not even touch
    // the catalog's timestamp (or convert legacy or invalid state).
    let changed = match &current {
        State::Catalog(c) => c.outputs != recovered,
        // A publication converting legacy state stopped part way: a new
        // catalog of what it wrote would leave the files of the root it
        // had not reached yet unrecorded, and its rerun would refuse them
        // (`fail_unmanaged`). Left legacy, the rerun converts it whole.
        State::Legacy { .. } => false,
        _ => !recovered.is_empty(),
    };
    if changed {
        base.outputs = recovered;
        base.updated_at = now;
    }
    if apply {
        if finished > 0 {
            // Durable before the journal that names them goes.
            root.sync()?;
        }
        if changed {
            root.write_reserved(STATE_FILE, &base.to_json())?;
        }
        root.remove_file(JOURNAL_FILE)?;
        memory.top_left_clean(root);
    }
    Ok(if changed {
        State::Catalog(base)
    } else {
        current
    })
}

/// The root's journal, if there is one to settle. One cut short by a crash
/// is logged and (with `apply`) removed: it had moved nothing into place.
fn read_journal(root: &Root, apply: bool, memory: &CatalogCache) -> io::Result<Option<Journal>> {
    let Some(file) = root.open_reserved(JOURNAL_FILE)? else {
        return Ok(None);
    };
    // Read as a stream: a large publication's journal is tens of MiB, and
    // its records are all that need to be held.
    let reader = io::BufReader::with_capacity(64 * 1024, file);
    match serde_json::from_reader(reader) {
        Ok(journal) => Ok(Some(journal)),
        Err(e) if e.is_io() => Err(io::Error::from(e)),
        Err(e) if cut_short(root, &e)? => {
            // Every publication makes its journal durable before it moves
            // anything into place (backend::local::stage), so one cut short by a
            // crash had changed nothing outside the top of the root: there
            // is nothing to settle but its temporary files, which
            // `recover_with` removed before reading it.
            log::warn!(
                "{}/{JOURNAL_FILE} was cut short ({e}): the publication that wrote it stopped before it was durable, so it had moved nothing into place; {}",
                root.path().display(),
                if apply {
                    "removed it, the catalog stands as it was"
                } else {
                    "it is removed by the next run"
                }
            );
            if apply {
                root.remove_file(JOURNAL_FILE)?;
                memory.top_left_clean(root);
            }
            Ok(None)
        }
        Err(e) => Err(io::Error::other(format!(
            "{}/{JOURNAL_FILE} is unreadable ({e}); it records an interrupted publication. Inspect the root, then delete the journal and rerun the bundle",
            root.path().display()
        ))),
    }
}

/// Whether `current` is the catalog the journaled publication writes: it
/// has the journaled `updated_at` and records none of the outputs the
/// publication deletes (an older catalog stamped in the same millisecond
/// still records them).
fn catalog_written(journal: &Journal, current: &State) -> bool {
    let (Some(at), State::Catalog(c)) = (&journal.catalog, current) else {
        return false;
    };
    format_time(c.updated_at) == *at
        && journal
            .deleted
            .iter()
            .all(|d| d.old.is_none() || c.get(&d.path).is_none())
}

/// Deletes what the publication still had to delete after its catalog,
/// where the path still holds what it deleted ([`JournalDelete`]): never
/// anything else, nor a path `records` holds. A file that cannot be
/// deleted keeps its record, put back, with a warning. Returns how many
/// were deleted (with `apply` false, none: the state is the same).
fn finish_deletions(
    root: &Root,
    journal: &Journal,
    apply: bool,
    records: &mut BTreeMap<String, OutputRecord>,
) -> io::Result<usize> {
    let mut finished = 0;
    for d in &journal.deleted {
        let path = d.path.as_str();
        if records.contains_key(path) {
            continue;
        }
        let holds = match (&d.old, d.look) {
            (Some(old), _) => root.holds(path, &old.sha256, old.size)?.is_some(),
            (None, Some(look)) => root.look(path)?.map(JournalLook::from) == Some(look),
            (None, None) => d.folder && root.entry(path)? == Entry::Dir,
        };
        if !holds || !apply {
            continue;
        }
        match root.remove_output(path) {
            Ok(true) => {
                finished += 1;
                if let Err(e) = root.prune_empty_parents(path) {
                    log::warn!(
                        "{}: cannot remove the folders {path} left empty ({e}); remove them by hand",
                        root.path().display()
                    );
                }
            }
            // A folder that is not empty any more: someone's content.
            Ok(false) => {}
            Err(e) => {
                log::warn!(
                    "{}/{path}: cannot delete it ({e}); its record is kept, and the next publication that drops it deletes it",
                    root.path().display()
                );
                if let Some(old) = &d.old {
                    records.insert(path.to_owned(), old.clone());
                }
            }
        }
    }
    if finished > 0 {
        log::warn!(
            "{}: the interrupted publication's catalog is in place; deleted the {finished} output(s) it no longer records",
            root.path().display()
        );
    }
    Ok(finished)
}

/// Brings `records` (by path) to what the root holds at every path the
/// journal names: a written path keeps the record of the bytes found there
/// (new or old), a deleted one loses its record (and, for a folder
/// cleared, every record below it).
fn settle_records(
    root: &Root,
    journal: &Journal,
    records: &mut BTreeMap<String, OutputRecord>,
) -> io::Result<()> {
    for w in &journal.writes {
        let path = w.new.path.as_str();
        let on_disk = root.hash_file(path)?;
        let holds = |r: &OutputRecord| {
            on_disk
                .as_ref()
                .is_some_and(|h| h.sha256 == r.sha256 && h.size == r.size)
        };
        if holds(&w.new) {
            records.insert(path.to_owned(), w.new.clone());
        } else if let Some(old) = w.old.as_ref().filter(|o| holds(o)) {
            records.insert(path.to_owned(), old.clone());
        } else if on_disk.is_none() && root.entry(path)? == Entry::Missing {
            records.remove(path);
        }
    }
    for path in &journal.deletes {
        match root.entry(path)? {
            // Someone's folder where a recorded file was (a deletion leaves
            // a folder with content alone): the file is gone.
            Entry::Dir => {
                records.remove(path);
            }
            Entry::Missing => {
                records.remove(path);
                // A folder cleared (`force_replace`) takes every record below.
                let below = format!("{path}/");
                let inside: Vec<String> = records
                    .range::<str, _>((Bound::Included(below.as_str()), Bound::Unbounded))
                    .map(|(p, _)| p)
                    .take_while(|p| p.starts_with(&below))
                    .cloned()
                    .collect();
                for p in inside {
                    records.remove(&p);
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// Whether the journal failed to parse because it was cut short: it ends
/// before its JSON does (a crash while it was being written), or holds NUL
/// bytes (its size reached the disk before its data, after a power loss).
/// Anything else (text that is not a journal) is not taken for a crash.
fn cut_short(root: &Root, e: &serde_json::Error) -> io::Result<bool> {
    match e.classify() {
        serde_json::error::Category::Eof => Ok(true),
        serde_json::error::Category::Syntax => {
            let Some(mut file) = root.open_reserved(JOURNAL_FILE)? else {
                return Ok(false);
            };
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = io::Read::read(&mut file, &mut buf)?;
                if n == 0 {
                    return Ok(false);
                }
                if buf[..n].contains(&0) {
                    return Ok(true);
                }
            }
        }
        _ => Ok(false),
    }
}

/// The first folder above `path` that exists but is not a real folder.
fn blocked_folder(root: &Root, path: &str) -> io::Result<Option<String>> {
    let mut end = 0;
    while let Some(i) = path[end..].find('/') {
        end += i;
        let folder = &path[..end];
        match root.entry(folder)? {
            Entry::Dir => {}
            Entry::Missing => return Ok(None),
            Entry::File { .. } | Entry::Symlink | Entry::Other => {
                return Ok(Some(folder.to_owned()));
            }
        }
        end += 1;
    }
    Ok(None)
}

/// Removes temporary files left in the root and in every folder a
/// journaled path lives in. Called with the lock held, so no live
/// publication owns them.
fn remove_temps(root: &Root, journal: &Journal) -> io::Result<()> {
    let mut folders: BTreeSet<String> = BTreeSet::from([String::new()]);
    for w in &journal.writes {
        if let Some(parent) = w.new.path.parent() {
            folders.insert(parent.to_owned());
        }
    }
    for folder in folders {
        remove_temps_in(root, &folder)?;
    }
    Ok(())
}

fn remove_temps_in(root: &Root, folder: &str) -> io::Result<()> {
    for name in root.list_names(folder)? {
        if is_temp_name(&name) {
            let path = if folder.is_empty() {
                name
            } else {
                format!("{folder}/{name}")
            };
            root.remove_file(&path)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{OutputKind, SourceIdentity};
    use crate::paths::RelPath;

    fn record(path: &str, size: u64) -> OutputRecord {
        let at = time::macros::datetime!(2026-06-01 00:00 UTC);
        OutputRecord {
            path: RelPath::parse(path).unwrap(),
            pipeline_id: "p".into(),
            destination_id: "d".into(),
            source: std::sync::Arc::new(SourceIdentity {
                id: "s".to_owned(),
                digest: format!("sha256:{}", "a".repeat(64)),
                created: at,
            }),
            kind: OutputKind::Source,
            source_path: None,
            transform: None,
            url: None,
            sha256: crate::catalog::Sha256::parse(&format!("sha256:{}", "b".repeat(64))).unwrap(),
            size,
            created_at: at,
            updated_at: at,
        }
    }

    #[test]
    fn a_catalog_read_ahead_has_its_texts_only_beside_small_manifests() {
        let mut catalog = Catalog::new(time::macros::datetime!(2026-06-01 00:00 UTC));
        catalog.outputs = (0..80).map(|i| record(&format!("f/{i:03}"), i)).collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(STATE_FILE);
        std::fs::write(&path, catalog.to_json()).unwrap();
        let memory = CatalogCache::default();
        let ahead = read_ahead(std::fs::File::open(&path).unwrap(), 0, &memory).unwrap();
        assert_eq!(ahead.catalog, catalog);
        assert!(ahead.texts.is_some(), "read with the text of its records");
        // Manifests large beside the catalog: not read.
        let size = std::fs::metadata(&path).unwrap().len();
        let most = size / CATALOG_FOR_ONE_MANIFEST_BYTE;
        for (manifests, read) in [(most, true), (most + 1, false)] {
            let ahead =
                read_ahead(std::fs::File::open(&path).unwrap(), manifests, &memory).unwrap();
            assert_eq!(
                ahead.texts.is_some(),
                read,
                "manifests of {manifests} bytes"
            );
        }
    }

    #[test]
    fn a_large_file_that_is_no_catalog_is_read_ahead_once_while_it_is_that_file() {
        let tmp = tempfile::tempdir().unwrap();
        let root = Root::open(tmp.path()).unwrap().unwrap();
        let memory = CatalogCache::default();
        // Large, and not a catalog: its JSON is cut short.
        let mut catalog = Catalog::new(time::macros::datetime!(2026-06-01 00:00 UTC));
        catalog.outputs = (0..3000).map(|i| record(&format!("f/{i:05}"), 1)).collect();
        let text = catalog.to_json();
        root.write_reserved(STATE_FILE, &text[..text.len() - 10])
            .unwrap();
        let file = worth_reading_ahead(&root, &memory).expect("large: worth reading ahead");
        assert!(read_ahead(file, 0, &memory).is_none());
        assert!(
            worth_reading_ahead(&root, &memory).is_none(),
            "the same file is not read ahead again"
        );
        // Another process repairs it: a new file, read ahead again.
        root.write_reserved(STATE_FILE, &text).unwrap();
        let file = worth_reading_ahead(&root, &memory).expect("a new file");
        assert_eq!(read_ahead(file, 0, &memory).unwrap().catalog, catalog);
    }

    #[test]
    fn a_journal_written_by_reference_reads_back_as_the_same_journal() {
        let (new_a, old_a, new_b) = (record("a/x", 1), record("a/x", 2), record("b", 3));
        let gone = record("gone", 4);
        let look = JournalLook {
            dev: 1,
            ino: 2,
            size: 3,
            ctime: 4,
            ctime_nsec: 5,
        };
        // (path, old record, look, folder) of each deletion after the catalog
        type Deleted<'a> = Vec<(&'a str, Option<&'a OutputRecord>, Option<JournalLook>, bool)>;
        let cases: [(_, _, _, _, Option<String>, Deleted); 3] = [
            (vec![], vec![], vec![], false, None, vec![]),
            (
                vec![(&new_a, Some(&old_a)), (&new_b, None)],
                vec!["gone", "g/one", "e"],
                vec!["a".to_owned()],
                true,
                Some("2026-06-01T00:00:00.001Z".to_owned()),
                vec![
                    ("gone", Some(&gone), None, false),
                    ("g/one", None, Some(look), false),
                    ("e", None, None, true),
                ],
            ),
            (
                vec![(&new_b, None)],
                vec![],
                vec![],
                false,
                Some("2026-06-01T00:00:00Z".to_owned()),
                vec![],
            ),
        ];
        for (writes, deletes, created_dirs, state_was_absent, catalog, deleted) in cases {
            let by_ref = JournalRef {
                writes: writes
                    .iter()
                    .map(|(new, old)| JournalWriteRef { new, old: *old })
                    .collect(),
                deletes: deletes.clone(),
                created_dirs: created_dirs.clone(),
                state_was_absent,
                catalog: catalog.clone(),
                deleted: deleted
                    .iter()
                    .map(|&(path, old, look, folder)| JournalDeleteRef {
                        path,
                        old,
                        look,
                        folder,
                    })
                    .collect(),
            };
            let mut bytes = Vec::new();
            by_ref.write_json(&mut bytes).unwrap();
            let read: Journal = serde_json::from_slice(&bytes).unwrap();
            let owned = Journal {
                writes: writes
                    .iter()
                    .map(|(new, old)| JournalWrite {
                        new: (*new).clone(),
                        old: old.cloned(),
                    })
                    .collect(),
                deletes: deletes.iter().map(|d| d.to_string()).collect(),
                created_dirs,
                state_was_absent,
                catalog,
                deleted: deleted
                    .iter()
                    .map(|&(path, old, look, folder)| JournalDelete {
                        path: path.to_owned(),
                        old: old.cloned(),
                        look,
                        folder,
                    })
                    .collect(),
            };
            assert_eq!(bytes, owned.to_json());
            assert_eq!(read.writes.len(), owned.writes.len());
            assert_eq!(read.deletes, owned.deletes);
            assert_eq!(read.catalog, owned.catalog);
            let summary = |j: &Journal| -> Vec<_> {
                j.deleted
                    .iter()
                    .map(|d| (d.path.clone(), d.old.clone(), d.look, d.folder))
                    .collect()
            };
            assert_eq!(summary(&read), summary(&owned));
        }
        // A journal of a version that deleted before its catalog reads
        // with neither: recovery settles it as that version did.
        let older: Journal = serde_json::from_str(
            r#"{"writes": [], "deletes": ["x"], "created_dirs": [], "state_was_absent": false}"#,
        )
        .unwrap();
        assert!(older.catalog.is_none() && older.deleted.is_empty());
    }

    /// A publication killed once its catalog was in place, before it had
    /// deleted all it drops: recovery deletes each journaled path that
    /// still holds what the publication deleted, and nothing else; a
    /// catalog that is not the journaled one finishes nothing.
    #[test]
    fn deletions_left_after_the_catalog_are_finished_only_where_the_old_output_is() {
        let then = time::macros::datetime!(2026-06-01 00:00 UTC);
        let now = time::macros::datetime!(2026-06-02 00:00:00.007 UTC);
        let with_bytes = |path: &str, bytes: &[u8]| {
            let h = crate::fs::hashing::hash_bytes(bytes);
            OutputRecord {
                sha256: crate::catalog::Sha256::parse(&h.sha256).unwrap(),
                size: h.size,
                ..record(path, 0)
            }
        };
        // (case, the catalog on disk: its time and whether it still records
        // the deleted outputs, paths left afterwards)
        let cases = [
            (
                "the journaled catalog",
                now,
                false,
                &["changed.txt", "full/x", "legacy-changed.txt", "kept.txt"][..],
            ),
            (
                "the catalog before it",
                then,
                true,
                &[
                    "gone.txt",
                    "sub/deep.txt",
                    "changed.txt",
                    "legacy.txt",
                    "legacy-changed.txt",
                    "empty",
                    "full/x",
                    "kept.txt",
                ][..],
            ),
            (
                "an older catalog stamped alike",
                now,
                true,
                &[
                    "gone.txt",
                    "sub/deep.txt",
                    "changed.txt",
                    "legacy.txt",
                    "legacy-changed.txt",
                    "empty",
                    "full/x",
                    "kept.txt",
                ][..],
            ),
        ];
        for (what, stamped, old_records, left) in cases {
            let tmp = tempfile::tempdir().unwrap();
            let root = Root::open(tmp.path()).unwrap().unwrap();
            let write = |path: &str, bytes: &[u8]| {
                let p = tmp.path().join(path);
                std::fs::create_dir_all(p.parent().unwrap()).unwrap();
                std::fs::write(p, bytes).unwrap();
            };
            for (path, bytes) in [
                ("gone.txt", &b"old"[..]),
                ("sub/deep.txt", b"deep"),
                ("changed.txt", b"old too"),
                ("legacy.txt", b"legacy"),
                ("legacy-changed.txt", b"legacy"),
                ("full/x", b"someone's"),
                ("kept.txt", b"kept"),
            ] {
                write(path, bytes);
            }
            std::fs::create_dir(tmp.path().join("empty")).unwrap();
            let look = |path: &str| root.look(path).unwrap().map(JournalLook::from);
            let old = [
                with_bytes("gone.txt", b"old"),
                with_bytes("sub/deep.txt", b"deep"),
                with_bytes("changed.txt", b"old too"),
                with_bytes("full", b"a file once"),
            ];
            let journal = Journal {
                writes: Vec::new(),
                deletes: old.iter().map(|r| r.path.to_string()).collect(),
                created_dirs: Vec::new(),
                state_was_absent: false,
                catalog: Some(format_time(now)),
                deleted: old
                    .iter()
                    .map(|r| JournalDelete {
                        path: r.path.to_string(),
                        old: Some(r.clone()),
                        look: None,
                        folder: false,
                    })
                    .chain(["legacy.txt", "legacy-changed.txt"].map(|p| JournalDelete {
                        path: p.to_owned(),
                        old: None,
                        look: look(p),
                        folder: false,
                    }))
                    .chain([JournalDelete {
                        path: "empty".to_owned(),
                        old: None,
                        look: None,
                        folder: true,
                    }])
                    .collect(),
            };
            // Changed after the journal was written: not the old output.
            write("changed.txt", b"someone else's");
            crate::backend::local::hash_cache::wait_for_a_newer_change_time(
                &tmp.path().join("legacy-changed.txt"),
            );
            write("legacy-changed.txt", b"legacy");
            let mut catalog = Catalog::new(stamped);
            catalog.outputs = vec![with_bytes("kept.txt", b"kept")];
            if old_records {
                catalog.outputs.extend(old.iter().cloned());
                crate::catalog::sort_by_path(&mut catalog.outputs);
            }
            root.write_reserved(STATE_FILE, &catalog.to_json()).unwrap();
            std::fs::write(tmp.path().join(JOURNAL_FILE), journal.to_json()).unwrap();

            let Ok(State::Catalog(settled)) = recover(&root, true, now, &CatalogCache::default())
            else {
                panic!("{what}: not a catalog");
            };
            for path in [
                "gone.txt",
                "sub/deep.txt",
                "sub",
                "changed.txt",
                "legacy.txt",
                "legacy-changed.txt",
                "empty",
                "full/x",
                "kept.txt",
            ] {
                let kept =
                    left.contains(&path) || (path == "sub" && left.contains(&"sub/deep.txt"));
                assert_eq!(tmp.path().join(path).exists(), kept, "{what}: {path}");
            }
            let recorded: Vec<&str> = settled.outputs.iter().map(|r| r.path.as_str()).collect();
            let want: &[&str] = match old_records {
                false => &["kept.txt"],
                // The folder where a recorded file was is not the file.
                true => &["changed.txt", "gone.txt", "kept.txt", "sub/deep.txt"],
            };
            assert_eq!(recorded, want, "{what}");
            assert!(!tmp.path().join(JOURNAL_FILE).exists(), "{what}");
        }
    }

    /// A crash while the journal was being written, before it was durable,
    /// leaves it cut short: nothing of its publication was moved into place
    /// (the journal is durable before anything is), so it is dropped with
    /// the temporary files and the catalog stands. A journal that is whole
    /// but not one this version reads still stops the root, as before.
    #[test]
    fn a_journal_cut_short_is_dropped_and_anything_else_unreadable_is_kept() {
        let now = time::macros::datetime!(2026-06-02 00:00 UTC);
        let whole = Journal {
            writes: vec![JournalWrite {
                new: record("a/x", 1),
                old: None,
            }],
            deletes: vec!["gone".to_owned()],
            created_dirs: vec!["a".to_owned()],
            state_was_absent: false,
            catalog: None,
            deleted: Vec::new(),
        }
        .to_json();
        let mut zero_tail = whole[..whole.len() / 2].to_vec();
        zero_tail.resize(whole.len(), 0);
        let cases: [(&str, Vec<u8>, bool); 6] = [
            ("empty", Vec::new(), true),
            ("half", whole[..whole.len() / 2].to_vec(), true),
            (
                "all but the last byte",
                whole[..whole.len() - 1].to_vec(),
                true,
            ),
            ("its size on disk before its data", zero_tail, true),
            ("not JSON", b"{\"writes\": nonsense}".to_vec(), false),
            ("JSON, not a journal", b"{\"steps\": []}".to_vec(), false),
        ];
        for (what, bytes, dropped) in cases {
            let tmp = tempfile::tempdir().unwrap();
            let root = Root::open(tmp.path()).unwrap().unwrap();
            let mut catalog = Catalog::new(now);
            catalog.outputs.push(record("kept", 1));
            root.write_reserved(STATE_FILE, &catalog.to_json()).unwrap();
            let state_before = std::fs::read(tmp.path().join(STATE_FILE)).unwrap();
            std::fs::write(tmp.path().join(JOURNAL_FILE), &bytes).unwrap();
            std::fs::write(tmp.path().join(".distributor-tmp-1-0"), b"staged").unwrap();

            // A dry run changes nothing either way.
            let dry = recover(&root, false, now, &CatalogCache::default());
            assert_eq!(dry.is_ok(), dropped, "{what}: dry run");
            assert!(tmp.path().join(JOURNAL_FILE).exists(), "{what}");

            let got = recover(&root, true, now, &CatalogCache::default());
            let journal_left = tmp.path().join(JOURNAL_FILE).exists();
            if dropped {
                let Ok(State::Catalog(c)) = got else {
                    panic!("{what}: {got:?}");
                };
                assert_eq!(c.outputs, catalog.outputs, "{what}");
                assert!(!journal_left, "{what}: the journal stayed");
            } else {
                let e = got.unwrap_err();
                assert!(e.to_string().contains("is unreadable"), "{what}: {e}");
                assert!(journal_left, "{what}: an unreadable journal was removed");
            }
            assert_eq!(
                std::fs::read(tmp.path().join(STATE_FILE)).unwrap(),
                state_before,
                "{what}: the catalog changed"
            );
        }
    }

    /// A catalog read ahead of the lock is used only while the root's file
    /// is still the one read: another writer's catalog (a new file) or an
    /// edit in place of the same size (a newer change time) is read again.
    #[test]
    fn a_catalog_read_ahead_is_used_only_while_the_file_is_the_one_read() {
        let now = time::macros::datetime!(2026-06-02 00:00 UTC);
        let tmp = tempfile::tempdir().unwrap();
        let root = Root::open(tmp.path()).unwrap().unwrap();
        let catalog_of = |n: usize, size: u64| {
            let mut c = Catalog::new(now);
            c.outputs = (0..n).map(|i| record(&format!("f/{i:05}"), size)).collect();
            c
        };
        let small = catalog_of(10, 1);
        root.write_reserved(STATE_FILE, &small.to_json()).unwrap();
        assert!(
            worth_reading_ahead(&root, &CatalogCache::default()).is_none(),
            "a small catalog is read under the lock"
        );

        let big = catalog_of(3000, 1);
        root.write_reserved(STATE_FILE, &big.to_json()).unwrap();
        let read = |root: &Root| {
            let memory = CatalogCache::default();
            let ahead = worth_reading_ahead(root, &memory).and_then(|f| read_ahead(f, 0, &memory));
            assert!(ahead.is_some(), "a large catalog is worth reading ahead");
            ahead
        };
        // Unchanged: the catalog read ahead is the state, and the text of
        // its records is kept for the next write.
        let memory = CatalogCache::default();
        let Ok(State::Catalog(c)) = recover_with(&root, true, now, read(&root), &memory) else {
            panic!("not a catalog");
        };
        assert_eq!(c.outputs, big.outputs);
        let texts = memory.texts(&root).expect("the texts read ahead");
        assert_eq!(texts.len(), big.outputs.len());

        // Replaced by another writer after it was read.
        let ahead = read(&root);
        let other = catalog_of(3000, 2);
        root.write_reserved(STATE_FILE, &other.to_json()).unwrap();
        let Ok(State::Catalog(c)) = recover_with(&root, true, now, ahead, &CatalogCache::default())
        else {
            panic!("not a catalog");
        };
        assert_eq!(
            c.outputs, other.outputs,
            "the catalog read ahead was used over a newer one"
        );

        // Edited in place, same size and inode, after it was read.
        let ahead = read(&root);
        let path = tmp.path().join(STATE_FILE);
        crate::backend::local::hash_cache::wait_for_a_newer_change_time(&path);
        let text = std::fs::read_to_string(&path).unwrap();
        let edited = text.replacen("\"size\": 2", "\"size\": 3", 1);
        assert_eq!(edited.len(), text.len());
        {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            f.write_all(edited.as_bytes()).unwrap();
        }
        let Ok(State::Catalog(c)) = recover_with(&root, true, now, ahead, &CatalogCache::default())
        else {
            panic!("not a catalog");
        };
        assert_eq!(
            c.outputs[0].size, 3,
            "an edit in place after the read was missed"
        );
    }
}
