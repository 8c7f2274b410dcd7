//! Unit tests of the command line's output helpers.

use super::output::human_age;

#[test]
fn ages_round_to_a_readable_unit() {
    for (secs, text) in [
        (-5, "0s"),
        (59, "59s"),
        (119, "119s"),
        (120, "2m"),
        (7_243, "2h"),
        (200_000, "2d"),
    ] {
        assert_eq!(human_age(secs), text);
    }
}
