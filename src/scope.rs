//! Scopes (docs/contract.md §17): which output paths a destination may
//! publish. A [`Scope`] is a list of entries, each a folder of the root
//! (`"reports/"`, which holds every path below it) or one exact file
//! (`"index.html"`); "no scope" is `Option<Scope>::None`, the whole root.
//!
//! Pure: it compares path text and never touches the file system, and it
//! knows nothing of where a scope is configured.

use std::fmt;

use crate::paths::{self, RelPath};

/// What a valid scope entry looks like, for error messages.
const VALID_ENTRY: &str = "an entry is a folder of the root ending in '/', such as \"reports/\", or one file path, such as \"index.html\" (relative to the root, no '..', no wildcards)";

/// The output paths a destination may publish: a non-empty list of folder
/// entries (ending in `/`) and exact file entries, each clean and relative.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    /// As written: a folder entry ends in `/`, a file entry does not.
    entries: Vec<String>,
}

impl Scope {
    /// Checks a scope as written in the configuration. The error names the
    /// bad entry and says what a valid one looks like.
    pub fn parse(entries: &[String]) -> Result<Scope, String> {
        if entries.is_empty() {
            return Err(format!(
                "scope is empty, so nothing could be published; list what may be published ({VALID_ENTRY}), or remove scope to allow the whole root"
            ));
        }
        for entry in entries {
            check_entry(entry)
                .map_err(|why| format!("scope entry {entry:?} {why}; {VALID_ENTRY}"))?;
        }
        Ok(Scope {
            entries: entries.to_vec(),
        })
    }

    /// True when the clean relative output path `path` lies inside the
    /// scope: below one of its folders, or equal to one of its files.
    pub fn contains(&self, path: &str) -> bool {
        self.entries.iter().any(|e| entry_contains(e, path))
    }

    /// True when some path could lie inside both scopes.
    pub fn overlaps(&self, other: &Scope) -> bool {
        self.entries
            .iter()
            .any(|a| other.entries.iter().any(|b| entries_overlap(a, b)))
    }

    /// The entries as written (folders end in `/`).
    pub fn entries(&self) -> &[String] {
        &self.entries
    }

    /// The scope of the whole folder `folder`: the paths a destination
    /// rooted there may write, seen from a root it lies in.
    pub fn folder(folder: &RelPath) -> Scope {
        Scope {
            entries: vec![format!("{folder}/")],
        }
    }

    /// This scope seen from a root `folder` levels up: every entry moved
    /// below `folder` (`a/` under `docs` is `docs/a/`).
    pub fn under(&self, folder: &RelPath) -> Scope {
        Scope {
            entries: self
                .entries
                .iter()
                .map(|e| format!("{folder}/{e}"))
                .collect(),
        }
    }
}

/// Why `entry` is not a valid scope entry, as the end of a sentence that
/// starts with the entry.
fn check_entry(entry: &str) -> Result<(), String> {
    if entry.is_empty() {
        return Err("is empty".to_owned());
    }
    if entry == "/" {
        return Err(
            "is the whole root; remove scope to allow the whole root, or name its folders"
                .to_owned(),
        );
    }
    if entry.contains("//") {
        return Err("has an empty segment ('//')".to_owned());
    }
    let path = entry.strip_suffix('/').unwrap_or(entry);
    let path = RelPath::parse(path).map_err(|e| format!("is not valid: {e}"))?;
    if path.is_reserved() {
        return Err(format!(
            "names the tool's own files ({}*), which are never published",
            paths::RESERVED_PREFIX
        ));
    }
    Ok(())
}

/// True when `path` lies below the folder entry `folder` (which ends in
/// `/`).
fn below(path: &str, folder: &str) -> bool {
    path.len() > folder.len() && path.starts_with(folder)
}

fn entry_contains(entry: &str, path: &str) -> bool {
    if entry.ends_with('/') {
        below(path, entry)
    } else {
        path == entry
    }
}

fn entries_overlap(a: &str, b: &str) -> bool {
    match (a.ends_with('/'), b.ends_with('/')) {
        (true, true) => a.starts_with(b) || b.starts_with(a),
        (true, false) => below(b, a),
        (false, true) => below(a, b),
        (false, false) => a == b,
    }
}

