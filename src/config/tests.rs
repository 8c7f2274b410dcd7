//! Unit tests of config loading, from YAML text to the resolved [`Config`].

use super::raw::check_base_url;
use super::*;
use std::time::Duration;
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

pub(super) const SPEC_EXAMPLE: &str = r#"
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
    // The example sets max_attempts, which is unset by default.
    assert_eq!(
        c.agent,
        AgentConfig {
            max_attempts: Some(5),
            ..AgentConfig::default()
        }
    );
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
    assert_eq!(d.raw_html, RawHtml::Escape, "the example sets escape");
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
    assert_eq!(a.max_attempts, None, "unset: defer_for bounds retries");
    assert_eq!(a.retry_max_interval, Duration::from_secs(600));
    assert_eq!(a.defer_for, Duration::from_secs(86_400));
    assert_eq!(a.done_retention, Duration::from_secs(7 * 86_400));
    let p = &c.pipelines[0];
    assert_eq!(p.inbox, PathBuf::from("/var/spool/distributor/p/inbox"));
    let d = &p.destinations[0];
    assert_eq!(d.root, PathBuf::from("/srv/cfg/out"));
    assert_eq!(d.workflow, Workflow::Additive);
    assert_eq!(d.prefix, "");
    assert!(d.publish_source && !d.publish_html && d.raw_html == RawHtml::Sanitize);
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
    assert!(!d.publish_source && d.publish_html && d.raw_html == RawHtml::Allow);
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
    assert!(d.publish_source && !d.publish_html && d.raw_html == RawHtml::Sanitize);
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
    let c =
        ok("pipelines:\n  - id: 2024\n    destinations:\n      - id: 1.5\n        path: /srv/x\n");
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
    let mut cases = error_cases_of_documents();
    cases.extend(error_cases_of_pipelines());
    cases.extend(error_cases_of_values());
    cases
}

/// Two pipelines, each with one destination `d`, the pipelines' own keys
/// given.
fn two_pipelines(a_extra: &str, b_extra: &str) -> String {
    format!(
        "pipelines:\n  - id: a\n{a_extra}    destinations:\n      - id: d\n        path: /srv/a\n  - id: b\n{b_extra}    destinations:\n      - id: d\n        path: /srv/b\n"
    )
}

fn error_cases_of_documents() -> Vec<(&'static str, String, Vec<&'static str>)> {
    let dest = |extra: &str| with_destination(extra);
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
            vec![FILE, "destination \"d\" of pipeline \"p\"", "path is empty"],
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
    ]
}

