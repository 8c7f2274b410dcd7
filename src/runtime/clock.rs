//! The clock: the current time as the catalog and the plans record it. It
//! owns nothing else; planning never reads it (`now` is an input there).

use time::OffsetDateTime;

/// The current time, truncated to milliseconds for readable catalogs.
pub fn now_millis() -> OffsetDateTime {
    let now = OffsetDateTime::now_utc();
    now.replace_nanosecond(now.nanosecond() / 1_000_000 * 1_000_000)
        .unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn now_is_whole_milliseconds_and_close_to_the_system_clock() {
        let before = OffsetDateTime::now_utc();
        let now = now_millis();
        assert_eq!(now.nanosecond() % 1_000_000, 0);
        assert!(now <= OffsetDateTime::now_utc());
        assert!(before - now < time::Duration::milliseconds(1));
    }
}