impl fmt::Display for Scope {
    /// `["reports/", "index.html"]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, entry) in self.entries.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{entry:?}")?;
        }
        f.write_str("]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(entries: &[&str]) -> Scope {
        let entries: Vec<String> = entries.iter().map(|e| e.to_string()).collect();
        Scope::parse(&entries).unwrap_or_else(|e| panic!("{entries:?}: {e}"))
    }

    fn rel(text: &str) -> RelPath {
        RelPath::parse(text).unwrap()
    }

    #[test]
    fn valid_entries_are_folders_or_files() {
        for entries in [
            &["reports/"][..],
            &["reports/", "index.html"],
            &["project-a/"],
            &["a/b/c/"],
            &["index.html"],
            &["a/b.txt"],
            &["é/ü.md"],
            &[".well-known/"],
            &["reports/", "reports/"],
        ] {
            scope(entries);
        }
    }

    #[test]
    fn invalid_entries_are_named_with_the_rule_and_a_valid_example() {
        // (entries, words the message must hold)
        let long = format!("{}/", "x".repeat(256));
        let cases: &[(&[&str], &str)] = &[
            (&[], "scope is empty"),
            (&[""], "\"\" is empty"),
            (&["/"], "\"/\" is the whole root"),
            (&["/srv/www/"], "starts with '/'"),
            (&["/index.html"], "starts with '/'"),
            (&["a//b/"], "'//'"),
            (&["a//"], "'//'"),
            (&["../x/"], "'..'"),
            (&["a/../b"], "'..'"),
            (&["./a/"], "'.' segment"),
            (&["a/./"], "'.' segment"),
            (&["."], "'.' segment"),
            (&["a\\b/"], "backslash"),
            (&["a\nb"], "control character"),
            (&[long.as_str()], "longer than 255 bytes"),
            (&[".distributor.json"], "the tool's own files"),
            (&["a/.distributor-pending/"], "the tool's own files"),
            (&["reports/", "../etc/"], "\"../etc/\""),
        ];
        for (entries, want) in cases {
            let entries: Vec<String> = entries.iter().map(|e| e.to_string()).collect();
            let e = Scope::parse(&entries).expect_err(&format!("{entries:?} is invalid"));
            assert!(e.contains(want), "{entries:?}: {e}");
            assert!(
                e.contains("\"reports/\"") && e.contains("\"index.html\""),
                "{entries:?}: the message shows valid entries: {e}"
            );
        }
    }

    #[test]
    fn contains_folders_below_and_files_exactly() {
        let s = scope(&["reports/", "index.html", "a/b/"]);
        // (path, inside)
        let cases = [
            ("reports/x.html", true),
            ("reports/2026/06/x.html", true),
            ("reports", false),
            ("reportsx/y", false),
            ("reports.html", false),
            ("index.html", true),
            ("index.html/x", false),
            ("index.htm", false),
            ("sub/index.html", false),
            ("a/b/c", true),
            ("a/b", false),
            ("a/bc/d", false),
            ("a/x", false),
            ("secret/x.html", false),
        ];
        for (path, inside) in cases {
            assert_eq!(s.contains(path), inside, "{path} in {s}");
        }
    }

    #[test]
    fn overlaps_when_some_path_could_be_in_both() {
        // (a, b, overlap): symmetric.
        let cases: &[(&[&str], &[&str], bool)] = &[
            (&["a/"], &["a/"], true),
            (&["a/"], &["a/b/"], true),
            (&["a/"], &["ab/"], false),
            (&["a/"], &["b/"], false),
            (&["a/"], &["a/x.html"], true),
            (&["a/"], &["a"], false),
            (&["a/"], &["ab"], false),
            (&["index.html"], &["index.html"], true),
            (&["index.html"], &["index.htm"], false),
            (&["project-a/"], &["project-b/", "index.html"], false),
            (
                &["project-a/", "index.html"],
                &["project-b/", "index.html"],
                true,
            ),
            (&["docs/a/"], &["docs/"], true),
            (&["docs/a/"], &["docs/b/", "docs/a/x"], true),
        ];
        for (a, b, want) in cases {
            let (a, b) = (scope(a), scope(b));
            assert_eq!(a.overlaps(&b), *want, "{a} and {b}");
            assert_eq!(b.overlaps(&a), *want, "{b} and {a}");
        }
    }

    #[test]
    fn a_scope_moves_below_a_folder_of_an_outer_root() {
        // A destination rooted at /srv/www/docs with scope a/ covers
        // docs/a/ of the root /srv/www.
        let inner = scope(&["a/", "index.html"]).under(&rel("docs"));
        assert_eq!(inner.to_string(), r#"["docs/a/", "docs/index.html"]"#);
        assert!(inner.contains("docs/a/x"));
        assert!(inner.contains("docs/index.html"));
        assert!(!inner.contains("a/x"));
        assert!(inner.overlaps(&scope(&["docs/"])));
        assert!(!inner.overlaps(&scope(&["a/"])));
        assert!(!inner.overlaps(&scope(&["docs/b/"])));
        let whole = Scope::folder(&rel("docs/v1"));
        assert_eq!(whole.to_string(), r#"["docs/v1/"]"#);
        assert!(whole.contains("docs/v1/x"));
        assert!(!whole.contains("docs/v1"));
    }

    #[test]
    fn display_lists_the_entries_as_written() {
        assert_eq!(
            scope(&["reports/", "index.html"]).to_string(),
            r#"["reports/", "index.html"]"#
        );
        assert_eq!(
            scope(&["reports/", "index.html"]).entries(),
            ["reports/", "index.html"]
        );
    }

    proptest::proptest! {
        /// Whatever the text, parsing never panics, and an accepted scope
        /// only contains clean paths that start with one of its entries.
        #[test]
        fn parse_never_panics_and_contains_only_what_it_names(
            entries in proptest::collection::vec("[a-z./\\\\]{0,8}", 0..4),
            path in "[a-z./]{1,12}",
        ) {
            if let Ok(s) = Scope::parse(&entries)
                && RelPath::parse(&path).is_ok()
                && s.contains(&path)
            {
                proptest::prop_assert!(s.entries().iter().any(|e| path.starts_with(e.as_str())));
            }
        }
    }
}
