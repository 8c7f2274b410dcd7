//! What `config check` and the agent's start show of a loaded config:
//! its warnings (things allowed but probably not meant, shared roots
//! among them) and its summary.

use super::model::{Backend, Config, Destination, Limits, RawHtml, Signatures};
use super::shared::shared_roots;
use super::values::{format_duration, format_size};
use crate::paths::RelPath;
use crate::scope::Scope;
use std::time::Duration;

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
        warnings.extend(shared_roots(self).iter().map(|s| s.to_text()));
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
            match &p.intake {
                Some(i) => {
                    let l = &i.location;
                    let _ = writeln!(
                        s,
                        "    intake: s3 bucket {}, path {}, endpoint {}, region {}, lease {} (producers upload to {}inbox/<bundle>/)",
                        l.bucket,
                        if l.path.is_empty() { "(none)" } else { &l.path },
                        l.endpoint.as_deref().unwrap_or("(none; AWS S3)"),
                        l.region,
                        format_duration(i.lease),
                        if l.path.is_empty() {
                            String::new()
                        } else {
                            format!("{}/", l.path)
                        }
                    );
                }
                None => {
                    let _ = writeln!(s, "    inbox: {}", p.inbox.display());
                }
            }
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
                if let Some(n) = d.releases {
                    let _ = writeln!(
                        s,
                        "      releases: {n} kept in {}",
                        crate::backend::releases_folder(&d.root).display()
                    );
                }
                if !d.precompress.is_empty() {
                    let names: Vec<&str> = d.precompress.iter().map(|e| e.as_str()).collect();
                    let _ = writeln!(s, "      precompress: {}", names.join(", "));
                }
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
                if d.headers.is_empty() {
                    let _ = writeln!(s, "      headers: (none; each object gets its MIME type)");
                }
                for r in d.headers.rules() {
                    let mut text = format!("      headers: match {:?}", r.pattern);
                    for (key, value) in [
                        ("cache_control", &r.cache_control),
                        ("content_type", &r.content_type),
                        ("content_disposition", &r.content_disposition),
                    ] {
                        if let Some(value) = value {
                            text.push_str(&format!(", {key} {value:?}"));
                        }
                    }
                    let _ = writeln!(s, "{text}");
                }
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
