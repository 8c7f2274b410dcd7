//! The clock: the current time as the catalog and the plans record it
//! (planning never reads it: `now` is an input there), and [`Boot`], the
//! clock a lease is counted on.

use std::time::Duration;
use time::OffsetDateTime;

/// A point on the boot-time clock (`CLOCK_BOOTTIME`), which, unlike
/// [`std::time::Instant`] (`CLOCK_MONOTONIC`), also counts the time the
/// host spent suspended. A lease is counted on it: a holder resumed after
/// a suspension longer than its lease must count the lease as lapsed, as
/// every other agent does (docs/object-storage.md, "Intake").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Boot(Duration);

impl Boot {
    pub fn now() -> Boot {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
        let secs = u64::try_from(t.tv_sec).unwrap_or(0);
        let nanos = u32::try_from(t.tv_nsec).unwrap_or(0);
        Boot(Duration::new(secs, nanos))
    }

    /// The time since `self` (zero for a point not reached yet).
    pub fn elapsed(self) -> Duration {
        Boot::now().0.saturating_sub(self.0)
    }
}

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

    #[test]
    fn the_boot_clock_counts_at_least_what_the_monotonic_one_counts() {
        // The boot-time interval encloses the monotonic one.
        let boot = Boot::now();
        let mono = std::time::Instant::now();
        std::thread::sleep(Duration::from_millis(20));
        let m = mono.elapsed();
        let b = boot.elapsed();
        assert!(m >= Duration::from_millis(20), "{m:?}");
        assert!(b >= m, "{b:?} against {m:?}");
        assert!(Boot::now() > boot);
    }
}
