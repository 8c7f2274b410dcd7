//! Publication: verify a bundle, lock every destination root, plan them all,
//! and only if every plan is accepted, execute them.
//!
//! Execution follows the plan exactly and decides nothing new: journal,
//! clear (force and legacy replacement only), stage every output as a
//! fsynced temporary file, rename them into place, delete, write the
//! catalog last, drop the journal. Any error rolls the root back to a state
//! whose catalog matches its bytes (see `journal`).

use crate::bundle::{self, VerifiedBundle};
use crate::catalog::{
    Catalog, OutputKind, OutputRecord, STATE_FILE, SourceIdentity, State, format_time,
};
use crate::config::{self, Destination, Pipeline};
use crate::failpoint;
use crate::hashing::{self, Hashed};
use crate::journal::{self, JOURNAL_FILE, Journal, JournalWrite};
use crate::lock::{self, RootLock};
use crate::paths::RelPath;
use crate::plan::{self, Desired, Listing, Plan, PlanInput};
use crate::render::{RenderOptions, markdown_to_html};
use crate::report::{DestinationReport, RunReport, SourceReport, Stage};
use crate::storage::{self, Entry, Root};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Read};
use std::path::Path;
use std::time::Duration;
use time::OffsetDateTime;

/// How to run a publication.
#[derive(Debug, Clone)]
pub struct Options {
    pub dry_run: bool,
    /// `--force`: plan `force_replace` for every selected destination.
    pub force: bool,
    pub lock_timeout: Duration,
}

/// Rendered HTML, keyed by the markdown file's bundle path.
type Rendered = BTreeMap<RelPath, Vec<u8>>;

/// One destination, prepared before any lock is taken.
struct Prepared<'a> {
    destination: &'a Destination,
    desired: Vec<Desired>,
    /// Bytes of generated outputs, by output path.
    generated: BTreeMap<RelPath, Vec<u8>>,
}

/// One destination once its root is locked and planned.
struct Planned {
    root: Option<Root>,
    _lock: Option<RootLock>,
    state_was_absent: bool,
    /// The record each planned write replaces (for the journal), by path.
    replaced: BTreeMap<String, OutputRecord>,
    /// The catalog to write last (`None`: nothing to write, or a dry run).
    catalog: Option<Catalog>,
    plan: Plan,
}

fn destination_report(d: &Destination) -> DestinationReport {
    DestinationReport {
        destination_id: d.id.clone(),
        root: d.root.display().to_string(),
        workflow: d.workflow.as_str().to_owned(),
        action: None,
        writes: Vec::new(),
        deletes: Vec::new(),
        unmanaged: Vec::new(),
        error: None,
    }
}

