//! The response headers stored with each object of an s3 root
//! (docs/object-storage.md, "Serving the bucket"): the `Content-Type` an
//! output's extension gives in a maintained MIME database (`mime_guess`,
//! not a table of our own), and a destination's `headers` rules, globs
//! over the output path (`globset`) of which the first that matches sets
//! `Cache-Control`, `Content-Type` and `Content-Disposition`. Pure: no
//! request, no file.

use globset::{Glob, GlobBuilder, GlobSet, GlobSetBuilder};

/// The response headers stored with an object: what the rules give an
/// output ([`HeaderRules::served`]), or what a HEAD shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Served {
    pub content_type: Option<String>,
    pub cache_control: Option<String>,
    pub content_disposition: Option<String>,
}

/// One rule of a destination's `headers`.
#[derive(Debug, Clone)]
pub struct HeaderRule {
    /// `match`, as written.
    pub pattern: String,
    glob: Glob,
    pub cache_control: Option<String>,
    /// Instead of the MIME database's type.
    pub content_type: Option<String>,
    pub content_disposition: Option<String>,
}

impl HeaderRule {
    /// A rule matching the glob `pattern` ([`glob`]).
    pub fn new(
        pattern: &str,
        cache_control: Option<String>,
        content_type: Option<String>,
        content_disposition: Option<String>,
    ) -> Result<HeaderRule, String> {
        Ok(HeaderRule {
            pattern: pattern.to_owned(),
            glob: glob(pattern)?,
            cache_control,
            content_type,
            content_disposition,
        })
    }
}

/// A destination's `headers` rules, in order (none: every object gets
/// its MIME type only).
#[derive(Debug, Clone, Default)]
pub struct HeaderRules {
    rules: Vec<HeaderRule>,
    set: GlobSet,
}

impl HeaderRules {
    pub fn new(rules: Vec<HeaderRule>) -> Result<HeaderRules, String> {
        let mut set = GlobSetBuilder::new();
        for r in &rules {
            set.add(r.glob.clone());
        }
        let set = set
            .build()
            .map_err(|e| format!("the headers rules cannot be compiled: {}", e.kind()))?;
        Ok(HeaderRules { rules, set })
    }

