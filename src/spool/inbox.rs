//! Looking at the inbox: what each entry is (docs/contract.md §13) and whether it may be
//! claimed now. [`probe_inbox`] inspects every entry on its own, through
//! [`crate::fs::spoolfs`], so one unreadable, hostile or half-copied entry never
//! hides the others (§12.5). [`decide`] is the pure rule: from what a probe
//! found and how long the entry has been quiet, claim, wait or leave it.
//!
//! *Complete* means: `manifest.json` is a regular file that parses, every
//! listed file exists with its declared size, and nothing in the folder
//! changed for `settle`. Changes are read from the change times (ctime) of
//! the folder and everything in it, which a producer cannot set (rsync and
//! tar preserve modification times, not change times), so a copy that keeps
//! writing is never mistaken for a quiet one.

use super::{MANIFEST, is_ignored_name};
use crate::bundle::{self, Limits};
use crate::fs::spoolfs::{self, EntryError, Visit};
use crate::signature::SIGNATURE_FILE;
use cap_std::fs::{Dir, MetadataExt};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// How long a folder stays unexamined at most while it has no manifest or
/// is incomplete, in case changes inside it send no event (the watcher sees
/// the inbox itself, not every folder below it).
pub const INCOMPLETE_POLL: Duration = Duration::from_millis(250);
/// Entries inspected beyond `max_files` before the folder counts as too big.
const SPARE_ENTRIES: u64 = 10_000;

/// Why an inbox entry waits, as `spool list --inbox` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Waiting {
    NoManifest,
    Incomplete,
    Settling,
    Unreadable,
    Ready,
}

impl Waiting {
    pub fn as_str(self) -> &'static str {
        match self {
            Waiting::NoManifest => "no_manifest",
            Waiting::Incomplete => "incomplete",
            Waiting::Settling => "settling",
            Waiting::Unreadable => "unreadable",
            Waiting::Ready => "ready",
        }
    }

    /// Every state, in the order `status` shows them.
    pub const ALL: [Waiting; 5] = [
        Waiting::Ready,
        Waiting::Settling,
        Waiting::Incomplete,
        Waiting::NoManifest,
        Waiting::Unreadable,
    ];
}

/// What a probe found in one inbox entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeKind {
    /// A folder without `manifest.json`: not a bundle yet.
    NoManifest,
    /// The agent cannot read, search or use it; the text says why and what
    /// to do.
    Unreadable(String),
    /// The manifest does not parse yet, or listed files are missing or of
    /// another size; the text says which.
    Incomplete(String),
    /// Manifest parsed and every listed file has its declared size.
    Complete,
    /// Waiting cannot make it valid (a manifest that is a FIFO or a link,
    /// that parses but breaks the contract or a limit, a listed file that is
    /// a link): it is claimed so that verification fails it with the reason.
    Broken(String),
}

/// One inbox entry as found.
#[derive(Debug, Clone)]
pub struct Probe {
    pub name: String,
    pub path: PathBuf,
    pub kind: ProbeKind,
    /// The newest change time of the folder and everything in it.
    pub last_change: SystemTime,
    /// Modification time of `manifest.json` (arrival order), when present.
    pub arrival: Option<SystemTime>,
}

/// What the worker does with an entry now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Claim,
    /// Look again after at most this long.
    Wait(Duration),
    /// Nothing to do until something changes (`agent --once`: left).
    Leave,
}

/// The agent settings the decision depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    pub settle: Duration,
    pub incomplete_timeout: Duration,
    /// `agent --once`: complete bundles are claimed without waiting for
    /// `settle`, incomplete ones are left.
    pub once: bool,
}

impl Timing {
    /// The same timing as the live agent would use (for listings).
    pub fn for_listing(&self) -> Timing {
        Timing {
            once: false,
            ..*self
        }
    }
}

