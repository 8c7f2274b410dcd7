//! The resolved configuration every other module works from: [`Config`],
//! its pipelines and destinations, and what `config check` shows of them.
//! Plain data and accessors; nothing here reads files or checks input.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::format_duration;
use super::values::format_size;
pub use crate::bundle::Limits;
use crate::paths::RelPath;
use crate::scope::Scope;

/// A loaded, checked configuration with every path resolved.
#[derive(Debug, Clone)]
pub struct Config {
    /// The config file it was read from (as given, made absolute).
    pub file: PathBuf,
    /// The spool folder; per-pipeline spools live below it.
    pub spool: PathBuf,
    pub agent: AgentConfig,
    /// The top-level `limits:` (defaults for every pipeline).
    pub limits: Limits,
    pub pipelines: Vec<Pipeline>,
}

/// Timing and retry settings of the agent (`agent:` section).
#[derive(Debug, Clone, PartialEq)]
pub struct AgentConfig {
    /// Quiet time after a manifest appears before the bundle is claimed.
    pub settle: Duration,
    /// How long a bundle may stay incomplete in the inbox with no change
    /// before it is claimed and failed (docs/contract.md §13); also the age at which
    /// `status --check` reports an inbox entry as stuck.
    pub incomplete_timeout: Duration,
    /// Full inbox rescan period; never zero.
    pub rescan_interval: Duration,
    /// Retention pruning period; zero turns scheduled pruning off.
    pub prune_interval: Duration,
    /// How long to wait for a destination root lock.
    pub lock_timeout: Duration,
    /// Attempts per bundle for transient failures (at least 1); `None`
    /// bounds a deferral by [`AgentConfig::defer_for`] only
    /// (docs/contract.md §18.1).
    pub max_attempts: Option<u32>,
    /// Longest pause between two attempts of a deferred bundle.
    pub retry_max_interval: Duration,
    /// How long a bundle may stay deferred before it fails with its last
    /// error; zero fails it at its first transient failure.
    pub defer_for: Duration,
    /// Age after which `done/` entries are deleted; zero keeps them.
    pub done_retention: Duration,
    /// Where the agent writes its metrics in the Prometheus text format
    /// (for node_exporter's textfile collector); `None` writes none.
    pub metrics_file: Option<PathBuf>,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            settle: Duration::from_millis(250),
            incomplete_timeout: Duration::from_secs(10 * 60),
            rescan_interval: Duration::from_secs(60),
            prune_interval: Duration::from_secs(60 * 60),
            lock_timeout: Duration::from_secs(30),
            max_attempts: None,
            retry_max_interval: Duration::from_secs(10 * 60),
            defer_for: Duration::from_secs(24 * 60 * 60),
            done_retention: Duration::from_secs(7 * 24 * 60 * 60),
            metrics_file: None,
        }
    }
}

/// One configured flow: an inbox and the destinations it publishes to.
#[derive(Debug, Clone)]
pub struct Pipeline {
    pub id: String,
    /// Resolved inbox folder; default `<spool>/<id>/inbox`.
    pub inbox: PathBuf,
    /// The top-level limits with this pipeline's overrides applied.
    pub limits: Limits,
    pub destinations: Vec<Destination>,
    /// `signatures`: who may sign this pipeline's bundles
    /// (docs/contract.md §17.3); `None` takes unsigned bundles.
    pub signatures: Option<Signatures>,
}

/// A pipeline's `signatures`.
#[derive(Debug, Clone)]
pub struct Signatures {
    /// The `allowed_signers` file, resolved; read (and re-read on reload)
    /// while the config is loaded.
    pub allowed_signers: PathBuf,
    pub signers: std::sync::Arc<crate::signature::AllowedSigners>,
    /// Refuse a bundle without a valid signature (default true).
    pub required: bool,
    /// Refuse a bundle that would overwrite or delete outputs of a source
    /// created after it (default true; docs/contract.md §17.5).
    pub refuse_older: bool,
    /// Principal -> the output path prefixes it may publish; `None` when
    /// every principal may publish everywhere the destinations allow.
    pub scopes: Option<std::collections::BTreeMap<String, crate::scope::Scope>>,
}

