//! Sealing a folder into a bundle for producers: [`seal_report`], [`sign`] and
//! [`SealError`]. It must never write anything but `manifest.json` and its
//! signature `manifest.json.sig`, each through a reserved temporary name,
//! and never leave a signature of an earlier manifest behind.

use super::MANIFEST;
use super::error::Problem;
use super::manifest::{Manifest, ManifestFile, compute_digest, normalise_created};
use super::open::{kind_label, open_checked, walk};
use crate::fs::hashing;
use crate::fs::replace_file::{self, Durability, Temp};
use crate::paths::{IdKind, RelPath, check_id, is_reserved_name};
use crate::signature::SIGNATURE_FILE;
use crate::text::escape::{inert, inert_os};
use cap_std::ambient_authority;
use cap_std::fs::Dir;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use time::OffsetDateTime;
use unicode_normalization::UnicodeNormalization;

/// Why `seal` did not write a manifest.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("invalid --id: {reason}")]
    BadId { id: String, reason: String },
    #[error("invalid --created: {reason}")]
    BadCreated { reason: String },
    #[error("{}: cannot read: {io}", path.display())]
    Unreadable { path: PathBuf, io: io::Error },
    /// Entries that cannot be sealed; the message lists each on its own
    /// line, then what to do about each kind of problem found.
    #[error("{}", refused_text(.dir, .problems, .hints))]
    Refused {
        dir: PathBuf,
        problems: Vec<Problem>,
        /// What to do, one line per kind of problem present.
        hints: Vec<&'static str>,
    },
    #[error(
        "{}: nothing to seal: the folder holds no regular file besides {MANIFEST} and reserved .distributor* names",
        dir.display()
    )]
    Empty { dir: PathBuf },
    #[error("{}: cannot write {MANIFEST}: {io}", dir.display())]
    Write { dir: PathBuf, io: io::Error },
    /// The manifest is written but could not be signed; no signature is
    /// left beside it.
    #[error("{}: sealed, but not signed: {message}", dir.display())]
    Sign { dir: PathBuf, message: String },
}

impl SealError {
    /// Exit code of `bundle seal` (docs/contract.md §9, §11.14): usage errors 2, the rest 1.
    pub fn exit_code(&self) -> u8 {
        match self {
            SealError::BadId { .. } | SealError::BadCreated { .. } => {
                crate::runtime::exit::EXIT_USAGE
            }
            _ => crate::runtime::exit::EXIT_FAILURE,
        }
    }
}

/// Hint for links and special files.
const HINT_KIND: &str = "only regular files can be sealed: replace each symbolic link with the file it points to, and move pipes, sockets and devices out of the folder";
/// Hint for names that are not bundle paths.
const HINT_NAME: &str = "rename the entries whose names cannot be used: bundle paths are UTF-8, without backslashes or control characters, and no part may start with .distributor";

/// `cannot seal DIR: N problems, nothing was written:`, then one problem
/// per line (names made inert), then the hints.
fn refused_text(dir: &Path, problems: &[Problem], hints: &[&str]) -> String {
    let mut text = format!(
        "cannot seal {}: {}, nothing was written:",
        inert_os(dir.as_os_str()),
        count(problems.len(), "problem", "problems")
    );
    for problem in problems {
        text.push_str("\n  ");
        text.push_str(&inert(&problem.to_string()));
    }
    for hint in hints {
        text.push('\n');
        text.push_str(hint);
    }
    text
}

/// "1 problem", "2 problems".
fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// A sealed bundle and what the producer should know about it.
#[derive(Debug)]
pub struct Sealed {
    pub manifest: Manifest,
    /// Reserved `.distributor*` entries that were left out, as paths
    /// relative to the folder (made inert for printing).
    pub skipped: Vec<String>,
    /// Listed names that are allowed but deceptive: equal to another after
    /// Unicode NFC normalisation, or holding bidirectional or zero-width
    /// characters.
    pub warnings: Vec<String>,
}

/// Temporary name used while writing `manifest.json`. It is reserved
/// (`.distributor*`), so a leftover from an interrupted seal is never sealed
/// into the bundle or published.
fn temp_manifest_name() -> String {
    format!(".distributor-manifest.json.tmp-{}", std::process::id())
}

/// [`seal_report`], for the tests that need only the manifest.
#[cfg(test)]
pub fn seal(dir: &Path, id: &str, created: Option<OffsetDateTime>) -> Result<Manifest, SealError> {
    seal_report(dir, id, created).map(|sealed| sealed.manifest)
}

