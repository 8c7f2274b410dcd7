//! The intent layer of the s3 commit protocol (docs/object-storage.md,
//! "The commit protocol"): the lease's timing, the intent record a
//! publication writes first and renews while it works, and what both the
//! publication ([`super::protocol`]) and its recovery ([`super::recovery`])
//! read off the catalog. Neither of those is needed here.

use std::time::{Duration, Instant};

use object_store::{PutMode, UpdateVersion};
use serde::{Deserialize, Serialize};

use super::{ETag, Error, Result, S3Root};
use crate::catalog::{Catalog, State};

/// Folder (below the root's prefix) of the intent records.
pub const PENDING_DIR: &str = ".distributor-pending";

/// Timing of the intent lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// An intent not renewed for this long (server clock) is stale.
    pub lease: Duration,
    /// The owner renews its intent when this much has passed since the
    /// last renewal (its own monotonic clock).
    pub renew_every: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            lease: Duration::from_secs(5 * 60),
            renew_every: Duration::from_secs(30),
        }
    }
}

/// Environment variable setting the intent lease in whole seconds
/// (docs/object-storage.md, "Lease"); the owner renews every tenth of it.
pub const LEASE_ENV: &str = "DISTRIBUTOR_S3_LEASE_SECS";

impl Settings {
    /// The settings a process uses: the lease from [`LEASE_ENV`] when it is
    /// set (else 5 minutes). Debug builds (the ones `cargo test` runs) also
    /// take a lease below 2 s, 0 included, so that a test need not wait
    /// for a killed publisher's intent to go stale. The error names the
    /// variable and says what to do.
    pub fn for_process() -> Result<Settings> {
        let value = std::env::var(LEASE_ENV).ok();
        #[cfg(debug_assertions)]
        if let Some(secs @ 0..2) = value.as_deref().and_then(|v| v.trim().parse::<u64>().ok()) {
            let lease = Duration::from_secs(secs);
            return Ok(Settings {
                lease,
                renew_every: lease / 10,
            });
        }
        lease_settings(value.as_deref()).map_err(Error::Setting)
    }
}

/// The lease settings for the value of [`LEASE_ENV`] (`None`: unset, the
/// default of 5 minutes). At least 2 s: ages are measured on the server's
/// `Last-Modified`, which has whole seconds.
fn lease_settings(value: Option<&str>) -> Result<Settings, String> {
    let Some(value) = value.filter(|v| !v.is_empty()) else {
        return Ok(Settings::default());
    };
    match value.trim().parse::<u64>() {
        Ok(secs @ 2..=86_400) => Ok(Settings {
            lease: Duration::from_secs(secs),
            renew_every: Duration::from_secs(secs) / 10,
        }),
        _ => Err(format!(
            "{LEASE_ENV} is {value:?}, not a whole number of seconds from 2 to 86400; fix it in the publisher's environment, or unset it for the default of {} s",
            Settings::default().lease.as_secs()
        )),
    }
}

/// One recorded object to delete once the catalog no longer records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delete {
    pub path: String,
    /// The sha256 the catalog recorded for it.
    pub sha256: String,
}

/// The pending-intent record, `.distributor-pending/<id>.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Intent {
    pub id: String,
    /// Who wrote it: host name and process id, for operators.
    pub owner: String,
    /// Bumped by every renewal, so each renewal has a new ETag.
    pub renewals: u64,
    /// Set by a recoverer: the owner must not go on.
    pub revoked: bool,
    /// For an agent's publication: `host:spool-folder` of the pipeline it
    /// serves. Only one agent serves a spool folder at a time (it holds the
    /// folder's lock), so the next agent there knows the owner is dead and
    /// recovers the intent at once ([`crate::s3::recovery::recover_abandoned`]) instead of
    /// waiting for the lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spool: Option<String>,
    pub writes: Vec<IntentWrite>,
    pub deletes: Vec<Delete>,
}

/// One key an intent writes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IntentWrite {
    pub path: String,
    pub sha256: String,
    /// Whether the key was recorded in the catalog (a replacement).
    pub replaces: bool,
}

pub(super) fn intent_key(id: &str) -> String {
    format!("{PENDING_DIR}/{id}.json")
}

fn host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown-host".to_owned())
}

pub(super) fn owner() -> String {
    format!("{} pid {}", host(), std::process::id())
}

