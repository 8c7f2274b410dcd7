//! The config file as written (serde types that check every leaf while it
//! is read) and [`build`], which resolves it into a [`Config`]. It must never
//! touch the file system: paths are resolved lexically.

use std::fmt;
use std::marker::PhantomData;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

use super::DEFAULT_SPOOL;
use super::error::ConfigError;
use super::error::Place;
use super::model::{
    AgentConfig, Backend, Config, Destination, Encoding, Hooks, Intake, Limits, Pipeline,
    PrunePolicy, RawHtml, S3Location, Signatures, Workflow,
};
use super::relations::{check_relations, normalize};
use super::template::read_template;
use super::values::{expand_prefix, parse_duration, parse_size};
use crate::paths::{self, IdKind};
use crate::s3::headers::{self, HeaderRule, HeaderRules};
use crate::scope::Scope;

// ---------------------------------------------------------------------------
// The file as written. Every leaf is checked while it is read, so a bad value
// is reported at its own line and column.

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping with the keys spool, agent, limits and pipelines"
)]
pub(super) struct RawConfig {
    spool: Option<Checked<PathRule>>,
    agent: Option<RawAgent>,
    limits: Option<RawLimits>,
    pipelines: Option<Vec<RawPipeline>>,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping of agent settings (settle, incomplete_timeout, rescan_interval, prune_interval, lock_timeout, max_attempts, retry_max_interval, defer_for, done_retention, metrics_file)"
)]
struct RawAgent {
    settle: Option<Checked<DurationRule>>,
    incomplete_timeout: Option<Checked<DurationRule>>,
    rescan_interval: Option<Checked<IntervalRule>>,
    prune_interval: Option<Checked<DurationRule>>,
    lock_timeout: Option<Checked<DurationRule>>,
    max_attempts: Option<MaxAttempts>,
    retry_max_interval: Option<Checked<RetryIntervalRule>>,
    defer_for: Option<Checked<DurationRule>>,
    done_retention: Option<Checked<DurationRule>>,
    metrics_file: Option<Checked<FilePathRule>>,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping of limits (max_file_bytes, max_bundle_bytes, max_files, max_markdown_bytes)"
)]
struct RawLimits {
    max_file_bytes: Option<Checked<SizeRule>>,
    max_bundle_bytes: Option<Checked<SizeRule>>,
    max_files: Option<MaxFiles>,
    max_markdown_bytes: Option<Checked<SizeRule>>,
}

impl RawLimits {
    fn over(self, base: Limits) -> Limits {
        Limits {
            max_file_bytes: self.max_file_bytes.map_or(base.max_file_bytes, |c| c.0),
            max_bundle_bytes: self.max_bundle_bytes.map_or(base.max_bundle_bytes, |c| c.0),
            max_files: self.max_files.map_or(base.max_files, |c| u64::from(c.0)),
            max_markdown_bytes: self
                .max_markdown_bytes
                .map_or(base.max_markdown_bytes, |c| c.0),
        }
    }
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a pipeline: a mapping with id, an optional inbox or intake, limits, destinations and signatures"
)]
struct RawPipeline {
    id: Checked<PipelineIdRule>,
    inbox: Option<Checked<PathRule>>,
    intake: Option<RawIntake>,
    limits: Option<RawLimits>,
    destinations: Destinations,
    signatures: Option<RawSignatures>,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "an intake: a mapping with backend (s3), bucket, path, endpoint, region and lease"
)]
struct RawIntake {
    backend: Option<Checked<BackendRule>>,
    bucket: Option<Checked<BucketRule>>,
    path: Checked<DestinationPathRule>,
    endpoint: Option<Checked<EndpointRule>>,
    region: Option<Checked<RegionRule>>,
    lease: Option<Checked<LeaseRule>>,
}

