//! Rendering a big document in pieces, so that memory follows the largest
//! piece and not the document (docs/contract.md §12.3).
//!
//! pulldown-cmark builds the tree of the whole document, inline nodes
//! included (about 50 bytes each), before the first event comes out. Text
//! made of tiny cells (`|1|2|3|`) or tiny emphasis (`*a* _b_`) has about one
//! node per byte, so the tree alone is ~50 x the input. Two kinds of pieces
//! are taken out of the document and parsed on their own:
//!
//! - **Rows**: body rows of a top-level table, from a run of lines that
//!   start with `|` (rows holding a footnote reference stay, a piece cannot
//!   know which footnotes are defined). The main document keeps one row
//!   holding a token in their place; the cut rows are parsed in batches, each
//!   as a little table with the same header and delimiter row, and their row
//!   events take the token row's place.
//! - **Words**: a stretch of a paragraph between spaces or line ends, without
//!   `<`, `>`, `\`, `|`, `[^` or `]:`, whose lines start like paragraph text,
//!   whose runs of `*`, `_` and `~` can each only open, only close or
//!   neither, and that alone is one paragraph with nothing left unmatched
//!   (no `` ` ``, `[`, `]` as text, and as text only those `*`, `_` and `~`
//!   that can neither open nor close). The main document holds a token in its
//!   place; the stretch's inline events take the token's place, provided
//!   nothing before it in the paragraph was left unmatched either.
//!
//! Nothing here is trusted blindly: the main document is parsed as usual and
//! every token must come out where its piece is known to mean the same
//! thing (a rows token as a body row of a top-level table whose
//! header and delimiter rows are the recorded ones; a words token in the
//! text of a paragraph, outside links). A token anywhere else, or not at all,
//! fails its piece, and the caller renders again without the failed pieces;
//! without pieces the document is parsed whole, as before. Reference links in
//! pieces are resolved against the main document's definitions (pieces never
//! hold definitions).

use std::cell::Cell;
use std::collections::VecDeque;
use std::ops::Range;

use super::budget;
use super::bytes::{byte_lines, flanking, is_blank_byte};
use pulldown_cmark::{
    BrokenLink, CowStr, Event, LinkType, OffsetIter, Options, Parser, RefDefs, Tag, TagEnd,
};

/// Sizes that decide when and how a document is cut.
#[derive(Debug, Clone, Copy)]
pub(super) struct Settings {
    /// Documents smaller than this are parsed whole.
    pub min_document: usize,
    /// Table rows are cut only when there are at least this many bytes of them.
    pub min_rows: usize,
    /// Bytes of rows parsed together.
    pub batch: usize,
    /// A stretch of words is cut only when it is at least this long.
    pub min_words: usize,
    /// A stretch of words is at most this long.
    pub max_words: usize,
}

impl Settings {
    /// Cuts only for documents of 64 KiB or more, into pieces of at most
    /// 16 KiB: the tree of one piece stays under 1 MiB.
    pub(super) const DEFAULT: Settings = Settings {
        min_document: 64 << 10,
        min_rows: 4 << 10,
        batch: 16 << 10,
        min_words: 1 << 10,
        max_words: 16 << 10,
    };
}

/// Rounds of rendering in pieces before a document is parsed whole. Each
/// round parses the whole document (in pieces), so this bounds the time a
/// document can take; pieces only ever fail for a chain of as many kinds of
/// blocks as a piece put back can end (see [`find_sections`]).
pub(super) const MOST_ROUNDS: usize = 16;

/// One piece cut out of the document.
#[derive(Debug, Clone)]
pub(super) struct Cut {
    /// Bytes of the document the piece replaces.
    source: Range<usize>,
    kind: Kind,
}

#[derive(Debug, Clone)]
enum Kind {
    /// Table body rows; `header` and `delimiter` are the table's lines
    /// (without line ending) in the document.
    Rows {
        header: Range<usize>,
        delimiter: Range<usize>,
        /// Cells of the delimiter row.
        columns: usize,
        /// At most this many cells the parser adds to the cut rows to fill
        /// them up to `columns`.
        filled: usize,
    },
    /// Whole top-level blocks, from an ATX heading line to another.
    Section,
    /// One-line items of a top-level tight bullet list, all with `marker`.
    Items,
    /// A stretch of paragraph text, with its runs of `*`, `_` and `~`;
    /// `quoted` when its lines start with `> ` (but the first, which starts
    /// inside a line that does).
    Words { runs: Runs, quoted: bool },
}

/// The pieces to cut in one round of rendering, and stretches of words
/// set aside for a later round.
#[derive(Debug, Default)]
pub(super) struct Cuts {
    /// In document order; none overlap.
    active: Vec<Cut>,
    /// Stretches that overlap an active cut and may be used once the
    /// pieces they overlap have failed: those past a table's end (see
    /// [`rows_of_run`]).
    shelved: Vec<Cut>,
}

impl Cuts {
    pub(super) fn is_empty(&self) -> bool {
        self.active.is_empty()
    }
}

/// The bytes a cut keeps from other cuts: a table's rows cut also keeps
/// its header line.
fn taken_by(cut: &Cut) -> Range<usize> {
    match &cut.kind {
        Kind::Rows { header, .. } => header.start..cut.source.end,
        _ => cut.source.clone(),
    }
}

fn overlaps(taken: &[Range<usize>], range: &Range<usize>) -> bool {
    taken
        .iter()
        .any(|t| range.start < t.end && t.start < range.end)
}

/// Finds the pieces worth cutting, in document order.
pub(super) fn find_cuts(markdown: &str, settings: &Settings) -> Cuts {
    if markdown.len() < settings.min_document {
        return Cuts::default();
    }
    let mut cuts = find_sections(markdown, settings);
    let sections: Vec<Range<usize>> = cuts.iter().map(|cut| cut.source.clone()).collect();
    let (rows, past_tables) = find_rows(markdown, settings);
    let rows = rows.into_iter().filter(|cut| {
        // The header line stays as it is too.
        let Kind::Rows { header, .. } = &cut.kind else {
            return false;
        };
        !overlaps(&sections, &(header.start..cut.source.end))
    });
    cuts.extend(rows);
    let taken: Vec<Range<usize>> = cuts.iter().map(|cut| cut.source.clone()).collect();
    let items = find_items(markdown, settings)
        .into_iter()
        .filter(|cut| !overlaps(&taken, &cut.source));
    cuts.extend(items);
    let taken: Vec<Range<usize>> = cuts.iter().map(taken_by).collect();
    let tables = table_chunks(markdown);
    let mut shelved = Vec::new();
    for cut in find_words(markdown, settings) {
        let text = &markdown[cut.source.clone()];
        // Where a table may be, a `|` may be a cell's edge.
        let plain = !text.contains('|') || !overlaps(&tables, &cut.source);
        if !overlaps(&taken, &cut.source) {
            if plain {
                cuts.push(cut);
            }
        } else if matches!(cut.kind, Kind::Words { quoted: false, .. })
            && past_tables
                .iter()
                .any(|r| r.start <= cut.source.start && cut.source.end <= r.end)
        {
            shelved.push(cut);
        }
    }
    cuts.sort_by_key(|cut| cut.source.start);
    Cuts {
        active: cuts,
        shelved,
    }
}

/// The chunks of lines (between blank lines) holding a line that could be
/// a table's delimiter row, also inside block quotes and list items: only
/// there can a table be (a blank line ends any table).
fn table_chunks(markdown: &str) -> Vec<Range<usize>> {
    let mut chunks = Vec::new();
    let mut chunk: Option<usize> = None;
    let mut has_delimiter = false;
    for (start, end, next) in lines(markdown) {
        let line = &markdown[start..end];
        if line.bytes().all(is_blank_byte) {
            if let Some(from) = chunk.take()
                && has_delimiter
            {
                chunks.push(from..start);
            }
            has_delimiter = false;
            continue;
        }
        chunk.get_or_insert(start);
        // A lone `\r` ends a line for the parser too.
        has_delimiter |= line
            .split('\r')
            .any(|part| looks_like_delimiter(part.trim_start_matches([' ', '\t', '>'])));
        if next == markdown.len()
            && let Some(from) = chunk.take()
            && has_delimiter
        {
            chunks.push(from..next);
        }
    }
    chunks
}

/// The lines of `text` as (start, end without line ending, end with it).
/// Only `\n` (or `\r\n`) ends a line here; a lone `\r`, which ends one for
/// the parser, is left inside: the finders treat it where it matters.
fn lines(text: &str) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
    byte_lines(text.as_bytes())
}

/// Whether a line could be a table's delimiter row (`|---|:-:|`); loose on
/// purpose, the parse of the main document decides.
fn looks_like_delimiter(line: &str) -> bool {
    line.contains('-')
        && line
            .bytes()
            .all(|b| matches!(b, b'|' | b'-' | b':') || is_blank_byte(b))
}

/// Whether a line is an ATX heading line at the first column (`# x`).
fn is_atx_heading(line: &str) -> bool {
    let hashes = line.bytes().take_while(|&b| b == b'#').count();
    (1..=6).contains(&hashes) && matches!(line.as_bytes().get(hashes), None | Some(b' ' | b'\t'))
}

