//! The value syntaxes of the config file: durations (`250ms`, `7d`) and
//! `prefix` templates. Pure text functions; they know nothing of YAML.

use std::time::Duration;

use crate::paths::{self, RelPath};

/// Parses `<integer><unit>` with unit `ms`, `s`, `m`, `h` or `d`
/// (`250ms`, `0s`, `7d`). No sign, spaces, fractions or compound forms.
/// Parses a size: a whole number followed by `B`, `KiB`, `MiB`, `GiB` or
/// `TiB` (docs/contract.md §12.3).
pub fn parse_size(text: &str) -> Result<u64, String> {
    const HINT: &str =
        "write a whole number followed by B, KiB, MiB, GiB or TiB, such as 4MiB or 16GiB";
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = text.split_at(digits);
    if number.is_empty() {
        return Err(format!(
            "{text:?} is not a size: it must start with a digit; {HINT}"
        ));
    }
    let shift = match unit {
        "B" => 0,
        "KiB" => 10,
        "MiB" => 20,
        "GiB" => 30,
        "TiB" => 40,
        "" => return Err(format!("{text:?} is not a size: it has no unit; {HINT}")),
        "KB" | "MB" | "GB" | "TB" | "kB" | "K" | "M" | "G" | "T" | "k" | "b" => {
            return Err(format!(
                "{text:?} is not a size: units are binary and spelled out ({}); {HINT}",
                match unit.chars().next() {
                    Some('K' | 'k') => "KiB",
                    Some('M') => "MiB",
                    Some('G') => "GiB",
                    Some('T') => "TiB",
                    _ => "B",
                }
            ));
        }
        _ => {
            return Err(format!(
                "{text:?} is not a size: unknown unit {unit:?}; {HINT}"
            ));
        }
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1u64 << shift))
        .ok_or_else(|| format!("{text:?} is too large a size; {HINT}"))
}

/// Formats a size the way the config writes it, in the largest unit that
/// divides it (`4MiB`, `1500B`).
pub fn format_size(bytes: u64) -> String {
    for (shift, unit) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if bytes != 0 && bytes.is_multiple_of(1u64 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    format!("{bytes}B")
}

pub fn parse_duration(text: &str) -> Result<Duration, String> {
    const HINT: &str =
        "write a whole number followed by ms, s, m, h or d, such as 250ms, 30s or 7d";
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = text.split_at(digits);
    if number.is_empty() {
        return Err(format!(
            "{text:?} is not a duration: it must start with a digit; {HINT}"
        ));
    }
    let seconds_per_unit: Option<u64> = match unit {
        "ms" => None,
        "s" => Some(1),
        "m" => Some(60),
        "h" => Some(60 * 60),
        "d" => Some(24 * 60 * 60),
        "" => {
            return Err(format!(
                "{text:?} is not a duration: it has no unit; {HINT}"
            ));
        }
        _ if unit.starts_with(['.', ',']) => {
            return Err(format!(
                "{text:?} is not a duration: fractions are not allowed, use a smaller unit (1500ms rather than 1.5s); {HINT}"
            ));
        }
        _ if unit.contains(char::is_whitespace) => {
            return Err(format!(
                "{text:?} is not a duration: it contains a space; {HINT}"
            ));
        }
        _ => {
            return Err(format!(
                "{text:?} is not a duration: unknown unit {unit:?}; {HINT}"
            ));
        }
    };
    let too_large = || format!("{text:?} is too large for a duration");
    let n: u64 = number.parse().map_err(|_| too_large())?;
    match seconds_per_unit {
        None => Ok(Duration::from_millis(n)),
        Some(factor) => n
            .checked_mul(factor)
            .map(Duration::from_secs)
            .ok_or_else(too_large),
    }
}

/// Writes a duration the way the config spells it, in the largest unit that
/// represents it exactly (`250ms`, `60s` stays `1m`, `0s`).
pub fn format_duration(duration: Duration) -> String {
    let ms = duration.as_millis();
    if ms == 0 {
        return "0s".to_owned();
    }
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1000),
    ] {
        if ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

/// The placeholders a `prefix` template may use.
pub const PREFIX_PLACEHOLDERS: [&str; 6] = ["source_id", "pipeline_id", "date", "yyyy", "mm", "dd"];

/// Expands a `prefix` template (docs/contract.md §4, §11.5, §11.17).
///
/// An empty template gives "". Otherwise placeholders are replaced (dates
/// use the UTC date of `created_utc`), one trailing `/` is dropped, and the
/// rest must be a clean relative path without reserved segments. The result
/// has no trailing slash; callers join `prefix/path`.
pub fn expand_prefix(
    template: &str,
    source_id: &str,
    pipeline_id: &str,
    created_utc: time::OffsetDateTime,
) -> Result<String, String> {
    if template.is_empty() {
        return Ok(String::new());
    }
    let utc = created_utc
        .checked_to_offset(time::UtcOffset::UTC)
        .ok_or_else(|| format!("the creation time {created_utc} has no UTC date"))?;
    let (year, month, day) = (utc.year(), u8::from(utc.month()), utc.day());

    let mut out = String::with_capacity(template.len() + source_id.len());
    let mut rest = template;
    while let Some(i) = rest.find(['{', '}']) {
        out.push_str(&rest[..i]);
        if rest[i..].starts_with('}') {
            return Err(format!(
                "prefix {template:?} has a '}}' without a matching '{{'; braces may only surround a placeholder ({})",
                placeholder_list()
            ));
        }
        let after = &rest[i + 1..];
        let Some(end) = after
            .find(['{', '}'])
            .filter(|&e| after[e..].starts_with('}'))
        else {
            return Err(format!(
                "prefix {template:?} has a '{{' that is not closed by '}}'; braces may only surround a placeholder ({})",
                placeholder_list()
            ));
        };
        match &after[..end] {
            "source_id" => out.push_str(source_id),
            "pipeline_id" => out.push_str(pipeline_id),
            "date" => out.push_str(&format!("{year:04}-{month:02}-{day:02}")),
            "yyyy" => out.push_str(&format!("{year:04}")),
            "mm" => out.push_str(&format!("{month:02}")),
            "dd" => out.push_str(&format!("{day:02}")),
            other => {
                return Err(format!(
                    "prefix {template:?} uses the unknown placeholder {{{other}}}; use {}",
                    placeholder_list()
                ));
            }
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);

    let trimmed = out.strip_suffix('/').unwrap_or(&out);
    let path = RelPath::parse(trimmed).map_err(|e| {
        format!("prefix {template:?} expands to {out:?}, which is not a clean relative path: {e}")
    })?;
    if path.is_reserved() {
        return Err(format!(
            "prefix {template:?} expands to {out:?}, which uses a name starting with {:?}; those are reserved for the tool",
            paths::RESERVED_PREFIX
        ));
    }
    Ok(path.as_str().to_owned())
}

fn placeholder_list() -> String {
    PREFIX_PLACEHOLDERS
        .iter()
        .map(|p| format!("{{{p}}}"))
        .collect::<Vec<_>>()
        .join(", ")
}
