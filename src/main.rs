use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = distributor::cli::Cli::parse();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    ExitCode::from(distributor::cli::run(cli))
}