/// Sections of whole top-level blocks: from an ATX heading line at the
/// first column to another, at most `batch` bytes. Such a line always starts
/// a top-level heading, closing whatever came before (unless it is inside a
/// fenced code or HTML block: the main document's parse tells), and ends
/// it. Sections hold no footnote (`[^`) and no link reference definition
/// (`]:`), which the rest of the document needs to see, and no line that
/// could open a fenced code or HTML block ([`opens_raw_block`]).
fn find_sections(markdown: &str, settings: &Settings) -> Vec<Cut> {
    let mut cuts = Vec::new();
    // Start of the open section, end (with line ending) of its last heading.
    let mut open: Option<(usize, usize)> = None;
    let close = |open: Option<(usize, usize)>, cuts: &mut Vec<Cut>| {
        if let Some((start, end)) = open
            && end - start >= settings.min_rows
        {
            cuts.push(Cut {
                source: start..end,
                kind: Kind::Section,
            });
        }
    };
    for (start, content_end, end) in lines(markdown) {
        let line = &markdown[start..content_end];
        if line.contains("[^") || line.contains("]:") || opens_raw_block(line) {
            close(open.take(), &mut cuts);
            continue;
        }
        if !is_atx_heading(line) {
            continue;
        }
        match open {
            Some((first, _)) if end - first <= settings.batch => open = Some((first, end)),
            _ => {
                close(open.take(), &mut cuts);
                open = Some((start, end));
            }
        }
    }
    close(open, &mut cuts);
    cuts
}

/// Whether a line could start a fenced code block or an HTML block at the
/// top level: such a block may go on past the section's last heading when the
/// section is put back into a main document whose block state differs from
/// the section's alone (after an earlier block it ends), and swallow the
/// place of the next piece. Sections hold none, so a section put back never
/// opens a block that swallows anything after it.
fn opens_raw_block(line: &str) -> bool {
    let text = line.trim_start_matches(' ');
    line.len() - text.len() <= 3
        && (text.starts_with('<') || text.starts_with("```") || text.starts_with("~~~"))
}

/// Items of a bullet list: runs of lines that start with the same marker
/// (`- `, `* ` or `+ `) and hold more than a thematic break, but no `[^` or
/// `]:`; the first item of a run stays.
fn find_items(markdown: &str, settings: &Settings) -> Vec<Cut> {
    let mut cuts = Vec::new();
    let mut run: Option<(u8, usize, usize)> = None; // marker, start, end
    let close = |run: Option<(u8, usize, usize)>, cuts: &mut Vec<Cut>| {
        if let Some((_, start, end)) = run
            && end - start >= settings.min_rows
        {
            cuts.push(Cut {
                source: start..end,
                kind: Kind::Items,
            });
        }
    };
    for (start, content_end, end) in lines(markdown) {
        let line = &markdown.as_bytes()[start..content_end];
        // Footnotes and link reference definitions must stay in the main
        // document, where the rest of it sees them.
        let global = line.windows(2).any(|w| w == b"[^" || w == b"]:");
        // Raw HTML and fenced code blocks go on through a blank line after
        // the item, which a batch does not have.
        let content = line.get(1..).unwrap_or_default().trim_ascii_start();
        let raw =
            content.starts_with(b"<") || content.starts_with(b"```") || content.starts_with(b"~~~");
        let marker = match line {
            [b'-' | b'*' | b'+', b' ', ..]
                if !global
                    && !raw
                    && line
                        .iter()
                        .any(|&b| !matches!(b, b' ' | b'\t') && b != line[0]) =>
            {
                Some(line[0])
            }
            _ => None,
        };
        match (marker, run) {
            (Some(m), Some((r, first, _))) if m == r => run = Some((r, first, end)),
            (Some(m), None) => {
                // The first item stays; the run starts after it.
                run = Some((m, end, end));
            }
            (Some(m), Some(_)) => {
                close(run.take(), &mut cuts);
                run = Some((m, end, end));
            }
            (None, _) => close(run.take(), &mut cuts),
        }
    }
    close(run, &mut cuts);
    cuts
}

/// Runs of lines starting with `|` that hold the body rows of a table; and
/// the lines of such runs past the row where the parser surely ended the
/// table (see [`rows_of_run`]).
fn find_rows(markdown: &str, settings: &Settings) -> (Vec<Cut>, Vec<Range<usize>>) {
    let mut cuts = Vec::new();
    let mut past = Vec::new();
    // The lines of the current run, and the line before it.
    let mut run: Vec<(usize, usize, usize)> = Vec::new();
    let mut before_run = None;
    let mut previous = None;
    let end = markdown.len();
    for line in lines(markdown).chain(std::iter::once((end, end, end))) {
        // A line of a lone `|` has no cell: it ends a table. A lone `\r`
        // ends a line for the parser: each part must be a row.
        let row = line.0 < end
            && markdown[line.0..line.1]
                .split('\r')
                .all(|part| part.starts_with('|') && !part[1..].bytes().all(is_blank_byte));
        if row {
            if run.is_empty() {
                before_run = previous;
            }
            run.push(line);
        } else if !run.is_empty() {
            rows_of_run(markdown, before_run, &run, settings, &mut cuts, &mut past);
            run.clear();
        }
        previous = Some(line);
    }
    (cuts, past)
}

/// The cuts of one run of lines starting with `|`.
///
/// Also, into `past`, the lines of the run from the first row that the
/// parser surely does not take: it stops a table at the row that would
/// take its filled cells past [`MOST_FILLED_CELLS`], and counting at most
/// as many cells per row as it finds (escapes only join cells) fills at
/// least as many. From that row on, the lines are a paragraph, whose
/// stretches can be cut once the table is parsed whole: in the main
/// document the table then ends where it does in the whole one.
fn rows_of_run(
    markdown: &str,
    before_run: Option<(usize, usize, usize)>,
    run: &[(usize, usize, usize)],
    settings: &Settings,
    cuts: &mut Vec<Cut>,
    past: &mut Vec<Range<usize>>,
) {
    let text = |(start, end, _): (usize, usize, usize)| &markdown[start..end];
    // The delimiter row among the first lines of the run; the header is the
    // line before it.
    let Some(delimiter) = (0..run.len().min(3)).find(|&l| looks_like_delimiter(text(run[l])))
    else {
        return;
    };
    let header = match delimiter {
        0 => match before_run {
            Some(line) if !text(line).trim().is_empty() => line,
            _ => return,
        },
        d => run[d - 1],
    };
    let delimiter_line = run[delimiter];
    // Every batch repeats the header and delimiter rows: a table with
    // enormous ones is parsed whole.
    if text(header).len() + text(delimiter_line).len() > MOST_HEAD_BYTES {
        return;
    }
    let columns = cells(text(delimiter_line));
    let mut fewest_filled = 0usize;
    for &line in &run[delimiter + 1..] {
        // Each part between lone `\r`s is a row of its own.
        fewest_filled += text(line)
            .split('\r')
            .map(|row| columns.saturating_sub(cells(row)))
            .sum::<usize>();
        if fewest_filled > MOST_FILLED_CELLS {
            past.push(line.0..run[run.len() - 1].2);
            break;
        }
    }
    // Rows with a footnote reference stay: a piece does not know which
    // footnotes are defined.
    let mut l = delimiter + 1;
    while l < run.len() {
        if text(run[l]).contains("[^") {
            l += 1;
            continue;
        }
        let from = l;
        while l < run.len() && !text(run[l]).contains("[^") {
            l += 1;
        }
        let source = run[from].0..run[l - 1].2;
        if source.len() < settings.min_rows {
            continue;
        }
        let filled = run[from..l]
            .iter()
            .map(|&line| {
                text(line)
                    .split('\r')
                    .map(|row| columns.saturating_sub(fewest_cells(row)))
                    .sum::<usize>()
            })
            .sum();
        cuts.push(Cut {
            source,
            kind: Kind::Rows {
                header: header.0..header.1,
                delimiter: delimiter_line.0..delimiter_line.1,
                columns,
                filled,
            },
        });
    }
}

/// Where each cell of a table line without code spans, escapes, links or
/// raw HTML starts (after its leading pipe and blanks), split the way the
/// parser splits them.
fn cell_starts(line: &str) -> impl Iterator<Item = usize> + '_ {
    let bytes = line.as_bytes();
    let mut at = 0;
    std::iter::from_fn(move || {
        if bytes.get(at) == Some(&b'|') {
            at += 1;
        }
        while bytes.get(at).copied().is_some_and(is_blank_byte) {
            at += 1;
        }
        if at >= bytes.len() {
            return None;
        }
        let start = at;
        while at < bytes.len() && bytes[at] != b'|' {
            at += 1;
        }
        Some(start)
    })
}

/// The cells of a table line, counted the way the parser splits them.
fn cells(line: &str) -> usize {
    cell_starts(line).count()
}