/// The claim rule (docs/contract.md §8, §13). `quiet` is how long nothing in the folder
/// has changed; `complete_for` how long the live agent has seen it complete
/// (a bundle whose files keep being touched is still claimed after
/// 10 × `settle`).
pub fn decide(
    kind: &ProbeKind,
    quiet: Duration,
    complete_for: Option<Duration>,
    t: &Timing,
) -> (Waiting, Verdict) {
    match kind {
        ProbeKind::NoManifest if t.once => (Waiting::NoManifest, Verdict::Leave),
        ProbeKind::NoManifest => (Waiting::NoManifest, Verdict::Wait(INCOMPLETE_POLL)),
        ProbeKind::Unreadable(_) => (Waiting::Unreadable, Verdict::Leave),
        ProbeKind::Broken(_) => (Waiting::Ready, Verdict::Claim),
        ProbeKind::Complete => {
            let cap = t.settle * 10;
            let seen = complete_for.unwrap_or_default();
            if t.once || quiet >= t.settle || (complete_for.is_some() && seen >= cap) {
                (Waiting::Ready, Verdict::Claim)
            } else {
                let left =
                    (t.settle - quiet).min(cap.saturating_sub(seen).max(Duration::from_millis(1)));
                (Waiting::Settling, Verdict::Wait(left))
            }
        }
        ProbeKind::Incomplete(_) => {
            if quiet >= t.incomplete_timeout {
                (Waiting::Incomplete, Verdict::Claim)
            } else if t.once {
                (Waiting::Incomplete, Verdict::Leave)
            } else {
                let left = (t.incomplete_timeout - quiet).min(INCOMPLETE_POLL);
                // (the lower bound keeps a near-timeout wait from spinning)
                (Waiting::Incomplete, Verdict::Wait(left))
            }
        }
    }
}

impl Probe {
    /// [`decide`] at wall-clock time `now`.
    pub fn decide(
        &self,
        now: SystemTime,
        complete_for: Option<Duration>,
        t: &Timing,
    ) -> (Waiting, Verdict) {
        decide(&self.kind, self.quiet(now), complete_for, t)
    }

    /// How long nothing in the folder has changed.
    pub fn quiet(&self, now: SystemTime) -> Duration {
        now.duration_since(self.last_change).unwrap_or_default()
    }

    /// The text `spool list --inbox` shows for the entry in state `state`.
    pub fn reason(&self, state: Waiting, now: SystemTime, t: &Timing) -> String {
        let quiet = short(self.quiet(now));
        match (&self.kind, state) {
            (ProbeKind::NoManifest, _) => format!(
                "no {MANIFEST} yet (its top level last changed {quiet} ago); a folder becomes a bundle once its {MANIFEST} is there and every file it lists has its declared size (seal it with `distributor bundle seal`, or rename the finished folder in; see docs/producers.md)"
            ),
            (ProbeKind::Unreadable(why), _) => why.clone(),
            (ProbeKind::Incomplete(what), _) => format!(
                "{what}; nothing changed for {quiet}; goes to failed/ after {} without change",
                short(t.incomplete_timeout)
            ),
            (ProbeKind::Broken(why), _) => {
                format!("will be claimed and fail verification: {why}")
            }
            (ProbeKind::Complete, Waiting::Settling) => format!(
                "complete, changed {quiet} ago; claimed once nothing changes for {}",
                short(t.settle)
            ),
            (ProbeKind::Complete, _) => "complete; claimed at the agent's next scan".to_owned(),
        }
    }
}

fn short(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        crate::config::format_duration(Duration::from_millis(d.as_millis() as u64))
    } else {
        crate::config::format_duration(Duration::from_secs(d.as_secs()))
    }
}

/// Probes every entry of the inbox (dot-names are staging and skipped). Only
/// an inbox that cannot be listed at all is an error. With `signed`, a
/// bundle is complete only once its `manifest.json.sig` is there too.
pub fn probe_inbox(inbox: &Path, limits: &Limits, signed: bool) -> io::Result<Vec<Probe>> {
    probe_inbox_again(inbox, limits, signed, &mut Unchanged::default())
}

/// The inbox folders found without a `manifest.json` at the last probe,
/// by name, with the look of the folder then (inode and change time). A
/// `manifest.json` created in, or renamed into, a folder changes its
/// change time, so a folder whose look is the same still has none and is
/// not opened again: a live agent that probes an inbox every 250 ms
/// (docs/security.md, "What a producer can make the agent spend is
/// bounded") pays one `statx` per such folder, not an open, a lookup and
/// a close.
#[derive(Debug, Default)]
pub struct Unchanged(HashMap<String, (u64, SystemTime)>);

