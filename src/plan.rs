//! Planning: the pure decision, per destination, of what a publication does.
//!
//! Inputs are the destination's settings, the bundle's outputs, the root's
//! state and a listing of the storage paths that matter (and, for the
//! signature rules, the signer's scopes, the sources of the batch and the
//! tombstones: [`Replay`]); the output is a [`Plan`] with one of the
//! contract's action labels, or a refusal that says why. No file system
//! access and no clock here: `now` is an input, so every rule is a small
//! unit test.

use crate::catalog::{
    Catalog, OutputKind, OutputRecord, Overlay, STATE_FILE, Sha256, SourceIdentity, State,
};
use crate::config::{Encoding, Workflow};
use crate::paths::RelPath;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use time::OffsetDateTime;

/// What sits at a path in storage, as a plan sees it (the storage layer
/// lists it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    Missing,
    File {
        size: u64,
    },
    Dir,
    Symlink,
    /// FIFO, socket or device.
    Other,
}

/// The contract's action labels (docs/contract.md §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    PublishNew,
    UpsertAdditive,
    ReplaceCatalog,
    SkipSame,
    ForceReplace,
    FailUnmanaged,
    FailConflict,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::PublishNew => "publish_new",
            Action::UpsertAdditive => "upsert_additive",
            Action::ReplaceCatalog => "replace_catalog",
            Action::SkipSame => "skip_same",
            Action::ForceReplace => "force_replace",
            Action::FailUnmanaged => "fail_unmanaged",
            Action::FailConflict => "fail_conflict",
        }
    }

    /// True for the two refusals.
    pub fn is_refusal(self) -> bool {
        matches!(self, Action::FailUnmanaged | Action::FailConflict)
    }
}

/// One output the publication wants in the root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    pub path: RelPath,
    pub kind: OutputKind,
    /// The bundle file the bytes come from (copied, rendered, or
    /// compressed: a sibling's is its original's).
    pub bundle_path: RelPath,
    /// How a generated output is made from `bundle_path` (a catalog
    /// transform); `None` for a copy.
    pub transform: Option<&'static str>,
    pub url: Option<String>,
    pub sha256: Sha256,
    pub size: u64,
}

/// What every record a plan writes shares: its owner and its source,
/// allocated once per plan rather than copied into each record.
struct Shared {
    pipeline_id: Arc<str>,
    destination_id: Arc<str>,
    source: Arc<SourceIdentity>,
}

impl Shared {
    fn new(input: &PlanInput<'_>) -> Shared {
        Shared {
            pipeline_id: input.pipeline_id.into(),
            destination_id: input.destination_id.into(),
            source: Arc::new(input.source.clone()),
        }
    }
}

impl Desired {
    fn record(
        &self,
        shared: &Shared,
        created_at: OffsetDateTime,
        now: OffsetDateTime,
    ) -> OutputRecord {
        let generated = self.kind == OutputKind::Generated;
        OutputRecord {
            path: self.path.clone(),
            pipeline_id: shared.pipeline_id.clone(),
            destination_id: shared.destination_id.clone(),
            source: shared.source.clone(),
            kind: self.kind,
            source_path: generated.then(|| self.bundle_path.clone()),
            transform: self.transform,
            url: self.url.clone(),
            sha256: self.sha256,
            size: self.size,
            created_at,
            updated_at: now,
        }
    }

    /// True when `record` already describes exactly this output for
    /// `input`'s owner and source (timestamps aside).
    fn matches(&self, record: &OutputRecord, input: &PlanInput<'_>) -> bool {
        let generated = self.kind == OutputKind::Generated;
        record.path == self.path
            && record.owned_by(input.pipeline_id, input.destination_id)
            && *record.source == *input.source
            && record.kind == self.kind
            && record.source_path.as_ref() == generated.then_some(&self.bundle_path)
            && record.transform == self.transform
            && record.url == self.url
            && record.sha256 == self.sha256
            && record.size == self.size
    }
}

/// What storage holds at the paths that matter to a plan.
#[derive(Debug, Clone, Default)]
pub struct Listing {
    pub root_exists: bool,
    /// Top-level names, reserved ones aside; filled only when
    /// [`needs_top_level`] says so.
    pub top_level: Vec<String>,
    /// Entries at every planned path and each of its folders.
    pub entries: BTreeMap<String, Entry>,
    /// Every entry below the root; filled only when [`needs_walk`] says so.
    pub all: Vec<(String, Entry)>,
}

impl Listing {
    fn entry(&self, path: &str) -> Entry {
        self.entries.get(path).copied().unwrap_or(Entry::Missing)
    }
}

/// The storage paths a plan for `desired` looks at: each output path and
/// each folder above it.
pub fn probe_paths(desired: &[Desired]) -> BTreeSet<String> {
    let mut paths = BTreeSet::new();
    for d in desired {
        paths.insert(d.path.as_str().to_owned());
        paths.extend(d.path.ancestors().map(str::to_owned));
    }
    paths
}

/// True when planning needs the root's top-level names: only a root without
/// state (is it empty?) and `--force` (what it clears) look at them, so a
/// publication into a large flat root does not list it.
pub fn needs_top_level(state: &State, force: bool) -> bool {
    force || matches!(state, State::Absent)
}

/// True when planning needs the full listing of the root (clearing plans).
pub fn needs_walk(state: &State, workflow: Workflow, force: bool) -> bool {
    force || (matches!(state, State::Legacy { .. }) && workflow == Workflow::Replacement)
}

/// Everything planning decides from.
#[derive(Debug, Clone)]
pub struct PlanInput<'a> {
    pub pipeline_id: &'a str,
    pub destination_id: &'a str,
    pub workflow: Workflow,
    pub force: bool,
    pub source: &'a SourceIdentity,
    /// Sorted by path, unique, no path a folder of another. Shared, so
    /// that a plan's writes are this list, not a copy of it.
    pub desired: &'a Arc<[Desired]>,
    pub state: &'a State,
    pub listing: &'a Listing,
    /// Planned paths whose stored entry holds the recorded bytes but is
    /// written again all the same: an object stored with other response
    /// headers than its destination's rules give now
    /// (docs/object-storage.md, "Serving the bucket").
    pub rewrite: &'a BTreeSet<String>,
    pub now: OffsetDateTime,
    /// A replacement deletes the owner's outputs it no longer plans only
    /// inside these scopes: those of the principals that signed the bundle,
    /// when the pipeline has `signatures.scopes` (docs/contract.md §17.4).
    /// `None`: everywhere.
    pub delete_within: Option<&'a [crate::scope::Scope]>,
    /// What finds the outputs of later sources the plan would roll back
    /// ([`decide`]); `None`: they are not looked for.
    pub replay: Option<Replay<'a>>,
}

/// What [`decide`] needs to find the stored outputs of sources created
/// after the bundle's that its plan would overwrite or delete, or write
/// again after a later source deleted them (docs/contract.md §17.5,
/// §18.7). Asked for when the pipeline refuses older bundles, or when the
/// caller wants them listed.
#[derive(Debug, Clone, Copy)]
pub struct Replay<'a> {
    /// `signatures.refuse_older`: a plan that would roll anything back is
    /// refused.
    pub refuse: bool,
    /// The sources of the bundles planned after this one in the same
    /// batch, whose records it may overwrite without rolling anything back
    /// (the merged change puts theirs on top; a batch published again
    /// after a crash during its commit meets them in the roots the commit
    /// reached).
    pub later: &'a [SourceIdentity],
    /// What the bundles planned before this one in the same batch delete
    /// in this root, with the source of each (their tombstones).
    pub retracted: &'a BTreeMap<String, SourceIdentity>,
    /// What publications before the batch deleted at this destination, by
    /// output path (the spool's tombstones): a deleted output has no record
    /// to protect it.
    pub tombstones: Option<&'a BTreeMap<String, crate::spool::queue::Tombstone>>,
}

/// A stored output that publishing a bundle would overwrite or delete
/// although its source was created after the bundle's own: publishing it
/// would roll the destination back (docs/contract.md §18.7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rollback {
    pub destination: String,
    pub path: String,
    /// The stored output's source and its `created`.
    pub source: String,
    pub created: OffsetDateTime,
    /// The bundle's own `created`.
    pub own: OffsetDateTime,
}

impl std::fmt::Display for Rollback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::catalog::format_time;
        write!(
            f,
            "{} in destination {} is from source {} created {}, later than this bundle's {}",
            self.path,
            self.destination,
            self.source,
            format_time(self.created),
            format_time(self.own)
        )
    }
}

impl Rollback {
    /// "N outputs of later sources: …", the first five named with their
    /// source and both times: what a refusal to roll back says
    /// (docs/contract.md §17.5, §18.7).
    pub fn summary(found: &[Rollback]) -> String {
        format!(
            "{} output{} of later sources: {}",
            found.len(),
            if found.len() == 1 { "" } else { "s" },
            crate::text::wording::first_few(found, 5, "; ")
        )
    }
}

