//! Configuration: reading the YAML file, checking it, and resolving it into
//! the typed [`Config`] every other module works from.
//!
//! This module owns the config file format (SPEC §4): key names, defaults,
//! duration syntax, the `prefix` template language, path resolution against
//! the config file's folder, and every load-time check (unknown and retired
//! keys, ids, duplicates, overlapping folders). Errors name the file and,
//! where the YAML parser knows it, the line and column.
//!
//! It must never touch the file system beyond reading the config file itself
//! in [`load`]: paths are resolved lexically, nothing is created, canonicalised
//! or probed, and nothing here prints or logs.

use std::cell::Cell;
use std::collections::HashSet;
use std::ffi::OsString;
use std::fmt;
use std::io;
use std::marker::PhantomData;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, Visitor};

use crate::paths::{self, IdKind, RelPath};

/// Where the agent looks for its config when neither `--config` nor
/// `$DISTRIBUTOR_CONFIG` says otherwise.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/distributor/config.yaml";
/// The spool folder when the config has no `spool` key.
pub const DEFAULT_SPOOL: &str = "/var/spool/distributor";
/// The environment variable naming the config file.
pub const CONFIG_ENV: &str = "DISTRIBUTOR_CONFIG";

/// Policy keys of earlier versions, rejected wherever they appear.
pub const RETIRED_KEYS: [&str; 4] = ["state", "reconciliation", "takeover", "transfer"];

/// A loaded, checked configuration with every path resolved.
#[derive(Debug, Clone)]
pub struct Config {
    /// The config file it was read from (as given, made absolute).
    pub file: PathBuf,
    /// The spool folder; per-pipeline spools live below it.
    pub spool: PathBuf,
    pub agent: AgentConfig,
    pub pipelines: Vec<Pipeline>,
}

/// Timing and retry settings of the agent (`agent:` section).
#[derive(Debug, Clone, PartialEq)]
pub struct AgentConfig {
    /// Quiet time after a manifest appears before the bundle is claimed.
    pub settle: Duration,
    /// Full inbox rescan period; never zero.
    pub rescan_interval: Duration,
    /// Retention pruning period; zero turns scheduled pruning off.
    pub prune_interval: Duration,
    /// How long to wait for a destination root lock.
    pub lock_timeout: Duration,
    /// Attempts per bundle for transient failures; at least 1.
    pub max_attempts: u32,
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
            rescan_interval: Duration::from_secs(60),
            prune_interval: Duration::from_secs(60 * 60),
            lock_timeout: Duration::from_secs(30),
            max_attempts: 5,
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
    pub destinations: Vec<Destination>,
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

/// How a publication treats the owner's earlier outputs (SPEC §6).
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

/// One target a pipeline publishes to.
#[derive(Debug, Clone)]
pub struct Destination {
    pub id: String,
    /// The destination root (`path`), resolved against the config file's folder.
    pub root: PathBuf,
    pub workflow: Workflow,
    /// The raw `prefix` template text, checked at load; "" for none.
    pub prefix: String,
    /// `publish.source`: copy listed files as they are.
    pub publish_source: bool,
    /// `publish.html`: render `*.md` files to HTML.
    pub publish_html: bool,
    /// `html.raw_html: allow` (true) or `escape` (false).
    pub allow_raw_html: bool,
    /// `links.base_url`, always ending with `/`.
    pub base_url: Option<String>,
    /// `retention.prune`.
    pub prune: Option<PrunePolicy>,
}

/// Retention policy of one owner (`retention.prune`).
#[derive(Debug, Clone, PartialEq)]
pub struct PrunePolicy {
    /// Outputs whose `updated_at` is older than this may be pruned.
    pub max_age: Duration,
    /// Outputs of the owner's N newest sources are never pruned.
    pub keep_latest: u32,
}

/// A place in the config file: the file, and the line and column when the
/// YAML parser knows them (both 1-based).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    pub file: PathBuf,
    pub line_column: Option<(usize, usize)>,
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some((line, column)) = self.line_column {
            write!(f, " line {line} column {column}")?;
        }
        Ok(())
    }
}

/// Why a config could not be loaded. Every message names the file and says
/// what to change; all of them are configuration errors (exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "cannot read config file {}: {source}; check the path given by --config, ${CONFIG_ENV} or the default {DEFAULT_CONFIG_PATH}, and its permissions",
        file.display()
    )]
    Read { file: PathBuf, source: io::Error },

    #[error("{at}: not valid YAML: {message}; fix the syntax")]
    Syntax { at: Place, message: String },

    #[error(
        "{at}: {key:?} was retired; set \"workflow: additive\" or \"workflow: replacement\" on the destination instead"
    )]
    Retired { at: Place, key: String },

    #[error("{at}: {message}; remove the key or fix its spelling")]
    UnknownKey {
        at: Place,
        key: String,
        message: String,
    },

    #[error("{at}: {message}")]
    Invalid { at: Place, message: String },

    #[error(
        "{}: pipeline id {id:?} is used by more than one pipeline; give every pipeline its own id",
        file.display()
    )]
    DuplicatePipeline { file: PathBuf, id: String },

    #[error(
        "{}: pipeline {pipeline:?} has more than one destination with id {id:?}; destination ids must be unique within a pipeline",
        file.display()
    )]
    DuplicateDestination {
        file: PathBuf,
        pipeline: String,
        id: String,
    },

    #[error(
        "{}: pipelines {first:?} and {second:?} share the inbox {}; give each pipeline its own inbox",
        file.display(),
        inbox.display()
    )]
    SharedInbox {
        file: PathBuf,
        first: String,
        second: String,
        inbox: PathBuf,
    },

    #[error(
        "{}: destinations {first:?} and {second:?} of pipeline {pipeline:?} have the same root {}; they would contend for one catalog, so give each its own path",
        file.display(),
        root.display()
    )]
    SharedRoot {
        file: PathBuf,
        pipeline: String,
        first: String,
        second: String,
        root: PathBuf,
    },

    #[error(
        "{}: {first} and {second} overlap (one is the other or lies inside it); move one of them",
        file.display()
    )]
    Overlap {
        file: PathBuf,
        first: String,
        second: String,
    },

    #[error(
        "{}: destination {destination:?} of pipeline {pipeline:?} publishes nothing; set publish.source or publish.html to true",
        file.display()
    )]
    PublishesNothing {
        file: PathBuf,
        pipeline: String,
        destination: String,
    },
}

/// Which file to read: the `--config` flag, else `$DISTRIBUTOR_CONFIG`
/// (when set and not empty), else [`DEFAULT_CONFIG_PATH`].
pub fn resolve_config_path(flag: Option<&Path>) -> PathBuf {
    choose_config_path(flag, std::env::var_os(CONFIG_ENV))
}

fn choose_config_path(flag: Option<&Path>, env: Option<OsString>) -> PathBuf {
    match (flag, env) {
        (Some(flag), _) => flag.to_path_buf(),
        (None, Some(env)) if !env.is_empty() => PathBuf::from(env),
        _ => PathBuf::from(DEFAULT_CONFIG_PATH),
    }
}

/// Reads and checks the config file at `path`.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        file: path.to_path_buf(),
        source,
    })?;
    parse(&text, path)
}

/// Checks config text as if read from `file`; relative paths inside it are
/// resolved against `file`'s folder. Reads nothing from disk.
pub fn parse(text: &str, file: &Path) -> Result<Config, ConfigError> {
    find_retired_keys(text, file)?;
    let raw: RawConfig = serde_norway::from_str(text).map_err(|e| yaml_error(&e, file))?;
    build(raw, file)
}

/// Parses `<integer><unit>` with unit `ms`, `s`, `m`, `h` or `d`
/// (`250ms`, `0s`, `7d`). No sign, spaces, fractions or compound forms.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    const HINT: &str =
        "write a whole number followed by ms, s, m, h or d, such as 250ms, 30s or 7d";
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = text.split_at(digits);
    if number.is_empty() {
        return Err(format!(
            "{text:?} is not a duration: it must start with a digit; {HINT}"
        ));
    }
    let seconds_per_unit: Option<u64> = match unit {
        "ms" => None,
        "s" => Some(1),
        "m" => Some(60),
        "h" => Some(60 * 60),
        "d" => Some(24 * 60 * 60),
        "" => {
            return Err(format!(
                "{text:?} is not a duration: it has no unit; {HINT}"
            ));
        }
        _ if unit.starts_with(['.', ',']) => {
            return Err(format!(
                "{text:?} is not a duration: fractions are not allowed, use a smaller unit (1500ms rather than 1.5s); {HINT}"
            ));
        }
        _ if unit.contains(char::is_whitespace) => {
            return Err(format!(
                "{text:?} is not a duration: it contains a space; {HINT}"
            ));
        }
        _ => {
            return Err(format!(
                "{text:?} is not a duration: unknown unit {unit:?}; {HINT}"
            ));
        }
    };
    let too_large = || format!("{text:?} is too large for a duration");
    let n: u64 = number.parse().map_err(|_| too_large())?;
    match seconds_per_unit {
        None => Ok(Duration::from_millis(n)),
        Some(factor) => n
            .checked_mul(factor)
            .map(Duration::from_secs)
            .ok_or_else(too_large),
    }
}

