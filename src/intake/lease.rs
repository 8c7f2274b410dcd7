//! The lease of an intake pipeline (docs/contract.md §22.2): the object
//! `<path>/.distributor-lease`, created with `If-None-Match: *`, renewed
//! and taken over with `If-Match`, holding the holder's host, pid and an
//! epoch that grows by one at each takeover.
//!
//! Nothing here trusts another host's clock. A standby decides that a
//! lease lapsed when the object's version has not changed for a whole
//! `lease` on its own monotonic clock; the holder counts its lease as
//! lost once a `lease` has passed since it *sent* its last successful
//! renewal (a standby that saw that renewal waits a `lease` after seeing
//! it, which is later). Both count on the boot-time clock ([`Boot`]), which
//! counts a suspension of the host: a holder resumed after one longer than
//! its lease knows, without asking, that it lost the lease. The argument,
//! and the window that remains, are in docs/object-storage.md ("Intake").

use crate::runtime::clock::Boot;
use crate::s3::{self, ETag, S3Root};
use serde::{Deserialize, Serialize};
use std::sync::Mutex;
use std::time::Duration;

/// The lease object, below the intake's `<path>`.
pub const LEASE_KEY: &str = ".distributor-lease";
/// The most of the lease object that is read.
const LEASE_CAP: u64 = 4096;

/// What the lease object says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub host: String,
    pub pid: u32,
    /// 1 for the first holder, one more at each takeover.
    pub epoch: u64,
    /// The holder's clock when it wrote this version (for people; no
    /// decision reads it). Every renewal changes it, and with it the
    /// object's version.
    pub renewed: String,
    /// Renewals since this holder took the lease.
    pub renewals: u64,
    /// The holder gave the lease up at a clean stop: the next agent takes
    /// it at once.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub released: bool,
}

impl Record {
    fn mine(epoch: u64, renewals: u64) -> Record {
        Record {
            host: host_name(),
            pid: std::process::id(),
            epoch,
            renewed: crate::catalog::format_time(time::OffsetDateTime::now_utc()),
            renewals,
            released: false,
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let mut b = serde_json::to_vec_pretty(self).expect("a lease record serializes");
        b.push(b'\n');
        b
    }

    /// `host pid N, epoch E`.
    pub fn holder(&self) -> String {
        format!("{} pid {}, epoch {}", self.host, self.pid, self.epoch)
    }
}

/// This machine's name, for the lease record and `status`.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown-host".to_owned())
}

/// The lease object as it is now: its record (`None` when it does not
/// parse) and version, or `None` when there is no lease object.
pub fn read(bucket: &S3Root) -> s3::Result<Option<(Option<Record>, ETag, time::OffsetDateTime)>> {
    Ok(bucket.get_small(LEASE_KEY, LEASE_CAP)?.map(|small| {
        (
            serde_json::from_slice(&small.bytes).ok(),
            small.etag,
            small.last_modified,
        )
    }))
}

/// What a standby keeps about the lease between looks.
#[derive(Debug, Default)]
pub struct Watch {
    /// The version last seen, and since when.
    seen: Option<(ETag, Boot)>,
}

/// What one attempt to take the lease found.
#[derive(Debug)]
pub enum Attempt {
    /// This agent holds it now.
    Taken(Held),
    /// Another agent holds it (its record, when it parses), renewed within
    /// the last `lease` as far as this agent can tell.
    HeldBy(Option<Record>),
}

