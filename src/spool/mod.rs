//! A pipeline's spool folders (`inbox`, `work`, `done`, `failed`) and the
//! moves between them: find complete bundles, claim, record the result,
//! file away, list, retry. Every move is a `rename` within one file system,
//! so a bundle is always in exactly one folder. No threads, no publishing.
//!
//! Bundles belong to their producers, who may be hostile (docs/contract.md §12): every
//! file read or written inside a spool goes through [`crate::fs::spoolfs`], and
//! one entry that cannot be read or moved never stops the others.

use crate::config::{Config, Pipeline};
use crate::fs::spoolfs;
use crate::report::RunReport;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

mod expire;
mod inbox;
mod list;
pub mod names;
pub mod queue;

pub use expire::{
    RETENTION_FILE, RetentionRecord, Undeletable, expire_done, newly_blocked, record_retention,
    retention_record,
};
pub use inbox::{
    INCOMPLETE_POLL, Probe, ProbeKind, Timing, Unchanged, Verdict, Waiting, probe_inbox_again,
};
pub use list::{FailedError, ResultDoc, SpoolEntry, UNVERIFIED, delete, list, read_result, retry};

/// Result document written inside a finished bundle.
pub const RESULT_FILE: &str = ".distributor-result.json";
/// Attempt counter kept inside a bundle in `work/`.
pub const ATTEMPTS_FILE: &str = ".distributor-attempts";
/// The attempt a batch of bundles in `work/` is making, kept in `work/`
/// while the batch runs: one file for the batch instead of one per bundle.
pub const BATCH_FILE: &str = ".distributor-batch.json";
/// The manifest whose presence makes a bundle complete.
pub const MANIFEST: &str = crate::bundle::MANIFEST;

/// Which spool folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Folder {
    Inbox,
    Work,
    Done,
    Failed,
}

impl Folder {
    pub fn as_str(self) -> &'static str {
        match self {
            Folder::Inbox => "inbox",
            Folder::Work => "work",
            Folder::Done => "done",
            Folder::Failed => "failed",
        }
    }
}

/// The four folders of one pipeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spool {
    pub pipeline_id: String,
    pub inbox: PathBuf,
    pub work: PathBuf,
    pub done: PathBuf,
    pub failed: PathBuf,
    /// The pipeline's limits (the manifest cap when probing the inbox).
    pub limits: crate::bundle::Limits,
    /// The pipeline takes only signed bundles: an entry is complete only
    /// once its `manifest.json.sig` is there too.
    pub signed: bool,
    /// When inbox entries are claimed (`once` is false here).
    pub timing: Timing,
    /// The pipeline's inbox is in a bucket (docs/contract.md §22): `inbox`
    /// is neither made nor used.
    pub intake: bool,
}

impl Spool {
    pub fn of(config: &Config, pipeline: &Pipeline) -> Spool {
        let base = pipeline.spool_dir(config);
        Spool {
            pipeline_id: pipeline.id.clone(),
            inbox: pipeline.inbox.clone(),
            work: base.join("work"),
            done: base.join("done"),
            failed: base.join("failed"),
            limits: pipeline.limits,
            signed: pipeline.signatures.as_ref().is_some_and(|s| s.required),
            timing: Timing {
                settle: config.agent.settle,
                incomplete_timeout: config.agent.incomplete_timeout,
                once: false,
            },
            intake: pipeline.intake.is_some(),
        }
    }

    pub fn folder(&self, folder: Folder) -> &Path {
        match folder {
            Folder::Inbox => &self.inbox,
            Folder::Work => &self.work,
            Folder::Done => &self.done,
            Folder::Failed => &self.failed,
        }
    }

    /// Where a bundle whose publication ended is filed: `done/` when it
    /// was published (`ok`), else `failed/`.
    pub fn filed_in(&self, ok: bool) -> Folder {
        if ok { Folder::Done } else { Folder::Failed }
    }