/// Where the cells past the first `columns` start in a row line with more
/// cells (the parser drops them), for a line simple enough to split
/// exactly; `None` to keep the whole line. The pipe before that cell ends
/// the row as the parser keeps it.
fn kept_cells_end(line: &str, columns: usize) -> Option<usize> {
    if line.contains(['`', '\\', '<', '[', '$', '\r']) {
        return None;
    }
    cell_starts(line).nth(columns)
}

/// At least this many cells are in a row line starting with `|` that has
/// more than the `|`. The parser splits a row at every `|`, also inside
/// code spans, links and raw HTML, except an escaped one (`\|`), so each
/// `\|` may join two of the cells counted without it.
fn fewest_cells(line: &str) -> usize {
    cells(line)
        .saturating_sub(line.matches("\\|").count())
        .max(1)
}

/// A table whose header and delimiter rows are longer than this together
/// is not cut into batches (each batch repeats them).
const MOST_HEAD_BYTES: usize = 16 << 10;

/// The parser stops a table once it has filled this many missing cells
/// (pulldown-cmark's `MAX_AUTOCOMPLETED_CELLS`).
const MOST_FILLED_CELLS: usize = 1 << 18;

/// Bytes a stretch of words never holds: a backslash escapes what follows
/// it (the stretch's first byte too), and a lone carriage return ends a line
/// for the parser. (A `|` is kept out where a table may be by
/// [`find_cuts`]; raw HTML and autolinks must be complete in the stretch,
/// see [`Splicer::splice_words`].)
fn unsafe_in_words(b: u8) -> bool {
    matches!(b, b'\\' | b'\r')
}

/// Whether `bytes[at..]` starts like paragraph text that starts no other
/// block, even at the start of a line: a letter (any non-ASCII character
/// too), digits not followed by `.` or `)` (no list item), punctuation
/// that starts no block (`.`, `,`, `;`, `?`, `!`, quotes, parentheses,
/// `%`, `&`, `@`, `/`, `$`, `^`, braces), `*` or `_` right before a letter
/// or digit, `[` (stretches never hold `]:`, so it is no definition), or
/// fewer than three backticks or tildes. Whatever a stretch holds must
/// still parse, alone, as one paragraph of inline text (checked when it is
/// spliced), so this only has to rule out lines that could start a block.
fn starts_plain(bytes: &[u8], at: usize) -> bool {
    let next = bytes.get(at + 1).copied();
    match bytes.get(at) {
        Some(b) if b.is_ascii_alphabetic() || *b >= 0x80 => true,
        Some(b) if b.is_ascii_digit() => {
            let after = bytes[at..].iter().find(|c| !c.is_ascii_digit());
            !matches!(after, Some(b'.' | b')'))
        }
        Some(
            b'.' | b',' | b';' | b'?' | b'!' | b'\'' | b'"' | b'(' | b')' | b'%' | b'&' | b'@'
            | b'/' | b'$' | b'^' | b'{' | b'}',
        ) => true,
        Some(b'*' | b'_') => next.is_some_and(|n| n.is_ascii_alphanumeric()),
        Some(b'[') => next.is_some(),
        // A table's edge: plain where no table may be (see [`find_cuts`]),
        // but never its delimiter row.
        Some(b'|') => {
            let line = bytes[at..]
                .split(|&c| c == b'\n' || c == b'\r')
                .next()
                .unwrap_or(&[]);
            !looks_like_delimiter(std::str::from_utf8(line).unwrap_or("-"))
        }
        Some(b'`') => !bytes[at..].starts_with(b"```"),
        Some(b'~') => !bytes[at..].starts_with(b"~~~"),
        _ => false,
    }
}

/// Stretches of paragraph text, cut at spaces and line ends (see the module
/// comment).
fn find_words(markdown: &str, settings: &Settings) -> Vec<Cut> {
    let bytes = markdown.as_bytes();
    let mut cuts = Vec::new();
    let mut start: Option<usize> = None;
    let mut end: Option<usize> = None;
    // A non-blank byte came before, on the current line.
    let mut line_content = false;
    // The current line starts with `> `, and so did the open stretch's
    // first line: its other lines must too (a blockquote's paragraph).
    let mut line_quoted = markdown.starts_with("> ");
    // The current line may open a fenced code block: no stretch starts on
    // it. Cut there, the tail of a later line would join it in the main
    // document, and a backtick in that tail makes it no fence.
    let mut line_fence = may_open_fence(bytes);
    let mut quoted = false;
    // The `> ` starting a line inside the open stretch, up to here.
    let mut prefix_end = 0;
    // The last line looked at by `next_line_looks_like_delimiter`: from
    // where, its end, and the answer (a long line holds many stretches).
    let looked_at: Cell<(usize, usize, bool)> = Cell::new((0, 0, false));
    let next_line_delimiter = |at: usize| {
        let (from, line_end, answer) = looked_at.get();
        if from <= at && at < line_end {
            return answer;
        }
        let line_end = markdown[at..]
            .find(['\n', '\r'])
            .map_or(markdown.len(), |i| at + i);
        let answer = next_line_looks_like_delimiter(markdown, at);
        looked_at.set((at, line_end, answer));
        answer
    };
    let close = |start: usize, end: Option<usize>, quoted: bool, cuts: &mut Vec<Cut>| {
        let Some(end) = end else { return };
        // A footnote reference needs its definition, which the piece is
        // given when its label is plain; `]:` could make a stretch, alone, a
        // link reference definition.
        let text = &markdown[start..end];
        if end - start < settings.min_words
            || footnote_labels(text).is_none()
            || text.contains("]:")
            || next_line_delimiter(end)
        {
            return;
        }
        let Some(runs) = one_sided_runs(bytes, start..end) else {
            return;
        };
        cuts.push(Cut {
            source: start..end,
            kind: Kind::Words { runs, quoted },
        });
    };
    for (at, &b) in bytes.iter().enumerate() {
        // Between two tags (`<a><b>`): a stretch may end or start there.
        let junction = b == b'<' && at > 0 && bytes[at - 1] == b'>' && line_content;
        if let Some(s) = start {
            // A stretch ends before a space or a line end (not in a line's
            // `> `), or between two tags.
            let boundary = at >= prefix_end
                && ((matches!(b, b' ' | b'\n') && !matches!(bytes[at - 1], b' ' | b'\t' | b'\n'))
                    || (junction && at > s));
            if boundary {
                end = Some(at);
            }
            // The next line must go on as paragraph text.
            let rest = &bytes[at + 1..];
            let next_line_plain = || {
                if quoted {
                    return rest.starts_with(b"> ") && starts_plain(rest, 2);
                }
                let indent = rest
                    .iter()
                    .take_while(|c| matches!(c, b' ' | b'\t'))
                    .count();
                starts_plain(rest, indent)
            };
            let stop = (unsafe_in_words(b) && at >= prefix_end)
                || (b == b'\n' && !next_line_plain())
                || (boundary && at - s >= settings.max_words);
            if stop {
                close(s, end, quoted, &mut cuts);
                start = None;
            } else if b == b'\n' && quoted {
                prefix_end = at + 3;
            }
        }
        // A stretch starts after a space that follows text on its line, or
        // at the start of a line; in a line also at a tag or an autolink
        // (at the start of a line, `<` may start an HTML block).
        let after = (b == b' ' && line_content) || b == b'\n';
        let tag = b == b' ' && bytes.get(at + 1) == Some(&b'<');
        if line_fence && b != b'\n' {
            // No stretch starts on this line.
        } else if start.is_none() && after && (starts_plain(bytes, at + 1) || tag) {
            start = Some(at + 1);
            end = None;
            quoted = line_quoted && b == b' ';
        } else if start.is_none() && junction {
            start = Some(at);
            end = None;
            quoted = line_quoted;
        }
        if b == b'\n' {
            line_content = false;
            line_quoted = bytes[at + 1..].starts_with(b"> ");
            line_fence = may_open_fence(&bytes[at + 1..]);
        } else if !matches!(b, b' ' | b'\t') {
            line_content = true;
        }
    }
    if let Some(s) = start {
        close(s, end, quoted, &mut cuts);
    }
    cuts
}

/// Whether the line at the start of `rest` could open a fenced code block,
/// inside any containers: three backticks or tildes after blanks, `>` and
/// list markers.
fn may_open_fence(rest: &[u8]) -> bool {
    let text = rest
        .iter()
        .position(|b| {
            !matches!(
                b,
                b' ' | b'\t' | b'>' | b'-' | b'+' | b'*' | b'.' | b')' | b'0'..=b'9'
            )
        })
        .map_or(&[][..], |at| &rest[at..]);
    text.starts_with(b"```") || text.starts_with(b"~~~")
}

/// The labels of the footnote references (`[^label]`) in `text`, lowercase;
/// `None` when one is not plain ASCII letters, digits, `-` and `_`.
fn footnote_labels(text: &str) -> Option<Vec<String>> {
    let mut labels = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("[^") {
        rest = &rest[at + 2..];
        let len = rest
            .bytes()
            .take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'))
            .count();
        if len == 0 || rest.as_bytes().get(len) != Some(&b']') {
            return None;
        }
        labels.push(rest[..len].to_ascii_lowercase());
        rest = &rest[len + 1..];
    }
    Some(labels)
}

