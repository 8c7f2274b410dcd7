//! Output helpers shared by the commands: a run report as text or JSON, and
//! ages rounded for people.

use crate::report::RunReport;
use std::time::Duration;

/// Prints a run report: the JSON document, or the text summary (every
/// file too when `verbose`).
pub(super) fn print_report(report: &RunReport, json: bool, verbose: bool, elapsed: Duration) {
    if json {
        print!("{}", report.to_json());
    } else {
        print!("{}", report.to_text(verbose, elapsed));
    }
}

/// A rough age for people: seconds, minutes, hours or days.
pub(super) fn human_age(seconds: i64) -> String {
    let s = seconds.max(0);
    match s {
        0..120 => format!("{s}s"),
        120..7_200 => format!("{}m", s / 60),
        7_200..172_800 => format!("{}h", s / 3_600),
        _ => format!("{}d", s / 86_400),
    }
}

pub(super) use crate::text::wording::human_time;