    /// Creates the four folders and checks they share one file system, so
    /// every move is an atomic rename. New folders get the modes of docs/contract.md
    /// §12.6: `work/`, `done/` and `failed/` 0750 (no access for others),
    /// `inbox/` 01770 (sticky: a producer cannot rename or delete another
    /// producer's entry), whatever the umask, which may only make the other
    /// three stricter. Existing folders owned by the agent's user are
    /// tightened the same way (others' access removed, sticky bit added);
    /// the group and the group's access stay the operator's choice.
    pub fn create(&self) -> io::Result<()> {
        let mut device = None;
        for folder in [Folder::Inbox, Folder::Work, Folder::Done, Folder::Failed] {
            if folder == Folder::Inbox && self.intake {
                continue;
            }
            let path = self.folder(folder);
            let (new_mode, fix) = match folder {
                Folder::Inbox => (0o1770, (0o1000, 0)),
                _ => (0o750, (0, 0o007)),
            };
            let created = match fs::symlink_metadata(path) {
                Ok(_) => false,
                Err(e) if e.kind() == io::ErrorKind::NotFound => true,
                Err(e) => return Err(folder_error(path, e)),
            };
            // Durably: a bundle is renamed into these folders and never
            // fsynced there (docs/reliability.md, "Crash states").
            crate::fs::replace_file::create_dir_all_durable(path, 0o750)
                .map_err(|e| folder_error(path, e))?;
            let meta = fs::metadata(path).map_err(|e| folder_error(path, e))?;
            let mode = meta.mode() & 0o7777;
            let wanted = if created && folder == Folder::Inbox {
                // Exactly 01770, whatever the umask: a umask of 022 or 077
                // would leave an inbox its producers cannot drop into.
                new_mode
            } else if created {
                // The umask may take access away (work/, done/, failed/).
                new_mode & !current_umask()
            } else {
                (mode | fix.0) & !fix.1
            };
            if wanted != mode && meta.uid() == effective_uid() {
                fs::set_permissions(path, fs::Permissions::from_mode(wanted))
                    .map_err(|e| folder_error(path, e))?;
                if !created {
                    log::info!(
                        "pipeline={}: spool folder {} had mode {mode:04o}; set {wanted:04o} (docs/security.md: no access for others to work/, done/, failed/; a sticky inbox)",
                        self.pipeline_id,
                        path.display()
                    );
                }
            } else if wanted != mode && !created {
                log::warn!(
                    "pipeline={}: spool folder {} has mode {mode:04o} and belongs to another user, so the agent cannot set {wanted:04o}; run `chmod {wanted:04o} {}` (see docs/security.md)",
                    self.pipeline_id,
                    path.display(),
                    path.display()
                );
            }
            let dev = meta.dev();
            match device {
                None => device = Some((dev, path.to_owned())),
                Some((d, ref first)) if d != dev => {
                    return Err(io::Error::other(format!(
                        "spool folders {} and {} of pipeline {} are on different file systems; bundles move between them by rename, so put the inbox on the same file system as the spool",
                        first.display(),
                        path.display(),
                        self.pipeline_id
                    )));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }
}

fn folder_error(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(
        e.kind(),
        format!("cannot create spool folder {}: {e}", path.display()),
    )
}

fn effective_uid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// The process umask, from `/proc/self/status` (reading it with umask(2)
/// would change it for a moment under other threads); 022 when unknown.
fn current_umask() -> u32 {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Umask:"))
                .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        })
        .unwrap_or(0o022)
}

/// A bundle folder found in `work/` (left there by a crash or a stop).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub name: String,
    pub path: PathBuf,
    /// Modification time of `manifest.json` (arrival order).
    pub manifest_modified: SystemTime,
}

/// True when the inbox entry name is staging (ignored).
pub fn is_ignored_name(name: &str) -> bool {
    name.starts_with('.')
}

/// What `work/` holds.
#[derive(Debug, Default)]
pub struct Scan {
    /// Bundles with a manifest entry, in arrival order (manifest
    /// modification time, then name). A manifest that is not a regular file
    /// (a symlink, a folder) counts as present: verification then fails the
    /// bundle with the reason.
    pub found: Vec<Found>,
    /// Folders without a manifest.
    pub incomplete: Vec<PathBuf>,
    /// Names that are not folders (files, symlinks): never bundles.
    pub strays: Vec<String>,
}

/// Scans `work/` for bundles to resume. Only the agent writes there, but the
/// bundles are still the producers': nothing in them is followed, and an
/// entry that cannot be inspected is passed over (logged), not fatal.
pub fn scan(dir: &Path) -> io::Result<Scan> {
    let mut scan = Scan::default();
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(scan),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            log::warn!(
                "{}: ignoring an entry whose name is not UTF-8 ({}); rename it",
                dir.display(),
                crate::text::escape::inert_os(&entry.file_name())
            );
            continue;
        };
        if is_ignored_name(&name) {
            continue;
        }
        let path = entry.path();
        match entry.file_type() {
            Ok(t) if t.is_dir() => {}
            Ok(_) => {
                scan.strays.push(name);
                continue;
            }
            Err(e) => {
                log::warn!("cannot inspect {}: {e}; passed over", path.display());
                continue;
            }
        }
        match fs::symlink_metadata(path.join(MANIFEST)) {
            Ok(m) => scan.found.push(Found {
                name,
                manifest_modified: m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                path,
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => scan.incomplete.push(path),
            Err(e) => log::warn!(
                "cannot inspect {}: {e}; passed over until it can be read",
                path.join(MANIFEST).display()
            ),
        }
    }
    scan.found.sort_by(|a, b| {
        a.manifest_modified
            .cmp(&b.manifest_modified)
            .then_with(|| a.name.cmp(&b.name))
    });
    scan.strays.sort();
    Ok(scan)
}