/// The characters of emphasis and strikethrough delimiter runs.
const DELIMITERS: [u8; 3] = [b'*', b'_', b'~'];

fn delimiter_index(b: u8) -> Option<usize> {
    DELIMITERS.iter().position(|&d| d == b)
}

/// The runs of `*`, `_` and `~` of a stretch, per character (in
/// [`DELIMITERS`] order).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Runs {
    /// Some run can only open.
    opens: [bool; 3],
    /// Some run can only close.
    closes: [bool; 3],
}

/// The runs of `*`, `_` or `~` in `bytes[range]` when each can only open,
/// only close, or neither (judged by ASCII neighbours, see [`flanking`]).
/// A run that could both open and close might, in the whole paragraph,
/// close an opener from before the stretch while alone it opens one inside
/// it: `None`.
fn one_sided_runs(bytes: &[u8], range: Range<usize>) -> Option<Runs> {
    let mut runs = Runs::default();
    let mut at = range.start;
    while at < range.end {
        let b = bytes[at];
        let Some(d) = delimiter_index(b) else {
            at += 1;
            continue;
        };
        let run_end = at + bytes[at..].iter().take_while(|&&c| c == b).count();
        // The stretch lies between spaces, line ends or `>` and `<`, so both
        // neighbours exist.
        let (before, after) = (bytes[at - 1], bytes[run_end]);
        if !before.is_ascii() || !after.is_ascii() {
            return None;
        }
        match flanking(b, run_end - at, Some(before), Some(after)) {
            (true, true) => return None,
            (false, false) => {}
            (true, false) => runs.opens[d] = true,
            (false, true) => runs.closes[d] = true,
        }
        at = run_end;
    }
    Some(runs)
}

/// Whether the line after the one holding byte `at` could be a delimiter
/// row (it could turn the paragraph's line into a table header). A lone
/// `\r` ends a line as `\n` does.
fn next_line_looks_like_delimiter(markdown: &str, at: usize) -> bool {
    let Some(end) = markdown[at..].find(['\n', '\r']).map(|i| at + i) else {
        return false;
    };
    let next = if markdown[end..].starts_with("\r\n") {
        end + 2
    } else {
        end + 1
    };
    let line = markdown[next..].split(['\n', '\r']).next().unwrap_or("");
    looks_like_delimiter(line)
}

/// The documents to parse: the main one with tokens in place of the cuts,
/// and the batches of rows.
pub(super) struct Pieces<'m> {
    markdown: &'m str,
    cuts: Vec<Cut>,
    shelved: Vec<Cut>,
    /// Tokens are this prefix, the cut's index, and `z`.
    prefix: String,
    main: String,
    /// The row batches of every rows cut, one after another.
    extra: String,
    /// For each cut, its batches in `extra` (empty for words).
    batches: Vec<Vec<Range<usize>>>,
    /// The document defines no link reference and no footnote (it has no
    /// `]:`): no link label can match anything.
    no_definitions: bool,
    /// The parses of this plan stay within the limit it was made with.
    fits: bool,
    /// Per cut, for each of [`ENDERS`]: none of its bytes follows the cut's
    /// start in its paragraph (see [`none_after`]).
    none_after: Vec<[bool; 3]>,
}

/// A piece's events are collected before they are passed on: its parse
/// may take this many times its tree (events of about twice a node's size,
/// and up to two per node).
const PIECE_TIMES: u64 = 4;

impl<'m> Pieces<'m> {
    /// `limit`: bytes the parse trees of a round may take (see
    /// [`super::budget`]); when the plan's would take more, it does not fit
    /// ([`Pieces::fits`]) and nothing of it is parsed.
    pub(super) fn new(
        markdown: &'m str,
        cuts: Cuts,
        settings: &Settings,
        limit: Option<u64>,
    ) -> Self {
        let Cuts {
            active: cuts,
            shelved,
        } = cuts;
        let mut prefix = String::from("distributorcut");
        while markdown.contains(&prefix) {
            prefix.push('x');
        }
        let cut_bytes: usize = cuts.iter().map(|c| c.source.len()).sum();
        let mut main = String::with_capacity(markdown.len() - cut_bytes + cuts.len() * 32);
        let mut extra = String::new();
        let mut batches = Vec::with_capacity(cuts.len());
        let mut at = 0;
        for (index, cut) in cuts.iter().enumerate() {
            main.push_str(&markdown[at..cut.source.start]);
            at = cut.source.end;
            match &cut.kind {
                Kind::Words { quoted, .. } => {
                    main.push_str(&token(&prefix, index));
                    // Alone, a blockquote's stretch is parsed with the `> `
                    // its first line lacks.
                    let mut ranges = Vec::new();
                    if *quoted {
                        let begin = extra.len();
                        extra.push_str("> ");
                        extra.push_str(&markdown[cut.source.clone()]);
                        ranges.push(begin..extra.len());
                    }
                    batches.push(ranges);
                }
                Kind::Items => {
                    let marker = &markdown[cut.source.start..cut.source.start + 1];
                    main.push_str(marker);
                    main.push(' ');
                    main.push_str(&token(&prefix, index));
                    main.push('\n');
                    let mut ranges = Vec::new();
                    let items = &markdown[cut.source.clone()];
                    let mut from = 0;
                    while from < items.len() {
                        let mut to = (from + settings.batch).min(items.len());
                        while to < items.len() && items.as_bytes()[to - 1] != b'\n' {
                            to += 1;
                        }
                        let begin = extra.len();
                        extra.push_str(&items[from..to]);
                        ranges.push(begin..extra.len());
                        from = to;
                    }
                    batches.push(ranges);
                }
                Kind::Section => {
                    main.push_str("# ");
                    main.push_str(&token(&prefix, index));
                    if markdown[..cut.source.end].ends_with('\n') {
                        main.push('\n');
                    }
                    batches.push(Vec::new());
                }
                Kind::Rows {
                    header,
                    delimiter,
                    columns,
                    ..
                } => {
                    main.push('|');
                    main.push_str(&token(&prefix, index));
                    main.push_str("|\n");
                    let mut ranges = Vec::new();
                    let rows = &markdown[cut.source.clone()];
                    let mut from = 0;
                    while from < rows.len() {
                        // At least as many bytes of rows as of header and
                        // delimiter: the copies take at most the rows' size.
                        let size = settings.batch.max(header.len() + delimiter.len());
                        let mut to = (from + size).min(rows.len());
                        while to < rows.len() && rows.as_bytes()[to - 1] != b'\n' {
                            to += 1;
                        }
                        let begin = extra.len();
                        extra.push_str(&markdown[header.clone()]);
                        extra.push('\n');
                        extra.push_str(&markdown[delimiter.clone()]);
                        extra.push('\n');
                        for (start, content_end, end) in lines(&rows[from..to]) {
                            let line = &rows[from + start..from + end];
                            match kept_cells_end(&line[..content_end - start], *columns) {
                                Some(kept) => {
                                    extra.push_str(&line[..kept]);
                                    extra.push('\n');
                                }
                                None => extra.push_str(line),
                            }
                        }
                        ranges.push(begin..extra.len());
                        from = to;
                    }
                    batches.push(ranges);
                }
            }
        }
        main.push_str(&markdown[at..]);
        // The main document's tree lives through the round, with the copies
        // made for it.
        let main_bytes = limit
            .map(|_| budget::weigh(&main).bytes() + (main.capacity() + extra.capacity()) as u64);
        let mut fits = match (limit, main_bytes) {
            (Some(limit), Some(bytes)) => bytes <= limit,
            _ => true,
        };
        // Stretches with footnote references are parsed with a definition
        // for each label the document defines (the definition's events are
        // left out).
        let noted: Vec<(usize, Vec<String>)> = cuts
            .iter()
            .enumerate()
            .filter(|(_, cut)| matches!(cut.kind, Kind::Words { .. }))
            .filter_map(|(index, cut)| {
                let labels = footnote_labels(&markdown[cut.source.clone()])?;
                (!labels.is_empty()).then_some((index, labels))
            })
            .collect();
        if !noted.is_empty() && fits {
            let defined = defined_footnotes(&main);
            for (index, labels) in noted {
                let cut = &cuts[index];
                let Kind::Words { quoted, .. } = cut.kind else {
                    continue;
                };
                let begin = extra.len();
                if quoted {
                    extra.push_str("> ");
                }
                extra.push_str(&markdown[cut.source.clone()]);
                extra.push_str("\n\n");
                let mut written: Vec<&String> = Vec::new();
                for label in &labels {
                    if defined.contains(label) && !written.contains(&label) {
                        extra.push_str("[^");
                        extra.push_str(label);
                        extra.push_str("]: n\n");
                        written.push(label);
                    }
                }
                batches[index] = std::iter::once(begin..extra.len()).collect();
            }
        }
        if let (Some(limit), Some(main_bytes)) = (limit, main_bytes)
            && fits
        {
            // One piece is parsed at a time, while the main document's tree
            // is alive.
            let heaviest = cuts
                .iter()
                .enumerate()
                .flat_map(|(index, cut)| {
                    let texts: Vec<&str> = match (&cut.kind, batches[index].is_empty()) {
                        (Kind::Words { .. } | Kind::Section, true) => {
                            vec![&markdown[cut.source.clone()]]
                        }
                        _ => batches[index]
                            .iter()
                            .map(|range| &extra[range.clone()])
                            .collect(),
                    };
                    texts.into_iter().map(|text| budget::weigh(text).bytes())
                })
                .max()
                .unwrap_or(0);
            fits = main_bytes + (extra.capacity() as u64) + PIECE_TIMES * heaviest <= limit;
        }
        let none_after = none_after(markdown, &cuts);
        Pieces {
            markdown,
            cuts,
            shelved,
            prefix,
            main,
            extra,
            batches,
            no_definitions: !markdown.contains("]:"),
            fits,
            none_after,
        }
    }