impl Pipeline {
    /// The pipeline's spool folder, `<spool>/<id>`.
    pub fn spool_dir(&self, config: &Config) -> PathBuf {
        config.spool.join(&self.id)
    }

    /// The destination with this id, if the pipeline has one.
    pub fn destination(&self, id: &str) -> Option<&Destination> {
        self.destinations.iter().find(|d| d.id == id)
    }
}

impl Config {
    /// The pipeline with this id, if configured.
    pub fn pipeline(&self, id: &str) -> Option<&Pipeline> {
        self.pipelines.iter().find(|p| p.id == id)
    }
}

/// How a publication treats the owner's earlier outputs (docs/contract.md §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workflow {
    /// Write the planned outputs and keep every other record.
    Additive,
    /// Also delete this owner's outputs that are no longer planned.
    Replacement,
}

impl Workflow {
    /// The config and JSON spelling: `additive` or `replacement`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Workflow::Additive => "additive",
            Workflow::Replacement => "replacement",
        }
    }
}

impl fmt::Display for Workflow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a destination's root lives (`backend:`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// A folder on this machine: [`Destination::root`].
    Local,
    /// A key prefix in an S3-compatible bucket (docs/contract.md §15).
    S3(S3Location),
}

/// The root of an s3 destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Location {
    pub bucket: String,
    /// Key prefix of the root inside the bucket: "" (the whole bucket) or a
    /// clean relative path without a trailing slash.
    pub path: String,
    /// An S3-compatible server (path-style requests); `None` for AWS.
    pub endpoint: Option<String>,
    /// Default `us-east-1`.
    pub region: String,
}

impl fmt::Display for S3Location {
    /// `s3://bucket/path`, with the endpoint when there is one.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s3://{}/{}", self.bucket, self.path)?;
        if let Some(endpoint) = &self.endpoint {
            write!(f, " at {endpoint}")?;
        }
        Ok(())
    }
}

/// One target a pipeline publishes to.
#[derive(Debug, Clone)]
pub struct Destination {
    pub id: String,
    /// The destination root (`path`), resolved against the config file's
    /// folder. Empty for an s3 destination, whose root is in `backend`.
    pub root: PathBuf,
    /// `local` (the root is [`Destination::root`]) or `s3`.
    pub backend: Backend,
    pub workflow: Workflow,
    /// The raw `prefix` template text, checked at load; "" for none.
    pub prefix: String,
    /// `scope`: the output paths (after `prefix`) the destination may
    /// publish; `None` is the whole root (docs/contract.md §17.1).
    pub scope: Option<Scope>,
    /// `publish.source`: copy listed files as they are.
    pub publish_source: bool,
    /// `publish.html`: render `*.md` files to HTML.
    pub publish_html: bool,
    /// `html.raw_html`: what raw HTML inside markdown becomes.
    pub raw_html: RawHtml,
    /// `html.template`: the page template, read and checked at load.
    pub html_template: Option<HtmlTemplate>,
    /// `links.base_url`, always ending with `/`.
    pub base_url: Option<String>,
    /// `retention.prune`.
    pub prune: Option<PrunePolicy>,
    /// `hooks`: what runs after each publication that changed the
    /// destination (docs/contract.md §19).
    pub hooks: Option<Hooks>,
}

/// `html.raw_html` (docs/contract.md §10, §16.4).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum RawHtml {
    /// Kept through an allowlist of what READMEs use, the rest removed.
    #[default]
    Sanitize,
    /// Shown as text.
    Escape,
    /// Kept as it is (trusted producers only).
    Allow,
}

impl RawHtml {
    /// The config's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            RawHtml::Sanitize => "sanitize",
            RawHtml::Escape => "escape",
            RawHtml::Allow => "allow",
        }
    }
}

/// A destination's `hooks`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hooks {
    /// `after_publish`: the argv, its first element an absolute path.
    pub after_publish: Vec<String>,
    /// `timeout`: how long it may run before it is killed.
    pub timeout: Duration,
}

impl Hooks {
    /// `hooks.timeout` when unset.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
}

impl Destination {
    /// Where the destination publishes, for reports and messages: the root
    /// folder, or `s3://bucket/path` for an s3 destination.
    pub fn root_label(&self) -> String {
        match &self.backend {
            Backend::Local => self.root.display().to_string(),
            Backend::S3(l) => format!("s3://{}/{}", l.bucket, l.path),
        }
    }