/// The decision for one destination.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub action: Action,
    /// Outputs to write (empty for skips and refusals): the desired
    /// outputs themselves, shared rather than copied (a large tree's list
    /// is several MiB).
    pub writes: Arc<[Desired]>,
    /// Entries removed before anything is written: everything for
    /// `force_replace`, entries that block planned paths for a replacement
    /// over legacy state. Removed whole (folders with their content).
    pub clear_first: Vec<String>,
    /// Files removed after the writes (replacement), then their emptied folders.
    pub delete_after: Vec<String>,
    /// What the report lists as deleted: every file gone afterwards.
    pub deletes: Vec<String>,
    /// Storage paths that block the plan.
    pub unmanaged: Vec<String>,
    pub error: Option<String>,
    /// How the catalog changes, written last; `None` when nothing is written.
    pub update: Option<CatalogUpdate>,
}

/// The change a plan makes to a root's catalog. Kept as a delta so that
/// planning never copies a catalog that may hold 100k records.
#[derive(Debug, Clone, PartialEq)]
pub struct CatalogUpdate {
    /// Start from the root's current catalog; `false` starts a fresh one
    /// (new roots, legacy state, `force_replace`).
    pub keep_existing: bool,
    /// The record of every planned output, sorted by path.
    pub upserts: Vec<OutputRecord>,
    /// Paths whose records are dropped.
    pub removes: Vec<String>,
    pub now: OffsetDateTime,
}

impl CatalogUpdate {
    /// The catalog after the update, built from `current` (moved, not
    /// copied) in one pass.
    #[cfg(test)]
    pub fn apply(&self, current: Option<Catalog>) -> Catalog {
        let base = match current {
            Some(c) if self.keep_existing => c,
            _ => Catalog::new(self.now),
        };
        let mut catalog = Overlay::new(base);
        catalog.record(&self.upserts, &self.removes);
        catalog.into_catalog(self.now)
    }

    /// The catalog after the update, consuming the update so that its records
    /// are moved into the catalog rather than copied (a large tree's
    /// records are then held once, not twice). Also hands back the records
    /// of `current` at the planned paths (what each write replaces, for
    /// the journal), moved out rather than copied.
    pub fn into_catalog(self, current: Option<Catalog>) -> (Catalog, Vec<OutputRecord>) {
        let CatalogUpdate {
            keep_existing,
            upserts,
            removes,
            now,
        } = self;
        let mut catalog = match &current {
            Some(c) if keep_existing => Catalog {
                created_at: c.created_at,
                ..Catalog::new(now)
            },
            _ => Catalog::new(now),
        };
        let old = current.map(|c| c.outputs).unwrap_or_default();
        let (outputs, replaced) =
            if keep_existing && crate::catalog::small_beside(upserts.len(), old.len()) {
                merge_small(old, upserts, &removes)
            } else {
                merge_large(old, upserts, &removes, keep_existing)
            };
        catalog.outputs = outputs;
        (catalog, replaced)
    }
}

/// Whether `path` is one of `upserts` (sorted by path).
fn upserted(upserts: &[OutputRecord], path: &str) -> bool {
    upserts
        .binary_search_by(|u| u.path.as_str().cmp(path))
        .is_ok()
}

/// A small change to the records `old`, made where they are (a small
/// change to a large catalog then moves and sorts none of them): removed
/// ones dropped, replaced ones swapped for their upsert (and handed back),
/// new ones merged in. The records, and those replaced.
fn merge_small(
    old: Vec<OutputRecord>,
    upserts: Vec<OutputRecord>,
    removes: &[String],
) -> (Vec<OutputRecord>, Vec<OutputRecord>) {
    let mut records = old;
    debug_assert!(records.is_sorted_by(|a, b| a.path.as_str() <= b.path.as_str()));
    if !removes.is_empty() {
        let mut removed: Vec<&str> = removes.iter().map(String::as_str).collect();
        removed.sort_unstable();
        records.retain(|r| {
            let path = r.path.as_str();
            removed.binary_search(&path).is_err() || upserted(&upserts, path)
        });
    }
    let mut replaced = Vec::new();
    let mut added = Vec::new();
    for u in upserts {
        match records.binary_search_by(|r| r.path.as_str().cmp(u.path.as_str())) {
            Ok(i) => replaced.push(std::mem::replace(&mut records[i], u)),
            Err(_) => added.push(u),
        }
    }
    crate::catalog::merge_by_path(&mut records, added);
    (records, replaced)
}

/// A large change (or a fresh catalog, without `keep_existing`): what
/// becomes of each old record (replaced by an upsert and handed back,
/// removed, or kept and moved over to the upserts) is decided first, then
/// collected in place: the replaced records stay in the old records'
/// buffer, so a large tree's records are never held in a third array.
fn merge_large(
    old: Vec<OutputRecord>,
    mut upserts: Vec<OutputRecord>,
    removes: &[String],
    keep_existing: bool,
) -> (Vec<OutputRecord>, Vec<OutputRecord>) {
    let mut removed: Vec<&str> = removes.iter().map(String::as_str).collect();
    removed.sort_unstable();
    let fate: Vec<Fate> = old
        .iter()
        .map(|r| {
            let path = r.path.as_str();
            if upserted(&upserts, path) {
                Fate::Replaced
            } else if keep_existing && removed.binary_search(&path).is_err() {
                Fate::Kept
            } else {
                Fate::Dropped
            }
        })
        .collect();
    upserts.reserve_exact(fate.iter().filter(|f| **f == Fate::Kept).count());
    let mut fates = fate.into_iter();
    let replaced: Vec<OutputRecord> = old
        .into_iter()
        .filter_map(|r| match fates.next() {
            Some(Fate::Replaced) => Some(r),
            Some(Fate::Kept) => {
                upserts.push(r);
                None
            }
            _ => None,
        })
        .collect();
    crate::catalog::sort_by_path(&mut upserts);
    (upserts, replaced)
}

/// What a catalog update does with a record of the current catalog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Replaced,
    Kept,
    Dropped,
}

impl Plan {
    /// A refusal: nothing written, `error` says why.
    pub fn refused(action: Action, unmanaged: Vec<String>, error: String) -> Plan {
        Plan {
            action,
            writes: Arc::default(),
            clear_first: Vec::new(),
            delete_after: Vec::new(),
            deletes: Vec::new(),
            unmanaged,
            error: Some(error),
            update: None,
        }
    }
}

/// The plan for one destination, and what it would roll back.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub plan: Plan,
    /// The outputs of later sources the plan (as it was before a refusal
    /// for them) would roll back; empty unless [`PlanInput::replay`] asks.
    pub rollbacks: Vec<Rollback>,
}

/// Plans one destination.
#[cfg(test)]
pub fn plan(input: &PlanInput<'_>) -> Plan {
    decide(input).plan
}

/// Plans one destination and finds what the plan would roll back: under
/// `signatures.refuse_older` such a plan is refused
/// (docs/contract.md §17.5).
pub fn decide(input: &PlanInput<'_>) -> Decision {
    let plan = plan_outputs(input);
    let (Some(replay), State::Catalog(catalog)) = (&input.replay, input.state) else {
        return Decision {
            plan,
            rollbacks: Vec::new(),
        };
    };
    let mut rollbacks: Vec<Rollback> = rolled_back(&plan, catalog, input.source)
        .into_iter()
        .filter(|record| !replay.later.contains(&record.source))
        .map(|record| Rollback {
            destination: input.destination_id.to_owned(),
            path: record.path.as_str().to_owned(),
            source: record.source.id.clone(),
            created: record.source.created,
            own: input.source.created,
        })
        .collect();
    // Outputs a later publication deleted have no record to protect them:
    // their tombstones do.
    rollbacks.extend(retracted(input, replay, &plan, catalog));
    let plan = if replay.refuse && !rollbacks.is_empty() {
        Plan::refused(Action::FailConflict, Vec::new(), replay_refusal(&rollbacks))
    } else {
        plan
    };
    Decision { plan, rollbacks }
}

/// The planned writes of `plan` that a publication of a source created
/// after the bundle's deleted (a bundle before it in this batch, or a
/// publication before the batch), and that no record holds again since.
fn retracted(
    input: &PlanInput<'_>,
    replay: &Replay<'_>,
    plan: &Plan,
    catalog: &Catalog,
) -> Vec<Rollback> {
    let deleted = replay.tombstones;
    let own = input.source.created;
    plan.writes
        .iter()
        .filter(|w| catalog.get(w.path.as_str()).is_none())
        .filter_map(|w| {
            let path = w.path.as_str();
            let (by, created) = match replay.retracted.get(path) {
                Some(s) => (s.id.clone(), s.created),
                None => {
                    let t = deleted?.get(path)?;
                    (t.source.clone(), t.created)
                }
            };
            (created > own).then(|| Rollback {
                destination: input.destination_id.to_owned(),
                path: path.to_owned(),
                source: format!("{by}, which deleted it"),
                created,
                own,
            })
        })
        .collect()
}