    /// Whether the plan's parses stay within the limit it was made with.
    pub(super) fn fits(&self) -> bool {
        self.fits
    }

    /// How many pieces are parsed on their own (stretches of words and
    /// batches of rows).
    pub(super) fn pieces(&self) -> usize {
        self.batches.iter().map(|b| b.len().max(1)).sum()
    }

    /// The cuts, without those at the given indexes.
    /// The cuts for the next round: these without the `failed` ones, and
    /// the shelved stretches that overlap none of those left.
    pub(super) fn into_cuts_without(self, failed: &[usize]) -> Cuts {
        let mut active: Vec<Cut> = self
            .cuts
            .into_iter()
            .enumerate()
            .filter(|(index, _)| !failed.contains(index))
            .map(|(_, cut)| cut)
            .collect();
        let taken: Vec<Range<usize>> = active.iter().map(taken_by).collect();
        let (free, shelved): (Vec<Cut>, Vec<Cut>) = self
            .shelved
            .into_iter()
            .partition(|cut| !overlaps(&taken, &cut.source));
        active.extend(free);
        active.sort_by_key(|cut| cut.source.start);
        Cuts { active, shelved }
    }
}

/// Per cut (in document order), for each of [`ENDERS`]: whether none of
/// its bytes follows the cut's start before the next blank line. A
/// paragraph never goes on past a blank line, so then a `[` left unclosed
/// before the cut cannot be closed after it (`]`), nor a link title
/// (`"'()`) or a tag (`>`). One pass, keeping nothing per line.
fn none_after(markdown: &str, cuts: &[Cut]) -> Vec<[bool; 3]> {
    let bytes = markdown.as_bytes();
    let mut result = vec![[true; 3]; cuts.len()];
    // Per set, the cuts of the open chunk that no byte of it followed yet.
    let mut pending: [Vec<usize>; 3] = Default::default();
    let mut next = 0;
    for (start, content_end, end) in lines(markdown) {
        let line = &bytes[start..content_end];
        if line.iter().all(|&b| is_blank_byte(b)) {
            for waiting in &mut pending {
                waiting.clear();
            }
            // No cut starts in a blank line; if one did, say no.
            while next < cuts.len() && cuts[next].source.start < end {
                result[next] = [false; 3];
                next += 1;
            }
            continue;
        }
        for (at, byte) in (start..content_end).zip(line) {
            while next < cuts.len() && cuts[next].source.start <= at {
                for waiting in &mut pending {
                    waiting.push(next);
                }
                next += 1;
            }
            for (k, set) in ENDERS.iter().enumerate() {
                if set.contains(byte) {
                    for index in pending[k].drain(..) {
                        result[index][k] = false;
                    }
                }
            }
        }
        while next < cuts.len() && cuts[next].source.start < end {
            for waiting in &mut pending {
                waiting.push(next);
            }
            next += 1;
        }
    }
    result
}

/// What ends something left open before a stretch: a `[` (`]`), an inline
/// link's destination or title (`"'()`), raw HTML or an autolink (`>`).
const ENDERS: [&[u8]; 3] = [b"]", b"\"'()", b">"];

/// The labels, lowercase, of the footnotes `main` defines.
fn defined_footnotes(main: &str) -> std::collections::BTreeSet<String> {
    Parser::new_ext(main, super::parser_options())
        .filter_map(|event| match event {
            Event::Start(Tag::FootnoteDefinition(label)) => Some(label.to_lowercase()),
            _ => None,
        })
        .collect()
}

fn token(prefix: &str, index: usize) -> String {
    format!("{prefix}{index}z")
}

/// What an open tag is, as far as token placement goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Paragraph,
    Table,
    List,
    /// Emphasis, strong, strikethrough: text inside is still paragraph text.
    Inline,
    Link,
    Other,
}

fn open_kind(tag: &Tag<'_>) -> Open {
    match tag {
        Tag::Paragraph => Open::Paragraph,
        Tag::Table(_) => Open::Table,
        Tag::List(_) => Open::List,
        Tag::Emphasis | Tag::Strong | Tag::Strikethrough => Open::Inline,
        Tag::Link { .. } | Tag::Image { .. } => Open::Link,
        _ => Open::Other,
    }
}

/// What the open paragraph of the main document holds before the current
/// point, as far as a stretch spliced there goes (see
/// [`Splicer::splice_words`]). Counted on the document's bytes where text
/// events are verbatim slices of it.
#[derive(Debug, Default)]
struct Before {
    /// Text that is not a slice of the document, or a backtick run after a
    /// backslash: no stretch fits from here on.
    loose: bool,
    /// A `<` left as text: raw HTML or an autolink could go on into the
    /// stretch, unless no `>` follows in the paragraph.
    angle: bool,
    /// `[` left as text and not closed by a `]` left as text after them: a
    /// link label could go on through the stretch.
    brackets: usize,
    /// A `]` left as text right before `(`: an inline link's destination or
    /// title could go on into the stretch.
    link_tail: bool,
    /// Lengths of backtick runs left as text: a run of the same length in a
    /// stretch would close a code span opened before it.
    ticks: Vec<usize>,
    /// Stretches spliced since the first of `ticks`.
    since_ticks: Vec<usize>,
    /// A stretch of the paragraph failed.
    failed_here: bool,
    /// The document's bytes up to here were looked at for runs of `*`, `_`
    /// and `~`.
    scanned: usize,
    /// Per character of [`DELIMITERS`]: a run that can open came before and
    /// was left (partly) as text, or came in a stretch: it may still be open
    /// where the stretch is.
    openers: [bool; 3],
    /// Per character: stretches left with a run that only opens unmatched;
    /// a run of the same character that can close must not follow in the
    /// paragraph.
    unclosed: [Vec<usize>; 3],
}

/// Splicing in hand, done one piece at a time so that only one piece's
/// events wait at once.
enum Work<'p> {
    /// Rows cut `index`, from batch `next` on.
    Rows { index: usize, next: usize },
    /// A main text event holding words tokens, from byte `at` on; `base`
    /// is where the text starts in the main document when it is a verbatim
    /// slice of it.
    Words {
        text: CowStr<'p>,
        at: usize,
        base: Option<usize>,
    },
    /// Section cut `index`.
    Section { index: usize },
}

/// The event stream of a [`Pieces`]: the main document's events with each
/// token replaced by its piece's events. Check [`Splicer::failed`] once it
/// is exhausted.
pub(super) struct Splicer<'p> {
    plan: &'p Pieces<'p>,
    main: OffsetIter<'p>,
    pending: VecDeque<Event<'p>>,
    work: Option<Work<'p>>,
    stack: Vec<Open>,
    /// What the open paragraph holds so far.
    before: Before,
    /// Header and delimiter lines (in `plan.main`) of the open top-level table.
    table: Option<(Range<usize>, Range<usize>)>,
    /// The open top-level table's columns, its cuts, and at most how many
    /// cells the parser fills in it, whole or cut. Below
    /// [`MOST_FILLED_CELLS`] both parse it the same.
    columns: usize,
    table_cuts: Vec<usize>,
    filled: usize,
    /// The last event was the start of a table cell.
    cell_start: bool,
    seen: Vec<bool>,
    failed: Vec<usize>,
    /// Cuts that did not fit only because of an earlier cut that failed:
    /// worth trying again without that one (see [`Splicer::retried`]).
    retry: Vec<usize>,
    /// Bytes that reference links may still expand to: the parser stops
    /// resolving them past the document's size (at least 100 KB). Shared by
    /// the pieces and charged with the main document's own, so that the
    /// pieces together cannot expand more than the whole document could.
    budget: Cell<usize>,
}

impl<'p> Splicer<'p> {
    pub(super) fn new(plan: &'p Pieces<'p>, options: Options) -> Self {
        Splicer {
            plan,
            main: Parser::new_ext(&plan.main, options).into_offset_iter(),
            pending: VecDeque::new(),
            work: None,
            stack: Vec::new(),
            before: Before::default(),
            table: None,
            columns: 0,
            table_cuts: Vec::new(),
            filled: 0,
            cell_start: false,
            seen: vec![false; plan.cuts.len()],
            budget: Cell::new(plan.markdown.len().max(100_000)),
            failed: Vec::new(),
            retry: Vec::new(),
        }
    }