/// Publishes the bundle in `bundle_dir` to `destinations` of `pipeline`.
///
/// Every byte is read once where possible: the bundle is inspected (manifest,
/// file types and sizes) up front, and each copied file is hashed while it
/// is staged. Nothing is renamed into any root until every staged copy, and
/// every file no destination copies, has matched the manifest. When the run
/// will not write (a dry run, a refusal, a skip) or creates a root, the whole
/// bundle is hashed before anything else, so an invalid bundle is always
/// reported as such and never leaves a trace.
pub fn publish(
    pipeline: &Pipeline,
    destinations: &[&Destination],
    bundle_dir: &Path,
    options: &Options,
) -> RunReport {
    let Ready {
        mut report,
        bundle,
        source,
        prepared,
        mut verified,
    } = match prepare_bundle(pipeline, destinations, bundle_dir, options.dry_run) {
        Ok(ready) => ready,
        Err(report) => return *report,
    };

    // Lock roots in path order (no deadlock between processes), then plan.
    let now = now_millis();
    let mut order: Vec<usize> = (0..prepared.len()).collect();
    order.sort_by(|a, b| {
        prepared[*a]
            .destination
            .root
            .cmp(&prepared[*b].destination.root)
    });
    let mut planned: Vec<(usize, Planned)> = Vec::new();
    for i in order {
        match lock_and_plan(&prepared[i], &pipeline.id, &source, options, now, false) {
            Ok(done) => planned.push((i, done)),
            Err((stage, e, transient)) => {
                report.destinations[i].error = Some(e.clone());
                return report.fail(stage, e, transient);
            }
        }
    }
    let refused = record_plans(&mut report, planned.iter().map(|(i, p)| (*i, &p.plan)));
    let writes_anything = planned.iter().any(|(_, p)| !p.plan.writes.is_empty());
    let creates_root = planned.iter().any(|(_, p)| p.root.is_none());
    let hash_first = refused.is_some() || options.dry_run || !writes_anything || creates_root;
    if hash_first && let Err(e) = verify_rest(&bundle, &mut verified) {
        return report.fail(Stage::Verify, e.to_string(), e.is_transient());
    }
    if let Some(refused) = refused {
        return refused;
    }
    if options.dry_run {
        return report;
    }
    // Roots that do not exist yet are created (and locked) only now that
    // every plan is accepted, then planned again under their lock.
    for (i, p) in planned.iter_mut().filter(|(_, p)| p.root.is_none()) {
        match lock_and_plan(&prepared[*i], &pipeline.id, &source, options, now, true) {
            Ok(again) => *p = again,
            Err((stage, e, transient)) => {
                report.destinations[*i].error = Some(e.clone());
                return report.fail(stage, e, transient);
            }
        }
    }
    if let Some(refused) = record_plans(&mut report, planned.iter().map(|(i, p)| (*i, &p.plan))) {
        return refused;
    }
    planned.sort_by_key(|(i, _)| *i);

    // Stage every destination (journal, temporary files hashed as they are
    // copied); then check what no destination copied; only then commit.
    let mut staged: Vec<(usize, Vec<String>)> = Vec::new();
    let mut failure = None;
    for (i, p) in &planned {
        match stage(p, &prepared[*i], &bundle, &mut verified) {
            Ok(temps) => staged.push((*i, temps)),
            Err(f) => {
                failure = Some((*i, f));
                break;
            }
        }
    }
    if failure.is_none()
        && let Err(e) = verify_rest(&bundle, &mut verified)
    {
        failure = Some((usize::MAX, Failure::Bundle(e)));
    }
    if let Some((i, f)) = failure {
        for (_, p) in &planned {
            roll_back(p);
        }
        return match f {
            Failure::Bundle(e) => report.fail(Stage::Verify, e.to_string(), e.is_transient()),
            Failure::Io(e) => write_failed(report, i, prepared[i].destination, &e),
            Failure::Other(e) => report.fail(Stage::Publish, e, false),
        };
    }
    for (i, temps) in &staged {
        let p = &planned
            .iter()
            .find(|(j, _)| j == i)
            .expect("staged destinations are planned")
            .1;
        if let Err(e) = commit(p, temps) {
            roll_back(p);
            return write_failed(report, *i, prepared[*i].destination, &e);
        }
        report.bytes_published += p.plan.writes.iter().map(|d| d.size).sum::<u64>();
    }
    report
}

/// A bundle inspected, rendered and mapped to each destination's outputs.
struct Ready<'a> {
    report: RunReport,
    bundle: VerifiedBundle,
    source: SourceIdentity,
    prepared: Vec<Prepared<'a>>,
    /// Bundle files whose bytes have been hashed and matched the manifest.
    verified: BTreeSet<RelPath>,
}

