//! Element ids of a page: GitHub-style heading slugs and footnote ids, all
//! unique within the page (docs/contract.md §16.1).
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

use std::collections::HashMap;

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

/// What a slug has handed out so far.
#[derive(Default, Clone, Copy)]
struct Taken {
    /// The number of the last numbered id given for it (`slug-N`; 0: none).
    /// Every number up to it is in use: they were tried in order.
    last: usize,
    /// Whether the slug itself was given as an id.
    itself: bool,
}

/// The ids handed out so far in one page, and the footnote numbering.
///
/// Heading ids are remembered per distinct slug, not per id: an id is in
/// use when it is a slug given as it is, or `slug-N` with N up to the last
/// number that slug reached (see [`Taken`]). So a page of many headings
/// with the same text (or none) keeps one entry, however many ids it hands
/// out (docs/contract.md §12.3 bounds rendering memory by the input).
#[derive(Default)]
pub(super) struct Ids {
    slugs: HashMap<Box<str>, Taken>,
    /// Footnote number by lowercased label.
    footnotes: HashMap<String, usize>,
    /// References written so far, by footnote number.
    references: HashMap<usize, usize>,
}

/// `id` split into a slug and the number a repeat of it got (`intro-2`:
/// `intro`, 2), when it has that form: a `-` and a number from 1 without
/// leading zeros, as numbering writes them.
fn numbered_form(id: &str) -> Option<(&str, usize)> {
    let (slug, digits) = id.rsplit_once('-')?;
    if digits.starts_with('0') || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((slug, digits.parse().ok()?))
}

impl Ids {
    /// Whether a heading already has `id`.
    fn is_used(&self, id: &str) -> bool {
        if self.slugs.get(id).is_some_and(|t| t.itself) {
            return true;
        }
        numbered_form(id).is_some_and(|(slug, n)| self.slugs.get(slug).is_some_and(|t| t.last >= n))
    }

    /// A unique id for a heading with this text.
    pub(super) fn heading(&mut self, text: &str) -> String {
        let mut base = slug(text);
        if base.is_empty() {
            base.push_str("section");
        }
        if looks_like_footnote(&base) {
            base.insert_str(0, "h-");
        }
        // Numbers up to the last one taken for this slug are all in use, so
        // the search goes on from there: many headings with the same text
        // cost linear, not quadratic, time.
        let mut n = self.slugs.get(base.as_str()).map_or(0, |t| t.last);
        if n == 0 && !self.is_used(&base) {
            self.slugs.entry(base.as_str().into()).or_default().itself = true;
            return base;
        }
        let mut candidate;
        loop {
            n += 1;
            candidate = format!("{base}-{n}");
            if !self.is_used(&candidate) {
                break;
            }
        }
        self.slugs.entry(base.into_boxed_str()).or_default().last = n;
        candidate
    }

    /// The number of the footnote with this label, given on its first
    /// reference; `None` when it was never referenced.
    pub(super) fn footnote_number(&self, label: &str) -> Option<usize> {
        self.footnotes.get(&label.to_lowercase()).copied()
    }

    /// A reference to footnote `label`: its number (the next one on its
    /// first reference) and the reference's own id (`fnref-N`, then
    /// `fnref-N-2`, ...).
    pub(super) fn footnote_reference(&mut self, label: &str) -> (usize, String) {
        let next = self.footnotes.len() + 1;
        let number = *self.footnotes.entry(label.to_lowercase()).or_insert(next);
        let count = self.references.entry(number).or_insert(0);
        *count += 1;
        let id = if *count == 1 {
            format!("fnref-{number}")
        } else {
            format!("fnref-{number}-{count}")
        };
        (number, id)
    }

    /// How many references to footnote `number` there were.
    pub(super) fn references(&self, number: usize) -> usize {
        self.references.get(&number).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

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

    /// The rule as written: every id handed out is kept, and a repeat
    /// takes the first free `slug-N`.
    fn naive_ids(texts: &[&str]) -> Vec<String> {
        let mut used = HashSet::new();
        texts
            .iter()
            .map(|text| {
                let mut base = slug(text);
                if base.is_empty() {
                    base.push_str("section");
                }
                if looks_like_footnote(&base) {
                    base.insert_str(0, "h-");
                }
                let mut candidate = base.clone();
                let mut n = 0;
                while used.contains(&candidate) {
                    n += 1;
                    candidate = format!("{base}-{n}");
                }
                used.insert(candidate.clone());
                candidate
            })
            .collect()
    }

    #[test]
    fn ids_kept_per_slug_match_keeping_every_id() {
        // Texts whose slugs collide with each other's numbered forms.
        let alphabet = [
            "a",
            "A",
            "a 1",
            "a-1",
            "a 1 1",
            "a-2",
            "a 0",
            "a-01",
            "a-",
            "",
            "section 1",
            "fn 1",
            "h fn 1",
            "1",
            "-1",
            "a--1",
        ];
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        for round in 0..400 {
            let len = 1 + round % 40;
            let texts: Vec<&str> = (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    alphabet[(seed % alphabet.len() as u64) as usize]
                })
                .collect();
            let mut ids = Ids::default();
            let got: Vec<String> = texts.iter().map(|t| ids.heading(t)).collect();
            assert_eq!(got, naive_ids(&texts), "texts {texts:?}");
        }
    }

    #[test]
    fn many_equal_headings_keep_one_entry() {
        let mut ids = Ids::default();
        for _ in 0..1000 {
            ids.heading("");
        }
        assert_eq!(ids.heading(""), "section-1000");
        assert_eq!(ids.slugs.len(), 1);
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
        assert_eq!((ids.references(1), ids.references(2)), (2, 1));
        assert_eq!(ids.references(3), 0);
        assert_eq!(ids.footnote_number("A"), Some(2));
        // A note never referenced has no number: it is not shown.
        assert_eq!(ids.footnote_number("c"), None);
    }
}