/// True when `path` is a real folder (not a link to one). A producer may
/// swap its inbox entry for a symlink between the scan and the claim; the
/// claim then moves the link, which must never be processed as a bundle.
pub fn is_real_folder(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| m.is_dir())
}

/// Moves `from` into folder `to` under its name, adding `.1`, `.2`, … when
/// the name is taken, each name cut to at most `max` bytes (see
/// [`names::fit`]): a producer's name may already be as long as a name can
/// be. Returns the new path.
pub fn move_unique(from: &Path, to: &Path, name: &str, max: usize) -> io::Result<PathBuf> {
    for n in 0u32.. {
        let candidate = to.join(names::candidate(name, n, max));
        if fs::symlink_metadata(&candidate).is_ok() {
            continue;
        }
        match rename_noreplace(from, &candidate) {
            Ok(()) => return Ok(candidate),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    unreachable!("u32 names exhausted")
}

/// `rename(2)` that refuses to replace an existing target.
fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    use rustix::fs::{CWD, RenameFlags, renameat_with};
    renameat_with(CWD, from, CWD, to, RenameFlags::NOREPLACE).map_err(io::Error::from)
}

/// Most bytes read of a bookkeeping file (attempt count, batch file, result).
const MAX_ATTEMPTS_BYTES: u64 = 64;
const MAX_BATCH_BYTES: u64 = 16 << 20;
pub(crate) const MAX_RESULT_BYTES: u64 = 16 << 20;

fn open_bundle(bundle: &Path) -> io::Result<cap_std::fs::Dir> {
    spoolfs::open_folder_io(bundle)
}

/// Writes a small bookkeeping file inside a bundle by replacing the entry
/// (a new file renamed over the name, relative to the bundle's descriptor),
/// without fsync: both such files are rewritten whole whenever the bundle is
/// processed again, and a power cut that loses them only makes the agent
/// redo a bundle, which is idempotent (`skip_same`). A producer's symlink,
/// FIFO or hard link at that name is replaced, never written through.
fn write_bookkeeping(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    spoolfs::replace(&open_bundle(dir)?, name, bytes, false)
}

/// Removes temporary files that a killed agent left at the top of a bundle
/// in work/, or of one of the folders of [`Spool::bookkeeping_folders`].
/// Only the worker holding the pipeline's agent lock writes there, so any
/// found there is stale.
pub fn remove_stale_temps(bundle: &Path) -> io::Result<()> {
    let dir = open_bundle(bundle)?;
    for entry in dir.entries()? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if crate::fs::storage::is_temp_name(name) && entry.file_type()?.is_file() {
            spoolfs::remove(&dir, name)?;
        }
    }
    Ok(())
}

/// Attempts already made on a bundle (0 when never tried, or when what is
/// there is not a small regular file).
pub fn attempts(bundle: &Path) -> u32 {
    recorded_attempts(bundle).unwrap_or(0)
}

/// The attempt count recorded in a bundle: `None` when nothing is there
/// (a bundle on its first attempt records none, see [`count_attempt`]),
/// 0 when what is there is not a small regular file holding a number.
pub fn recorded_attempts(bundle: &Path) -> Option<u32> {
    let Ok(dir) = open_bundle(bundle) else {
        return Some(0);
    };
    match spoolfs::read_capped(&dir, ATTEMPTS_FILE, MAX_ATTEMPTS_BYTES) {
        Err(e) if e.is_missing() => None,
        read => Some(
            read.ok()
                .and_then(|b| String::from_utf8(b).ok())
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0),
        ),
    }
}

/// Counts the attempt about to start on a bundle in work/ and returns its
/// number. A bundle's first attempt records nothing (a small bundle's
/// publication is a few milliseconds; the file cost a tenth of that): a
/// bundle found in work/ without a count when an agent starts was in its
/// first attempt when the last one stopped ([`count_interrupted`]). Later
/// attempts, or anything already at the name (a producer's file or link
/// is replaced, never written through), are recorded before they start.
pub fn count_attempt(bundle: &Path) -> io::Result<u32> {
    let recorded = recorded_attempts(bundle);
    let attempt = recorded.unwrap_or(0) + 1;
    if recorded.is_some() || attempt > 1 {
        set_attempts(bundle, attempt)?;
    }
    Ok(attempt)
}

/// For a bundle found in work/ when the agent starts: one that records no
/// attempt was in its first one (see [`count_attempt`]), which counts.
pub fn count_interrupted(bundle: &Path) -> io::Result<()> {
    if recorded_attempts(bundle).is_none() {
        set_attempts(bundle, 1)?;
    }
    Ok(())
}

/// Gives back the attempt a stop interrupted: it is made again at the next
/// start.
pub fn uncount_attempt(bundle: &Path) -> io::Result<()> {
    let recorded = recorded_attempts(bundle).unwrap_or(1);
    set_attempts(bundle, recorded.saturating_sub(1))
}