/// Inspects the bundle (manifest, file types and sizes), renders its
/// markdown where a destination wants HTML, and computes every
/// destination's outputs. Takes no lock. The error is the finished report.
fn prepare_bundle<'a>(
    pipeline: &Pipeline,
    destinations: &[&'a Destination],
    bundle_dir: &Path,
    dry_run: bool,
) -> Result<Ready<'a>, Box<RunReport>> {
    let mut report = RunReport::new(&pipeline.id, dry_run);
    let bundle = match bundle::inspect(bundle_dir) {
        Ok(b) => b,
        Err(e) => {
            report.source = bundle::read_manifest(bundle_dir)
                .ok()
                .map(|m| SourceReport {
                    id: m.id.clone(),
                    digest: m.digest.clone(),
                    created: m.created_text(),
                });
            let transient = e.is_transient();
            return Err(Box::new(report.fail(
                Stage::Verify,
                e.to_string(),
                transient,
            )));
        }
    };
    let m = &bundle.manifest;
    report.source = Some(SourceReport {
        id: m.id.clone(),
        digest: m.digest.clone(),
        created: m.created_text(),
    });
    report.warnings = bundle.warnings.clone();
    let source = SourceIdentity {
        id: m.id.clone(),
        digest: m.digest.clone(),
        created: m.created,
    };
    report.destinations = destinations.iter().map(|d| destination_report(d)).collect();
    // Bundle files whose bytes have been hashed and matched the manifest.
    let mut verified: BTreeSet<RelPath> = BTreeSet::new();

    // Prepare every destination's outputs (rendering included) before locking.
    let mut rendered: [Option<Rendered>; 2] = [None, None];
    let mut prepared = Vec::new();
    for (i, d) in destinations.iter().enumerate() {
        let html = if d.publish_html {
            let slot = &mut rendered[usize::from(d.allow_raw_html)];
            if slot.is_none() {
                match render_all(&bundle, d.allow_raw_html, &mut verified) {
                    Ok(r) => *slot = Some(r),
                    Err(Failure::Bundle(e)) => {
                        return Err(Box::new(report.fail(
                            Stage::Verify,
                            e.to_string(),
                            e.is_transient(),
                        )));
                    }
                    Err(Failure::Other(e)) => {
                        report.destinations[i].error = Some(e.clone());
                        return Err(Box::new(report.fail(Stage::Verify, e, false)));
                    }
                    Err(Failure::Io(e)) => {
                        return Err(Box::new(report.fail(
                            Stage::Verify,
                            e.to_string(),
                            storage::is_transient(&e),
                        )));
                    }
                }
            }
            slot.as_ref()
        } else {
            None
        };
        match prepare(pipeline, d, &bundle, html) {
            Ok(p) => prepared.push(p),
            Err(e) => {
                report.destinations[i].error = Some(e.clone());
                return Err(Box::new(report.fail(
                    Stage::Verify,
                    format!("bundle is invalid for destination {}: {e}", d.id),
                    false,
                )));
            }
        }
    }

    Ok(Ready {
        report,
        bundle,
        source,
        prepared,
        verified,
    })
}

/// The report of a write that failed in destination `i` (after its root
/// was settled from the journal).
fn write_failed(mut report: RunReport, i: usize, d: &Destination, e: &io::Error) -> RunReport {
    let transient = storage::is_transient(e);
    let next = if transient {
        "the agent retries it with backoff; if it persists, free space or fix permissions on the root, then `distributor spool retry`"
    } else {
        "fix the cause, then publish the bundle again"
    };
    let message = format!(
        "publishing to {} failed: {e}; the root was left consistent (its catalog matches its files), {next}",
        d.root.display()
    );
    report.destinations[i].error = Some(message.clone());
    report.fail(Stage::Publish, message, transient)
}

/// Why preparing or staging a publication stopped.
enum Failure {
    /// The bundle does not match its manifest.
    Bundle(bundle::BundleError),
    /// Writing to a destination failed.
    Io(io::Error),
    /// Anything else, already phrased for the operator.
    Other(String),
}

/// Hashes every listed file not checked yet.
fn verify_rest(
    bundle: &VerifiedBundle,
    verified: &mut BTreeSet<RelPath>,
) -> Result<(), bundle::BundleError> {
    let rest: Vec<&bundle::ManifestFile> = bundle
        .manifest
        .files
        .iter()
        .filter(|f| !verified.contains(&f.path))
        .collect();
    if rest.is_empty() {
        return Ok(());
    }
    bundle::verify_files(&bundle.dir, &rest)?;
    verified.extend(rest.into_iter().map(|f| f.path.clone()));
    Ok(())
}