/// An intake's `lease`: 3 s to 1 h.
enum LeaseRule {}
impl Rule for LeaseRule {
    type Out = Duration;
    const EXPECTING: &'static str = "a duration from 3s to 1h, such as 30s";
    fn check(text: &str) -> Result<Duration, String> {
        let d = parse_duration(text)?;
        if d < Duration::from_secs(3) || d > Duration::from_secs(3600) {
            return Err(format!(
                "lease {text} is out of range: give 3s to 1h (the holder renews it every third of it, and a standby takes over once it lapses)"
            ));
        }
        Ok(d)
    }
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping with allowed_signers (a file), namespace, required, refuse_older (true or false) and scopes (principal: [prefixes])"
)]
struct RawSignatures {
    allowed_signers: Checked<FilePathRule>,
    namespace: Option<Checked<NamespaceRule>>,
    required: Option<bool>,
    refuse_older: Option<bool>,
    scopes: Option<std::collections::BTreeMap<String, Vec<String>>>,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a destination: a mapping with id, path and optional backend, bucket, endpoint, region, releases, workflow, prefix, scope, publish, html, precompress, links, retention, hooks and headers"
)]
struct RawDestination {
    id: Checked<DestinationIdRule>,
    backend: Option<Checked<BackendRule>>,
    path: Checked<DestinationPathRule>,
    bucket: Option<Checked<BucketRule>>,
    endpoint: Option<Checked<EndpointRule>>,
    region: Option<Checked<RegionRule>>,
    releases: Option<Releases>,
    workflow: Option<Checked<WorkflowRule>>,
    prefix: Option<Checked<PrefixRule>>,
    scope: Option<ScopeList>,
    publish: Option<RawPublish>,
    html: Option<RawHtmlSection>,
    precompress: Option<PrecompressList>,
    links: Option<RawLinks>,
    retention: Option<RawRetention>,
    hooks: Option<RawHooks>,
    headers: Option<Vec<RawHeaderRule>>,
}

/// One rule of `headers` (docs/object-storage.md, "Serving the bucket").
#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a header rule: a mapping with match (a glob over the output path) and cache_control, content_type and content_disposition"
)]
struct RawHeaderRule {
    #[serde(rename = "match")]
    pattern: Checked<GlobRule>,
    cache_control: Option<Checked<CacheControlRule>>,
    content_type: Option<Checked<ContentTypeRule>>,
    content_disposition: Option<Checked<ContentDispositionRule>>,
}

/// `headers[].match`: a glob over output paths.
enum GlobRule {}
impl Rule for GlobRule {
    type Out = String;
    const EXPECTING: &'static str = "a glob over the output path in quotes, such as \"assets/**\"";
    fn check(text: &str) -> Result<String, String> {
        headers::glob(text).map(|_| text.to_owned())
    }
}

enum CacheControlRule {}
impl Rule for CacheControlRule {
    type Out = String;
    const EXPECTING: &'static str = "a Cache-Control value such as \"public, max-age=3600\"";
    fn check(text: &str) -> Result<String, String> {
        headers::check_value("cache_control", text)
    }
}

enum ContentTypeRule {}
impl Rule for ContentTypeRule {
    type Out = String;
    const EXPECTING: &'static str = "a media type such as \"text/html; charset=utf-8\"";
    fn check(text: &str) -> Result<String, String> {
        headers::check_value("content_type", text)
    }
}

enum ContentDispositionRule {}
impl Rule for ContentDispositionRule {
    type Out = String;
    const EXPECTING: &'static str = "a Content-Disposition value such as \"attachment\"";
    fn check(text: &str) -> Result<String, String> {
        headers::check_value("content_disposition", text)
    }
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping with after_publish (a command as a list of strings) and timeout"
)]
struct RawHooks {
    after_publish: HookCommand,
    timeout: Option<Checked<HookTimeoutRule>>,
}

/// `hooks.after_publish`: an argv whose first element is the absolute path
/// of an existing executable file (docs/contract.md §19.3).
struct HookCommand(Vec<String>);

impl<'de> Deserialize<'de> for HookCommand {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = HookCommand;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a command as a list of strings, such as [\"/usr/local/bin/purge-cdn\", \"--zone\", \"docs\"] (no shell)")
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<HookCommand, A::Error> {
                let mut argv = Vec::new();
                while let Some(arg) = seq.next_element::<String>()? {
                    argv.push(arg);
                }
                check_hook(&argv).map_err(de::Error::custom)?;
                Ok(HookCommand(argv))
            }
        }
        d.deserialize_seq(V)
    }
}

