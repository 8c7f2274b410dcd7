//! How a message names things: a long list named in part. Used by the
//! reports, the signature checks and planning's refusals alike.

/// The first `shown` of `items` joined with `sep`, then "and N more" for
/// the rest: how a message names a long list without printing it whole.
pub fn first_few<T: std::fmt::Display>(items: &[T], shown: usize, sep: &str) -> String {
    let named: Vec<String> = items.iter().take(shown).map(ToString::to_string).collect();
    let mut text = named.join(sep);
    if items.len() > shown {
        text.push_str(&format!(" and {} more", items.len() - shown));
    }
    text
}

/// An RFC 3339 time as people read it in text output: to the second, in
/// UTC (`2026-06-04 11:55:00 UTC`), one form on every screen; the text as
/// it is when it does not parse. JSON keeps the full time.
pub fn human_time(rfc3339: &str) -> String {
    crate::catalog::parse_time(rfc3339)
        .ok()
        .and_then(|t| {
            let t = t.to_offset(time::UtcOffset::UTC);
            let format = time::macros::format_description!(
                "[year]-[month]-[day] [hour]:[minute]:[second] UTC"
            );
            t.format(&format).ok()
        })
        .unwrap_or_else(|| rfc3339.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lists_are_named_in_part() {
        let cases: &[(&[&str], &str)] = &[
            (&[], ""),
            (&["a"], "a"),
            (&["a", "b", "c"], "a; b; c"),
            (&["a", "b", "c", "d"], "a; b; c and 1 more"),
            (&["a", "b", "c", "d", "e", "f"], "a; b; c and 3 more"),
        ];
        for (items, want) in cases {
            assert_eq!(first_few(items, 3, "; "), *want, "{items:?}");
        }
    }
}
