//! An inbox in the object store (docs/contract.md §22): the layout of an
//! intake below its `<path>`, and what the agent and the spool commands do
//! there. No threads and no publishing: the agent's intake loop
//! (`agent::intake`) brings one bundle at a time from here into its local
//! `work/` and hands it to the same processing as a local inbox's.
//!
//! ```text
//! <path>/.distributor-lease           the holder (lease.rs)
//! <path>/.distributor-hold            `spool hold` (its text: since when)
//! <path>/.distributor-flush           `spool flush`
//! <path>/inbox/<name>/<file>          what producers upload, manifest.json last
//! <path>/done/<name>/.distributor-result.json
//! <path>/failed/<name>/.distributor-result.json, and the bundle's files
//! ```

pub mod lease;

use crate::bundle::{Limits, Manifest};
use crate::config::Intake;
use crate::s3::{self, ETag, Listed, S3Root};
use std::collections::HashMap;
use std::path::Path;
use time::OffsetDateTime;

/// Below it, `<name>`: the hooks a holder's publication of bundle `name`
/// owes, written before its commit and deleted once it is filed, so that
/// whichever agent publishes it again runs them (docs/contract.md §22.2).
pub const COMMITTING: &str = ".distributor-committing";
/// `spool hold` of an intake pipeline.
pub const HOLD_KEY: &str = ".distributor-hold";
/// `spool flush` of an intake pipeline.
pub const FLUSH_KEY: &str = ".distributor-flush";
/// The folders below `<path>`.
pub const INBOX: &str = "inbox";
pub const DONE: &str = "done";
pub const FAILED: &str = "failed";
/// The result object of a finished bundle.
pub const RESULT: &str = crate::spool::RESULT_FILE;
/// The most of a result object that is read: a result lists every output
/// of every destination (about 20 bytes a file and more for long paths),
/// and one that could not be read would stop the filing of every later
/// delivery under its name.
const RESULT_CAP: u64 = 64 << 20;
const MANIFEST: &str = crate::bundle::MANIFEST;
/// Why an object whose key the s3 client cannot name is left alone.
const UNNAMED: &str = "its key holds a control character, an empty, `.` or `..` segment, or a slash at its end, which no request of this agent can name";
const SIGNATURE: &str = crate::signature::SIGNATURE_FILE;

/// An intake's bucket, at its `<path>`.
pub struct Bucket {
    pub root: S3Root,
    /// The names in the inbox no request can name ([`Bucket::unreachable`]),
    /// each told once.
    told: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

/// One bundle name's state in the inbox, as one probe found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// Objects but no `manifest.json` yet.
    NoManifest,
    /// Listed files are missing or of another size, or the signature the
    /// pipeline requires is not there yet: the text says which.
    Incomplete(String),
    /// Waiting cannot make it valid (the text says why): it is failed.
    Broken(String),
    /// Every listed file is there with its size.
    Complete,
}

/// The newest `Last-Modified`, the count and the total size of a
/// bundle's objects: it changes whenever an upload adds or replaces one.
pub type Shape = (Option<OffsetDateTime>, usize, u64);

/// A manifest in the inbox as a look found it ([`Bucket::arrivals`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arrival {
    pub etag: ETag,
    /// Its `Last-Modified`: the bundle's arrival.
    pub at: OffsetDateTime,
    /// Its bytes, kept for the probe when small.
    pub bytes: Option<Vec<u8>>,
}

/// What a look at the inbox found of one bundle, which its probe does not
/// ask again.
#[derive(Debug, Clone, Copy, Default)]
pub struct Known<'a> {
    /// Its objects (paths below its folder), when the look listed every
    /// object of the inbox.
    pub objects: Option<&'a [Listed]>,
    /// Its manifest, when the look read it.
    pub manifest: Option<&'a Arrival>,
}

/// What one look at the inbox found ([`Bucket::look`]).
#[derive(Debug)]
pub enum Look {
    /// Every object below `inbox/`, by bundle name (paths below its
    /// folder). A name whose objects are all gone is not there, even on
    /// a server that lists an emptied folder for minutes.
    Whole(std::collections::BTreeMap<String, Vec<Listed>>),
    /// More objects than a look lists: the names only.
    Names(Vec<String>),
}

/// The keys one `DeleteObjects` takes.
const DELETES_A_REQUEST: usize = 1000;

/// The most bytes of a manifest kept from a look to the probe.
pub const MANIFEST_KEPT: u64 = 64 << 10;

/// A finished bundle in the bucket: its name, its result (when it has one
/// that parses) and when that was written.
#[derive(Debug, Clone)]
pub struct Finished {
    pub name: String,
    pub result: Option<serde_json::Value>,
    pub at: Option<OffsetDateTime>,
}

/// A bundle in the inbox, probed.
#[derive(Debug, Clone)]
pub struct Probe {
    pub name: String,
    pub state: State,
    /// The manifest's version and `Last-Modified` (arrival order).
    pub manifest: Option<(ETag, OffsetDateTime)>,
    /// The parsed manifest, when complete.
    pub parsed: Option<Manifest>,
    /// The bytes it was parsed from ([`Bucket::fetch`] writes these, not
    /// a second read of the object).
    pub manifest_bytes: Vec<u8>,
    /// Every object of the bundle as listed (at most `max_files + 16`).
    pub objects: Vec<Listed>,
    /// What changed last: the newest `Last-Modified`, the count and the
    /// bytes of its objects.
    pub signature: Shape,
}

impl Probe {
    /// Bundle `name`, failed for `why` before anything of it was read.
    pub fn broken(name: &str, why: String) -> Probe {
        Probe {
            name: name.to_owned(),
            state: State::Broken(why),
            manifest: None,
            parsed: None,
            manifest_bytes: Vec::new(),
            objects: Vec::new(),
            signature: (None, 0, 0),
        }
    }
}

/// What [`Bucket::fetch`] found wrong while reading (the bundle is still
/// handed on: its verification then fails it with the same words as a
/// local inbox's).
#[derive(Debug, Default)]
pub struct Fetched {
    pub mismatches: Vec<String>,
    pub bytes: u64,
}