    /// The root's folder, for a root on this machine's file system (an s3
    /// root is not one).
    pub fn local_root(&self) -> Option<&Path> {
        match &self.backend {
            Backend::Local => Some(&self.root),
            Backend::S3(_) => None,
        }
    }

    /// The destination as `config check --json` shows it.
    pub fn to_json(&self) -> serde_json::Value {
        let mut doc = serde_json::json!({
            "id": self.id,
            "backend": "local",
            "workflow": self.workflow.as_str(),
            "root": self.root.display().to_string(),
            "prefix": self.prefix,
            "scope": self.scope.as_ref().map(Scope::entries),
            "publish_source": self.publish_source,
            "publish_html": self.publish_html,
        });
        if let Backend::S3(l) = &self.backend {
            doc["backend"] = "s3".into();
            doc["root"] = l.to_string().into();
            doc["bucket"] = l.bucket.clone().into();
            doc["path"] = l.path.clone().into();
            doc["endpoint"] = l.endpoint.clone().into();
            doc["region"] = l.region.clone().into();
        }
        if let Some(h) = &self.hooks {
            doc["hooks"] = serde_json::json!({
                "after_publish": h.after_publish,
                "timeout": format_duration(h.timeout),
            });
        }
        doc
    }
}

/// Why a destination's scope can hold none of its outputs, when the fixed
/// start of its `prefix` puts every output outside it (docs/contract.md
/// §17.1).
fn scope_misses_prefix(d: &Destination) -> Option<String> {
    let scope = d.scope.as_ref()?;
    let fixed = match d.prefix.find('{') {
        None => d.prefix.trim_end_matches('/'),
        Some(i) => d.prefix[..i]
            .rsplit_once('/')
            .map_or("", |(folder, _)| folder),
    };
    let folder = RelPath::parse(fixed).ok()?;
    (!Scope::folder(&folder).overlaps(scope)).then(|| {
        format!(
            "prefix {:?} puts every output below {folder}/, where scope {scope} allows nothing, so every bundle would fail at stage verify; change the prefix or the scope",
            d.prefix
        )
    })
}

/// A page template (`html.template`): the file, resolved against the config
/// file's folder, and its text, which holds `{{content}}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HtmlTemplate {
    pub path: PathBuf,
    pub text: std::sync::Arc<str>,
}

/// Retention policy of one owner (`retention.prune`).
#[derive(Debug, Clone, PartialEq)]
pub struct PrunePolicy {
    /// Outputs whose `updated_at` is older than this may be pruned.
    pub max_age: Duration,
    /// Outputs of the owner's N newest sources are never pruned.
    pub keep_latest: u32,
}