/// Why `argv` cannot be run as a hook, if it cannot.
fn check_hook(argv: &[String]) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt as _;
    let Some(program) = argv.first() else {
        return Err("after_publish is empty; give the command to run, such as [\"/usr/local/bin/purge-cdn\"]".to_owned());
    };
    if argv.iter().any(|a| a.contains('\0')) {
        return Err("after_publish holds a NUL byte, which no argument can carry".to_owned());
    }
    let path = Path::new(program);
    if !path.is_absolute() {
        return Err(format!(
            "after_publish must start with an absolute path (no shell, no PATH search), not {program:?}; find it with `command -v {program}`"
        ));
    }
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => Ok(()),
        Ok(m) if m.is_file() => Err(format!(
            "{program} is not executable; make it so (chmod +x {program})"
        )),
        Ok(_) => Err(format!("{program} is not a file")),
        Err(e) => Err(format!("cannot use {program} as a hook: {e}")),
    }
}

/// `precompress`: the siblings each text output gets (docs/contract.md
/// §21.4), each encoding at most once; a bad entry is reported at its own
/// line.
struct PrecompressList(Vec<Encoding>);

impl<'de> Deserialize<'de> for PrecompressList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = PrecompressList;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of encodings: [gzip], [br] or [gzip, br]")
            }
            fn visit_seq<A: de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<PrecompressList, A::Error> {
                let mut list = Vec::new();
                while let Some(e) = seq.next_element_seed(NotYet(&list))? {
                    list.push(e);
                }
                Ok(PrecompressList(list))
            }
        }
        d.deserialize_seq(V)
    }
}

/// One entry of `precompress`, not among those before it (`.0`): a
/// repeated one is reported at its own line.
struct NotYet<'a>(&'a [Encoding]);

impl<'de> de::DeserializeSeed<'de> for NotYet<'_> {
    type Value = Encoding;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Encoding, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for NotYet<'_> {
    type Value = Encoding;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(EncodingRule::EXPECTING)
    }
    fn visit_str<E: de::Error>(self, text: &str) -> Result<Encoding, E> {
        let e = EncodingRule::check(text).map_err(E::custom)?;
        if self.0.contains(&e) {
            return Err(E::custom(format!(
                "precompress lists {} twice; list each encoding once",
                e.as_str()
            )));
        }
        Ok(e)
    }
}

enum EncodingRule {}
impl Rule for EncodingRule {
    type Out = Encoding;
    const EXPECTING: &'static str = "gzip or br";
    fn check(text: &str) -> Result<Encoding, String> {
        match text {
            "gzip" => Ok(Encoding::Gzip),
            "br" => Ok(Encoding::Brotli),
            _ => Err(format!(
                "precompress {text:?} is not known; use gzip (X.gz) or br (X.br, brotli)"
            )),
        }
    }
}

/// `scope`: the output paths the destination may publish
/// (docs/contract.md §17.1), checked by [`Scope::parse`].
struct ScopeList(Scope);

impl<'de> Deserialize<'de> for ScopeList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ScopeList;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of folders ending in '/' and file paths, such as [\"reports/\", \"index.html\"]")
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<ScopeList, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = seq.next_element::<String>()? {
                    entries.push(entry);
                }
                Scope::parse(&entries)
                    .map(ScopeList)
                    .map_err(de::Error::custom)
            }
        }
        d.deserialize_seq(V)
    }
}

