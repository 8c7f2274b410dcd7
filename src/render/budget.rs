//! What a parse may cost, known before it starts (docs/contract.md §12.3: rendering a
//! markdown file takes at most 32 × its size in memory).
//!
//! pulldown-cmark builds the tree of a whole document, every inline node
//! included, before its first event comes out; nothing stops it half-way.
//! So every parse the renderer makes (the main document of a round, each
//! piece, and the whole document when pieces did not hold) is weighed first
//! with [`weigh`]: an upper bound, in units, of what the parse can build,
//! read off the text in one pass without parsing it. A unit is one tree
//! node ([`UNIT_BYTES`]); what else the parser keeps per piece of syntax
//! (a link's destination and title, a code span's or entity's text, an
//! entry on its stack of open brackets or of emphasis runs that can open)
//! is charged as extra units to the byte that causes it.
//!
//! How the bound is reached (pulldown-cmark 0.13's first pass): each node
//! starts at a byte of the text that can start one, and only some bytes
//! can:
//!
//! - in a line's text, the bytes the parser treats as special (`*`, `_`,
//!   `~` runs that can open or close, `` ` `` runs, `\` before punctuation,
//!   `<`, `![`, `[`, `]`, `&` of an entity, `|` in a table), and the first
//!   byte of each stretch of text between them;
//! - per line, one node for the block it starts or for the soft or hard
//!   break that ends the line before it (a paragraph of n lines has one
//!   paragraph node and n - 1 breaks), one for a `\r\n` ending (a code or
//!   HTML line keeps it as a separate node), one for a tab in its indent
//!   or in the whitespace after its quote and list markers (a line ends
//!   where the parser ends it: at `\n`, `\r\n` or a lone `\r`), and one
//!   per blank line (a node inside an HTML comment or a code block);
//! - block quote markers (`>`) and list markers, two for a list marker
//!   (the item, and the list it may start), table rows and the cells the
//!   parser fills into short rows (at most 2^18 per table).
//!
//! Three refinements keep plain documents from being overcharged; each
//! only moves a charge to a line that surely paid for it:
//!
//! - a line of only `>` markers charges only those past the previous
//!   line's (a quote, once open, stays open while every line has as many
//!   markers; a line that is not such a line counts as none);
//! - a line of one list marker with the same marker and indent as the
//!   line before charges the item only (the list is that line's);
//! - a line of only `-` or `=` right after a plain text line that surely
//!   starts or goes on a top-level paragraph (after a blank line, the
//!   start, or such an underline) is a setext underline: no node.
//!
//! Nothing here decides what the page looks like; an estimate too high
//! refuses a document, one too low would break the bound. The unit tests
//! compare it with the events the parser gives on generated documents of
//! the parser's special characters.

use super::bytes::{byte_lines as lines, flanking, is_blank_byte};
use std::fmt;

/// Bytes one unit stands for: a tree node of pulldown-cmark 0.13
/// (`Node<Item>`: two indexes, the item's start and end, and its 16-byte
/// body). Measured: a 4 MiB paragraph of `a*` (one node per byte) peaks at
/// 51 times the input, 48 of which are the tree.
pub(super) const UNIT_BYTES: u64 = 48;

/// The root, and what the parser allocates for any document.
pub(super) const BASE_UNITS: u64 = 16;

/// What the parser can build from a text, in units, and the line (1-based,
/// in the text weighed) where the heaviest block starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Weight {
    pub units: u64,
    pub heaviest_line: usize,
}

impl Weight {
    pub(super) fn bytes(&self) -> u64 {
        self.units.saturating_mul(UNIT_BYTES)
    }
}

/// The lines of `bytes` as the parser ends them, at `\n`, `\r\n` or a lone
/// `\r`: (start, end without line ending, end with it).
fn parser_lines(bytes: &[u8]) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
    lines(bytes).flat_map(move |(start, content_end, end)| {
        let mut at = start;
        std::iter::from_fn(move || {
            if at > content_end || (at == content_end && at == end) {
                return None;
            }
            let from = at;
            match bytes[from..content_end].iter().position(|&b| b == b'\r') {
                Some(i) => {
                    at = from + i + 1;
                    Some((from, from + i, from + i + 1))
                }
                None => {
                    at = end;
                    Some((from, content_end, end))
                }
            }
        })
    })
}