/// Writes a duration the way the config spells it, in the largest unit that
/// represents it exactly (`250ms`, `60s` stays `1m`, `0s`).
pub fn format_duration(duration: Duration) -> String {
    let ms = duration.as_millis();
    if ms == 0 {
        return "0s".to_owned();
    }
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1000),
    ] {
        if ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

/// The placeholders a `prefix` template may use.
pub const PREFIX_PLACEHOLDERS: [&str; 6] = ["source_id", "pipeline_id", "date", "yyyy", "mm", "dd"];

/// Expands a `prefix` template (SPEC §4, §11.5, §11.17).
///
/// An empty template gives "". Otherwise placeholders are replaced (dates
/// use the UTC date of `created_utc`), one trailing `/` is dropped, and the
/// rest must be a clean relative path without reserved segments. The result
/// has no trailing slash; callers join `prefix/path`.
pub fn expand_prefix(
    template: &str,
    source_id: &str,
    pipeline_id: &str,
    created_utc: time::OffsetDateTime,
) -> Result<String, String> {
    if template.is_empty() {
        return Ok(String::new());
    }
    let utc = created_utc
        .checked_to_offset(time::UtcOffset::UTC)
        .ok_or_else(|| format!("the creation time {created_utc} has no UTC date"))?;
    let (year, month, day) = (utc.year(), u8::from(utc.month()), utc.day());

    let mut out = String::with_capacity(template.len() + source_id.len());
    let mut rest = template;
    while let Some(i) = rest.find(['{', '}']) {
        out.push_str(&rest[..i]);
        if rest[i..].starts_with('}') {
            return Err(format!(
                "prefix {template:?} has a '}}' without a matching '{{'; braces may only surround a placeholder ({})",
                placeholder_list()
            ));
        }
        let after = &rest[i + 1..];
        let Some(end) = after
            .find(['{', '}'])
            .filter(|&e| after[e..].starts_with('}'))
        else {
            return Err(format!(
                "prefix {template:?} has a '{{' that is not closed by '}}'; braces may only surround a placeholder ({})",
                placeholder_list()
            ));
        };
        match &after[..end] {
            "source_id" => out.push_str(source_id),
            "pipeline_id" => out.push_str(pipeline_id),
            "date" => out.push_str(&format!("{year:04}-{month:02}-{day:02}")),
            "yyyy" => out.push_str(&format!("{year:04}")),
            "mm" => out.push_str(&format!("{month:02}")),
            "dd" => out.push_str(&format!("{day:02}")),
            other => {
                return Err(format!(
                    "prefix {template:?} uses the unknown placeholder {{{other}}}; use {}",
                    placeholder_list()
                ));
            }
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);

    let trimmed = out.strip_suffix('/').unwrap_or(&out);
    let path = RelPath::parse(trimmed).map_err(|e| {
        format!("prefix {template:?} expands to {out:?}, which is not a clean relative path: {e}")
    })?;
    if path.is_reserved() {
        return Err(format!(
            "prefix {template:?} expands to {out:?}, which uses a name starting with {:?}; those are reserved for the tool",
            paths::RESERVED_PREFIX
        ));
    }
    Ok(path.as_str().to_owned())
}

fn placeholder_list() -> String {
    PREFIX_PLACEHOLDERS
        .iter()
        .map(|p| format!("{{{p}}}"))
        .collect::<Vec<_>>()
        .join(", ")
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
            for d in &pipeline.destinations {
                if d.allow_raw_html && !d.publish_html {
                    warnings.push(format!(
                        "destination {:?} of pipeline {:?} sets html.raw_html: allow but does not publish HTML; the setting has no effect",
                        d.id, pipeline.id
                    ));
                }
            }
        }
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
            "  rescan_interval: {}",
            format_duration(a.rescan_interval)
        );
        let _ = writeln!(
            s,
            "  prune_interval: {}",
            or_off(a.prune_interval, "scheduled pruning off")
        );
        let _ = writeln!(s, "  lock_timeout: {}", format_duration(a.lock_timeout));
        let _ = writeln!(s, "  max_attempts: {}", a.max_attempts);
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
        let _ = writeln!(s, "pipelines: {}", self.pipelines.len());
        for p in &self.pipelines {
            let _ = writeln!(s, "  pipeline {}", p.id);
            let _ = writeln!(s, "    inbox: {}", p.inbox.display());
            let _ = writeln!(s, "    spool: {}", p.spool_dir(self).display());
            for d in &p.destinations {
                let yes_no = |b: bool| if b { "yes" } else { "no" };
                let _ = writeln!(s, "    destination {}", d.id);
                let _ = writeln!(s, "      backend: local");
                let _ = writeln!(s, "      root: {}", d.root.display());
                let _ = writeln!(s, "      workflow: {}", d.workflow);
                if d.prefix.is_empty() {
                    let _ = writeln!(s, "      prefix: (none)");
                } else {
                    let _ = writeln!(s, "      prefix: {:?}", d.prefix);
                }
                let _ = writeln!(
                    s,
                    "      publish: source {}, html {}",
                    yes_no(d.publish_source),
                    yes_no(d.publish_html)
                );
                let raw = if d.allow_raw_html { "allow" } else { "escape" };
                let _ = writeln!(s, "      raw_html: {raw}");
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
            }
        }
        for warning in self.warnings() {
            let _ = writeln!(s, "warning: {warning}");
        }
        s
    }
}

// ---------------------------------------------------------------------------
// Retired keys: a pass over the whole YAML document, before the typed parse,
// so the retired-key message wins over serde's "unknown field".

fn find_retired_keys(text: &str, file: &Path) -> Result<(), ConfigError> {
    let hit = Cell::new(None);
    let de = serde_norway::Deserializer::from_str(text);
    match (Scan {
        is_key: false,
        hit: &hit,
    })
    .deserialize(de)
    {
        Ok(()) => Ok(()),
        Err(e) => match hit.get() {
            Some(key) => Err(ConfigError::Retired {
                at: place(&e, file),
                key: key.to_owned(),
            }),
            None => Err(ConfigError::Syntax {
                at: place(&e, file),
                message: message_without_location(&e),
            }),
        },
    }
}

/// Walks any YAML value; fails on a mapping key that is a retired key.
#[derive(Clone, Copy)]
struct Scan<'a> {
    is_key: bool,
    hit: &'a Cell<Option<&'static str>>,
}

impl<'de> DeserializeSeed<'de> for Scan<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Scan<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_i128<E: de::Error>(self, _: i128) -> Result<(), E> {
        Ok(())
    }
    fn visit_u128<E: de::Error>(self, _: u128) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        if self.is_key
            && let Some(key) = RETIRED_KEYS.iter().find(|k| **k == v)
        {
            self.hit.set(Some(key));
            return Err(E::custom(format!("{key:?} was retired")));
        }
        Ok(())
    }
    fn visit_bytes<E: de::Error>(self, _: &[u8]) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        self.value().deserialize(d)
    }
    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        self.value().deserialize(d)
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(self.value())?.is_some() {}
        Ok(())
    }
    fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let key = Scan {
            is_key: true,
            hit: self.hit,
        };
        while map.next_key_seed(key)?.is_some() {
            map.next_value_seed(self.value())?;
        }
        Ok(())
    }
    fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<(), A::Error> {
        // A tagged value (`!tag value`): look inside it.
        use de::VariantAccess as _;
        let ((), variant) = data.variant_seed(self.value())?;
        variant.newtype_variant_seed(self.value())
    }
}

impl Scan<'_> {
    fn value(self) -> Self {
        Scan {
            is_key: false,
            ..self
        }
    }
}

fn place(e: &serde_norway::Error, file: &Path) -> Place {
    Place {
        file: file.to_path_buf(),
        line_column: e.location().map(|l| (l.line(), l.column())),
    }
}

/// serde_norway appends " at line L column C"; the place is shown separately.
fn message_without_location(e: &serde_norway::Error) -> String {
    let text = e.to_string();
    match e.location() {
        Some(l) => text.replacen(
            &format!(" at line {} column {}", l.line(), l.column()),
            "",
            1,
        ),
        None => text,
    }
}

fn yaml_error(e: &serde_norway::Error, file: &Path) -> ConfigError {
    let at = place(e, file);
    // serde speaks of fields; operators write keys.
    let mut message = message_without_location(e)
        .replacen("unknown field `", "unknown key `", 1)
        .replacen("missing field `", "missing required key `", 1)
        .replacen("duplicate field `", "duplicate key `", 1);
    if message.contains("missing required key `") {
        message.push_str("; add it");
    } else if message.contains("duplicate key `") {
        message.push_str("; keep only one of them");
    }
    if let Some(start) = message.find("unknown key `") {
        let rest = &message[start + "unknown key `".len()..];
        let key = rest.split('`').next().unwrap_or_default().to_owned();
        return ConfigError::UnknownKey { at, key, message };
    }
    ConfigError::Invalid { at, message }
}