/// A delivery as its result records it: its manifest's version, and its
/// `Last-Modified` when known.
pub type Delivery<'a> = (&'a ETag, Option<OffsetDateTime>);

/// The name a bundle gets below `done/` or `failed/`, and whether it was
/// written by this call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filed {
    pub name: String,
    pub written: bool,
}

impl Bucket {
    /// A client for the intake (credentials from the environment).
    pub fn open(intake: &Intake) -> s3::Result<Bucket> {
        Ok(Bucket::over(S3Root::open(&intake.location)?))
    }

    /// For `status`: one try per request.
    pub fn open_single_try(intake: &Intake) -> s3::Result<Bucket> {
        Ok(Bucket::over(S3Root::open_single_try(&intake.location)?))
    }

    /// The intake at `root`.
    pub fn over(root: S3Root) -> Bucket {
        Bucket {
            root,
            told: std::sync::Mutex::default(),
        }
    }

    /// Why no bundle `name` can be taken from the inbox, when none can:
    /// its name holds a control character or is empty, so that no
    /// request of this agent names its objects (the s3 client would name
    /// others). It is never claimed, filed or deleted, and no other
    /// bundle waits for it.
    pub fn unreachable(&self, name: &str) -> Option<String> {
        if self.root.addresses(&Bucket::key(INBOX, name, MANIFEST)) {
            return None;
        }
        Some(format!(
            "its name \"{}\" holds a control character or is empty, so this agent cannot name its objects; it is never claimed: delete it with an S3 client (`aws s3 rm --recursive`) and deliver it again under a name of letters, digits, '.', '_' and '-'",
            crate::text::escape::inert(name)
        ))
    }

    /// `names` without the unreachable ones, each of those told once (a
    /// warning) by this client.
    fn reachable(&self, names: impl IntoIterator<Item = String>) -> Vec<String> {
        let mut out = Vec::new();
        for name in names {
            match self.unreachable(&name) {
                None => out.push(name),
                Some(why) => {
                    let mut told = self.told.lock().unwrap_or_else(|e| e.into_inner());
                    if told.insert(name.clone()) {
                        log::warn!("{}: a bundle in the inbox is skipped: {why}", self.label());
                    }
                }
            }
        }
        out
    }

    /// `s3://bucket/path`, for messages.
    pub fn label(&self) -> &str {
        self.root.label()
    }

    /// The key of `name`'s file `file` in `folder`, relative to `<path>`.
    pub fn key(folder: &str, name: &str, file: &str) -> String {
        format!("{folder}/{name}/{file}")
    }

    /// The bundle names in the inbox, sorted (names starting with `.`
    /// are ignored, as in a local inbox).
    pub fn names(&self) -> s3::Result<Vec<String>> {
        Ok(self.reachable(self.all_names()?))
    }

    /// [`Bucket::names`] with the unreachable ones ([`Bucket::unreachable`]),
    /// for `spool list`.
    pub fn all_names(&self) -> s3::Result<Vec<String>> {
        let level = self.root.list_level(INBOX)?;
        Ok(level
            .folders
            .into_iter()
            .filter(|n| !crate::spool::is_ignored_name(n))
            .collect())
    }

    /// Every object of the inbox, when there are at most `most` (one LIST
    /// per thousand), else its names ([`Bucket::names`]). Objects right
    /// below `inbox/` and names starting with `.` are no bundle's.
    pub fn look(&self, most: usize) -> s3::Result<Look> {
        // A listing the client cannot make sense of even read by the
        // agent itself ([`S3Root::list_at_most`]): the names are listed
        // instead, which spares every other bundle.
        let all = match self.root.list_at_most(INBOX, most) {
            Ok(Some(all)) => all,
            Ok(None) => return Ok(Look::Names(self.names()?)),
            Err(e) if unreadable(&e) => {
                log::warn!(
                    "{}: cannot list the inbox whole ({e}); looking at it by its names",
                    self.label()
                );
                return Ok(Look::Names(self.names()?));
            }
            Err(e) => return Err(e),
        };
        let strip = format!("{INBOX}/");
        let mut names = std::collections::BTreeMap::<String, Vec<Listed>>::new();
        for mut o in all {
            let rel = o.path.strip_prefix(&strip).unwrap_or(&o.path);
            let Some((name, path)) = rel.split_once('/') else {
                continue;
            };
            if crate::spool::is_ignored_name(name) {
                continue;
            }
            let name = name.to_owned();
            o.path = path.to_owned();
            names.entry(name).or_default().push(o);
        }
        let keep: std::collections::HashSet<String> =
            self.reachable(names.keys().cloned()).into_iter().collect();
        names.retain(|n, _| keep.contains(n));
        Ok(Look::Whole(names))
    }

    /// The control objects at the top (`.distributor-hold`, `-flush`,
    /// `-lease`), by name.
    pub fn controls(&self) -> s3::Result<HashMap<String, Listed>> {
        let level = self.root.list_level("")?;
        Ok(level
            .objects
            .into_iter()
            .map(|o| (o.path.clone(), o))
            .collect())
    }

    /// The manifest of each name that has one, read with up to
    /// [`s3::HEADS_IN_FLIGHT`] GETs at once: its version and arrival, and
    /// its bytes when it holds at most [`MANIFEST_KEPT`] and the bytes kept
    /// stay within `budget` (the probe then reads only the listing). A GET
    /// costs what a HEAD costs, and saves the probe's. A manifest the
    /// server refuses for good ([`Bucket::refuses`]) is an arrival of
    /// unknown version, first in order, whose probe then fails the
    /// bundle; the look goes on.
    pub fn arrivals(&self, names: &[&str], mut budget: usize) -> s3::Result<Vec<Option<Arrival>>> {
        let keys: Vec<String> = names
            .iter()
            .map(|n| Bucket::key(INBOX, n, MANIFEST))
            .collect();
        let rels: Vec<&str> = keys.iter().map(String::as_str).collect();
        let mut out = vec![None; names.len()];
        // Reads stop at the first failure other than a refusal (an
        // outage: the look fails, and is tried again).
        let mut failed = Vec::new();
        self.root.get_small_each(&rels, MANIFEST_KEPT, |i, small| {
            let small = match small {
                Ok(small) => small,
                Err(e) => {
                    let go_on = refused(&e);
                    failed.push((i, e));
                    return go_on;
                }
            };
            out[i] = small.map(|s| {
                let keep = s.bytes.len() as u64 <= MANIFEST_KEPT && s.bytes.len() <= budget;
                if keep {
                    budget -= s.bytes.len();
                }
                Arrival {
                    etag: s.etag,
                    at: s.last_modified,
                    bytes: keep.then_some(s.bytes),
                }
            });
            true
        });
        for (i, e) in failed {
            if !self.refuses(&e) {
                return Err(e);
            }
            // An arrival of unknown version, first in order: its probe
            // reads the manifest again, and fails the bundle.
            out[i] = Some(Arrival {
                etag: ETag(String::new()),
                at: OffsetDateTime::UNIX_EPOCH,
                bytes: None,
            });
        }
        Ok(out)
    }