/// The bound on what a parse of `text` can build (see the module comment).
pub(super) fn weigh(text: &str) -> Weight {
    let bytes = text.as_bytes();
    let tables = table_chunks(bytes);
    // The cells the parser fills into short rows, per table.
    let filled: u64 = tables.iter().map(|t| t.filled).sum();
    let mut tables = tables.iter().peekable();
    let mut units: u64 = BASE_UNITS;
    // The block (chunk between blank lines) being weighed, and the heaviest.
    let mut block = (1usize, 0u64);
    let mut heaviest = (1usize, 0u64);
    let mut state = LineState::default();
    let mut number = 0usize;
    for (start, content_end, end) in parser_lines(bytes) {
        number += 1;
        let line = &bytes[start..content_end];
        while tables.peek().is_some_and(|t| t.end <= start) {
            tables.next();
        }
        let table = tables.peek().is_some_and(|t| t.start <= start);
        let crlf = end >= content_end + 2;
        let blank = line.iter().all(|&b| is_blank_byte(b));
        let charge = if blank {
            state = LineState::after_blank();
            // Inside a block that blank lines do not end (an HTML comment,
            // `<pre>`, a fenced code block), each is a node of its own.
            1
        } else {
            state.weigh_line(line, crlf, table)
        };
        if blank {
            if block.1 > heaviest.1 {
                heaviest = block;
            }
            block = (number + 1, 0);
        } else {
            block.1 += charge;
        }
        units += charge;
    }
    if block.1 > heaviest.1 {
        heaviest = block;
    }
    units += filled;
    Weight {
        units,
        heaviest_line: heaviest.0,
    }
}

/// What the lines before tell about the next one.
#[derive(Debug, Clone, Copy)]
struct LineState {
    /// `>` markers of the previous line, when it had nothing else before
    /// its text (0 otherwise).
    quotes: usize,
    /// The previous line's single list marker and its indent.
    marker: Option<(u8, usize)>,
    /// The next line, when plain text, surely starts or continues a
    /// top-level paragraph (or is inside a top-level code or HTML block).
    top_paragraph: bool,
    /// The previous line was such a plain line.
    after_plain: bool,
}

impl Default for LineState {
    fn default() -> Self {
        LineState::after_blank()
    }
}

impl LineState {
    fn after_blank() -> Self {
        LineState {
            quotes: 0,
            marker: None,
            top_paragraph: true,
            after_plain: false,
        }
    }