/// Records the number of attempts made (kept across restarts).
pub fn set_attempts(bundle: &Path, n: u32) -> io::Result<()> {
    write_bookkeeping(bundle, ATTEMPTS_FILE, format!("{n}\n").as_bytes())
}

/// Records that the bundles of `attempts` (name in work/, attempt number)
/// start that attempt together. Like the per-bundle counter it is written
/// without fsync.
pub fn begin_batch(spool: &Spool, attempts: &[(String, u32)]) -> io::Result<()> {
    let doc: std::collections::BTreeMap<&str, u32> = attempts
        .iter()
        .map(|(name, n)| (name.as_str(), *n))
        .collect();
    let bytes = serde_json::to_vec(&doc).map_err(io::Error::other)?;
    write_bookkeeping(&spool.work, BATCH_FILE, &bytes)
}

/// The batch is over; its bundles carry their own counters from here on.
pub fn end_batch(spool: &Spool) -> io::Result<()> {
    spoolfs::remove(&open_bundle(&spool.work)?, BATCH_FILE).map(|_| ())
}

/// Bundles whose publication ended (published, or failed) but that could
/// not be moved out of `work/` afterwards, kept by the agent in `work/`
/// itself, by bundle name ([`Unfiled`]). A producer that still holds its
/// folder can make it immovable (`chmod a-w` of the folder, so that an
/// agent not running as root may not move it to another parent); the next
/// start then files such a bundle instead of publishing it again, which
/// could put back older content over what was published since
/// (docs/troubleshooting.md, "The bundle cannot be moved out of work/").
///
/// It also holds, from just before a publication commits until each of
/// its bundles is filed, what the commit owes across a crash
/// (docs/reliability.md, "After the commit"): a bundle whose commit may
/// have happened ([`Unfiled::committing`]) is published again at the next
/// start together with the others of its batch, never one by one; one
/// whose commit happened is filed without publishing it again; and the
/// hooks each owes ([`Unfiled::hooks`]) run first.
pub const UNFILED_FILE: &str = ".distributor-unfiled.json";
/// Hooks' documents list every path a publication wrote: a record may be
/// large, and only the agent writes it (work/ is the agent's alone).
const MAX_UNFILED_BYTES: u64 = 1 << 30;
/// The most of a result kept in [`UNFILED_FILE`] (a larger one is left out).
const MAX_UNFILED_RESULT: usize = 64 << 10;

/// One bundle of [`UNFILED_FILE`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Unfiled {
    /// Published (else failed).
    pub published: bool,
    /// The folder's device and inode: a record is only ever that folder's
    /// (a later bundle of the same name is another folder).
    pub dev: u64,
    pub ino: u64,
    /// Its result document, when small enough, for the folder's
    /// `.distributor-result.json` and the agent's copy once it moves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// Its publication was about to commit when this was recorded, and
    /// may or may not have: the next start publishes it again (with the
    /// other bundles recorded so, as one batch), and `published` and
    /// `result` mean nothing yet.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub committing: bool,
    /// The hooks its publication owes, not run yet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<crate::hooks::Owed>,
    /// Recorded when its publication committed, before it was filed
    /// (else filing it was tried and failed): a bundle the agent is
    /// filing, not one stuck in work/, unless the agent is gone.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pending: bool,
    /// Its place in the publication that was committing (arrival order,
    /// as claimed): a batch published again keeps the order it committed in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<u32>,
}

impl Unfiled {
    /// The record of `bundle` (a folder in work/) as `report` ended it.
    pub fn of(bundle: &Path, report: &RunReport) -> io::Result<Unfiled> {
        let meta = fs::symlink_metadata(bundle)?;
        let result = report.to_json();
        Ok(Unfiled {
            published: report.ok,
            dev: meta.dev(),
            ino: meta.ino(),
            result: (result.len() <= MAX_UNFILED_RESULT).then_some(result),
            committing: false,
            hooks: Vec::new(),
            pending: false,
            order: None,
        })
    }

    /// The record of `bundle` (a folder in work/), `order`-th of the
    /// publication about to be committed, owing `hooks` if the commit
    /// happens.
    pub fn committing(
        bundle: &Path,
        order: usize,
        hooks: Vec<crate::hooks::Owed>,
    ) -> io::Result<Unfiled> {
        let meta = fs::symlink_metadata(bundle)?;
        Ok(Unfiled {
            published: false,
            dev: meta.dev(),
            ino: meta.ino(),
            result: None,
            committing: true,
            hooks,
            pending: true,
            order: u32::try_from(order).ok(),
        })
    }

    /// Whether `bundle` is the folder this record is about.
    pub fn is(&self, bundle: &Path) -> bool {
        fs::symlink_metadata(bundle)
            .is_ok_and(|m| m.is_dir() && (m.dev(), m.ino()) == (self.dev, self.ino))
    }
}