    /// Whether `e` is the server refusing one object for good ([`refused`])
    /// while it answers this agent otherwise: a read of the lease right
    /// after succeeds (S3 answers 403 to a bad signature or a skewed
    /// clock too, and then to every request).
    pub fn refuses(&self, e: &s3::Error) -> bool {
        refused(e) && lease::read(&self.root).is_ok()
    }

    /// Whether every one of `objects` of bundle `name` is still in the
    /// inbox as listed, the bundle listed with at most `most` objects: a
    /// refusal of a GET is the object's, not that of an object deleted
    /// meanwhile (S3 answers 403 for a missing key to a client that may
    /// not list the bucket).
    pub fn still_listed(&self, name: &str, objects: &[Listed], most: usize) -> bool {
        let Ok(Some(now)) = self.objects(INBOX, name, most) else {
            return false;
        };
        let now: HashMap<&str, &Listed> = now.iter().map(|o| (o.path.as_str(), o)).collect();
        objects
            .iter()
            .all(|o| now.get(o.path.as_str()).is_some_and(|n| same_bytes(o, n)))
    }

    /// Probes bundle `name`: lists its objects (at most `max_files + 16`)
    /// while reading its manifest, checks the manifest, and checks every
    /// listed file's object and size. What a look found is not asked
    /// again ([`Known`]).
    pub fn probe(
        &self,
        name: &str,
        limits: &Limits,
        signed: bool,
        known: Known<'_>,
    ) -> s3::Result<Probe> {
        if let Err(why) = crate::paths::check_bundle_name(name) {
            return Ok(Probe::broken(name, why));
        }
        let mut probe = Probe {
            state: State::NoManifest,
            ..Probe::broken(name, String::new())
        };
        let prefix = format!("{INBOX}/{name}");
        let most = most_objects(limits);
        let cap = limits.max_manifest_bytes();
        let manifest_key = Bucket::key(INBOX, name, MANIFEST);
        // The listing and the manifest are read side by side, unless the
        // look listed the bundle or read its manifest already; the
        // manifest counts only when the listing shows it too.
        let kept = known.manifest.and_then(|a| Some((a, a.bytes.as_ref()?)));
        let (listed, read) = match (known.objects, kept) {
            (Some(objects), _) => (Ok((objects.len() <= most).then(|| objects.to_vec())), None),
            (None, Some(_)) => (self.objects(INBOX, name, most), None),
            (None, None) => {
                let (listed, small) = self
                    .root
                    .list_and_get_small((&prefix, most), (&manifest_key, cap));
                (listed.map(|l| l.map(|l| below(&prefix, l))), Some(small))
            }
        };
        let Some(objects) = listed? else {
            probe.state = State::Broken(format!(
                "more than {most} objects under {prefix}/ (limits.max_files is {}); delete them with an S3 client (`aws s3 rm --recursive`), and split the bundle",
                limits.max_files
            ));
            return Ok(probe);
        };
        probe.objects = objects;
        probe.signature = (
            probe.objects.iter().map(|o| o.last_modified).max(),
            probe.objects.len(),
            probe.objects.iter().map(|o| o.size).sum(),
        );
        let sizes: HashMap<&str, u64> = probe
            .objects
            .iter()
            .map(|o| (o.path.as_str(), o.size))
            .collect();
        let Some(&manifest_size) = sizes.get(MANIFEST) else {
            return Ok(probe);
        };
        if manifest_size > cap {
            probe.state = State::Broken(format!(
                "{MANIFEST} is {manifest_size} bytes, more than the {cap} bytes this pipeline reads (room for limits.max_files entries); split the bundle"
            ));
            return Ok(probe);
        }
        let shown = probe
            .objects
            .iter()
            .find(|o| o.path == MANIFEST)
            .and_then(|o| o.etag.as_deref());
        let small = match (read, kept) {
            (Some(small), _) => small,
            (None, Some((a, bytes))) if shown.is_some_and(|e| same_etag(e, &a.etag.0)) => {
                Ok(Some(s3::bucket::Small {
                    bytes: bytes.clone(),
                    etag: a.etag.clone(),
                    last_modified: a.at,
                }))
            }
            (None, _) => self.root.get_small(&manifest_key, cap),
        };
        let listed_manifest: Vec<Listed> = probe
            .objects
            .iter()
            .filter(|o| o.path == MANIFEST)
            .cloned()
            .collect();
        let small = match small {
            // Replaced since the listing, which showed it within the cap,
            // by a larger one: looked at again at the next look (whose
            // listing shows its size).
            Err(s3::Error::Oversize { .. }) => return Ok(probe),
            Err(e) if self.refuses(&e) => {
                // Replaced or deleted since the listing (S3 may refuse a
                // key deleted meanwhile): looked at again at the next look.
                if !self.still_listed(name, &listed_manifest, most) {
                    return Ok(probe);
                }
                probe.state = State::Broken(format!(
                    "the intake bucket refuses to give its {MANIFEST} ({e}) while it answers this agent otherwise: an object encrypted with a key of the producer's (SSE-C), archived, or denied to this agent by a policy; upload it again as a plain object, readable by the agent"
                ));
                return Ok(probe);
            }
            small => small?,
        };
        let Some(small) = small else {
            return Ok(probe); // deleted meanwhile
        };
        // Replaced between the listing and the read: looked at again at
        // the next look, as one delivery.
        if shown.is_some_and(|e| !same_etag(e, &small.etag.0)) {
            return Ok(probe);
        }
        probe.manifest = Some((small.etag.clone(), small.last_modified));
        let manifest = match crate::bundle::parse_manifest(&small.bytes)
            .and_then(|m| crate::bundle::check_limits(&m, limits).map(|()| m))
        {
            Ok(m) => m,
            Err(e) => {
                // An object is written whole: waiting cannot mend it.
                probe.state = State::Broken(e.to_string());
                return Ok(probe);
            }
        };
        let mut missing = Vec::new();
        for f in &manifest.files {
            match sizes.get(f.path.as_str()) {
                None => missing.push(format!("{} is missing", f.path)),
                Some(&size) if size != f.size => missing.push(format!(
                    "{} has {size} bytes, the manifest says {}",
                    f.path, f.size
                )),
                Some(_) => {}
            }
        }
        if signed && !sizes.contains_key(SIGNATURE) {
            missing.push(format!("{SIGNATURE} is missing (the pipeline takes only signed bundles; upload it before {MANIFEST})"));
        }
        probe.state = if missing.is_empty() {
            State::Complete
        } else {
            State::Incomplete(crate::text::wording::first_few(&missing, 3, "; "))
        };
        probe.parsed = Some(manifest);
        probe.manifest_bytes = small.bytes;
        Ok(probe)
    }