    /// Units a non-blank line can add, updating what is known for the next.
    fn weigh_line(&mut self, line: &[u8], crlf: bool, table: bool) -> u64 {
        let mut units: u64 = 0;
        if crlf {
            units += 1;
        }
        let indent = line
            .iter()
            .take_while(|&&b| b == b' ' || b == b'\t')
            .count();
        if line[..indent].contains(&b'\t') {
            units += 1;
        }
        // A setext underline after a plain top-level line.
        let underline = self.after_plain
            && !crlf
            && !line.is_empty()
            && (line[0] == b'-' || line[0] == b'=')
            && {
                let run = line.iter().take_while(|&&b| b == line[0]).count();
                line[run..].iter().all(|&b| b == b' ')
            };
        if underline {
            *self = LineState::after_blank();
            return units;
        }
        // `>` markers, each after at most three spaces.
        let mut at = 0;
        let mut quotes = 0;
        let mut regular = true;
        loop {
            let spaces = line[at..].iter().take_while(|&&b| b == b' ').count();
            if line.get(at + spaces) == Some(&b'>') && spaces <= 3 {
                quotes += 1;
                at += spaces + 1;
            } else {
                if line.get(at + spaces) == Some(&b'\t') {
                    regular = false;
                }
                break;
            }
        }
        // Further containers: list markers, more quotes, charged in full.
        let mut markers = 0usize;
        let mut first_marker: Option<(u8, usize)> = None;
        let mut others = 0u64;
        loop {
            let spaces = line[at..]
                .iter()
                .take_while(|&&b| b == b' ' || b == b'\t')
                .count();
            let here = at + spaces;
            let rest = &line[here..];
            if rest.first() == Some(&b'>') {
                others += 1;
                at = here + 1;
                regular = false;
                continue;
            }
            if is_thematic_break(rest) {
                break;
            }
            match list_marker(rest) {
                Some((ch, len)) => {
                    markers += 1;
                    if markers == 1 {
                        first_marker = Some((ch, here));
                    }
                    at = here + len;
                }
                None => break,
            }
        }
        let plain_quotes = quotes > 0 && markers == 0 && regular;
        units += if plain_quotes {
            (quotes - self.quotes.min(quotes)) as u64
        } else {
            quotes as u64
        };
        // A `>` after an irregular indent may be an indented code block's
        // text (the block and its text) rather than a quote.
        units += others + u64::from(others > 0);
        // Two per list marker (item and list), but the first marker of a
        // line only one when the line before had the same single marker.
        units += 2 * markers as u64;
        let single = (markers == 1 && quotes == 0 && others == 0).then_some(first_marker);
        if let Some(Some(marker)) = single
            && self.marker == Some(marker)
        {
            units -= 1;
        }
        let rest_start = at
            + line[at..]
                .iter()
                .take_while(|&&b| b == b' ' || b == b'\t')
                .count();
        // A tab in the whitespace after the containers' markers is split
        // off as a node of its own (an indented code block's leading
        // spaces), as a tab in the line's indent is.
        if (markers > 0 || quotes > 0 || others > 0) && line[at..rest_start].contains(&b'\t') {
            units += 1;
        }
        let rest = &line[rest_start..];
        let plain = quotes == 0
            && markers == 0
            && others == 0
            && indent == 0
            && !table
            && starts_plain(rest)
            && !rest.contains(&b'|');
        if !rest.is_empty() {
            // The block the line starts, or the break ending the line before.
            units += 1;
            if is_thematic_break(rest) {
                // A rule: no text.
            } else {
                let hashes = rest.iter().take_while(|&&b| b == b'#').count();
                let text = if (1..=6).contains(&hashes)
                    && matches!(rest.get(hashes), None | Some(b' ' | b'\t'))
                {
                    &rest[hashes..]
                } else {
                    rest
                };
                let mut openers = 0;
                units += inline_units(text, table, &mut openers);
                units += (openers * 2).div_ceil(3);
                if table {
                    // The row's first cell; each `|` charged one for the
                    // cell after it, none after a trailing one.
                    let end = text.iter().rposition(|&b| !is_blank_byte(b));
                    let trailing =
                        end.is_some_and(|e| text[e] == b'|' && (e == 0 || text[e - 1] != b'\\'));
                    units += 1;
                    units -= u64::from(text.first() == Some(&b'|')).min(units);
                    units -= u64::from(trailing).min(units);
                }
            }
        }
        let top_paragraph = self.top_paragraph;
        *self = LineState {
            quotes: if plain_quotes { quotes } else { 0 },
            marker: single.flatten(),
            top_paragraph: plain && top_paragraph,
            // A trailing backslash before an underline is text of its own.
            after_plain: plain && top_paragraph && line.last() != Some(&b'\\'),
        };
        units
    }
}

/// Whether `rest` starts like paragraph text that starts no other block
/// and is no link reference definition.
fn starts_plain(rest: &[u8]) -> bool {
    match rest.first() {
        Some(b) if b.is_ascii_alphabetic() || *b >= 0x80 => true,
        Some(b) if b.is_ascii_digit() => {
            let after = rest.iter().find(|c| !c.is_ascii_digit());
            !matches!(after, Some(b'.' | b')'))
        }
        Some(b'.' | b',' | b';' | b'?' | b'\'' | b'"' | b'(' | b')' | b'%' | b'@' | b'/') => true,
        _ => false,
    }
}

/// Whether a line's text (after containers) is a thematic break.
fn is_thematic_break(rest: &[u8]) -> bool {
    let Some(&c) = rest.first() else {
        return false;
    };
    if !matches!(c, b'-' | b'*' | b'_') {
        return false;
    }
    let mut count = 0;
    for &b in rest {
        if b == c {
            count += 1;
        } else if b != b' ' && b != b'\t' {
            return false;
        }
    }
    count >= 3
}

