//! The producer helpers `bundle seal` and `bundle verify`: no config is
//! needed, and the bundle folder is all they look at.

use super::{EXIT_FAILURE, EXIT_OK, EXIT_USAGE};
use crate::bundle::{self, BundleError, SealError};
use crate::catalog::parse_time;
use std::path::Path;

pub(super) fn seal(dir: &Path, id: &str, created: Option<&str>) -> u8 {
    let created = match created.map(parse_time).transpose() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: invalid --created: {e}");
            return EXIT_USAGE;
        }
    };
    match bundle::seal(dir, id, created) {
        Ok(m) => {
            println!(
                "sealed {} ({} files, {})",
                dir.join(bundle::MANIFEST).display(),
                m.files.len(),
                m.digest
            );
            EXIT_OK
        }
        Err(e) => {
            eprintln!("error: {e}");
            match e {
                SealError::BadId { .. } | SealError::BadCreated { .. } => EXIT_USAGE,
                _ => EXIT_FAILURE,
            }
        }
    }
}

pub(super) fn verify(dir: &Path, json: bool) -> u8 {
    let result = bundle::verify(dir, &bundle::Limits::default());
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
        let doc = serde_json::json!({
            "ok": ok,
            "bundle": dir.display().to_string(),
            "id": source.as_ref().map(|s| s.0.clone()),
            "digest": source.as_ref().map(|s| s.1.clone()),
            "problems": problems,
            "warnings": warnings,
        });
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else {
        match &source {
            Some((id, digest, n)) => {
                println!("ok: {} is bundle {id} ({n} files, {digest})", dir.display())
            }
            None => println!("invalid bundle {}:", dir.display()),
        }
        for p in &problems {
            println!("  problem: {p}");
        }
        for w in &warnings {
            println!("  warning: {w}");
        }
    }
    if ok { EXIT_OK } else { EXIT_FAILURE }
}