    /// Streams a probed bundle's listed files (and its signature) into
    /// the new folder `into`, hashing each against the manifest as it is
    /// read, then writes the manifest the probe read and checked (the
    /// one the files were hashed against; not read again). A file is
    /// never read past its declared size (a longer object gets one byte
    /// more, which its verification then reports).
    pub fn fetch(&self, probe: &Probe, into: &Path) -> Result<Fetched, FetchError> {
        let manifest = probe.parsed.as_ref().ok_or_else(|| {
            FetchError::Local(std::io::Error::other("the bundle has no parsed manifest"))
        })?;
        // work/ is the agent's own folder (0750, nobody else writes
        // there) and every name comes from a parsed manifest: plain
        // creation, never over anything.
        std::fs::create_dir(into).map_err(FetchError::Local)?;
        let mut fetched = Fetched::default();
        // Each object as probed: one replaced since (a new delivery under
        // way) is not read ([`FetchError::changed`]).
        let version = |path: &str| {
            probe
                .objects
                .iter()
                .find(|o| o.path == path)
                .and_then(|o| o.etag.clone())
        };
        let mut keys: Vec<(String, u64, Option<String>)> = manifest
            .files
            .iter()
            .map(|f| {
                let key = Bucket::key(INBOX, &probe.name, f.path.as_str());
                (key, f.size, version(f.path.as_str()))
            })
            .collect();
        if probe.objects.iter().any(|o| o.path == SIGNATURE) {
            keys.push((
                Bucket::key(INBOX, &probe.name, SIGNATURE),
                crate::signature::MAX_SIGNATURE_BYTES + 1,
                version(SIGNATURE),
            ));
        }
        let prefix = Bucket::key(INBOX, &probe.name, "");
        let got = self.root.get_many_into(&keys, |key| {
            let rel = key.strip_prefix(&prefix).unwrap_or(key);
            let path = into.join(rel);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            let file = std::fs::File::create_new(&path)?;
            Ok::<_, FetchError>(std::io::BufWriter::with_capacity(1 << 18, file))
        })?;
        for (f, got) in manifest.files.iter().zip(&got) {
            if let Some(h) = got {
                fetched.bytes += h.size;
            }
            match got {
                None => fetched
                    .mismatches
                    .push(format!("{}: gone from the bucket", f.path)),
                Some(h) if h.size != f.size || h.sha256 != f.sha256 => {
                    fetched.mismatches.push(format!(
                        "{}: read {} bytes hashing to {}, the manifest says {} bytes, {}",
                        f.path, h.size, h.sha256, f.size, f.sha256
                    ))
                }
                Some(_) => {}
            }
        }
        let mut file = std::fs::File::create_new(into.join(MANIFEST)).map_err(FetchError::Local)?;
        std::io::Write::write_all(&mut file, &probe.manifest_bytes).map_err(FetchError::Local)?;
        fetched.bytes += probe.manifest_bytes.len() as u64;
        Ok(fetched)
    }

