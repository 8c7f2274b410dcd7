//! Agent metrics: counters and gauges per pipeline, spool folder and
//! destination, rendered in the Prometheus text exposition format and
//! written atomically for node_exporter's textfile collector.
//!
//! This module owns the metric names, their help texts and the rendering.
//! It keeps numbers only: it never decides when to write (the agent calls
//! [`Metrics::write_atomic`]), never logs, and touches the file system only
//! in `write_atomic`, inside the folder of the file it is given.
//!
//! A [`Metrics`] is shared between threads behind an `Arc`; every method takes
//! `&self`. Series are kept in sorted maps, so [`Metrics::render`] gives the
//! same text for the same numbers.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io;
use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::config::Config;
use crate::fs::replace_file::{self, Durability, Temp};
use crate::spool::Folder;

/// Every metric name starts with this.
pub const PREFIX: &str = "distributor_";

/// The spool folders whose depth is reported, in label order.
const SPOOL_FOLDERS: [Folder; 4] = [Folder::Inbox, Folder::Work, Folder::Done, Folder::Failed];

/// Thread-safe metrics of one agent. Counters start at zero when the agent
/// starts; nothing is persisted across restarts (Prometheus handles counter
/// resets).
#[derive(Debug, Default)]
pub struct Metrics {
    state: Mutex<State>,
}

#[derive(Debug, Default, Clone, PartialEq)]
struct State {
    pipelines: BTreeMap<String, PipelineSeries>,
    /// Keyed by (pipeline, spool folder name).
    queues: BTreeMap<(String, String), u64>,
    /// Keyed by (pipeline, destination).
    destinations: BTreeMap<(String, String), DestinationSeries>,
    /// Why the last reload of the config was refused, until one succeeds.
    reload_refused: Option<String>,
}

#[derive(Debug, Default, Clone, PartialEq)]
struct PipelineSeries {
    bundles_done: u64,
    bundles_failed: u64,
    published_bytes: u64,
    batch_fallbacks: u64,
    cross_device_copies: u64,
    file_by_file_syncs: u64,
    /// Transient failures after which a bundle was deferred.
    deferrals: u64,
    /// Unix seconds of the first failure of the deferred bundle, if any.
    deferred_since: Option<u64>,
    /// Whether `spool hold` holds the pipeline.
    held: bool,
    /// Bundles refused for their signature, by reason
    /// ([`crate::signature::Reason::as_str`]).
    signature_refusals: BTreeMap<&'static str, u64>,
}

#[derive(Debug, Default, Clone, PartialEq)]
struct DestinationSeries {
    /// Unix seconds of the last successful publication; `None` until one
    /// happens after start, and then the series is not rendered.
    last_success: Option<u64>,
    prune_deletions: u64,
    /// `after_publish` hooks that failed, timed out or could not start.
    hook_failures: u64,
    /// Lost catalog compare-and-swaps applied again on the winner's
    /// catalog (s3 roots).
    catalog_rebases: u64,
    /// Lost catalog compare-and-swaps that could not be applied again: the
    /// bundle was undone and is tried again (s3 roots).
    catalog_conflicts: u64,
}

impl Metrics {
    /// Empty metrics: no series until [`Metrics::configure`] or a recording
    /// method names them.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes the series of `config` exist (at zero) so that dashboards and
    /// `rate()` see every configured pipeline, spool folder and destination
    /// from the start, and drops the series of pipelines and destinations
    /// that are no longer configured. Values of series that stay are kept.
    /// Call at start and after each successful reload.
    pub fn configure(&self, config: &Config) {
        let mut state = self.lock();
        let mut next = State::default();
        for p in &config.pipelines {
            let series = state.pipelines.remove(&p.id).unwrap_or_default();
            next.pipelines.insert(p.id.clone(), series);
            for folder in SPOOL_FOLDERS {
                let key = (p.id.clone(), folder.as_str().to_owned());
                let depth = state.queues.remove(&key).unwrap_or(0);
                next.queues.insert(key, depth);
            }
            for d in &p.destinations {
                let key = (p.id.clone(), d.id.clone());
                let series = state.destinations.remove(&key).unwrap_or_default();
                next.destinations.insert(key, series);
            }
        }
        *state = next;
    }

