//! What the agent and the operator say to each other about a pipeline's
//! queue, kept as small files in the pipeline's spool folder (the agent's
//! own, where producers have no access; docs/operations.md, "Deferred
//! bundles, holds and flushes"):
//!
//! - [`DEFERRED_FILE`]: the bundle in `work/` whose transient failures the
//!   agent keeps retrying, with its attempts, the time of its first failure,
//!   the last error and the time of its next try. Written by the agent at
//!   each failure, so that a restart keeps the deferral's age, and read by
//!   `status` and `spool list`.
//! - [`HOLD_FILE`]: `spool hold` puts it, `spool release` removes it; while
//!   it is there the agent claims nothing of the pipeline.
//! - [`FLUSH_FILE`]: `spool flush` puts it; the agent removes it when it
//!   starts the attempt the flush asked for.
//!
//! Every file is read without following a link and with a size cap, and
//! written by replacing the entry.

use crate::catalog::format_time;
use crate::fs::spoolfs;
use serde::{Deserialize, Serialize};
use std::io;
use std::path::Path;
use std::time::Duration;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// The deferred bundle of a pipeline, in its spool folder.
pub const DEFERRED_FILE: &str = ".distributor-deferred.json";
/// A hold on a pipeline, in its spool folder.
pub const HOLD_FILE: &str = ".distributor-hold.json";
/// A request to try the deferred bundle now, in the pipeline's spool folder.
pub const FLUSH_FILE: &str = ".distributor-flush";
/// The agent's own verdicts on the inbox entries it refuses, in the
/// pipeline's spool folder ([`Verdict`]).
pub const VERDICTS_FILE: &str = ".distributor-inbox.json";
/// The most read of any of them (a deferral carries one error message).
const CAP: u64 = 64 << 10;
/// The most read of the verdicts (one reason per refused entry).
const VERDICTS_CAP: u64 = 16 << 20;

/// Why the agent does not claim an inbox entry it refuses: one it cannot
/// read, search or move with its own permissions. `status` and `spool list
/// --inbox` look at the inbox with their caller's, which may differ
/// (root sees everything as ready), so they show this instead
/// (docs/contract.md §13.4).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    /// A state of docs/contract.md §13.4 (`unreadable`).
    pub state: String,
    pub reason: String,
    /// When the agent came to it (RFC 3339).
    pub at: String,
}

/// The agent's verdicts, by inbox entry name (none when it recorded none).
pub fn verdicts(folder: &Path) -> std::collections::BTreeMap<String, Verdict> {
    let Ok(dir) = spoolfs::open_folder_io(folder) else {
        return Default::default();
    };
    spoolfs::read_capped(&dir, VERDICTS_FILE, VERDICTS_CAP)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Records the agent's verdicts (without fsync: the agent makes them again
/// at its next scan), or removes the record when there are none.
pub fn set_verdicts(
    folder: &Path,
    verdicts: &std::collections::BTreeMap<String, Verdict>,
) -> io::Result<()> {
    if verdicts.is_empty() {
        return remove(folder, VERDICTS_FILE).map(|_| ());
    }
    write(folder, VERDICTS_FILE, verdicts, false)
}

/// A bundle whose transient failures are retried (docs/contract.md §18.1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deferral {
    /// Its name in `work/`.
    pub bundle: String,
    /// Attempts made so far.
    pub attempts: u32,
    /// When its first attempt failed (RFC 3339).
    pub since: String,
    /// The stage of the last failure.
    pub stage: String,
    /// The last failure's message.
    pub last_error: String,
    /// When it is tried next (RFC 3339).
    pub next_try: String,
}

impl Deferral {
    /// When its first attempt failed.
    pub fn since(&self) -> Option<OffsetDateTime> {
        OffsetDateTime::parse(&self.since, &Rfc3339).ok()
    }

    /// How long it has been deferred at `now`.
    #[cfg(test)]
    pub fn age(&self, now: OffsetDateTime) -> Duration {
        self.since()
            .map(|s| (now - s).try_into().unwrap_or_default())
            .unwrap_or_default()
    }