    /// Indexes of the cuts that did not fit only because an earlier cut of
    /// their paragraph failed: the rendering is wrong, but they may fit in
    /// the next round, without that cut.
    pub(super) fn retried(&self) -> &[usize] {
        &self.retry
    }

    /// Indexes of the cuts whose token did not come out where it should
    /// (or not at all): the rendering is wrong and must be done again
    /// without them. Empty (and [`Splicer::retried`] too) when the
    /// rendering is right.
    pub(super) fn failed(&self) -> Vec<usize> {
        let mut failed = self.failed.clone();
        failed.extend(
            self.seen
                .iter()
                .enumerate()
                .filter(|(_, seen)| !**seen)
                .map(|(index, _)| index),
        );
        failed.sort_unstable();
        failed.dedup();
        failed
    }

    /// Fails every cut whose token occurs in `text`.
    fn fail_tokens_in(&mut self, text: &str) {
        let mut rest = text;
        while let Some(at) = rest.find(&self.plan.prefix) {
            rest = &rest[at + self.plan.prefix.len()..];
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            match rest[..digits].parse::<usize>() {
                Ok(index) if index < self.plan.cuts.len() => self.failed.push(index),
                _ => self.failed.extend(0..self.plan.cuts.len()),
            }
        }
    }

    /// Fails the tokens in the text a tag carries.
    fn check_tag(&mut self, tag: &Tag<'_>) {
        match tag {
            Tag::Link {
                dest_url,
                title,
                id,
                ..
            }
            | Tag::Image {
                dest_url,
                title,
                id,
                ..
            } => {
                self.fail_tokens_in(dest_url);
                self.fail_tokens_in(title);
                self.fail_tokens_in(id);
            }
            Tag::CodeBlock(pulldown_cmark::CodeBlockKind::Fenced(info)) => {
                self.fail_tokens_in(info)
            }
            Tag::FootnoteDefinition(label) => self.fail_tokens_in(label),
            Tag::Heading {
                id, classes, attrs, ..
            } => {
                if let Some(id) = id {
                    self.fail_tokens_in(id);
                }
                for class in classes {
                    self.fail_tokens_in(class);
                }
                for (name, value) in attrs {
                    self.fail_tokens_in(name);
                    if let Some(value) = value {
                        self.fail_tokens_in(value);
                    }
                }
            }
            _ => {}
        }
    }

    /// Index of the cut whose token `text` is exactly.
    fn token_index(&self, text: &str) -> Option<usize> {
        let rest = text.strip_prefix(self.plan.prefix.as_str())?;
        let digits = rest.strip_suffix('z')?;
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        digits.parse().ok().filter(|&i| i < self.plan.cuts.len())
    }

    /// Whether text here is paragraph text outside links.
    fn in_paragraph_text(&self) -> bool {
        for open in self.stack.iter().rev() {
            match open {
                Open::Inline => continue,
                Open::Paragraph => return true,
                _ => return false,
            }
        }
        false
    }

    /// Passes one main event on, checking where tokens come out.
    fn handle(&mut self, event: Event<'p>, range: Range<usize>) {
        // Cells without content may be filled ones.
        let after_cell_start = std::mem::replace(&mut self.cell_start, false);
        if matches!(event, Event::End(TagEnd::TableCell))
            && after_cell_start
            && self.stack.first() == Some(&Open::Table)
        {
            self.filled += 1;
            if self.filled >= MOST_FILLED_CELLS {
                self.failed.extend(&self.table_cuts);
            }
        }
        self.cell_start = matches!(event, Event::Start(Tag::TableCell));
        match event {
            Event::Start(Tag::TableRow) if self.stack == [Open::Table] => self.handle_row(),
            Event::Start(Tag::Item) if self.stack == [Open::List] => self.handle_item(),
            Event::Start(Tag::Heading { .. }) if self.stack.is_empty() => {
                self.handle_heading(event)
            }
            Event::Start(tag) => {
                self.check_tag(&tag);
                if let Tag::Link {
                    link_type: LinkType::Reference | LinkType::Collapsed | LinkType::Shortcut,
                    dest_url,
                    title,
                    ..
                }
                | Tag::Image {
                    link_type: LinkType::Reference | LinkType::Collapsed | LinkType::Shortcut,
                    dest_url,
                    title,
                    ..
                } = &tag
                {
                    let used = dest_url.len() + title.len();
                    self.budget.set(self.budget.get().saturating_sub(used));
                }
                if matches!(tag, Tag::Paragraph) {
                    self.before = Before {
                        scanned: range.start,
                        ..Before::default()
                    };
                }
                if let (Tag::Table(alignments), true) = (&tag, self.stack.is_empty()) {
                    self.table = table_lines(&self.plan.main, range.start);
                    self.columns = alignments.len();
                    self.table_cuts.clear();
                    self.filled = 0;
                }
                self.stack.push(open_kind(&tag));
                self.pending.push_back(Event::Start(tag));
            }
            Event::End(end) => {
                if end == TagEnd::Paragraph {
                    // Runs that can close, after stretches left open.
                    self.scan_runs(range.end);
                    self.before.unclosed = Default::default();
                }
                self.stack.pop();
                if end == TagEnd::Table && self.stack.is_empty() {
                    self.table = None;
                }
                self.pending.push_back(Event::End(end));
            }
            Event::Text(text) if text.contains(self.plan.prefix.as_str()) => {
                let base =
                    (self.plan.main.get(range.clone()) == Some(&*text)).then_some(range.start);
                self.work = Some(Work::Words { text, at: 0, base });
            }
            Event::Text(ref text)
            | Event::Code(ref text)
            | Event::InlineHtml(ref text)
            | Event::Html(ref text)
            | Event::InlineMath(ref text)
            | Event::DisplayMath(ref text)
            | Event::FootnoteReference(ref text) => {
                self.fail_tokens_in(text);
                if let Event::Text(text) = &event {
                    let verbatim = self.plan.main.get(range.clone()) == Some(&**text);
                    self.text_before(text, verbatim.then_some(range));
                }
                self.pending.push_back(event);
            }
            other => self.pending.push_back(other),
        }
    }

    /// A body row of a top-level table: the rows of a cut when it is the
    /// cut's token row, else passed on as it is.
    fn handle_row(&mut self) {
        let head = self.read_ahead(3, |e| matches!(e, Event::End(TagEnd::TableRow)));
        let token = match head.as_slice() {
            [
                Event::Start(Tag::TableCell),
                Event::Text(text),
                Event::End(TagEnd::TableCell),
            ] => self.token_index(text),
            _ => None,
        };
        if let Some(index) = token {
            // The rest of the token row is cells the parser filled.
            for (event, _) in self.main.by_ref() {
                match event {
                    Event::End(TagEnd::TableRow) => break,
                    Event::Start(Tag::TableCell) | Event::End(TagEnd::TableCell) => {}
                    _ => self.failed.push(index),
                }
            }
            self.splice_rows(index);
            return;
        }
        self.stack.push(Open::Other);
        self.pending.push_back(Event::Start(Tag::TableRow));
        for event in head {
            self.handle(event, 0..0);
        }
    }