/// A list marker at the start of `rest` followed by a blank or the line's
/// end: its character (`.` or `)` for ordered ones) and length.
fn list_marker(rest: &[u8]) -> Option<(u8, usize)> {
    let (ch, len) = match rest.first()? {
        c @ (b'-' | b'+' | b'*') => (*c, 1),
        b'0'..=b'9' => {
            let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
            match rest.get(digits) {
                Some(c @ (b'.' | b')')) if digits <= 9 => (*c, digits + 1),
                _ => return None,
            }
        }
        _ => return None,
    };
    match rest.get(len) {
        None | Some(b' ' | b'\t') => Some((ch, len)),
        _ => None,
    }
}

/// Units of the inline nodes of a line's text (see the module comment).
fn inline_units(text: &[u8], table: bool, openers: &mut u64) -> u64 {
    let mut units = 0u64;
    let mut pending = false;
    let flush = |units: &mut u64, pending: &mut bool| {
        if std::mem::replace(pending, false) {
            *units += 1;
        }
    };
    let mut at = 0;
    while at < text.len() {
        let b = text[at];
        match b {
            b'\\' if text.get(at + 1).is_some_and(u8::is_ascii_punctuation) => {
                flush(&mut units, &mut pending);
                if text[at + 1] == b'`' {
                    // An escaped backtick run is a code delimiter node.
                    let run = text[at + 1..].iter().take_while(|&&c| c == b'`').count();
                    units += 2;
                    at += 1 + run;
                } else {
                    // The escaped byte starts a text node.
                    pending = true;
                    at += 2;
                }
            }
            b'*' | b'_' | b'~' => {
                let run = text[at..].iter().take_while(|&&c| c == b).count();
                let before = at.checked_sub(1).map(|i| text[i]);
                let after = text.get(at + run).copied();
                let (open, close) = if table && (before == Some(b'|') || after == Some(b'|')) {
                    (true, true)
                } else {
                    flanking(b, run, before, after)
                };
                if (open || close) && (b != b'~' || run <= 2) {
                    flush(&mut units, &mut pending);
                    // A node per character; a run that can open may wait
                    // on the parser's stack (32 bytes, two thirds of a unit).
                    units += run as u64;
                    *openers += u64::from(open);
                } else {
                    pending = true;
                }
                at += run;
            }
            b'`' => {
                let run = text[at..].iter().take_while(|&&c| c == b'`').count();
                flush(&mut units, &mut pending);
                // The delimiter node, and the code span's text.
                units += 2;
                at += run;
            }
            b'<' => {
                flush(&mut units, &mut pending);
                units += 1;
                if may_be_autolink(&text[at + 1..]) {
                    // The autolink's link and text.
                    units += 3;
                }
                at += 1;
            }
            b'!' if text.get(at + 1) == Some(&b'[') => {
                flush(&mut units, &mut pending);
                units += 2;
                at += 2;
            }
            b'[' => {
                flush(&mut units, &mut pending);
                // The node and its place on the bracket stack.
                units += 2;
                at += 1;
            }
            b']' => {
                flush(&mut units, &mut pending);
                // The node, and the link it may close (type, destination,
                // title, label).
                units += 3;
                at += 1;
            }
            b'&' if text
                .get(at + 1)
                .is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'#') =>
            {
                flush(&mut units, &mut pending);
                // The entity's node and its text.
                units += 2;
                at += 1;
            }
            b'|' if table && (at == 0 || text[at - 1] != b'\\') => {
                flush(&mut units, &mut pending);
                units += 1;
                at += 1;
            }
            b'\r' => {
                // A lone carriage return ends a line: its break.
                flush(&mut units, &mut pending);
                units += 2;
                at += 1;
            }
            _ => {
                pending = true;
                at += 1;
            }
        }
    }
    flush(&mut units, &mut pending);
    units
}