impl Config {
    /// Things that are allowed but probably not meant; shown by
    /// `config check` and worth logging at start.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        if self.pipelines.is_empty() {
            warnings
                .push("no pipelines are configured; the agent will have nothing to do".to_owned());
        }
        if let Some(path) = &self.agent.metrics_file
            && path.extension().is_none_or(|e| e != "prom")
        {
            warnings.push(format!(
                "agent.metrics_file {} does not end in .prom; node_exporter's textfile collector only reads files that do",
                path.display()
            ));
        }
        for pipeline in &self.pipelines {
            if let Some(sig) = &pipeline.signatures {
                warnings.extend(sig.warnings(&pipeline.id));
            }
            for d in &pipeline.destinations {
                if let Backend::S3(l) = &d.backend {
                    for var in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"] {
                        if std::env::var_os(var).is_none_or(|v| v.is_empty()) {
                            warnings.push(format!(
                                "destination {:?} of pipeline {:?} publishes to {l} but {var} is not set in this environment; s3 credentials come only from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN",
                                d.id, pipeline.id
                            ));
                        }
                    }
                }
                if d.raw_html == RawHtml::Allow && !d.publish_html {
                    warnings.push(format!(
                        "destination {:?} of pipeline {:?} sets html.raw_html: allow but does not publish HTML; the setting has no effect",
                        d.id, pipeline.id
                    ));
                }
                if let Some(warning) = scope_misses_prefix(d) {
                    warnings.push(format!(
                        "destination {:?} of pipeline {:?}: {warning}",
                        d.id, pipeline.id
                    ));
                }
                if d.html_template.is_some() && !d.publish_html {
                    warnings.push(format!(
                        "destination {:?} of pipeline {:?} sets html.template but does not publish HTML; the template is not used",
                        d.id, pipeline.id
                    ));
                }
            }
        }
        warnings.extend(super::shared_roots(self).iter().map(|s| s.to_text()));
        warnings
    }

    /// A readable description of the resolved config: what
    /// `distributor config check` prints.
    pub fn summary(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        let a = &self.agent;
        let or_off = |d: Duration, off: &str| {
            if d.is_zero() {
                format!("0s ({off})")
            } else {
                format_duration(d)
            }
        };
        // Writing to a String cannot fail.
        let _ = writeln!(s, "config file: {}", self.file.display());
        let _ = writeln!(s, "spool: {}", self.spool.display());
        let _ = writeln!(s, "agent:");
        let _ = writeln!(s, "  settle: {}", format_duration(a.settle));
        let _ = writeln!(
            s,
            "  incomplete_timeout: {}",
            format_duration(a.incomplete_timeout)
        );
        let _ = writeln!(
            s,
            "  rescan_interval: {}",
            format_duration(a.rescan_interval)
        );
        let _ = writeln!(
            s,
            "  prune_interval: {}",
            or_off(a.prune_interval, "scheduled pruning off")
        );
        let _ = writeln!(s, "  lock_timeout: {}", format_duration(a.lock_timeout));
        match a.max_attempts {
            Some(n) => {
                let _ = writeln!(s, "  max_attempts: {n}");
            }
            None => {
                let _ = writeln!(s, "  max_attempts: (unset; defer_for bounds retries)");
            }
        }
        let _ = writeln!(
            s,
            "  retry_max_interval: {}",
            format_duration(a.retry_max_interval)
        );
        let _ = writeln!(
            s,
            "  defer_for: {}",
            or_off(a.defer_for, "a transient failure fails at once")
        );
        let _ = writeln!(
            s,
            "  done_retention: {}",
            or_off(a.done_retention, "done/ entries are kept")
        );
        match &a.metrics_file {
            Some(path) => {
                let _ = writeln!(s, "  metrics_file: {}", path.display());
            }
            None => {
                let _ = writeln!(s, "  metrics_file: (none; no metrics are written)");
            }
        }
        let limits = |l: &Limits| {
            format!(
                "max_file_bytes {}, max_bundle_bytes {}, max_files {}, max_markdown_bytes {}",
                format_size(l.max_file_bytes),
                format_size(l.max_bundle_bytes),
                l.max_files,
                format_size(l.max_markdown_bytes)
            )
        };
        let _ = writeln!(s, "limits: {}", limits(&self.limits));
        let _ = writeln!(s, "pipelines: {}", self.pipelines.len());
        for p in &self.pipelines {
            let _ = writeln!(s, "  pipeline {}", p.id);
            let _ = writeln!(s, "    inbox: {}", p.inbox.display());
            if p.limits != self.limits {
                let _ = writeln!(s, "    limits: {}", limits(&p.limits));
            }
            let _ = writeln!(s, "    spool: {}", p.spool_dir(self).display());
            if let Some(sig) = &p.signatures {
                let _ = writeln!(s, "    {}", sig.summary());
            }
            for d in &p.destinations {
                d.write_summary(&mut s);
            }
        }
        for warning in self.warnings() {
            let _ = writeln!(s, "warning: {warning}");
        }
        s
    }
}

impl Signatures {
    /// One line for `config check`: the file, how many keys it lists, and
    /// the settings.
    pub fn summary(&self) -> String {
        let scopes = match &self.scopes {
            None => "every principal anywhere".to_owned(),
            Some(scopes) => {
                let each: Vec<String> = scopes.iter().map(|(p, s)| format!("{p} {s}")).collect();
                each.join(", ")
            }
        };
        format!(
            "signatures: {} ({} key line(s)), required {}, refuse_older {}, scopes: {scopes}",
            self.allowed_signers.display(),
            self.signers.lines.len(),
            self.required,
            self.refuse_older
        )
    }