    /// One bundle of `pipeline` ended in `done/`.
    pub fn bundle_done(&self, pipeline: &str) {
        self.lock().pipeline(pipeline).bundles_done += 1;
    }

    /// One bundle of `pipeline` ended in `failed/`.
    pub fn bundle_failed(&self, pipeline: &str) {
        self.lock().pipeline(pipeline).bundles_failed += 1;
    }

    /// Bundles done and failed since start, over every pipeline.
    pub fn bundle_totals(&self) -> (u64, u64) {
        let state = self.lock();
        state.pipelines.values().fold((0, 0), |(done, failed), s| {
            (done + s.bundles_done, failed + s.bundles_failed)
        })
    }

    /// The last reload of the config was refused (`Some`: why; the old
    /// config is still served) or succeeded (`None`).
    pub fn set_reload_refused(&self, why: Option<String>) {
        self.lock().reload_refused = why;
    }

    /// Why the last reload of the config was refused, if it was.
    pub fn reload_refused(&self) -> Option<String> {
        self.lock().reload_refused.clone()
    }

    /// A batch of `pipeline` stepped aside and its bundles were published
    /// one by one.
    pub fn batch_fallback(&self, pipeline: &str) {
        self.lock().pipeline(pipeline).batch_fallbacks += 1;
    }

    /// `copies` outputs of `pipeline` were copied into a folder on another
    /// file system than their root, instead of renamed into place.
    pub fn add_cross_device_copies(&self, pipeline: &str, copies: u64) {
        let mut state = self.lock();
        let series = state.pipeline(pipeline);
        series.cross_device_copies = series.cross_device_copies.saturating_add(copies);
    }

    /// `roots` publications of `pipeline` into a root were made durable by
    /// a fsync of each file and folder instead of one barrier, because much
    /// else waited to be written back on the machine.
    pub fn add_file_by_file_syncs(&self, pipeline: &str, roots: u64) {
        let mut state = self.lock();
        let series = state.pipeline(pipeline);
        series.file_by_file_syncs = series.file_by_file_syncs.saturating_add(roots);
    }

    /// `bytes` were written into destination roots for `pipeline`.
    pub fn add_published_bytes(&self, pipeline: &str, bytes: u64) {
        let mut state = self.lock();
        let series = state.pipeline(pipeline);
        series.published_bytes = series.published_bytes.saturating_add(bytes);
    }

    /// A bundle of `pipeline` failed transiently and was deferred; its
    /// first failure was at `since`.
    pub fn deferred(&self, pipeline: &str, since: SystemTime) {
        let mut state = self.lock();
        let series = state.pipeline(pipeline);
        series.deferrals += 1;
        series.deferred_since = Some(unix_seconds(since));
    }

    /// A bundle of `pipeline` deferred before a restart, first failing at
    /// `since`, is deferred still (no new deferral is counted).
    pub fn still_deferred(&self, pipeline: &str, since: SystemTime) {
        self.lock().pipeline(pipeline).deferred_since = Some(unix_seconds(since));
    }

    /// `pipeline` has no deferred bundle (any more).
    pub fn not_deferred(&self, pipeline: &str) {
        self.lock().pipeline(pipeline).deferred_since = None;
    }

    /// Whether `spool hold` holds `pipeline`, as the agent last saw.
    pub fn set_held(&self, pipeline: &str, held: bool) {
        self.lock().pipeline(pipeline).held = held;
    }

    /// The number of bundles currently in one spool folder (`inbox`,
    /// `work`, `done`, `failed`; see [`Folder::as_str`]) of `pipeline`.
    pub fn set_queue_depth(&self, pipeline: &str, spool: &str, depth: u64) {
        self.lock()
            .queues
            .insert((pipeline.to_owned(), spool.to_owned()), depth);
    }

    /// `destination` of `pipeline` was published to successfully at `at`
    /// (`skip_same` counts: the destination is up to date).
    pub fn destination_succeeded(&self, pipeline: &str, destination: &str, at: SystemTime) {
        self.lock().destination(pipeline, destination).last_success = Some(unix_seconds(at));
    }