/// Copies each plan into the report; returns the failed report when any
/// plan is a refusal (then nothing may be written anywhere).
fn record_plans<'p>(
    report: &mut RunReport,
    plans: impl Iterator<Item = (usize, &'p Plan)>,
) -> Option<RunReport> {
    let mut refused = Vec::new();
    for (i, plan) in plans {
        let r = &mut report.destinations[i];
        r.action = Some(plan.action.as_str().to_owned());
        r.writes = plan
            .writes
            .iter()
            .map(|d| d.path.as_str().to_owned())
            .collect();
        r.deletes = plan.deletes.clone();
        r.unmanaged = plan.unmanaged.clone();
        r.error = plan.error.clone();
        if plan.action.is_refusal() {
            refused.push(format!(
                "{}: {}",
                r.destination_id,
                r.error.clone().unwrap_or_default()
            ));
        }
    }
    if refused.is_empty() {
        return None;
    }
    let mut failed = report.clone();
    failed.refused = true;
    Some(failed.fail(
        Stage::Plan,
        format!(
            "publication refused, nothing was written: {}",
            refused.join("; ")
        ),
        false,
    ))
}

/// Reads every markdown file of the bundle (checking its bytes against the
/// manifest) and renders it.
fn render_all(
    bundle: &VerifiedBundle,
    allow_raw_html: bool,
    verified: &mut BTreeSet<RelPath>,
) -> Result<Rendered, Failure> {
    let md: Vec<&bundle::ManifestFile> = bundle
        .manifest
        .files
        .iter()
        .filter(|f| f.path.as_str().ends_with(".md"))
        .collect();
    let generated: BTreeSet<String> = md.iter().map(|f| f.path.as_str().to_owned()).collect();
    let mut out = Rendered::new();
    for f in md {
        let bytes = read_listed(bundle, f)?;
        verified.insert(f.path.clone());
        let text = String::from_utf8(bytes).map_err(|e| {
            Failure::Other(format!(
                "{}: not valid UTF-8 (byte {}), so it cannot be rendered to HTML; save it as UTF-8 or turn publish.html off",
                f.path,
                e.utf8_error().valid_up_to()
            ))
        })?;
        let html = markdown_to_html(
            &text,
            &RenderOptions {
                allow_raw_html,
                source_path: f.path.as_str(),
                generated_markdown: &generated,
            },
        );
        out.insert(f.path.clone(), html.into_bytes());
    }
    Ok(out)
}

/// Reads a listed file into memory, checking size and hash.
fn read_listed(bundle: &VerifiedBundle, f: &bundle::ManifestFile) -> Result<Vec<u8>, Failure> {
    let invalid =
        |p: bundle::Problem| Failure::Bundle(bundle::BundleError::Invalid { problems: vec![p] });
    let file = bundle::open_listed(&bundle.dir, &f.path).map_err(invalid)?;
    let mut bytes = Vec::new();
    let got = hashing::copy_hashed(&mut (&file).take(f.size + 1), Some(&mut bytes), None)
        .map_err(Failure::Io)?;
    if got.sha256 != f.sha256 || got.size != f.size {
        return Err(invalid(bundle::mismatch_problem(f, &got)));
    }
    Ok(bytes)
}

/// Computes one destination's desired outputs.
fn prepare<'a>(
    pipeline: &Pipeline,
    d: &'a Destination,
    bundle: &VerifiedBundle,
    html: Option<&Rendered>,
) -> Result<Prepared<'a>, String> {
    let m = &bundle.manifest;
    let prefix = config::expand_prefix(&d.prefix, &m.id, &pipeline.id, m.created)
        .map_err(|e| format!("prefix {:?}: {e}", d.prefix))?;
    let place = |path: &str| -> Result<RelPath, String> {
        let full = if prefix.is_empty() {
            path.to_owned()
        } else {
            format!("{prefix}/{path}")
        };
        RelPath::parse(&full).map_err(|e| format!("output path {full:?}: {e}"))
    };
    let url = |p: &RelPath| d.base_url.as_ref().map(|b| plan::output_url(b, p));
    let mut desired = Vec::new();
    let mut generated = BTreeMap::new();
    for f in &m.files {
        if d.publish_source {
            let path = place(f.path.as_str())?;
            desired.push(Desired {
                url: url(&path),
                path,
                kind: OutputKind::Source,
                bundle_path: f.path.clone(),
                sha256: f.sha256.clone(),
                size: f.size,
            });
        }
        if let Some(bytes) = html.and_then(|h| h.get(&f.path)) {
            let stem = f
                .path
                .as_str()
                .strip_suffix(".md")
                .unwrap_or(f.path.as_str());
            let path = place(&format!("{stem}.html"))?;
            let Hashed { sha256, size } = hashing::hash_bytes(bytes);
            desired.push(Desired {
                url: url(&path),
                path: path.clone(),
                kind: OutputKind::Generated,
                bundle_path: f.path.clone(),
                sha256,
                size,
            });
            generated.insert(path, bytes.clone());
        }
    }
    plan::check_unique(&desired)?;
    desired.sort_by(|a, b| a.path.as_str().cmp(b.path.as_str()));
    Ok(Prepared {
        destination: d,
        desired,
        generated,
    })
}