    pub fn rules(&self) -> &[HeaderRule] {
        &self.rules
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The headers output `path` (relative to the root) is stored with:
    /// those of the first rule that matches it, and the MIME database's
    /// type where that rule sets none.
    pub fn served(&self, path: &str) -> Served {
        let rule = self
            .set
            .matches(path)
            .into_iter()
            .min()
            .map(|i| &self.rules[i]);
        let pick = |f: fn(&HeaderRule) -> &Option<String>| rule.and_then(|r| f(r).clone());
        Served {
            content_type: Some(pick(|r| &r.content_type).unwrap_or_else(|| content_type(path))),
            cache_control: pick(|r| &r.cache_control),
            content_disposition: pick(|r| &r.content_disposition),
        }
    }
}

/// A `match` glob over output paths: `*` and `?` within one path segment,
/// `**` across segments, `[a-z]` and `{a,b}` as usual; case-sensitive.
pub fn glob(pattern: &str) -> Result<Glob, String> {
    const HINT: &str = "* matches within a path segment and ** across segments, such as \"assets/**\" or \"**/*.html\"";
    if pattern.is_empty() {
        return Err(format!(
            "match is empty; give a glob over the output path: {HINT}"
        ));
    }
    if pattern.starts_with('/') {
        return Err(format!(
            "match {pattern:?} starts with '/'; it is matched against output paths relative to the root (such as assets/app.css), so drop the leading '/'"
        ));
    }
    GlobBuilder::new(pattern)
        .literal_separator(true)
        .build()
        .map_err(|e| {
            format!(
                "match {pattern:?} is not a valid glob: {}; {HINT}",
                e.kind()
            )
        })
}

/// A header value of key `key` (`cache_control`, `content_type`,
/// `content_disposition`) as it will be sent: trimmed, one line of
/// printable ASCII, not empty; a `content_type` must be a media type.
pub fn check_value(key: &str, text: &str) -> Result<String, String> {
    let value = text.trim_matches(|c| c == ' ' || c == '\t');
    if value.chars().any(|c| c.is_control()) {
        return Err(format!(
            "{key} {text:?} holds a newline or another control character, which an HTTP header cannot carry; write the value on one line"
        ));
    }
    if !value.is_ascii() {
        return Err(format!(
            "{key} {text:?} holds a character outside ASCII, which S3 does not store in a header; percent-encode it (a file name: filename*=UTF-8''name%C3%A9.pdf)"
        ));
    }
    if value.is_empty() {
        return Err(format!(
            "{key} is empty; remove the key to store no such header"
        ));
    }
    if key == "content_type" && value.parse::<mime_guess::Mime>().is_err() {
        return Err(format!(
            "content_type {text:?} is not a media type; write it like \"text/html; charset=utf-8\""
        ));
    }
    Ok(value.to_owned())
}

/// The `Content-Type` of output `path`: the first type the MIME database
/// gives for its extension (case does not matter), with `; charset=utf-8`
/// on a text type ([`is_text`]); `application/octet-stream` for an
/// extension it does not know or a path without one.
pub fn content_type(path: &str) -> String {
    let name = path.rsplit('/').next().unwrap_or(path);
    // `mime_guess` takes a name without a dot (`README`) for an extension.
    let Some((_, ext)) = name.rsplit_once('.') else {
        return OCTET_STREAM.to_owned();
    };
    match mime_guess::from_ext(ext).first_raw() {
        Some(t) if is_text(t) => format!("{t}; charset=utf-8"),
        Some(t) => t.to_owned(),
        None => OCTET_STREAM.to_owned(),
    }
}

const OCTET_STREAM: &str = "application/octet-stream";

/// Whether media type `t` (no parameters) is text a browser decodes with
/// a charset: `text/*`, and the `application`/`image` types whose
/// subtype is `javascript`, `json` or `xml` or ends in `+json` or `+xml`
/// (`application/manifest+json`, `image/svg+xml`, `application/rss+xml`).
pub fn is_text(t: &str) -> bool {
    let Some((top, sub)) = t.split_once('/') else {
        return false;
    };
    top == "text"
        || matches!(sub, "javascript" | "json" | "xml")
        || sub.ends_with("+json")
        || sub.ends_with("+xml")
}

#[cfg(test)]
mod tests {
    use super::{HeaderRule, HeaderRules, Served, check_value, content_type, glob, is_text};

    /// `match`, `cache_control`, `content_type`, `content_disposition`.
    type Row<'a> = (&'a str, Option<&'a str>, Option<&'a str>, Option<&'a str>);