/// Whether an autolink may start after a `<`: a scheme and `:`, or an
/// email address's `@`, before the next `>`, space or `<`.
fn may_be_autolink(after: &[u8]) -> bool {
    after
        .iter()
        .take(320)
        .take_while(|&&b| !matches!(b, b'>' | b'<' | b' ' | b'\t' | b'\n' | b'\r'))
        .any(|&b| b == b':' || b == b'@')
}

/// A run of lines between blank lines holding a line that could be a
/// table's delimiter row: only there can table rows be (a blank line ends
/// any table).
#[derive(Debug)]
struct TableChunk {
    start: usize,
    end: usize,
    /// At most this many cells the parser fills into its rows.
    filled: u64,
}

/// The parser stops a table once it has filled this many missing cells
/// (pulldown-cmark's `MAX_AUTOCOMPLETED_CELLS`).
const MOST_FILLED_CELLS: u64 = 1 << 18;

fn table_chunks(bytes: &[u8]) -> Vec<TableChunk> {
    // Chunks first, without keeping anything per line (a file of short
    // lines would need as much again as its tree): start, delimiter-like
    // lines, most columns, whether some line holds a `|`.
    let mut found: Vec<(usize, usize, u64, usize)> = Vec::new();
    let mut chunk: Option<(usize, u64, usize, bool)> = None;
    let mut close = |chunk: Option<(usize, u64, usize, bool)>, end: usize| {
        if let Some((start, delimiters, columns, pipes)) = chunk
            && delimiters > 0
            && pipes
        {
            found.push((start, end, delimiters, columns));
        }
    };
    for (start, content_end, _) in lines(bytes) {
        let line = &bytes[start..content_end];
        if line.iter().all(|&b| is_blank_byte(b)) {
            close(chunk.take(), start);
            continue;
        }
        let (first, mut delimiters, mut columns, mut pipes) = chunk.unwrap_or((start, 0, 0, false));
        pipes |= line.contains(&b'|');
        if looks_like_delimiter(line) {
            delimiters += 1;
            let segments = line
                .split(|&b| b == b'|')
                .filter(|s| !s.iter().all(|&b| is_blank_byte(b)))
                .count();
            columns = columns.max(segments);
        }
        chunk = Some((first, delimiters, columns, pipes));
    }
    close(chunk, bytes.len());
    // Then the cells filled into the rows of each.
    found
        .into_iter()
        .map(|(start, end, delimiters, columns)| {
            let filled: u64 = lines(&bytes[start..end])
                .map(|(s, e, _)| {
                    columns.saturating_sub(fewest_cells(&bytes[start + s..start + e])) as u64
                })
                .sum();
            TableChunk {
                start,
                end,
                filled: filled.min(MOST_FILLED_CELLS.saturating_mul(delimiters)),
            }
        })
        .collect()
}

/// At least this many cells are in a row line: the parser splits it at
/// every `|` not right after a `\`, a leading and a trailing one aside.
fn fewest_cells(line: &[u8]) -> usize {
    let pipes = (0..line.len())
        .filter(|&i| line[i] == b'|' && (i == 0 || line[i - 1] != b'\\'))
        .count();
    (pipes + 1).saturating_sub(2).max(1)
}

/// Whether a line could be a table's delimiter row; loose on purpose.
fn looks_like_delimiter(line: &[u8]) -> bool {
    line.contains(&b'-')
        && line
            .iter()
            .all(|&b| matches!(b, b'|' | b'-' | b':' | b'>') || is_blank_byte(b))
}

/// A document, or the main document of a round, too dense to parse within
/// its budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooDense {
    /// Line of the markdown file where the heaviest paragraph or block starts.
    pub line: usize,
    /// Bytes the parse could take.
    pub needed: u64,
    /// Bytes it may take.
    pub allowed: u64,
}

impl fmt::Display for TooDense {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "is too dense with inline markup to render to HTML within 32 times its size in memory \
             (parsing it could take {} MiB, at most {} MiB allowed); the paragraph or block \
             starting at line {} is the densest: break it into smaller paragraphs, or publish \
             the file as a copy (publish.html off for this destination)",
            self.needed.div_ceil(1 << 20),
            self.allowed >> 20,
            self.line
        )
    }
}
