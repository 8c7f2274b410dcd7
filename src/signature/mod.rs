//! Signed bundles (docs/contract.md §17.3–17.4): a producer's SSH signature
//! over the exact bytes of `manifest.json`, in the file `manifest.json.sig`,
//! checked against the pipeline's `allowed_signers`.
//!
//! The cryptography and the SSHSIG format (what `ssh-keygen -Y sign`
//! writes) are RustCrypto's `ssh-key`; this module decides only which keys
//! are allowed, in which namespace, when, and for which principals, and
//! says why a bundle is refused.

mod allowed;

pub use allowed::{AllowedSigners, MAX_ALLOWED_SIGNERS_BYTES, SignerLine, matches_list};

use crate::scope::Scope;
use serde::Serialize;
use ssh_key::{HashAlg, PublicKey, SshSig};
use std::collections::BTreeMap;
use std::fmt;
use time::OffsetDateTime;

/// The signature's file name, beside `manifest.json`. Never listed in a
/// manifest, never published.
pub const SIGNATURE_FILE: &str = "manifest.json.sig";

/// The SSHSIG namespace of bundle signatures (`ssh-keygen -Y sign -n`).
pub const NAMESPACE: &str = "distributor";

/// Largest signature file read. What `ssh-keygen -Y sign` writes is under
/// 1 KiB for ed25519 and ecdsa keys and under 3 KiB for a 16384-bit RSA
/// key; anything larger is refused unread.
pub const MAX_SIGNATURE_BYTES: u64 = 16 * 1024;

/// Why a bundle's signature was refused (the `status` counts and the
/// metric use [`Reason::as_str`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    Missing,
    Malformed,
    BadSignature,
    UnknownKey,
    WrongNamespace,
    NotYetValid,
    NoLongerValid,
    /// Valid, but an output lies outside every scope of the signer's
    /// principals.
    OutsideScope,
}

impl Reason {
    pub const ALL: [Reason; 8] = [
        Reason::Missing,
        Reason::Malformed,
        Reason::BadSignature,
        Reason::UnknownKey,
        Reason::WrongNamespace,
        Reason::NotYetValid,
        Reason::NoLongerValid,
        Reason::OutsideScope,
    ];

    /// The spelling in JSON, `status` and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Missing => "missing",
            Reason::Malformed => "malformed",
            Reason::BadSignature => "bad_signature",
            Reason::UnknownKey => "unknown_key",
            Reason::WrongNamespace => "wrong_namespace",
            Reason::NotYetValid => "not_yet_valid",
            Reason::NoLongerValid => "no_longer_valid",
            Reason::OutsideScope => "outside_scope",
        }
    }

    pub fn parse(text: &str) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| r.as_str() == text)
    }
}

/// A refused signature: why, and a message naming the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{SIGNATURE_FILE}: {message}")]
pub struct SignatureRefusal {
    pub reason: Reason,
    pub message: String,
}

impl SignatureRefusal {
    pub fn new(reason: Reason, message: impl Into<String>) -> SignatureRefusal {
        SignatureRefusal {
            reason,
            message: message.into(),
        }
    }
}

/// Who signed a bundle, as the result reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Signer {
    /// The principal the result names: the first one listed for the key
    /// whose scopes hold every output (the first listed, without scopes).
    pub principal: String,
    /// The key's SHA-256 fingerprint, as `ssh-keygen -l` prints it.
    pub key: String,
    /// Every principal listed for the key on a line that allows this
    /// signature, in file order.
    #[serde(skip)]
    pub principals: Vec<String>,
}

impl fmt::Display for Signer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.principal, self.key)
    }
}