    /// Writes the result of bundle `name` below `folder` (`done` or
    /// `failed`), never over another bundle's: a name already taken by a
    /// result of another delivery gets `.1`, `.2`, … (the first one free,
    /// as a local spool names them). A result this delivery already wrote
    /// ([`Bucket::filed_for`]) is found and kept, so that filing again
    /// after a crash writes nothing twice.
    ///
    /// One PUT when the name is free; else one LIST of the names taken
    /// (a page per thousand), a GET of each result written since the
    /// delivery's manifest (none, but after a crash), and a PUT: a name
    /// delivered again and again costs a LIST per thousand of its
    /// results, not a PUT and a GET for each.
    pub fn put_result(
        &self,
        folder: &str,
        name: &str,
        result: &serde_json::Value,
        delivery: Delivery<'_>,
    ) -> s3::Result<Filed> {
        use crate::spool::names::{NAME_MAX, candidate};
        let mut bytes = serde_json::to_vec_pretty(result).expect("a result serializes");
        bytes.push(b'\n');
        let put = |candidate: &str| {
            let key = Bucket::key(folder, candidate, RESULT);
            match self
                .root
                .put_new(&key, &mut &bytes[..], None, "intake-result")
            {
                Ok(_) => Ok(true),
                Err(s3::Error::Exists { .. } | s3::Error::Changed { .. }) => Ok(false),
                Err(e) => Err(e),
            }
        };
        let filed = |name: String, written: bool| Ok(Filed { name, written });
        let first = candidate(name, 0, NAME_MAX);
        if put(&first)? {
            return filed(first, true);
        }
        // A key the client cannot take below `folder` (no agent writes
        // one; a bucket-wide writer could): each name is then tried.
        let taken = match self.taken_names(folder, name) {
            Err(e) if unreadable(&e) => {
                log::warn!(
                    "{}: cannot list the names taken below {folder}/ ({e}); trying each",
                    self.label()
                );
                Default::default()
            }
            taken => taken?,
        };
        // A result of this delivery was written after its manifest (a
        // second of leeway for the clocks of a server's nodes).
        let since = delivery.1.map(|at| at.unix_timestamp() - 1);
        for (candidate, written) in &taken {
            let suspect = match (written, since) {
                (Some(written), Some(since)) => written.unix_timestamp() >= since,
                (None, _) => false,
                (Some(_), None) => true,
            };
            if suspect && self.filed_for((folder, candidate), name, delivery)? {
                return filed(candidate.clone(), false);
            }
        }
        // Names found taken that the listing did not show: a few at most
        // (written since it, or a listing behind); a thousand is a server
        // that refuses every conditional PUT.
        let mut unlisted = 0;
        for n in 0..=u32::MAX {
            let candidate = candidate(name, n, NAME_MAX);
            if taken.contains_key(&candidate) {
                continue;
            }
            // Free when listed, unless written since: by this delivery's
            // filing (a holder paused meanwhile) or another's.
            if put(&candidate)? {
                return filed(candidate, true);
            }
            unlisted += 1;
            if unlisted == 1000 {
                break;
            }
            if self.filed_for((folder, &candidate), name, delivery)? {
                return filed(candidate, false);
            }
        }
        Err(s3::Error::Protocol {
            root: self.label().to_owned(),
            what: format!(
                "{folder}/{name}: a thousand names a result of it can have were found taken though no listing showed them; is the server's listing up to date?"
            ),
        })
    }

    /// The names below `folder` that results of bundle `name` can have
    /// taken (`name`, `name.1`, …), each with when its result was written
    /// (`None`: a folder without one, being filed or deleted).
    fn taken_names(
        &self,
        folder: &str,
        name: &str,
    ) -> s3::Result<std::collections::BTreeMap<String, Option<OffsetDateTime>>> {
        use crate::spool::names::{NAME_MAX, index_of, stem};
        let listed = self
            .root
            .list_starting(folder, &format!("{folder}/{}", stem(name, NAME_MAX)))?;
        let strip = format!("{folder}/");
        let mut taken = std::collections::BTreeMap::new();
        for o in listed {
            let Some((candidate, file)) = o
                .path
                .strip_prefix(&strip)
                .and_then(|rest| rest.split_once('/'))
            else {
                continue;
            };
            if index_of(name, candidate, NAME_MAX).is_none() {
                continue;
            }
            let written = taken.entry(candidate.to_owned()).or_insert(None);
            if file == RESULT {
                *written = Some(o.last_modified);
            }
        }
        Ok(taken)
    }

    /// Whether the result `folder/filed` was written for `delivery` of
    /// bundle `name`: the `intake.name` it records is `name`, its
    /// `intake.manifest_etag` that version, and its
    /// `intake.manifest_last_modified` that second (a result that does not
    /// record one, and a delivery whose second is not known, are compared
    /// by version only). The same bytes uploaded again after their filing
    /// are a new delivery: it is published again, and filed apart.
    pub fn filed_for(
        &self,
        (folder, filed): (&str, &str),
        name: &str,
        (etag, at): Delivery<'_>,
    ) -> s3::Result<bool> {
        let Some(recorded) = self.recorded(folder, filed)? else {
            return Ok(false);
        };
        let Some(version) = recorded.manifest_etag else {
            return Ok(false);
        };
        if recorded.name.is_some_and(|n| n != name) {
            return Ok(false);
        }
        if !same_version(&ETag(version), etag) {
            return Ok(false);
        }
        Ok(match (recorded.manifest_at, at) {
            (Some(a), Some(b)) => same_second(a, b),
            _ => true,
        })
    }

    /// What the result `folder/filed` records of the delivery it was
    /// filed for (its `intake` object); `None` without a result that
    /// parses.
    fn recorded(&self, folder: &str, filed: &str) -> s3::Result<Option<Recorded>> {
        let Some(doc) = self.result(folder, filed)? else {
            return Ok(None);
        };
        let text = |key: &str| Some(doc.get("intake")?.get(key)?.as_str()?.to_owned());
        Ok(Some(Recorded {
            name: text("name"),
            manifest_etag: text("manifest_etag"),
            manifest_at: text("manifest_last_modified")
                .and_then(|t| crate::catalog::parse_time(&t).ok()),
        }))
    }

    /// The name in `failed/` of the failure that left behind the objects
    /// of bundle `name` still in the inbox, the newest of them written at
    /// `newest` (objects the server would not copy beside it): its newest
    /// failed result, recording `name` and a manifest written no earlier
    /// than the objects (a producer uploads a bundle's files before its
    /// manifest). `None` for objects of a delivery still under way, and
    /// for a failure that does not record its manifest's time.
    pub fn left_behind_by(&self, name: &str, newest: OffsetDateTime) -> s3::Result<Option<String>> {
        let newest_result = self
            .taken_names(FAILED, name)?
            .into_iter()
            .filter_map(|(filed, written)| Some((written?, filed)))
            .max();
        let Some((written, filed)) = newest_result else {
            return Ok(None);
        };
        if written < newest {
            return Ok(None);
        }
        let Some(recorded) = self.recorded(FAILED, &filed)? else {
            return Ok(None);
        };
        let before_manifest = recorded
            .manifest_at
            .filter(|at| *at > OffsetDateTime::UNIX_EPOCH)
            .is_some_and(|at| newest.unix_timestamp() <= at.unix_timestamp());
        Ok((recorded.name.as_deref() == Some(name) && before_manifest).then_some(filed))
    }

