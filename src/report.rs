//! The result documents of a publication: the `run --json` shape (also the
//! spool's `.distributor-result.json`) and its text form. Formatting only;
//! nothing here decides or performs anything.

use crate::text::escape::inert;
use serde::Serialize;
use std::fmt::{self, Write as _};
use std::sync::Arc;
use std::time::Duration;

/// What a report needs to know of the error a publication failed with:
/// where it happened, whether trying again later may succeed, and whether
/// planning refused it. `publish::Error` is the one implementation; this
/// module knows it only through the trait, so that it stays below
/// `publish` (no import circle).
pub trait Failure: std::error::Error + Send + Sync + 'static {
    /// The step the publication stopped at (docs/contract.md §11.20).
    fn stage(&self) -> Stage;
    /// Publishing the same bundle again later may succeed without anyone
    /// changing anything.
    fn is_transient(&self) -> bool;
    /// Planning refused the publication (exit 3).
    fn is_refused(&self) -> bool;
}

/// The error a publication failed with: the value itself, not its text,
/// plus what the agent added to its message after giving up on it. It
/// serialises as the message (the `error` key of the result document).
#[derive(Debug, Clone)]
pub struct RunError {
    failure: Arc<dyn Failure>,
    /// Appended to the message, as it is: the agent's account of its
    /// attempts (empty when there is none).
    note: String,
}

impl RunError {
    pub fn new(failure: impl Failure) -> RunError {
        RunError {
            failure: Arc::new(failure),
            note: String::new(),
        }
    }

    /// The error value.
    pub fn failure(&self) -> &dyn Failure {
        &*self.failure
    }

    /// Adds `text` at the end of the message.
    pub fn add_note(&mut self, text: &str) {
        self.note.push_str(text);
    }

    /// The process exit code of a publication that failed with this
    /// error (docs/contract.md §9).
    pub fn exit_code(&self) -> u8 {
        use crate::runtime::exit::{EXIT_FAILURE, EXIT_REFUSED, EXIT_USAGE};
        match self.failure.stage() {
            Stage::Config => EXIT_USAGE,
            Stage::Plan if self.failure.is_refused() => EXIT_REFUSED,
            _ => EXIT_FAILURE,
        }
    }
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.failure, self.note)
    }
}

impl Serialize for RunError {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Where a failure happened (docs/contract.md §11.20).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    Config,
    Verify,
    Plan,
    Lock,
    Publish,
    Spool,
}

impl Stage {
    /// The contract's spelling (`config`, `verify`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Config => "config",
            Stage::Verify => "verify",
            Stage::Plan => "plan",
            Stage::Lock => "lock",
            Stage::Publish => "publish",
            Stage::Spool => "spool",
        }
    }
}

/// The compact identity of the published bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SourceReport {
    pub id: String,
    pub digest: String,
    pub created: String,
}

/// What happened at one destination.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DestinationReport {
    pub destination_id: String,
    pub root: String,
    pub workflow: String,
    pub action: Option<String>,
    pub writes: Vec<String>,
    pub deletes: Vec<String>,
    pub unmanaged: Vec<String>,
    pub error: Option<String>,
    /// Of a publication that failed: what it had planned to write and
    /// delete (`writes` and `deletes` then hold what it did: nothing, since
    /// a failed publication leaves the root as it was).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub planned_writes: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub planned_deletes: Vec<String>,
    /// Planned writes (also listed in `writes`) whose file already held
    /// exactly those bytes and was kept as it is; not serialised.
    #[serde(skip)]
    pub unchanged: Vec<String>,
    /// Times the catalog's compare-and-swap lost to another publisher and
    /// the change was applied again on top of its catalog (an s3 root);
    /// not serialised.
    #[serde(skip)]
    pub catalog_rebases: u32,
    /// The catalog's compare-and-swap lost to another publisher and the
    /// change could not be applied on top of its catalog: undone, to be
    /// tried again (an s3 root); not serialised.
    #[serde(skip)]
    pub catalog_conflict: bool,
}