type StageError = (Stage, String, bool);

fn lock_and_plan(
    prepared: &Prepared<'_>,
    pipeline_id: &str,
    source: &SourceIdentity,
    options: &Options,
    now: OffsetDateTime,
    create: bool,
) -> Result<Planned, StageError> {
    let d = prepared.destination;
    let shown = d.root.display();
    let io_err = |what: &str, e: io::Error| {
        let transient = storage::is_transient(&e);
        (Stage::Lock, format!("{what} {shown}: {e}"), transient)
    };
    let root = if create {
        Some(Root::create(&d.root).map_err(|e| io_err("cannot create destination root", e))?)
    } else {
        Root::open(&d.root).map_err(|e| io_err("cannot open destination root", e))?
    };
    let lock = match &root {
        Some(root) if options.dry_run => lock::acquire_existing(root, options.lock_timeout),
        Some(root) => lock::acquire(root, options.lock_timeout).map(Some),
        None => Ok(None),
    }
    .map_err(|e| {
        let transient = match &e {
            lock::LockError::Timeout { .. } => true,
            lock::LockError::Io { source, .. } => storage::is_transient(source),
        };
        (Stage::Lock, e.to_string(), transient)
    })?;

    let plan_err = |e: io::Error| {
        let transient = storage::is_transient(&e);
        (
            Stage::Plan,
            format!("cannot read destination root {shown}: {e}"),
            transient,
        )
    };
    let (state, listing) = match &root {
        None => (State::Absent, Listing::default()),
        Some(root) => {
            let state = journal::recover(root, !options.dry_run, now).map_err(plan_err)?;
            let listing =
                list(root, &prepared.desired, &state, d, options.force).map_err(plan_err)?;
            (state, listing)
        }
    };
    let plan = plan::plan(&PlanInput {
        pipeline_id,
        destination_id: &d.id,
        workflow: d.workflow,
        force: options.force,
        source,
        desired: &prepared.desired,
        state: &state,
        listing: &listing,
        now,
    });
    let state_was_absent = matches!(state, State::Absent);
    // Keep only the records the journal needs, then turn the old catalog
    // into the new one in place (dry runs never write, so never build it).
    let (replaced, current) = match state {
        State::Catalog(old) => (
            plan.writes
                .iter()
                .filter_map(|d| old.get(d.path.as_str()).cloned())
                .map(|r| (r.path.as_str().to_owned(), r))
                .collect(),
            Some(old),
        ),
        _ => (BTreeMap::new(), None),
    };
    let catalog = match &plan.update {
        Some(update) if !options.dry_run => Some(update.apply(current)),
        _ => None,
    };
    Ok(Planned {
        root,
        _lock: lock,
        state_was_absent,
        replaced,
        catalog,
        plan,
    })
}

fn list(
    root: &Root,
    desired: &[Desired],
    state: &State,
    d: &Destination,
    force: bool,
) -> io::Result<Listing> {
    Ok(Listing {
        root_exists: true,
        top_level: if plan::needs_top_level(state, force) {
            root.top_level()?
        } else {
            Vec::new()
        },
        entries: probe(root, desired, &BTreeMap::new())?,
        all: if plan::needs_walk(state, d.workflow, force) {
            root.walk()?
        } else {
            Vec::new()
        },
    })
}