/// Checks `signature` (the bytes of `manifest.json.sig`; `None` when there
/// is none) over `manifest` (the exact bytes of `manifest.json`) against
/// `signers` at time `now`: a valid SSHSIG in `namespace` (the
/// pipeline's; [`NAMESPACE`] by default), by a key that a line lists,
/// honouring that line's `namespaces=`, `valid-after=` and `valid-before=`.
pub fn check(
    manifest: &[u8],
    signature: Option<&[u8]>,
    signers: &AllowedSigners,
    namespace: &str,
    now: OffsetDateTime,
) -> Result<Signer, SignatureRefusal> {
    let ns = namespace;
    let Some(bytes) = signature else {
        return Err(SignatureRefusal::new(
            Reason::Missing,
            format!(
                "not found; this pipeline takes only signed bundles: sign the sealed bundle with `ssh-keygen -Y sign -f KEY -n {ns} DIR/manifest.json` or `distributor bundle seal DIR --id ID --sign KEY{}`",
                if ns == NAMESPACE {
                    String::new()
                } else {
                    format!(" --namespace {ns}")
                }
            ),
        ));
    };
    let sig = parse(bytes)?;
    if sig.namespace() != ns {
        return Err(SignatureRefusal::new(
            Reason::WrongNamespace,
            format!(
                "signed in namespace {:?}, not {ns:?} (this pipeline's signatures.namespace); sign with `-n {ns}`",
                crate::text::escape::inert(sig.namespace())
            ),
        ));
    }
    let fingerprint = sig.public_key().fingerprint(HashAlg::Sha256).to_string();
    PublicKey::from(sig.public_key().clone())
        .verify(ns, manifest, &sig)
        .map_err(|_| {
            SignatureRefusal::new(
                Reason::BadSignature,
                format!(
                    "does not verify for this manifest.json (key {fingerprint}); the manifest changed after it was signed, or the signature is of another file: sign manifest.json again after sealing"
                ),
            )
        })?;
    let mut principals = Vec::new();
    let mut first_refusal = None;
    for line in signers.lines_for(sig.public_key()) {
        match line_allows(line, ns, now) {
            Ok(()) => principals.extend(line.principals.iter().cloned()),
            Err(refusal) => {
                first_refusal.get_or_insert(refusal);
            }
        }
    }
    if principals.is_empty() {
        return Err(first_refusal.unwrap_or_else(|| {
            SignatureRefusal::new(
                Reason::UnknownKey,
                format!(
                    "signed by key {fingerprint}, which allowed_signers does not list; add the signer's public key with its principal, or sign with a listed key"
                ),
            )
        }));
    }
    principals.dedup();
    Ok(Signer {
        principal: principals[0].clone(),
        key: fingerprint,
        principals,
    })
}

/// How many paths outside the scopes a refusal names.
const SHOWN_PATHS: usize = 5;

/// Checks `signatures.scopes` (docs/contract.md §17.4): every output path
/// must lie inside the scope of a principal `signer`'s key is listed for;
/// a principal without an entry in `scopes` may publish nothing. Returns
/// the principal to report: the first whose scope holds every path, else
/// the first with an entry.
pub fn check_scopes<'p>(
    signer: &Signer,
    scopes: &BTreeMap<String, Scope>,
    paths: impl IntoIterator<Item = &'p str>,
) -> Result<String, SignatureRefusal> {
    let granted: Vec<(&String, &Scope)> = signer
        .principals
        .iter()
        .filter_map(|p| scopes.get(p).map(|s| (p, s)))
        .collect();
    let paths: Vec<&str> = paths.into_iter().collect();
    let outside: Vec<&str> = paths
        .iter()
        .copied()
        .filter(|path| !granted.iter().any(|(_, scope)| scope.contains(path)))
        .collect();
    if let Some(first) = outside.first() {
        let who = if granted.is_empty() {
            format!(
                "{} may publish nothing: signatures.scopes has no entry for {}",
                principals_text(&signer.principals),
                if signer.principals.len() == 1 {
                    "it"
                } else {
                    "them"
                }
            )
        } else {
            let each: Vec<String> = granted.iter().map(|(p, s)| format!("{p} {s}")).collect();
            format!("the signer's scopes are {}", each.join(", "))
        };
        let shown = if outside.len() == 1 {
            format!("output {first:?} is")
        } else {
            let quoted: Vec<String> = outside.iter().map(|p| format!("{p:?}")).collect();
            format!(
                "{} outputs are ({})",
                outside.len(),
                crate::text::wording::first_few(&quoted, SHOWN_PATHS, ", ")
            )
        };
        return Err(SignatureRefusal::new(
            Reason::OutsideScope,
            format!(
                "{shown} outside what key {} may publish: {who}; publish only inside those scopes, or ask the operator to widen signatures.scopes",
                signer.key
            ),
        ));
    }
    let whole = granted
        .iter()
        .find(|(_, scope)| paths.iter().all(|path| scope.contains(path)));
    Ok(whole
        .or(granted.first())
        .map_or_else(|| signer.principal.clone(), |(p, _)| (*p).clone()))
}

