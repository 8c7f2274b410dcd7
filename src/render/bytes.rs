//! Bytes of markdown as pulldown-cmark's first pass sees them: lines,
//! blanks and the flanking rules of emphasis runs. Shared by the splitter
//! and the budget; pure functions of the text.

/// Whitespace within a line, as the parser counts it (a line of only such
/// bytes is blank).
pub(super) fn is_blank_byte(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | 0x0b | 0x0c)
}

/// The lines of `bytes` as (start, end without line ending, end with it).
/// Only `\n` (or `\r\n`) ends a line here; a lone `\r`, which ends one for
/// the parser, is left inside.
pub(super) fn byte_lines(bytes: &[u8]) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
    let mut at = 0;
    std::iter::from_fn(move || {
        if at >= bytes.len() {
            return None;
        }
        let start = at;
        let newline = memchr(b'\n', &bytes[start..]).map(|i| start + i);
        let (content_end, next) = match newline {
            Some(n) => (n, n + 1),
            None => (bytes.len(), bytes.len()),
        };
        let content_end = if content_end > start && bytes[content_end - 1] == b'\r' {
            content_end - 1
        } else {
            content_end
        };
        at = next;
        Some((start, content_end, next))
    })
}

fn memchr(needle: u8, haystack: &[u8]) -> Option<usize> {
    haystack.iter().position(|&b| b == needle)
}

/// Whitespace as the parser's flanking rules see it (ASCII).
fn is_space_byte(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// Whether a run of `run` characters `c` between `before` and `after`
/// (`None`: the start or end of the text) can open and can close emphasis
/// or strikethrough, as the parser decides for ASCII neighbours
/// (pulldown-cmark's `delim_run_can_open` and `delim_run_can_close`).
/// A neighbour that is not ASCII may be a letter, a space or punctuation:
/// `(true, true)`, the run may do both.
pub(super) fn flanking(c: u8, run: usize, before: Option<u8>, after: Option<u8>) -> (bool, bool) {
    if before.is_some_and(|b| !b.is_ascii()) || after.is_some_and(|b| !b.is_ascii()) {
        return (true, true);
    }
    let punct = |b: u8| b.is_ascii_punctuation();
    let open = match (before, after) {
        (_, None) => false,
        (_, Some(a)) if is_space_byte(a) => false,
        (None, _) => true,
        (Some(b), Some(a)) => {
            (c == b'*' && !punct(a)) || (c == b'~' && run > 1) || is_space_byte(b) || punct(b)
        }
    };
    let close = match (before, after) {
        (None, _) => false,
        (Some(b), _) if is_space_byte(b) => false,
        (_, None) => true,
        (Some(b), Some(a)) => {
            ((c == b'*' || (c == b'~' && run > 1)) && !punct(b)) || is_space_byte(a) || punct(a)
        }
    };
    (open, close)
}