    /// Copies a failed bundle's objects beside its result (server-side).
    /// One gone from the inbox meanwhile (the producer deleted it, or a
    /// new delivery dropped it) is not copied: its failure says so. One
    /// the server refuses to copy for good (S3 copies at most 5 GiB in one
    /// request; a policy that denies it) is returned with why: it stays in
    /// the inbox. An outage is an error (the filing is tried again).
    pub fn copy_to_failed(
        &self,
        name: &str,
        filed: &str,
        objects: &[Listed],
    ) -> s3::Result<Vec<(String, s3::Error)>> {
        let mut refused = Vec::new();
        for o in objects {
            if o.path == RESULT {
                continue;
            }
            let from = Bucket::key(INBOX, name, &o.path);
            if !self.root.addresses(&from) {
                refused.push((
                    o.path.clone(),
                    s3::Error::Protocol {
                        root: self.label().to_owned(),
                        what: UNNAMED.to_owned(),
                    },
                ));
                continue;
            }
            match self
                .root
                .copy_within(&from, &Bucket::key(FAILED, filed, &o.path))
            {
                Ok(()) => {}
                Err(e) if self.root.head(&from).is_ok_and(|h| h.is_none()) => {
                    log::debug!("{from}: gone, not copied ({e})");
                }
                Err(e) if !e.is_transient() => refused.push((o.path.clone(), e)),
                Err(e) => return Err(e),
            }
        }
        Ok(refused)
    }

    /// The objects below `inbox/<name>/` now, by path (`None`: more than
    /// a page of a listing and more than `objects` and a few more), for
    /// [`Bucket::remove_unchanged`].
    pub fn inbox_now(
        &self,
        name: &str,
        objects: &[Listed],
    ) -> s3::Result<Option<HashMap<String, Listed>>> {
        let most = objects.len().saturating_add(16).max(DELETES_A_REQUEST);
        Ok(self
            .objects(INBOX, name, most)?
            .map(|listed| listed.into_iter().map(|o| (o.path.clone(), o)).collect()))
    }

    /// Removes a finished bundle from the inbox: its manifest first, then
    /// the rest of what was listed, in one request when it fits. Only
    /// objects that `now` (a listing taken since the probe; `None` when it
    /// held more than a page) shows as `objects` listed them go: same
    /// size, version and `Last-Modified`. An object uploaded again since
    /// (even with the same bytes) belongs to a new delivery under way, and
    /// nothing goes once the manifest was replaced: the new delivery is
    /// left whole, and its own filing removes what the first left. The
    /// same bytes uploaded again whole (a newer manifest, same version)
    /// are the same delivery, and go. Returns how many listed objects
    /// were left.
    pub fn remove_unchanged(
        &self,
        name: &str,
        (objects, version): (&[Listed], &ETag),
        now: Option<&HashMap<String, Listed>>,
    ) -> s3::Result<usize> {
        let manifest_key = Bucket::key(INBOX, name, MANIFEST);
        let probed = objects.iter().find(|o| o.path == MANIFEST);
        let Some(now) = now.filter(|_| !objects.is_empty()) else {
            // Failed before it was listed (its name, a prefix of too many
            // objects), or more objects than a page now (a new delivery
            // under way): only the manifest goes, if it is still the one
            // probed (`version`; any, for a bundle failed before its
            // manifest was read), so that this delivery is no bundle.
            let head = self.root.head(&manifest_key)?;
            let same = head
                .as_ref()
                .is_some_and(|h| version.0.is_empty() || same_version(version, &h.etag));
            if same {
                self.root.delete(&manifest_key)?;
            }
            return Ok(objects
                .len()
                .saturating_sub(usize::from(probed.is_some() && same)));
        };
        let manifest_now = now.get(MANIFEST);
        let delivered_again =
            matches!((probed, manifest_now), (Some(p), Some(n)) if !same_bytes(p, n));
        // Uploaded again whole: the files written up to the new manifest's
        // second are that upload's; a later one is a new delivery's.
        let again_whole = match (probed, manifest_now) {
            (Some(p), Some(n))
                if same_bytes(p, n) && !same_second(p.last_modified, n.last_modified) =>
            {
                Some(n.last_modified.unix_timestamp())
            }
            _ => None,
        };
        let unchanged = |o: &Listed| {
            now.get(&o.path).is_some_and(|n| {
                same_bytes(o, n)
                    && (same_second(o.last_modified, n.last_modified)
                        || again_whole.is_some_and(|m| n.last_modified.unix_timestamp() <= m))
            })
        };
        let manifest = objects.iter().filter(|o| o.path == MANIFEST);
        let files = objects.iter().filter(|o| o.path != MANIFEST);
        let mut keys = Vec::new();
        let mut left = 0;
        for o in manifest.chain(files) {
            let key = Bucket::key(INBOX, name, &o.path);
            if !self.root.addresses(&key) {
                log::warn!(
                    "{}: {}: {UNNAMED}; it stays in the inbox: delete it with an S3 client",
                    self.label(),
                    crate::text::escape::inert(&key)
                );
            } else if unchanged(o) && !delivered_again {
                keys.push(key);
            } else if now.contains_key(&o.path) {
                left += 1;
            }
        }
        // The server deletes a request's keys whatever becomes of the
        // agent, and a filing that fails on any key is tried again from a
        // new listing. More keys than one request takes go side by side:
        // the manifest goes first, on its own.
        let mut rels: Vec<&str> = keys.iter().map(String::as_str).collect();
        if rels.len() > DELETES_A_REQUEST && rels.first() == Some(&manifest_key.as_str()) {
            self.root.delete(&manifest_key)?;
            rels.remove(0);
        }
        self.root.delete_many(&rels)?;
        Ok(left)
    }

    /// The results below `folder`: name, result object (when there is
    /// one) and when it was written.
    pub fn results(&self, folder: &str) -> s3::Result<Vec<Finished>> {
        let mut names = self.root.list_level(folder)?.folders;
        names.retain(|n| self.root.addresses(&Bucket::key(folder, n, RESULT)));
        let keys: Vec<String> = names
            .iter()
            .map(|n| Bucket::key(folder, n, RESULT))
            .collect();
        let mut out = Vec::new();
        for (name, key) in names.iter().zip(&keys) {
            let got = self.root.get_small(key, RESULT_CAP)?;
            let when = got.as_ref().map(|s| s.last_modified);
            let doc = got.and_then(|s| serde_json::from_slice(&s.bytes).ok());
            out.push(Finished {
                name: name.clone(),
                result: doc,
                at: when,
            });
        }
        Ok(out)
    }

