//! The resolved configuration every other module works from: [`Config`],
//! its pipelines and destinations (what `config check` shows of them is
//! in `check`). Plain data and accessors; nothing here reads files or
//! checks input.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::format_duration;
pub use crate::bundle::Limits;
use crate::s3::headers::HeaderRules;
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
    /// `intake`: the pipeline's inbox is in a bucket (docs/contract.md
    /// §22), and `inbox` is unused.
    pub intake: Option<Intake>,
}

/// A pipeline's `intake`: an inbox in an S3-compatible bucket that any
/// agent configured with it may serve, one at a time (docs/contract.md §22).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Intake {
    /// The bucket and `<path>`: producers upload under `<path>/inbox/`.
    pub location: S3Location,
    /// How long the lease of the agent serving the pipeline lasts without
    /// renewal (default 30 s).
    pub lease: Duration,
}

impl Intake {
    /// How often the holder renews its lease: three times a lease, so
    /// that two renewals may fail before it lapses.
    pub fn renew_every(&self) -> Duration {
        self.lease / 3
    }

    /// How often the holder lists the intake: six times a lease (5 s with
    /// the default lease; docs/object-storage.md, "Intake requests").
    pub fn poll_every(&self) -> Duration {
        self.lease / 6
    }
}

/// A pipeline's `signatures`.
#[derive(Debug, Clone)]
pub struct Signatures {
    /// The `allowed_signers` file, resolved; read (and re-read on reload)
    /// while the config is loaded.
    pub allowed_signers: PathBuf,
    pub signers: std::sync::Arc<crate::signature::AllowedSigners>,
    /// The SSHSIG namespace signatures must be made in (default
    /// `distributor`): a pipeline of its own binds its bundles' signatures
    /// to it (docs/security.md, "Signed bundles").
    pub namespace: String,
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

    /// Whether a bundle older than the source of a record it would
    /// overwrite or delete is refused: `signatures.refuse_older`, and
    /// always for an intake, where it fences a holder that lost its lease
    /// (docs/contract.md §17.5, §22.3).
    pub fn refuses_older(&self) -> bool {
        self.intake.is_some() || self.signatures.as_ref().is_some_and(|s| s.refuse_older)
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

/// A precompressed sibling a local root gets beside each text output
/// (`precompress`, docs/contract.md §21.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Encoding {
    /// `X.gz`, catalog transform `gzip`.
    Gzip,
    /// `X.br`, catalog transform `brotli`.
    Brotli,
}

impl Encoding {
    /// The config spelling: `gzip` or `br`.
    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::Gzip => "gzip",
            Encoding::Brotli => "br",
        }
    }

    /// What the sibling's name adds to its original's: `.gz` or `.br`.
    pub fn suffix(self) -> &'static str {
        match self {
            Encoding::Gzip => ".gz",
            Encoding::Brotli => ".br",
        }
    }

    /// The sibling's `transform` in the catalog.
    pub fn transform(self) -> &'static str {
        match self {
            Encoding::Gzip => crate::catalog::GZIP,
            Encoding::Brotli => crate::catalog::BROTLI,
        }
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
    /// `releases`: a local root published as whole releases behind a
    /// link, this many kept (docs/contract.md §20.2); `None`: in place.
    pub releases: Option<u32>,
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
    /// `precompress`: the siblings each text output gets (local roots
    /// only), each encoding once, in the order written; empty: none.
    pub precompress: Vec<Encoding>,
    /// `headers`: the response headers stored with each object of an s3
    /// destination (docs/object-storage.md, "Serving the bucket"); none on a local one.
    pub headers: HeaderRules,
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
        if !self.headers.is_empty() {
            let rules: Vec<serde_json::Value> = (self.headers.rules().iter())
                .map(|r| {
                    serde_json::json!({
                        "match": r.pattern,
                        "cache_control": r.cache_control,
                        "content_type": r.content_type,
                        "content_disposition": r.content_disposition,
                    })
                })
                .collect();
            doc["headers"] = rules.into();
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