    /// When it is tried next.
    pub fn next_try(&self) -> Option<OffsetDateTime> {
        OffsetDateTime::parse(&self.next_try, &Rfc3339).ok()
    }

    /// One line for an operator: attempts, since when, next try, last error.
    pub fn summary(&self) -> String {
        format!(
            "{} attempt(s) since {}, next try {}, last error at {}: {}",
            self.attempts,
            self.since,
            self.next_try,
            self.stage,
            crate::text::escape::inert(&self.last_error)
        )
    }
}

/// A hold on a pipeline (docs/contract.md §18.5).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    /// When it was put (RFC 3339).
    pub since: String,
}

/// Reads `name` in `folder`: `None` when it is not there; an error when it
/// is there but cannot be read or is not what the agent writes.
fn read<T: for<'de> Deserialize<'de>>(folder: &Path, name: &str) -> io::Result<Option<T>> {
    let dir = match spoolfs::open_folder_io(folder) {
        Ok(dir) => dir,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let bytes = match spoolfs::read_capped(&dir, name, CAP) {
        Ok(b) => b,
        Err(e) if e.is_missing() => return Ok(None),
        Err(e) => {
            return Err(io::Error::other(format!(
                "{}: {e}",
                folder.join(name).display()
            )));
        }
    };
    serde_json::from_slice(&bytes).map(Some).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {e}", folder.join(name).display()),
        )
    })
}

fn write<T: Serialize>(folder: &Path, name: &str, value: &T, durable: bool) -> io::Result<()> {
    let bytes = serde_json::to_vec(value).map_err(io::Error::other)?;
    spoolfs::replace(&spoolfs::open_folder_io(folder)?, name, &bytes, durable)
}