/// How old a folder's change time must be for [`Unchanged`] to keep its
/// look: timestamps come from a clock that ticks every few milliseconds,
/// so a manifest created in the same tick as the last change would not
/// change it.
const LOOK_SETTLED: Duration = Duration::from_secs(1);

/// [`probe_inbox`] again, skipping the folders `unchanged` knows to still
/// have no manifest, and updating it.
pub fn probe_inbox_again(
    inbox: &Path,
    limits: &Limits,
    signed: bool,
    unchanged: &mut Unchanged,
) -> io::Result<Vec<Probe>> {
    let dir = match spoolfs::open_folder(inbox) {
        Ok(d) => d,
        Err(EntryError::Missing) => return Ok(Vec::new()),
        Err(EntryError::Io(e)) => return Err(e),
        Err(other) => {
            return Err(io::Error::other(format!(
                "{}: {other}; the inbox must be a real folder",
                inbox.display()
            )));
        }
    };
    let mut probes = Vec::new();
    for entry in dir.entries()? {
        let entry = entry?;
        let file_name = entry.file_name();
        let Some(name) = file_name.to_str().map(str::to_owned) else {
            probes.push(Probe {
                name: crate::text::escape::inert_os(&file_name),
                path: inbox.join(&file_name),
                kind: ProbeKind::Unreadable(
                    "its name is not UTF-8; rename it (bundle names are UTF-8)".to_owned(),
                ),
                last_change: change_time(entry.metadata().ok().as_ref()),
                arrival: None,
            });
            continue;
        };
        if is_ignored_name(&name) {
            continue;
        }
        if let Some(p) = probe_entry(&dir, inbox, &name, limits, signed, unchanged) {
            probes.push(p);
        }
    }
    let names: std::collections::HashSet<&str> = probes.iter().map(|p| p.name.as_str()).collect();
    unchanged.0.retain(|name, _| names.contains(name.as_str()));
    probes.sort_by(|a, b| a.arrival.cmp(&b.arrival).then_with(|| a.name.cmp(&b.name)));
    Ok(probes)
}

/// A folder's look, as [`Unchanged`] keeps it: its inode and change time.
fn look(meta: &cap_std::fs::Metadata) -> (u64, SystemTime) {
    (meta.ino(), change_time(Some(meta)))
}

fn change_time(meta: Option<&cap_std::fs::Metadata>) -> SystemTime {
    meta.and_then(|m| {
        let secs = u64::try_from(m.ctime()).ok()?;
        let nanos = u32::try_from(m.ctime_nsec()).ok()?;
        SystemTime::UNIX_EPOCH.checked_add(Duration::new(secs, nanos))
    })
    .unwrap_or(SystemTime::UNIX_EPOCH)
}

