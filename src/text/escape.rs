//! Making producer-controlled text inert before it reaches a terminal or a
//! log line (docs/contract.md §12.7): control characters in names and messages are
//! printed escaped (`\n`, `\x1b`, ...), so a bundle named with a carriage
//! return or an escape sequence cannot rewrite what an operator sees.
//! `--json` output does not use this: JSON escapes control characters itself.
//!
//! Pure functions; no I/O.

use std::borrow::Cow;
use std::fmt::Write;

/// True for the characters that must never reach a terminal as they are:
/// C0 controls, DEL, C1 controls, and the bidirectional overrides and
/// isolates that reorder what follows them on screen.
fn needs_escape(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

fn push_escaped(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        c if (c as u32) < 0x100 => {
            let _ = write!(out, "\\x{:02x}", c as u32);
        }
        c => {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
    }
}

/// `text` with every control character (and bidirectional override)
/// escaped; borrowed when there is nothing to escape. A backslash is left as
/// it is: the escapes only need to be unambiguous to a reader, not reversible.
pub fn inert(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if needs_escape(c) {
            push_escaped(&mut out, c);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Raw bytes of a name (which may not be UTF-8) shown so that a producer can
/// tell exactly which bytes are wrong: valid UTF-8 runs as text (made inert),
/// every invalid byte as `\xNN`.
pub fn inert_bytes(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        out.push_str(&inert(chunk.valid()));
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out
}

/// [`inert_bytes`] of an OS string (a file name read from disk).
pub fn inert_os(name: &std::ffi::OsStr) -> String {
    use std::os::unix::ffi::OsStrExt;
    inert_bytes(name.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_plain_text_is_borrowed() {
        let cases: &[(&str, &str)] = &[
            ("report-1", "report-1"),
            ("a b/ü.md", "a b/ü.md"),
            ("x\ry", "x\\ry"),
            ("line\nnext", "line\\nnext"),
            ("tab\there", "tab\\there"),
            ("\x1b[31mred", "\\x1b[31mred"),
            ("bell\x07", "bell\\x07"),
            ("del\x7f", "del\\x7f"),
            ("c1\u{9b}", "c1\\x9b"),
            ("evil\u{202e}fdp.exe", "evil\\u{202e}fdp.exe"),
            ("iso\u{2066}x", "iso\\u{2066}x"),
            ("back\\slash", "back\\slash"),
        ];
        for (input, want) in cases {
            assert_eq!(inert(input), *want, "input {input:?}");
        }
        assert!(matches!(inert("plain"), Cow::Borrowed(_)));
    }

    #[test]
    fn invalid_utf8_bytes_are_shown_as_hex() {
        assert_eq!(inert_bytes(b"bad\xff\xfe.txt"), "bad\\xff\\xfe.txt");
        assert_eq!(inert_bytes("ok\u{e9}".as_bytes()), "ok\u{e9}");
        assert_eq!(inert_bytes(b"a\x1bb\xc3"), "a\\x1bb\\xc3");
    }

    proptest::proptest! {
        #[test]
        fn nothing_that_moves_a_terminal_survives(text in "\\PC*|[\\x00-\\x1f\\x7f-\\u{9f}\\u{202a}-\\u{202e}a-z]{0,40}") {
            let out = inert(&text);
            proptest::prop_assert!(!out.chars().any(needs_escape), "{out:?}");
            // Text without anything to escape is unchanged.
            if !text.chars().any(needs_escape) {
                proptest::prop_assert_eq!(out.as_ref(), text.as_str());
            }
        }

        #[test]
        fn any_bytes_become_printable_text(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)) {
            let out = inert_bytes(&bytes);
            proptest::prop_assert!(!out.chars().any(needs_escape), "{out:?}");
        }
    }
}