    /// The next events of the main document, at most `most` and up to the
    /// first for which `last` holds.
    fn read_ahead(&mut self, most: usize, last: impl Fn(&Event<'p>) -> bool) -> Vec<Event<'p>> {
        let mut head = Vec::with_capacity(most);
        while head.len() < most {
            let Some((event, _)) = self.main.next() else {
                break;
            };
            let stop = last(&event);
            head.push(event);
            if stop {
                break;
            }
        }
        head
    }

    /// A top-level heading: a section's blocks when it is the section's
    /// token heading, else passed on (through [`Splicer::handle`]).
    fn handle_heading(&mut self, start: Event<'p>) {
        let head = self.read_ahead(2, |e| matches!(e, Event::End(TagEnd::Heading(_))));
        if let [Event::Text(text), Event::End(_)] = head.as_slice()
            && let Some(index) = self.token_index(text)
        {
            let fits = matches!(self.plan.cuts[index].kind, Kind::Section)
                && !std::mem::replace(&mut self.seen[index], true);
            if fits {
                self.work = Some(Work::Section { index });
            } else {
                self.failed.push(index);
            }
            return;
        }
        if let Event::Start(tag) = start {
            self.check_tag(&tag);
            self.stack.push(open_kind(&tag));
            self.pending.push_back(Event::Start(tag));
        }
        for event in head {
            // Heading text is never paragraph text: any token in it fails.
            self.handle(event, 0..0);
        }
    }

    /// An item of a top-level list: an items cut's items when it is the
    /// cut's token item (which also shows the list is tight), else passed on.
    fn handle_item(&mut self) {
        let item = self.read_ahead(2, |e| matches!(e, Event::End(TagEnd::Item)));
        if let [Event::Text(text), Event::End(TagEnd::Item)] = item.as_slice()
            && let Some(index) = self.token_index(text)
        {
            let fits = matches!(self.plan.cuts[index].kind, Kind::Items)
                && !std::mem::replace(&mut self.seen[index], true);
            if fits {
                self.work = Some(Work::Rows { index, next: 0 });
            } else {
                self.failed.push(index);
            }
            return;
        }
        self.stack.push(Open::Other);
        self.pending.push_back(Event::Start(Tag::Item));
        for event in item {
            self.handle(event, 0..0);
        }
    }

    /// The blocks of section cut `index`, parsed alone: they must end with
    /// the heading of its last line, closing everything.
    fn splice_section(&mut self, index: usize) {
        let plan = self.plan;
        let source = &plan.markdown[plan.cuts[index].source.clone()];
        let defs = self.main.reference_definitions();
        let events: Vec<Event<'p>> = parse_piece(source, defs, &self.budget).collect();
        let mut depth = 0usize;
        let mut closed = true;
        for event in &events {
            match event {
                Event::Start(_) => depth += 1,
                Event::End(_) => depth = depth.saturating_sub(1),
                Event::FootnoteReference(_) => closed = false,
                _ => {}
            }
        }
        let ends_with_heading = matches!(events.last(), Some(Event::End(TagEnd::Heading(_))));
        if !closed || depth != 0 || !ends_with_heading {
            self.failed.push(index);
            return;
        }
        self.pending.extend(events);
    }

    /// The body rows of rows cut `index`, in place of its token row.
    fn splice_rows(&mut self, index: usize) {
        let plan = self.plan;
        let Kind::Rows {
            header,
            delimiter,
            columns,
            filled,
        } = &plan.cuts[index].kind
        else {
            self.failed.push(index);
            return;
        };
        // Whole, the parser fills at most `filled` cells in the cut rows;
        // with the cut, `columns` in the token row.
        self.table_cuts.push(index);
        self.filled += filled + columns;
        if *columns != self.columns || self.filled >= MOST_FILLED_CELLS {
            self.failed.extend(&self.table_cuts);
            return;
        }
        let same_table = self.table.as_ref().is_some_and(|(h, d)| {
            plan.main[h.clone()] == plan.markdown[header.clone()]
                && plan.main[d.clone()] == plan.markdown[delimiter.clone()]
        });
        if !same_table || std::mem::replace(&mut self.seen[index], true) {
            self.failed.push(index);
            return;
        }
        self.work = Some(Work::Rows { index, next: 0 });
    }

    /// The rows of one batch of a rows cut, or the items of one of an
    /// items cut.
    fn splice_batch(&mut self, index: usize, batch: usize) {
        let plan = self.plan;
        let defs = self.main.reference_definitions();
        if matches!(plan.cuts[index].kind, Kind::Items) {
            let text = &plan.extra[plan.batches[index][batch].clone()];
            let events: Vec<Event<'p>> = parse_piece(text, defs, &self.budget).collect();
            // Alone, the batch must be one bullet list.
            let mut depth = 0usize;
            let one_list = matches!(events.first(), Some(Event::Start(Tag::List(None))))
                && matches!(events.last(), Some(Event::End(TagEnd::List(false))))
                && events.iter().enumerate().all(|(i, event)| {
                    match event {
                        Event::Start(_) => depth += 1,
                        Event::End(_) => depth -= 1,
                        _ => {}
                    }
                    depth > 0 || i == events.len() - 1
                });
            if !one_list {
                self.failed.push(index);
                return;
            }
            let inner = events.len() - 1;
            self.pending.extend(events.into_iter().take(inner).skip(1));
            return;
        }
        let mut in_body = false;
        for event in parse_piece(
            &plan.extra[plan.batches[index][batch].clone()],
            defs,
            &self.budget,
        ) {
            match event {
                Event::End(TagEnd::TableHead) => in_body = true,
                Event::End(TagEnd::Table) => break,
                event if in_body => self.pending.push_back(event),
                _ => {}
            }
        }
    }

    /// Goes on with the work in hand, one piece at a time; false when there
    /// is none.
    fn step(&mut self) -> bool {
        match self.work.take() {
            None => false,
            Some(Work::Rows { index, next }) => {
                if next < self.plan.batches[index].len() {
                    self.splice_batch(index, next);
                    self.work = Some(Work::Rows {
                        index,
                        next: next + 1,
                    });
                }
                true
            }
            Some(Work::Words { text, at, base }) => {
                self.words_step(text, at, base);
                true
            }
            Some(Work::Section { index }) => {
                self.splice_section(index);
                true
            }
        }
    }

    /// Text holding words tokens, from byte `at` on: the text up to the
    /// next token and that token's stretch; the rest is left as work.
    fn words_step(&mut self, text: CowStr<'p>, at: usize, base: Option<usize>) {
        let plan = self.plan;
        let piece = |range: Range<usize>| -> CowStr<'p> {
            match &text {
                CowStr::Borrowed(s) => CowStr::Borrowed(&s[range]),
                other => other[range].to_owned().into(),
            }
        };
        let source = |range: Range<usize>| base.map(|b| b + range.start..b + range.end);
        let Some(found) = text[at..].find(plan.prefix.as_str()) else {
            self.text_before(&text[at..], source(at..text.len()));
            if at < text.len() {
                self.pending.push_back(Event::Text(piece(at..text.len())));
            }
            return;
        };
        let token_start = at + found;
        let after = token_start + plan.prefix.len();
        let digits = text[after..].bytes().take_while(u8::is_ascii_digit).count();
        let index = text[after..after + digits].parse::<usize>().ok();
        let Some(index) =
            index.filter(|&i| i < plan.cuts.len() && text[after + digits..].starts_with('z'))
        else {
            self.failed.extend(0..plan.cuts.len());
            return;
        };
        let token_end = after + digits + 1;
        if token_start > at {
            self.text_before(&text[at..token_start], source(at..token_start));
            self.pending.push_back(Event::Text(piece(at..token_start)));
        }
        match base {
            Some(base) => self.scan_runs(base + token_start),
            // Where the token is in the document is unknown.
            None => self.before.loose = true,
        }
        // A code span, link or raw HTML opened before the stretch and left
        // unmatched could be closed inside it (see [`Before`]).
        let before = &self.before;
        let fits = matches!(plan.cuts[index].kind, Kind::Words { .. })
            && !before.loose
            && (!before.angle || plan.none_after[index][2])
            && (!before.link_tail || plan.none_after[index][1])
            && (before.brackets == 0 || plan.no_definitions || plan.none_after[index][0])
            && self.in_paragraph_text()
            && !std::mem::replace(&mut self.seen[index], true);
        if fits {
            self.splice_words(index);
        } else {
            self.failed.push(index);
        }
        if let Some(base) = base {
            self.before.scanned = base + token_end;
        }
        self.work = Some(Work::Words {
            text,
            at: token_end,
            base,
        });
    }

    /// Takes in text of the main document left as text in the open
    /// paragraph; `source` is where it is in the main document when it is a
    /// verbatim slice of it.
    fn text_before(&mut self, text: &str, source: Option<Range<usize>>) {
        let Some(source) = source else {
            if text.contains(['`', '[', ']', '<']) {
                self.before.loose = true;
            }
            for (d, &c) in DELIMITERS.iter().enumerate() {
                self.before.openers[d] |= text.contains(char::from(c));
            }
            return;
        };
        let bytes = self.plan.main.as_bytes();
        let before = &mut self.before;
        let mut at = source.start;
        while at < source.end {
            match bytes[at] {
                b'<' => before.angle = true,
                b'[' => before.brackets += 1,
                // An escaped `]` closes nothing.
                b']' if at > 0 && bytes[at - 1] == b'\\' => {}
                b']' => {
                    before.brackets = before.brackets.saturating_sub(1);
                    if bytes.get(at + 1) == Some(&b'(') {
                        before.link_tail = true;
                    }
                }
                c @ (b'*' | b'_' | b'~') => {
                    let from = at - bytes[..at].iter().rev().take_while(|&&b| b == c).count();
                    let to = at + bytes[at..].iter().take_while(|&&b| b == c).count();
                    let before_run = from.checked_sub(1).map(|i| bytes[i]);
                    let (open, _) = flanking(c, to - from, before_run, bytes.get(to).copied());
                    if let Some(d) = delimiter_index(c) {
                        before.openers[d] |= open;
                    }
                }
                b'`' => {
                    // The whole run (one text node), which a backslash
                    // before it would shorten.
                    let from = at - bytes[..at].iter().rev().take_while(|&&b| b == b'`').count();
                    let to = at + bytes[at..].iter().take_while(|&&b| b == b'`').count();
                    if from > 0 && bytes[from - 1] == b'\\' {
                        before.loose = true;
                    }
                    before.ticks.push(to - from);
                    at = to;
                    continue;
                }
                _ => {}
            }
            at += 1;
        }
    }

    /// Looks at the main document's runs of `*`, `_` and `~` in the open
    /// paragraph up to `to` (also those in code spans, link destinations,
    /// ...): runs that can close fail the stretches left open before them.
    fn scan_runs(&mut self, to: usize) {
        let bytes = self.plan.main.as_bytes();
        let from = self.before.scanned.min(to);
        let mut at = from;
        while at < to {
            let b = bytes[at];
            let Some(d) = delimiter_index(b) else {
                at += 1;
                continue;
            };
            let end = at + bytes[at..to].iter().take_while(|&&c| c == b).count();
            // A run at the edge of what is looked at may go on: it may do
            // anything.
            let close = at == from
                || end == to
                || flanking(b, end - at, Some(bytes[at - 1]), Some(bytes[end])).1;
            if close {
                self.failed.append(&mut self.before.unclosed[d]);
            }
            at = end;
        }
        self.before.scanned = self.before.scanned.max(to);
    }

    /// The inline events of words cut `index`.
    fn splice_words(&mut self, index: usize) {
        let plan = self.plan;
        let Kind::Words { runs, quoted } = plan.cuts[index].kind else {
            self.failed.push(index);
            return;
        };
        let source = match plan.batches[index].first() {
            Some(range) => &plan.extra[range.clone()],
            None => &plan.markdown[plan.cuts[index].source.clone()],
        };
        let defs = self.main.reference_definitions();
        let mut events: Vec<(Event<'p>, Range<usize>)> =
            parse_piece_with_offsets(source, defs, &self.budget).collect();
        // Only the first block is the stretch; footnote definitions given
        // to it follow.
        let mut depth = 0usize;
        if let Some(first_end) = events.iter().position(|(event, _)| {
            match event {
                Event::Start(_) => depth += 1,
                Event::End(_) => depth = depth.saturating_sub(1),
                _ => {}
            }
            depth == 0
        }) {
            events.truncate(first_end + 1);
        }
        if quoted {
            let in_quote = matches!(
                events.first(),
                Some((Event::Start(Tag::BlockQuote(None)), _))
            ) && matches!(
                events.last(),
                Some((Event::End(TagEnd::BlockQuote(None)), _))
            );
            if !in_quote {
                self.failed.push(index);
                return;
            }
            events.pop();
            events.remove(0);
        }
        let bytes = source.as_bytes();
        // Alone, the stretch must be one paragraph of inline events, with
        // its code spans, raw HTML and autolinks complete.
        let complete = matches!(events.first(), Some((Event::Start(Tag::Paragraph), _)))
            && matches!(events.last(), Some((Event::End(TagEnd::Paragraph), _)))
            && events[1..events.len() - 1].iter().all(|(e, _)| match e {
                Event::Start(tag) => matches!(open_kind(tag), Open::Inline | Open::Link),
                Event::End(end) => matches!(
                    end,
                    TagEnd::Emphasis
                        | TagEnd::Strong
                        | TagEnd::Strikethrough
                        | TagEnd::Link
                        | TagEnd::Image
                ),
                Event::Text(t) => !t.contains(['`', '<']),
                Event::Code(_)
                | Event::InlineHtml(_)
                | Event::SoftBreak
                | Event::HardBreak
                | Event::FootnoteReference(_) => true,
                _ => false,
            });
        // Brackets left as text must close each other, and none be an
        // inline link's `](` (see [`Before`]): then the link labels and
        // destinations of the stretch end in it.
        let mut brackets = 0usize;
        let mut link_tail = false;
        // Per character, a run that can open or close left (partly) as text.
        let mut left_open = [false; 3];
        for (event, range) in &events {
            let Event::Text(_) = event else { continue };
            for at in range.clone() {
                if let Some(d) = delimiter_index(bytes[at]) {
                    let c = bytes[at];
                    let from = at - bytes[..at].iter().rev().take_while(|&&b| b == c).count();
                    let to = at + bytes[at..].iter().take_while(|&&b| b == c).count();
                    let before = from.checked_sub(1).map(|i| bytes[i]);
                    let (open, close) = flanking(c, to - from, before, bytes.get(to).copied());
                    left_open[d] |= open || close;
                }
                match bytes[at] {
                    b'[' => brackets += 1,
                    b']' => {
                        brackets = brackets.saturating_sub(1);
                        link_tail |= bytes.get(at + 1) == Some(&b'(');
                    }
                    _ => {}
                }
            }
        }
        // A run left as text that only closes could close an opener before
        // the stretch; one that only opens, a closer after it.
        // An emphasis open in the main document where the token is may be
        // closed after it by a run whose opener is still open there.
        let in_emphasis = self
            .stack
            .iter()
            .rev()
            .take_while(|open| **open != Open::Paragraph)
            .any(|open| *open == Open::Inline);
        let closes_before = (0..3)
            .any(|d| left_open[d] && runs.closes[d] && (self.before.openers[d] || in_emphasis));
        // A code span opened before the stretch, left as text in the main
        // document, would close at a run of the same length.
        let piece_text = &plan.markdown[plan.cuts[index].source.clone()];
        let ticks = tick_runs(piece_text);
        let closes_ticks = ticks.iter().any(|n| self.before.ticks.contains(n));
        if complete && !(brackets != 0 || link_tail || closes_ticks) && closes_before {
            // The opener may be one that an earlier stretch of the paragraph,
            // which failed, closes: once that one is back in the main
            // document this one may fit.
            if self.before.failed_here {
                self.retry.push(index);
            } else {
                self.failed.push(index);
                self.before.failed_here = true;
            }
            return;
        }
        if !complete || brackets != 0 || link_tail || closes_ticks {
            self.failed.push(index);
            self.before.failed_here = true;
            if closes_ticks {
                self.failed.append(&mut self.before.since_ticks);
            }
            return;
        }
        for (d, &left_open) in left_open.iter().enumerate() {
            if runs.closes[d] {
                self.failed.append(&mut self.before.unclosed[d]);
            }
            self.before.openers[d] |= runs.opens[d];
            if left_open && runs.opens[d] {
                self.before.unclosed[d].push(index);
            }
        }
        if !self.before.ticks.is_empty() {
            self.before.since_ticks.push(index);
        }
        let inner = events.len() - 1;
        self.pending
            .extend(events.into_iter().take(inner).skip(1).map(|(e, _)| e));
    }
}

/// Lengths of the runs of backticks in `text`.
fn tick_runs(text: &str) -> Vec<usize> {
    let bytes = text.as_bytes();
    let mut runs = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'`' {
            let n = bytes[at..].iter().take_while(|&&b| b == b'`').count();
            runs.push(n);
            at += n;
        } else {
            at += 1;
        }
    }
    runs
}

/// The header and delimiter lines of the table starting at `offset` of
/// `main`.
fn table_lines(main: &str, offset: usize) -> Option<(Range<usize>, Range<usize>)> {
    let start = main[..offset].rfind('\n').map_or(0, |n| n + 1);
    let mut it = lines(&main[start..]);
    let (hs, he, _) = it.next()?;
    let (ds, de, _) = it.next()?;
    Some((start + hs..start + he, start + ds..start + de))
}

/// Events of a piece parsed alone, reference links resolved against the
/// main document's definitions while `budget` lasts (see
/// [`Splicer::budget`]).
fn parse_piece<'t>(
    text: &'t str,
    defs: &RefDefs<'_>,
    budget: &Cell<usize>,
) -> impl Iterator<Item = Event<'t>> {
    parse_piece_with_offsets(text, defs, budget).map(|(event, _)| event)
}