fn error_cases_of_pipelines() -> Vec<(&'static str, String, Vec<&'static str>)> {
    let dest = |extra: &str| with_destination(extra);
    vec![
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
            "releases on s3",
            dest("        backend: s3\n        bucket: reports\n        releases: 5\n")
                .replace("path: /srv/out", "path: site"),
            vec!["releases is set but the backend is s3", "local roots only"],
        ),
        (
            "precompress on s3",
            dest("        backend: s3\n        bucket: reports\n        precompress: [gzip]\n")
                .replace("path: /srv/out", "path: site"),
            vec![
                "destination \"d\" of pipeline \"p\"",
                "precompress is set but the backend is s3",
                "remove precompress",
            ],
        ),
        (
            "unknown precompress encoding",
            dest("        precompress: [gzip, zstd]\n"),
            vec!["line 6 column 29", "precompress \"zstd\" is not known", "gzip", "br"],
        ),
        (
            "precompress that is not a list",
            dest("        precompress: gzip\n"),
            vec!["line 6", "[gzip, br]"],
        ),
        (
            "precompress listing an encoding twice",
            dest("        precompress:\n          - br\n          - gzip\n          - br\n"),
            vec!["line 9", "precompress lists br twice"],
        ),
        (
            "one release",
            dest("        releases: 1\n"),
            vec!["releases must be at least 2, not 1", "roll back to"],
        ),
        (
            "too many releases",
            dest("        releases: 101\n"),
            vec!["releases must be at most 100, not 101"],
        ),
        (
            "releases folder holding an inbox",
            dest("        releases: 3\n")
                .replace("    destinations:", "    inbox: /srv/out.releases/in\n    destinations:"),
            vec!["/srv/out.releases", "the inbox of pipeline \"p\"", "overlap"],
        ),
        (
            "unknown backend",
            dest("        backend: ftp\n"),
            vec!["line 6 column 18", "backend \"ftp\"", "use local or s3"],
        ),
        (
            "s3 without a bucket",
            dest("        backend: s3\n"),
            vec![FILE, "destination \"d\" of pipeline \"p\"", "backend s3 needs a bucket"],
        ),
        (
            "bucket with backend local",
            dest("        bucket: reports\n"),
            vec!["destination \"d\"", "bucket is set but the backend is local", "backend: s3"],
        ),
        (
            "endpoint with the default backend",
            dest("        endpoint: http://127.0.0.1:8333\n"),
            vec!["endpoint is set but the backend is local"],
        ),
        (
            "region with backend local",
            dest("        backend: local\n        region: eu-west-1\n"),
            vec!["region is set but the backend is local"],
        ),
        (
            "s3 path that is not a key prefix",
            dest("        backend: s3\n        bucket: reports\n"),
            vec!["path \"/srv/out\" is not a key prefix", "clean relative path"],
        ),
        (
            "s3 path with ..",
            dest("        backend: s3\n        bucket: reports\n")
                .replace("path: /srv/out", "path: site/../x"),
            vec!["path \"site/../x\" is not a key prefix"],
        ),
        (
            "bad bucket name",
            dest("        backend: s3\n        bucket: Reports_2026\n"),
            vec!["line 7 column 17", "bucket \"Reports_2026\" is not a valid bucket name"],
        ),
        (
            "endpoint that is not a URL",
            dest("        backend: s3\n        bucket: reports\n        endpoint: 127.0.0.1:8333\n"),
            vec!["line 8", "endpoint \"127.0.0.1:8333\" is not an absolute http or https URL"],
        ),
        (
            "endpoint with a path",
            dest("        backend: s3\n        bucket: reports\n        endpoint: http://h:1/sub\n"),
            vec!["line 8", "has a path"],
        ),
        (
            "bad region",
            dest("        backend: s3\n        bucket: reports\n        region: EU West\n"),
            vec!["line 8", "region \"EU West\""],
        ),
        (
            "two s3 destinations on one root",
            "pipelines:\n  - id: p\n    destinations:\n      - id: a\n        backend: s3\n        bucket: bk1\n        path: x\n      - id: b\n        backend: s3\n        bucket: bk1\n        path: x/\n".to_owned(),
            vec!["destinations \"a\" and \"b\"", "s3://bk1/x"],
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
    ]
}