// ---------------------------------------------------------------------------
// The file as written. Every leaf is checked while it is read, so a bad value
// is reported at its own line and column.

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping with the keys spool, agent and pipelines"
)]
struct RawConfig {
    spool: Option<Checked<PathRule>>,
    agent: Option<RawAgent>,
    pipelines: Option<Vec<RawPipeline>>,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping of agent settings (settle, rescan_interval, prune_interval, lock_timeout, max_attempts, done_retention, metrics_file)"
)]
struct RawAgent {
    settle: Option<Checked<DurationRule>>,
    rescan_interval: Option<Checked<IntervalRule>>,
    prune_interval: Option<Checked<DurationRule>>,
    lock_timeout: Option<Checked<DurationRule>>,
    max_attempts: Option<MaxAttempts>,
    done_retention: Option<Checked<DurationRule>>,
    metrics_file: Option<Checked<FilePathRule>>,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a pipeline: a mapping with id, an optional inbox, and destinations"
)]
struct RawPipeline {
    id: Checked<PipelineIdRule>,
    inbox: Option<Checked<PathRule>>,
    destinations: Destinations,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a destination: a mapping with id, path and optional backend, workflow, prefix, publish, html, links and retention"
)]
struct RawDestination {
    id: Checked<DestinationIdRule>,
    #[allow(dead_code)] // only `local` exists; the check is the point
    backend: Option<Checked<BackendRule>>,
    path: Checked<PathRule>,
    workflow: Option<Checked<WorkflowRule>>,
    prefix: Option<Checked<PrefixRule>>,
    publish: Option<RawPublish>,
    html: Option<RawHtml>,
    links: Option<RawLinks>,
    retention: Option<RawRetention>,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping with source and html (true or false)"
)]
struct RawPublish {
    source: Option<bool>,
    html: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping with raw_html")]
struct RawHtml {
    raw_html: Option<Checked<RawHtmlRule>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping with base_url")]
struct RawLinks {
    base_url: Option<Checked<BaseUrlRule>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping with prune")]
struct RawRetention {
    prune: Option<RawPrune>,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping with max_age and an optional keep_latest"
)]
struct RawPrune {
    max_age: Checked<DurationRule>,
    keep_latest: Option<KeepLatest>,
}

/// A non-empty list of destinations.
struct Destinations(Vec<RawDestination>);

impl<'de> Deserialize<'de> for Destinations {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let list = Vec::<RawDestination>::deserialize(d)?;
        if list.is_empty() {
            return Err(de::Error::custom(
                "the pipeline has no destinations; add at least one under destinations",
            ));
        }
        Ok(Destinations(list))
    }
}

/// A rule for one scalar text value.
trait Rule {
    type Out;
    const EXPECTING: &'static str;
    fn check(text: &str) -> Result<Self::Out, String>;
}

/// A scalar checked by rule `R` while it is read.
struct Checked<R: Rule>(R::Out);

impl<'de, R: Rule> Deserialize<'de> for Checked<R> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<R>(PhantomData<R>);
        impl<'de, R: Rule> Visitor<'de> for V<R> {
            type Value = Checked<R>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(R::EXPECTING)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Checked<R>, E> {
                R::check(v).map(Checked).map_err(E::custom)
            }
        }
        d.deserialize_str(V::<R>(PhantomData))
    }
}

enum PipelineIdRule {}
impl Rule for PipelineIdRule {
    type Out = String;
    const EXPECTING: &'static str = "a pipeline id";
    fn check(text: &str) -> Result<String, String> {
        paths::check_id(IdKind::Pipeline, text).map(|()| text.to_owned())
    }
}

enum DestinationIdRule {}
impl Rule for DestinationIdRule {
    type Out = String;
    const EXPECTING: &'static str = "a destination id";
    fn check(text: &str) -> Result<String, String> {
        paths::check_id(IdKind::Destination, text).map(|()| text.to_owned())
    }
}

enum PathRule {}
impl Rule for PathRule {
    type Out = String;
    const EXPECTING: &'static str = "a folder path";
    fn check(text: &str) -> Result<String, String> {
        if text.is_empty() {
            return Err("the path is empty; give a folder path".to_owned());
        }
        if text.chars().any(char::is_control) {
            return Err(format!("the path {text:?} contains a control character"));
        }
        if text == "~" || text.starts_with("~/") {
            return Err(format!(
                "the path {text:?} starts with '~', which is not expanded; write the full path"
            ));
        }
        Ok(text.to_owned())
    }
}

enum FilePathRule {}
impl Rule for FilePathRule {
    type Out = String;
    const EXPECTING: &'static str = "a file path";
    fn check(text: &str) -> Result<String, String> {
        let text = PathRule::check(text).map_err(|e| e.replace("a folder path", "a file path"))?;
        let names_a_file = !text.ends_with('/')
            && matches!(
                Path::new(&text).components().next_back(),
                Some(Component::Normal(_))
            );
        if !names_a_file {
            return Err(format!(
                "the path {text:?} names a folder, not a file; give a file path such as /var/lib/prometheus/node-exporter/distributor.prom"
            ));
        }
        Ok(text)
    }
}

enum DurationRule {}
impl Rule for DurationRule {
    type Out = Duration;
    const EXPECTING: &'static str = "a duration such as 250ms, 30s, 5m, 1h or 7d";
    fn check(text: &str) -> Result<Duration, String> {
        parse_duration(text)
    }
}

/// A duration that must not be zero.
enum IntervalRule {}
impl Rule for IntervalRule {
    type Out = Duration;
    const EXPECTING: &'static str = DurationRule::EXPECTING;
    fn check(text: &str) -> Result<Duration, String> {
        let d = parse_duration(text)?;
        if d.is_zero() {
            return Err(format!(
                "{text:?} would rescan without pause; give a period greater than zero, such as 60s"
            ));
        }
        Ok(d)
    }
}

enum WorkflowRule {}
impl Rule for WorkflowRule {
    type Out = Workflow;
    const EXPECTING: &'static str = "additive or replacement";
    fn check(text: &str) -> Result<Workflow, String> {
        match text {
            "additive" => Ok(Workflow::Additive),
            "replacement" => Ok(Workflow::Replacement),
            _ => Err(format!(
                "workflow {text:?} is not known; use additive or replacement"
            )),
        }
    }
}

enum RawHtmlRule {}
impl Rule for RawHtmlRule {
    type Out = bool;
    const EXPECTING: &'static str = "escape or allow";
    fn check(text: &str) -> Result<bool, String> {
        match text {
            "escape" => Ok(false),
            "allow" => Ok(true),
            _ => Err(format!(
                "raw_html {text:?} is not known; use escape or allow"
            )),
        }
    }
}

enum BackendRule {}
impl Rule for BackendRule {
    type Out = ();
    const EXPECTING: &'static str = "local";
    fn check(text: &str) -> Result<(), String> {
        match text {
            "local" => Ok(()),
            _ => Err(format!(
                "backend {text:?} is not supported; the only backend is local"
            )),
        }
    }
}

enum PrefixRule {}
impl Rule for PrefixRule {
    type Out = String;
    const EXPECTING: &'static str = "a prefix template in quotes, such as \"{source_id}/\"";
    fn check(text: &str) -> Result<String, String> {
        let sample = time::macros::datetime!(2026-01-31 12:00 UTC);
        expand_prefix(text, "sample-source", "sample-pipeline", sample)?;
        Ok(text.to_owned())
    }
}

enum BaseUrlRule {}
impl Rule for BaseUrlRule {
    type Out = String;
    const EXPECTING: &'static str = "an absolute http or https URL";
    fn check(text: &str) -> Result<String, String> {
        check_base_url(text)
    }
}

/// Accepts `http://host[/path]` or `https://...`; returns it ending in `/`.
fn check_base_url(text: &str) -> Result<String, String> {
    let lower = text.to_ascii_lowercase();
    let rest = if lower.starts_with("https://") {
        &text["https://".len()..]
    } else if lower.starts_with("http://") {
        &text["http://".len()..]
    } else {
        return Err(format!(
            "base_url {text:?} is not an absolute http or https URL; write it like https://example.com/reports/"
        ));
    };
    let host = rest.split('/').next().unwrap_or_default();
    if host.is_empty() {
        return Err(format!("base_url {text:?} has no host name"));
    }
    if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "base_url {text:?} contains a space or control character; percent-encode it"
        ));
    }
    if text.contains(['?', '#']) {
        return Err(format!(
            "base_url {text:?} has a query or fragment; output paths are appended to it, so remove the '?' or '#' part"
        ));
    }
    let mut url = text.to_owned();
    if !url.ends_with('/') {
        url.push('/');
    }
    Ok(url)
}

