//! Listing a root's catalog (every owner's records) as JSON or as an
//! aligned table. Read-only: it creates and changes nothing.

use super::session::{open, read, report_pending};
use super::{MaintainError, OwnedRoot, json_text};
use crate::backend::Access;
use crate::catalog::{OutputRecord, format_time};
use crate::runtime::clock::now_millis;
use serde::Serialize;
use std::fmt::Write as _;

/// Result of `catalog` (`catalog --json`): every record of the root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CatalogReport {
    pub root: String,
    pub outputs: Vec<OutputRecord>,
}

impl CatalogReport {
    /// Pretty JSON with a final newline.
    pub fn to_json(&self) -> String {
        json_text(self)
    }

    /// A table with aligned columns, one row per record.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        if self.outputs.is_empty() {
            let _ = writeln!(out, "{}: no managed outputs", self.root);
            return out;
        }
        let n = self.outputs.len();
        let _ = writeln!(
            out,
            "{}: {n} managed output{}",
            self.root,
            if n == 1 { "" } else { "s" }
        );
        let header = ["PATH", "OWNER", "SOURCE", "KIND", "SIZE", "UPDATED"];
        let rows: Vec<[String; 6]> = self
            .outputs
            .iter()
            .map(|r| {
                [
                    r.path.as_str().to_owned(),
                    format!("{}/{}", r.pipeline_id, r.destination_id),
                    r.source.id.clone(),
                    r.kind.as_str().to_owned(),
                    r.size.to_string(),
                    format_time(r.updated_at),
                ]
            })
            .collect();
        let mut widths = header.map(|h| h.chars().count());
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let mut line = |cells: [&str; 6]| {
            let mut text = String::new();
            for (i, cell) in cells.iter().enumerate() {
                let pad = widths[i].saturating_sub(cell.chars().count());
                if i == 4 {
                    // Sizes are right-aligned.
                    text.push_str(&" ".repeat(pad));
                    text.push_str(cell);
                } else if i == cells.len() - 1 {
                    text.push_str(cell);
                } else {
                    text.push_str(cell);
                    text.push_str(&" ".repeat(pad));
                }
                if i + 1 < cells.len() {
                    text.push_str("  ");
                }
            }
            let _ = writeln!(out, "{}", text.trim_end());
        };
        line(header);
        for row in &rows {
            line(row.each_ref().map(String::as_str));
        }
        out
    }
}

/// Lists every record of the target's root (all owners).
pub fn catalog(target: &OwnedRoot) -> Result<CatalogReport, MaintainError> {
    let mut root = open(target, Access::Read, now_millis())?;
    let catalog = read(target, &mut root)?;
    report_pending(target, &root)?;
    Ok(CatalogReport {
        root: target.root_text(),
        outputs: catalog.map(|c| c.outputs).unwrap_or_default(),
    })
}