/// Probes one entry; `None` when it vanished meanwhile.
fn probe_entry(
    inbox: &Dir,
    inbox_path: &Path,
    name: &str,
    limits: &Limits,
    signed: bool,
    unchanged: &mut Unchanged,
) -> Option<Probe> {
    let path = inbox_path.join(name);
    let meta = match inbox.symlink_metadata(name) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
        Err(e) => {
            return Some(Probe {
                name: name.to_owned(),
                path,
                kind: ProbeKind::Unreadable(format!("cannot inspect it: {e}")),
                last_change: SystemTime::UNIX_EPOCH,
                arrival: None,
            });
        }
    };
    let mut probe = Probe {
        name: name.to_owned(),
        path,
        kind: ProbeKind::NoManifest,
        last_change: change_time(Some(&meta)),
        arrival: None,
    };
    if !meta.is_dir() {
        probe.kind = ProbeKind::Unreadable(format!(
            "is {}, not a folder, so it is not a bundle; producers drop folders holding a {MANIFEST}: move it away",
            spoolfs::kind_label(meta.file_type())
        ));
        return Some(probe);
    }
    let look = look(&meta);
    if unchanged.0.get(name) == Some(&look) {
        return Some(probe);
    }
    unchanged.0.remove(name);
    let folder = match spoolfs::open_dir(inbox, OsStr::new(name)) {
        Ok(d) => d,
        Err(EntryError::Missing) => return None,
        Err(e) => {
            probe.kind = ProbeKind::Unreadable(unreadable_folder(".", &e));
            return Some(probe);
        }
    };
    // A folder without a manifest is not a bundle yet: nothing below its
    // top is read until one appears (producers may leave thousands).
    match folder.symlink_metadata(MANIFEST) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            // Only a look a second old: a change within the same tick of
            // the kernel's coarse clock could leave the change time as it
            // was.
            let settled = SystemTime::now()
                .duration_since(probe.last_change)
                .is_ok_and(|age| age >= LOOK_SETTLED);
            if settled {
                unchanged.0.insert(name.to_owned(), look);
            }
            return Some(probe);
        }
        Err(e) => {
            probe.kind = ProbeKind::Unreadable(unreadable_folder(".", &EntryError::Io(e)));
            return Some(probe);
        }
        Ok(_) => {}
    }
    let tree = match Tree::read(&folder, limits.max_files.saturating_add(SPARE_ENTRIES)) {
        Ok(tree) => tree,
        Err(TreeError::Unreadable(why)) => {
            probe.kind = ProbeKind::Unreadable(why);
            return Some(probe);
        }
        Err(TreeError::TooBig(why)) => {
            probe.kind = ProbeKind::Broken(why);
            return Some(probe);
        }
    };
    probe.last_change = probe.last_change.max(tree.last_change);
    probe.arrival = tree.files.get(MANIFEST).map(|f| f.modified);
    probe.kind = examine(&folder, &tree, limits, signed);
    if probe.kind != ProbeKind::NoManifest && !writable(inbox, name) {
        // Claiming moves the folder into work/, which needs write access
        // to the folder itself (its ".." entry changes).
        probe.kind = ProbeKind::Unreadable(format!(
            "the agent cannot move it into work/: the folder is not writable for the agent (moving a folder needs write access to the folder itself). {TAKE_OVER}"
        ));
    }
    Some(probe)
}

/// True when the running user may write into the folder `name` of
/// `inbox` (as root: always).
fn writable(inbox: &Dir, name: &str) -> bool {
    use rustix::fs::{Access, AtFlags, accessat};
    let flags = AtFlags::EACCESS | AtFlags::SYMLINK_NOFOLLOW;
    accessat(inbox, name, Access::WRITE_OK, flags).is_ok()
}

/// Why the agent may lack access to a bundle its producer delivered, and
/// the fixes (docs/security.md, "Setting up producers").
const TAKE_OVER: &str = "A copy made with cp -r, rsync -a or tar -x gives new folders the mode of their source, and a umask of 077 none for the group: under the inbox's ACL that mode is the mask, which limits the agent's own entry. An agent with CAP_FOWNER (the packaged unit gives it) restores the group's read and write access by itself; without it, the producer runs chmod -R g+rwX on the bundle before its last rename, or gives rsync --chmod=Dg+rwx,Fg+r";

fn unreadable_folder(shown: &str, e: &EntryError) -> String {
    let place = if shown == "." {
        "the folder".to_owned()
    } else {
        format!("its folder \"{shown}\"")
    };
    match e {
        EntryError::Io(io) if io.kind() == io::ErrorKind::PermissionDenied => {
            format!("the agent cannot read {place} ({io}). {TAKE_OVER}")
        }
        other => format!("the agent cannot open {place}: {other}"),
    }
}

/// One entry below a bundle folder, links not followed.
struct Node {
    /// A regular file (its size counts); anything else is `kind`.
    kind: &'static str,
    size: u64,
    /// Names the file has (more than one: a hard link, never read).
    links: u64,
    modified: SystemTime,
}

/// What a bundle folder holds, by path.
struct Tree {
    files: HashMap<String, Node>,
    last_change: SystemTime,
}

enum TreeError {
    Unreadable(String),
    TooBig(String),
}