impl Watch {
    /// Takes the lease when there is none or when it lapsed: its version
    /// unchanged for `lease` since this watch first saw it.
    pub fn attempt(&mut self, bucket: &S3Root, lease: Duration) -> s3::Result<Attempt> {
        let current = read(bucket)?;
        let Some((record, etag, _)) = current else {
            let mine = Record::mine(1, 0);
            return match bucket.put_new(LEASE_KEY, &mut &mine.bytes()[..], None, "lease") {
                Ok(w) => Ok(Attempt::Taken(Held::new(mine, w.etag, lease))),
                Err(s3::Error::Exists { .. } | s3::Error::Changed { .. }) => {
                    Ok(Attempt::HeldBy(None))
                }
                Err(e) => Err(e),
            };
        };
        let since = match &self.seen {
            Some((seen, since)) if *seen == etag => *since,
            _ => {
                let now = Boot::now();
                self.seen = Some((etag.clone(), now));
                now
            }
        };
        let released = record.as_ref().is_some_and(|r| r.released);
        if since.elapsed() < lease && !released {
            return Ok(Attempt::HeldBy(record));
        }
        let epoch = record.as_ref().map_or(0, |r| r.epoch) + 1;
        let mine = Record::mine(epoch, 0);
        let started = Boot::now();
        match bucket.put_replace(LEASE_KEY, &mut &mine.bytes()[..], &etag, None, "lease") {
            Ok(w) => {
                self.seen = None;
                let mut held = Held::new(mine, w.etag, lease);
                held.took_over = record;
                held.state.lock().expect("fresh").sent = started;
                Ok(Attempt::Taken(held))
            }
            Err(s3::Error::Changed { .. } | s3::Error::Exists { .. }) => {
                Ok(Attempt::HeldBy(record))
            }
            Err(e) => Err(e),
        }
    }
}

/// A lease this agent holds.
#[derive(Debug)]
pub struct Held {
    lease: Duration,
    /// The holder whose lapsed lease this one took over, if any.
    pub took_over: Option<Record>,
    state: Mutex<HeldState>,
    /// Held across each request on the lease (a renewal, a check), so
    /// that a check never compares the server's version with the one a
    /// renewal in flight is replacing.
    requests: Mutex<()>,
}

#[derive(Debug)]
struct HeldState {
    record: Record,
    etag: ETag,
    /// When the last successful write of the lease was sent.
    sent: Boot,
    /// Another agent's version was found where ours should be.
    lost: bool,
}

/// Why this agent no longer holds its lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lost(pub String);

impl std::fmt::Display for Lost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Held {
    fn new(record: Record, etag: ETag, lease: Duration) -> Held {
        Held {
            lease,
            took_over: None,
            state: Mutex::new(HeldState {
                record,
                etag,
                sent: Boot::now(),
                lost: false,
            }),
            requests: Mutex::new(()),
        }
    }

    fn one_request(&self) -> std::sync::MutexGuard<'_, ()> {
        self.requests.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn state(&self) -> std::sync::MutexGuard<'_, HeldState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The lease's length.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    pub fn epoch(&self) -> u64 {
        self.state().record.epoch
    }

    /// Whether this agent may still count the lease as its own without
    /// asking the server: not found lost, and less than a `lease` since
    /// its last successful renewal was sent.
    pub fn valid(&self) -> Result<(), Lost> {
        let s = self.state();
        if s.lost {
            return Err(Lost(format!(
                "another agent took over the intake lease (this agent held epoch {})",
                s.record.epoch
            )));
        }
        let since = s.sent.elapsed();
        if since >= self.lease {
            return Err(Lost(format!(
                "the intake lease was last renewed {} ago, longer than the lease ({}); another agent may hold it now",
                crate::config::format_duration(since),
                crate::config::format_duration(self.lease)
            )));
        }
        Ok(())
    }

    /// Renews the lease (`If-Match` on the version this agent wrote last).
    /// A version not ours means another agent took over: lost for good.
    pub fn renew(&self, bucket: &S3Root) -> Result<(), RenewError> {
        let _one = self.one_request();
        self.valid().map_err(RenewError::Lost)?;
        let (record, etag) = {
            let s = self.state();
            let mut r = s.record.clone();
            r.renewals += 1;
            r.renewed = crate::catalog::format_time(time::OffsetDateTime::now_utc());
            (r, s.etag.clone())
        };
        let sent = Boot::now();
        match bucket.put_replace(LEASE_KEY, &mut &record.bytes()[..], &etag, None, "lease") {
            Ok(w) => {
                let mut s = self.state();
                s.record = record;
                s.etag = w.etag;
                s.sent = sent;
                Ok(())
            }
            Err(s3::Error::Changed { .. } | s3::Error::Exists { .. }) => {
                // A retried request whose first try was applied meets its
                // own write: the server has this very record.
                if let Ok(Some((Some(now), etag, _))) = read(bucket)
                    && now == record
                {
                    let mut s = self.state();
                    s.record = record;
                    s.etag = etag;
                    s.sent = sent;
                    return Ok(());
                }
                self.state().lost = true;
                Err(RenewError::Lost(self.valid().expect_err("just lost")))
            }
            Err(e) => Err(RenewError::Failed(e)),
        }
    }

