//! Output helpers shared by the commands: a run report as text or JSON, and
//! ages rounded for people.

use crate::report::RunReport;

pub(super) fn print_report(report: &RunReport, json: bool) {
    if json {
        print!("{}", report.to_json());
    } else {
        print!("{}", report.to_text());
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