impl Tree {
    /// Lists everything below `root` (links are listed, never followed),
    /// reading at most `max_entries` entries, with the few descriptors
    /// [`spoolfs::walk`] holds however wide or deep the folder is.
    fn read(root: &Dir, max_entries: u64) -> Result<Tree, TreeError> {
        let mut tree = Tree {
            files: HashMap::new(),
            last_change: SystemTime::UNIX_EPOCH,
        };
        let mut count: u64 = 0;
        let mut too_big = false;
        let walked = spoolfs::walk(root, &mut |segments, meta| {
            count += 1;
            if count > max_entries {
                too_big = true;
                return Visit::Stop;
            }
            tree.last_change = tree.last_change.max(change_time(Some(meta)));
            let mut path = String::new();
            for segment in segments {
                let Some(name) = segment.to_str() else {
                    return Visit::Skip;
                };
                if !path.is_empty() {
                    path.push('/');
                }
                path.push_str(name);
            }
            let modified = meta
                .modified()
                .map(|t| t.into_std())
                .unwrap_or(SystemTime::UNIX_EPOCH);
            tree.files.insert(
                path,
                Node {
                    kind: if meta.is_file() {
                        "a regular file"
                    } else {
                        spoolfs::kind_label(meta.file_type())
                    },
                    size: meta.len(),
                    links: meta.nlink(),
                    modified,
                },
            );
            Visit::Descend
        });
        if let Err((shown, e)) = walked {
            return Err(TreeError::Unreadable(unreadable_folder(
                &shown,
                &EntryError::Io(e),
            )));
        }
        if too_big {
            return Err(TreeError::TooBig(format!(
                "the folder holds more than {max_entries} entries, far more than limits.max_files allows"
            )));
        }
        Ok(tree)
    }
}

/// Most names listed one by one in an incomplete bundle's reason.
const MAX_NAMED: usize = 5;