/// Turns `dir` into a bundle: hashes every regular file below it (dot-files
/// included; the top-level `manifest.json` and reserved `.distributor*` names
/// excluded) and writes `dir/manifest.json` atomically. Refuses links and
/// special files anywhere in the tree. `created` defaults to now (UTC, whole
/// seconds). Says which reserved entries were skipped and which names
/// deserve a warning.
pub fn seal_report(
    dir: &Path,
    id: &str,
    created: Option<OffsetDateTime>,
) -> Result<Sealed, SealError> {
    check_id(IdKind::Source, id).map_err(|reason| SealError::BadId {
        id: id.to_owned(),
        reason,
    })?;
    let created = match created {
        Some(t) => normalise_created(t).map_err(|reason| SealError::BadCreated { reason })?,
        None => OffsetDateTime::now_utc().truncate_to_second(),
    };
    let root =
        Dir::open_ambient_dir(dir, ambient_authority()).map_err(|io| SealError::Unreadable {
            path: dir.to_path_buf(),
            io,
        })?;

    let mut found: Vec<RelPath> = Vec::new();
    let mut problems: Vec<Problem> = Vec::new();
    let (mut bad_kinds, mut bad_names) = (false, false);
    // Folders walked (the top one included), to find the reserved entries
    // the walk leaves out.
    let mut folders: Vec<Vec<OsString>> = vec![Vec::new()];
    walk(&root, &mut |segments, ft| {
        let shown = shown_path(segments);
        let last = segments.last().map(OsString::as_os_str).unwrap_or_default();
        let Some(name) = last.to_str() else {
            bad_names = true;
            problems.push(Problem::at(
                shown,
                "name is not valid UTF-8 (bytes shown as \\xNN); rename it (bundle paths are UTF-8)",
            ));
            return false;
        };
        if let Err(e) = RelPath::parse(name) {
            bad_names = true;
            problems.push(Problem::at(shown, format!("name cannot be used: {e}")));
            return false;
        }
        if ft.is_dir() {
            folders.push(segments.to_vec());
            return true;
        }
        if !ft.is_file() {
            bad_kinds = true;
            problems.push(Problem::at(shown, format!("is {}", kind_label(ft))));
            return false;
        }
        let utf8: Vec<&str> = segments.iter().filter_map(|s| s.to_str()).collect();
        match RelPath::parse(&utf8.join("/")) {
            Ok(path) => found.push(path),
            Err(e) => {
                bad_names = true;
                problems.push(Problem::at(shown, format!("path cannot be used: {e}")));
            }
        }
        false
    })
    .map_err(|(path, io)| SealError::Unreadable {
        path: dir.join(path),
        io,
    })?;
    if !problems.is_empty() {
        let mut hints = Vec::new();
        if bad_kinds {
            hints.push(HINT_KIND);
        }
        if bad_names {
            hints.push(HINT_NAME);
        }
        return Err(SealError::Refused {
            dir: dir.to_path_buf(),
            problems,
            hints,
        });
    }
    let skipped = reserved_entries(&root, &folders);
    if found.is_empty() {
        return Err(SealError::Empty {
            dir: dir.to_path_buf(),
        });
    }
    found.sort();

    let mut files = Vec::with_capacity(found.len());
    for path in found {
        let mut file = open_checked(&root, &path).map_err(|r| match r.io {
            Some(io) => SealError::Unreadable {
                path: dir.join(path.as_str()),
                io,
            },
            None => SealError::Refused {
                dir: dir.to_path_buf(),
                problems: vec![r.problem],
                hints: vec![HINT_KIND],
            },
        })?;
        let hashed =
            hashing::copy_hashed(&mut file, None, None).map_err(|io| SealError::Unreadable {
                path: dir.join(path.as_str()),
                io,
            })?;
        files.push(ManifestFile {
            path,
            sha256: hashed.sha256,
            size: hashed.size,
        });
    }
    let manifest = Manifest {
        id: id.to_owned(),
        created,
        digest: compute_digest(&files),
        files,
    };
    // A signature of the manifest being replaced would not match the new
    // one: it goes first, so that no moment shows the new manifest with it.
    let write = |io| SealError::Write {
        dir: dir.to_path_buf(),
        io,
    };
    remove_signature(&root).map_err(write)?;
    write_manifest(&root, &manifest.to_json()).map_err(write)?;
    let warnings = name_warnings(&manifest.files);
    Ok(Sealed {
        manifest,
        skipped,
        warnings,
    })
}