    /// The check before a commit (docs/contract.md §22.3): the lease is
    /// valid here and the server still has this agent's version.
    pub fn check(&self, bucket: &S3Root) -> Result<(), Lost> {
        let _one = self.one_request();
        self.valid()?;
        let etag = self.state().etag.clone();
        match read(bucket) {
            Ok(Some((_, now, _))) if super::same_version(&now, &etag) => self.valid(),
            Ok(_) => {
                self.state().lost = true;
                self.valid()
            }
            Err(e) => Err(Lost(format!(
                "cannot read the intake lease to check that it is still this agent's ({e})"
            ))),
        }
    }

    /// Gives the lease up at a clean stop, so that a standby takes over
    /// at once (with the next epoch): marks it released, if it is still
    /// this agent's version.
    pub fn release(&self, bucket: &S3Root) {
        let _one = self.one_request();
        if self.valid().is_err() {
            return;
        }
        let (mut record, etag) = {
            let s = self.state();
            (s.record.clone(), s.etag.clone())
        };
        record.released = true;
        if let Err(e) =
            bucket.put_replace(LEASE_KEY, &mut &record.bytes()[..], &etag, None, "lease")
        {
            log::warn!(
                "cannot give up the intake lease ({e}); a standby takes over once it lapses"
            );
        }
        self.state().lost = true;
    }
}

/// Why a renewal did not happen.
#[derive(Debug)]
pub enum RenewError {
    Lost(Lost),
    /// The request failed; the lease holds until [`Held::valid`] says no.
    Failed(s3::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket() -> S3Root {
        crate::s3::tests::memory_root("intake")
    }

    #[test]
    fn the_first_agent_takes_a_missing_lease_at_epoch_one() {
        let b = bucket();
        let Attempt::Taken(held) = Watch::default()
            .attempt(&b, Duration::from_secs(30))
            .unwrap()
        else {
            panic!("not taken")
        };
        assert_eq!(held.epoch(), 1);
        let (record, _, _) = read(&b).unwrap().unwrap();
        assert_eq!(record.unwrap().pid, std::process::id());
    }

    #[test]
    fn a_standby_waits_a_whole_lease_of_no_change_then_takes_over_with_the_next_epoch() {
        let b = bucket();
        let lease = Duration::from_millis(300);
        let Attempt::Taken(first) = Watch::default().attempt(&b, lease).unwrap() else {
            panic!()
        };
        let mut standby = Watch::default();
        assert!(matches!(
            standby.attempt(&b, lease).unwrap(),
            Attempt::HeldBy(Some(_))
        ));
        // A renewal changes the version: the standby's wait starts again.
        first.renew(&b).unwrap();
        assert!(matches!(
            standby.attempt(&b, lease).unwrap(),
            Attempt::HeldBy(Some(_))
        ));
        std::thread::sleep(lease);
        let Attempt::Taken(second) = standby.attempt(&b, lease).unwrap() else {
            panic!("a lapsed lease is taken over")
        };
        assert_eq!(second.epoch(), 2);
        // The first holder finds out at its next renewal or check.
        assert!(matches!(first.renew(&b), Err(RenewError::Lost(_))));
        assert!(first.check(&b).is_err());
        assert!(second.check(&b).is_ok());
    }

    #[test]
    fn a_holder_that_could_not_renew_for_a_lease_counts_itself_out() {
        let b = bucket();
        let lease = Duration::from_millis(100);
        let Attempt::Taken(held) = Watch::default().attempt(&b, lease).unwrap() else {
            panic!()
        };
        assert!(held.valid().is_ok());
        std::thread::sleep(lease);
        assert!(held.valid().is_err());
        // Even though the server still has its version.
        assert!(held.check(&b).is_err());
    }

    #[test]
    fn a_released_lease_is_taken_at_once() {
        let b = bucket();
        let lease = Duration::from_secs(30);
        let Attempt::Taken(held) = Watch::default().attempt(&b, lease).unwrap() else {
            panic!()
        };
        held.release(&b);
        let Attempt::Taken(next) = Watch::default().attempt(&b, lease).unwrap() else {
            panic!("a released lease is taken at once")
        };
        assert_eq!(next.epoch(), 2);
    }
}