fn remove(folder: &Path, name: &str) -> io::Result<bool> {
    match spoolfs::open_folder_io(folder) {
        Ok(dir) => spoolfs::remove(&dir, name),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// The deferred bundle recorded in the pipeline spool folder `folder`.
pub fn deferral(folder: &Path) -> io::Result<Option<Deferral>> {
    read(folder, DEFERRED_FILE)
}

/// Records `d` as the pipeline's deferred bundle. Written without fsync: a
/// power cut that loses it only restarts the deferral's clock.
pub fn defer(folder: &Path, d: &Deferral) -> io::Result<()> {
    write(folder, DEFERRED_FILE, d, false)
}

/// The pipeline has no deferred bundle any more.
pub fn undefer(folder: &Path) -> io::Result<()> {
    remove(folder, DEFERRED_FILE).map(|_| ())
}

/// The hold on the pipeline, if any.
pub fn hold(folder: &Path) -> io::Result<Option<Hold>> {
    read(folder, HOLD_FILE)
}

/// Whether the pipeline is held, and since when: a hold that cannot be
/// read holds (releasing is the operator's call), its time then saying why.
pub fn held(folder: &Path) -> Option<String> {
    match hold(folder) {
        Ok(Some(h)) => Some(h.since),
        Ok(None) => None,
        Err(e) => Some(format!("an unknown time ({e})")),
    }
}

/// Puts a hold on the pipeline (kept if one is there): returns the hold in
/// force. Durable, since it must survive a power cut as it does a restart.
pub fn put_hold(folder: &Path, now: OffsetDateTime) -> io::Result<Hold> {
    if let Ok(Some(h)) = hold(folder) {
        return Ok(h);
    }
    let h = Hold {
        since: format_time(now),
    };
    write(folder, HOLD_FILE, &h, true)?;
    Ok(h)
}

/// Lifts the hold; false when there was none.
pub fn release(folder: &Path) -> io::Result<bool> {
    remove(folder, HOLD_FILE)
}

/// Asks the agent to try the pipeline's deferred bundle now.
pub fn request_flush(folder: &Path, now: OffsetDateTime) -> io::Result<()> {
    write(folder, FLUSH_FILE, &format_time(now), false)
}

/// Whether a flush is asked for (and not yet taken).
pub fn flush_requested(folder: &Path) -> bool {
    spoolfs::open_folder_io(folder)
        .map(|dir| dir.symlink_metadata(FLUSH_FILE).is_ok())
        .unwrap_or(false)
}

/// Takes the flush request: the attempt it asked for starts.
pub fn take_flush(folder: &Path) -> io::Result<bool> {
    remove(folder, FLUSH_FILE)
}

/// The pause after failed attempt `attempt` (1 for the first): 1 s,
/// doubling, capped at `max` (docs/contract.md §18.1).
pub fn backoff(attempt: u32, max: Duration) -> Duration {
    Duration::from_secs(1u64 << attempt.saturating_sub(1).min(30)).min(max)
}

/// What to do after a transient failure of a bundle deferred since
/// `since`, that has now been tried `attempts` times (docs/contract.md
/// §18.1): `Some(pause)` to try again after `pause`, or `None` to fail it.
pub fn next_pause(
    attempts: u32,
    deferred_for: Duration,
    agent: &crate::config::AgentConfig,
) -> Option<Duration> {
    if agent.max_attempts.is_some_and(|max| attempts >= max) || deferred_for >= agent.defer_for {
        return None;
    }
    Some(backoff(attempts, agent.retry_max_interval))
}

/// What publications of a pipeline deleted, by destination and output
/// path, in the pipeline's spool folder: the retracted outputs that
/// `signatures.refuse_older` keeps an older bundle from writing again
/// (docs/security.md, "What replay protection covers"). The catalog cannot
/// hold them: a deleted output has no record.
pub const TOMBSTONES_FILE: &str = ".distributor-tombstones.json";
/// Paths remembered per destination; past it the oldest deletions go.
pub const TOMBSTONES_KEPT: usize = 100_000;
/// The most read of them: 100,000 paths of up to 4 KiB for each
/// destination fit many times over.
const TOMBSTONES_CAP: u64 = 4 << 30;

/// One deleted output: the source whose publication deleted it, and that
/// source's `created`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tombstone {
    pub source: String,
    #[serde(with = "crate::catalog::rfc3339")]
    pub created: time::OffsetDateTime,
}

/// Destination id -> output path -> its tombstone.
pub type Tombstones =
    std::collections::BTreeMap<String, std::collections::BTreeMap<String, Tombstone>>;

/// The pipeline's tombstones (none when it has none); an error when they
/// cannot be read (they are then never written over).
pub fn tombstones(folder: &Path) -> io::Result<Tombstones> {
    let dir = match spoolfs::open_folder_io(folder) {
        Ok(dir) => dir,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Tombstones::new()),
        Err(e) => return Err(e),
    };
    match spoolfs::read_capped(&dir, TOMBSTONES_FILE, TOMBSTONES_CAP) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{TOMBSTONES_FILE} is not what the agent writes ({e})"),
            )
        }),
        Err(e) if e.is_missing() => Ok(Tombstones::new()),
        Err(e) => Err(io::Error::other(format!("{TOMBSTONES_FILE}: {e}"))),
    }
}