/// `segments` joined with `/`, each made inert (invalid UTF-8 as `\xNN`).
fn shown_path(segments: &[OsString]) -> String {
    let parts: Vec<String> = segments.iter().map(|s| inert_os(s)).collect();
    parts.join("/")
}

/// The reserved `.distributor*` entries of the walked folders (the
/// top-level `manifest.json` is not one), as inert paths. A folder that
/// cannot be listed again is passed over: this is a courtesy report.
fn reserved_entries(root: &Dir, folders: &[Vec<OsString>]) -> Vec<String> {
    let mut skipped = Vec::new();
    for folder in folders {
        let entries = if folder.is_empty() {
            root.entries()
        } else {
            root.read_dir(folder.iter().collect::<PathBuf>())
        };
        let Ok(entries) = entries else { continue };
        let mut names: Vec<OsString> = entries
            .filter_map(Result::ok)
            .map(|e| e.file_name())
            .filter(|name| is_reserved_name(&name.to_string_lossy()))
            .collect();
        names.sort();
        for name in names {
            let mut path = folder.clone();
            path.push(name);
            skipped.push(shown_path(&path));
        }
    }
    skipped.sort();
    skipped
}

/// `path` with every non-ASCII character as `\u{XXXX}` (and ASCII made
/// inert), so that two spellings that look the same can be told apart.
fn code_points(path: &str) -> String {
    let mut out = String::with_capacity(path.len() + 8);
    for c in path.chars() {
        if c.is_ascii() {
            out.push_str(&inert(c.encode_utf8(&mut [0; 4])));
        } else {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        }
    }
    out
}

/// Bidirectional controls: embeddings and overrides (U+202A–U+202E) and
/// isolates (U+2066–U+2069).
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Zero-width characters: spaces, joiners, word joiner, BOM.
fn is_zero_width(c: char) -> bool {
    matches!(c, '\u{200b}'..='\u{200d}' | '\u{2060}' | '\u{feff}')
}

/// Warnings for listed paths that are valid but deceptive: they hold
/// bidirectional or zero-width characters (they show differently from
/// their bytes, in logs and listings), or two of them are the same text
/// after Unicode NFC normalisation (they collide on file systems that
/// normalise names, and look identical).
fn name_warnings(files: &[ManifestFile]) -> Vec<String> {
    let mut warnings = Vec::new();
    let mut by_nfc: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for f in files {
        let path = f.path.as_str();
        let codes = |pick: fn(char) -> bool| -> Vec<String> {
            let mut codes: Vec<String> = path
                .chars()
                .filter(|c| pick(*c))
                .map(|c| format!("U+{:04X}", u32::from(c)))
                .collect();
            codes.dedup();
            codes
        };
        let bidi = codes(is_bidi_control);
        if !bidi.is_empty() {
            warnings.push(format!(
                "{}: holds bidirectional control characters ({}), so it is displayed differently from its real order; rename it unless that is intended",
                inert(path),
                bidi.join(", ")
            ));
        }
        let zero = codes(is_zero_width);
        if !zero.is_empty() {
            warnings.push(format!(
                "{}: holds zero-width characters ({}), so it looks like a name it is not; rename it unless that is intended",
                inert(path),
                zero.join(", ")
            ));
        }
        by_nfc.entry(path.nfc().collect()).or_default().push(path);
    }
    for same in by_nfc.values().filter(|paths| paths.len() > 1) {
        let shown: Vec<String> = same.iter().map(|p| code_points(p)).collect();
        warnings.push(format!(
            "{} are the same name after Unicode NFC normalisation: they look identical and collide on file systems that normalise names (macOS, some SMB shares); keep one spelling",
            shown.join(" and ")
        ));
    }
    warnings
}

/// Writes `manifest.json` in `root`: temporary reserved name, `sync_all`,
/// rename over the final name, then sync the folder.
fn write_manifest(root: &Dir, text: &str) -> io::Result<()> {
    let temp = temp_manifest_name();
    replace_file::replace_bytes(
        root,
        MANIFEST,
        Temp::Named(temp.as_ref()),
        Durability::Full,
        text.as_bytes(),
    )
}

/// Removes `manifest.json.sig` from `root` if it is there.
fn remove_signature(root: &Dir) -> io::Result<()> {
    match root.remove_file(SIGNATURE_FILE) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// How [`sign`] signed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignedBy {
    /// In this process, with an unencrypted private key.
    Key,
    /// By `ssh-keygen -Y sign` (an encrypted key, or a public key whose
    /// private half an ssh-agent holds).
    SshKeygen,
}