/// `ci@a` or `ci@a, ci@b`, made inert.
fn principals_text(principals: &[String]) -> String {
    let shown: Vec<String> = principals
        .iter()
        .map(|p| crate::text::escape::inert(p).into_owned())
        .collect();
    shown.join(", ")
}

/// Reads an SSHSIG: ASCII armour, nothing else.
fn parse(bytes: &[u8]) -> Result<SshSig, SignatureRefusal> {
    let malformed = |why: &str| {
        SignatureRefusal::new(
            Reason::Malformed,
            format!(
                "{why}; it must be the armoured SSH signature that `ssh-keygen -Y sign` writes (-----BEGIN SSH SIGNATURE-----)"
            ),
        )
    };
    if bytes.is_empty() {
        return Err(malformed("is empty"));
    }
    if !bytes
        .iter()
        .all(|&b| b.is_ascii_graphic() || b.is_ascii_whitespace())
    {
        return Err(malformed("is not text"));
    }
    SshSig::from_pem(bytes).map_err(|e| malformed(&format!("cannot be read ({e})")))
}

/// Whether `line` allows a signature in namespace `ns` at `now`.
fn line_allows(line: &SignerLine, ns: &str, now: OffsetDateTime) -> Result<(), SignatureRefusal> {
    let at = |t: OffsetDateTime| crate::catalog::format_time(t);
    if let Some(namespaces) = &line.namespaces
        && !matches_list(ns, namespaces)
    {
        return Err(SignatureRefusal::new(
            Reason::WrongNamespace,
            format!(
                "the key is listed (line {}) only for namespaces {:?}, which do not include {ns:?}; add {ns} to that line's namespaces=",
                line.line,
                namespaces.join(",")
            ),
        ));
    }
    if let Some(after) = line.valid_after
        && now < after
    {
        return Err(SignatureRefusal::new(
            Reason::NotYetValid,
            format!(
                "the key is not valid yet: allowed_signers line {} says valid-after {}",
                line.line,
                at(after)
            ),
        ));
    }
    if let Some(before) = line.valid_before
        && now > before
    {
        return Err(SignatureRefusal::new(
            Reason::NoLongerValid,
            format!(
                "the key is no longer valid: allowed_signers line {} says valid-before {}; sign with a current key",
                line.line,
                at(before)
            ),
        ));
    }
    Ok(())
}

/// Signs `manifest` with an unencrypted OpenSSH private key, in
/// `namespace` ([`NAMESPACE`] unless the pipeline sets its own): what
/// `ssh-keygen -Y sign -n NAMESPACE` writes.
/// `Ok(None)` when the key is encrypted (the caller hands it to
/// `ssh-keygen`, which asks for the passphrase or uses the agent).
pub fn sign(
    private_key: &[u8],
    manifest: &[u8],
    namespace: &str,
) -> Result<Option<String>, String> {
    let key = ssh_key::PrivateKey::from_openssh(private_key)
        .map_err(|e| format!("not an OpenSSH private key ({e})"))?;
    if key.is_encrypted() {
        return Ok(None);
    }
    let sig = key
        .sign(namespace, HashAlg::Sha512, manifest)
        .map_err(|e| format!("cannot sign with this key ({e})"))?;
    sig.to_pem(ssh_key::LineEnding::LF)
        .map(Some)
        .map_err(|e| format!("cannot encode the signature ({e})"))
}

#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
mod tests;