fn error_cases_of_values() -> Vec<(&'static str, String, Vec<&'static str>)> {
    let dest = |extra: &str| with_destination(extra);
    vec![
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
            vec![
                "line 7",
                "base_url \"ftp://h/x/\"",
                "absolute http or https URL",
            ],
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
            "retry_max_interval below the first pause",
            "agent:\n  retry_max_interval: 500ms\n".to_owned(),
            vec![
                "line 2",
                "shorter than the first pause between attempts (1s)",
            ],
        ),
        (
            "defer_for not a duration",
            "agent:\n  defer_for: forever\n".to_owned(),
            vec!["line 2", "defer_for"],
        ),
        (
            "max_attempts not a number",
            "agent:\n  max_attempts: many\n".to_owned(),
            vec!["line 2", "whole number"],
        ),
        (
            "keep_latest negative",
            dest(
                "        retention:\n          prune:\n            max_age: 1d\n            keep_latest: -1\n",
            ),
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
    let base = "pipelines:\n  - id: p\n    destinations:\n      - id: d\n        path: /srv/out\n";
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
fn precompress_lists_each_encoding_in_the_order_written() {
    // (keys, encodings)
    let cases: &[(&str, &[Encoding])] = &[
        ("", &[]),
        ("        precompress: []\n", &[]),
        ("        precompress: [gzip]\n", &[Encoding::Gzip]),
        ("        precompress: [br]\n", &[Encoding::Brotli]),
        (
            "        precompress: [br, gzip]\n",
            &[Encoding::Brotli, Encoding::Gzip],
        ),
    ];
    for (keys, want) in cases {
        let config = ok(&with_destination(keys));
        let d = &config.pipelines[0].destinations[0];
        assert_eq!(d.precompress, *want, "{keys}");
    }
    let summary = ok(&with_destination("        precompress: [gzip, br]\n")).summary();
    assert!(
        summary.contains("      precompress: gzip, br\n"),
        "{summary}"
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
        "retry_max_interval: 10m",
        "defer_for: 1d",
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

#[test]
fn limits_default_and_pipelines_override_single_keys() {
    let c = ok("pipelines:\n  - id: p\n    destinations:\n      - id: d\n        path: /srv/out\n");
    assert_eq!(c.limits, Limits::default());
    assert_eq!(c.pipelines[0].limits.max_file_bytes, 16 << 30);
    assert_eq!(c.pipelines[0].limits.max_bundle_bytes, 64 << 30);
    assert_eq!(c.pipelines[0].limits.max_files, 200_000);
    assert_eq!(c.pipelines[0].limits.max_markdown_bytes, 4 << 20);
    assert_eq!(c.agent.incomplete_timeout, Duration::from_secs(600));

    let c = ok(r#"
agent:
  incomplete_timeout: 30s
limits:
  max_file_bytes: 1GiB
  max_files: 10
pipelines:
  - id: p
    limits: {max_bundle_bytes: 1GiB, max_markdown_bytes: 512KiB}
    destinations:
      - id: d
        path: /srv/out
  - id: q
    destinations:
      - id: d
        path: /srv/q
"#);
    assert_eq!(c.agent.incomplete_timeout, Duration::from_secs(30));
    let top = Limits {
        max_file_bytes: 1 << 30,
        max_files: 10,
        ..Limits::default()
    };
    assert_eq!(c.limits, top);
    assert_eq!(
        c.pipelines[0].limits,
        Limits {
            max_bundle_bytes: 1 << 30,
            max_markdown_bytes: 512 << 10,
            ..top
        }
    );
    assert_eq!(c.pipelines[1].limits, top);
    let summary = c.summary();
    assert!(summary.contains("limits: max_file_bytes 1GiB, max_bundle_bytes 64GiB, max_files 10, max_markdown_bytes 4MiB"), "{summary}");
    assert!(summary.contains("  incomplete_timeout: 30s"), "{summary}");
}

#[test]
fn bad_limits_name_the_key_and_the_fix() {
    let cases: &[(&str, &str)] = &[
        (
            "limits:\n  max_file_bytes: 16GB\n",
            "units are binary and spelled out (GiB)",
        ),
        ("limits:\n  max_file_bytes: 16\n", "it has no unit"),
        (
            "limits:\n  max_bundle_bytes: 0MiB\n",
            "would refuse every bundle",
        ),
        ("limits:\n  max_files: 0\n", "max_files must be at least 1"),
        ("limits:\n  max_markdown_bytes: 4 MiB\n", "unknown unit"),
        (
            "limits:\n  max_size: 1GiB\n",
            "unknown key `max_size`, expected one of `max_file_bytes`",
        ),
        (
            "limits:\n  max_file_bytes: 99999999999TiB\n",
            "too large a size",
        ),
    ];
    for (text, want) in cases {
        let e = err(text).to_string();
        assert!(e.contains(want), "{text}: {e}");
    }
}

#[test]
fn sizes_parse_and_format_round_trip() {
    for (text, n) in [
        ("1B", 1u64),
        ("1500B", 1500),
        ("4KiB", 4096),
        ("4MiB", 4 << 20),
        ("16GiB", 16 << 30),
        ("2TiB", 2 << 40),
    ] {
        assert_eq!(parse_size(text), Ok(n), "{text}");
        assert_eq!(format_size(n), text);
    }
}

#[test]
fn syntax_errors_name_a_tab_and_an_unquoted_placeholder() {
    let cases: [(String, &[&str]); 4] = [
        (
            "pipelines:\n\t- id: p\n".to_owned(),
            &["line 2 column 1", "has a tab at column 1", "spaces only"],
        ),
        (
            with_destination("        prefix: {source_id}/\n"),
            &[
                "line 6",
                "read as a YAML mapping",
                r#"prefix: "{source_id}/""#,
            ],
        ),
        (
            with_destination("        prefix: {yyyy}/{mm}/\n"),
            &[r#"put it in quotes: prefix: "{yyyy}/{mm}/""#],
        ),
        (
            // Not one of the two: no hint.
            "pipelines: [\n".to_owned(),
            &["not valid YAML"],
        ),
    ];
    for (text, wants) in cases {
        let message = err(&text).to_string();
        for want in wants {
            assert!(message.contains(want), "{want:?} in {message}");
        }
        if text.starts_with("pipelines: [") {
            assert!(
                !message.contains("tab") && !message.contains("quotes"),
                "{message}"
            );
        }
    }
}

#[test]
fn html_template_is_read_relative_to_the_config_file() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("config.yaml");
    std::fs::create_dir(tmp.path().join("t")).unwrap();
    std::fs::write(tmp.path().join("t/page.html"), "<main>{{content}}</main>").unwrap();
    let text = with_destination(
        "        publish: {html: true}\n        html:\n          template: t/page.html\n",
    );
    let c = parse(&text, &file).unwrap();
    let template = c.pipelines[0].destinations[0]
        .html_template
        .as_ref()
        .unwrap();
    assert_eq!(template.path, tmp.path().join("t/page.html"));
    assert_eq!(&*template.text, "<main>{{content}}</main>");
    assert!(c.warnings().is_empty(), "{:?}", c.warnings());
    assert!(c.summary().contains("template: "), "{}", c.summary());

    let unused = with_destination("        html:\n          template: t/page.html\n");
    let warnings = parse(&unused, &file).unwrap().warnings();
    assert!(warnings[0].contains("template is not used"), "{warnings:?}");
}

#[test]
fn html_template_missing_or_without_content_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("config.yaml");
    std::fs::write(tmp.path().join("no-content.html"), "<p>{{title}}</p>").unwrap();
    std::fs::write(tmp.path().join("latin1.html"), b"{{content}} \xe9").unwrap();
    let cases: &[(&str, &[&str])] = &[
        (
            "missing.html",
            &["missing.html", "cannot read", "create the file"],
        ),
        ("no-content.html", &["no-content.html", "{{content}}"]),
        ("latin1.html", &["latin1.html", "UTF-8"]),
        ("t/", &["names a folder"]),
    ];
    for (path, wanted) in cases {
        let text = with_destination(&format!(
            "        publish: {{html: true}}\n        html:\n          template: {path}\n"
        ));
        let e = parse(&text, &file).unwrap_err().to_string();
        assert!(e.contains("config.yaml"), "{path}: {e}");
        for w in *wanted {
            assert!(e.contains(w), "{path}: {e}");
        }
    }
}

#[test]
fn s3_destinations_resolve_to_a_location() {
    let s3 = |extra: &str, path: &str| {
        let text = with_destination(&format!("        backend: s3\n{extra}"))
            .replace("path: /srv/out", &format!("path: {path}"));
        let config = ok(&text);
        config.pipelines[0].destinations[0].clone()
    };
    let location = |bucket: &str, path: &str, endpoint: Option<&str>, region: &str| {
        Backend::S3(S3Location {
            bucket: bucket.into(),
            path: path.into(),
            endpoint: endpoint.map(str::to_owned),
            region: region.into(),
        })
    };
    for (extra, path, want) in [
        (
            "        bucket: reports\n",
            "site/archive",
            location("reports", "site/archive", None, "us-east-1"),
        ),
        (
            "        bucket: reports\n",
            "\"\"",
            location("reports", "", None, "us-east-1"),
        ),
        (
            "        bucket: reports\n",
            "site/",
            location("reports", "site", None, "us-east-1"),
        ),
        (
            "        bucket: my.bucket-1\n        endpoint: http://127.0.0.1:8333/\n        region: eu-west-1\n",
            "a",
            location(
                "my.bucket-1",
                "a",
                Some("http://127.0.0.1:8333"),
                "eu-west-1",
            ),
        ),
    ] {
        let d = s3(extra, path);
        assert_eq!(d.backend, want, "{extra} {path}");
        assert_eq!(
            d.root,
            PathBuf::new(),
            "an s3 destination has no local root"
        );
    }
    // Local destinations are unchanged.
    let local = ok(&with_destination(""));
    assert_eq!(local.pipelines[0].destinations[0].backend, Backend::Local);
    assert_eq!(
        local.pipelines[0].destinations[0].root,
        PathBuf::from("/srv/out")
    );
}

#[test]
fn s3_destinations_show_in_the_summary() {
    let text = with_destination(
        "        backend: s3\n        bucket: reports\n        endpoint: http://127.0.0.1:8333\n",
    )
    .replace("path: /srv/out", "path: \"\"");
    let config = ok(&text);
    let summary = config.summary();
    for want in [
        "backend: s3",
        "bucket: reports",
        "path: (none; the whole bucket)",
        "endpoint: http://127.0.0.1:8333",
        "region: us-east-1",
    ] {
        assert!(summary.contains(want), "summary lacks {want:?}:\n{summary}");
    }
}

#[test]
fn hooks_need_an_absolute_path_to_an_existing_executable() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("purge");
    std::fs::write(&exe, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let plain = dir.path().join("plain");
    std::fs::write(&plain, "").unwrap();
    let hooks = |value: &str| {
        with_destination(&format!(
            "        hooks:\n          after_publish: {value}\n"
        ))
    };

    let c = ok(&hooks(&format!(
        "[\"{}\", \"--zone\", \"docs\"]",
        exe.display()
    )));
    let h = c.pipelines[0].destinations[0].hooks.clone().unwrap();
    assert_eq!(
        h.after_publish,
        [exe.display().to_string(), "--zone".into(), "docs".into()]
    );
    assert_eq!(h.timeout, Duration::from_secs(30), "the default timeout");
    let c = ok(&format!(
        "{}          timeout: 5m\n",
        hooks(&format!("[\"{}\"]", exe.display()))
    ));
    assert_eq!(
        c.pipelines[0].destinations[0]
            .hooks
            .as_ref()
            .unwrap()
            .timeout,
        Duration::from_secs(300)
    );

    // (value of after_publish, what the error says)
    let cases = [
        ("[]".to_owned(), "after_publish is empty"),
        ("[\"purge\"]".to_owned(), "must start with an absolute path"),
        (
            "\"/bin/sh -c purge\"".to_owned(),
            "a command as a list of strings",
        ),
        (
            format!("[\"{}\"]", plain.display()),
            "is not executable; make it so (chmod +x",
        ),
        (
            format!("[\"{}\"]", dir.path().join("missing").display()),
            "cannot use",
        ),
        (format!("[\"{}\"]", dir.path().display()), "is not a file"),
    ];
    for (value, want) in cases {
        let err = parse(&hooks(&value), Path::new(FILE)).unwrap_err();
        let text = err.to_string();
        assert!(text.contains(want), "{value}: {text}");
        assert!(
            text.contains("line 7"),
            "{value}: the error names the line: {text}"
        );
    }
    let err = parse(
        &format!(
            "{}          timeout: 0s\n",
            hooks(&format!("[\"{}\"]", exe.display()))
        ),
        Path::new(FILE),
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("would kill every hook at once"),
        "{err}"
    );
}

#[test]
fn scope_is_a_list_of_folders_and_files() {
    let c = ok(&with_destination(
        "        scope: [\"reports/\", \"index.html\"]\n",
    ));
    let d = &c.pipelines[0].destinations[0];
    let scope = d.scope.as_ref().expect("a scope");
    assert_eq!(scope.entries(), ["reports/", "index.html"]);
    assert!(scope.contains("reports/a.html"));
    assert!(!scope.contains("secret/x.html"));
    assert_eq!(
        d.to_json()["scope"],
        serde_json::json!(["reports/", "index.html"])
    );
    assert!(
        c.summary()
            .contains("      scope: [\"reports/\", \"index.html\"]\n"),
        "{}",
        c.summary()
    );

    // A block list reads the same; no scope is the whole root.
    let c = ok(&with_destination("        scope:\n          - reports/\n"));
    let scope = c.pipelines[0].destinations[0].scope.as_ref().unwrap();
    assert_eq!(scope.entries(), ["reports/"]);
    let c = ok(&with_destination(""));
    let d = &c.pipelines[0].destinations[0];
    assert_eq!(d.scope, None);
    assert_eq!(d.to_json()["scope"], serde_json::Value::Null);
    assert!(
        c.summary()
            .contains("      scope: (none; the whole root)\n")
    );
}

#[test]
fn a_bad_scope_names_the_entry_the_line_and_a_valid_entry() {
    // (value of scope, what the error says)
    let cases = [
        ("[]", "scope is empty"),
        ("[\"/srv/www/\"]", "scope entry \"/srv/www/\""),
        ("[\"reports/\", \"../up/\"]", "scope entry \"../up/\""),
        ("[\"a//b\"]", "'//'"),
        ("[\"./a\"]", "'.' segment"),
        ("[\"a\\\\b\"]", "backslash"),
        ("[\"\"]", "scope entry \"\" is empty"),
        ("[\"/\"]", "the whole root"),
        ("[\".distributor.json\"]", "the tool's own files"),
        (
            "\"reports/\"",
            "a list of folders ending in '/' and file paths",
        ),
        (
            "{reports: yes}",
            "a list of folders ending in '/' and file paths",
        ),
    ];
    for (value, want) in cases {
        let e = err(&with_destination(&format!("        scope: {value}\n")));
        let text = e.to_string();
        assert!(text.contains(want), "{value}: {text}");
        assert!(text.contains("line 6"), "{value}: names the line: {text}");
        if value.starts_with('[') {
            assert!(
                text.contains("such as \"reports/\"") && text.contains("\"index.html\""),
                "{value}: shows a valid entry: {text}"
            );
        }
    }
}

#[test]
fn a_scope_that_the_prefix_leaves_no_room_in_is_a_warning() {
    // (prefix, scope, warned)
    let cases = [
        ("archive/", "[\"reports/\"]", true),
        ("archive", "[\"archive\"]", true),
        ("archive/", "[\"archive/\"]", false),
        ("archive/", "[\"archive/2026/\"]", false),
        ("site/{source_id}/", "[\"docs/\"]", true),
        ("site/{source_id}/", "[\"site/\"]", false),
        ("{source_id}/", "[\"docs/\"]", false),
        ("", "[\"docs/\"]", false),
    ];
    for (prefix, scope, warned) in cases {
        let c = ok(&with_destination(&format!(
            "        prefix: \"{prefix}\"\n        scope: {scope}\n"
        )));
        let warnings = c.warnings();
        let hit = warnings
            .iter()
            .any(|w| w.contains("every bundle would fail at stage verify"));
        assert_eq!(hit, warned, "{prefix} {scope}: {warnings:?}");
    }
}

/// Two pipelines `a` and `b`, each with destination `d`; `a_keys` and
/// `b_keys` are the destinations' keys (root and scope), one per line.
fn two_sharers(a_keys: &str, b_keys: &str) -> Config {
    let indent = |keys: &str| {
        keys.lines()
            .map(|l| format!("        {l}\n"))
            .collect::<String>()
    };
    ok(&format!(
        "pipelines:\n  - id: a\n    destinations:\n      - id: d\n{}  - id: b\n    destinations:\n      - id: d\n{}",
        indent(a_keys),
        indent(b_keys)
    ))
}

#[test]
fn shared_roots_are_found_when_scopes_can_meet() {
    for (a, b, warned, inside) in shared_root_cases() {
        let c = two_sharers(&a, &b);
        let found = shared_roots(&c);
        assert_eq!(found.len(), usize::from(warned), "{a:?} / {b:?}: {found:?}");
        let Some(shared) = found.first() else {
            continue;
        };
        assert_eq!(shared.inside.as_deref(), inside, "{a:?} / {b:?}");
        let text = shared.to_text();
        for want in [
            "destination \"d\" of pipeline \"a\"",
            "destination \"d\" of pipeline \"b\"",
            "and their scopes overlap",
            "give each destination a scope",
            "docs/security.md",
        ] {
            assert!(text.contains(want), "{a:?} / {b:?}: {want:?} not in {text}");
        }
        let harm = match inside {
            None => "each pipeline can overwrite and take over the other's outputs there",
            Some(_) => "each can block the other's publications (fail_unmanaged)",
        };
        assert!(text.contains(harm), "{a:?} / {b:?}: {text}");
        assert!(
            c.warnings().contains(&text),
            "config check shows it: {:?}",
            c.warnings()
        );
    }
}

/// (a's keys, b's keys, warned, where b's root lies in a's)
fn shared_root_cases() -> Vec<(String, String, bool, Option<&'static str>)> {
    let s3 = |path: &str| {
        format!("backend: s3\nbucket: site\npath: \"{path}\"\nendpoint: http://127.0.0.1:8333")
    };
    vec![
        // One folder, no scope on either side, or on one side.
        ("path: /srv/www".into(), "path: /srv/www".into(), true, None),
        (
            "path: /srv/www".into(),
            "path: /srv/www/".into(),
            true,
            None,
        ),
        (
            "path: /srv/www".into(),
            "path: /srv/x/../www".into(),
            true,
            None,
        ),
        (
            "path: /srv/www\nscope: [\"a/\"]".into(),
            "path: /srv/www".into(),
            true,
            None,
        ),
        // Scopes that meet, and scopes that do not.
        (
            "path: /srv/www\nscope: [\"a/\", \"index.html\"]".into(),
            "path: /srv/www\nscope: [\"b/\", \"index.html\"]".into(),
            true,
            None,
        ),
        (
            "path: /srv/www\nscope: [\"a/\"]".into(),
            "path: /srv/www\nscope: [\"a/b/\"]".into(),
            true,
            None,
        ),
        (
            "path: /srv/www\nscope: [\"a/\", \"index.html\"]".into(),
            "path: /srv/www\nscope: [\"b/\"]".into(),
            false,
            None,
        ),
        (
            "path: /srv/www\nscope: [\"a/\"]".into(),
            "path: /srv/www\nscope: [\"ab/\"]".into(),
            false,
            None,
        ),
        // Nested: the inner root is a folder of the outer one.
        (
            "path: /srv/www".into(),
            "path: /srv/www/docs".into(),
            true,
            Some("docs"),
        ),
        (
            "path: /srv/www/docs".into(),
            "path: /srv/www".into(),
            true,
            Some("docs"),
        ),
        (
            "path: /srv/www\nscope: [\"docs/\"]".into(),
            "path: /srv/www/docs\nscope: [\"a/\"]".into(),
            true,
            Some("docs"),
        ),
        (
            "path: /srv/www\nscope: [\"docs/a/x.html\"]".into(),
            "path: /srv/www/docs\nscope: [\"a/\"]".into(),
            true,
            Some("docs"),
        ),
        (
            "path: /srv/www\nscope: [\"docs/b/\", \"index.html\"]".into(),
            "path: /srv/www/docs\nscope: [\"a/\"]".into(),
            false,
            Some("docs"),
        ),
        (
            "path: /srv/www\nscope: [\"reports/\"]".into(),
            "path: /srv/www/docs".into(),
            false,
            Some("docs"),
        ),
        (
            "path: /srv/www\nscope: [\"docs\"]".into(),
            "path: /srv/www/docs".into(),
            false,
            Some("docs"),
        ),
        (
            "path: /srv/www".into(),
            "path: /srv/www/a/b".into(),
            true,
            Some("a/b"),
        ),
        // Apart.
        (
            "path: /srv/www".into(),
            "path: /srv/www2".into(),
            false,
            None,
        ),
        ("path: /srv/a".into(), "path: /srv/b".into(), false, None),
        // s3: one bucket on one server, paths compared by segment.
        (s3("site"), s3("site"), true, None),
        (s3(""), s3("site/docs"), true, Some("site/docs")),
        (s3("site"), s3("site/docs"), true, Some("docs")),
        (s3("site"), s3("site2"), false, None),
        (
            format!("{}\nscope: [\"a/\"]", s3("site")),
            format!("{}\nscope: [\"b/\"]", s3("site")),
            false,
            None,
        ),
        (s3("site"), s3("site").replace("8333", "9333"), false, None),
        (
            s3("site"),
            s3("site").replace("bucket: site", "bucket: other"),
            false,
            None,
        ),
        // A local folder and a bucket never meet.
        ("path: /srv/site".into(), s3("site"), false, None),
    ]
}

#[test]
fn a_shared_root_warning_names_roots_scopes_and_the_fix() {
    let c = two_sharers("path: /srv/www", "path: /srv/www\nscope: [\"docs/\"]");
    let text = shared_roots(&c)[0].to_text();
    assert_eq!(
        text,
        "destination \"d\" of pipeline \"a\" (root /srv/www) and destination \"d\" of pipeline \"b\" (root /srv/www) share one root, and their scopes overlap (no scope, the whole root; scope [\"docs/\"]): each pipeline can overwrite and take over the other's outputs there; give each destination a scope, the two disjoint (such as scope: [\"a/\"] for \"d\" and scope: [\"b/\"] for \"d\"); see docs/security.md"
    );
    let c = two_sharers("path: /srv/www/docs", "path: /srv/www");
    let shared = &shared_roots(&c)[0];
    assert_eq!(shared.outer.pipeline_id, "b", "the outer root comes first");
    assert_eq!(shared.outer.root, "/srv/www");
    assert_eq!(shared.inner.root, "/srv/www/docs");
    let text = shared.to_text();
    assert!(
        text.contains("lie one inside the other (the second at docs/ of the first)"),
        "{text}"
    );
    assert!(
        text.contains("a scope for \"d\" that leaves out docs/"),
        "{text}"
    );
    // Destinations of one pipeline are not warned about (one pipeline is
    // one party), nor is a pipeline with itself.
    let c = ok(
        "pipelines:\n  - id: a\n    destinations:\n      - id: x\n        path: /srv/www\n      - id: y\n        path: /srv/www/docs\n",
    );
    assert!(shared_roots(&c).is_empty());
}

/// An s3 destination with `headers:` set to `rules` (YAML lines indented
/// by 10 spaces in the caller's text, starting at line 9).
fn with_header_rules(rules: &str) -> String {
    with_destination(&format!(
        "        backend: s3\n        bucket: reports\n        headers:\n{rules}"
    ))
    .replace("path: /srv/out", "path: site")
}

#[test]
fn header_rules_load_in_order_and_show_in_the_summary() {
    let config = ok(&with_header_rules(
        "          - match: \"assets/**\"\n            cache_control: \"public, max-age=31536000, immutable\"\n          - match: \"**/*.html\"\n            cache_control: no-cache\n            content_type: \"text/html; charset=utf-8\"\n          - match: \"*.pdf\"\n            content_disposition: attachment\n",
    ));
    let d = &config.pipelines[0].destinations[0];
    let patterns: Vec<&str> = d
        .headers
        .rules()
        .iter()
        .map(|r| r.pattern.as_str())
        .collect();
    assert_eq!(patterns, ["assets/**", "**/*.html", "*.pdf"]);
    let served = d.headers.served("assets/a.html");
    assert_eq!(
        served.cache_control.as_deref(),
        Some("public, max-age=31536000, immutable")
    );
    assert_eq!(
        served.content_type.as_deref(),
        Some("text/html; charset=utf-8")
    );
    let summary = config.summary();
    for want in [
        "headers: match \"assets/**\", cache_control \"public, max-age=31536000, immutable\"\n",
        "headers: match \"**/*.html\", cache_control \"no-cache\", content_type \"text/html; charset=utf-8\"\n",
        "headers: match \"*.pdf\", content_disposition \"attachment\"\n",
    ] {
        assert!(summary.contains(want), "{want:?} missing:\n{summary}");
    }
    let json = d.to_json();
    assert_eq!(json["headers"][2]["match"], "*.pdf");
    assert_eq!(json["headers"][2]["content_disposition"], "attachment");
    // No rules: no key in the summary.
    let plain = ok(&with_destination(""));
    assert!(
        plain.pipelines[0].destinations[0]
            .to_json()
            .get("headers")
            .is_none()
    );
}

#[test]
fn bad_header_rules_name_the_line_and_the_fix() {
    // (rules, what the error says, the line it names)
    let cases = [
        (
            "          - match: \"assets/[a-\"\n",
            "is not a valid glob",
            Some(9),
        ),
        (
            "          - match: \"/assets/**\"\n",
            "drop the leading '/'",
            Some(9),
        ),
        (
            "          - match: \"**\"\n            cache_contol: no-cache\n",
            "unknown key `cache_contol`",
            Some(10),
        ),
        (
            "          - cache_control: no-cache\n",
            "missing required key `match`",
            Some(9),
        ),
        (
            "          - match: \"**\"\n            content_type: \"text/html\\nX-Evil: 1\"\n",
            "control character",
            Some(10),
        ),
        (
            "          - match: \"**\"\n            cache_control: \"a\\u0001\"\n",
            "control character",
            Some(10),
        ),
        (
            "          - match: \"**\"\n            content_type: html\n",
            "not a media type",
            Some(10),
        ),
        ("          match: \"**\"\n", "invalid type", Some(9)),
    ];
    for (rules, want, line) in cases {
        let e = err(&with_header_rules(rules));
        let text = e.to_string();
        assert!(text.contains(want), "{rules}: {text}");
        if let Some(line) = line {
            assert!(
                text.contains(&format!("line {line} ")),
                "{rules}: names line {line}: {text}"
            );
        }
    }
}

#[test]
fn header_rules_on_a_local_destination_are_an_error_pointing_to_serving_md() {
    let e = err(&with_destination(
        "        headers:\n          - match: \"**\"\n            cache_control: no-cache\n",
    ));
    let text = e.to_string();
    for want in [
        "destination \"d\" of pipeline \"p\"",
        "headers is set but the backend is local",
        "the web server sets the response headers",
        "docs/serving.md",
    ] {
        assert!(text.contains(want), "{want:?} missing: {text}");
    }
}
