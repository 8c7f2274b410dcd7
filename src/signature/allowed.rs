//! The OpenSSH `allowed_signers` format, as docs/contract.md §17.3 uses it
//! (docs/config.md, "Signatures", lists what a line may say): one signer
//! per line,
//!
//! ```text
//! principal[,principal...] [option[,option...]] keytype base64-key [comment]
//! ```
//!
//! with the options `namespaces="..."`, `valid-after="..."` and
//! `valid-before="..."`. Blank lines and lines starting with `#` are
//! skipped. `cert-authority` lines (keys that sign certificates) are
//! refused: a signer is named by its own key. Times must be written in UTC
//! (a trailing `Z`), since ssh-keygen reads a time without `Z` in the local
//! time zone of whichever machine checks it.

use ssh_key::{Algorithm, EcdsaCurve, PublicKey, public::KeyData};
use time::{Date, Month, OffsetDateTime, PrimitiveDateTime, Time};

/// Largest `allowed_signers` file read: a list of keys, not a document.
pub const MAX_ALLOWED_SIGNERS_BYTES: usize = 4 * 1024 * 1024;

/// One line of an `allowed_signers` file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignerLine {
    /// The line number in the file (from 1), for messages.
    pub line: usize,
    /// The principals, as written (patterns are kept as written).
    pub principals: Vec<String>,
    pub key: KeyData,
    /// `namespaces=`: patterns of the namespaces the key may sign in;
    /// `None` allows every namespace.
    pub namespaces: Option<Vec<String>>,
    pub valid_after: Option<OffsetDateTime>,
    pub valid_before: Option<OffsetDateTime>,
}

/// A parsed `allowed_signers` file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedSigners {
    pub lines: Vec<SignerLine>,
}

impl AllowedSigners {
    /// Parses the text of an `allowed_signers` file. The error names the
    /// line and says how to fix it.
    pub fn parse(text: &str) -> Result<AllowedSigners, String> {
        let mut lines = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let number = i + 1;
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let signer = parse_line(line, number).map_err(|e| format!("line {number}: {e}"))?;
            lines.push(signer);
        }
        if lines.is_empty() {
            return Err("lists no signer; add a line such as `ci@example.org ssh-ed25519 AAAA...` (the principal, then the signer's public key as in its .pub file)".to_owned());
        }
        Ok(AllowedSigners { lines })
    }

    /// Reads and parses the file at `path`; the error says what is wrong
    /// and how to fix it (not naming the file, which the caller does).
    pub fn read(path: &std::path::Path) -> Result<AllowedSigners, String> {
        use std::io::Read as _;
        let mut bytes = Vec::new();
        // A regular file only: a pipe there would hold a reload forever.
        std::fs::metadata(path)
            .and_then(|m| {
                if m.is_file() {
                    Ok(())
                } else {
                    Err(std::io::Error::other("not a regular file"))
                }
            })
            .and_then(|()| std::fs::File::open(path))
            .and_then(|file| {
                file.take(MAX_ALLOWED_SIGNERS_BYTES as u64 + 1)
                    .read_to_end(&mut bytes)
            })
            .map_err(|e| {
                format!(
                    "cannot read it: {e}; create the file (OpenSSH allowed_signers format: `principal keytype base64-key` per line) or fix the path"
                )
            })?;
        if bytes.len() > MAX_ALLOWED_SIGNERS_BYTES {
            return Err(format!(
                "larger than {MAX_ALLOWED_SIGNERS_BYTES} bytes; it should list public keys, one per line"
            ));
        }
        let text = String::from_utf8(bytes).map_err(|e| {
            format!(
                "not valid UTF-8 (byte {}); save it as UTF-8",
                e.utf8_error().valid_up_to()
            )
        })?;
        AllowedSigners::parse(&text)
    }

    /// The lines that list `key`, in file order.
    pub fn lines_for<'a>(&'a self, key: &'a KeyData) -> impl Iterator<Item = &'a SignerLine> {
        self.lines.iter().filter(move |l| &l.key == key)
    }
}