/// Signs the sealed bundle in `dir` with the OpenSSH key file `key`:
/// writes `manifest.json.sig`, the SSHSIG of the exact bytes of
/// `manifest.json` in `namespace` (`distributor` unless the pipeline sets
/// `signatures.namespace`; docs/contract.md §17.3).
/// An unencrypted private key signs here; anything else (an encrypted key,
/// a public key of an ssh-agent's key) is handed to `ssh-keygen -Y sign`,
/// which asks for the passphrase or uses the agent. On failure no
/// signature is left.
pub fn sign(dir: &Path, key: &Path, namespace: &str) -> Result<SignedBy, SealError> {
    let failed = |message: String| SealError::Sign {
        dir: dir.to_path_buf(),
        message,
    };
    let root =
        Dir::open_ambient_dir(dir, ambient_authority()).map_err(|io| SealError::Unreadable {
            path: dir.to_path_buf(),
            io,
        })?;
    let manifest = read_sealed_manifest(&root, dir)?;
    // The producer's own key, named on its own command line: no spool
    // and no bundle entry, so a plain open by path.
    let key_bytes = std::fs::read(key)
        .map_err(|e| failed(format!("cannot read the key {}: {e}", key.display())))?;
    if let Ok(Some(pem)) = crate::signature::sign(&key_bytes, &manifest, namespace) {
        replace_file::replace_bytes(
            &root,
            SIGNATURE_FILE,
            Temp::Named(
                format!(".distributor-manifest.json.sig.tmp-{}", std::process::id()).as_ref(),
            ),
            Durability::Full,
            pem.as_bytes(),
        )
        .map_err(|e| failed(format!("cannot write {SIGNATURE_FILE}: {e}")))?;
        return Ok(SignedBy::Key);
    }
    sign_with_ssh_keygen(dir, key, namespace).inspect_err(|_| {
        let _ = remove_signature(&root);
    })?;
    // What ssh-keygen signed must still be the manifest just read.
    if read_sealed_manifest(&root, dir)? != manifest {
        let _ = remove_signature(&root);
        return Err(failed(format!(
            "{MANIFEST} changed while it was being signed; seal and sign again"
        )));
    }
    Ok(SignedBy::SshKeygen)
}

/// The bytes of the sealed `manifest.json` in `root`.
fn read_sealed_manifest(root: &Dir, dir: &Path) -> Result<Vec<u8>, SealError> {
    let unreadable = |io| SealError::Unreadable {
        path: dir.join(MANIFEST),
        io,
    };
    use crate::fs::spoolfs::EntryError;
    let file = crate::fs::spoolfs::open_file(root, MANIFEST.as_ref()).map_err(|e| match e {
        EntryError::Io(e) => unreadable(e),
        EntryError::Missing => unreadable(io::Error::other("not found; seal the bundle first")),
        EntryError::Kind(kind) => unreadable(io::Error::other(format!(
            "is {kind}; seal the bundle again"
        ))),
        EntryError::HardLink(_) | EntryError::Raced => unreadable(io::Error::other(
            "changed while it was opened; seal the bundle again",
        )),
    })?;
    let mut bytes = Vec::new();
    io::Read::read_to_end(
        &mut io::Read::take(file, super::MAX_MANIFEST_BYTES + 1),
        &mut bytes,
    )
    .map_err(unreadable)?;
    Ok(bytes)
}

/// `ssh-keygen -Y sign -f KEY -n NAMESPACE DIR/manifest.json`, which
/// writes `DIR/manifest.json.sig`; its terminal stays the caller's, so that
/// it can ask for a passphrase.
fn sign_with_ssh_keygen(dir: &Path, key: &Path, namespace: &str) -> Result<(), SealError> {
    let failed = |message: String| SealError::Sign {
        dir: dir.to_path_buf(),
        message,
    };
    let status = std::process::Command::new("ssh-keygen")
        .args(["-q", "-Y", "sign", "-n", namespace, "-f"])
        .arg(key)
        .arg(dir.join(MANIFEST))
        .stdout(std::process::Stdio::null())
        .status()
        .map_err(|e| {
            failed(format!(
                "{} is not an unencrypted OpenSSH private key, and ssh-keygen, which would sign with it, cannot be run ({e}); install openssh-client",
                key.display()
            ))
        })?;
    if status.success() {
        Ok(())
    } else {
        Err(failed(format!(
            "ssh-keygen -Y sign with {} failed ({status}); see its message above",
            key.display()
        )))
    }
}