/// What storage holds at each planned path and the folders above it (the
/// planner's view); `overlay` answers for paths a batch has already planned.
fn probe(
    root: &Root,
    desired: &[Desired],
    overlay: &BTreeMap<String, Entry>,
) -> io::Result<BTreeMap<String, Entry>> {
    let mut entries = BTreeMap::new();
    for path in plan::probe_paths(desired) {
        let entry = match overlay.get(&path) {
            Some(e) => *e,
            None => root.entry(&path)?,
        };
        if entry != Entry::Missing {
            entries.insert(path, entry);
        }
    }
    Ok(entries)
}

/// Folders above the planned outputs that do not exist yet, shallowest first.
fn missing_dirs(root: &Root, writes: &[Desired]) -> io::Result<Vec<String>> {
    let mut dirs = BTreeSet::new();
    for d in writes {
        dirs.extend(d.path.ancestors().map(str::to_owned));
    }
    let mut missing = Vec::new();
    for dir in dirs {
        if root.entry(&dir)? != Entry::Dir {
            missing.push(dir);
        }
    }
    missing.sort_by_key(|d| d.matches('/').count());
    Ok(missing)
}

/// Writes the journal and every output of `p` as a fsynced temporary file,
/// hashing copies as they stream. Returns the temporary names, in the order
/// of `p.plan.writes`. Renames nothing.
fn stage(
    p: &Planned,
    prepared: &Prepared<'_>,
    bundle: &VerifiedBundle,
    verified: &mut BTreeSet<RelPath>,
) -> Result<Vec<String>, Failure> {
    let plan = &p.plan;
    let (Some(root), Some(catalog)) = (&p.root, &p.catalog) else {
        return Ok(Vec::new()); // skip_same: nothing to do
    };
    let journal = Journal {
        writes: plan
            .writes
            .iter()
            .filter_map(|d| {
                catalog.get(d.path.as_str()).map(|new| JournalWrite {
                    new: new.clone(),
                    old: p.replaced.get(d.path.as_str()).cloned(),
                })
            })
            .collect(),
        deletes: plan
            .clear_first
            .iter()
            .chain(&plan.delete_after)
            .cloned()
            .collect(),
        created_dirs: missing_dirs(root, &plan.writes).map_err(Failure::Io)?,
        state_was_absent: p.state_was_absent,
    };
    root.write_reserved(JOURNAL_FILE, &journal.to_json())
        .map_err(Failure::Io)?;
    failpoint::hit("publish.after_journal");
    for entry in &plan.clear_first {
        root.remove_any(entry).map_err(Failure::Io)?;
        failpoint::hit("publish.after_clear");
    }
    if !plan.clear_first.is_empty() {
        storage::sync_dir(root.dir()).map_err(Failure::Io)?;
    }
    let mut staged = Vec::with_capacity(plan.writes.len());
    for d in &plan.writes {
        let (temp, file, copied) =
            stage_output(root, d, prepared.generated.get(&d.path), &bundle.dir)?;
        staged.push(temp);
        if let Some(got) = copied {
            if got.sha256 != d.sha256 || got.size != d.size {
                let listed = bundle
                    .manifest
                    .files
                    .iter()
                    .find(|f| f.path == d.bundle_path)
                    .expect("copied outputs come from listed files");
                return Err(Failure::Bundle(bundle::BundleError::Invalid {
                    problems: vec![bundle::mismatch_problem(listed, &got)],
                }));
            }
            verified.insert(d.bundle_path.clone());
        }
        // Every staged byte is on disk before anything is renamed into
        // place (the journal already is). Per-file fsync, not syncfs: a
        // busy neighbour on the same file system must not slow us down.
        file.sync_all().map_err(Failure::Io)?;
        failpoint::hit("publish.after_stage");
    }
    Ok(staged)
}