    /// What `config check` and the agent warn about: `scopes` that an
    /// unsigned bundle would pass by (`required: false`), and principals
    /// in `scopes` that no line of `allowed_signers` lists.
    pub fn warnings(&self, pipeline: &str) -> Vec<String> {
        let Some(scopes) = &self.scopes else {
            return Vec::new();
        };
        let mut warnings = Vec::new();
        if !self.required {
            warnings.push(format!(
                "pipeline {pipeline:?}: signatures.scopes limits signed bundles only, and with signatures.required: false an unsigned bundle is limited by its destinations' scope alone; set required: true once every producer signs"
            ));
        }
        for principal in scopes.keys() {
            let listed = self
                .signers
                .lines
                .iter()
                .any(|l| l.principals.iter().any(|p| p == principal));
            if !listed {
                warnings.push(format!(
                    "pipeline {pipeline:?}: signatures.scopes names {principal:?}, which no line of {} lists; fix the spelling, or add its key",
                    self.allowed_signers.display()
                ));
            }
        }
        warnings
    }

    /// The same for `config check --json`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "allowed_signers": self.allowed_signers.display().to_string(),
            "keys": self.signers.lines.len(),
            "required": self.required,
            "refuse_older": self.refuse_older,
            "scopes": self.scopes.as_ref().map(|scopes| scopes
                .iter()
                .map(|(p, s)| (p.clone(), serde_json::json!(s.entries())))
                .collect::<serde_json::Map<_, _>>()),
        })
    }
}

impl Destination {
    /// The destination's lines of [`Config::summary`].
    fn write_summary(&self, s: &mut String) {
        use std::fmt::Write as _;
        let d = self;
        let yes_no = |b: bool| if b { "yes" } else { "no" };
        let _ = writeln!(s, "    destination {}", d.id);
        match &d.backend {
            Backend::Local => {
                let _ = writeln!(s, "      backend: local");
                let _ = writeln!(s, "      root: {}", d.root.display());
            }
            Backend::S3(l) => {
                let _ = writeln!(s, "      backend: s3");
                let _ = writeln!(s, "      bucket: {}", l.bucket);
                let path = if l.path.is_empty() {
                    "(none; the whole bucket)"
                } else {
                    &l.path
                };
                let _ = writeln!(s, "      path: {path}");
                let endpoint = l.endpoint.as_deref().unwrap_or("(none; AWS S3)");
                let _ = writeln!(s, "      endpoint: {endpoint}");
                let _ = writeln!(s, "      region: {}", l.region);
            }
        }
        let _ = writeln!(s, "      workflow: {}", d.workflow);
        if d.prefix.is_empty() {
            let _ = writeln!(s, "      prefix: (none)");
        } else {
            let _ = writeln!(s, "      prefix: {:?}", d.prefix);
        }
        match &d.scope {
            Some(scope) => {
                let _ = writeln!(s, "      scope: {scope}");
            }
            None => {
                let _ = writeln!(s, "      scope: (none; the whole root)");
            }
        }
        let _ = writeln!(
            s,
            "      publish: source {}, html {}",
            yes_no(d.publish_source),
            yes_no(d.publish_html)
        );
        let raw = d.raw_html.as_str();
        let _ = writeln!(s, "      raw_html: {raw}");
        if let Some(template) = &d.html_template {
            let _ = writeln!(s, "      template: {}", template.path.display());
        }
        let url = d
            .base_url
            .as_deref()
            .unwrap_or("(none; outputs get no url)");
        let _ = writeln!(s, "      base_url: {url}");
        match &d.prune {
            Some(prune) => {
                let _ = writeln!(
                    s,
                    "      prune: max_age {}, keep_latest {}",
                    format_duration(prune.max_age),
                    prune.keep_latest
                );
            }
            None => {
                let _ = writeln!(s, "      prune: (no policy)");
            }
        }
        match &d.hooks {
            Some(h) => {
                let _ = writeln!(
                    s,
                    "      hooks: after_publish {:?}, timeout {}",
                    h.after_publish,
                    format_duration(h.timeout)
                );
            }
            None => {
                let _ = writeln!(s, "      hooks: (none)");
            }
        }
    }
}
