use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = distributor::cli::Cli::parse();
    if !matches!(cli.command, distributor::cli::Command::Agent { .. }) {
        die_quietly_on_a_closed_pipe();
    }
    // The agent logs what it does (info); a command prints its own report
    // and logs only warnings and errors beside it, unless `run -v` asks.
    let level = match &cli.command {
        distributor::cli::Command::Agent { .. } => "info",
        distributor::cli::Command::Run(args) if args.verbose => "info",
        _ => "warn",
    };
    distributor::runtime::logging::init(level);
    ExitCode::from(distributor::cli::run(cli))
}

/// A command whose reader has gone (`distributor status | head`) ends as
/// Unix tools do: killed by SIGPIPE at its next write, instead of Rust's
/// default (SIGPIPE ignored, then a panic on the failed write). The agent
/// keeps the default: a log reader that goes away must not kill it in the
/// middle of a publication.
fn die_quietly_on_a_closed_pipe() {
    // SAFETY: called before any other thread exists; setting a signal's
    // disposition to its default touches no memory of ours.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
