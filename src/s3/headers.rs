//! The response headers stored with each object of an s3 root
//! (docs/contract.md §21.1): the `Content-Type` an output's extension
//! gives in a maintained MIME database (`mime_guess`, not a table of our
//! own). Pure: no request, no file.

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
    use super::{content_type, is_text};

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