impl DestinationReport {
    /// The report of a destination nothing has happened at yet.
    pub fn new(destination_id: &str, root: String, workflow: &str) -> DestinationReport {
        DestinationReport {
            destination_id: destination_id.to_owned(),
            root,
            workflow: workflow.to_owned(),
            action: None,
            writes: Vec::new(),
            deletes: Vec::new(),
            unmanaged: Vec::new(),
            error: None,
            planned_writes: Vec::new(),
            planned_deletes: Vec::new(),
            unchanged: Vec::new(),
            catalog_rebases: 0,
            catalog_conflict: false,
        }
    }
}

/// The whole result of publishing one bundle.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub ok: bool,
    pub dry_run: bool,
    pub pipeline_id: String,
    pub source: Option<SourceReport>,
    pub destinations: Vec<DestinationReport>,
    /// Where the publication failed: its error's stage, kept beside it
    /// for the result document.
    pub stage: Option<Stage>,
    pub error: Option<RunError>,
    /// Who signed the bundle (docs/contract.md §17.4): `null` when the
    /// pipeline takes unsigned bundles or this one was not signed.
    pub signer: Option<crate::signature::Signer>,
    /// Why the bundle's signature was refused; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signature_refused: Option<&'static str>,
    /// How each `after_publish` hook ended (docs/contract.md §19.2); absent
    /// when none ran.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<HookReport>,
    /// Bytes written into destination roots; not serialised.
    #[serde(skip)]
    pub bytes_published: u64,
    /// Outputs copied into a folder of a root on another file system,
    /// instead of renamed (slower; logged); not serialised.
    #[serde(skip)]
    pub copied_across: u64,
    /// Roots made durable file by file rather than by one barrier, because
    /// much else waited to be written back on the machine; not serialised.
    #[serde(skip)]
    pub synced_file_by_file: u64,
    /// Non-fatal notes (unlisted bundle files); not serialised.
    #[serde(skip)]
    pub warnings: Vec<String>,
}

/// How one hook run ended, as the bundle's result records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HookReport {
    pub destination_id: String,
    /// Its exit status; `None` when it did not start or was killed.
    pub exit: Option<i32>,
    pub elapsed_ms: u64,
    /// The first [`crate::hooks::OUTPUT_KEPT`] bytes of what it wrote to stdout and
    /// stderr, invalid UTF-8 replaced.
    pub output: String,
    /// Why it counts as failed (did not start, exit status, timeout, killed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Killed because the agent was stopping (it is run again at the next
    /// start); not serialised.
    #[serde(skip)]
    pub stopped: bool,
}

impl RunReport {
    pub fn new(pipeline_id: &str, dry_run: bool) -> RunReport {
        RunReport {
            ok: true,
            dry_run,
            pipeline_id: pipeline_id.to_owned(),
            source: None,
            destinations: Vec::new(),
            stage: None,
            error: None,
            signer: None,
            signature_refused: None,
            hooks: Vec::new(),
            bytes_published: 0,
            copied_across: 0,
            synced_file_by_file: 0,
            warnings: Vec::new(),
        }
    }

    /// Marks the report failed with `error`, at its stage.
    pub fn fail(mut self, error: impl Failure) -> RunReport {
        self.ok = false;
        // What was planned was not done: a failed publication changes no
        // root (docs/contract.md §6).
        for d in &mut self.destinations {
            d.planned_writes.append(&mut d.writes);
            d.planned_deletes.append(&mut d.deletes);
            d.unchanged.clear();
        }
        self.bytes_published = 0;
        self.stage = Some(error.stage());
        self.error = Some(RunError::new(error));
        self
    }

    /// Worth retrying later (lock timeout, I/O error): its error says so.
    pub fn transient(&self) -> bool {
        self.error
            .as_ref()
            .is_some_and(|e| e.failure().is_transient())
    }