/// `hooks.timeout`: how long a hook may run; not zero.
enum HookTimeoutRule {}
impl Rule for HookTimeoutRule {
    type Out = Duration;
    const EXPECTING: &'static str = DurationRule::EXPECTING;
    fn check(text: &str) -> Result<Duration, String> {
        nonzero_duration(text, "would kill every hook at once", "30s")
    }
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
#[serde(
    deny_unknown_fields,
    expecting = "a mapping with raw_html and template"
)]
struct RawHtmlSection {
    raw_html: Option<Checked<RawHtmlRule>>,
    template: Option<Checked<FilePathRule>>,
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

/// An SSHSIG namespace (`ssh-keygen -Y sign -n`): what a pipeline's
/// signatures must be made in.
enum NamespaceRule {}
impl Rule for NamespaceRule {
    type Out = String;
    const EXPECTING: &'static str = "a signature namespace";
    fn check(text: &str) -> Result<String, String> {
        let ok = (1..=64).contains(&text.len())
            && text
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@' | '+'));
        if !ok {
            return Err(format!(
                "the namespace {:?} is not 1 to 64 of A-Z a-z 0-9 . _ - @ +; use one such as docs@example.org, and sign with `ssh-keygen -Y sign -n` it",
                crate::text::escape::inert(text)
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

enum SizeRule {}
impl Rule for SizeRule {
    type Out = u64;
    const EXPECTING: &'static str = "a size such as 4MiB, 1GiB or 16GiB";
    fn check(text: &str) -> Result<u64, String> {
        let n = parse_size(text)?;
        if n == 0 {
            return Err(format!(
                "{text:?} would refuse every bundle; give a size greater than zero"
            ));
        }
        Ok(n)
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
        nonzero_duration(text, "would rescan without pause", "60s")
    }
}

/// A duration greater than zero; zero gets `why` it is refused and an
/// `example` of a good value.
fn nonzero_duration(text: &str, why: &str, example: &str) -> Result<Duration, String> {
    let d = parse_duration(text)?;
    if d.is_zero() {
        return Err(format!(
            "{text:?} {why}; give a duration greater than zero, such as {example}"
        ));
    }
    Ok(d)
}

/// `retry_max_interval`: at least a second, the first pause.
enum RetryIntervalRule {}
impl Rule for RetryIntervalRule {
    type Out = Duration;
    const EXPECTING: &'static str = DurationRule::EXPECTING;
    fn check(text: &str) -> Result<Duration, String> {
        let d = parse_duration(text)?;
        if d < Duration::from_secs(1) {
            return Err(format!(
                "{text:?} is shorter than the first pause between attempts (1s); give at least 1s, such as 10m"
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
    type Out = RawHtml;
    const EXPECTING: &'static str = "sanitize, escape or allow";
    fn check(text: &str) -> Result<RawHtml, String> {
        match text {
            "sanitize" => Ok(RawHtml::Sanitize),
            "escape" => Ok(RawHtml::Escape),
            "allow" => Ok(RawHtml::Allow),
            _ => Err(format!(
                "raw_html {text:?} is not known; use sanitize (the default), escape or allow"
            )),
        }
    }
}

/// Which backend a destination names (`backend:`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum BackendKind {
    Local,
    S3,
}

enum BackendRule {}
impl Rule for BackendRule {
    type Out = BackendKind;
    const EXPECTING: &'static str = "local or s3";
    fn check(text: &str) -> Result<BackendKind, String> {
        match text {
            "local" => Ok(BackendKind::Local),
            "s3" => Ok(BackendKind::S3),
            _ => Err(format!(
                "backend {text:?} is not supported; use local or s3"
            )),
        }
    }
}

/// A destination's `path`: a folder for `local`, a key prefix for `s3`
/// (where "" is the whole bucket). Which one is checked in [`build`],
/// once the backend is known.
enum DestinationPathRule {}
impl Rule for DestinationPathRule {
    type Out = String;
    const EXPECTING: &'static str = "a folder path (backend local) or a key prefix (backend s3)";
    fn check(text: &str) -> Result<String, String> {
        if text.is_empty() {
            return Ok(String::new());
        }
        PathRule::check(text)
    }
}

/// An S3 key prefix: empty or a clean relative path.
pub(super) fn check_key_prefix(text: &str) -> Result<String, String> {
    let trimmed = text.strip_suffix('/').unwrap_or(text);
    if trimmed.is_empty() {
        return Ok(String::new());
    }
    paths::RelPath::parse(trimmed)
        .map(|p| p.to_string())
        .map_err(|e| {
            format!(
                "path {text:?} is not a key prefix: {e}; with backend s3, path is a clean relative path inside the bucket such as site/archive, or \"\" for the whole bucket"
            )
        })
}

enum BucketRule {}
impl Rule for BucketRule {
    type Out = String;
    const EXPECTING: &'static str = "an S3 bucket name";
    fn check(text: &str) -> Result<String, String> {
        let ok_chars = text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
        let ends_ok = text
            .bytes()
            .next()
            .zip(text.bytes().last())
            .is_some_and(|(a, z)| a.is_ascii_alphanumeric() && z.is_ascii_alphanumeric());
        if !(3..=63).contains(&text.len()) || !ok_chars || !ends_ok {
            return Err(format!(
                "bucket {text:?} is not a valid bucket name; use 3 to 63 lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"
            ));
        }
        Ok(text.to_owned())
    }
}

enum EndpointRule {}
impl Rule for EndpointRule {
    type Out = String;
    const EXPECTING: &'static str = "an http or https URL such as http://127.0.0.1:8333";
    fn check(text: &str) -> Result<String, String> {
        let url = check_base_url(text).map_err(|e| e.replace("base_url", "endpoint"))?;
        let url = url.trim_end_matches('/').to_owned();
        if url.matches('/').count() > 2 {
            return Err(format!(
                "endpoint {text:?} has a path; give the server only (scheme, host and port), and the key prefix in path"
            ));
        }
        Ok(url)
    }
}

enum RegionRule {}
impl Rule for RegionRule {
    type Out = String;
    const EXPECTING: &'static str = "a region name such as us-east-1";
    fn check(text: &str) -> Result<String, String> {
        if text.is_empty()
            || !text
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err(format!(
                "region {text:?} is not a region name; use lowercase letters, digits and '-', such as us-east-1"
            ));
        }
        Ok(text.to_owned())
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
pub(super) fn check_base_url(text: &str) -> Result<String, String> {
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

/// `limits.max_files`: an integer of at least 1.
struct MaxFiles(u32);

impl<'de> Deserialize<'de> for MaxFiles {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(CountVisitor {
            field: "max_files",
            min: 1,
            hint: "give the most files one bundle may list, such as 200000",
        })
        .map(MaxFiles)
    }
}

/// `releases`: how many releases a local root keeps, 2 to
/// [`MAX_RELEASES`] (docs/contract.md §20.2).
struct Releases(u32);

/// The most releases a root may keep: each costs a link for every file.
pub const MAX_RELEASES: u32 = 100;

impl<'de> Deserialize<'de> for Releases {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = d.deserialize_any(CountVisitor {
            field: "releases",
            min: 2,
            hint: "keep the current release and at least one to roll back to, such as 5; remove the key to publish in place",
        })?;
        if n > MAX_RELEASES {
            return Err(de::Error::custom(format!(
                "releases must be at most {MAX_RELEASES}, not {n}: every release holds a link for each file of the root; keep fewer, such as 5"
            )));
        }
        Ok(Releases(n))
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

/// The root and backend of a destination: the keys that depend on
/// `backend` are checked here, where it is known.
fn destination_backend(
    rd: &RawDestination,
    pipeline: &str,
    file: &Path,
    resolve: &dyn Fn(&str) -> PathBuf,
) -> Result<(PathBuf, Backend), ConfigError> {
    let invalid = |message: String| ConfigError::Invalid {
        at: Place {
            file: file.to_path_buf(),
            line_column: None,
        },
        message: format!(
            "destination {:?} of pipeline {pipeline:?}: {message}",
            rd.id.0
        ),
    };
    let kind = rd.backend.as_ref().map_or(BackendKind::Local, |c| c.0);
    match kind {
        BackendKind::Local => {
            for (key, set) in [
                ("bucket", rd.bucket.is_some()),
                ("endpoint", rd.endpoint.is_some()),
                ("region", rd.region.is_some()),
            ] {
                if set {
                    return Err(invalid(format!(
                        "{key} is set but the backend is local; {key} belongs to backend s3: add \"backend: s3\" or remove {key}"
                    )));
                }
            }
            if rd.headers.is_some() {
                return Err(invalid(
                    "headers is set but the backend is local; on a local root the web server sets the response headers (docs/serving.md, \"Response headers\", shows the nginx and Caddy lines): remove headers".to_owned(),
                ));
            }
            if rd.path.0.is_empty() {
                return Err(invalid("the path is empty; give a folder path".to_owned()));
            }
            Ok((resolve(&rd.path.0), Backend::Local))
        }
        BackendKind::S3 => {
            if rd.precompress.is_some() {
                return Err(invalid(
                    "precompress is set but the backend is s3: siblings such as X.gz are for web servers that serve them from a folder (nginx gzip_static, Caddy precompressed); remove precompress, and let the CDN in front of the bucket compress".to_owned(),
                ));
            }
            if rd.releases.is_some() {
                return Err(invalid(
                    "releases is set but the backend is s3: a bucket cannot switch many keys at once, so releases are for local roots only (an s3 publication shows pages only after every other output, §20.1); remove releases".to_owned(),
                ));
            }
            let bucket = rd.bucket.as_ref().map(|c| c.0.clone()).ok_or_else(|| {
                invalid("backend s3 needs a bucket; add \"bucket: NAME\"".to_owned())
            })?;
            let path = check_key_prefix(&rd.path.0).map_err(invalid)?;
            let location = S3Location {
                bucket,
                path,
                endpoint: rd.endpoint.as_ref().map(|c| c.0.clone()),
                region: rd
                    .region
                    .as_ref()
                    .map_or_else(|| "us-east-1".to_owned(), |c| c.0.clone()),
            };
            Ok((PathBuf::new(), Backend::S3(location)))
        }
    }
}

/// A pipeline's `intake` (docs/contract.md §22).
fn intake(ri: RawIntake, pipeline: &str, file: &Path) -> Result<Intake, ConfigError> {
    let invalid = |message: String| ConfigError::Invalid {
        at: Place {
            file: file.to_path_buf(),
            line_column: None,
        },
        message: format!("intake of pipeline {pipeline:?}: {message}"),
    };
    if ri.backend.as_ref().map_or(BackendKind::Local, |c| c.0) != BackendKind::S3 {
        return Err(invalid(
            "an intake is a bucket: add \"backend: s3\" (for a folder on this machine, use inbox instead of intake)".to_owned(),
        ));
    }
    let bucket = ri
        .bucket
        .map(|c| c.0)
        .ok_or_else(|| invalid("backend s3 needs a bucket; add \"bucket: NAME\"".to_owned()))?;
    let path = check_key_prefix(&ri.path.0).map_err(invalid)?;
    Ok(Intake {
        location: S3Location {
            bucket,
            path,
            endpoint: ri.endpoint.map(|c| c.0),
            region: ri.region.map_or_else(|| "us-east-1".to_owned(), |c| c.0),
        },
        lease: ri.lease.map_or(Duration::from_secs(30), |c| c.0),
    })
}

/// A destination's `headers`, each glob already checked as it was read.
fn header_rules(raw: Vec<RawHeaderRule>) -> Result<HeaderRules, String> {
    let rules = raw
        .into_iter()
        .map(|r| {
            HeaderRule::new(
                &r.pattern.0,
                r.cache_control.map(|c| c.0),
                r.content_type.map(|c| c.0),
                r.content_disposition.map(|c| c.0),
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    HeaderRules::new(rules)
}

/// Reads `signatures.allowed_signers` (docs/contract.md §17.3) of pipeline
/// `pipeline` while the config is loaded: an unreadable or malformed file
/// is a config error, and a reload that meets one keeps the old config.
fn read_allowed_signers(
    path: &Path,
    pipeline: &str,
    file: &Path,
) -> Result<std::sync::Arc<crate::signature::AllowedSigners>, ConfigError> {
    crate::signature::AllowedSigners::read(path)
        .map(std::sync::Arc::new)
        .map_err(|message| ConfigError::Invalid {
            at: Place {
                file: file.to_path_buf(),
                line_column: None,
            },
            message: format!(
                "pipeline {pipeline:?}: signatures.allowed_signers {}: {message} (relative paths start at the config file's folder)",
                path.display()
            ),
        })
}

/// `signatures.scopes` of pipeline `pipeline`: each principal's entries
/// checked as a destination's `scope` is (docs/contract.md §17.4).
fn principal_scopes(
    raw: std::collections::BTreeMap<String, Vec<String>>,
    pipeline: &str,
    file: &Path,
) -> Result<std::collections::BTreeMap<String, crate::scope::Scope>, ConfigError> {
    raw.into_iter()
        .map(|(principal, entries)| {
            crate::scope::Scope::parse(&entries)
                .map(|scope| (principal.clone(), scope))
                .map_err(|message| ConfigError::Invalid {
                    at: Place {
                        file: file.to_path_buf(),
                        line_column: None,
                    },
                    message: format!(
                        "pipeline {pipeline:?}: signatures.scopes of {principal:?}: {message}"
                    ),
                })
        })
        .collect()
}

pub(super) fn build(raw: RawConfig, file: &Path) -> Result<Config, ConfigError> {
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
            incomplete_timeout: a
                .incomplete_timeout
                .map_or(defaults.incomplete_timeout, |c| c.0),
            rescan_interval: a.rescan_interval.map_or(defaults.rescan_interval, |c| c.0),
            prune_interval: a.prune_interval.map_or(defaults.prune_interval, |c| c.0),
            lock_timeout: a.lock_timeout.map_or(defaults.lock_timeout, |c| c.0),
            max_attempts: a.max_attempts.map(|c| c.0),
            retry_max_interval: a
                .retry_max_interval
                .map_or(defaults.retry_max_interval, |c| c.0),
            defer_for: a.defer_for.map_or(defaults.defer_for, |c| c.0),
            done_retention: a.done_retention.map_or(defaults.done_retention, |c| c.0),
        },
    };

    let limits = raw
        .limits
        .map_or_else(Limits::default, |l| l.over(Limits::default()));

    let mut pipelines = Vec::new();
    for rp in raw.pipelines.unwrap_or_default() {
        let id = rp.id.0;
        let pipeline_limits = rp.limits.map_or(limits, |l| l.over(limits));
        let intake = match rp.intake {
            Some(_) if rp.inbox.is_some() => {
                return Err(ConfigError::Invalid {
                    at: Place {
                        file: file.to_path_buf(),
                        line_column: None,
                    },
                    message: format!(
                        "pipeline {id:?} sets both inbox and intake; a pipeline takes bundles from a folder (inbox) or from a bucket (intake), not both: remove one of them"
                    ),
                });
            }
            Some(ri) => Some(intake(ri, &id, file)?),
            None => None,
        };
        let inbox = match rp.inbox {
            Some(Checked(text)) => resolve(&text),
            None => spool.join(&id).join("inbox"),
        };
        let mut destinations = Vec::new();
        for mut rd in rp.destinations.0 {
            let (root, backend) = destination_backend(&rd, &id, file, &resolve)?;
            let headers =
                header_rules(rd.headers.take().unwrap_or_default()).map_err(|message| {
                    ConfigError::Invalid {
                        at: Place {
                            file: file.to_path_buf(),
                            line_column: None,
                        },
                        message: format!("destination {:?} of pipeline {id:?}: {message}", rd.id.0),
                    }
                })?;
            let publish = rd.publish.unwrap_or(RawPublish {
                source: None,
                html: None,
            });
            destinations.push(Destination {
                id: rd.id.0,
                root,
                backend,
                releases: rd.releases.map(|r| r.0),
                workflow: rd.workflow.map_or(Workflow::Additive, |c| c.0),
                prefix: rd.prefix.map(|c| c.0).unwrap_or_default(),
                scope: rd.scope.map(|s| s.0),
                publish_source: publish.source.unwrap_or(true),
                publish_html: publish.html.unwrap_or(false),
                raw_html: rd
                    .html
                    .as_ref()
                    .and_then(|h| h.raw_html.as_ref())
                    .map_or(RawHtml::default(), |c| c.0),
                html_template: match rd.html.and_then(|h| h.template) {
                    Some(Checked(text)) => Some(read_template(&resolve(&text), file)?),
                    None => None,
                },
                base_url: rd.links.and_then(|l| l.base_url).map(|c| c.0),
                prune: rd.retention.and_then(|r| r.prune).map(|p| PrunePolicy {
                    max_age: p.max_age.0,
                    keep_latest: p.keep_latest.map_or(1, |k| k.0),
                }),
                hooks: rd.hooks.map(|h| Hooks {
                    after_publish: h.after_publish.0,
                    timeout: h.timeout.map_or(Hooks::DEFAULT_TIMEOUT, |c| c.0),
                }),
                precompress: rd.precompress.map(|p| p.0).unwrap_or_default(),
                headers,
            });
        }
        let signatures = match rp.signatures {
            Some(rs) => Some(Signatures {
                signers: read_allowed_signers(&resolve(&rs.allowed_signers.0), &id, file)?,
                allowed_signers: resolve(&rs.allowed_signers.0),
                namespace: rs
                    .namespace
                    .map_or_else(|| crate::signature::NAMESPACE.to_owned(), |n| n.0),
                required: rs.required.unwrap_or(true),
                refuse_older: rs.refuse_older.unwrap_or(true),
                scopes: rs
                    .scopes
                    .map(|scopes| principal_scopes(scopes, &id, file))
                    .transpose()?,
            }),
            None => None,
        };
        pipelines.push(Pipeline {
            id,
            inbox,
            limits: pipeline_limits,
            destinations,
            signatures,
            intake,
        });
    }

    let config = Config {
        file: file_abs,
        spool,
        agent,
        limits,
        pipelines,
    };
    check_relations(&config, file)?;
    Ok(config)
}
