//! Verifying managed outputs: every file in scope re-hashed, streaming,
//! against its record. Read-only: it changes nothing, not even a journal.

use super::session::{Access, in_scope, open};
use super::{MaintainError, Target, io_error, json_text};
use crate::clock::now_millis;
use crate::config::Backend;
use serde::Serialize;
use std::fmt::Write as _;

/// Result of `verify` (`verify --json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VerifyReport {
    pub ok: bool,
    pub checked: usize,
    pub missing: Vec<String>,
    pub mismatched: Vec<String>,
}

impl VerifyReport {
    /// Pretty JSON with a final newline.
    pub fn to_json(&self) -> String {
        json_text(self)
    }

    pub fn to_text(&self) -> String {
        let mut out = String::new();
        if self.ok {
            let _ = writeln!(out, "verify: {} output(s) checked: ok", self.checked);
        } else {
            let _ = writeln!(
                out,
                "verify: {} output(s) checked: {} missing, {} mismatched",
                self.checked,
                self.missing.len(),
                self.mismatched.len()
            );
        }
        for path in &self.missing {
            let _ = writeln!(out, "  missing     {path}");
        }
        for path in &self.mismatched {
            let _ = writeln!(out, "  mismatched  {path}");
        }
        out
    }
}

/// Re-hashes every managed output in scope, streaming, and reports the
/// missing ones (no regular file at the path) and the mismatched ones (size
/// or SHA-256 differs from the record). Changes nothing, not even an
/// interrupted publication's journal: it checks what the catalog would say
/// once that is finished.
pub fn verify(target: &Target, all_owners: bool) -> Result<VerifyReport, MaintainError> {
    if let Backend::S3(location) = &target.destination.backend {
        return super::s3::verify(target, location, all_owners);
    }
    let mut report = VerifyReport {
        ok: true,
        checked: 0,
        missing: Vec::new(),
        mismatched: Vec::new(),
    };
    let Some(session) = open(target, Access::Read, now_millis())? else {
        return Ok(report);
    };
    let records = session.catalog.as_ref().map_or(&[][..], |c| &c.outputs);
    for r in in_scope(target, records, all_owners) {
        report.checked += 1;
        let path = r.path.as_str();
        let hashed = session
            .root
            .hash_file(path)
            .map_err(io_error(target, format!("cannot read {path}")))?;
        match hashed {
            None => report.missing.push(path.to_owned()),
            Some(h) if h.size != r.size || h.sha256 != r.sha256 => {
                report.mismatched.push(path.to_owned())
            }
            Some(_) => {}
        }
    }
    report.ok = report.missing.is_empty() && report.mismatched.is_empty();
    Ok(report)
}