/// Writes one output to a new temporary file in its target folder (created
/// as needed): the rendered bytes, or the bundle file copied as it is
/// hashed. Returns the temporary name, the open file (not fsynced) and,
/// for a copy, the hash of the bytes copied, for the caller to check.
fn stage_output(
    root: &Root,
    d: &Desired,
    generated: Option<&Vec<u8>>,
    bundle_dir: &Path,
) -> Result<(String, std::fs::File, Option<Hashed>), Failure> {
    let dir = root
        .parent_dir(&d.path, Some(&mut Vec::new()))
        .map_err(Failure::Io)?;
    let (temp, mut file) = storage::create_temp(&dir).map_err(Failure::Io)?;
    let copied = match generated {
        Some(bytes) => {
            io::Write::write_all(&mut file, bytes).map_err(Failure::Io)?;
            None
        }
        None => {
            let source = bundle::open_listed(bundle_dir, &d.bundle_path)
                .map_err(|p| Failure::Bundle(bundle::BundleError::Invalid { problems: vec![p] }))?;
            let got = hashing::copy_hashed(
                &mut (&source),
                Some(&mut storage::WriteBehind::new(&mut file)),
                Some(d.size),
            )
            .map_err(Failure::Io)?;
            Some(got)
        }
    };
    Ok((temp, file, copied))
}

/// Renames the staged outputs of `p` into place, deletes, writes the
/// catalog and drops the journal.
fn commit(p: &Planned, staged: &[String]) -> io::Result<()> {
    let plan = &p.plan;
    let (Some(root), Some(catalog)) = (&p.root, &p.catalog) else {
        return Ok(());
    };
    let touched = move_into_place(
        root,
        plan.writes.iter().map(|d| &d.path).zip(staged),
        &plan.delete_after,
    )?;
    failpoint::hit("publish.before_catalog");
    root.write_reserved_data(STATE_FILE, &mut |w| catalog.write_json(w))?;
    // One fsync per folder makes the renames, the deletions and the
    // catalog's own rename durable together; until then the journal (already
    // durable) lets the next process settle whatever a crash leaves.
    for folder in &touched {
        root.sync_folder(folder)?;
    }
    log::debug!(
        "{}: catalog written at {}",
        root.path().display(),
        format_time(catalog.updated_at)
    );
    failpoint::hit("publish.after_catalog");
    root.remove_file(JOURNAL_FILE)?;
    Ok(())
}

/// Renames staged temporary files over their targets, then deletes (and
/// prunes emptied folders). Returns every folder touched, the root always
/// included (the catalog is renamed there), for the caller's fsyncs.
fn move_into_place<'p>(
    root: &Root,
    staged: impl Iterator<Item = (&'p RelPath, &'p String)>,
    deletes: impl IntoIterator<Item = &'p String>,
) -> io::Result<BTreeSet<String>> {
    let mut touched = BTreeSet::from([String::new()]);
    let mut touch = |path: &str| {
        let mut above = path;
        while let Some(i) = above.rfind('/') {
            above = &above[..i];
            touched.insert(above.to_owned());
        }
    };
    for (path, temp) in staged {
        let dir = root.parent_dir(path, None)?;
        dir.rename(temp, &dir, path.file_name())?;
        failpoint::hit("publish.after_rename");
        touch(path.as_str());
    }
    for path in deletes {
        root.remove_any(path)?;
        root.prune_empty_parents(path)?;
        failpoint::hit("publish.after_delete");
        touch(path);
    }
    Ok(touched)
}

/// After a failure, settles the root from its journal (if one was written):
/// temporary files and new folders go, and the catalog records exactly what
/// is on disk. The original error is what gets reported.
fn roll_back(p: &Planned) {
    let Some(root) = &p.root else { return };
    if let Err(again) = journal::recover(root, true, now_millis()) {
        log::error!(
            "{}: could not settle after a failed publication ({again}); the journal stays and the next run will finish it",
            root.path().display()
        );
    }
}

/// The current time, truncated to milliseconds for readable catalogs.
pub fn now_millis() -> OffsetDateTime {
    let now = OffsetDateTime::now_utc();
    now.replace_nanosecond(now.nanosecond() / 1_000_000 * 1_000_000)
        .unwrap_or(now)
}

mod batch;
pub use batch::{Batch, InOrder, Workers, publish_batch};