    /// The names below `folder` that have a result, each with when it was
    /// written, oldest first: one LIST per thousand objects and no GET
    /// (`done/` can hold a week of bundles), for `spool list` and `status`.
    pub fn filed(&self, folder: &str) -> s3::Result<Vec<(String, OffsetDateTime)>> {
        let all = self.root.list_at_most(folder, usize::MAX)?;
        let (strip, tail) = (format!("{folder}/"), format!("/{RESULT}"));
        let mut out: Vec<(String, OffsetDateTime)> = all
            .unwrap_or_default()
            .into_iter()
            .filter_map(|o| {
                let name = o.path.strip_prefix(&strip)?.strip_suffix(&tail)?;
                (!name.contains('/')).then(|| (name.to_owned(), o.last_modified))
            })
            .collect();
        out.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
        Ok(out)
    }

    /// The result of `folder/name`, if there is one.
    pub fn result(&self, folder: &str, name: &str) -> s3::Result<Option<serde_json::Value>> {
        let got = self
            .root
            .get_small(&Bucket::key(folder, name, RESULT), RESULT_CAP)?;
        Ok(got.and_then(|s| serde_json::from_slice(&s.bytes).ok()))
    }

    /// Every object of `folder/name` (at most `most`; `None` beyond).
    pub fn objects(
        &self,
        folder: &str,
        name: &str,
        most: usize,
    ) -> s3::Result<Option<Vec<Listed>>> {
        let prefix = format!("{folder}/{name}");
        Ok(self
            .root
            .list_at_most(&prefix, most)?
            .map(|listed| below(&prefix, listed)))
    }

    /// Deletes every object of `folder/name` (the result last, so that a
    /// listing never shows a result without its files).
    pub fn delete_all(&self, folder: &str, name: &str, objects: &[Listed]) -> s3::Result<()> {
        let rest: Vec<String> = objects
            .iter()
            .filter(|o| o.path != RESULT)
            .map(|o| Bucket::key(folder, name, &o.path))
            .filter(|key| self.root.addresses(key))
            .collect();
        let rels: Vec<&str> = rest.iter().map(String::as_str).collect();
        self.root.delete_many(&rels)?;
        self.root.delete(&Bucket::key(folder, name, RESULT))
    }