    /// The message of its error, or "" on success.
    pub fn error_text(&self) -> String {
        self.error
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default()
    }

    /// The process exit code for this result (docs/contract.md §9).
    pub fn exit_code(&self) -> u8 {
        self.error
            .as_ref()
            .map_or(crate::runtime::exit::EXIT_OK, RunError::exit_code)
    }

    /// `dest=action` for every destination, space-separated: the heart of
    /// the one log line per bundle.
    pub fn actions(&self) -> String {
        if self.destinations.is_empty() {
            // A bundle that failed verification never reaches a destination.
            return "no destination planned".to_owned();
        }
        self.destinations
            .iter()
            .map(|d| {
                format!(
                    "{}={}",
                    d.destination_id,
                    d.action.as_deref().unwrap_or("none")
                )
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The stage of a failure, or "" on success.
    pub fn stage_name(&self) -> &'static str {
        self.stage.map_or("", Stage::as_str)
    }

    /// Pretty JSON with a final newline.
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).unwrap_or_default();
        s.push('\n');
        s
    }

    /// The readable form printed by `run` without `--json`: per destination
    /// its action and counts, then the totals (files, bytes, `elapsed`).
    /// `verbose` adds every written, deleted and blocking path; without it
    /// at most [`BLOCKING_SHOWN`] blocking paths are listed. Names come from
    /// the producer, so they are printed inert (docs/contract.md §12.7).
    pub fn to_text(&self, verbose: bool, elapsed: Duration) -> String {
        let mut out = String::new();
        let verb = if self.dry_run { "dry run" } else { "run" };
        let source = self
            .source
            .as_ref()
            .map_or("(manifest unreadable)".to_owned(), |s| {
                format!("{} created {}", inert(&s.id), s.created)
            });
        let _ = writeln!(out, "{verb} of pipeline {}: {source}", self.pipeline_id);
        for d in &self.destinations {
            let action = d.action.as_deref().unwrap_or("not planned");
            let _ = write!(
                out,
                "  {} ({}, {}): {action}",
                d.destination_id,
                d.workflow,
                inert(&d.root)
            );
            let mut counts = Vec::new();
            if !d.planned_writes.is_empty() || !d.planned_deletes.is_empty() {
                counts.push(format!(
                    "{} and {} planned, not made",
                    count(d.planned_writes.len(), "write", "writes"),
                    count(d.planned_deletes.len(), "delete", "deletes")
                ));
            } else if d.action.is_some() || !d.writes.is_empty() {
                counts.push(count(d.writes.len(), "write", "writes"));
                counts.push(count(d.deletes.len(), "delete", "deletes"));
            }
            if !d.unmanaged.is_empty() {
                counts.push(format!(
                    "blocked by {}",
                    count(d.unmanaged.len(), "unmanaged path", "unmanaged paths")
                ));
            }
            if !d.unchanged.is_empty() {
                counts.push(format!(
                    "{} already held the same bytes and kept",
                    count(d.unchanged.len(), "write", "writes")
                ));
            }
            if counts.is_empty() {
                out.push('\n');
            } else {
                let _ = writeln!(out, ", {}", counts.join(", "));
            }
            if verbose {
                for w in &d.writes {
                    let _ = writeln!(out, "    write   {}", inert(w));
                }
                for x in &d.deletes {
                    let _ = writeln!(out, "    delete  {}", inert(x));
                }
            }
            let shown = if verbose {
                d.unmanaged.len()
            } else {
                BLOCKING_SHOWN
            };
            for u in d.unmanaged.iter().take(shown) {
                let _ = writeln!(out, "    blocked by unmanaged {}", inert(u));
            }
            if d.unmanaged.len() > shown {
                let _ = writeln!(
                    out,
                    "    ... and {} more (--verbose or --json lists them all)",
                    d.unmanaged.len() - shown
                );
            }
            if let Some(e) = &d.error {
                let _ = writeln!(out, "    error: {}", inert(e));
            }
        }
        for h in &self.hooks {
            match &h.error {
                None => {
                    let _ = writeln!(
                        out,
                        "  {}: hook exited 0 in {} ms",
                        h.destination_id, h.elapsed_ms
                    );
                }
                Some(e) => {
                    let _ = writeln!(
                        out,
                        "  {}: hook {} after {} ms (the publication stands)",
                        h.destination_id,
                        inert(e),
                        h.elapsed_ms
                    );
                }
            }
        }
        for w in &self.warnings {
            let _ = writeln!(out, "warning: {}", inert(w));
        }
        let writes: usize = self.destinations.iter().map(|d| d.writes.len()).sum();
        let kept: usize = self.destinations.iter().map(|d| d.unchanged.len()).sum();
        let deletes: usize = self.destinations.iter().map(|d| d.deletes.len()).sum();
        if self.dry_run {
            // Nothing is written, so there are no bytes to count.
            let _ = writeln!(
                out,
                "would write {}, would delete {} (dry run, {:.1}s)",
                count(writes, "file", "files"),
                count(deletes, "file", "files"),
                elapsed.as_secs_f64()
            );
        } else if !self.ok {
            let _ = writeln!(
                out,
                "wrote nothing, deleted nothing in {:.1}s",
                elapsed.as_secs_f64()
            );
        } else {
            // Outputs that already held their bytes were kept, not written.
            let kept_text = if kept > 0 {
                format!(
                    ", kept {} that already held the same bytes",
                    count(kept, "file", "files")
                )
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "wrote {} ({}){kept_text}, deleted {} in {:.1}s",
                count(writes.saturating_sub(kept), "file", "files"),
                human_bytes(self.bytes_published),
                count(deletes, "file", "files"),
                elapsed.as_secs_f64()
            );
        }
        match (&self.stage, &self.error) {
            (Some(stage), Some(error)) => {
                let error = error.to_string();
                let _ = writeln!(out, "failed at {}: {}", stage.as_str(), inert(&error));
            }
            _ => {
                let _ = writeln!(out, "ok");
            }
        }
        out
    }
}