/// The bundles of [`UNFILED_FILE`]: none when it is missing; an error when
/// it cannot be read or parsed (it is then left as it is).
pub fn unfiled(spool: &Spool) -> io::Result<std::collections::BTreeMap<String, Unfiled>> {
    let work = open_bundle(&spool.work)?;
    match spoolfs::read_capped(&work, UNFILED_FILE, MAX_UNFILED_BYTES) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{UNFILED_FILE} is not what the agent writes ({e})"),
            )
        }),
        Err(e) if e.is_missing() => Ok(Default::default()),
        Err(e) => Err(io::Error::other(format!("{UNFILED_FILE}: {e}"))),
    }
}

/// Where a damaged [`UNFILED_FILE`] is set aside, for the operator to read.
pub const UNFILED_DAMAGED: &str = ".distributor-unfiled.json.damaged";

/// Moves a damaged [`UNFILED_FILE`] aside to [`UNFILED_DAMAGED`]
/// (replacing an older one), so that the pipeline publishes on.
pub fn set_aside_unfiled(spool: &Spool) -> io::Result<PathBuf> {
    let work = open_bundle(&spool.work)?;
    work.rename(UNFILED_FILE, &work, UNFILED_DAMAGED)?;
    Ok(spool.work.join(UNFILED_DAMAGED))
}

/// Writes [`UNFILED_FILE`] as `bundles` (durably: it is what keeps the
/// next start from publishing them again), or removes it when empty.
pub fn set_unfiled(
    spool: &Spool,
    bundles: &std::collections::BTreeMap<String, Unfiled>,
) -> io::Result<()> {
    let work = open_bundle(&spool.work)?;
    if bundles.is_empty() {
        return spoolfs::remove(&work, UNFILED_FILE).map(|_| ());
    }
    let bytes = serde_json::to_vec(bundles).map_err(io::Error::other)?;
    spoolfs::replace(&work, UNFILED_FILE, &bytes, true)
}

/// Moves a bundle of [`UNFILED_FILE`] to `done/` or `failed/`, writing
/// the result the record holds inside it first when it can (it could not
/// when the publication ended, as a rule) and keeping the agent's copy of
/// a failed one's. Returns where it went.
pub fn file_unfiled(
    spool: &Spool,
    bundle: &Path,
    name: &str,
    record: &Unfiled,
) -> io::Result<PathBuf> {
    if let Some(result) = &record.result {
        let _ = write_bookkeeping(bundle, RESULT_FILE, result.as_bytes());
    }
    let moved = file_as(spool, bundle, name, record.published)?;
    if let (false, Some(result)) = (record.published, &record.result) {
        let _ = keep_result(spool, &moved, result.as_bytes());
    }
    Ok(moved)
}

/// Moves `bundle` into `done/` (`ok`) or `failed/` under `name` (made
/// unique and short enough for its folder).
fn file_as(spool: &Spool, bundle: &Path, name: &str, ok: bool) -> io::Result<PathBuf> {
    let max = if ok {
        names::NAME_MAX
    } else {
        names::FAILED_NAME_MAX
    };
    move_unique(bundle, spool.folder(spool.filed_in(ok)), name, max)
}

/// After a crash during a batch: each bundle of the batch still in work/
/// gets the attempt the batch had started as its own counter, then the
/// batch file goes. A torn batch file (power cut) only loses that attempt.
pub fn settle_batch(spool: &Spool) -> io::Result<()> {
    let work = open_bundle(&spool.work)?;
    let bytes = match spoolfs::read_capped(&work, BATCH_FILE, MAX_BATCH_BYTES) {
        Ok(b) => b,
        Err(e) if e.is_missing() => return Ok(()),
        Err(_) => Vec::new(),
    };
    let doc: std::collections::BTreeMap<String, u32> =
        serde_json::from_slice(&bytes).unwrap_or_default();
    for (name, n) in doc {
        if name.contains('/') || name == "." || name == ".." || is_ignored_name(&name) {
            continue;
        }
        let bundle = spool.work.join(&name);
        if is_real_folder(&bundle) && attempts(&bundle) < n {
            set_attempts(&bundle, n)?;
        }
    }
    end_batch(spool)
}

/// Why the agent cannot keep its bookkeeping inside `bundle`: a folder
/// stands at a name it writes there ([`RESULT_FILE`], [`ATTEMPTS_FILE`]).
/// A file, link or FIFO at such a name is replaced by the agent's own
/// file; a folder is not, because a folder its producer owns (holding
/// files, or read-only) may not be removable by an unprivileged agent. The
/// bundle then fails at stage `verify` with this reason, whatever the
/// agent's privileges (docs/producers.md: names starting with
/// `.distributor` are the tool's).
pub fn bookkeeping_blocked(bundle: &Path) -> Option<String> {
    let dir = open_bundle(bundle).ok()?;
    [RESULT_FILE, ATTEMPTS_FILE].into_iter().find_map(|name| {
        dir.symlink_metadata(name)
            .is_ok_and(|m| m.is_dir())
            .then(|| {
                format!(
                    "{name} in the bundle is a folder; names starting with .distributor are reserved for the agent, which writes its own {name} there. Remove that folder from the bundle and deliver it again"
                )
            })
    })
}