/// Why a bundle is refused under `signatures.refuse_older`
/// (docs/contract.md §17.5): the outputs of later sources it would roll
/// back, the first few named with their source and both times.
fn replay_refusal(newer: &[Rollback]) -> String {
    format!(
        "publishing it would roll back {}. This pipeline refuses bundles older than what they replace (signatures.refuse_older), so that a signed bundle dropped again cannot roll the site back; to publish this content again, seal and sign it as a new bundle",
        Rollback::summary(newer)
    )
}

/// Plans one destination's outputs (the signature rules aside).
fn plan_outputs(input: &PlanInput<'_>) -> Plan {
    if input.force {
        return force_plan(input);
    }
    let force_hint = format!(
        "review with --dry-run, then run with --force --destination {} to replace the whole root",
        input.destination_id
    );
    match input.state {
        State::Invalid { reason } => Plan::refused(
            Action::FailConflict,
            Vec::new(),
            format!("{STATE_FILE} is invalid: {reason}; repair it by hand or {force_hint}"),
        ),
        State::Future { schema_version } => Plan::refused(
            Action::FailConflict,
            Vec::new(),
            format!(
                "{STATE_FILE} has schema_version {schema_version}, newer than this distributor understands (4); upgrade distributor, or {force_hint}"
            ),
        ),
        State::Absent => {
            if input.listing.root_exists && !input.listing.top_level.is_empty() {
                let n = input.listing.top_level.len();
                return Plan::refused(
                    Action::FailUnmanaged,
                    input.listing.top_level.clone(),
                    format!(
                        "the root has no {STATE_FILE} but holds {n} unmanaged entr{} (first: {:?}); distributor never adopts files it did not write. Point the destination at an empty folder, move the content away, or {force_hint}",
                        if n == 1 { "y" } else { "ies" },
                        input.listing.top_level[0]
                    ),
                );
            }
            write_plan(input, Action::PublishNew, None, Vec::new(), Vec::new())
        }
        State::Legacy { .. } => legacy_plan(input, &force_hint),
        State::Catalog(catalog) => catalog_plan(input, catalog, &force_hint),
    }
}

/// A plan that writes every desired output, removes `delete_after` (and
/// their records) and keeps every other record of `base` (none when `base`
/// is `None`).
fn write_plan(
    input: &PlanInput<'_>,
    action: Action,
    base: Option<&Catalog>,
    clear_first: Vec<String>,
    delete_after: Vec<String>,
) -> Plan {
    let shared = Shared::new(input);
    let mut upserts: Vec<OutputRecord> = input
        .desired
        .iter()
        .map(|d| {
            let created_at = base
                .and_then(|b| b.get(d.path.as_str()))
                .map_or(input.now, |r| r.created_at);
            d.record(&shared, created_at, input.now)
        })
        .collect();
    // Desired outputs come sorted: usually nothing to do.
    crate::catalog::sort_by_path(&mut upserts);
    Plan {
        action,
        writes: Arc::clone(input.desired),
        clear_first,
        deletes: delete_after.clone(),
        update: Some(CatalogUpdate {
            keep_existing: base.is_some(),
            upserts,
            removes: delete_after.clone(),
            now: input.now,
        }),
        delete_after,
        unmanaged: Vec::new(),
        error: None,
    }
}

/// Files (anything but folders) in the full listing that no planned output
/// replaces: what a clearing plan leaves gone.
fn unplanned_files(input: &PlanInput<'_>) -> Vec<String> {
    let planned: BTreeSet<&str> = input.desired.iter().map(|d| d.path.as_str()).collect();
    input
        .listing
        .all
        .iter()
        .filter(|(p, e)| *e != Entry::Dir && !planned.contains(p.as_str()))
        .map(|(p, _)| p.clone())
        .collect()
}

fn force_plan(input: &PlanInput<'_>) -> Plan {
    let mut plan = write_plan(
        input,
        Action::ForceReplace,
        None,
        input.listing.top_level.clone(),
        Vec::new(),
    );
    plan.deletes = unplanned_files(input);
    plan
}

/// Legacy state (schema 1–3): its records are not trusted; the new catalog
/// holds only the planned outputs.
fn legacy_plan(input: &PlanInput<'_>, force_hint: &str) -> Plan {
    match input.workflow {
        Workflow::Additive => {
            let mut unmanaged = Vec::new();
            for d in input.desired.iter() {
                let blocked_at = d
                    .path
                    .ancestors()
                    .find(|a| !matches!(input.listing.entry(a), Entry::Missing | Entry::Dir));
                if let Some(a) = blocked_at {
                    unmanaged.push(a.to_owned());
                } else if !matches!(
                    input.listing.entry(d.path.as_str()),
                    Entry::Missing | Entry::File { .. }
                ) {
                    unmanaged.push(d.path.as_str().to_owned());
                }
            }
            if !unmanaged.is_empty() {
                return unmanaged_refusal(unmanaged, force_hint);
            }
            write_plan(input, Action::UpsertAdditive, None, Vec::new(), Vec::new())
        }
        Workflow::Replacement => {
            // Entries in the way of a planned path go first; every other
            // unplanned file goes after the writes.
            let planned = probe_paths(input.desired);
            let desired_files: BTreeSet<&str> =
                input.desired.iter().map(|d| d.path.as_str()).collect();
            let mut clear_first = Vec::new();
            let mut delete_after = Vec::new();
            for (path, entry) in &input.listing.all {
                let is_folder_needed =
                    planned.contains(path) && !desired_files.contains(path.as_str());
                let blocks = match entry {
                    Entry::Dir => desired_files.contains(path.as_str()),
                    _ => is_folder_needed,
                };
                let inside_cleared = clear_first.iter().any(|c: &String| {
                    path.starts_with(c.as_str()) && path[c.len()..].starts_with('/')
                });
                if inside_cleared {
                    continue;
                }
                if blocks {
                    clear_first.push(path.clone());
                } else if *entry != Entry::Dir && !desired_files.contains(path.as_str()) {
                    delete_after.push(path.clone());
                } else if *entry == Entry::Dir
                    && !planned.contains(path)
                    && !input.listing.all.iter().any(|(p, _)| {
                        p.starts_with(path.as_str()) && p[path.len()..].starts_with('/')
                    })
                {
                    // An empty folder is content too.
                    delete_after.push(path.clone());
                }
            }
            let mut plan = write_plan(
                input,
                Action::ReplaceCatalog,
                None,
                clear_first,
                delete_after,
            );
            plan.deletes = unplanned_files(input);
            plan
        }
    }
}

fn unmanaged_refusal(mut unmanaged: Vec<String>, force_hint: &str) -> Plan {
    unmanaged.sort();
    unmanaged.dedup();
    let error = format!(
        "{} exists in the root but is not recorded in {STATE_FILE}; distributor never overwrites files it does not own. Move it away, or {force_hint}",
        unmanaged.join(", ")
    );
    Plan::refused(Action::FailUnmanaged, unmanaged, error)
}

fn catalog_plan(input: &PlanInput<'_>, catalog: &Catalog, force_hint: &str) -> Plan {
    let mut conflicts = Vec::new();
    let mut unmanaged = Vec::new();
    for d in input.desired.iter() {
        let path = d.path.as_str();
        for a in d.path.ancestors() {
            if let Some(r) = catalog.get(a) {
                conflicts.push(format!(
                    "planned output {path} needs {a} to be a folder, but {a} is a managed output of {}/{}",
                    r.pipeline_id, r.destination_id
                ));
            } else if !matches!(input.listing.entry(a), Entry::Missing | Entry::Dir) {
                unmanaged.push(a.to_owned());
            }
        }
        let below = format!("{path}/");
        if let Some(r) = catalog.outputs.get(catalog.first_index_from(&below))
            && r.path.as_str().starts_with(&below)
        {
            conflicts.push(format!(
                "planned output {path} would be a file, but the managed output {} of {}/{} lies below it",
                r.path, r.pipeline_id, r.destination_id
            ));
        }
        match input.listing.entry(path) {
            Entry::Missing => {}
            Entry::Dir => unmanaged.push(path.to_owned()),
            Entry::File { .. } | Entry::Symlink | Entry::Other => {
                if catalog.get(path).is_none() {
                    unmanaged.push(path.to_owned());
                }
            }
        }
    }
    if !conflicts.is_empty() {
        return Plan::refused(
            Action::FailConflict,
            Vec::new(),
            format!(
                "{}; change the bundle or the prefix, or {force_hint}",
                conflicts.join("; ")
            ),
        );
    }
    if !unmanaged.is_empty() {
        return unmanaged_refusal(unmanaged, force_hint);
    }

    let planned: BTreeSet<&str> = input.desired.iter().map(|d| d.path.as_str()).collect();
    let mut delete_after: Vec<String> = match input.workflow {
        Workflow::Additive => Vec::new(),
        Workflow::Replacement => catalog
            .outputs
            .iter()
            .filter(|r| {
                r.owned_by(input.pipeline_id, input.destination_id)
                    && !planned.contains(r.path.as_str())
                    && input
                        .delete_within
                        .is_none_or(|scopes| scopes.iter().any(|s| s.contains(r.path.as_str())))
            })
            .map(|r| r.path.as_str().to_owned())
            .collect(),
    };
    delete_after.extend(stale_siblings(input.desired, catalog, &planned));
    delete_after.sort();
    delete_after.dedup();
    let all_same = input.desired.iter().all(|d| {
        catalog
            .get(d.path.as_str())
            .is_some_and(|r| d.matches(r, input))
            && input.listing.entry(d.path.as_str()) == Entry::File { size: d.size }
            && !input.rewrite.contains(d.path.as_str())
    });
    if all_same && delete_after.is_empty() {
        return Plan {
            action: Action::SkipSame,
            writes: Arc::default(),
            clear_first: Vec::new(),
            delete_after: Vec::new(),
            deletes: Vec::new(),
            unmanaged: Vec::new(),
            error: None,
            update: None,
        };
    }
    let action = match input.workflow {
        Workflow::Additive => Action::UpsertAdditive,
        Workflow::Replacement => Action::ReplaceCatalog,
    };
    write_plan(input, action, Some(catalog), Vec::new(), delete_after)
}