/// Reads the manifest and compares the listed files with the tree; with
/// `signed`, `manifest.json.sig` counts as one more file to wait for.
fn examine(folder: &Dir, tree: &Tree, limits: &Limits, signed: bool) -> ProbeKind {
    if !tree.files.contains_key(MANIFEST) {
        return ProbeKind::NoManifest;
    }
    let bytes = match spoolfs::read_capped(folder, MANIFEST, limits.max_manifest_bytes()) {
        Ok(b) => b,
        Err(e) if e.is_missing() => return ProbeKind::NoManifest,
        Err(spoolfs::ReadError::Entry(EntryError::Io(e)))
            if e.kind() == io::ErrorKind::PermissionDenied =>
        {
            return ProbeKind::Unreadable(format!(
                "the agent cannot read its {MANIFEST} ({e}). {TAKE_OVER}"
            ));
        }
        Err(e) => return ProbeKind::Broken(format!("{MANIFEST} {e}")),
    };
    if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(&bytes)
        && e.classify() == serde_json::error::Category::Eof
    {
        return ProbeKind::Incomplete(format!(
            "{MANIFEST} ends early ({} bytes so far; it is still being written?)",
            bytes.len()
        ));
    }
    let manifest = match bundle::parse_manifest(&bytes) {
        Ok(m) => m,
        Err(e) => return ProbeKind::Broken(e.to_string()),
    };
    if let Err(e) = bundle::check_limits(&manifest, limits) {
        return ProbeKind::Broken(e.to_string());
    }
    let mut missing = Vec::new();
    let mut short = Vec::new();
    for listed in &manifest.files {
        match tree.files.get(listed.path.as_str()) {
            None => missing.push(listed.path.as_str()),
            Some(node) if node.kind != "a regular file" => {
                return ProbeKind::Broken(format!("{}: is {}", listed.path, node.kind));
            }
            // Its size is another file's, maybe one the producer cannot
            // read: neither waited for nor shown.
            Some(node) if node.links > 1 => {
                return ProbeKind::Broken(format!(
                    "{}: is a hard link ({} names for one file)",
                    listed.path, node.links
                ));
            }
            // Waiting cannot shrink it: the manifest is written last.
            Some(node) if node.size > listed.size => {
                return ProbeKind::Broken(format!(
                    "{}: is {} bytes, more than the {} its manifest declares, so it cannot become complete; seal the bundle again after its files are written (`distributor bundle seal`), then deliver it again",
                    listed.path, node.size, listed.size
                ));
            }
            Some(node) if node.size != listed.size => short.push(format!(
                "{} ({} of {} bytes)",
                listed.path, node.size, listed.size
            )),
            Some(_) => {}
        }
    }
    if missing.is_empty() && short.is_empty() {
        if signed && !tree.files.contains_key(SIGNATURE_FILE) {
            // rsync and cp copy in name order: the signature comes after
            // the manifest (docs/contract.md §17.3).
            return ProbeKind::Incomplete(format!(
                "{SIGNATURE_FILE} is not there yet, and this pipeline takes only signed bundles (deliver it with the bundle, or sign the bundle before handing it over)"
            ));
        }
        return ProbeKind::Complete;
    }
    let mut parts = Vec::new();
    let named = |list: Vec<String>| {
        let more = list.len().saturating_sub(MAX_NAMED);
        let mut text = list
            .into_iter()
            .take(MAX_NAMED)
            .collect::<Vec<_>>()
            .join(", ");
        if more > 0 {
            text.push_str(&format!(" and {more} more"));
        }
        text
    };
    if !missing.is_empty() {
        parts.push(format!(
            "{} of {} listed files missing: {}",
            missing.len(),
            manifest.files.len(),
            named(missing.iter().map(|s| s.to_string()).collect())
        ));
    }
    if !short.is_empty() {
        parts.push(format!(
            "{} not of the declared size yet: {}",
            short.len(),
            named(short)
        ));
    }
    ProbeKind::Incomplete(parts.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    fn timing(once: bool) -> Timing {
        Timing {
            settle: MS(250),
            incomplete_timeout: Duration::from_secs(600),
            once,
        }
    }

    /// The claim rule's inputs: what the folder holds, how long it has
    /// been quiet (ms), since when it has been seen changing (ms, if at
    /// all), `--once`; and its verdict.
    type Case = (
        &'static str,
        ProbeKind,
        u64,
        Option<u64>,
        bool,
        Waiting,
        Verdict,
    );

    fn check(cases: Vec<Case>) {
        for (what, kind, quiet, seen, once, state, verdict) in cases {
            let got = decide(&kind, MS(quiet), seen.map(MS), &timing(once));
            assert_eq!(got, (state, verdict), "{what}");
        }
    }

    #[test]
    fn the_claim_rule_without_a_complete_manifest() {
        use ProbeKind::*;
        use Verdict::*;
        check(vec![
            (
                "no manifest: looked at again",
                NoManifest,
                999_999,
                None,
                false,
                Waiting::NoManifest,
                Wait(INCOMPLETE_POLL),
            ),
            (
                "no manifest, --once",
                NoManifest,
                0,
                None,
                true,
                Waiting::NoManifest,
                Leave,
            ),
            (
                "unreadable is left",
                Unreadable("x".into()),
                999_999,
                None,
                false,
                Waiting::Unreadable,
                Leave,
            ),
            (
                "broken is claimed at once to fail it",
                Broken("x".into()),
                0,
                None,
                false,
                Waiting::Ready,
                Claim,
            ),
        ]);
    }

    #[test]
    fn the_claim_rule_for_a_complete_bundle() {
        use ProbeKind::*;
        use Verdict::*;
        check(vec![
            (
                "complete and just changed: settles",
                Complete,
                100,
                Some(0),
                false,
                Waiting::Settling,
                Wait(MS(150)),
            ),
            (
                "complete and quiet for settle: claimed",
                Complete,
                250,
                Some(0),
                false,
                Waiting::Ready,
                Claim,
            ),
            (
                "complete, touched for 10 x settle: claimed anyway",
                Complete,
                0,
                Some(2500),
                false,
                Waiting::Ready,
                Claim,
            ),
            (
                "complete, touched for a while: waits the rest",
                Complete,
                0,
                Some(2400),
                false,
                Waiting::Settling,
                Wait(MS(100)),
            ),
            (
                "complete, seen for the first time and just changed: waits settle",
                Complete,
                0,
                Some(0),
                false,
                Waiting::Settling,
                Wait(MS(250)),
            ),
            (
                "complete, the cap nearer than settle: waits for the cap",
                Complete,
                100,
                Some(2450),
                false,
                Waiting::Settling,
                Wait(MS(50)),
            ),
            (
                "complete, quiet for settle long before the cap: claimed",
                Complete,
                300,
                Some(10),
                false,
                Waiting::Ready,
                Claim,
            ),
            (
                "complete, touched far past the cap: claimed",
                Complete,
                0,
                Some(60_000),
                false,
                Waiting::Ready,
                Claim,
            ),
            (
                "complete, --once: no settle",
                Complete,
                0,
                None,
                true,
                Waiting::Ready,
                Claim,
            ),
        ]);
    }

    #[test]
    fn the_claim_rule_for_an_incomplete_bundle() {
        use Verdict::*;
        let incomplete = ProbeKind::Incomplete("x".into());
        check(vec![
            (
                "incomplete and recently changed: polls",
                incomplete.clone(),
                10,
                None,
                false,
                Waiting::Incomplete,
                Wait(INCOMPLETE_POLL),
            ),
            (
                "incomplete near the timeout: waits the rest",
                incomplete.clone(),
                599_900,
                None,
                false,
                Waiting::Incomplete,
                Wait(MS(100)),
            ),
            (
                "incomplete past the timeout: claimed to fail",
                incomplete.clone(),
                600_000,
                None,
                false,
                Waiting::Incomplete,
                Claim,
            ),
            (
                "incomplete, --once: left",
                incomplete.clone(),
                10,
                None,
                true,
                Waiting::Incomplete,
                Leave,
            ),
            (
                "incomplete past the timeout, --once: claimed",
                incomplete,
                600_000,
                None,
                true,
                Waiting::Incomplete,
                Claim,
            ),
        ]);
    }

    fn write(path: &Path, bytes: &[u8]) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }

    fn probe_one(inbox: &Path) -> Probe {
        let mut all = probe_inbox(inbox, &Limits::default(), false).unwrap();
        assert_eq!(all.len(), 1, "{all:?}");
        all.remove(0)
    }

    #[test]
    fn a_bundle_of_a_signed_pipeline_waits_for_its_signature() {
        let tmp = tempfile::tempdir().unwrap();
        let inbox = tmp.path().join("inbox");
        let b = inbox.join("b");
        write(&b.join("a.txt"), b"hello");
        bundle::seal(&b, "b-1", None).unwrap();
        let probe = |signed| {
            probe_inbox(&inbox, &Limits::default(), signed)
                .unwrap()
                .remove(0)
        };
        assert_eq!(probe(false).kind, ProbeKind::Complete);
        match probe(true).kind {
            ProbeKind::Incomplete(why) => assert!(why.contains("manifest.json.sig"), "{why}"),
            other => panic!("{other:?}"),
        }
        write(&b.join("manifest.json.sig"), b"anything: checked at verify");
        assert_eq!(probe(true).kind, ProbeKind::Complete);
    }

    /// A folder known to have no manifest is not opened again while its
    /// look is the same, and is probed whole once a manifest changes it;
    /// the looks of folders gone from the inbox are forgotten.
    #[test]
    fn a_folder_without_a_manifest_is_probed_again_once_it_changes() {
        let tmp = tempfile::tempdir().unwrap();
        let inbox = tmp.path().join("inbox");
        let b = inbox.join("b");
        write(&b.join("a.txt"), b"hello");
        std::fs::create_dir_all(inbox.join("gone")).unwrap();
        let mut unchanged = Unchanged::default();
        let again = |unchanged: &mut Unchanged| {
            probe_inbox_again(&inbox, &Limits::default(), false, unchanged).unwrap()
        };
        let look = |name: &str| {
            let meta = std::fs::symlink_metadata(inbox.join(name)).unwrap();
            super::look(&cap_std::fs::Metadata::from_just_metadata(meta))
        };
        let probes = again(&mut unchanged);
        assert!(probes.iter().all(|p| p.kind == ProbeKind::NoManifest));
        // As they would be kept once a second old.
        for name in ["b", "gone"] {
            unchanged.0.insert(name.to_owned(), look(name));
        }
        std::fs::remove_dir(inbox.join("gone")).unwrap();
        let probes = again(&mut unchanged);
        assert_eq!(probes.len(), 1);
        assert_eq!(probes[0].kind, ProbeKind::NoManifest);
        assert_eq!(unchanged.0.keys().collect::<Vec<_>>(), ["b"]);

        // A kept look is trusted: the folder is not opened (were a
        // manifest to arrive without changing the look, as a look younger
        // than a second could let happen, it would not be seen).
        bundle::seal(&b, "b-1", None).unwrap();
        unchanged.0.insert("b".to_owned(), look("b"));
        assert_eq!(again(&mut unchanged)[0].kind, ProbeKind::NoManifest);

        // Its look kept a second before the manifest arrived.
        let (ino, ctime) = unchanged.0["b"];
        unchanged
            .0
            .insert("b".to_owned(), (ino, ctime - Duration::from_secs(1)));
        let probes = again(&mut unchanged);
        assert_eq!(probes[0].kind, ProbeKind::Complete);
        assert!(unchanged.0.is_empty(), "{unchanged:?}");
    }

    #[test]
    fn probes_tell_missing_short_unparsable_and_complete_apart() {
        let tmp = tempfile::tempdir().unwrap();
        let inbox = tmp.path().join("inbox");
        let b = inbox.join("b");
        write(&b.join("sub/a.txt"), b"hello");
        write(&b.join("z.bin"), &[0u8; 10]);
        std::fs::create_dir_all(&b).unwrap();
        assert_eq!(probe_one(&inbox).kind, ProbeKind::NoManifest);
        bundle::seal(&b, "b-1", None).unwrap();
        let manifest = std::fs::read(b.join(MANIFEST)).unwrap();
        assert_eq!(probe_one(&inbox).kind, ProbeKind::Complete);
        assert!(probe_one(&inbox).arrival.is_some());

        std::fs::write(b.join(MANIFEST), &manifest[..manifest.len() / 2]).unwrap();
        let kind = probe_one(&inbox).kind;
        assert!(
            matches!(&kind, ProbeKind::Incomplete(t) if t.contains("ends early")),
            "{kind:?}"
        );

        std::fs::write(b.join(MANIFEST), &manifest).unwrap();
        std::fs::write(b.join("z.bin"), [0u8; 4]).unwrap();
        std::fs::remove_file(b.join("sub/a.txt")).unwrap();
        let kind = probe_one(&inbox).kind;
        assert_eq!(
            kind,
            ProbeKind::Incomplete(
                "1 of 2 listed files missing: sub/a.txt; 1 not of the declared size yet: z.bin (4 of 10 bytes)".into()
            )
        );

        // Longer than declared: waiting cannot help, it is claimed to fail.
        std::fs::write(b.join("sub/a.txt"), b"hello").unwrap();
        std::fs::write(b.join("z.bin"), [0u8; 20]).unwrap();
        let kind = probe_one(&inbox).kind;
        assert!(
            matches!(&kind, ProbeKind::Broken(t) if t.starts_with("z.bin: is 20 bytes, more than the 10")),
            "{kind:?}"
        );

        std::fs::write(b.join(MANIFEST), b"{\"schema_version\": 7}").unwrap();
        assert!(matches!(probe_one(&inbox).kind, ProbeKind::Broken(_)));
    }

    #[test]
    fn hostile_entries_are_refused_without_blocking_and_do_not_hide_others() {
        let tmp = tempfile::tempdir().unwrap();
        let inbox = tmp.path().join("inbox");
        std::fs::create_dir_all(&inbox).unwrap();
        let fifo = inbox.join("fifo-manifest");
        std::fs::create_dir(&fifo).unwrap();
        let c = std::ffi::CString::new(fifo.join(MANIFEST).as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let zero = inbox.join("zero-manifest");
        std::fs::create_dir(&zero).unwrap();
        std::os::unix::fs::symlink("/dev/zero", zero.join(MANIFEST)).unwrap();
        std::os::unix::fs::symlink(tmp.path(), inbox.join("link")).unwrap();
        write(&inbox.join("stray"), b"x");
        let good = inbox.join("good");
        write(&good.join("f"), b"f");
        bundle::seal(&good, "good", None).unwrap();

        let probes = probe_inbox(&inbox, &Limits::default(), false).unwrap();
        let kinds: HashMap<&str, &ProbeKind> =
            probes.iter().map(|p| (p.name.as_str(), &p.kind)).collect();
        assert_eq!(kinds["good"], &ProbeKind::Complete);
        let text = |name: &str| format!("{:?}", kinds[name]);
        assert!(
            text("fifo-manifest").contains("Broken(\"manifest.json is a named pipe (FIFO)"),
            "{}",
            text("fifo-manifest")
        );
        assert!(
            text("zero-manifest").contains("Broken(\"manifest.json is a symbolic link"),
            "{}",
            text("zero-manifest")
        );
        assert!(
            text("link").contains("Unreadable(\"is a symbolic link, not a folder"),
            "{}",
            text("link")
        );
        assert!(
            text("stray").contains("Unreadable(\"is a regular file, not a folder"),
            "{}",
            text("stray")
        );
    }
}
