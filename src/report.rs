//! The result documents of a publication: the `run --json` shape (also the
//! spool's `.distributor-result.json`) and its text form. Formatting only;
//! nothing here decides or performs anything.

use serde::Serialize;
use std::fmt::Write as _;

/// Where a failure happened (SPEC §11.20).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    Config,
    Verify,
    Plan,
    Lock,
    Publish,
    Spool,
}

impl Stage {
    /// The contract's spelling (`config`, `verify`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Config => "config",
            Stage::Verify => "verify",
            Stage::Plan => "plan",
            Stage::Lock => "lock",
            Stage::Publish => "publish",
            Stage::Spool => "spool",
        }
    }
}

/// The compact identity of the published bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SourceReport {
    pub id: String,
    pub digest: String,
    pub created: String,
}

/// What happened at one destination.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DestinationReport {
    pub destination_id: String,
    pub root: String,
    pub workflow: String,
    pub action: Option<String>,
    pub writes: Vec<String>,
    pub deletes: Vec<String>,
    pub unmanaged: Vec<String>,
    pub error: Option<String>,
    /// Planned writes (also listed in `writes`) whose file already held
    /// exactly those bytes and was kept as it is; not serialised.
    #[serde(skip)]
    pub unchanged: Vec<String>,
}

/// The whole result of publishing one bundle.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub ok: bool,
    pub dry_run: bool,
    pub pipeline_id: String,
    pub source: Option<SourceReport>,
    pub destinations: Vec<DestinationReport>,
    pub stage: Option<Stage>,
    pub error: Option<String>,
    /// Worth retrying later (lock timeout, I/O error); not serialised.
    #[serde(skip)]
    pub transient: bool,
    /// Bytes written into destination roots; not serialised.
    #[serde(skip)]
    pub bytes_published: u64,
    /// Planning refused the publication (exit 3); not serialised.
    #[serde(skip)]
    pub refused: bool,
    /// Non-fatal notes (unlisted bundle files); not serialised.
    #[serde(skip)]
    pub warnings: Vec<String>,
}

impl RunReport {
    pub fn new(pipeline_id: &str, dry_run: bool) -> RunReport {
        RunReport {
            ok: true,
            dry_run,
            pipeline_id: pipeline_id.to_owned(),
            source: None,
            destinations: Vec::new(),
            stage: None,
            error: None,
            transient: false,
            refused: false,
            bytes_published: 0,
            warnings: Vec::new(),
        }
    }

    /// Marks the report failed at `stage`.
    pub fn fail(mut self, stage: Stage, error: impl Into<String>, transient: bool) -> RunReport {
        self.ok = false;
        self.stage = Some(stage);
        self.error = Some(error.into());
        self.transient = transient;
        self
    }

    /// The process exit code for this result (SPEC §9).
    pub fn exit_code(&self) -> u8 {
        match self.stage {
            None => 0,
            Some(Stage::Config) => 2,
            Some(Stage::Plan) if self.refused => 3,
            Some(_) => 1,
        }
    }

    /// `dest=action` for every destination, space-separated: the heart of
    /// the one log line per bundle.
    pub fn actions(&self) -> String {
        self.destinations
            .iter()
            .map(|d| {
                format!(
                    "{}={}",
                    d.destination_id,
                    d.action.as_deref().unwrap_or("none")
                )
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The stage of a failure, or "" on success.
    pub fn stage_name(&self) -> &'static str {
        self.stage.map_or("", Stage::as_str)
    }

    /// Pretty JSON with a final newline.
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).unwrap_or_default();
        s.push('\n');
        s
    }

    /// The readable form printed by `run` without `--json`.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let verb = if self.dry_run { "dry run" } else { "run" };
        let source = self
            .source
            .as_ref()
            .map_or("(manifest unreadable)".to_owned(), |s| {
                format!("{} created {}", s.id, s.created)
            });
        let _ = writeln!(out, "{verb} of pipeline {}: {source}", self.pipeline_id);
        for d in &self.destinations {
            let action = d.action.as_deref().unwrap_or("not planned");
            let _ = writeln!(
                out,
                "  {} ({}, {}): {action}",
                d.destination_id, d.workflow, d.root
            );
            for w in &d.writes {
                let _ = writeln!(out, "    write   {w}");
            }
            if !d.unchanged.is_empty() {
                let _ = writeln!(
                    out,
                    "    ({} of these writes already held the same bytes and were kept as they are)",
                    d.unchanged.len()
                );
            }
            for x in &d.deletes {
                let _ = writeln!(out, "    delete  {x}");
            }
            for u in &d.unmanaged {
                let _ = writeln!(out, "    blocked by unmanaged {u}");
            }
            if let Some(e) = &d.error {
                let _ = writeln!(out, "    error: {e}");
            }
        }
        for w in &self.warnings {
            let _ = writeln!(out, "warning: {w}");
        }
        match (&self.stage, &self.error) {
            (Some(stage), Some(error)) => {
                let _ = writeln!(out, "failed at {}: {error}", stage.as_str());
            }
            _ => {
                let _ = writeln!(out, "ok");
            }
        }
        out
    }
}