    /// `spool retry` of a failed bundle: copies its files back into the
    /// inbox (its manifest last), then deletes it from `failed/`. The name
    /// in the inbox is the failed one; a name taken there is refused.
    pub fn retry(&self, name: &str, most: usize) -> Result<(), String> {
        let objects = self
            .objects(FAILED, name, most)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("{FAILED}/{name} holds more than {most} objects"))?;
        if objects.is_empty() {
            return Err(format!("no failed bundle {name} in {}", self.label()));
        }
        if !objects.iter().any(|o| o.path == MANIFEST) {
            return Err(format!(
                "{FAILED}/{name} has no {MANIFEST}: nothing to retry; deliver the bundle again"
            ));
        }
        let taken = self.objects(INBOX, name, 1).map_err(|e| e.to_string())?;
        if taken.is_none_or(|v| !v.is_empty()) {
            return Err(format!(
                "the inbox already has a bundle {name}; wait until it is finished, or delete it"
            ));
        }
        let mut order: Vec<&Listed> = objects.iter().filter(|o| o.path != RESULT).collect();
        order.sort_by_key(|o| match o.path.as_str() {
            MANIFEST => 2,
            SIGNATURE => 1,
            _ => 0,
        });
        for o in order {
            (self.root)
                .copy_within(
                    &Bucket::key(FAILED, name, &o.path),
                    &Bucket::key(INBOX, name, &o.path),
                )
                .map_err(|e| e.to_string())?;
        }
        self.delete_all(FAILED, name, &objects)
            .map_err(|e| e.to_string())
    }

    /// Deletes results below `done/` written longer than `retention` ago
    /// (server time): how many went.
    pub fn expire_done(&self, retention: std::time::Duration) -> s3::Result<usize> {
        // One listing of done/ (a thousand objects a request), grouped by
        // bundle, rather than a request per bundle.
        let Some(all) = self.root.list_at_most(DONE, 10_000_000)? else {
            return Ok(0);
        };
        if all.is_empty() {
            return Ok(0);
        }
        let mut by_name: std::collections::BTreeMap<&str, Vec<&Listed>> = Default::default();
        for o in &all {
            let rest = o.path.strip_prefix("done/").unwrap_or(&o.path);
            let name = rest.split('/').next().unwrap_or(rest);
            by_name.entry(name).or_default().push(o);
        }
        let now = self.root.server_now()?;
        let mut gone = 0;
        for (name, objects) in by_name {
            // A name no request can name (no agent files one): left alone,
            // as the client would name another bundle's keys.
            if !self.root.addresses(&Bucket::key(DONE, name, RESULT)) {
                continue;
            }
            let newest = objects.iter().map(|o| o.last_modified).max();
            if newest.is_some_and(|t| now - t > retention) {
                let strip = format!("{DONE}/{name}/");
                let objects: Vec<Listed> = objects
                    .into_iter()
                    .map(|o| Listed {
                        path: o.path.strip_prefix(&strip).unwrap_or(&o.path).to_owned(),
                        ..o.clone()
                    })
                    .collect();
                self.delete_all(DONE, name, &objects)?;
                gone += 1;
            }
        }
        Ok(gone)
    }

    /// `spool hold`: since when, or `None` when not held.
    pub fn held(&self, controls: &HashMap<String, Listed>) -> Option<OffsetDateTime> {
        controls.get(HOLD_KEY).map(|o| o.last_modified)
    }

    /// Places a hold (`spool hold`).
    pub fn hold(&self) -> s3::Result<()> {
        match self
            .root
            .put_new(HOLD_KEY, &mut &b"held\n"[..], None, "hold")
        {
            Ok(_) | Err(s3::Error::Exists { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Lifts a hold (`spool release`).
    pub fn release(&self) -> s3::Result<()> {
        self.root.delete(HOLD_KEY)
    }

    /// Asks for a deferred bundle's next try now (`spool flush`).
    pub fn flush(&self) -> s3::Result<()> {
        match self
            .root
            .put_new(FLUSH_KEY, &mut &b"flush\n"[..], None, "flush")
        {
            Ok(_) | Err(s3::Error::Exists { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Takes a flush request: true when there was one.
    pub fn take_flush(&self, controls: &HashMap<String, Listed>) -> s3::Result<bool> {
        if !controls.contains_key(FLUSH_KEY) {
            return Ok(false);
        }
        self.root.delete(FLUSH_KEY)?;
        Ok(true)
    }
}

/// What a holder's publication about to commit owes: the hooks of the
/// bundle `name`, as delivered (its manifest's version).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Committing {
    pub name: String,
    pub manifest_etag: String,
    pub hooks: Vec<crate::hooks::Owed>,
}

impl Bucket {
    /// Every record of a publication about to commit, by bundle name (at
    /// most a thousand; unreadable ones are skipped).
    pub fn committing(&self) -> s3::Result<HashMap<String, Committing>> {
        let listed = self
            .root
            .list_at_most(COMMITTING, 1000)?
            .unwrap_or_default();
        let mut out = HashMap::new();
        for o in listed {
            if let Some(small) = self.root.get_small(&o.path, 1 << 20)?
                && let Ok(c) = serde_json::from_slice::<Committing>(&small.bytes)
            {
                out.insert(c.name.clone(), c);
            }
        }
        Ok(out)
    }

    fn committing_key(name: &str) -> String {
        format!("{COMMITTING}/{name}")
    }

    /// Records `c` (over an earlier record of that name).
    pub fn mark_committing(&self, c: &Committing) -> s3::Result<()> {
        let key = Bucket::committing_key(&c.name);
        self.root.delete(&key)?;
        let bytes = serde_json::to_vec(c).expect("a record serializes");
        self.root
            .put_new(&key, &mut &bytes[..], None, "committing")?;
        Ok(())
    }

    /// Forgets the record of bundle `name` (filed: its hooks ran).
    pub fn unmark_committing(&self, name: &str) -> s3::Result<()> {
        self.root.delete(&Bucket::committing_key(name))
    }
}

/// The most objects a bundle's listing holds before the bundle fails:
/// `limits.max_files`, its manifest and signature, and room for a few
/// unlisted objects.
pub fn most_objects(limits: &Limits) -> usize {
    usize::try_from(limits.max_files.saturating_add(16)).unwrap_or(usize::MAX)
}

/// `listed` (objects below `prefix`) with their paths below it. A folder
/// marker (`<prefix>/`, an empty object a bucket console's "Create
/// folder" makes, listed by `object_store` without its slash) is no
/// object of it.
fn below(prefix: &str, listed: Vec<Listed>) -> Vec<Listed> {
    let strip = format!("{prefix}/");
    listed
        .into_iter()
        .filter(|o| o.path != prefix)
        .map(|mut o| {
            o.path = o.path.strip_prefix(&strip).unwrap_or(&o.path).to_owned();
            o
        })
        .collect()
}

/// Whether two listings of an object show the same bytes: its size, and
/// its ETag (its `Last-Modified` second where a listing gives none).
fn same_bytes(o: &Listed, n: &Listed) -> bool {
    n.size == o.size
        && match (&n.etag, &o.etag) {
            (Some(a), Some(b)) => same_etag(a, b),
            _ => same_second(n.last_modified, o.last_modified),
        }
}

/// Whether two ETags name one version: equal, quotes aside (a listing
/// and a response header may quote them differently).
fn same_etag(a: &str, b: &str) -> bool {
    a.trim_matches('"') == b.trim_matches('"')
}

/// Whether `e` is a request the client could not make sense of (a key it
/// cannot take): not an outage, and not the bucket's refusal either.
pub fn unreadable(e: &s3::Error) -> bool {
    s3::bucket::unparsed(e)
}

/// Whether the server refuses one object for good: access denied to it, or
/// another client error (a key it cannot decrypt, an archived storage
/// class). Not refused credentials or a missing bucket. S3 answers 403 to
/// a bad signature too: the agent fails a bundle for it only when the
/// server answers it otherwise (it read the bundle's manifest, and reads
/// the lease right after), else waits it out.
pub fn refused(e: &s3::Error) -> bool {
    match e {
        s3::Error::Store { failure, .. } => match failure {
            s3::Failure::Denied => true,
            s3::Failure::Status(s) => (400..500).contains(s) && !failure.is_transient(),
            _ => false,
        },
        _ => false,
    }
}

/// [`same_etag`] of two versions.
pub fn same_version(a: &ETag, b: &ETag) -> bool {
    same_etag(&a.0, &b.0)
}

/// Whether two manifests are one delivery: the same version, written in
/// the same second (the same bytes uploaded again are a new delivery).
pub fn same_delivery(a: (&ETag, OffsetDateTime), b: (&ETag, OffsetDateTime)) -> bool {
    same_version(a.0, b.0) && same_second(a.1, b.1)
}

/// Two `Last-Modified` times of one object, to the second (a listing
/// may carry milliseconds that a response header does not).
fn same_second(a: OffsetDateTime, b: OffsetDateTime) -> bool {
    a.unix_timestamp() == b.unix_timestamp()
}

/// What a result records of the delivery it was filed for.
struct Recorded {
    name: Option<String>,
    manifest_etag: Option<String>,
    manifest_at: Option<OffsetDateTime>,
}

/// Why a bundle could not be brought into `work/`.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("{0}")]
    Bucket(#[from] s3::Error),
    #[error("cannot write the bundle into work/: {0}")]
    Local(#[from] std::io::Error),
}

impl FetchError {
    /// An object was replaced since the probe listed it: the bundle is
    /// being delivered again, and is probed again rather than failed.
    pub fn changed(&self) -> bool {
        matches!(self, FetchError::Bucket(s3::Error::Changed { .. }))
    }
}

#[cfg(test)]
mod tests;
