//! The names the agent makes from a producer's bundle name: `<name>.1`
//! when the name is taken, `<name>.json` for the agent's copy of a failed
//! result. A producer may use a name of the longest length a folder entry
//! may have (255 bytes), so every derived name is cut to fit: the start of
//! the name up to a UTF-8 character boundary, then `~` and 16 hex digits of
//! the SHA-256 of the whole name (so that long names with one start stay
//! apart), then the suffix. Pure: no file system access.

use sha2::{Digest, Sha256};

/// The longest name of a folder entry (`NAME_MAX` on Linux), in bytes.
pub const NAME_MAX: usize = 255;

/// Added to a failed bundle's name for the agent's copy of its result.
pub const KEPT_SUFFIX: &str = ".json";

/// The longest name a bundle gets in `failed/`: room is left for
/// [`KEPT_SUFFIX`], so the agent's copy of its result always has a name.
pub const FAILED_NAME_MAX: usize = NAME_MAX - KEPT_SUFFIX.len();

/// `~` and 16 hex digits.
const TAG_LEN: usize = 17;

/// `name` followed by `suffix`, in at most `max` bytes: unchanged when it
/// fits, else the longest start of `name` that ends on a character
/// boundary and leaves room for `~<hash>` and `suffix`.
pub fn fit(name: &str, suffix: &str, max: usize) -> String {
    if name.len() + suffix.len() <= max {
        return format!("{name}{suffix}");
    }
    let digest = Sha256::digest(name.as_bytes());
    let tag: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    let room = max.saturating_sub(suffix.len() + TAG_LEN);
    let mut cut = room.min(name.len());
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}~{tag}{suffix}", &name[..cut])
}

/// The `n`th name tried for `name` in a folder whose names may be `max`
/// bytes long: the name itself (fitted), then `.1`, `.2`, … appended.
pub fn candidate(name: &str, n: u32, max: usize) -> String {
    if n == 0 {
        fit(name, "", max)
    } else {
        fit(name, &format!(".{n}"), max)
    }
}

/// The longest suffix [`candidate`] appends: `.` and the ten digits of
/// the largest `u32`.
const LONGEST_INDEX: usize = 11;

/// A start of `name` that every [`candidate`] of it in `max` bytes
/// begins with: the name itself when even its longest suffix fits, else
/// the part of it that the most cut candidate keeps. A listing from it
/// finds every name a bundle of that name can have taken.
pub fn stem(name: &str, max: usize) -> &str {
    if name.len() + LONGEST_INDEX <= max {
        return name;
    }
    let mut cut = max.saturating_sub(LONGEST_INDEX + TAG_LEN).min(name.len());
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    &name[..cut]
}

/// Which [`candidate`] of `name` in `max` bytes `taken` is, if it is one.
pub fn index_of(name: &str, taken: &str, max: usize) -> Option<u32> {
    if taken == candidate(name, 0, max) {
        return Some(0);
    }
    let (_, digits) = taken.rsplit_once('.')?;
    let n = digits.parse::<u32>().ok().filter(|n| *n > 0)?;
    (candidate(name, n, max) == taken).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(name: &str) -> String {
        let digest = Sha256::digest(name.as_bytes());
        digest[..8].iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn derived_names_fit_and_cut_on_a_character_boundary() {
        let ascii = "a".repeat(255);
        // 1 + 127 × 2 bytes: every cut falls next to a two-byte character.
        let accents = format!("r{}", "é".repeat(127));
        // Four-byte characters: a cut may fall inside one at three offsets.
        let emoji = "🦀".repeat(63);
        let cases: &[(&str, &str, usize, &str)] = &[
            ("short", "", NAME_MAX, "short"),
            ("short", ".1", NAME_MAX, "short.1"),
            ("short", KEPT_SUFFIX, NAME_MAX, "short.json"),
            (&ascii, "", NAME_MAX, &ascii),
            (&accents, "", NAME_MAX, &accents),
            (&ascii[..250], "", FAILED_NAME_MAX, &ascii[..250]),
        ];
        for (name, suffix, max, want) in cases {
            assert_eq!(fit(name, suffix, *max), *want, "{name:?}{suffix}");
        }
        for name in [&ascii, &accents, &emoji] {
            for (suffix, max) in [
                (".1", NAME_MAX),
                (".4294967295", NAME_MAX),
                ("", FAILED_NAME_MAX),
                (KEPT_SUFFIX, NAME_MAX),
                (".7", FAILED_NAME_MAX),
            ] {
                if name.len() + suffix.len() <= max {
                    continue;
                }
                let got = fit(name, suffix, max);
                assert!(got.len() <= max, "{} > {max}: {got}", got.len());
                assert!(got.len() + 4 > max, "cut more than needed: {got}");
                let (start, rest) = got.split_once('~').expect("a tag");
                assert!(name.starts_with(start), "{got}");
                assert_eq!(rest, format!("{}{suffix}", tag(name)));
            }
        }
    }

    #[test]
    fn long_names_that_share_a_start_stay_apart() {
        let common = "x".repeat(250);
        let a = format!("{common}aaaaa");
        let b = format!("{common}bbbbb");
        for (suffix, max) in [
            ("", FAILED_NAME_MAX),
            (".1", NAME_MAX),
            (KEPT_SUFFIX, NAME_MAX),
        ] {
            assert_ne!(fit(&a, suffix, max), fit(&b, suffix, max), "{suffix}");
        }
        // And one name's candidates are all different.
        let names: std::collections::BTreeSet<String> =
            (0..50).map(|n| candidate(&a, n, FAILED_NAME_MAX)).collect();
        assert_eq!(names.len(), 50);
        assert_eq!(candidate("b", 0, NAME_MAX), "b");
        assert_eq!(candidate("b", 2, NAME_MAX), "b.2");
    }

    #[test]
    fn every_candidate_starts_with_the_stem_and_is_told_by_its_index() {
        let long = "n".repeat(250);
        let accents = format!("r{}", "é".repeat(127));
        for name in [
            "x",
            "report.1",
            &"y".repeat(244),
            &"z".repeat(245),
            &long,
            &accents,
        ] {
            let stem = stem(name, NAME_MAX);
            for n in [0, 1, 2, 9, 10, 999, 1000, 123_456, u32::MAX] {
                let c = candidate(name, n, NAME_MAX);
                assert!(c.starts_with(stem), "{c} does not start with {stem}");
                assert_eq!(index_of(name, &c, NAME_MAX), Some(n), "{c}");
            }
        }
        // (name, a name below done/, which candidate it is)
        let cases: &[(&str, &str, Option<u32>)] = &[
            ("x", "x", Some(0)),
            ("x", "x.1", Some(1)),
            ("x", "x.01", None),
            ("x", "x.0", None),
            ("x", "x.-1", None),
            ("x", "x.1.2", None),
            ("x", "xy", None),
            ("x", "x-2026", None),
            ("report.1", "report.1", Some(0)),
            ("report.1", "report.1.1", Some(1)),
            ("report", "report.1", Some(1)),
        ];
        for (name, taken, want) in cases {
            assert_eq!(index_of(name, taken, NAME_MAX), *want, "{name} {taken}");
        }
    }
}
