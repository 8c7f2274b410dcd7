//! Reading the manifest of a bundle folder and checking the listed files
//! against it: [`verify`] (hashes included), [`inspect`] (sizes only) and
//! [`verify_files`]. Reads only; it never writes or moves anything.

use super::error::{BundleError, Problem};
use super::limits::{Limits, check_limits};
use super::manifest::{Manifest, ManifestFile};
use super::open::{
    EntryError, LastFolder, UnopenedFile, display_segments, kind_label, open_bundle_dir,
    open_checked_in, open_file_nofollow, raced_message, size_checked_in, walk,
};
use super::parse::{parse_manifest, too_big};
use super::{MANIFEST, MAX_MANIFEST_BYTES, MAX_WARNINGS};
use crate::fs::hashing;
use crate::runtime::workers::{Workers, map_on};
use crate::signature::{
    AllowedSigners, MAX_SIGNATURE_BYTES, Reason, SIGNATURE_FILE, SignatureRefusal, Signer,
};
use cap_std::fs::Dir;
use std::collections::HashSet;
use std::ffi::OsStr;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// A bundle whose every listed file matched its size and hash when checked.
#[derive(Debug)]
pub struct VerifiedBundle {
    pub dir: PathBuf,
    pub manifest: Manifest,
    /// Things worth telling the producer that do not make the bundle
    /// invalid, such as files present but not listed.
    pub warnings: Vec<String>,
    /// Who signed it, when the pipeline checks signatures and it is signed.
    pub signer: Option<Signer>,
}

/// Reads and parses `dir/manifest.json`, which must be a regular file (not a
/// link) of at most [`MAX_MANIFEST_BYTES`].
pub fn read_manifest(dir: &Path) -> Result<Manifest, BundleError> {
    let root = open_bundle_dir(dir)?;
    read_manifest_at(&root, dir, MAX_MANIFEST_BYTES)
}

/// [`read_manifest`] for a bundle folder that is already open, reading at
/// most `cap` bytes; `dir` is only used in messages.
pub fn read_manifest_at(root: &Dir, dir: &Path, cap: u64) -> Result<Manifest, BundleError> {
    parse_manifest(&read_manifest_bytes(root, dir, cap)?)
}

/// The exact bytes of `manifest.json` (what a signature covers), read
/// without following a link, at most `cap` of them.
pub(super) fn read_manifest_bytes(
    root: &Dir,
    dir: &Path,
    cap: u64,
) -> Result<Vec<u8>, BundleError> {
    let path = dir.join(MANIFEST);
    let unreadable = |message: String, io: Option<io::Error>| BundleError::Unreadable {
        path: path.clone(),
        message,
        io,
    };
    let file = open_file_nofollow(root, OsStr::new(MANIFEST)).map_err(|e| match e {
        EntryError::Missing => unreadable(
            "not found; a bundle is complete only once its manifest.json exists (write it last, or run `distributor bundle seal`)".to_owned(),
            None,
        ),
        EntryError::Kind(kind) => unreadable(
            format!("is {kind}; the manifest must be a regular file, never a link or special file"),
            None,
        ),
        EntryError::HardLink(n) => unreadable(
            format!(
                "is a hard link ({n} names for one file); write the manifest as a new file (temporary name + rename), never as a link"
            ),
            None,
        ),
        EntryError::Raced => unreadable(raced_message(), None),
        EntryError::Io(e) => unreadable(format!("cannot open: {e}"), Some(e)),
    })?;
    read_capped(file, cap)
        .map_err(|e| unreadable(format!("cannot read: {e}"), Some(e)))?
        .map_err(|len| too_big(len, cap))
}