    fn rules(rules: &[Row<'_>]) -> HeaderRules {
        let own = |v: &Option<&str>| v.map(str::to_owned);
        HeaderRules::new(
            rules
                .iter()
                .map(|(m, cc, ct, cd)| HeaderRule::new(m, own(cc), own(ct), own(cd)).unwrap())
                .collect(),
        )
        .unwrap()
    }

    #[test]
    fn the_first_matching_rule_sets_the_headers() {
        let r = rules(&[
            ("assets/**", Some("immutable"), None, None),
            (
                "**/*.html",
                Some("no-cache"),
                Some("text/html; charset=utf-8"),
                None,
            ),
            ("*.pdf", None, None, Some("attachment")),
            ("raw/*", None, None, None),
            ("**", Some("max-age=60"), None, None),
        ]);
        let served = |ct: &str, cc: Option<&str>, cd: Option<&str>| Served {
            content_type: Some(ct.to_owned()),
            cache_control: cc.map(str::to_owned),
            content_disposition: cd.map(str::to_owned),
        };
        for (path, want) in [
            // `**` across segments; the first rule wins over later ones.
            (
                "assets/a/b/app.css",
                served("text/css; charset=utf-8", Some("immutable"), None),
            ),
            (
                "assets/index.html",
                served("text/html; charset=utf-8", Some("immutable"), None),
            ),
            // `**/` matches no folder too.
            (
                "index.html",
                served("text/html; charset=utf-8", Some("no-cache"), None),
            ),
            (
                "a/b/page.html",
                served("text/html; charset=utf-8", Some("no-cache"), None),
            ),
            // `*` stays within one segment.
            (
                "report.pdf",
                served("application/pdf", None, Some("attachment")),
            ),
            (
                "2026/report.pdf",
                served("application/pdf", Some("max-age=60"), None),
            ),
            // A rule without values still stops the search.
            (
                "raw/x.json",
                served("application/json; charset=utf-8", None, None),
            ),
            (
                "raw/deeper/x.json",
                served("application/json; charset=utf-8", Some("max-age=60"), None),
            ),
            // Case-sensitive, like the paths.
            (
                "ASSETS/x.png",
                served("image/png", Some("max-age=60"), None),
            ),
        ] {
            assert_eq!(r.served(path), want, "{path}");
        }
        assert_eq!(
            HeaderRules::default().served("x/y.bin"),
            served("application/octet-stream", None, None)
        );
    }

    #[test]
    fn bad_globs_are_refused_with_a_hint() {
        for (pattern, says) in [
            ("", "match is empty"),
            ("/assets/**", "drop the leading '/'"),
            ("assets/[a-", "is not a valid glob"),
            ("{a,b", "is not a valid glob"),
        ] {
            let e = glob(pattern).unwrap_err();
            assert!(e.contains(says), "{pattern:?}: {e}");
        }
        assert!(glob("**/*.{js,css}").is_ok());
    }

    #[test]
    fn header_values_are_one_line_of_ascii() {
        for (key, text, result) in [
            ("cache_control", "no-cache", Ok("no-cache")),
            (
                "cache_control",
                "  public, max-age=60 ",
                Ok("public, max-age=60"),
            ),
            ("cache_control", "no-cache\nX-Evil: 1", Err("newline")),
            ("content_disposition", "attachment\r", Err("newline")),
            ("cache_control", "a\tb", Err("control character")),
            ("cache_control", "a\u{7f}", Err("control character")),
            (
                "content_disposition",
                "attachment; filename=\"é.pdf\"",
                Err("outside ASCII"),
            ),
            ("cache_control", "  ", Err("is empty")),
            (
                "content_type",
                "text/html; charset=utf-8",
                Ok("text/html; charset=utf-8"),
            ),
            ("content_type", "html", Err("not a media type")),
            ("content_type", "text/html\n", Err("newline")),
        ] {
            let got = check_value(key, text);
            match result {
                Ok(v) => assert_eq!(got.as_deref(), Ok(v), "{text:?}"),
                Err(says) => {
                    let e = got.unwrap_err();
                    assert!(e.contains(says) && e.contains(key), "{text:?}: {e}");
                }
            }
        }
    }

    #[test]
    fn content_types_come_from_the_mime_database() {
        for (path, expected) in [
            ("app.wasm", "application/wasm"),
            ("favicon.ico", "image/x-icon"),
            ("photo.avif", "image/avif"),
            ("clip.mp4", "video/mp4"),
            ("f.woff", "application/font-woff"),
            ("f.woff2", "font/woff2"),
            ("f.ttf", "font/ttf"),
            ("f.otf", "application/font-sfnt"),
            (
                "site.webmanifest",
                "application/manifest+json; charset=utf-8",
            ),
            ("index.html", "text/html; charset=utf-8"),
            ("a/B.HTM", "text/html; charset=utf-8"),
            ("style.css", "text/css; charset=utf-8"),
            ("app.js", "text/javascript; charset=utf-8"),
            ("mod.mjs", "application/javascript; charset=utf-8"),
            ("data.json", "application/json; charset=utf-8"),
            ("logo.svg", "image/svg+xml; charset=utf-8"),
            ("feed.xml", "text/xml; charset=utf-8"),
            ("notes.txt", "text/plain; charset=utf-8"),
            ("README.md", "text/markdown; charset=utf-8"),
            ("table.csv", "text/csv; charset=utf-8"),
            ("img/x.png", "image/png"),
            ("archive.tar.gz", "application/gzip"),
            ("blob.unknown-ext", "application/octet-stream"),
            ("Makefile", "application/octet-stream"),
            ("dir.d/noext", "application/octet-stream"),
            (".hidden", "application/octet-stream"),
        ] {
            assert_eq!(content_type(path), expected, "{path}");
        }
    }

    #[test]
    fn text_types_are_text_and_others_are_not() {
        for (t, text) in [
            ("text/plain", true),
            ("application/json", true),
            ("application/ld+json", true),
            ("image/svg+xml", true),
            ("application/xml", true),
            ("application/javascript", true),
            ("application/wasm", false),
            ("image/png", false),
            ("application/octet-stream", false),
            ("application/zip", false),
            ("nonsense", false),
        ] {
            assert_eq!(is_text(t), text, "{t}");
        }
    }
}
