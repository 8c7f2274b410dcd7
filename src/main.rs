use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = distributor::cli::Cli::parse();
    distributor::logging::init();
    ExitCode::from(distributor::cli::run(cli))
}