fn parse_line(line: &str, number: usize) -> Result<SignerLine, String> {
    let (principals, rest) = token(line);
    let principals: Vec<String> = unquote(principals).split(',').map(str::to_owned).collect();
    if principals.iter().any(String::is_empty) {
        return Err("an empty principal; write principals as a comma-separated list without spaces, such as `ci@a.example,ci@b.example`".to_owned());
    }
    let rest = rest.trim_start();
    if rest.is_empty() {
        return Err("a principal without a key; add the signer's public key (as in its .pub file) after the principal".to_owned());
    }
    // Options come between the principals and the key, unless the next
    // word already is a key type.
    let (options, key_text) = if is_key_type(first_word(rest)) {
        ("", rest)
    } else {
        let (options, rest) = options_token(rest)?;
        (options, rest.trim_start())
    };
    let (mut namespaces, mut valid_after, mut valid_before) = (None, None, None);
    for option in split_options(options) {
        let (name, value) = match option.split_once('=') {
            Some((name, value)) => (name, Some(unquote(value))),
            None => (option, None),
        };
        match (name.to_ascii_lowercase().as_str(), value) {
            ("cert-authority", _) => {
                return Err("cert-authority (a key that signs SSH certificates) is not supported; list each signer's own public key instead".to_owned());
            }
            ("namespaces", Some(list)) => {
                namespaces = Some(list.split(',').map(str::to_owned).collect());
            }
            ("valid-after", Some(time)) => valid_after = Some(parse_time(time)?),
            ("valid-before", Some(time)) => valid_before = Some(parse_time(time)?),
            (name, _) => {
                return Err(format!(
                    "unknown or incomplete option {name:?}; the options are namespaces=\"...\", valid-after=\"...\" and valid-before=\"...\""
                ));
            }
        }
    }
    Ok(SignerLine {
        line: number,
        principals,
        key: parse_key(key_text)?,
        namespaces,
        valid_after,
        valid_before,
    })
}

/// The first whitespace-separated word of `text` (a quoted one whole) and
/// the rest.
fn token(text: &str) -> (&str, &str) {
    let mut quoted = false;
    for (i, c) in text.char_indices() {
        match c {
            '"' => quoted = !quoted,
            c if c.is_whitespace() && !quoted => return (&text[..i], &text[i..]),
            _ => {}
        }
    }
    (text, "")
}

/// The options word: up to the first whitespace outside quotes.
fn options_token(text: &str) -> Result<(&str, &str), String> {
    let (options, rest) = token(text);
    if options.matches('"').count() % 2 == 1 {
        return Err("an option's quotes are not closed".to_owned());
    }
    if rest.trim().is_empty() {
        return Err(format!(
            "{:?} is neither a key type nor followed by a key; a line is `principals [options] keytype base64-key`",
            first_word(text)
        ));
    }
    Ok((options, rest))
}

fn first_word(text: &str) -> &str {
    text.split_whitespace().next().unwrap_or_default()
}