/// The paths where a precompressed sibling of `path` may be recorded
/// (docs/contract.md §21.4), each with the transform its record names.
fn sibling_paths(path: &RelPath) -> impl Iterator<Item = (String, &'static str)> + '_ {
    [Encoding::Gzip, Encoding::Brotli]
        .into_iter()
        .map(move |e| (format!("{path}{}", e.suffix()), e.transform()))
}

/// The recorded siblings of the planned outputs that the plan does not
/// write again, whoever owns them: a sibling goes with its original, so a
/// planned output that no longer gets one (too small now, or `precompress`
/// turned off) takes its old one away rather than leave a web server
/// serving stale bytes for it. A file of that name the catalog records as
/// a copy or a page is no sibling and stays.
fn stale_siblings<'c>(
    desired: &'c [Desired],
    catalog: &'c Catalog,
    planned: &'c BTreeSet<&str>,
) -> impl Iterator<Item = String> + 'c {
    desired.iter().flat_map(move |d| {
        sibling_paths(&d.path).filter_map(move |(path, transform)| {
            let recorded = catalog.get(&path)?;
            (recorded.transform == Some(transform) && !planned.contains(path.as_str()))
                .then_some(path)
        })
    })
}

/// The records that planning `desired` can consult, taken from `records` (a
/// catalog with a batch's pending changes): the record at each planned path
/// and at each folder above it, the first record below each planned path,
/// the records where its precompressed siblings would be, and for a
/// replacement every record of the destination. Planning against
/// this small catalog decides exactly what planning against all of
/// `records` would, without a pass over every record per bundle.
pub fn catalog_view(
    records: &Overlay,
    desired: &[Desired],
    workflow: Workflow,
    pipeline_id: &str,
    destination_id: &str,
) -> Catalog {
    let mut picked: BTreeMap<&str, &OutputRecord> = BTreeMap::new();
    for d in desired {
        let below = format!("{}/", d.path);
        let at_or_above = d.path.ancestors().chain([d.path.as_str()]);
        for r in at_or_above
            .filter_map(|a| records.get(a))
            .chain(records.first_from(&below))
            .chain(sibling_paths(&d.path).filter_map(|(p, _)| records.get(&p)))
        {
            picked.insert(r.path.as_str(), r);
        }
    }
    if workflow == Workflow::Replacement {
        for r in records.iter() {
            if r.owned_by(pipeline_id, destination_id) {
                picked.insert(r.path.as_str(), r);
            }
        }
    }
    let base = records.base();
    Catalog {
        distributor_version: base.distributor_version.clone(),
        created_at: base.created_at,
        updated_at: base.updated_at,
        outputs: picked.into_values().cloned().collect(),
    }
}

/// Percent-encodes one path segment: every byte but `A-Z a-z 0-9 - . _ ~`,
/// uppercase hex (docs/contract.md §11.15).
pub fn encode_segment(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `base_url` (ending in `/`) followed by the encoded output path.
pub fn output_url(base_url: &str, path: &RelPath) -> String {
    let mut url = base_url.to_owned();
    if !url.ends_with('/') {
        url.push('/');
    }
    let encoded: Vec<String> = path.segments().map(encode_segment).collect();
    url.push_str(&encoded.join("/"));
    url
}

/// The records that `plan` would overwrite or delete although their source
/// was created after `source`: publishing it would roll those outputs back
/// (docs/contract.md §17.5, §18.7). A skip writes nothing, so a bundle
/// dropped again unchanged rolls nothing back.
pub fn rolled_back<'c>(
    plan: &Plan,
    catalog: &'c Catalog,
    source: &SourceIdentity,
) -> Vec<&'c OutputRecord> {
    let written = plan.writes.iter().map(|d| d.path.as_str());
    written
        .chain(plan.deletes.iter().map(String::as_str))
        .filter_map(|path| catalog.get(path))
        .filter(|record| record.source.created > source.created)
        .collect()
}

