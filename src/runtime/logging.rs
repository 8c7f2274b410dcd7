//! The logger: `env_logger` on stderr (`RUST_LOG`; by default `info` for
//! the agent and `run -v`, `warn` for every other command, whose own
//! output is its report). Under
//! systemd (`JOURNAL_STREAM` set, stderr connected to the journal) every
//! line starts with its syslog priority (`<3>` error, `<4>` warning, `<6>`
//! info, `<7>` debug and trace) so `journalctl -p err` can select by level,
//! and carries no timestamp of its own: the journal records one.

use crate::text::escape::inert;
use log::Level;
use std::io::Write as _;

/// Starts the logger for this process, at `default` unless `RUST_LOG`
/// says otherwise.
pub fn init(default: &str) {
    let mut builder =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default));
    // Messages carry names and error texts that producers choose: every
    // control character is escaped (docs/contract.md §12.7), so a line stays one line
    // and cannot rewrite an operator's terminal.
    if std::env::var_os("JOURNAL_STREAM").is_some() {
        builder.format(|buf, record| {
            let message = record.args().to_string();
            let line = journal_line(record.level(), record.target(), &inert(&message));
            buf.write_all(line.as_bytes())
        });
    } else {
        builder.format(|buf, record| {
            let message = record.args().to_string();
            writeln!(
                buf,
                "[{} {:<5} {}] {}",
                buf.timestamp(),
                record.level(),
                record.target(),
                inert(&message)
            )
        });
    }
    builder.init();
}

/// The syslog priority of a log level.
pub fn priority(level: Level) -> u8 {
    match level {
        Level::Error => 3,
        Level::Warn => 4,
        Level::Info => 6,
        Level::Debug | Level::Trace => 7,
    }
}

/// One record for the journal: `<P>target: message\n`, with the crate's
/// own `distributor::` left off the target. A message of several lines
/// gets the prefix on each, so no line loses its priority.
pub fn journal_line(level: Level, target: &str, message: &str) -> String {
    let p = priority(level);
    let target = target.strip_prefix("distributor::").unwrap_or(target);
    let mut out = String::with_capacity(message.len() + target.len() + 8);
    for (i, line) in message.split('\n').enumerate() {
        if i == 0 {
            out.push_str(&format!("<{p}>{target}: {line}\n"));
        } else {
            out.push_str(&format!("<{p}>{target}:   {line}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_level_gets_its_syslog_priority_and_no_timestamp() {
        let cases = [
            (
                Level::Error,
                "distributor::agent::process",
                "pipeline=p bundle=b failed at verify",
                "<3>agent::process: pipeline=p bundle=b failed at verify\n",
            ),
            (Level::Warn, "distributor::agent", "w", "<4>agent: w\n"),
            (
                Level::Info,
                "distributor::agent",
                "agent started",
                "<6>agent: agent started\n",
            ),
            (
                Level::Debug,
                "distributor::fs::lock",
                "d",
                "<7>fs::lock: d\n",
            ),
            (
                Level::Trace,
                "notify::inotify",
                "t",
                "<7>notify::inotify: t\n",
            ),
            (
                Level::Error,
                "distributor::config",
                "a\nb",
                "<3>config: a\n<3>config:   b\n",
            ),
        ];
        for (level, target, message, want) in cases {
            assert_eq!(journal_line(level, target, message), want);
        }
    }
}