    /// A bundle of `pipeline` was refused for its signature (`reason`, as
    /// [`crate::signature::Reason::as_str`] spells it).
    pub fn signature_refused(&self, pipeline: &str, reason: &'static str) {
        *self
            .lock()
            .pipeline(pipeline)
            .signature_refusals
            .entry(reason)
            .or_default() += 1;
    }

    /// The `after_publish` hook of `destination` failed once.
    pub fn hook_failed(&self, pipeline: &str, destination: &str) {
        self.lock().destination(pipeline, destination).hook_failures += 1;
    }

    /// What publishing one bundle (or, for the first bundle of a batch,
    /// the batch) met at each destination's catalog: compare-and-swaps
    /// that lost to another publisher and were re-applied on its catalog,
    /// and one that lost and could not be (docs/object-storage.md,
    /// "Several hosts").
    pub fn catalog_races(&self, report: &crate::report::RunReport) {
        let mut state = self.lock();
        for d in &report.destinations {
            if d.catalog_rebases == 0 && !d.catalog_conflict {
                continue;
            }
            let series = state.destination(&report.pipeline_id, &d.destination_id);
            series.catalog_rebases = series
                .catalog_rebases
                .saturating_add(u64::from(d.catalog_rebases));
            series.catalog_conflicts += u64::from(d.catalog_conflict);
        }
    }

    /// Pruning deleted `deletions` outputs from `destination` of `pipeline`.
    pub fn add_prune_deletions(&self, pipeline: &str, destination: &str, deletions: u64) {
        let mut state = self.lock();
        let series = state.destination(pipeline, destination);
        series.prune_deletions = series.prune_deletions.saturating_add(deletions);
    }

    /// Everything, in the Prometheus text exposition format (version
    /// 0.0.4): each family with its `# HELP` and `# TYPE` lines, families in
    /// a fixed order, series sorted by their labels.
    pub fn render(&self) -> String {
        self.render_at(SystemTime::now())
    }

    /// [`Metrics::render`] with ages counted up to `now`.
    fn render_at(&self, now: SystemTime) -> String {
        let now = unix_seconds(now);
        let state = self.lock().clone();
        let mut out = String::new();
        family(
            &mut out,
            "config_last_reload_successful",
            "gauge",
            "0 when the last reload of the config (SIGHUP) was refused and the agent still serves the config it had, else 1.",
            std::iter::once((Vec::new(), u64::from(state.reload_refused.is_none()))),
        );
        render_pipelines(&mut out, &state, now);
        render_destinations(&mut out, &state);
        family(
            &mut out,
            "signature_refusals_total",
            "counter",
            "Bundles refused because of their signature (signatures in the pipeline's config), by reason, since the agent started.",
            state.pipelines.iter().flat_map(|(p, s)| {
                s.signature_refusals
                    .iter()
                    .map(|(reason, n)| (vec![("pipeline", p.as_str()), ("reason", *reason)], *n))
            }),
        );
        out
    }

    /// Writes [`Metrics::render`] to `path` atomically: into a temporary
    /// file in the same folder (named `.<file name>.<pid>.tmp`, which the
    /// textfile collector ignores because it does not end in `.prom`),
    /// flushed to disk, renamed over `path`, then the folder flushed too. A
    /// reader sees the old file or the new one, never a partial one. The
    /// folder must exist.
    pub fn write_atomic(&self, path: &Path) -> io::Result<()> {
        let text = self.render();
        let name = path.file_name().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} does not name a file", path.display()),
            )
        })?;
        let mut temp = std::ffi::OsString::from(".");
        temp.push(name);
        temp.push(format!(".{}.tmp", std::process::id()));
        let folder = match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        let dir = cap_std::fs::Dir::open_ambient_dir(folder, cap_std::ambient_authority())?;
        replace_file::replace_bytes(
            &dir,
            name,
            Temp::Named(&temp),
            Durability::Full,
            text.as_bytes(),
        )
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is plain numbers: a panic elsewhere cannot leave it
        // inconsistent, so a poisoned lock is still good to use.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl State {
    fn pipeline(&mut self, pipeline: &str) -> &mut PipelineSeries {
        self.pipelines.entry(pipeline.to_owned()).or_default()
    }

    fn destination(&mut self, pipeline: &str, destination: &str) -> &mut DestinationSeries {
        self.destinations
            .entry((pipeline.to_owned(), destination.to_owned()))
            .or_default()
    }
}

