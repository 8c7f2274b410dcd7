//! Element ids of a page: GitHub-style heading slugs and footnote ids, all
//! unique within the page (SPEC §16.1).
//!
//! - A heading's slug is its text, lowercased, with each space turned into
//!   `-` and every character other than letters, digits, marks, `-` and `_`
//!   dropped (what GitHub does), after trimming the text (GitHub keeps a
//!   leading `-` where an image starts the heading). A repeated slug gets `-1`, `-2`, ...; the
//!   first free one is taken, so a later heading whose own slug is taken
//!   (e.g. "a-1") is numbered too.
//! - A heading with no slug text gets `section`.
//! - Footnote ids start with `fn-` or `fnref-` and a digit. A heading slug
//!   of that form (or exactly `fn` or `fnref`, whose numbered repeats would
//!   be) is prefixed with `h-`, so headings can never take a footnote's id.

use std::collections::{HashMap, HashSet};

/// The slug of a heading's text, before making it unique.
pub(super) fn slug(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars().flat_map(char::to_lowercase) {
        if c == ' ' {
            out.push('-');
        } else if c == '-' || c == '_' || c.is_alphanumeric() || is_mark(c) {
            out.push(c);
        }
    }
    out
}

/// Combining marks (kept by GitHub's slugger so that accented letters
/// written in decomposed form survive). Approximated by the common
/// combining blocks.
fn is_mark(c: char) -> bool {
    matches!(c, '\u{300}'..='\u{36f}' | '\u{1ab0}'..='\u{1aff}' | '\u{1dc0}'..='\u{1dff}' | '\u{20d0}'..='\u{20ff}' | '\u{fe20}'..='\u{fe2f}')
}

/// Whether a slug could collide with a footnote id (or would when numbered).
fn looks_like_footnote(slug: &str) -> bool {
    if slug == "fn" || slug == "fnref" {
        return true;
    }
    ["fn-", "fnref-"].iter().any(|prefix| {
        slug.strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
    })
}

/// The ids handed out so far in one page, and the footnote numbering.
#[derive(Default)]
pub(super) struct Ids {
    used: HashSet<String>,
    /// The number of the last id given to a heading, by slug (0: the slug
    /// itself).
    numbered: HashMap<String, usize>,
    /// Footnote number by lowercased label.
    footnotes: HashMap<String, usize>,
    /// References written so far, by footnote number.
    references: HashMap<usize, usize>,
    /// Footnote numbers whose definition has been written.
    defined: HashSet<usize>,
}

impl Ids {
    /// A unique id for a heading with this text.
    pub(super) fn heading(&mut self, text: &str) -> String {
        let mut base = slug(text);
        if base.is_empty() {
            base.push_str("section");
        }
        if looks_like_footnote(&base) {
            base.insert_str(0, "h-");
        }
        // Numbers below the last one taken for this slug are all in use
        // (ids are never freed), so the search goes on from there: many
        // headings with the same text cost linear, not quadratic, time.
        let mut n = self.numbered.get(&base).copied().unwrap_or(0);
        let mut candidate = if n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        };
        while self.used.contains(&candidate) {
            n += 1;
            candidate = format!("{base}-{n}");
        }
        self.numbered.insert(base, n);
        self.used.insert(candidate.clone());
        candidate
    }

    /// The number of the footnote with this label (assigned on first use).
    fn footnote_number(&mut self, label: &str) -> usize {
        let next = self.footnotes.len() + 1;
        *self.footnotes.entry(label.to_lowercase()).or_insert(next)
    }

    /// A reference to footnote `label`: its number and the reference's own
    /// id (`fnref-N`, then `fnref-N-2`, ...).
    pub(super) fn footnote_reference(&mut self, label: &str) -> (usize, String) {
        let number = self.footnote_number(label);
        let count = self.references.entry(number).or_insert(0);
        *count += 1;
        let id = if *count == 1 {
            format!("fnref-{number}")
        } else {
            format!("fnref-{number}-{count}")
        };
        (number, id)
    }

    /// A definition of footnote `label`: its number and id (`fn-N`), or no
    /// id when the label was already defined.
    pub(super) fn footnote_definition(&mut self, label: &str) -> (usize, Option<String>) {
        let number = self.footnote_number(label);
        let id = self.defined.insert(number).then(|| format!("fn-{number}"));
        (number, id)
    }

    /// Whether footnote `number` has been referenced so far.
    pub(super) fn is_referenced(&self, number: usize) -> bool {
        self.references.contains_key(&number)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_like_github() {
        let cases: &[(&str, &str)] = &[
            ("Usage", "usage"),
            ("Getting Started", "getting-started"),
            ("What's new?", "whats-new"),
            ("C++ & Rust: a guide!", "c--rust-a-guide"),
            ("snake_case and kebab-case", "snake_case-and-kebab-case"),
            ("  two  spaces ", "--two--spaces-"),
            ("Ünïcödé Straße", "ünïcödé-straße"),
            ("日本語 見出し", "日本語-見出し"),
            ("v1.2.3", "v123"),
            ("`code` (x)", "code-x"),
            ("!!!", ""),
        ];
        for (text, expected) in cases {
            assert_eq!(slug(text), *expected, "text {text:?}");
        }
    }

    #[test]
    fn repeated_and_empty_headings_get_unique_ids() {
        let mut ids = Ids::default();
        let got: Vec<String> = [
            "Intro", "Intro", "Intro 1", "Intro", "", "!", "A-1", "A", "A",
        ]
        .iter()
        .map(|t| ids.heading(t))
        .collect();
        assert_eq!(
            got,
            [
                "intro",
                "intro-1",
                "intro-1-1",
                "intro-2",
                "section",
                "section-1",
                "a-1",
                "a",
                "a-2"
            ]
        );
    }

    #[test]
    fn headings_never_take_footnote_ids() {
        let mut ids = Ids::default();
        let got: Vec<String> = ["fn 1", "fnref 1", "fn", "fn", "fnref-2-2", "fn-x"]
            .iter()
            .map(|t| ids.heading(t))
            .collect();
        assert_eq!(
            got,
            [
                "h-fn-1",
                "h-fnref-1",
                "h-fn",
                "h-fn-2",
                "h-fnref-2-2",
                "fn-x"
            ]
        );
    }

    #[test]
    fn footnotes_are_numbered_by_first_use() {
        let mut ids = Ids::default();
        assert_eq!(ids.footnote_reference("b"), (1, "fnref-1".to_owned()));
        assert_eq!(ids.footnote_reference("a"), (2, "fnref-2".to_owned()));
        assert_eq!(ids.footnote_reference("B"), (1, "fnref-1-2".to_owned()));
        assert!(ids.is_referenced(1));
        assert!(!ids.is_referenced(3));
        assert_eq!(ids.footnote_definition("c"), (3, Some("fn-3".to_owned())));
        assert_eq!(ids.footnote_definition("a"), (2, Some("fn-2".to_owned())));
        assert_eq!(ids.footnote_definition("A"), (2, None));
    }
}