/// Blocking paths listed by `run` without `--verbose`.
pub const BLOCKING_SHOWN: usize = 10;

/// "1 file", "2 files".
fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Bytes for people: exact below 1 KiB, else one decimal in KiB/MiB/GiB/TiB.
fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return count(
            usize::try_from(bytes).unwrap_or(usize::MAX),
            "byte",
            "bytes",
        );
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {

    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("disk full")]
    struct DiskFull;

    impl Failure for DiskFull {
        fn stage(&self) -> Stage {
            Stage::Publish
        }
        fn is_transient(&self) -> bool {
            true
        }
        fn is_refused(&self) -> bool {
            false
        }
    }

    fn report(writes: usize, unmanaged: usize) -> RunReport {
        let mut r = RunReport::new("reports", false);
        r.source = Some(SourceReport {
            id: "rep.1".to_owned(),
            digest: "sha256:x".to_owned(),
            created: "2026-06-04T11:55:00Z".to_owned(),
        });
        r.destinations.push(DestinationReport {
            action: Some("publish_new".to_owned()),
            writes: (0..writes).map(|i| format!("f{i}.txt")).collect(),
            deletes: vec!["old\x1b[2J.txt".to_owned()],
            unmanaged: (0..unmanaged).map(|i| format!("u{i}")).collect(),
            ..DestinationReport::new("site", "/srv/site".to_owned(), "additive")
        });
        r.bytes_published = 3 * 1024 * 1024 / 2;
        r
    }

    #[test]
    fn a_failed_report_calls_its_counts_planned_and_wrote_nothing() {
        let r = report(3, 0).fail(DiskFull);
        assert!(r.transient());
        assert_eq!(r.exit_code(), crate::runtime::exit::EXIT_FAILURE);
        let d = &r.destinations[0];
        assert!(d.writes.is_empty() && d.deletes.is_empty());
        assert_eq!(d.planned_writes.len(), 3);
        assert_eq!(d.planned_deletes.len(), 1);
        let text = r.to_text(false, Duration::from_millis(100));
        assert!(
            text.contains("publish_new, 3 writes and 1 delete planned, not made\n"),
            "{text}"
        );
        assert!(
            text.contains("wrote nothing, deleted nothing in 0.1s\n"),
            "{text}"
        );
        let json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(json["destinations"][0]["writes"], serde_json::json!([]));
        assert_eq!(json["destinations"][0]["planned_writes"][2], "f2.txt");
        // A published one has no planned lists.
        let ok: serde_json::Value = serde_json::from_str(&report(1, 0).to_json()).unwrap();
        assert!(
            ok["destinations"][0].get("planned_writes").is_none(),
            "{ok}"
        );
    }

    #[test]
    fn writes_that_already_held_their_bytes_are_counted_as_kept() {
        let mut r = report(5, 0);
        r.destinations[0].unchanged = vec!["f0.txt".into(), "f1.txt".into()];
        let text = r.to_text(false, Duration::from_millis(100));
        assert!(
            text.contains("wrote 3 files (1.5 MiB), kept 2 files that already held the same bytes, deleted 1 file"),
            "{text}"
        );
    }

    #[test]
    fn text_is_a_summary_unless_verbose() {
        let r = report(3, 0);
        let text = r.to_text(false, Duration::from_millis(2_340));
        assert_eq!(
            text,
            "run of pipeline reports: rep.1 created 2026-06-04T11:55:00Z\n  \
             site (additive, /srv/site): publish_new, 3 writes, 1 delete\n\
             wrote 3 files (1.5 MiB), deleted 1 file in 2.3s\nok\n"
        );
        let verbose = r.to_text(true, Duration::from_millis(2_340));
        assert!(verbose.contains("    write   f0.txt\n"), "{verbose}");
        assert!(verbose.contains("    write   f2.txt\n"), "{verbose}");
        assert!(
            verbose.contains("    delete  old\\x1b[2J.txt\n"),
            "{verbose}"
        );
        assert!(!verbose.contains('\x1b'), "{verbose}");
    }

    #[test]
    fn dry_run_text_counts_without_bytes() {
        let mut r = report(2, 0);
        r.dry_run = true;
        r.bytes_published = 0;
        let text = r.to_text(false, Duration::from_millis(50));
        assert!(text.starts_with("dry run of pipeline reports"), "{text}");
        assert!(
            text.contains("\nwould write 2 files, would delete 1 file (dry run, 0.1s)\nok\n"),
            "{text}"
        );
    }

    #[test]
    fn blocking_paths_are_capped_without_verbose() {
        let r = report(0, 25);
        let text = r.to_text(false, Duration::ZERO);
        assert_eq!(
            text.matches("blocked by unmanaged u").count(),
            BLOCKING_SHOWN,
            "{text}"
        );
        assert!(text.contains("... and 15 more"), "{text}");
        assert!(text.contains("blocked by 25 unmanaged paths"), "{text}");
        let all = r.to_text(true, Duration::ZERO);
        assert_eq!(all.matches("blocked by unmanaged u").count(), 25, "{all}");
    }

    #[test]
    fn bytes_for_people() {
        let cases: &[(u64, &str)] = &[
            (0, "0 bytes"),
            (1, "1 byte"),
            (1023, "1023 bytes"),
            (1024, "1.0 KiB"),
            (1536, "1.5 KiB"),
            (5 << 30, "5.0 GiB"),
        ];
        for (bytes, expected) in cases {
            assert_eq!(human_bytes(*bytes), *expected);
        }
    }
}