/// Writes the result document into the bundle, then files it into `done/`
/// or `failed/`. Returns where it went. A "bundle" that is not a real folder
/// (a link swapped in before the claim) is filed away without writing
/// anything into it.
///
/// The bundle is its producer's, who may put a folder at the result's name
/// or take the agent's write access away after the claim: the result then
/// cannot be written inside, and the bundle is filed all the same (a
/// failed one with the agent's own copy of its result), so that what a
/// bundle holds never keeps it in `work/`. Only a full disk keeps it
/// there, to be filed at the next start.
pub fn finish(spool: &Spool, bundle: &Path, name: &str, report: &RunReport) -> io::Result<PathBuf> {
    let mut unwritten = None;
    let result = report.to_json();
    if is_real_folder(bundle)
        && let Err(e) = write_bookkeeping(bundle, RESULT_FILE, result.as_bytes())
    {
        if crate::fs::io_class::is_out_of_space(&e) {
            return Err(e);
        }
        unwritten = Some(e);
    }
    crate::runtime::failpoint::hit("spool.after_result");
    let moved = file_as(spool, bundle, name, report.ok)?;
    crate::runtime::failpoint::hit("spool.after_move");
    if let Some(e) = unwritten {
        log::warn!(
            "pipeline={} bundle={}: cannot write {RESULT_FILE} inside it ({e}); filed as {} without it{}",
            spool.pipeline_id,
            crate::text::escape::inert(name),
            moved.display(),
            if report.ok {
                ""
            } else {
                "; the agent's own copy of the result is what `spool show` prints"
            }
        );
    }
    if !report.ok
        && let Err(e) = keep_result(spool, &moved, result.as_bytes())
    {
        // A copy left by an earlier bundle of that name must not stand in.
        let stale = moved
            .file_name()
            .and_then(|n| n.to_str())
            .map(|n| forget_result(spool, n));
        log::warn!(
            "cannot keep the agent's copy of the result of {}: {e}{}; `spool list`, `spool show` and `status` mark the copy inside the bundle, which its producer can change, as unverified",
            moved.display(),
            match stale {
                Some(Err(e)) => format!(" (and cannot remove an older copy: {e})"),
                _ => String::new(),
            }
        );
    }
    Ok(moved)
}

/// The agent's own record of failed bundles' results, in the pipeline's
/// spool folder beside `failed/` (where producers have no access): the copy
/// inside a bundle belongs to its producer, who can rewrite it.
pub const RESULTS_DIR: &str = ".distributor-results";

impl Spool {
    /// Where the agent keeps its copy of the result of `failed/<name>`.
    /// Bundles are filed into `failed/` under names short enough for this
    /// one to fit (see [`names::FAILED_NAME_MAX`]).
    pub(crate) fn kept_result(&self, name: &str) -> (PathBuf, String) {
        (
            self.pipeline_folder().join(RESULTS_DIR),
            format!("{name}{}", names::KEPT_SUFFIX),
        )
    }

    /// The pipeline's own folder, which holds `inbox/`, `work/`, `done/`,
    /// `failed/` and the agent's lock and presence files.
    /// `<spool>/<pipeline>`: the agent's own folder of the pipeline, where
    /// its lock, its presence and the [`queue`] files live.
    pub fn pipeline_folder(&self) -> &Path {
        self.failed.parent().unwrap_or(&self.failed)
    }

    /// The folders the agent writes its bookkeeping into by replacing a
    /// file, which a kill can leave a temporary file in (see
    /// [`remove_stale_temps`]): `work/`, the pipeline's folder and its
    /// results folder, when they exist.
    pub fn bookkeeping_folders(&self) -> Vec<PathBuf> {
        let base = self.pipeline_folder();
        [self.work.clone(), base.to_owned(), base.join(RESULTS_DIR)]
            .into_iter()
            .filter(|f| f.is_dir())
            .collect()
    }
}

/// Writes the agent's copy of a failed bundle's result (`result`, the
/// result document).
fn keep_result(spool: &Spool, moved: &Path, result: &[u8]) -> io::Result<()> {
    let Some(name) = moved.file_name().and_then(|n| n.to_str()) else {
        return Ok(());
    };
    let (folder, file) = spool.kept_result(name);
    match fs::DirBuilder::new().mode(0o750).create(&folder) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    spoolfs::replace(&open_bundle(&folder)?, &file, result, false)
}