fn unix_seconds(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The families of every pipeline's series, ages counted up to `now`
/// (Unix seconds).
fn render_pipelines(out: &mut String, state: &State, now: u64) {
    let pipelines: Vec<_> = state.pipelines.iter().collect();
    family(
        out,
        "bundles_done_total",
        "counter",
        "Bundles published and moved to done/ since the agent started.",
        pipelines
            .iter()
            .map(|(p, s)| (vec![("pipeline", p.as_str())], s.bundles_done)),
    );
    family(
        out,
        "bundles_failed_total",
        "counter",
        "Bundles moved to failed/ since the agent started.",
        pipelines
            .iter()
            .map(|(p, s)| (vec![("pipeline", p.as_str())], s.bundles_failed)),
    );
    family(
        out,
        "published_bytes_total",
        "counter",
        "Bytes written into destination roots since the agent started.",
        pipelines
            .iter()
            .map(|(p, s)| (vec![("pipeline", p.as_str())], s.published_bytes)),
    );
    family(
        out,
        "batch_fallbacks_total",
        "counter",
        "Batches that stepped aside (their bundles were then published one by one) since the agent started.",
        pipelines
            .iter()
            .map(|(p, s)| (vec![("pipeline", p.as_str())], s.batch_fallbacks)),
    );
    family(
        out,
        "cross_device_copies_total",
        "counter",
        "Outputs copied into a folder of their root that is on another file system (a mount point), instead of renamed into place, since the agent started.",
        pipelines
            .iter()
            .map(|(p, s)| (vec![("pipeline", p.as_str())], s.cross_device_copies)),
    );
    family(
        out,
        "file_by_file_syncs_total",
        "counter",
        "Publications into a root made durable by a fsync of each file and folder rather than one barrier of the file system (the machine had much else waiting to be written back), since the agent started.",
        pipelines
            .iter()
            .map(|(p, s)| (vec![("pipeline", p.as_str())], s.file_by_file_syncs)),
    );
    family(
        out,
        "deferrals_total",
        "counter",
        "Transient failures after which a bundle stayed in work/ to be tried again later, since the agent started.",
        pipelines
            .iter()
            .map(|(p, s)| (vec![("pipeline", p.as_str())], s.deferrals)),
    );
    family(
        out,
        "deferred_bundles",
        "gauge",
        "Bundles of the pipeline deferred now (kept in work/ after a transient failure, waiting for their next try).",
        pipelines.iter().map(|(p, s)| {
            (
                vec![("pipeline", p.as_str())],
                u64::from(s.deferred_since.is_some()),
            )
        }),
    );
    family(
        out,
        "oldest_deferred_age_seconds",
        "gauge",
        "Seconds since the first failure of the pipeline's oldest deferred bundle; 0 when none is deferred.",
        pipelines.iter().map(|(p, s)| {
            (
                vec![("pipeline", p.as_str())],
                s.deferred_since.map_or(0, |t| now.saturating_sub(t)),
            )
        }),
    );
    family(
        out,
        "pipeline_held",
        "gauge",
        "1 while `distributor spool hold` holds the pipeline (nothing new is claimed), else 0.",
        pipelines
            .iter()
            .map(|(p, s)| (vec![("pipeline", p.as_str())], u64::from(s.held))),
    );
    family(
        out,
        "spool_bundles",
        "gauge",
        "Bundles in each spool folder (inbox, work, done, failed) when last counted.",
        state.queues.iter().map(|((p, spool), depth)| {
            (
                vec![("pipeline", p.as_str()), ("spool", spool.as_str())],
                *depth,
            )
        }),
    );
}

/// The families of every destination's series.
fn render_destinations(out: &mut String, state: &State) {
    family(
        out,
        "destination_last_success_timestamp_seconds",
        "gauge",
        "Unix time of the last successful publication to the destination; absent until one happens after start.",
        state.destinations.iter().filter_map(|((p, d), s)| {
            s.last_success.map(|at| {
                (
                    vec![("pipeline", p.as_str()), ("destination", d.as_str())],
                    at,
                )
            })
        }),
    );
    family(
        out,
        "prune_deletions_total",
        "counter",
        "Outputs deleted from the destination by scheduled pruning since the agent started.",
        state.destinations.iter().map(|((p, d), s)| {
            (
                vec![("pipeline", p.as_str()), ("destination", d.as_str())],
                s.prune_deletions,
            )
        }),
    );
    family(
        out,
        "hook_failures_total",
        "counter",
        "after_publish hooks of the destination that exited non-zero, could not start or were killed at their timeout, since the agent started (the publications stand).",
        state.destinations.iter().map(|((p, d), s)| {
            (
                vec![("pipeline", p.as_str()), ("destination", d.as_str())],
                s.hook_failures,
            )
        }),
    );
    family(
        out,
        "catalog_rebases_total",
        "counter",
        "Times the catalog compare-and-swap of an s3 destination lost to another publisher and the publication was applied again on top of its catalog, since the agent started.",
        state.destinations.iter().map(|((p, d), s)| {
            (
                vec![("pipeline", p.as_str()), ("destination", d.as_str())],
                s.catalog_rebases,
            )
        }),
    );
    family(
        out,
        "catalog_conflicts_total",
        "counter",
        "Times the catalog compare-and-swap of an s3 destination lost to another publisher that changed a record the publication relies on: undone and tried again later, since the agent started.",
        state.destinations.iter().map(|((p, d), s)| {
            (
                vec![("pipeline", p.as_str()), ("destination", d.as_str())],
                s.catalog_conflicts,
            )
        }),
    );
}

/// Appends one metric family: HELP and TYPE lines, then one line per series.
fn family<'a>(
    out: &mut String,
    name: &str,
    kind: &str,
    help: &str,
    series: impl Iterator<Item = (Vec<(&'a str, &'a str)>, u64)>,
) {
    // Writing to a String cannot fail.
    let _ = writeln!(out, "# HELP {PREFIX}{name} {}", escape_help(help));
    let _ = writeln!(out, "# TYPE {PREFIX}{name} {kind}");
    for (labels, value) in series {
        let labels = labels
            .iter()
            .map(|(key, value)| format!("{key}=\"{}\"", escape_label_value(value)))
            .collect::<Vec<_>>()
            .join(",");
        if labels.is_empty() {
            let _ = writeln!(out, "{PREFIX}{name} {value}");
        } else {
            let _ = writeln!(out, "{PREFIX}{name}{{{labels}}} {value}");
        }
    }
}