/// Checks that planned paths are unique and that none is a folder of
/// another; returns the first offending pair as an operator message.
pub fn check_unique(desired: &[Desired]) -> Result<(), String> {
    let mut sorted: Vec<&Desired> = desired.iter().collect();
    sorted.sort_by(|a, b| a.path.as_str().cmp(b.path.as_str()));
    for pair in sorted.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if a.path == b.path {
            return Err(format!(
                "two outputs would be written to {} (from {} and {}); rename one of the files in the bundle",
                a.path, a.bundle_path, b.bundle_path
            ));
        }
    }
    let files: BTreeSet<&str> = desired.iter().map(|d| d.path.as_str()).collect();
    for d in desired {
        if let Some(a) = d.path.ancestors().find(|a| files.contains(a)) {
            return Err(format!(
                "output {} would need {a} to be a folder, but {a} is also an output; rename one of the files in the bundle",
                d.path
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{MARKDOWN_TO_HTML, parse_time};

    const P: &str = "reports";
    const D: &str = "site";

    fn t(text: &str) -> OffsetDateTime {
        parse_time(text).unwrap()
    }

    fn now() -> OffsetDateTime {
        t("2026-07-01T00:00:00Z")
    }

    fn hex(c: char) -> String {
        format!("sha256:{}", c.to_string().repeat(64))
    }

    fn source(id: &str) -> SourceIdentity {
        SourceIdentity {
            id: id.to_owned(),
            digest: hex('d'),
            created: t("2026-06-04T11:55:00Z"),
        }
    }

    fn want(path: &str, sha: char, size: u64) -> Desired {
        let p = RelPath::parse(path).unwrap();
        Desired {
            path: p.clone(),
            kind: OutputKind::Source,
            bundle_path: p,
            transform: None,
            url: None,
            sha256: crate::catalog::Sha256::parse(&hex(sha)).unwrap(),
            size,
        }
    }

    fn rec(
        path: &str,
        owner: (&str, &str),
        src: &SourceIdentity,
        sha: char,
        size: u64,
    ) -> OutputRecord {
        OutputRecord {
            path: RelPath::parse(path).unwrap(),
            pipeline_id: owner.0.into(),
            destination_id: owner.1.into(),
            source: Arc::new(src.clone()),
            kind: OutputKind::Source,
            source_path: None,
            transform: None,
            url: None,
            sha256: crate::catalog::Sha256::parse(&hex(sha)).unwrap(),
            size,
            created_at: t("2026-01-01T00:00:00Z"),
            updated_at: t("2026-02-01T00:00:00Z"),
        }
    }

    /// The catalog a state holds, as the publisher hands it to an update.
    fn current(state: &State) -> Option<Catalog> {
        match state {
            State::Catalog(c) => Some(c.clone()),
            _ => None,
        }
    }

    fn catalog(records: Vec<OutputRecord>) -> State {
        let mut c = Catalog::new(t("2026-01-01T00:00:00Z"));
        c.outputs = records;
        c.sort();
        State::Catalog(c)
    }

    /// Moving an update into the catalog gives the catalog that applying
    /// it to a copy gives, and hands back exactly the current records at
    /// the planned paths.
    #[test]
    fn an_update_moved_into_the_catalog_equals_one_applied_to_a_copy() {
        let src = source("s1");
        let old: Vec<OutputRecord> = ["a", "b/x", "b/y", "c", "d"]
            .iter()
            .map(|p| rec(p, (P, D), &src, 'a', 1))
            .collect();
        let State::Catalog(mut base) = catalog(old) else {
            unreachable!()
        };
        base.distributor_version = Some("0.0.1".to_owned());
        type Paths = &'static [&'static str];
        // (keep_existing, upserts, removes, replaced)
        let cases: [(bool, Paths, Paths, Paths); 6] = [
            (true, &[], &[], &[]),
            (true, &["0", "b/x", "e"], &["d", "a"], &["b/x"]),
            (
                true,
                &["a", "b/x", "b/y", "c", "d"],
                &[],
                &["a", "b/x", "b/y", "c", "d"],
            ),
            (true, &["z"], &["a", "b/x", "b/y", "c", "d"], &[]),
            (false, &["b/y", "f"], &[], &["b/y"]),
            (false, &[], &[], &[]),
        ];
        for (keep_existing, upserts, removes, want) in cases {
            let update = CatalogUpdate {
                keep_existing,
                upserts: upserts
                    .iter()
                    .map(|p| rec(p, (P, D), &src, 'b', 2))
                    .collect(),
                removes: removes.iter().map(|p| p.to_string()).collect(),
                now: now(),
            };
            let applied = update.apply(Some(base.clone()));
            if keep_existing {
                // Both ways of merging give the same records and hand
                // back the same ones, whatever the size of the change.
                let records = update.upserts.clone();
                let small = merge_small(base.outputs.clone(), records.clone(), &update.removes);
                let large = merge_large(base.outputs.clone(), records, &update.removes, true);
                assert_eq!(small, large, "{upserts:?} {removes:?}");
            }
            let (moved, replaced) = update.into_catalog(Some(base.clone()));
            assert_eq!(moved, applied, "{upserts:?} {removes:?}");
            let got: Vec<&str> = replaced.iter().map(|r| r.path.as_str()).collect();
            assert_eq!(got, want, "{upserts:?} {removes:?}");
            assert!(replaced.iter().all(|r| r.size == 1), "the current records");
        }
        let fresh = CatalogUpdate {
            keep_existing: false,
            upserts: vec![rec("a", (P, D), &src, 'b', 2)],
            removes: Vec::new(),
            now: now(),
        };
        let applied = fresh.apply(None);
        assert_eq!(fresh.into_catalog(None), (applied, Vec::new()));
    }

    /// A root holding these entries (folders above them added).
    fn storage(entries: &[(&str, Entry)]) -> Listing {
        let mut all: BTreeMap<String, Entry> = BTreeMap::new();
        for (path, entry) in entries {
            let p = RelPath::parse(path).unwrap();
            for a in p.ancestors() {
                all.insert(a.to_owned(), Entry::Dir);
            }
            all.insert(path.to_string(), *entry);
        }
        Listing {
            root_exists: true,
            top_level: all.keys().filter(|p| !p.contains('/')).cloned().collect(),
            entries: all.clone(),
            all: all.into_iter().collect(),
        }
    }

    fn file(size: u64) -> Entry {
        Entry::File { size }
    }

    #[derive(Clone)]
    struct Case {
        name: &'static str,
        workflow: Workflow,
        force: bool,
        state: State,
        listing: Listing,
        desired: Vec<Desired>,
        action: Action,
        writes: &'static [&'static str],
        deletes: &'static [&'static str],
        unmanaged: &'static [&'static str],
        /// Paths the new catalog records (None: no catalog written).
        recorded: Option<&'static [&'static str]>,
    }

    fn run(case: &Case) -> Plan {
        let src = source("bundle-2");
        let input = PlanInput {
            pipeline_id: P,
            destination_id: D,
            workflow: case.workflow,
            force: case.force,
            source: &src,
            desired: &case.desired.clone().into(),
            state: &case.state,
            listing: &case.listing,
            rewrite: &BTreeSet::new(),
            now: now(),
            delete_within: None,
            replay: None,
        };
        plan(&input)
    }

    /// An output the backend must write again (an object stored with
    /// other response headers, docs/object-storage.md, "Serving the
    /// bucket") is no skip_same:
    /// it is written, with the same record.
    #[test]
    fn an_output_to_write_again_is_no_skip_same() {
        let src = source("bundle-2");
        let state = catalog(vec![
            rec("r.html", (P, D), &src, 'a', 3),
            rec("s.html", (P, D), &src, 'b', 3),
        ]);
        let listing = storage(&[("r.html", file(3)), ("s.html", file(3))]);
        let desired: Arc<[Desired]> = vec![want("r.html", 'a', 3), want("s.html", 'b', 3)].into();
        let plan_with = |rewrite: &[&str]| {
            plan(&PlanInput {
                pipeline_id: P,
                destination_id: D,
                workflow: Workflow::Additive,
                force: false,
                source: &src,
                desired: &desired,
                state: &state,
                listing: &listing,
                rewrite: &rewrite.iter().map(|p| (*p).to_owned()).collect(),
                now: now(),
                delete_within: None,
                replay: None,
            })
        };
        assert_eq!(plan_with(&[]).action, Action::SkipSame);
        let again = plan_with(&["r.html"]);
        assert_eq!(again.action, Action::UpsertAdditive);
        let writes: Vec<&str> = again.writes.iter().map(|d| d.path.as_str()).collect();
        assert_eq!(
            writes,
            ["r.html", "s.html"],
            "the backend keeps what it holds"
        );
        let c = again.update.unwrap().apply(current(&state));
        assert_eq!(
            (c.outputs
                .iter()
                .map(|r| (r.path.as_str(), r.sha256.to_string())))
            .collect::<Vec<_>>(),
            [("r.html", hex('a')), ("s.html", hex('b'))]
        );
    }

    /// Outputs planned into a root without a usable catalog.
    fn cases_without_a_catalog() -> Vec<Case> {
        use Workflow::{Additive, Replacement};
        vec![
            Case {
                name: "publish_new into a missing root",
                workflow: Additive,
                force: false,
                state: State::Absent,
                listing: Listing::default(),
                desired: vec![want("a/r.html", 'a', 3)],
                action: Action::PublishNew,
                writes: &["a/r.html"],
                deletes: &[],
                unmanaged: &[],
                recorded: Some(&["a/r.html"]),
            },
            Case {
                name: "publish_new into an empty root",
                workflow: Replacement,
                force: false,
                state: State::Absent,
                listing: storage(&[]),
                desired: vec![want("r.html", 'a', 3)],
                action: Action::PublishNew,
                writes: &["r.html"],
                deletes: &[],
                unmanaged: &[],
                recorded: Some(&["r.html"]),
            },
            Case {
                name: "no state but content is unmanaged",
                workflow: Additive,
                force: false,
                state: State::Absent,
                listing: storage(&[("index.html", file(1)), ("img/x.png", file(1))]),
                desired: vec![want("r.html", 'a', 3)],
                action: Action::FailUnmanaged,
                writes: &[],
                deletes: &[],
                unmanaged: &["img", "index.html"],
                recorded: None,
            },
            Case {
                name: "an empty folder counts as content",
                workflow: Additive,
                force: false,
                state: State::Absent,
                listing: storage(&[("empty", Entry::Dir)]),
                desired: vec![want("r.html", 'a', 3)],
                action: Action::FailUnmanaged,
                writes: &[],
                deletes: &[],
                unmanaged: &["empty"],
                recorded: None,
            },
            Case {
                name: "invalid state is a conflict even in an otherwise empty root",
                workflow: Additive,
                force: false,
                state: State::Invalid {
                    reason: "not JSON".into(),
                },
                listing: storage(&[]),
                desired: vec![want("r.html", 'a', 3)],
                action: Action::FailConflict,
                writes: &[],
                deletes: &[],
                unmanaged: &[],
                recorded: None,
            },
            Case {
                name: "future state is a conflict",
                workflow: Replacement,
                force: false,
                state: State::Future { schema_version: 5 },
                listing: storage(&[]),
                desired: vec![want("r.html", 'a', 3)],
                action: Action::FailConflict,
                writes: &[],
                deletes: &[],
                unmanaged: &[],
                recorded: None,
            },
        ]
    }

    /// Outputs planned over a catalog: additive, replacement, skip_same.
    fn cases_over_a_catalog() -> Vec<Case> {
        use Workflow::{Additive, Replacement};
        let old = source("bundle-1");
        let new = source("bundle-2");
        let same_instant = SourceIdentity {
            created: t("2026-06-04T13:55:00+02:00"),
            ..new.clone()
        };
        vec![
            Case {
                name: "additive keeps every other record",
                workflow: Additive,
                force: false,
                state: catalog(vec![
                    rec("mine-old.html", (P, D), &old, 'b', 1),
                    rec("theirs.html", ("other", "x"), &old, 'c', 1),
                ]),
                listing: storage(&[("mine-old.html", file(1)), ("theirs.html", file(1))]),
                desired: vec![want("r.html", 'a', 3)],
                action: Action::UpsertAdditive,
                writes: &["r.html"],
                deletes: &[],
                unmanaged: &[],
                recorded: Some(&["mine-old.html", "r.html", "theirs.html"]),
            },
            Case {
                name: "replacement deletes only the same owner's omitted outputs",
                workflow: Replacement,
                force: false,
                state: catalog(vec![
                    rec("mine-old.html", (P, D), &old, 'b', 1),
                    rec("other-dest.html", (P, "archive"), &old, 'c', 1),
                    rec("theirs.html", ("other", D), &old, 'c', 1),
                ]),
                listing: storage(&[
                    ("mine-old.html", file(1)),
                    ("other-dest.html", file(1)),
                    ("theirs.html", file(1)),
                ]),
                desired: vec![want("r.html", 'a', 3)],
                action: Action::ReplaceCatalog,
                writes: &["r.html"],
                deletes: &["mine-old.html"],
                unmanaged: &[],
                recorded: Some(&["other-dest.html", "r.html", "theirs.html"]),
            },
            Case {
                name: "skip_same when every output is recorded and present",
                workflow: Replacement,
                force: false,
                state: catalog(vec![
                    rec("r.html", (P, D), &same_instant, 'a', 3),
                    rec("theirs.html", ("other", D), &old, 'c', 1),
                ]),
                listing: storage(&[("r.html", file(3))]),
                desired: vec![want("r.html", 'a', 3)],
                action: Action::SkipSame,
                writes: &[],
                deletes: &[],
                unmanaged: &[],
                recorded: None,
            },
            Case {
                name: "not skip_same when the file on disk has another size",
                workflow: Additive,
                force: false,
                state: catalog(vec![rec("r.html", (P, D), &new, 'a', 3)]),
                listing: storage(&[("r.html", file(4))]),
                desired: vec![want("r.html", 'a', 3)],
                action: Action::UpsertAdditive,
                writes: &["r.html"],
                deletes: &[],
                unmanaged: &[],
                recorded: Some(&["r.html"]),
            },
            Case {
                name: "not skip_same when the file is gone",
                workflow: Additive,
                force: false,
                state: catalog(vec![rec("r.html", (P, D), &new, 'a', 3)]),
                listing: storage(&[]),
                desired: vec![want("r.html", 'a', 3)],
                action: Action::UpsertAdditive,
                writes: &["r.html"],
                deletes: &[],
                unmanaged: &[],
                recorded: Some(&["r.html"]),
            },
            Case {
                name: "not skip_same when replacement would remove something",
                workflow: Replacement,
                force: false,
                state: catalog(vec![
                    rec("extra.html", (P, D), &new, 'b', 1),
                    rec("r.html", (P, D), &new, 'a', 3),
                ]),
                listing: storage(&[("extra.html", file(1)), ("r.html", file(3))]),
                desired: vec![want("r.html", 'a', 3)],
                action: Action::ReplaceCatalog,
                writes: &["r.html"],
                deletes: &["extra.html"],
                unmanaged: &[],
                recorded: Some(&["r.html"]),
            },
            Case {
                name: "not skip_same when the source differs",
                workflow: Additive,
                force: false,
                state: catalog(vec![rec("r.html", (P, D), &old, 'a', 3)]),
                listing: storage(&[("r.html", file(3))]),
                desired: vec![want("r.html", 'a', 3)],
                action: Action::UpsertAdditive,
                writes: &["r.html"],
                deletes: &[],
                unmanaged: &[],
                recorded: Some(&["r.html"]),
            },
        ]
    }

    /// What storage holds at or above a planned path.
    fn cases_of_storage() -> Vec<Case> {
        use Workflow::{Additive, Replacement};
        let old = source("bundle-1");
        vec![
            Case {
                name: "an unrecorded file at a planned path is unmanaged",
                workflow: Additive,
                force: false,
                state: catalog(vec![]),
                listing: storage(&[("r.html", file(3))]),
                desired: vec![want("r.html", 'a', 3)],
                action: Action::FailUnmanaged,
                writes: &[],
                deletes: &[],
                unmanaged: &["r.html"],
                recorded: None,
            },
            Case {
                name: "an unrecorded file where a folder must go is unmanaged",
                workflow: Replacement,
                force: false,
                state: catalog(vec![]),
                listing: storage(&[("a", file(3))]),
                desired: vec![want("a/r.html", 'a', 3)],
                action: Action::FailUnmanaged,
                writes: &[],
                deletes: &[],
                unmanaged: &["a"],
                recorded: None,
            },
            Case {
                name: "a symlink where a folder must go is unmanaged",
                workflow: Additive,
                force: false,
                state: catalog(vec![]),
                listing: storage(&[("a", Entry::Symlink)]),
                desired: vec![want("a/r.html", 'a', 3)],
                action: Action::FailUnmanaged,
                writes: &[],
                deletes: &[],
                unmanaged: &["a"],
                recorded: None,
            },
            Case {
                name: "a folder at a planned path is unmanaged",
                workflow: Additive,
                force: false,
                state: catalog(vec![]),
                listing: storage(&[("r.html/x", file(1))]),
                desired: vec![want("r.html", 'a', 3)],
                action: Action::FailUnmanaged,
                writes: &[],
                deletes: &[],
                unmanaged: &["r.html"],
                recorded: None,
            },
            Case {
                name: "a managed file where a folder must go is a conflict",
                workflow: Replacement,
                force: false,
                state: catalog(vec![rec("a", (P, D), &old, 'b', 1)]),
                listing: storage(&[("a", file(1))]),
                desired: vec![want("a/r.html", 'a', 3)],
                action: Action::FailConflict,
                writes: &[],
                deletes: &[],
                unmanaged: &[],
                recorded: None,
            },
            Case {
                name: "a managed file below a planned file is a conflict",
                workflow: Additive,
                force: false,
                state: catalog(vec![rec("a/b", ("other", "x"), &old, 'b', 1)]),
                listing: storage(&[]),
                desired: vec![want("a", 'a', 3)],
                action: Action::FailConflict,
                writes: &[],
                deletes: &[],
                unmanaged: &[],
                recorded: None,
            },
            Case {
                name: "a recorded path now holding a symlink is overwritten",
                workflow: Additive,
                force: false,
                state: catalog(vec![rec("r.html", ("other", "x"), &old, 'b', 1)]),
                listing: storage(&[("r.html", Entry::Symlink)]),
                desired: vec![want("r.html", 'a', 3)],
                action: Action::UpsertAdditive,
                writes: &["r.html"],
                deletes: &[],
                unmanaged: &[],
                recorded: Some(&["r.html"]),
            },
        ]
    }

    /// `--force`, and legacy state.
    fn cases_forced_or_legacy() -> Vec<Case> {
        use Workflow::{Additive, Replacement};
        vec![
            Case {
                name: "force replaces invalid state and unmanaged content",
                workflow: Additive,
                force: true,
                state: State::Invalid { reason: "x".into() },
                listing: storage(&[("junk/a.txt", file(1)), ("r.html", file(1))]),
                desired: vec![want("r.html", 'a', 3)],
                action: Action::ForceReplace,
                writes: &["r.html"],
                deletes: &["junk/a.txt"],
                unmanaged: &[],
                recorded: Some(&["r.html"]),
            },
            Case {
                name: "legacy additive overwrites planned files and records only them",
                workflow: Additive,
                force: false,
                state: State::Legacy { schema_version: 1 },
                listing: storage(&[("r.html", file(9)), ("old.html", file(1))]),
                desired: vec![want("r.html", 'a', 3)],
                action: Action::UpsertAdditive,
                writes: &["r.html"],
                deletes: &[],
                unmanaged: &[],
                recorded: Some(&["r.html"]),
            },
            Case {
                name: "legacy additive refuses a folder at a planned path",
                workflow: Additive,
                force: false,
                state: State::Legacy { schema_version: 2 },
                listing: storage(&[("r.html/x", file(9))]),
                desired: vec![want("r.html", 'a', 3)],
                action: Action::FailUnmanaged,
                writes: &[],
                deletes: &[],
                unmanaged: &["r.html"],
                recorded: None,
            },
            Case {
                name: "legacy replacement clears the root",
                workflow: Replacement,
                force: false,
                state: State::Legacy { schema_version: 3 },
                listing: storage(&[("r.html", file(9)), ("old/x.html", file(1)), ("a", file(1))]),
                desired: vec![want("a/r.html", 'a', 3), want("r.html", 'a', 3)],
                action: Action::ReplaceCatalog,
                writes: &["a/r.html", "r.html"],
                deletes: &["a", "old/x.html"],
                unmanaged: &[],
                recorded: Some(&["a/r.html", "r.html"]),
            },
        ]
    }

    /// Plans `case` and checks the plan, the catalog it leaves, and that
    /// planning over a batch's catalog view or without the top level
    /// changes nothing.
    fn check(case: &Case) {
        let plan = run(case);
        let name = case.name;
        assert_eq!(plan.action, case.action, "{name}: {:?}", plan.error);
        let writes: Vec<&str> = plan.writes.iter().map(|d| d.path.as_str()).collect();
        assert_eq!(writes, case.writes, "{name}: writes");
        assert_eq!(plan.deletes, case.deletes, "{name}: deletes");
        assert_eq!(plan.unmanaged, case.unmanaged, "{name}: unmanaged");
        assert_eq!(
            plan.error.is_some(),
            case.action.is_refusal(),
            "{name}: error"
        );
        let after = plan.update.as_ref().map(|u| u.apply(current(&case.state)));
        let recorded: Option<Vec<&str>> = after
            .as_ref()
            .map(|c| c.outputs.iter().map(|r| r.path.as_str()).collect());
        assert_eq!(recorded.as_deref(), case.recorded, "{name}: catalog");
        // A batch plans over the records the plan can consult.
        if let (State::Catalog(c), false) = (&case.state, case.force) {
            let records = Overlay::new(c.clone());
            let view = catalog_view(&records, &case.desired, case.workflow, P, D);
            let viewed = run(&Case {
                state: State::Catalog(view),
                ..case.clone()
            });
            assert_eq!(viewed, plan, "{name}: plan over the catalog view");
        }
        // The publisher lists the top level only when planning needs it.
        if !needs_top_level(&case.state, case.force) {
            let mut listing = case.listing.clone();
            listing.top_level.clear();
            let without = run(&Case {
                listing,
                ..case.clone()
            });
            assert_eq!(without, plan, "{name}: plan depends on the top level");
        }
    }

    #[test]
    fn action_table() {
        let cases = [
            cases_without_a_catalog(),
            cases_over_a_catalog(),
            cases_of_storage(),
            cases_forced_or_legacy(),
            cases_of_siblings(),
        ];
        for case in cases.iter().flatten() {
            check(case);
        }
    }

    /// A precompressed sibling's record (docs/contract.md §21.4).
    fn sibling_rec(path: &str, owner: (&str, &str), src: &SourceIdentity) -> OutputRecord {
        let transform = if path.ends_with(".gz") {
            crate::catalog::GZIP
        } else {
            crate::catalog::BROTLI
        };
        OutputRecord {
            kind: OutputKind::Generated,
            source_path: Some(RelPath::parse("a.css").unwrap()),
            transform: Some(transform),
            ..rec(path, owner, src, 'e', 5)
        }
    }

    /// A planned sibling of `a.css`.
    fn want_sibling(path: &str) -> Desired {
        let mut d = want(path, 'e', 5);
        d.kind = OutputKind::Generated;
        d.bundle_path = RelPath::parse("a.css").unwrap();
        d.transform = Some(if path.ends_with(".gz") {
            crate::catalog::GZIP
        } else {
            crate::catalog::BROTLI
        });
        d
    }

    /// Siblings go with their original: a planned output takes its
    /// recorded siblings away unless it gets them again, whoever owns
    /// them, in either workflow; a same-named file that is no sibling
    /// stays.
    fn cases_of_siblings() -> Vec<Case> {
        use Workflow::{Additive, Replacement};
        let old = source("bundle-1");
        let new = source("bundle-2");
        let both = || {
            vec![
                rec("a.css", (P, D), &old, 'a', 3),
                sibling_rec("a.css.br", (P, D), &old),
                sibling_rec("a.css.gz", (P, D), &old),
            ]
        };
        let on_disk = || {
            storage(&[
                ("a.css", file(3)),
                ("a.css.br", file(5)),
                ("a.css.gz", file(5)),
            ])
        };
        vec![
            Case {
                name: "additive: an original written again with its siblings",
                workflow: Additive,
                force: false,
                state: catalog(both()),
                listing: on_disk(),
                desired: vec![
                    want("a.css", 'b', 3),
                    want_sibling("a.css.br"),
                    want_sibling("a.css.gz"),
                ],
                action: Action::UpsertAdditive,
                writes: &["a.css", "a.css.br", "a.css.gz"],
                deletes: &[],
                unmanaged: &[],
                recorded: Some(&["a.css", "a.css.br", "a.css.gz"]),
            },
            Case {
                name: "additive: an original without siblings now takes them away",
                workflow: Additive,
                force: false,
                state: catalog(both()),
                listing: on_disk(),
                desired: vec![want("a.css", 'b', 3)],
                action: Action::UpsertAdditive,
                writes: &["a.css"],
                deletes: &["a.css.br", "a.css.gz"],
                unmanaged: &[],
                recorded: Some(&["a.css"]),
            },
            Case {
                name: "additive: the same original with one sibling fewer",
                workflow: Additive,
                force: false,
                state: catalog(both()),
                listing: on_disk(),
                desired: vec![want("a.css", 'a', 3), want_sibling("a.css.gz")],
                action: Action::UpsertAdditive,
                writes: &["a.css", "a.css.gz"],
                deletes: &["a.css.br"],
                unmanaged: &[],
                recorded: Some(&["a.css", "a.css.gz"]),
            },
            Case {
                name: "additive: another owner's siblings go with the original taken over",
                workflow: Additive,
                force: false,
                state: catalog(vec![
                    rec("a.css", ("other", "x"), &old, 'a', 3),
                    sibling_rec("a.css.gz", ("other", "x"), &old),
                ]),
                listing: storage(&[("a.css", file(3)), ("a.css.gz", file(5))]),
                desired: vec![want("a.css", 'b', 3)],
                action: Action::UpsertAdditive,
                writes: &["a.css"],
                deletes: &["a.css.gz"],
                unmanaged: &[],
                recorded: Some(&["a.css"]),
            },
            Case {
                name: "additive: a copied file named like a sibling is no sibling",
                workflow: Additive,
                force: false,
                state: catalog(vec![
                    rec("a.css", (P, D), &old, 'a', 3),
                    rec("a.css.gz", (P, D), &old, 'c', 5),
                ]),
                listing: storage(&[("a.css", file(3)), ("a.css.gz", file(5))]),
                desired: vec![want("a.css", 'b', 3)],
                action: Action::UpsertAdditive,
                writes: &["a.css"],
                deletes: &[],
                unmanaged: &[],
                recorded: Some(&["a.css", "a.css.gz"]),
            },
            Case {
                name: "additive: siblings of an output not planned stay",
                workflow: Additive,
                force: false,
                state: catalog(both()),
                listing: on_disk(),
                desired: vec![want("b.css", 'b', 3)],
                action: Action::UpsertAdditive,
                writes: &["b.css"],
                deletes: &[],
                unmanaged: &[],
                recorded: Some(&["a.css", "a.css.br", "a.css.gz", "b.css"]),
            },
            Case {
                name: "additive: recorded and on disk as planned is skip_same",
                workflow: Additive,
                force: false,
                state: catalog(vec![
                    rec("a.css", (P, D), &new, 'a', 3),
                    sibling_rec("a.css.gz", (P, D), &new),
                ]),
                listing: storage(&[("a.css", file(3)), ("a.css.gz", file(5))]),
                desired: vec![want("a.css", 'a', 3), want_sibling("a.css.gz")],
                action: Action::SkipSame,
                writes: &[],
                deletes: &[],
                unmanaged: &[],
                recorded: None,
            },
            Case {
                name: "additive: an unchanged original whose sibling is gone now is no skip",
                workflow: Additive,
                force: false,
                state: catalog(vec![
                    rec("a.css", (P, D), &new, 'a', 3),
                    sibling_rec("a.css.gz", (P, D), &new),
                ]),
                listing: storage(&[("a.css", file(3)), ("a.css.gz", file(5))]),
                desired: vec![want("a.css", 'a', 3)],
                action: Action::UpsertAdditive,
                writes: &["a.css"],
                deletes: &["a.css.gz"],
                unmanaged: &[],
                recorded: Some(&["a.css"]),
            },
            Case {
                name: "replacement: siblings go when their original goes",
                workflow: Replacement,
                force: false,
                state: catalog(both()),
                listing: on_disk(),
                desired: vec![want("b.css", 'b', 3)],
                action: Action::ReplaceCatalog,
                writes: &["b.css"],
                deletes: &["a.css", "a.css.br", "a.css.gz"],
                unmanaged: &[],
                recorded: Some(&["b.css"]),
            },
            Case {
                name: "replacement: another owner's stale sibling goes too",
                workflow: Replacement,
                force: false,
                state: catalog(vec![
                    rec("a.css", ("other", "x"), &old, 'a', 3),
                    sibling_rec("a.css.br", ("other", "x"), &old),
                ]),
                listing: storage(&[("a.css", file(3)), ("a.css.br", file(5))]),
                desired: vec![want("a.css", 'b', 3)],
                action: Action::ReplaceCatalog,
                writes: &["a.css"],
                deletes: &["a.css.br"],
                unmanaged: &[],
                recorded: Some(&["a.css"]),
            },
        ]
    }

    #[test]
    fn ownership_change_keeps_created_at_and_sets_updated_at() {
        let old = source("bundle-1");
        let state = catalog(vec![rec("r.html", ("other", "x"), &old, 'b', 1)]);
        let listing = storage(&[("r.html", file(1))]);
        let desired = vec![want("r.html", 'a', 3)];
        let src = source("bundle-2");
        let plan = plan(&PlanInput {
            pipeline_id: P,
            destination_id: D,
            workflow: Workflow::Additive,
            force: false,
            source: &src,
            desired: &desired.clone().into(),
            state: &state,
            listing: &listing,
            rewrite: &BTreeSet::new(),
            now: now(),
            delete_within: None,
            replay: None,
        });
        let c = plan.update.unwrap().apply(current(&state));
        let r = &c.outputs[0];
        assert_eq!((&*r.pipeline_id, &*r.destination_id), (P, D));
        assert_eq!(*r.source, src);
        assert_eq!(r.created_at, t("2026-01-01T00:00:00Z"));
        assert_eq!(r.updated_at, now());
        assert_eq!(r.sha256, hex('a'));
        assert_eq!(
            c.created_at,
            t("2026-01-01T00:00:00Z"),
            "catalog keeps its birth"
        );
        assert_eq!(c.updated_at, now());
    }

    /// `signatures.refuse_older` (docs/contract.md §17.5): a plan that
    /// overwrites a later source's record, or writes again what a later
    /// source deleted (in this batch or before it), is refused, and lists
    /// what it would roll back when only asked; a later bundle of the same
    /// batch rolls nothing back.
    #[test]
    fn a_plan_that_rolls_a_later_source_back_is_refused_under_refuse_older() {
        let src = source("bundle-2");
        let mut newer = source("bundle-3");
        newer.created = t("2026-06-05T00:00:00Z");
        let state = catalog(vec![rec("new.html", (P, D), &newer, 'b', 1)]);
        let listing = storage(&[("new.html", file(1))]);
        let tombstone = crate::spool::queue::Tombstone {
            source: "bundle-4".to_owned(),
            created: t("2026-06-06T00:00:00Z"),
        };
        let tombstones: BTreeMap<String, _> = [("gone.html".to_owned(), tombstone)].into();
        let in_batch: BTreeMap<String, SourceIdentity> =
            [("gone-in-batch.html".to_owned(), newer.clone())].into();
        let none = BTreeMap::new();
        let later = [newer.clone()];
        // (wanted path, refuse, sources later in the batch, deleted in the batch: rolled back?)
        type Case<'c> = (
            &'c str,
            bool,
            &'c [SourceIdentity],
            &'c BTreeMap<String, SourceIdentity>,
            bool,
        );
        let cases: Vec<Case> = vec![
            ("new.html", true, &[], &none, true),
            ("new.html", false, &[], &none, true),
            ("new.html", true, &later, &none, false),
            ("gone.html", true, &[], &none, true),
            ("gone-in-batch.html", true, &[], &in_batch, true),
            ("gone-in-batch.html", true, &[], &none, false),
            ("other.html", true, &[], &none, false),
        ];
        for (path, refuse, later, retracted, rolls_back) in cases {
            let decision = decide(&PlanInput {
                pipeline_id: P,
                destination_id: D,
                workflow: Workflow::Additive,
                force: false,
                source: &src,
                desired: &vec![want(path, 'a', 1)].into(),
                state: &state,
                listing: &listing,
                rewrite: &BTreeSet::new(),
                now: now(),
                delete_within: None,
                replay: Some(Replay {
                    refuse,
                    later,
                    retracted,
                    tombstones: Some(&tombstones),
                }),
            });
            let found: Vec<&str> = decision.rollbacks.iter().map(|r| r.path.as_str()).collect();
            assert_eq!(found.is_empty(), !rolls_back, "{path}: {found:?}");
            let refused = decision.plan.action == Action::FailConflict;
            assert_eq!(refused, refuse && rolls_back, "{path}: {:?}", decision.plan);
            if refused {
                let error = decision.plan.error.unwrap();
                assert!(
                    error.starts_with(&format!("publishing it would roll back 1 output of later sources: {path} in destination {D} is from source bundle-")),
                    "{error}"
                );
            }
        }
    }

    #[test]
    fn a_replacement_by_a_scoped_signer_deletes_only_inside_its_scopes() {
        let old = source("bundle-1");
        let state = catalog(vec![
            rec("a/old.html", (P, D), &old, 'b', 1),
            rec("b/theirs.html", (P, D), &old, 'b', 1),
            rec("index.html", (P, D), &old, 'b', 1),
        ]);
        let listing = storage(&[
            ("a/old.html", file(1)),
            ("b/theirs.html", file(1)),
            ("index.html", file(1)),
        ]);
        let desired = vec![want("a/new.html", 'a', 3)];
        let src = source("bundle-2");
        let scope = |e: &[&str]| {
            crate::scope::Scope::parse(&e.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap()
        };
        let (a, a_and_index) = (scope(&["a/"]), scope(&["a/", "index.html"]));
        // (the signer's scopes, what the replacement deletes)
        let cases: Vec<(Option<Vec<crate::scope::Scope>>, Vec<&str>)> = vec![
            (None, vec!["a/old.html", "b/theirs.html", "index.html"]),
            (Some(vec![a]), vec!["a/old.html"]),
            (Some(vec![a_and_index]), vec!["a/old.html", "index.html"]),
            (Some(vec![]), vec![]),
        ];
        for (within, deleted) in cases {
            let plan = plan(&PlanInput {
                pipeline_id: P,
                destination_id: D,
                workflow: Workflow::Replacement,
                force: false,
                source: &src,
                desired: &desired.clone().into(),
                state: &state,
                listing: &listing,
                rewrite: &BTreeSet::new(),
                now: now(),
                delete_within: within.as_deref(),
                replay: None,
            });
            assert_eq!(plan.delete_after, deleted, "{within:?}");
        }
    }

    #[test]
    fn legacy_replacement_clears_blockers_before_writing() {
        let state = State::Legacy { schema_version: 1 };
        let listing = storage(&[("a", file(1)), ("r.html/x", file(1)), ("keep/y", file(1))]);
        let desired = vec![want("a/b.html", 'a', 3), want("r.html", 'a', 3)];
        let src = source("s");
        let plan = plan(&PlanInput {
            pipeline_id: P,
            destination_id: D,
            workflow: Workflow::Replacement,
            force: false,
            source: &src,
            desired: &desired.clone().into(),
            state: &state,
            listing: &listing,
            rewrite: &BTreeSet::new(),
            now: now(),
            delete_within: None,
            replay: None,
        });
        assert_eq!(plan.clear_first, ["a", "r.html"]);
        assert_eq!(plan.delete_after, ["keep/y"]);
    }

    #[test]
    fn generated_outputs_record_source_path_and_transform() {
        let mut d = want("r.html", 'a', 3);
        d.kind = OutputKind::Generated;
        d.transform = Some(MARKDOWN_TO_HTML);
        d.bundle_path = RelPath::parse("r.md").unwrap();
        d.url = Some("https://x.example/r.html".into());
        let src = source("s");
        let plan = plan(&PlanInput {
            pipeline_id: P,
            destination_id: D,
            workflow: Workflow::Additive,
            force: false,
            source: &src,
            desired: &vec![d.clone()].into(),
            state: &State::Absent,
            listing: &Listing::default(),
            rewrite: &BTreeSet::new(),
            now: now(),
            delete_within: None,
            replay: None,
        });
        let c = plan.update.unwrap().apply(None);
        let r = &c.outputs[0];
        assert_eq!(r.source_path.as_ref().map(RelPath::as_str), Some("r.md"));
        assert_eq!(r.transform, Some(MARKDOWN_TO_HTML));
        assert_eq!(r.url.as_deref(), Some("https://x.example/r.html"));
    }

    #[test]
    fn urls_percent_encode_each_segment() {
        let cases = [
            (
                "https://x.example/a/",
                "r.html",
                "https://x.example/a/r.html",
            ),
            (
                "https://x.example/a",
                "r.html",
                "https://x.example/a/r.html",
            ),
            (
                "https://x.example/",
                "my file/ü~_.html",
                "https://x.example/my%20file/%C3%BC~_.html",
            ),
            (
                "https://x.example/",
                "a+b&c/%.html",
                "https://x.example/a%2Bb%26c/%25.html",
            ),
        ];
        for (base, path, url) in cases {
            assert_eq!(output_url(base, &RelPath::parse(path).unwrap()), url);
        }
    }

    #[test]
    fn duplicate_and_nested_outputs_are_rejected() {
        let mut html = want("x.html", 'a', 1);
        html.bundle_path = RelPath::parse("x.md").unwrap();
        let err = check_unique(&[want("x.html", 'b', 1), html]).unwrap_err();
        assert!(err.contains("x.html") && err.contains("x.md"), "{err}");
        let err = check_unique(&[want("a", 'a', 1), want("a/b", 'a', 1)]).unwrap_err();
        assert!(err.contains("a/b"), "{err}");
        assert!(check_unique(&[want("a", 'a', 1), want("ab/c", 'a', 1)]).is_ok());
    }
}