/// The `host:spool` an intent of an agent serving `spool` on this host
/// carries (see [`Intent::spool`]).
pub fn spool_tag(spool: &str) -> String {
    format!("{}:{spool}", host())
}

/// The catalog a compare-and-swap writes: `next` with `updated_at` moved
/// past `prev`'s if needed, so that no two versions have the same bytes.
pub fn monotonic(next: Catalog, prev: &State) -> Catalog {
    match prev {
        State::Catalog(prev) => later_than(next, prev.updated_at),
        _ => next,
    }
}

/// [`monotonic`] after a catalog updated at `prev`.
pub fn later_than(mut next: Catalog, prev: time::OffsetDateTime) -> Catalog {
    if next.updated_at <= prev {
        next.updated_at = prev + Duration::from_millis(1);
    }
    next
}

/// The sha256 recorded for `path` in `state`, if any.
pub(super) fn recorded(state: &State, path: &str) -> Option<String> {
    match state {
        State::Catalog(c) => c.get(path).map(|r| r.sha256.to_string()),
        _ => None,
    }
}

/// A live intent held by this process.
pub(super) struct Session<'r> {
    pub(super) root: &'r S3Root,
    pub(super) settings: Settings,
    pub(super) intent: Intent,
    pub(super) etag: ETag,
    pub(super) renewed: Instant,
}

impl<'r> Session<'r> {
    pub(super) fn begin(
        root: &'r S3Root,
        settings: Settings,
        intent: Intent,
    ) -> Result<Session<'r>> {
        let renewed = Instant::now();
        let bytes = serde_json::to_vec_pretty(&intent).unwrap_or_default();
        let etag = root.put_json(&intent_key(&intent.id), bytes, PutMode::Create)?;
        Ok(Session {
            root,
            settings,
            intent,
            etag,
            renewed,
        })
    }

    /// Renews the lease when due; fails when a recoverer revoked it.
    pub(super) fn keep_alive(&mut self) -> Result<()> {
        if self.renewed.elapsed() < self.settings.renew_every {
            return Ok(());
        }
        let started = Instant::now();
        self.intent.renewals += 1;
        let bytes = serde_json::to_vec_pretty(&self.intent).unwrap_or_default();
        let mode = PutMode::Update(UpdateVersion {
            e_tag: Some(self.etag.0.clone()),
            version: None,
        });
        match self
            .root
            .put_json(&intent_key(&self.intent.id), bytes, mode)
        {
            Ok(etag) => {
                self.etag = etag;
                self.renewed = started;
                Ok(())
            }
            Err(Error::Changed { .. }) => Err(Error::Revoked {
                root: self.root.label.clone(),
                id: self.intent.id.clone(),
                lease_secs: self.settings.lease.as_secs(),
            }),
            Err(e) => Err(e),
        }
    }
}

/// Deletes `d` if the catalog no longer records it and it still holds the
/// recorded bytes.
pub(super) fn delete_if_unrecorded_and_unchanged(
    root: &S3Root,
    state: &State,
    d: &Delete,
) -> Result<()> {
    if recorded(state, &d.path).is_some() {
        return Ok(());
    }
    if let Some(head) = root.head(&d.path)? {
        let same = match head.sha256 {
            Some(sha) => sha == d.sha256,
            None => root
                .get_hashed(&d.path)?
                .is_some_and(|(h, _)| h.sha256 == d.sha256),
        };
        if same {
            root.delete(&d.path)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_settings_from_the_environment() {
        let default = Settings::default();
        let secs = |lease: u64, renew_ms: u64| Settings {
            lease: Duration::from_secs(lease),
            renew_every: Duration::from_millis(renew_ms),
        };
        let cases: [(Option<&str>, Option<Settings>); 9] = [
            (None, Some(default)),
            (Some(""), Some(default)),
            (Some("300"), Some(default)),
            (Some("2"), Some(secs(2, 200))),
            (Some(" 45 "), Some(secs(45, 4_500))),
            (Some("1"), None),
            (Some("0"), None),
            (Some("5m"), None),
            (Some("86401"), None),
        ];
        for (value, expected) in cases {
            let got = lease_settings(value);
            match expected {
                Some(s) => assert_eq!(got, Ok(s), "{value:?}"),
                None => {
                    let e = got.expect_err(value.unwrap_or_default());
                    assert!(e.contains(LEASE_ENV) && e.contains("300 s"), "{e}");
                }
            }
        }
    }
}