/// A label value as the text format wants it: `\`, `"` and line feeds
/// escaped with a backslash.
pub fn escape_label_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            other => out.push(other),
        }
    }
    out
}

/// A HELP text as the text format wants it: `\` and line feeds escaped.
fn escape_help(text: &str) -> String {
    text.replace('\\', "\\\\").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::sync::Arc;
    use std::time::Duration;

    fn config(text: &str) -> Config {
        crate::config::parse(text, Path::new("/etc/distributor/config.yaml")).unwrap()
    }

    #[test]
    fn render_small_case_exactly() {
        let m = Metrics::new();
        m.bundle_done("reports");
        m.bundle_done("reports");
        m.bundle_failed("reports");
        m.add_published_bytes("reports", 1234);
        m.add_published_bytes("reports", 66);
        m.add_cross_device_copies("reports", 2);
        m.add_file_by_file_syncs("reports", 1);
        m.set_queue_depth("reports", "inbox", 3);
        m.set_queue_depth("reports", "failed", 1);
        m.destination_succeeded(
            "reports",
            "site",
            UNIX_EPOCH + Duration::from_millis(1_780_000_000_900),
        );
        m.add_prune_deletions("reports", "site", 4);
        m.add_prune_deletions("reports", "mirror", 0);
        m.deferred("reports", UNIX_EPOCH + Duration::from_secs(1_780_000_100));
        m.deferred("reports", UNIX_EPOCH + Duration::from_secs(1_780_000_005));
        m.set_held("reports", true);
        m.hook_failed("reports", "site");
        m.signature_refused("reports", "unknown_key");
        m.signature_refused("reports", "unknown_key");
        let now = UNIX_EPOCH + Duration::from_secs(1_780_000_100);

        let want = "\
# HELP distributor_config_last_reload_successful 0 when the last reload of the config (SIGHUP) was refused and the agent still serves the config it had, else 1.
# TYPE distributor_config_last_reload_successful gauge
distributor_config_last_reload_successful 1
# HELP distributor_bundles_done_total Bundles published and moved to done/ since the agent started.
# TYPE distributor_bundles_done_total counter
distributor_bundles_done_total{pipeline=\"reports\"} 2
# HELP distributor_bundles_failed_total Bundles moved to failed/ since the agent started.
# TYPE distributor_bundles_failed_total counter
distributor_bundles_failed_total{pipeline=\"reports\"} 1
# HELP distributor_published_bytes_total Bytes written into destination roots since the agent started.
# TYPE distributor_published_bytes_total counter
distributor_published_bytes_total{pipeline=\"reports\"} 1300
# HELP distributor_batch_fallbacks_total Batches that stepped aside (their bundles were then published one by one) since the agent started.
# TYPE distributor_batch_fallbacks_total counter
distributor_batch_fallbacks_total{pipeline=\"reports\"} 0
# HELP distributor_cross_device_copies_total Outputs copied into a folder of their root that is on another file system (a mount point), instead of renamed into place, since the agent started.
# TYPE distributor_cross_device_copies_total counter
distributor_cross_device_copies_total{pipeline=\"reports\"} 2
# HELP distributor_file_by_file_syncs_total Publications into a root made durable by a fsync of each file and folder rather than one barrier of the file system (the machine had much else waiting to be written back), since the agent started.
# TYPE distributor_file_by_file_syncs_total counter
distributor_file_by_file_syncs_total{pipeline=\"reports\"} 1
# HELP distributor_deferrals_total Transient failures after which a bundle stayed in work/ to be tried again later, since the agent started.
# TYPE distributor_deferrals_total counter
distributor_deferrals_total{pipeline=\"reports\"} 2
# HELP distributor_deferred_bundles Bundles of the pipeline deferred now (kept in work/ after a transient failure, waiting for their next try).
# TYPE distributor_deferred_bundles gauge
distributor_deferred_bundles{pipeline=\"reports\"} 1
# HELP distributor_oldest_deferred_age_seconds Seconds since the first failure of the pipeline's oldest deferred bundle; 0 when none is deferred.
# TYPE distributor_oldest_deferred_age_seconds gauge
distributor_oldest_deferred_age_seconds{pipeline=\"reports\"} 95
# HELP distributor_pipeline_held 1 while `distributor spool hold` holds the pipeline (nothing new is claimed), else 0.
# TYPE distributor_pipeline_held gauge
distributor_pipeline_held{pipeline=\"reports\"} 1
# HELP distributor_spool_bundles Bundles in each spool folder (inbox, work, done, failed) when last counted.
# TYPE distributor_spool_bundles gauge
distributor_spool_bundles{pipeline=\"reports\",spool=\"failed\"} 1
distributor_spool_bundles{pipeline=\"reports\",spool=\"inbox\"} 3
# HELP distributor_destination_last_success_timestamp_seconds Unix time of the last successful publication to the destination; absent until one happens after start.
# TYPE distributor_destination_last_success_timestamp_seconds gauge
distributor_destination_last_success_timestamp_seconds{pipeline=\"reports\",destination=\"site\"} 1780000000
# HELP distributor_prune_deletions_total Outputs deleted from the destination by scheduled pruning since the agent started.
# TYPE distributor_prune_deletions_total counter
distributor_prune_deletions_total{pipeline=\"reports\",destination=\"mirror\"} 0
distributor_prune_deletions_total{pipeline=\"reports\",destination=\"site\"} 4
# HELP distributor_hook_failures_total after_publish hooks of the destination that exited non-zero, could not start or were killed at their timeout, since the agent started (the publications stand).
# TYPE distributor_hook_failures_total counter
distributor_hook_failures_total{pipeline=\"reports\",destination=\"mirror\"} 0
distributor_hook_failures_total{pipeline=\"reports\",destination=\"site\"} 1
# HELP distributor_catalog_rebases_total Times the catalog compare-and-swap of an s3 destination lost to another publisher and the publication was applied again on top of its catalog, since the agent started.
# TYPE distributor_catalog_rebases_total counter
distributor_catalog_rebases_total{pipeline=\"reports\",destination=\"mirror\"} 0
distributor_catalog_rebases_total{pipeline=\"reports\",destination=\"site\"} 0
# HELP distributor_catalog_conflicts_total Times the catalog compare-and-swap of an s3 destination lost to another publisher that changed a record the publication relies on: undone and tried again later, since the agent started.
# TYPE distributor_catalog_conflicts_total counter
distributor_catalog_conflicts_total{pipeline=\"reports\",destination=\"mirror\"} 0
distributor_catalog_conflicts_total{pipeline=\"reports\",destination=\"site\"} 0
# HELP distributor_signature_refusals_total Bundles refused because of their signature (signatures in the pipeline's config), by reason, since the agent started.
# TYPE distributor_signature_refusals_total counter
distributor_signature_refusals_total{pipeline=\"reports\",reason=\"unknown_key\"} 2
";
        assert_eq!(m.render_at(now), want);
        // Rendering does not change anything.
        assert_eq!(m.render_at(now), want);
        // A refused reload shows until one succeeds.
        m.set_reload_refused(Some("bad".into()));
        assert!(
            m.render()
                .contains("\ndistributor_config_last_reload_successful 0\n")
        );
        assert_eq!(m.reload_refused().as_deref(), Some("bad"));
        m.set_reload_refused(None);
        assert_eq!(m.render_at(now), want);
        // The deferral ends, the hold is lifted; the count stays.
        m.not_deferred("reports");
        m.set_held("reports", false);
        let after = m.render_at(now);
        for line in [
            "distributor_deferrals_total{pipeline=\"reports\"} 2\n",
            "distributor_deferred_bundles{pipeline=\"reports\"} 0\n",
            "distributor_oldest_deferred_age_seconds{pipeline=\"reports\"} 0\n",
            "distributor_pipeline_held{pipeline=\"reports\"} 0\n",
        ] {
            assert!(after.contains(line), "{line} in {after}");
        }
    }

    #[test]
    fn lost_catalog_swaps_are_counted_per_destination() {
        let metrics = Metrics::new();
        let mut report = crate::report::RunReport::new("reports", false);
        let d = |id: &str, rebases, conflict| crate::report::DestinationReport {
            catalog_rebases: rebases,
            catalog_conflict: conflict,
            ..crate::report::DestinationReport::new(id, String::new(), "additive")
        };
        report.destinations = vec![d("site", 2, false), d("mirror", 0, true)];
        metrics.catalog_races(&report);
        metrics.catalog_races(&report);
        let text = metrics.render();
        for line in [
            "distributor_catalog_rebases_total{pipeline=\"reports\",destination=\"site\"} 4\n",
            "distributor_catalog_conflicts_total{pipeline=\"reports\",destination=\"mirror\"} 2\n",
            "distributor_catalog_conflicts_total{pipeline=\"reports\",destination=\"site\"} 0\n",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
    }

    #[test]
    fn empty_metrics_still_describe_every_family() {
        let text = Metrics::new().render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 37, "{text}");
        // Every family described; the only series is the one without labels.
        assert!(lines.iter().all(|l| l.starts_with("# HELP distributor_")
            || l.starts_with("# TYPE distributor_")
            || *l == "distributor_config_last_reload_successful 1"));
        assert!(text.ends_with('\n'));
    }

    #[test]
    fn label_values_are_escaped() {
        let cases = [
            ("plain", "plain"),
            ("", ""),
            ("a\"b", "a\\\"b"),
            ("a\\b", "a\\\\b"),
            ("a\nb", "a\\nb"),
            ("\\\"\n", "\\\\\\\"\\n"),
            ("tab\tand ünïcode", "tab\tand ünïcode"),
        ];
        for (raw, want) in cases {
            assert_eq!(escape_label_value(raw), want, "{raw:?}");
        }

        let m = Metrics::new();
        m.add_prune_deletions("p\"1", "d\\\n", 2);
        let text = m.render();
        assert!(
            text.contains(
                "distributor_prune_deletions_total{pipeline=\"p\\\"1\",destination=\"d\\\\\\n\"} 2\n"
            ),
            "{text}"
        );
        // One line per series: the newline inside the label did not break it.
        let series = text.lines().filter(|l| !l.starts_with('#'));
        assert_eq!(series.filter(|l| l.contains("prune")).count(), 1);
        assert_eq!(escape_help("a\\b\nc"), "a\\\\b\\nc");
    }

    #[test]
    fn series_are_sorted_whatever_the_recording_order() {
        let a = Metrics::new();
        let b = Metrics::new();
        for p in ["b", "a", "c"] {
            a.bundle_done(p);
            a.set_queue_depth(p, "work", 1);
        }
        for p in ["c", "a", "b"] {
            b.set_queue_depth(p, "work", 1);
            b.bundle_done(p);
        }
        assert_eq!(a.render(), b.render());
        let text = a.render();
        let order: Vec<usize> = ["pipeline=\"a\"", "pipeline=\"b\"", "pipeline=\"c\""]
            .iter()
            .map(|p| text.find(p).unwrap())
            .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{text}");
    }

    #[test]
    fn configure_adds_zero_series_and_drops_removed_ones() {
        let m = Metrics::new();
        m.configure(&config(
            "pipelines:\n  - id: p\n    destinations:\n      - id: d\n        path: /srv/d\n  - id: q\n    destinations:\n      - id: e\n        path: /srv/e\n",
        ));
        m.bundle_done("p");
        m.bundle_done("q");
        m.set_queue_depth("p", "inbox", 7);
        m.add_prune_deletions("p", "d", 3);
        let text = m.render();
        for want in [
            "distributor_bundles_failed_total{pipeline=\"p\"} 0\n",
            "distributor_spool_bundles{pipeline=\"q\",spool=\"done\"} 0\n",
            "distributor_spool_bundles{pipeline=\"q\",spool=\"work\"} 0\n",
            "distributor_prune_deletions_total{pipeline=\"q\",destination=\"e\"} 0\n",
        ] {
            assert!(text.contains(want), "lacks {want:?}:\n{text}");
        }
        assert!(!text.contains("last_success_timestamp_seconds{"), "{text}");

        // Reload: q goes away, p keeps its numbers, r appears at zero.
        m.configure(&config(
            "pipelines:\n  - id: p\n    destinations:\n      - id: d\n        path: /srv/d\n  - id: r\n    destinations:\n      - id: f\n        path: /srv/f\n",
        ));
        let text = m.render();
        assert!(!text.contains("pipeline=\"q\""), "{text}");
        for want in [
            "distributor_bundles_done_total{pipeline=\"p\"} 1\n",
            "distributor_bundles_done_total{pipeline=\"r\"} 0\n",
            "distributor_spool_bundles{pipeline=\"p\",spool=\"inbox\"} 7\n",
            "distributor_prune_deletions_total{pipeline=\"p\",destination=\"d\"} 3\n",
        ] {
            assert!(text.contains(want), "lacks {want:?}:\n{text}");
        }
    }

    #[test]
    fn counters_are_safe_to_share_between_threads() {
        let m = Arc::new(Metrics::new());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let m = Arc::clone(&m);
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        m.bundle_done("p");
                        m.add_published_bytes("p", 2);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let text = m.render();
        assert!(text.contains("distributor_bundles_done_total{pipeline=\"p\"} 4000\n"));
        assert!(text.contains("distributor_published_bytes_total{pipeline=\"p\"} 8000\n"));
    }

    #[test]
    fn write_atomic_replaces_the_file_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("distributor.prom");
        fs::write(&path, "old\n").unwrap();
        let m = Metrics::new();
        m.bundle_done("p");
        m.write_atomic(&path).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), m.render());
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("distributor.prom")]);

        // A missing folder is an error, and nothing is left behind.
        let missing = dir.path().join("nope").join("distributor.prom");
        assert_eq!(
            m.write_atomic(&missing).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        assert!(m.write_atomic(Path::new("/")).is_err());
    }
}