/// Writes the pipeline's tombstones (durably: a lost one lets a replay
/// bring a retracted page back), keeping the newest [`TOMBSTONES_KEPT`]
/// per destination.
pub fn set_tombstones(folder: &Path, tombstones: &mut Tombstones) -> io::Result<()> {
    for paths in tombstones.values_mut() {
        if paths.len() > TOMBSTONES_KEPT {
            let mut by_age: Vec<(time::OffsetDateTime, String)> =
                paths.iter().map(|(p, t)| (t.created, p.clone())).collect();
            by_age.sort();
            for (_, path) in by_age.into_iter().take(paths.len() - TOMBSTONES_KEPT) {
                paths.remove(&path);
            }
        }
    }
    tombstones.retain(|_, paths| !paths.is_empty());
    if tombstones.is_empty() {
        return remove(folder, TOMBSTONES_FILE).map(|_| ());
    }
    write(folder, TOMBSTONES_FILE, tombstones, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::AgentConfig;

    const S: u64 = 1;
    const M: u64 = 60;

    #[test]
    fn backoff_starts_at_a_second_doubles_and_caps() {
        // (attempt that failed, cap, pause before the next one)
        let cases = [
            (0, 600, 1),
            (1, 600, 1),
            (2, 600, 2),
            (3, 600, 4),
            (9, 600, 256),
            (10, 600, 512),
            (11, 600, 600),
            (5000, 600, 600),
            (u32::MAX, 600, 600),
            (3, 1, 1),
            (40, 1 << 31, 1 << 30),
        ];
        for (attempt, cap, pause) in cases {
            assert_eq!(
                backoff(attempt, Duration::from_secs(cap)),
                Duration::from_secs(pause),
                "attempt {attempt} cap {cap}s"
            );
        }
    }

    #[test]
    fn a_deferral_ends_at_defer_for_or_max_attempts_whichever_comes_first() {
        let agent = |max: Option<u32>, defer: u64| AgentConfig {
            max_attempts: max,
            defer_for: Duration::from_secs(defer),
            retry_max_interval: Duration::from_secs(10 * M),
            ..AgentConfig::default()
        };
        // (max_attempts, defer_for, attempts made, deferred for, next pause)
        type Case = (Option<u32>, u64, u32, u64, Option<u64>);
        let cases: [Case; 9] = [
            // The defaults: unset attempts, a day.
            (None, 86_400, 1, 0, Some(S)),
            (None, 86_400, 4, 7, Some(8 * S)),
            (None, 86_400, 200, 86_399, Some(10 * M)),
            (None, 86_400, 200, 86_400, None),
            // max_attempts set: whichever bound comes first.
            (Some(5), 86_400, 4, 15, Some(8 * S)),
            (Some(5), 86_400, 5, 15, None),
            (Some(50), 60, 7, 60, None),
            // defer_for 0s: the first transient failure fails.
            (None, 0, 1, 0, None),
            (Some(1), 86_400, 1, 0, None),
        ];
        for (max, defer, attempts, deferred_for, pause) in cases {
            assert_eq!(
                next_pause(
                    attempts,
                    Duration::from_secs(deferred_for),
                    &agent(max, defer)
                ),
                pause.map(Duration::from_secs),
                "max_attempts {max:?} defer_for {defer}s after attempt {attempts} deferred {deferred_for}s"
            );
        }
    }

    #[test]
    fn records_round_trip_and_a_planted_link_is_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path();
        assert_eq!(deferral(folder).unwrap(), None);
        let now = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let d = Deferral {
            bundle: "b1".into(),
            attempts: 3,
            since: format_time(now),
            stage: "lock".into(),
            last_error: "no lock".into(),
            next_try: format_time(now + Duration::from_secs(4)),
        };
        defer(folder, &d).unwrap();
        assert_eq!(deferral(folder).unwrap(), Some(d.clone()));
        assert_eq!(
            d.age(now + Duration::from_secs(90)),
            Duration::from_secs(90)
        );
        undefer(folder).unwrap();
        assert_eq!(deferral(folder).unwrap(), None);

        let h = put_hold(folder, now).unwrap();
        assert_eq!(put_hold(folder, now + Duration::from_secs(5)).unwrap(), h);
        assert!(release(folder).unwrap());
        assert!(!release(folder).unwrap());

        let outside = dir.path().join("outside.json");
        std::fs::write(&outside, serde_json::to_vec(&d).unwrap()).unwrap();
        std::os::unix::fs::symlink(&outside, folder.join(DEFERRED_FILE)).unwrap();
        assert!(deferral(folder).is_err(), "a link is not read through");
        request_flush(folder, now).unwrap();
        assert!(flush_requested(folder));
        assert!(take_flush(folder).unwrap());
        assert!(!flush_requested(folder));
    }
}