/// `max_attempts`: an integer of at least 1.
struct MaxAttempts(u32);

impl<'de> Deserialize<'de> for MaxAttempts {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(CountVisitor {
            field: "max_attempts",
            min: 1,
            hint: "use 1 for a single attempt without retries",
        })
        .map(MaxAttempts)
    }
}

/// `keep_latest`: an integer of at least 0.
struct KeepLatest(u32);

impl<'de> Deserialize<'de> for KeepLatest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(CountVisitor {
            field: "keep_latest",
            min: 0,
            hint: "use 0 to protect no source, or a positive number",
        })
        .map(KeepLatest)
    }
}

struct CountVisitor {
    field: &'static str,
    min: u32,
    hint: &'static str,
}

impl CountVisitor {
    fn check<E: de::Error>(&self, n: i128) -> Result<u32, E> {
        if n < i128::from(self.min) {
            return Err(E::custom(format!(
                "{} must be at least {}, not {n}; {}",
                self.field, self.min, self.hint
            )));
        }
        u32::try_from(n).map_err(|_| {
            E::custom(format!(
                "{} is {n}, which is larger than {}",
                self.field,
                u32::MAX
            ))
        })
    }
}

impl<'de> Visitor<'de> for CountVisitor {
    type Value = u32;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a whole number of at least {}", self.min)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<u32, E> {
        self.check(i128::from(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<u32, E> {
        self.check(i128::from(v))
    }
}

// ---------------------------------------------------------------------------
// From the file as written to the resolved config.

fn build(raw: RawConfig, file: &Path) -> Result<Config, ConfigError> {
    let file_abs = normalize(&std::path::absolute(file).unwrap_or_else(|_| file.to_path_buf()));
    let base = file_abs.parent().map(Path::to_path_buf).unwrap_or_default();
    let resolve = |text: &str| normalize(&base.join(text));

    let spool = match raw.spool {
        Some(Checked(text)) => resolve(&text),
        None => PathBuf::from(DEFAULT_SPOOL),
    };

    let defaults = AgentConfig::default();
    let agent = match raw.agent {
        None => defaults,
        Some(a) => AgentConfig {
            metrics_file: a.metrics_file.map(|c| resolve(&c.0)),
            settle: a.settle.map_or(defaults.settle, |c| c.0),
            rescan_interval: a.rescan_interval.map_or(defaults.rescan_interval, |c| c.0),
            prune_interval: a.prune_interval.map_or(defaults.prune_interval, |c| c.0),
            lock_timeout: a.lock_timeout.map_or(defaults.lock_timeout, |c| c.0),
            max_attempts: a.max_attempts.map_or(defaults.max_attempts, |c| c.0),
            done_retention: a.done_retention.map_or(defaults.done_retention, |c| c.0),
        },
    };

    let mut pipelines = Vec::new();
    for rp in raw.pipelines.unwrap_or_default() {
        let id = rp.id.0;
        let inbox = match rp.inbox {
            Some(Checked(text)) => resolve(&text),
            None => spool.join(&id).join("inbox"),
        };
        let mut destinations = Vec::new();
        for rd in rp.destinations.0 {
            let publish = rd.publish.unwrap_or(RawPublish {
                source: None,
                html: None,
            });
            destinations.push(Destination {
                id: rd.id.0,
                root: resolve(&rd.path.0),
                workflow: rd.workflow.map_or(Workflow::Additive, |c| c.0),
                prefix: rd.prefix.map(|c| c.0).unwrap_or_default(),
                publish_source: publish.source.unwrap_or(true),
                publish_html: publish.html.unwrap_or(false),
                allow_raw_html: rd.html.and_then(|h| h.raw_html).is_some_and(|c| c.0),
                base_url: rd.links.and_then(|l| l.base_url).map(|c| c.0),
                prune: rd.retention.and_then(|r| r.prune).map(|p| PrunePolicy {
                    max_age: p.max_age.0,
                    keep_latest: p.keep_latest.map_or(1, |k| k.0),
                }),
            });
        }
        pipelines.push(Pipeline {
            id,
            inbox,
            destinations,
        });
    }

    let config = Config {
        file: file_abs,
        spool,
        agent,
        pipelines,
    };
    check_relations(&config, file)?;
    Ok(config)
}

/// Removes `.` segments, repeated and trailing separators. `..` is kept:
/// without the file system we cannot know where it leads.
fn normalize(path: &Path) -> PathBuf {
    path.components().collect()
}

/// A comparison key: [`normalize`] plus lexical `..` folding, so that
/// `/a/b/../c` and `/a/c` count as the same folder when looking for clashes.
fn clash_key(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                if !out.pop() {
                    out.push(c);
                }
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

fn overlaps(a: &Path, b: &Path) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// Checks that need the whole config: unique ids, and folders that must not
/// be shared or nested.
fn check_relations(config: &Config, file: &Path) -> Result<(), ConfigError> {
    let file = file.to_path_buf();

    let mut seen = HashSet::new();
    for p in &config.pipelines {
        if !seen.insert(p.id.as_str()) {
            return Err(ConfigError::DuplicatePipeline {
                file,
                id: p.id.clone(),
            });
        }
    }

    for p in &config.pipelines {
        let mut ids = HashSet::new();
        for d in &p.destinations {
            if !ids.insert(d.id.as_str()) {
                return Err(ConfigError::DuplicateDestination {
                    file,
                    pipeline: p.id.clone(),
                    id: d.id.clone(),
                });
            }
            if !d.publish_source && !d.publish_html {
                return Err(ConfigError::PublishesNothing {
                    file,
                    pipeline: p.id.clone(),
                    destination: d.id.clone(),
                });
            }
            // The template was checked with sample values; check it again
            // with the real pipeline id.
            let sample = time::macros::datetime!(2026-01-31 12:00 UTC);
            if let Err(message) = expand_prefix(&d.prefix, "sample-source", &p.id, sample) {
                return Err(ConfigError::Invalid {
                    at: Place {
                        file,
                        line_column: None,
                    },
                    message: format!("destination {:?} of pipeline {:?}: {message}", d.id, p.id),
                });
            }
        }
        for (i, a) in p.destinations.iter().enumerate() {
            for b in &p.destinations[i + 1..] {
                if clash_key(&a.root) == clash_key(&b.root) {
                    return Err(ConfigError::SharedRoot {
                        file,
                        pipeline: p.id.clone(),
                        first: a.id.clone(),
                        second: b.id.clone(),
                        root: a.root.clone(),
                    });
                }
            }
        }
    }

    // Folders the agent moves bundles through.
    let inbox = |p: &Pipeline| {
        (
            format!("the inbox of pipeline {:?} ({})", p.id, p.inbox.display()),
            clash_key(&p.inbox),
        )
    };
    for (i, a) in config.pipelines.iter().enumerate() {
        for b in &config.pipelines[i + 1..] {
            if clash_key(&a.inbox) == clash_key(&b.inbox) {
                return Err(ConfigError::SharedInbox {
                    file,
                    first: a.id.clone(),
                    second: b.id.clone(),
                    inbox: a.inbox.clone(),
                });
            }
            let (first, ka) = inbox(a);
            let (second, kb) = inbox(b);
            if overlaps(&ka, &kb) {
                return Err(ConfigError::Overlap {
                    file,
                    first,
                    second,
                });
            }
        }
    }
    for p in &config.pipelines {
        let (first, key) = inbox(p);
        for q in &config.pipelines {
            for stage in ["work", "done", "failed"] {
                let dir = q.spool_dir(config).join(stage);
                if overlaps(&key, &clash_key(&dir)) {
                    let second = format!(
                        "the {stage} folder of pipeline {:?} ({})",
                        q.id,
                        dir.display()
                    );
                    return Err(ConfigError::Overlap {
                        file,
                        first,
                        second,
                    });
                }
            }
        }
    }

    // Destination roots must stay clear of the spool and every inbox: a
    // replacement or forced publication may delete anything in its root.
    let spool_key = clash_key(&config.spool);
    for p in &config.pipelines {
        for d in &p.destinations {
            let root_key = clash_key(&d.root);
            let first = format!(
                "the root of destination {:?} of pipeline {:?} ({})",
                d.id,
                p.id,
                d.root.display()
            );
            if overlaps(&root_key, &spool_key) {
                let second = format!("the spool ({})", config.spool.display());
                return Err(ConfigError::Overlap {
                    file,
                    first,
                    second,
                });
            }
            for q in &config.pipelines {
                let (second, key) = inbox(q);
                if overlaps(&root_key, &key) {
                    return Err(ConfigError::Overlap {
                        file,
                        first,
                        second,
                    });
                }
            }
        }
    }

    // The metrics file is rewritten all the time: inside a root it would be
    // unmanaged content, inside a pipeline's folders a stray entry.
    if let Some(metrics) = &config.agent.metrics_file {
        let metrics_key = clash_key(metrics);
        let first = format!("agent.metrics_file ({})", metrics.display());
        for p in &config.pipelines {
            let mut folders = vec![
                (
                    format!(
                        "the spool folder of pipeline {:?} ({})",
                        p.id,
                        p.spool_dir(config).display()
                    ),
                    clash_key(&p.spool_dir(config)),
                ),
                inbox(p),
            ];
            for d in &p.destinations {
                folders.push((
                    format!(
                        "the root of destination {:?} of pipeline {:?} ({})",
                        d.id,
                        p.id,
                        d.root.display()
                    ),
                    clash_key(&d.root),
                ));
            }
            for (second, key) in folders {
                if overlaps(&metrics_key, &key) {
                    return Err(ConfigError::Overlap {
                        file,
                        first,
                        second,
                    });
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    const FILE: &str = "/etc/distributor/config.yaml";

    fn ok(text: &str) -> Config {
        match parse(text, Path::new(FILE)) {
            Ok(config) => config,
            Err(e) => panic!("config should load: {e}\n{text}"),
        }
    }

    fn err(text: &str) -> ConfigError {
        match parse(text, Path::new(FILE)) {
            Ok(_) => panic!("config should be rejected:\n{text}"),
            Err(e) => e,
        }
    }

    /// One pipeline `p` with one destination `d` whose extra keys are `dest`
    /// (indented by 8 spaces in the caller's text).
    fn with_destination(dest: &str) -> String {
        format!(
            "pipelines:\n  - id: p\n    destinations:\n      - id: d\n        path: /srv/out\n{dest}"
        )
    }

    const SPEC_EXAMPLE: &str = r#"
spool: /var/spool/distributor      # default; per-pipeline spools live under it
agent:
  settle: 250ms
  rescan_interval: 60s
  prune_interval: 1h
  lock_timeout: 30s
  max_attempts: 5
  done_retention: 7d
pipelines:
  - id: reports
    inbox: ./inbox/reports
    destinations:
      - id: static-site
        backend: local
        path: /srv/reports/archive
        workflow: additive
        prefix: "{source_id}/"
        publish:
          source: true
          html: false
        html:
          raw_html: escape
        links:
          base_url: https://reports.example.com/archive/
        retention:
          prune:
            max_age: 30d
            keep_latest: 1
"#;

    #[test]
    fn spec_example_parses_to_the_expected_values() {
        let c = ok(SPEC_EXAMPLE);
        assert_eq!(c.file, PathBuf::from(FILE));
        assert_eq!(c.spool, PathBuf::from("/var/spool/distributor"));
        assert_eq!(c.agent, AgentConfig::default());
        assert_eq!(c.pipelines.len(), 1);
        let p = c.pipeline("reports").unwrap();
        assert_eq!(p.inbox, PathBuf::from("/etc/distributor/inbox/reports"));
        assert_eq!(
            p.spool_dir(&c),
            PathBuf::from("/var/spool/distributor/reports")
        );
        assert_eq!(p.destinations.len(), 1);
        let d = p.destination("static-site").unwrap();
        assert_eq!(d.root, PathBuf::from("/srv/reports/archive"));
        assert_eq!(d.workflow, Workflow::Additive);
        assert_eq!(d.workflow.as_str(), "additive");
        assert_eq!(d.prefix, "{source_id}/");
        assert!(d.publish_source);
        assert!(!d.publish_html);
        assert!(!d.allow_raw_html);
        assert_eq!(
            d.base_url.as_deref(),
            Some("https://reports.example.com/archive/")
        );
        assert_eq!(
            d.prune,
            Some(PrunePolicy {
                max_age: Duration::from_secs(30 * 86_400),
                keep_latest: 1
            })
        );
        assert!(c.pipeline("other").is_none());
        assert!(p.destination("other").is_none());
        assert!(c.warnings().is_empty());
    }

    #[test]
    fn defaults_fill_every_optional_key() {
        let c = parse(
            "pipelines:\n  - id: p\n    destinations:\n      - id: d\n        path: out\n",
            Path::new("/srv/cfg/config.yaml"),
        )
        .unwrap();
        assert_eq!(c.spool, PathBuf::from(DEFAULT_SPOOL));
        let a = &c.agent;
        assert_eq!(a.settle, Duration::from_millis(250));
        assert_eq!(a.rescan_interval, Duration::from_secs(60));
        assert_eq!(a.prune_interval, Duration::from_secs(3600));
        assert_eq!(a.lock_timeout, Duration::from_secs(30));
        assert_eq!(a.max_attempts, 5);
        assert_eq!(a.done_retention, Duration::from_secs(7 * 86_400));
        let p = &c.pipelines[0];
        assert_eq!(p.inbox, PathBuf::from("/var/spool/distributor/p/inbox"));
        let d = &p.destinations[0];
        assert_eq!(d.root, PathBuf::from("/srv/cfg/out"));
        assert_eq!(d.workflow, Workflow::Additive);
        assert_eq!(d.prefix, "");
        assert!(d.publish_source && !d.publish_html && !d.allow_raw_html);
        assert_eq!(d.base_url, None);
        assert_eq!(d.prune, None);
    }

    #[test]
    fn explicit_values_and_empty_sections() {
        let c = ok(&with_destination(
            "        workflow: replacement\n        publish:\n          source: false\n          html: true\n        html:\n          raw_html: allow\n        links:\n          base_url: http://h.example\n        retention:\n          prune:\n            max_age: 0s\n",
        ));
        let d = &c.pipelines[0].destinations[0];
        assert_eq!(d.workflow, Workflow::Replacement);
        assert_eq!(d.workflow.as_str(), "replacement");
        assert!(!d.publish_source && d.publish_html && d.allow_raw_html);
        assert_eq!(d.base_url.as_deref(), Some("http://h.example/"));
        assert_eq!(
            d.prune,
            Some(PrunePolicy {
                max_age: Duration::ZERO,
                keep_latest: 1
            })
        );

        // Keys present but empty mean "use the defaults".
        let c = ok(
            "agent:\npipelines:\n  - id: p\n    destinations:\n      - id: d\n        path: /srv/out\n        publish:\n        html:\n        links:\n        retention:\n",
        );
        assert_eq!(c.agent, AgentConfig::default());
        let d = &c.pipelines[0].destinations[0];
        assert!(d.publish_source && !d.publish_html && !d.allow_raw_html);
        assert_eq!(d.base_url, None);
        assert_eq!(d.prune, None);
    }

    #[test]
    fn zero_pipelines_is_valid_but_warned_about() {
        for text in [
            "",
            "# nothing yet\n",
            "pipelines: []\n",
            "spool: /s\npipelines:\n",
        ] {
            let c = ok(text);
            assert!(c.pipelines.is_empty(), "{text:?}");
            assert_eq!(c.warnings().len(), 1, "{text:?}");
            assert!(c.summary().contains("warning: no pipelines"), "{text:?}");
        }
    }

    #[test]
    fn same_destination_id_in_different_pipelines_is_fine() {
        let c = ok(
            "pipelines:\n  - id: a\n    destinations:\n      - id: site\n        path: /srv/a\n  - id: b\n    destinations:\n      - id: site\n        path: /srv/b\n",
        );
        assert_eq!(c.pipelines.len(), 2);
        // Two pipelines may also share a root: the catalog records owners.
        ok(
            "pipelines:\n  - id: a\n    destinations:\n      - id: site\n        path: /srv/x\n  - id: b\n    destinations:\n      - id: site\n        path: /srv/x\n",
        );
    }

    #[test]
    fn numeric_looking_ids_are_text() {
        let c = ok(
            "pipelines:\n  - id: 2024\n    destinations:\n      - id: 1.5\n        path: /srv/x\n",
        );
        assert_eq!(c.pipelines[0].id, "2024");
        assert_eq!(c.pipelines[0].destinations[0].id, "1.5");
    }

    #[test]
    fn null_means_default_for_optional_paths() {
        let c = ok(
            "spool: ~\npipelines:\n  - id: p\n    inbox: null\n    destinations:\n      - id: d\n        path: /srv/x\n",
        );
        assert_eq!(c.spool, PathBuf::from(DEFAULT_SPOOL));
        assert_eq!(
            c.pipelines[0].inbox,
            PathBuf::from("/var/spool/distributor/p/inbox")
        );
        let e = err("pipelines:\n  - id: p\n    destinations:\n      - id: d\n        path: ~\n");
        assert!(e.to_string().contains("line 5"), "{e}");
    }

    /// (name, config text, substrings the message must contain)
    fn error_cases() -> Vec<(&'static str, String, Vec<&'static str>)> {
        let dest = |extra: &str| with_destination(extra);
        let two_pipelines = |a_extra: &str, b_extra: &str| {
            format!(
                "pipelines:\n  - id: a\n{a_extra}    destinations:\n      - id: d\n        path: /srv/a\n  - id: b\n{b_extra}    destinations:\n      - id: d\n        path: /srv/b\n"
            )
        };
        vec![
            (
                "yaml syntax",
                "pipelines: [\n".to_owned(),
                vec![FILE, "line 2 column 1", "not valid YAML", "fix the syntax"],
            ),
            (
                "unquoted prefix braces",
                dest("        prefix: {source_id}/\n"),
                vec!["line 6", "not valid YAML"],
            ),
            (
                "top-level not a mapping",
                "- a\n".to_owned(),
                vec!["line 1 column 1", "expected a mapping"],
            ),
            (
                "unknown top key",
                "spool: /s\nspoool: /t\n".to_owned(),
                vec![FILE, "line 2 column 1", "unknown key `spoool`", "expected one of", "spelling"],
            ),
            (
                "unknown agent key",
                "agent:\n  setle: 1s\n".to_owned(),
                vec!["line 2 column 3", "agent", "`setle`"],
            ),
            (
                "unknown destination key",
                dest("        mode: fast\n"),
                vec!["line 6 column 9", "pipelines[0].destinations[0]", "`mode`"],
            ),
            (
                "unknown nested key",
                dest("        publish:\n          pdf: true\n"),
                vec!["line 7 column 11", "`pdf`"],
            ),
            (
                "bad pipeline id",
                "pipelines:\n  - id: bad id\n    destinations:\n      - id: d\n        path: /srv/x\n".to_owned(),
                vec!["line 2 column 9", "pipeline id \"bad id\"", "letters, digits"],
            ),
            (
                "pipeline id starting with a dot",
                "pipelines:\n  - id: .p\n    destinations:\n      - id: d\n        path: /srv/x\n".to_owned(),
                vec!["line 2", "must start with a letter or digit"],
            ),
            (
                "bad destination id",
                "pipelines:\n  - id: p\n    destinations:\n      - id: a/b\n        path: /srv/x\n".to_owned(),
                vec!["line 4 column 13", "destination id \"a/b\""],
            ),
            (
                "missing id",
                "pipelines:\n  - destinations:\n      - id: d\n        path: /srv/x\n".to_owned(),
                vec!["line 2", "missing required key `id`"],
            ),
            (
                "missing path",
                "pipelines:\n  - id: p\n    destinations:\n      - id: d\n".to_owned(),
                vec!["line 4", "missing required key `path`"],
            ),
            (
                "empty path",
                dest("").replace("path: /srv/out", "path: \"\""),
                vec!["line 5", "path is empty"],
            ),
            (
                "tilde path",
                dest("").replace("path: /srv/out", "path: ~/out"),
                vec!["line 5", "not expanded"],
            ),
            (
                "duplicate pipeline ids",
                "pipelines:\n  - id: p\n    inbox: /in/1\n    destinations:\n      - id: d\n        path: /srv/x\n  - id: p\n    inbox: /in/2\n    destinations:\n      - id: d\n        path: /srv/y\n".to_owned(),
                vec![FILE, "pipeline id \"p\"", "more than one pipeline"],
            ),
            (
                "duplicate destination ids in one pipeline",
                "pipelines:\n  - id: p\n    destinations:\n      - id: d\n        path: /srv/x\n      - id: d\n        path: /srv/y\n".to_owned(),
                vec![FILE, "pipeline \"p\"", "destination with id \"d\"", "unique within a pipeline"],
            ),
            (
                "shared inbox",
                two_pipelines("    inbox: /in/x\n", "    inbox: /in/./x/\n"),
                vec![FILE, "\"a\" and \"b\" share the inbox /in/x", "its own inbox"],
            ),
            (
                "shared inbox through ..",
                two_pipelines("    inbox: /in/x\n", "    inbox: /in/y/../x\n"),
                vec!["share the inbox"],
            ),
            (
                "shared inbox: explicit equals another's default",
                two_pipelines("    inbox: /var/spool/distributor/b/inbox\n", ""),
                vec!["share the inbox"],
            ),
            (
                "nested inboxes",
                two_pipelines("    inbox: /in\n", "    inbox: /in/b\n"),
                vec!["the inbox of pipeline \"a\" (/in)", "the inbox of pipeline \"b\" (/in/b)", "overlap"],
            ),
            (
                "inbox is a work folder",
                two_pipelines("    inbox: /var/spool/distributor/b/work\n", ""),
                vec!["the work folder of pipeline \"b\"", "overlap"],
            ),
            (
                "inbox holds the spool",
                two_pipelines("    inbox: /var/spool\n", ""),
                vec!["the inbox of pipeline \"a\"", "overlap"],
            ),
            (
                "two destinations with the same root",
                "pipelines:\n  - id: p\n    destinations:\n      - id: d1\n        path: /srv/x\n      - id: d2\n        path: /srv/./x/\n".to_owned(),
                vec![FILE, "\"d1\" and \"d2\"", "same root /srv/x", "one catalog"],
            ),
            (
                "root inside the spool",
                dest("").replace("path: /srv/out", "path: /var/spool/distributor/site"),
                vec!["root of destination \"d\"", "the spool", "overlap"],
            ),
            (
                "root holding the spool",
                dest("").replace("path: /srv/out", "path: /var"),
                vec!["the spool", "overlap"],
            ),
            (
                "root equal to an inbox",
                dest("").replace("    destinations:", "    inbox: /srv/out\n    destinations:"),
                vec!["root of destination", "the inbox of pipeline \"p\"", "overlap"],
            ),
            (
                "backend other than local",
                dest("        backend: s3\n"),
                vec!["line 6 column 18", "backend \"s3\"", "only backend is local"],
            ),
            (
                "bad duration",
                "agent:\n  settle: 5\n".to_owned(),
                vec!["line 2 column 11", "agent.settle", "\"5\"", "no unit", "250ms"],
            ),
            (
                "bad duration unit",
                "agent:\n  done_retention: 1w\n".to_owned(),
                vec!["line 2", "unknown unit \"w\""],
            ),
            (
                "zero rescan interval",
                "agent:\n  rescan_interval: 0s\n".to_owned(),
                vec!["line 2", "greater than zero"],
            ),
            (
                "bad prune max_age",
                dest("        retention:\n          prune:\n            max_age: 30 days\n"),
                vec!["line 8", "max_age", "not a duration", "contains a space"],
            ),
            (
                "missing prune max_age",
                dest("        retention:\n          prune:\n            keep_latest: 2\n"),
                vec!["line 8", "missing required key `max_age`"],
            ),
            (
                "bad workflow",
                dest("        workflow: mirror\n"),
                vec!["line 6 column 19", "workflow \"mirror\"", "additive or replacement"],
            ),
            (
                "bad raw_html",
                dest("        html:\n          raw_html: yes\n"),
                vec!["line 7", "raw_html \"yes\"", "escape or allow"],
            ),
            (
                "bad publish value",
                dest("        publish:\n          html: maybe\n"),
                vec!["line 7", "publish.html"],
            ),
            (
                "publishes nothing",
                dest("        publish:\n          source: false\n"),
                vec![FILE, "destination \"d\" of pipeline \"p\" publishes nothing"],
            ),
            (
                "prefix leaving the root",
                dest("        prefix: \"../x\"\n"),
                vec!["line 6 column 17", "prefix \"../x\"", "'..' segment"],
            ),
            (
                "prefix absolute",
                dest("        prefix: \"/x\"\n"),
                vec!["line 6", "starts with '/'"],
            ),
            (
                "prefix unknown placeholder",
                dest("        prefix: \"{month}/\"\n"),
                vec!["line 6", "unknown placeholder {month}", "{source_id}"],
            ),
            (
                "prefix stray brace",
                dest("        prefix: \"x}\"\n"),
                vec!["line 6", "'}' without a matching '{'"],
            ),
            (
                "prefix reserved name",
                dest("        prefix: \".distributor/\"\n"),
                vec!["line 6", "reserved"],
            ),
            (
                "base_url not http",
                dest("        links:\n          base_url: ftp://h/x/\n"),
                vec!["line 7", "base_url \"ftp://h/x/\"", "absolute http or https URL"],
            ),
            (
                "base_url relative",
                dest("        links:\n          base_url: /archive/\n"),
                vec!["line 7", "absolute http or https URL"],
            ),
            (
                "base_url without host",
                dest("        links:\n          base_url: https:///x\n"),
                vec!["line 7", "no host"],
            ),
            (
                "base_url with query",
                dest("        links:\n          base_url: https://h/x?y=1\n"),
                vec!["line 7", "query or fragment"],
            ),
            (
                "max_attempts zero",
                "agent:\n  max_attempts: 0\n".to_owned(),
                vec!["line 2 column 17", "max_attempts must be at least 1, not 0"],
            ),
            (
                "max_attempts not a number",
                "agent:\n  max_attempts: many\n".to_owned(),
                vec!["line 2", "whole number"],
            ),
            (
                "keep_latest negative",
                dest("        retention:\n          prune:\n            max_age: 1d\n            keep_latest: -1\n"),
                vec!["line 9", "keep_latest must be at least 0, not -1"],
            ),
            (
                "pipeline without destinations",
                "pipelines:\n  - id: p\n    destinations: []\n".to_owned(),
                vec!["line 2", "no destinations"],
            ),
            (
                "pipeline missing destinations",
                "pipelines:\n  - id: p\n".to_owned(),
                vec!["line 2", "missing required key `destinations`"],
            ),
            (
                "duplicate key",
                "spool: /a\nspool: /b\n".to_owned(),
                vec!["line", "duplicate"],
            ),
        ]
    }

    #[test]
    fn invalid_configs_are_rejected_with_a_useful_message() {
        let mut failures = Vec::new();
        for (name, text, wants) in error_cases() {
            let message = match parse(&text, Path::new(FILE)) {
                Ok(_) => {
                    failures.push(format!("{name}: accepted\n{text}"));
                    continue;
                }
                Err(e) => e.to_string(),
            };
            for want in wants {
                if !message.contains(want) {
                    failures.push(format!(
                        "{name}: message lacks {want:?}\n  message: {message}"
                    ));
                }
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    #[test]
    fn unknown_keys_carry_line_and_column() {
        let e = err("agent:\n  settle: 1s\n  typo: 2\n");
        match e {
            ConfigError::UnknownKey { at, key, .. } => {
                assert_eq!(key, "typo");
                assert_eq!(at.line_column, Some((3, 3)));
                assert_eq!(at.file, PathBuf::from(FILE));
            }
            other => panic!("expected UnknownKey, got {other:?}"),
        }
    }

    #[test]
    fn retired_keys_are_rejected_at_every_level() {
        for key in RETIRED_KEYS {
            let cases = [
                ("top", format!("{key}: x\n"), (1, 1)),
                ("agent", format!("agent:\n  {key}: x\n"), (2, 3)),
                (
                    "pipeline",
                    format!(
                        "pipelines:\n  - id: p\n    {key}:\n      mode: x\n    destinations:\n      - id: d\n        path: /srv/x\n"
                    ),
                    (3, 5),
                ),
                (
                    "destination",
                    with_destination(&format!("        {key}:\n          mode: x\n")),
                    (6, 9),
                ),
                (
                    "nested",
                    with_destination(&format!("        publish:\n          {key}: x\n")),
                    (7, 11),
                ),
                // Retired even where the typed parse would fail first.
                (
                    "before a bad value",
                    format!("agent:\n  settle: nope\n  {key}: x\n"),
                    (3, 3),
                ),
            ];
            for (level, text, line_column) in cases {
                let e = err(&text);
                let message = e.to_string();
                match &e {
                    ConfigError::Retired { at, key: k } => {
                        assert_eq!(k, key, "{level}");
                        assert_eq!(at.line_column, Some(line_column), "{key} at {level}");
                    }
                    other => panic!("{key} at {level}: expected Retired, got {other}"),
                }
                assert!(
                    message.contains(&format!("\"{key}\" was retired")),
                    "{message}"
                );
                assert!(message.contains("workflow: additive"), "{message}");
                assert!(message.contains("workflow: replacement"), "{message}");
                assert!(message.contains(FILE), "{message}");
            }
        }
        // A retired word as a value, not a key, is just text.
        ok(&with_destination("        prefix: \"state/\"\n"));
    }

    #[test]
    fn durations() {
        let cases: &[(&str, Option<Duration>)] = &[
            ("10ms", Some(Duration::from_millis(10))),
            ("250ms", Some(Duration::from_millis(250))),
            ("0s", Some(Duration::ZERO)),
            ("0ms", Some(Duration::ZERO)),
            ("30s", Some(Duration::from_secs(30))),
            ("5m", Some(Duration::from_secs(300))),
            ("1h", Some(Duration::from_secs(3600))),
            ("7d", Some(Duration::from_secs(7 * 86_400))),
            ("007s", Some(Duration::from_secs(7))),
            ("", None),
            ("5", None),
            ("s", None),
            ("1.5s", None),
            ("5 s", None),
            (" 5s", None),
            ("5s ", None),
            ("-1s", None),
            ("+1s", None),
            ("1w", None),
            ("1S", None),
            ("1h30m", None),
            ("1sec", None),
            ("99999999999999999999s", None),
            ("999999999999999999d", None),
        ];
        for (text, want) in cases {
            assert_eq!(parse_duration(text).ok(), *want, "{text:?}");
        }
        assert!(parse_duration("5").unwrap_err().contains("no unit"));
        assert!(parse_duration("1.5s").unwrap_err().contains("fractions"));
        assert!(parse_duration("5 s").unwrap_err().contains("space"));
        assert!(
            parse_duration("1w")
                .unwrap_err()
                .contains("unknown unit \"w\"")
        );
    }

    #[test]
    fn durations_format_in_the_largest_exact_unit() {
        for (ms, text) in [
            (0, "0s"),
            (250, "250ms"),
            (1500, "1500ms"),
            (30_000, "30s"),
            (60_000, "1m"),
            (90_000, "90s"),
            (3_600_000, "1h"),
            (7 * 86_400_000, "7d"),
        ] {
            let d = Duration::from_millis(ms);
            assert_eq!(format_duration(d), text);
            assert_eq!(parse_duration(text), Ok(d));
        }
    }

    #[test]
    fn prefix_expansion() {
        let created = datetime!(2026-06-04 23:30:00 -02:00); // 2026-06-05 in UTC
        let cases: &[(&str, Result<&str, &str>)] = &[
            ("", Ok("")),
            ("x", Ok("x")),
            ("x/", Ok("x")),
            ("{source_id}/", Ok("rep.2026")),
            ("{source_id}", Ok("rep.2026")),
            ("{pipeline_id}/{source_id}/", Ok("reports/rep.2026")),
            ("{date}/", Ok("2026-06-05")),
            ("{yyyy}/{mm}/{dd}/", Ok("2026/06/05")),
            (
                "archive/{yyyy}-{mm}/{source_id}",
                Ok("archive/2026-06/rep.2026"),
            ),
            ("{month}/", Err("unknown placeholder {month}")),
            ("{}/", Err("unknown placeholder {}")),
            ("{source_id", Err("not closed")),
            ("{a{date}}", Err("not closed")),
            ("x}/", Err("without a matching")),
            ("../", Err("'..' segment")),
            ("a/../b", Err("'..' segment")),
            ("./a", Err("'.' segment")),
            ("/", Err("path is empty")),
            ("/x", Err("starts with '/'")),
            ("x//", Err("ends with '/'")),
            ("a//b", Err("empty segment")),
            ("a\\b", Err("backslash")),
            (".distributor-x/", Err("reserved")),
        ];
        for (template, want) in cases {
            let got = expand_prefix(template, "rep.2026", "reports", created);
            match (want, &got) {
                (Ok(w), Ok(g)) => assert_eq!(g, w, "{template:?}"),
                (Err(w), Err(g)) => assert!(g.contains(w), "{template:?}: {g:?} lacks {w:?}"),
                _ => panic!("{template:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn prefix_dates_use_utc_on_both_sides_of_midnight() {
        let early = datetime!(2026-01-01 00:30:00 +01:00); // 2025-12-31 in UTC
        assert_eq!(
            expand_prefix("{date}", "s", "p", early).unwrap(),
            "2025-12-31"
        );
        let utc = datetime!(2026-02-28 23:59:59 UTC);
        assert_eq!(
            expand_prefix("{yyyy}/{mm}/{dd}", "s", "p", utc).unwrap(),
            "2026/02/28"
        );
    }

    #[test]
    fn relative_paths_resolve_against_the_config_folder() {
        let text = "spool: spool\npipelines:\n  - id: p\n    inbox: ./in//p/\n    destinations:\n      - id: rel\n        path: ../out/./site\n      - id: abs\n        path: /srv/abs/\n";
        let c = parse(text, Path::new("/opt/dist/conf/config.yaml")).unwrap();
        assert_eq!(c.file, PathBuf::from("/opt/dist/conf/config.yaml"));
        assert_eq!(c.spool, PathBuf::from("/opt/dist/conf/spool"));
        let p = &c.pipelines[0];
        assert_eq!(p.inbox, PathBuf::from("/opt/dist/conf/in/p"));
        assert_eq!(p.spool_dir(&c), PathBuf::from("/opt/dist/conf/spool/p"));
        // `..` is kept: only the file system knows where it leads.
        assert_eq!(
            p.destinations[0].root,
            PathBuf::from("/opt/dist/conf/../out/site")
        );
        assert_eq!(p.destinations[1].root, PathBuf::from("/srv/abs"));
    }

    #[test]
    fn metrics_file_is_optional_resolved_and_checked() {
        let base =
            "pipelines:\n  - id: p\n    destinations:\n      - id: d\n        path: /srv/out\n";
        assert_eq!(ok(base).agent.metrics_file, None);
        assert!(
            ok(base)
                .summary()
                .contains("metrics_file: (none; no metrics are written)")
        );

        for (written, want) in [
            (
                "/var/lib/prometheus/node-exporter/distributor.prom",
                "/var/lib/prometheus/node-exporter/distributor.prom",
            ),
            (
                "metrics/./distributor.prom",
                "/etc/distributor/metrics/distributor.prom",
            ),
            // Next to the pipelines' spool folders is fine.
            (
                "/var/spool/distributor/metrics.prom",
                "/var/spool/distributor/metrics.prom",
            ),
        ] {
            let c = ok(&format!("agent:\n  metrics_file: {written}\n{base}"));
            assert_eq!(c.agent.metrics_file, Some(PathBuf::from(want)), "{written}");
            assert!(c.summary().contains(&format!("metrics_file: {want}\n")));
            assert!(c.warnings().is_empty(), "{:?}", c.warnings());
        }

        let c = ok(&format!("agent:\n  metrics_file: /run/m.txt\n{base}"));
        let warnings = c.warnings();
        assert_eq!(warnings.len(), 1);
        assert!(
            warnings[0].contains("does not end in .prom"),
            "{warnings:?}"
        );

        for (written, want) in [
            ("\"\"", "empty"),
            ("/var/lib/metrics/", "names a folder"),
            ("/var/lib/..", "names a folder"),
            ("\"~/m.prom\"", "not expanded"),
            ("[a]", "a file path"),
        ] {
            let e = err(&format!("agent:\n  metrics_file: {written}\n{base}"));
            let message = e.to_string();
            assert!(
                matches!(e, ConfigError::Invalid { .. }),
                "{written}: {message}"
            );
            assert!(message.contains(want), "{written}: {message}");
            assert!(message.contains("line 2 column 17"), "{written}: {message}");
        }

        for (written, names) in [
            ("/srv/out/metrics.prom", "the root of destination \"d\""),
            (
                "/var/spool/distributor/p/metrics.prom",
                "the spool folder of pipeline \"p\"",
            ),
            (
                "/var/spool/distributor/p/inbox/m.prom",
                "the spool folder of pipeline \"p\"",
            ),
        ] {
            let e = err(&format!("agent:\n  metrics_file: {written}\n{base}"));
            let message = e.to_string();
            assert!(
                matches!(e, ConfigError::Overlap { .. }),
                "{written}: {message}"
            );
            assert!(message.contains("agent.metrics_file"), "{message}");
            assert!(message.contains(names), "{written}: {message}");
        }
        let e = err(
            "agent:\n  metrics_file: /in/p/m.prom\npipelines:\n  - id: p\n    inbox: /in/p\n    destinations:\n      - id: d\n        path: /srv/out\n",
        );
        assert!(e.to_string().contains("the inbox of pipeline \"p\""), "{e}");
    }

    #[test]
    fn a_relative_config_file_is_made_absolute() {
        let c = parse(
            "spool: s\npipelines:\n  - id: p\n    destinations:\n      - id: d\n        path: out\n",
            Path::new("./conf/config.yaml"),
        )
        .unwrap();
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(c.file, cwd.join("conf/config.yaml"));
        assert_eq!(c.spool, cwd.join("conf/s"));
        assert_eq!(c.pipelines[0].destinations[0].root, cwd.join("conf/out"));
    }

    #[test]
    fn config_path_precedence() {
        let flag = Path::new("/from/flag.yaml");
        let env = || Some(OsString::from("/from/env.yaml"));
        assert_eq!(
            choose_config_path(Some(flag), env()),
            PathBuf::from("/from/flag.yaml")
        );
        assert_eq!(
            choose_config_path(None, env()),
            PathBuf::from("/from/env.yaml")
        );
        assert_eq!(
            choose_config_path(None, Some(OsString::new())),
            PathBuf::from(DEFAULT_CONFIG_PATH)
        );
        assert_eq!(
            choose_config_path(None, None),
            PathBuf::from(DEFAULT_CONFIG_PATH)
        );
    }

    #[test]
    fn base_urls() {
        for (text, want) in [
            ("https://h.example/a/", Some("https://h.example/a/")),
            ("https://h.example/a", Some("https://h.example/a/")),
            ("http://h.example", Some("http://h.example/")),
            (
                "HTTPS://h.example:8443/x",
                Some("HTTPS://h.example:8443/x/"),
            ),
            ("https://h.example/a%20b/", Some("https://h.example/a%20b/")),
            ("h.example/a", None),
            ("https://", None),
            ("https:/h", None),
            ("https://h/a b", None),
            ("https://h/#top", None),
            ("mailto:x@h", None),
        ] {
            assert_eq!(check_base_url(text).ok().as_deref(), want, "{text:?}");
        }
    }

    #[test]
    fn load_reads_the_file_and_names_it_in_errors() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.yaml");
        std::fs::write(
            &file,
            "pipelines:\n  - id: p\n    destinations:\n      - id: d\n        path: out\n",
        )
        .unwrap();
        let c = load(&file).unwrap();
        assert_eq!(c.file, file);
        assert_eq!(c.pipelines[0].destinations[0].root, dir.path().join("out"));

        let missing = dir.path().join("missing.yaml");
        let e = load(&missing).unwrap_err();
        assert!(matches!(e, ConfigError::Read { .. }));
        let message = e.to_string();
        assert!(message.contains("missing.yaml"), "{message}");
        assert!(message.contains("--config"), "{message}");

        std::fs::write(&file, "agent:\n  settle: soon\n").unwrap();
        let message = load(&file).unwrap_err().to_string();
        assert!(
            message.contains(&format!("{} line 2 column 11", file.display())),
            "{message}"
        );
    }

    #[test]
    fn summary_lists_everything_config_check_should_show() {
        let text = format!(
            "{SPEC_EXAMPLE}      - id: mirror\n        path: /srv/mirror\n        workflow: replacement\n        publish:\n          html: true\n"
        );
        let summary = ok(&text).summary();
        for want in [
            "config file: /etc/distributor/config.yaml",
            "spool: /var/spool/distributor",
            "settle: 250ms",
            "rescan_interval: 1m",
            "prune_interval: 1h",
            "lock_timeout: 30s",
            "max_attempts: 5",
            "done_retention: 7d",
            "pipeline reports",
            "inbox: /etc/distributor/inbox/reports",
            "destination static-site",
            "workflow: additive",
            "root: /srv/reports/archive",
            "prefix: \"{source_id}/\"",
            "publish: source yes, html no",
            "raw_html: escape",
            "base_url: https://reports.example.com/archive/",
            "prune: max_age 30d, keep_latest 1",
            "destination mirror",
            "workflow: replacement",
            "prefix: (none)",
            "publish: source yes, html yes",
            "prune: (no policy)",
        ] {
            assert!(summary.contains(want), "summary lacks {want:?}:\n{summary}");
        }
        assert!(!summary.contains("warning"), "{summary}");

        let off = ok("agent:\n  prune_interval: 0s\n  done_retention: 0s\n").summary();
        assert!(
            off.contains("prune_interval: 0s (scheduled pruning off)"),
            "{off}"
        );
        assert!(
            off.contains("done_retention: 0s (done/ entries are kept)"),
            "{off}"
        );
    }

    #[test]
    fn raw_html_allow_without_html_is_a_warning() {
        let c = ok(&with_destination(
            "        html:\n          raw_html: allow\n",
        ));
        let warnings = c.warnings();
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("no effect"));
    }

    proptest::proptest! {
        #[test]
        fn parse_never_panics_on_arbitrary_text(text in "\\PC{0,200}") {
            let _ = parse(&text, Path::new(FILE));
        }

        #[test]
        fn parse_never_panics_on_yaml_like_text(
            lines in proptest::collection::vec(
                (0usize..5, proptest::sample::select(vec![
                    "spool:", "agent:", "pipelines:", "- id: p", "id: d", "destinations:",
                    "- id: d", "path: /srv/x", "path: out", "inbox: in", "settle: 1s",
                    "max_attempts: 0", "prefix: \"{date}/\"", "publish:", "html: true",
                    "raw_html: allow", "links:", "base_url: https://h/", "retention:",
                    "prune:", "max_age: 1d", "keep_latest: -3", "takeover: x", "[", "{",
                    "&a x", "*a", "!tag", "? x", "- ", ":", "\"", "workflow: replacement",
                ])),
                0..16,
            )
        ) {
            let text: String = lines
                .iter()
                .map(|(indent, line)| format!("{}{line}\n", "  ".repeat(*indent)))
                .collect();
            let _ = parse(&text, Path::new(FILE));
        }
    }
}
