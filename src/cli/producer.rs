//! The producer helpers `bundle seal` and `bundle verify`: no config is
//! needed, and the bundle folder is all they look at.

use super::{Error, Outcome, told_unless};
use crate::bundle::{self, BundleError};
use crate::catalog::parse_time;
use crate::runtime::process_state::ProcessState;
use crate::signature::AllowedSigners;
use crate::text::escape::{inert, inert_os};
use std::path::Path;

/// "1 file", "2 files".
fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

pub(super) fn seal(
    dir: &Path,
    id: &str,
    created: Option<&str>,
    sign: Option<&Path>,
    namespace: &str,
) -> Outcome {
    let created = created
        .map(parse_time)
        .transpose()
        .map_err(|e| Error::Usage(format!("invalid --created: {e}")))?;
    let sealed = bundle::seal_report(dir, id, created)?;
    let m = &sealed.manifest;
    println!(
        "sealed {} ({}, {})",
        inert_os(dir.join(bundle::MANIFEST).as_os_str()),
        count(m.files.len(), "file", "files"),
        m.digest
    );
    if !sealed.skipped.is_empty() {
        eprintln!(
            "warning: left out {} (names starting with .distributor are reserved for distributor's own files and never sealed; rename any that belong in the bundle):",
            count(sealed.skipped.len(), "reserved entry", "reserved entries")
        );
        for path in &sealed.skipped {
            eprintln!("  {path}");
        }
    }
    for w in &sealed.warnings {
        eprintln!("warning: {w}");
    }
    let Some(key) = sign else {
        return Ok(());
    };
    bundle::sign(dir, key, namespace)
        .map_err(|e| Error::Failed(inert(&e.to_string()).into_owned()))?;
    println!(
        "signed {}",
        inert_os(dir.join(crate::signature::SIGNATURE_FILE).as_os_str())
    );
    Ok(())
}

pub(super) fn verify(
    dir: &Path,
    signers: Option<&Path>,
    namespace: &str,
    json: bool,
    process: &ProcessState,
) -> Outcome {
    let signers = match signers.map(|path| (path, AllowedSigners::read(path))) {
        None => None,
        Some((_, Ok(signers))) => Some(signers),
        Some((path, Err(e))) => {
            return Err(Error::Usage(format!(
                "--signers {}: {e}",
                inert_os(path.as_os_str())
            )));
        }
    };
    let policy = signers.as_ref().map(|signers| bundle::SignaturePolicy {
        signers,
        namespace,
        required: true,
    });
    let result = bundle::verify(dir, &bundle::Limits::default(), policy, &process.per_core());
    let signer = result.as_ref().ok().and_then(|b| b.signer.clone());
    let refused = match &result {
        Err(BundleError::Signature(refusal)) => Some(refusal.reason.as_str()),
        _ => None,
    };
    let (ok, problems, warnings, source) = match &result {
        Ok(b) => (
            true,
            Vec::new(),
            b.warnings.clone(),
            Some((
                b.manifest.id.clone(),
                b.manifest.digest.clone(),
                b.manifest.files.len(),
            )),
        ),
        Err(BundleError::Invalid { problems }) => (
            false,
            problems.iter().map(ToString::to_string).collect(),
            Vec::new(),
            None,
        ),
        Err(e) => (false, vec![e.to_string()], Vec::new(), None),
    };
    if json {
        let mut doc = serde_json::json!({
            "ok": ok,
            "bundle": dir.display().to_string(),
            "id": source.as_ref().map(|s| s.0.clone()),
            "digest": source.as_ref().map(|s| s.1.clone()),
            "problems": problems,
            "warnings": warnings,
        });
        if policy.is_some() {
            doc["signer"] = serde_json::json!(signer);
            doc["signature_refused"] = serde_json::json!(refused);
        }
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else {
        let shown_dir = inert_os(dir.as_os_str());
        match &source {
            Some((id, digest, n)) => println!(
                "ok: {shown_dir} is bundle {} ({}, {digest})",
                inert(id),
                count(*n, "file", "files")
            ),
            None => println!(
                "invalid bundle {shown_dir} ({}):",
                count(problems.len(), "problem", "problems")
            ),
        }
        if let Some(signer) = &signer {
            println!("  signed by {}", inert(&signer.to_string()));
        }
        for p in &problems {
            println!("  problem: {}", inert(p));
        }
        for w in &warnings {
            println!("  warning: {}", inert(w));
        }
    }
    told_unless(ok)
}
