//! Verifying managed outputs: every file in scope re-hashed, streaming,
//! against its record, and (in a bucket) the response headers stored with
//! it against the destination's rules. Read-only: it changes nothing, not
//! even a journal.

use super::session::{in_scope, open, read, report_pending};
use super::{MaintainError, OwnedRoot, json_text};
use crate::backend::Access;
use crate::catalog::OutputRecord;
use crate::runtime::clock::now_millis;
use serde::Serialize;
use std::fmt::Write as _;

/// Result of `verify` (`verify --json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VerifyReport {
    pub ok: bool,
    pub checked: usize,
    pub missing: Vec<String>,
    pub mismatched: Vec<String>,
    /// Objects stored with other response headers than the `headers`
    /// rules give them now (docs/object-storage.md, "Serving the
    /// bucket"); never on a local root.
    pub headers_differ: Vec<String>,
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
            let _ = write!(
                out,
                "verify: {} output(s) checked: {} missing, {} mismatched",
                self.checked,
                self.missing.len(),
                self.mismatched.len()
            );
            if !self.headers_differ.is_empty() {
                let _ = write!(out, ", {} with other headers", self.headers_differ.len());
            }
            out.push('\n');
        }
        for path in &self.missing {
            let _ = writeln!(out, "  missing     {path}");
        }
        for path in &self.mismatched {
            let _ = writeln!(out, "  mismatched  {path}");
        }
        for path in &self.headers_differ {
            let _ = writeln!(out, "  headers     {path}");
        }
        out
    }
}

/// Re-hashes every managed output in scope, streaming, and reports the
/// missing ones (no regular file or object at the path), the mismatched
/// ones (size or SHA-256 differs from the record) and the objects stored
/// with other response headers than the rules give. Changes nothing, not
/// even an interrupted publication's journal or intent: it checks what the
/// catalog would say once that is finished.
pub fn verify(target: &OwnedRoot, all_owners: bool) -> Result<VerifyReport, MaintainError> {
    let mut root = open(target, Access::Read, now_millis())?;
    let catalog = read(target, &mut root)?;
    report_pending(target, &root)?;
    let records = catalog.as_ref().map_or(&[][..], |c| &c.outputs);
    let records: Vec<&OutputRecord> = in_scope(target, records, all_owners).collect();
    let paths: Vec<&str> = records.iter().map(|r| r.path.as_str()).collect();
    let mut report = VerifyReport {
        ok: true,
        checked: records.len(),
        missing: Vec::new(),
        mismatched: Vec::new(),
        headers_differ: Vec::new(),
    };
    root.hash_each(&paths, &mut |i, hashed| {
        let (r, path) = (records[i], paths[i]);
        match hashed {
            None => report.missing.push(path.to_owned()),
            Some(h) if h.size != r.size || h.sha256 != r.sha256 => {
                report.mismatched.push(path.to_owned())
            }
            Some(_) => {}
        }
    })
    .map_err(|f| target.error(f))?;
    report.headers_differ = root.headers_differ(&paths).map_err(|f| target.error(f))?;
    report.ok = report.missing.is_empty()
        && report.mismatched.is_empty()
        && report.headers_differ.is_empty();
    Ok(report)
}