/// At most `cap` bytes of `file`: `Ok(Err(size))` when it holds more.
fn read_capped(mut file: std::fs::File, cap: u64) -> io::Result<Result<Vec<u8>, u64>> {
    let len = file.metadata()?.len();
    if len > cap {
        return Ok(Err(len));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    (&mut file).take(cap + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > cap {
        return Ok(Err(bytes.len() as u64));
    }
    Ok(Ok(bytes))
}

/// What a pipeline asks of its bundles' signatures (docs/contract.md §17.4).
#[derive(Debug, Clone, Copy)]
pub struct SignaturePolicy<'a> {
    pub signers: &'a AllowedSigners,
    /// The namespace the signature must be made in.
    pub namespace: &'a str,
    /// Refuse a bundle without `manifest.json.sig`; a signature that is
    /// there is checked either way.
    pub required: bool,
}

/// Checks `manifest.json.sig` over `manifest` (the bytes just read) as
/// `policy` asks: who signed, `None` for an unsigned bundle that the
/// policy lets through.
fn check_signature(
    root: &Dir,
    dir: &Path,
    manifest: &[u8],
    policy: SignaturePolicy<'_>,
) -> Result<Option<Signer>, BundleError> {
    let signature = read_signature(root, dir)?;
    if signature.is_none() && !policy.required {
        return Ok(None);
    }
    let now = time::OffsetDateTime::now_utc();
    crate::signature::check(
        manifest,
        signature.as_deref(),
        policy.signers,
        policy.namespace,
        now,
    )
    .map(Some)
    .map_err(BundleError::Signature)
}

/// The bytes of `manifest.json.sig`, `None` when there is none. Read like
/// the manifest: no link, no special file, at most
/// [`MAX_SIGNATURE_BYTES`]; anything else is refused as malformed.
pub(super) fn read_signature(root: &Dir, dir: &Path) -> Result<Option<Vec<u8>>, BundleError> {
    let refused =
        |message: String| BundleError::Signature(SignatureRefusal::new(Reason::Malformed, message));
    Ok(match open_file_nofollow(root, OsStr::new(SIGNATURE_FILE)) {
        Ok(file) => match read_capped(file, MAX_SIGNATURE_BYTES) {
            Ok(Ok(bytes)) => Some(bytes),
            Ok(Err(len)) => {
                return Err(refused(format!(
                    "is {len} bytes, more than {MAX_SIGNATURE_BYTES}: not a signature (what `ssh-keygen -Y sign` writes is under 3 KiB); sign manifest.json again"
                )));
            }
            Err(e) => return Err(unreadable_signature(dir, e)),
        },
        Err(EntryError::Missing) => None,
        Err(EntryError::Kind(kind)) => {
            return Err(refused(format!(
                "is {kind}; the signature must be a regular file, never a link or special file"
            )));
        }
        Err(EntryError::HardLink(n)) => {
            return Err(refused(format!(
                "is a hard link ({n} names for one file); write the signature as a new file"
            )));
        }
        Err(EntryError::Raced) => return Err(refused(raced_message())),
        Err(EntryError::Io(e)) => return Err(unreadable_signature(dir, e)),
    })
}

/// A signature that cannot be read: refused when the producer made it
/// unreadable (it stays so), else a passing failure tried again later.
fn unreadable_signature(dir: &Path, e: io::Error) -> BundleError {
    if e.kind() == io::ErrorKind::PermissionDenied {
        return BundleError::Signature(SignatureRefusal::new(
            Reason::Malformed,
            format!(
                "cannot be read by the agent ({e}); deliver it readable by the agent's group (chmod g+r), as docs/security.md describes"
            ),
        ));
    }
    BundleError::Unreadable {
        path: dir.join(SIGNATURE_FILE),
        message: format!("cannot read: {e}; the bundle is tried again later"),
        io: Some(e),
    }
}

/// Fully checks the bundle in `dir`: parses the manifest (digest included),
/// then opens and hashes every listed file, streaming. Every problem found is
/// reported, not only the first. Unlisted files become warnings.
pub fn verify(
    dir: &Path,
    limits: &Limits,
    signatures: Option<SignaturePolicy<'_>>,
    workers: &dyn Workers,
) -> Result<VerifiedBundle, BundleError> {
    check(dir, limits, signatures, true, workers)
}

/// Checks everything [`verify`] does except the file hashes: the manifest,
/// and that every listed file is a regular file (reached without a symlink)
/// of the declared size. Publication uses it to read each file only once,
/// hashing while it copies, and calls [`verify_files`] for the rest.
pub fn inspect(
    dir: &Path,
    limits: &Limits,
    signatures: Option<SignaturePolicy<'_>>,
    workers: &dyn Workers,
) -> Result<VerifiedBundle, BundleError> {
    check(dir, limits, signatures, false, workers)
}

/// Hashes the given listed files and checks them against the manifest;
/// every problem is reported.
pub fn verify_files(
    dir: &Path,
    files: &[&ManifestFile],
    workers: &dyn Workers,
) -> Result<(), BundleError> {
    let root = open_bundle_dir(dir)?;
    let problems = check_all(&root, dir, files, true, workers)?;
    if problems.is_empty() {
        Ok(())
    } else {
        Err(BundleError::Invalid { problems })
    }
}

/// The problem reported when a file's bytes do not hash to the manifest's.
pub fn mismatch_problem(listed: &ManifestFile, actual: &hashing::Hashed) -> Problem {
    let message = if actual.size != listed.size {
        format!(
            "size is {} bytes but {MANIFEST} says {}; the file is incomplete or changed after the manifest was written (deliver it complete, or re-seal the bundle)",
            actual.size, listed.size
        )
    } else {
        format!(
            "content does not match: {MANIFEST} says {}, the file hashes to {}; fix the file or re-seal the bundle",
            listed.sha256, actual.sha256
        )
    };
    Problem::at(listed.path.as_str(), message)
}

/// Reads the manifest, checks its signature when `signatures` asks for
/// one (before anything else in it is looked at), then checks the listed
/// files, hashing them with `hash`.
fn check(
    dir: &Path,
    limits: &Limits,
    signatures: Option<SignaturePolicy<'_>>,
    hash: bool,
    workers: &dyn Workers,
) -> Result<VerifiedBundle, BundleError> {
    let root = open_bundle_dir(dir)?;
    let bytes = read_manifest_bytes(&root, dir, limits.max_manifest_bytes())?;
    let signer = match signatures {
        Some(policy) => check_signature(&root, dir, &bytes, policy)?,
        None => None,
    };
    let manifest = parse_manifest(&bytes)?;
    drop(bytes);
    check_limits(&manifest, limits)?;
    let listed: Vec<&ManifestFile> = manifest.files.iter().collect();
    let problems = check_all(&root, dir, &listed, hash, workers)?;
    if !problems.is_empty() {
        return Err(BundleError::Invalid { problems });
    }
    let warnings = unlisted_warnings(&root, &manifest);
    Ok(VerifiedBundle {
        dir: dir.to_path_buf(),
        manifest,
        warnings,
        signer,
    })
}

/// From this many listed files on, they are checked on several threads.
const PARALLEL_FROM: usize = 64;

/// How many neighbouring files a thread checks at a time: neighbours in a
/// manifest usually share a folder, which is then walked to once.
const RUN: usize = 32;

/// Checks every file of `files` ([`check_listed`]), on `workers` for a
/// long list. Returns the problems in the order of `files`; an
/// `Err` (a passing I/O failure) is the first one in that order.
fn check_all(
    root: &Dir,
    dir: &Path,
    files: &[&ManifestFile],
    hash: bool,
    workers: &dyn Workers,
) -> Result<Vec<Problem>, BundleError> {
    let check_run = |run: &[&ManifestFile]| {
        let mut last = LastFolder::default();
        run.iter()
            .map(|f| check_listed(root, dir, f, hash, &mut last))
            .collect::<Vec<_>>()
    };
    let results = if files.len() < PARALLEL_FROM {
        check_run(files)
    } else {
        let runs: Vec<&[&ManifestFile]> = files.chunks(RUN).collect();
        map_on(workers, &runs, |run| check_run(run))
            .into_iter()
            .flatten()
            .collect()
    };
    let mut problems = Vec::new();
    for result in results {
        problems.extend(result?);
    }
    Ok(problems)
}

/// Checks one listed file. `Ok(Some(..))` is a problem with the bundle;
/// `Err` is a passing I/O failure that makes the whole check unreliable.
/// `last` keeps the folder walked to for the next file.
fn check_listed(
    root: &Dir,
    dir: &Path,
    listed: &ManifestFile,
    hash: bool,
    last: &mut LastFolder,
) -> Result<Option<Problem>, BundleError> {
    let transient = |problem: Problem, e: io::Error| BundleError::Unreadable {
        path: dir.join(listed.path.as_str()),
        message: format!("{}; try again later", problem.message),
        io: Some(e),
    };
    let refused = |refusal: UnopenedFile| match refusal.into_error(dir, &listed.path) {
        BundleError::Invalid { mut problems } => Ok(problems.pop()),
        transient => Err(transient),
    };
    let declared = listed.size;
    if !hash {
        let size = match size_checked_in(root, &listed.path, last) {
            Ok(size) => size,
            Err(refusal) => return refused(refusal),
        };
        return Ok((size != declared).then(|| {
            Problem::at(
                listed.path.as_str(),
                format!(
                    "size is {size} bytes but {MANIFEST} says {declared}; the file is incomplete or changed after the manifest was written (deliver it complete, or re-seal the bundle)"
                ),
            )
        }));
    }
    let mut file = match open_checked_in(root, &listed.path, last) {
        Ok(file) => file,
        Err(refusal) => return refused(refusal),
    };
    let hashed = match hashing::copy_hashed(&mut file, None, Some(declared)) {
        Ok(hashed) => hashed,
        Err(e) => {
            let problem = Problem::at(listed.path.as_str(), format!("cannot read: {e}"));
            if crate::fs::io_class::is_transient_reading_bundle(&e) {
                return Err(transient(problem, e));
            }
            return Ok(Some(problem));
        }
    };
    let problem = if hashed.size != declared {
        let (actual, more) = if hashed.size > declared {
            match file.metadata().map(|m| m.len()) {
                Ok(len) if len > declared => (len, ""),
                _ => (hashed.size, "at least "),
            }
        } else {
            (hashed.size, "")
        };
        Some(format!(
            "size is {more}{actual} bytes but {MANIFEST} says {declared}; the file is incomplete or changed after the manifest was written (deliver it complete, or re-seal the bundle)"
        ))
    } else if hashed.sha256 != listed.sha256 {
        Some(format!(
            "content does not match: {MANIFEST} says {}, the file hashes to {}; fix the file or re-seal the bundle",
            listed.sha256, hashed.sha256
        ))
    } else {
        None
    };
    Ok(problem.map(|message| Problem::at(listed.path.as_str(), message)))
}

fn unlisted_warnings(root: &Dir, manifest: &Manifest) -> Vec<String> {
    let listed: HashSet<&str> = manifest.files.iter().map(|f| f.path.as_str()).collect();
    let mut warnings = Vec::new();
    let mut unlisted = 0usize;
    let result = walk(root, &mut |segments, ft| {
        if ft.is_dir() {
            return true;
        }
        let shown = display_segments(segments);
        if listed.contains(shown.as_str()) {
            return false;
        }
        unlisted += 1;
        if warnings.len() < MAX_WARNINGS {
            warnings.push(if ft.is_file() {
                format!("{shown}: present but not listed in {MANIFEST}; ignored")
            } else {
                format!(
                    "{shown}: {} present but not listed in {MANIFEST}; ignored",
                    kind_label(ft)
                )
            });
        }
        false
    });
    if unlisted > warnings.len() {
        warnings.push(format!(
            "{} more entries present but not listed in {MANIFEST}; ignored",
            unlisted - warnings.len()
        ));
    }
    if let Err((path, e)) = result {
        warnings.push(format!(
            "{path}: could not be listed while looking for unlisted files: {e}"
        ));
    }
    warnings
}