/// [`parse_piece`] with each event's range in `text`.
fn parse_piece_with_offsets<'t>(
    text: &'t str,
    defs: &RefDefs<'_>,
    budget: &Cell<usize>,
) -> impl Iterator<Item = (Event<'t>, Range<usize>)> {
    let resolve = move |link: BrokenLink<'t>| {
        if budget.get() == 0 {
            return None;
        }
        defs.get(&link.reference).map(|def| {
            let title = def.title.as_deref().unwrap_or("");
            budget.set(budget.get().saturating_sub(def.dest.len() + title.len()));
            (
                CowStr::from(def.dest.to_string()),
                CowStr::from(title.to_owned()),
            )
        })
    };
    Parser::new_with_broken_link_callback(text, super::parser_options(), Some(resolve))
        .into_offset_iter()
        .map(|(event, range)| {
            let event = match event {
                // Resolved by the callback, so marked "unknown"; in the whole
                // document it was an ordinary reference.
                Event::Start(Tag::Link {
                    link_type,
                    dest_url,
                    title,
                    id,
                }) => Event::Start(Tag::Link {
                    link_type: known(link_type),
                    dest_url,
                    title,
                    id,
                }),
                Event::Start(Tag::Image {
                    link_type,
                    dest_url,
                    title,
                    id,
                }) => Event::Start(Tag::Image {
                    link_type: known(link_type),
                    dest_url,
                    title,
                    id,
                }),
                other => other,
            };
            (event, range)
        })
}

fn known(link_type: LinkType) -> LinkType {
    match link_type {
        LinkType::ReferenceUnknown => LinkType::Reference,
        LinkType::CollapsedUnknown => LinkType::Collapsed,
        LinkType::ShortcutUnknown => LinkType::Shortcut,
        other => other,
    }
}

impl<'p> Iterator for Splicer<'p> {
    type Item = Event<'p>;

    fn next(&mut self) -> Option<Event<'p>> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some(event);
            }
            if self.step() {
                continue;
            }
            let (event, range) = self.main.next()?;
            self.handle(event, range);
        }
    }
}