/// The options, split at commas outside quotes.
fn split_options(options: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut quoted) = (0, false);
    for (i, c) in options.char_indices() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => {
                out.push(&options[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if start < options.len() {
        out.push(&options[start..]);
    }
    out
}

fn unquote(text: &str) -> &str {
    text.strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or(text)
}

fn is_key_type(word: &str) -> bool {
    word.starts_with("ssh-")
        || word.starts_with("ecdsa-sha2-")
        || word.starts_with("sk-")
        || word.contains("-cert-v01@openssh.com")
}

/// The key of a line (`keytype base64 [comment]`), of a type that
/// signatures can be checked with.
fn parse_key(text: &str) -> Result<KeyData, String> {
    let kind = first_word(text);
    if kind.contains("-cert-v01@") {
        return Err(format!(
            "{kind} is a certificate; list the signer's own public key instead"
        ));
    }
    let key = PublicKey::from_openssh(text)
        .map_err(|e| format!("the key cannot be read ({e}); copy the whole line of the signer's .pub file (type, then base64)"))?;
    match key.algorithm() {
        Algorithm::Ed25519
        | Algorithm::Rsa { .. }
        | Algorithm::Ecdsa {
            curve: EcdsaCurve::NistP256 | EcdsaCurve::NistP384,
        } => Ok(key.key_data().clone()),
        // OpenSSH requires a FIDO key's touch flag unless a line says
        // otherwise; the verifier used here does not look at it.
        Algorithm::SkEd25519 | Algorithm::SkEcdsaSha2NistP256 => Err(format!(
            "{} (FIDO security key) signers are not supported; use an ed25519, ecdsa or rsa key",
            key.algorithm().as_str()
        )),
        other => Err(format!(
            "{} keys are not supported; use an ed25519, ecdsa (nistp256 or nistp384) or rsa key",
            other.as_str()
        )),
    }
}

/// `valid-after`/`valid-before`: `YYYYMMDD[HHMM[SS]]Z`, in UTC.
fn parse_time(text: &str) -> Result<OffsetDateTime, String> {
    let bad = || {
        format!(
            "time {text:?} is not YYYYMMDD[HHMM[SS]]Z; write it in UTC with a trailing Z, such as 20270101Z or 202701011200Z"
        )
    };
    let Some(digits) = text.strip_suffix(['Z', 'z']) else {
        return Err(format!(
            "time {text:?} has no trailing Z; write it in UTC with a Z (such as {text}Z), since a time without Z would depend on the time zone of the machine that checks it"
        ));
    };
    if !digits.bytes().all(|b| b.is_ascii_digit()) || ![8, 12, 14].contains(&digits.len()) {
        return Err(bad());
    }
    let number = |range: std::ops::Range<usize>| -> u32 {
        digits
            .get(range)
            .and_then(|s| s.parse().ok())
            .unwrap_or_default()
    };
    let month =
        Month::try_from(u8::try_from(number(4..6)).map_err(|_| bad())?).map_err(|_| bad())?;
    let date = Date::from_calendar_date(
        i32::try_from(number(0..4)).map_err(|_| bad())?,
        month,
        u8::try_from(number(6..8)).map_err(|_| bad())?,
    )
    .map_err(|_| bad())?;
    let byte = |range| u8::try_from(number(range)).map_err(|_| bad());
    let time = Time::from_hms(byte(8..10)?, byte(10..12)?, byte(12..14)?).map_err(|_| bad())?;
    Ok(PrimitiveDateTime::new(date, time).assume_utc())
}

/// Whether `name` matches the OpenSSH pattern list `patterns` (`*` and `?`
/// wildcards; a pattern starting with `!` that matches excludes the name).
pub fn matches_list(name: &str, patterns: &[String]) -> bool {
    let mut found = false;
    for pattern in patterns {
        if let Some(negated) = pattern.strip_prefix('!') {
            if matches(name.as_bytes(), negated.as_bytes()) {
                return false;
            }
        } else if matches(name.as_bytes(), pattern.as_bytes()) {
            found = true;
        }
    }
    found
}

/// Whether `name` matches `pattern` (`*`: any run, `?`: any one byte), in
/// at most `name.len() × pattern.len()` steps: on a mismatch only the last
/// star seen takes one more byte (an earlier star could only take bytes
/// the last one can). Trying every run for every star took time
/// exponential in the stars: a 21-byte pattern of them held one signature
/// check for 9 s, 40 for longer than any agent runs.
fn matches(name: &[u8], pattern: &[u8]) -> bool {
    let (mut n, mut p) = (0, 0);
    // After the last star: where its pattern goes on, and where in `name`
    // it has taken bytes up to.
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        match pattern.get(p) {
            Some(b'*') => {
                p += 1;
                star = Some((p, n));
            }
            Some(&c) if c == b'?' || c == name[n] => {
                p += 1;
                n += 1;
            }
            _ => match star {
                Some((after, taken)) => {
                    p = after;
                    n = taken + 1;
                    star = Some((after, n));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    const ED: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEjZgHxsZ3v3O3OKm2T7sPVzQSyovVa8VHiiPkeFALIW";
    const P521: &str = "ecdsa-sha2-nistp521 AAAAE2VjZHNhLXNoYTItbmlzdHA1MjEAAAAIbmlzdHA1MjEAAACFBABuRVRVegtzP9Dw3MsKCGANmmbxehS/AWHfhw7uOXJ3SCBe0ic+gBTWWgfugELnYfY3jvc1KYNNMPqpuWhi3nY/+AA3pXCH1DxMctuR0of+d8LLfgKPmbFcyB0XU9ax7Jyge/dlv4rcYA3EE8FPFwPV45oUa+H8ToJ7U3JWOck44dE/2g==";

    #[test]
    fn lines_are_read_as_openssh_writes_them() {
        let text = format!(
            "# signers\n\nci@a,ci@b {ED} deploy key\nops@x namespaces=\"git,distributor\",valid-after=\"20260101Z\",valid-before=\"202701011230Z\" {ED}\n\"quoted@p\" {ED}\n"
        );
        let signers = AllowedSigners::parse(&text).unwrap();
        assert_eq!(signers.lines.len(), 3);
        let [first, second, third] = &signers.lines[..] else {
            panic!()
        };
        assert_eq!(first.principals, ["ci@a", "ci@b"]);
        assert_eq!(first.line, 3);
        assert_eq!(first.namespaces, None);
        assert_eq!(
            second.namespaces.as_deref(),
            Some(&["git".to_owned(), "distributor".to_owned()][..])
        );
        assert_eq!(
            second.valid_after.unwrap(),
            time::macros::datetime!(2026-01-01 00:00 UTC)
        );
        assert_eq!(
            second.valid_before.unwrap(),
            time::macros::datetime!(2027-01-01 12:30 UTC)
        );
        assert_eq!(third.principals, ["quoted@p"]);
        assert_eq!(signers.lines_for(&first.key).count(), 3);
    }

    #[test]
    fn bad_lines_are_refused_naming_the_line_and_the_fix() {
        let cases = [
            (
                format!("ci@a cert-authority {ED}"),
                "line 1: cert-authority",
            ),
            (
                format!("ci@a valid-after=\"20260101\" {ED}"),
                "no trailing Z",
            ),
            (
                format!("ci@a valid-after=\"2026-01-01Z\" {ED}"),
                "not YYYYMMDD",
            ),
            (
                format!("ci@a valid-after=\"20261301Z\" {ED}"),
                "not YYYYMMDD",
            ),
            (
                format!("ci@a permit-pty {ED}"),
                "unknown or incomplete option",
            ),
            ("ci@a".to_owned(), "a principal without a key"),
            (
                "ci@a ssh-ed25519 AAAA!!".to_owned(),
                "the key cannot be read",
            ),
            (format!(",ci@a {ED}"), "an empty principal"),
            (
                "ci@a namespaces=\"x {ED}".to_owned(),
                "quotes are not closed",
            ),
            ("\n# only a comment\n".to_owned(), "lists no signer"),
            (format!("ci@a {P521}"), "not supported"),
            (
                "ci@a sk-ssh-ed25519@openssh.com AAAAGnNrLXNzaC1lZDI1NTE5QG9wZW5zc2guY29tAAAAIAABAgMEBQYHCAkKCwwNDg8QERITFBUWFxgZGhscHR4fAAAABHNzaDo=".to_owned(),
                "FIDO security key",
            ),
        ];
        for (text, wanted) in cases {
            let e = AllowedSigners::parse(&text).unwrap_err();
            assert!(e.contains(wanted), "{text:?}: {e}");
        }
    }

    #[test]
    fn pattern_lists_match_as_openssh_does() {
        let list = |s: &str| s.split(',').map(str::to_owned).collect::<Vec<_>>();
        let cases = [
            ("distributor", "distributor", true),
            ("distributor", "git,distributor", true),
            ("distributor", "git", false),
            ("distributor", "dist*", true),
            ("distributor", "distribut?r", true),
            ("distributor", "*,!distributor", false),
            ("distributor", "!git", false),
            ("distributor", "d*r,!git", true),
            ("distributor", "distributo", false),
            ("distributor", "*t*t*r", true),
            ("distributor", "*t*t*t*r", false),
            ("distributor", "d**?", true),
            ("", "**", true),
            ("", "*?", false),
        ];
        for (name, patterns, wanted) in cases {
            assert_eq!(
                matches_list(name, &list(patterns)),
                wanted,
                "{name} in {patterns}"
            );
        }
    }

    /// Found by fuzzing `allowed_signers` (docs/reliability.md): a
    /// `namespaces=` pattern of many stars that does not match took time
    /// exponential in the stars (matching each star against every run),
    /// so one such line held every signature check of its pipeline for
    /// hours. It is now decided in a step per byte of name and pattern.
    #[test]
    fn a_pattern_of_many_stars_is_decided_at_once() {
        let stars = "*".repeat(200);
        let text = format!("ci@a namespaces=\"{stars}x,{stars}?{stars}\" {ED}");
        let signers = AllowedSigners::parse(&text).unwrap();
        let namespaces = signers.lines[0].namespaces.as_ref().unwrap();
        assert!(!matches_list("distributor", &namespaces[..1]));
        assert!(matches_list("distributor", namespaces));
        assert!(!matches_list("", namespaces));
    }
}