/// Removes the agent's copy of the result of `failed/<name>`, if any.
fn forget_result(spool: &Spool, name: &str) -> io::Result<()> {
    let (folder, file) = spool.kept_result(name);
    match open_bundle(&folder) {
        Ok(dir) => spoolfs::remove(&dir, &file).map(|_| ()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spool(tmp: &Path) -> Spool {
        let s = Spool {
            intake: false,
            pipeline_id: "p".into(),
            inbox: tmp.join("inbox"),
            work: tmp.join("work"),
            done: tmp.join("done"),
            failed: tmp.join("failed"),
            limits: crate::bundle::Limits::default(),
            signed: false,
            timing: Timing {
                settle: std::time::Duration::from_millis(250),
                incomplete_timeout: std::time::Duration::from_secs(600),
                once: false,
            },
        };
        s.create().unwrap();
        s
    }

    #[test]
    fn scan_finds_complete_bundles_in_arrival_order_and_ignores_staging() {
        let tmp = tempfile::tempdir().unwrap();
        let s = spool(tmp.path());
        for (name, manifest) in [("b", true), ("a", true), (".staging", true), ("c", false)] {
            fs::create_dir(s.inbox.join(name)).unwrap();
            if manifest {
                fs::write(s.inbox.join(name).join(MANIFEST), b"{}").unwrap();
            }
        }
        let old = SystemTime::now() - std::time::Duration::from_secs(60);
        fs::File::options()
            .write(true)
            .open(s.inbox.join("b").join(MANIFEST))
            .unwrap()
            .set_modified(old)
            .unwrap();
        fs::write(s.inbox.join("stray-file"), b"").unwrap();
        let scan = scan(&s.inbox).unwrap();
        let names: Vec<_> = scan.found.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["b", "a"]);
        assert_eq!(scan.incomplete, [s.inbox.join("c")]);
        assert_eq!(scan.strays, ["stray-file"]);
    }

    #[test]
    fn move_unique_never_replaces() {
        let tmp = tempfile::tempdir().unwrap();
        let s = spool(tmp.path());
        for _ in 0..3 {
            fs::create_dir(s.work.join("x")).unwrap();
            fs::write(s.work.join("x/f"), b"1").unwrap();
            move_unique(&s.work.join("x"), &s.done, "x", names::NAME_MAX).unwrap();
        }
        let mut names: Vec<_> = fs::read_dir(&s.done)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["x", "x.1", "x.2"]);
    }

    #[test]
    fn a_batch_left_by_a_crash_becomes_per_bundle_counters() {
        let tmp = tempfile::tempdir().unwrap();
        let s = spool(tmp.path());
        for name in ["fresh", "retried", "gone-to-done"] {
            fs::create_dir(s.work.join(name)).unwrap();
        }
        set_attempts(&s.work.join("retried"), 4).unwrap();
        fs::rename(s.work.join("gone-to-done"), s.done.join("gone-to-done")).unwrap();
        fs::create_dir(tmp.path().join("outside")).unwrap();
        let batch: Vec<(String, u32)> = [
            ("fresh", 1),
            ("retried", 3),
            ("gone-to-done", 1),
            ("../outside", 1),
        ]
        .iter()
        .map(|(n, a)| (n.to_string(), *a))
        .collect();
        begin_batch(&s, &batch).unwrap();

        settle_batch(&s).unwrap();
        assert_eq!(
            attempts(&s.work.join("fresh")),
            1,
            "the batch's attempt counts"
        );
        assert_eq!(
            attempts(&s.work.join("retried")),
            4,
            "a higher count is kept"
        );
        assert_eq!(
            attempts(&s.done.join("gone-to-done")),
            0,
            "only work/ is touched"
        );
        assert_eq!(
            attempts(&tmp.path().join("outside")),
            0,
            "names stay in work/"
        );
        assert!(!s.work.join(BATCH_FILE).exists());
        // Nothing to settle, or a torn file: no error, and the file goes.
        settle_batch(&s).unwrap();
        fs::write(s.work.join(BATCH_FILE), b"{\"fre").unwrap();
        settle_batch(&s).unwrap();
        assert!(!s.work.join(BATCH_FILE).exists());
    }

    #[test]
    fn retry_clears_result_and_attempts() {
        let tmp = tempfile::tempdir().unwrap();
        let s = spool(tmp.path());
        let b = s.failed.join("bad");
        fs::create_dir(&b).unwrap();
        fs::write(b.join(RESULT_FILE), br#"{"stage":"verify","error":"x"}"#).unwrap();
        set_attempts(&b, 3).unwrap();
        // Without the agent's own copy, the bundle's is not taken for it.
        let rows = list(&s, &[Folder::Failed]).unwrap();
        assert_eq!(rows[0].stage, None);
        assert_eq!(rows[0].error.as_deref(), Some(UNVERIFIED));
        let (kept, file) = s.kept_result("bad");
        fs::create_dir(&kept).unwrap();
        fs::write(kept.join(&file), br#"{"stage":"verify","error":"x"}"#).unwrap();
        let rows = list(&s, &[Folder::Failed]).unwrap();
        assert_eq!(rows[0].stage.as_deref(), Some("verify"));
        let back = retry(&s, "bad").unwrap();
        assert_eq!(back, s.inbox.join("bad"));
        assert!(!back.join(RESULT_FILE).exists());
        assert!(!kept.join(&file).exists());
        assert_eq!(attempts(&back), 0);
        assert!(retry(&s, "../etc").is_err());
        assert!(retry(&s, "missing").is_err());
    }

    fn mkfifo(path: &Path) {
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            path,
            rustix::fs::Mode::from_raw_mode(0o644),
        )
        .unwrap();
    }

    #[test]
    fn only_a_folder_at_a_bookkeeping_name_blocks_a_bundle() {
        let tmp = tempfile::tempdir().unwrap();
        let s = spool(tmp.path());
        type Plant<'a> = &'a dyn Fn(&Path);
        let cases: &[(&str, &str, Plant, bool)] = &[
            ("nothing", RESULT_FILE, &|_| {}, false),
            (
                "file",
                RESULT_FILE,
                &|p| fs::write(p, b"{}").unwrap(),
                false,
            ),
            (
                "link",
                ATTEMPTS_FILE,
                &|p| std::os::unix::fs::symlink("/etc", p).unwrap(),
                false,
            ),
            ("fifo", ATTEMPTS_FILE, &|p| mkfifo(p), false),
            (
                "result-folder",
                RESULT_FILE,
                &|p| fs::create_dir(p).unwrap(),
                true,
            ),
            (
                "attempts-folder",
                ATTEMPTS_FILE,
                &|p| fs::create_dir(p).unwrap(),
                true,
            ),
            (
                "other-reserved-folder",
                ".distributor-x",
                &|p| fs::create_dir(p).unwrap(),
                false,
            ),
        ];
        for (bundle, name, plant, blocked) in cases {
            let b = s.work.join(bundle);
            fs::create_dir(&b).unwrap();
            plant(&b.join(name));
            let why = bookkeeping_blocked(&b);
            assert_eq!(why.is_some(), *blocked, "{bundle}: {why:?}");
            if let Some(why) = why {
                assert!(why.contains(name) && why.contains("folder"), "{why}");
            }
        }
    }

    #[test]
    fn a_bundle_whose_result_cannot_be_written_inside_is_filed_all_the_same() {
        let tmp = tempfile::tempdir().unwrap();
        let s = spool(tmp.path());
        for (name, ok) in [("good", true), ("bad", false)] {
            let b = s.work.join(name);
            fs::create_dir_all(b.join(RESULT_FILE).join("inside")).unwrap();
            let report = if ok {
                RunReport::new("p", false)
            } else {
                RunReport::new("p", false).fail(crate::publish::Error::Prepare(io::Error::other(
                    "bad bytes",
                )))
            };
            let to = finish(&s, &b, name, &report).unwrap();
            let folder = if ok { &s.done } else { &s.failed };
            assert_eq!(to, folder.join(name));
            assert!(to.join(RESULT_FILE).join("inside").is_dir());
        }
        assert_eq!(fs::read_dir(&s.work).unwrap().count(), 0);
        let read = read_result(&s, Folder::Failed, "bad").unwrap();
        assert!(!read.unverified);
        assert_eq!(read.doc["error"], "bad bytes");
    }

    #[test]
    fn a_longest_name_is_filed_again_and_again_with_its_kept_result() {
        let tmp = tempfile::tempdir().unwrap();
        let s = spool(tmp.path());
        let name = format!("r{}", "é".repeat(127));
        assert_eq!(name.len(), names::NAME_MAX);
        let mut filed = Vec::new();
        for round in 0..3 {
            let b = s.work.join(&name);
            fs::create_dir(&b).unwrap();
            let report = RunReport::new("p", false).fail(crate::publish::Error::Prepare(
                io::Error::other(format!("round {round}")),
            ));
            let to = finish(&s, &b, &name, &report).unwrap();
            let filed_as = to.file_name().unwrap().to_str().unwrap().to_owned();
            assert!(filed_as.len() <= names::FAILED_NAME_MAX, "{filed_as}");
            let read = read_result(&s, Folder::Failed, &filed_as).unwrap();
            assert!(!read.unverified, "round {round}");
            assert_eq!(read.doc["error"], format!("round {round}"));
            filed.push(filed_as);
        }
        filed.sort();
        filed.dedup();
        assert_eq!(filed.len(), 3);
        // The same name is claimed into a work/ that still holds it.
        fs::create_dir(s.inbox.join(&name)).unwrap();
        fs::create_dir(s.work.join(&name)).unwrap();
        let claimed = move_unique(&s.inbox.join(&name), &s.work, &name, names::NAME_MAX).unwrap();
        assert_ne!(claimed, s.work.join(&name));
    }
}
