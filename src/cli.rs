//! The command line: parses arguments, calls the library, prints results
//! and maps them to exit codes (SPEC §9). The only module that prints.

use crate::bundle::{self, BundleError, SealError};
use crate::catalog::parse_time;
use crate::config::{self, Config};
use crate::maintain::{self, MaintainError, Target};
use crate::publish::now_millis;
use crate::publish::{self, Options};
use crate::report::{RunReport, Stage};
use crate::spool::{self, Folder, Spool};
use clap::{Args, Parser, Subcommand};
use std::path::{Path, PathBuf};

/// Exit code for success.
pub const EXIT_OK: u8 = 0;
/// Exit code for runtime failures, invalid bundles and problems found.
pub const EXIT_FAILURE: u8 = 1;
/// Exit code for usage and configuration errors.
pub const EXIT_USAGE: u8 = 2;
/// Exit code for a publication refused by planning.
pub const EXIT_REFUSED: u8 = 3;

#[derive(Debug, Parser)]
#[command(
    name = "distributor",
    version,
    about = "Verify bundles against their manifests and publish them into catalogued destination roots",
    after_help = "Example:\n  distributor --config spool-example/config.yaml run --pipeline reports spool-example/bundles/report-1"
)]
pub struct Cli {
    /// Config file (default: $DISTRIBUTOR_CONFIG, else /etc/distributor/config.yaml)
    #[arg(long, global = true, value_name = "PATH")]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the spool agent (foreground; SIGTERM/SIGINT stop, SIGHUP reloads)
    #[command(
        after_help = "Example:\n  distributor --config /etc/distributor/config.yaml agent\n  distributor --config spool-example/config.yaml agent --once"
    )]
    Agent {
        /// Process work/ and every inbox once, then exit (0: all done, 1: some failed)
        #[arg(long)]
        once: bool,
    },
    /// Plan and publish one bundle folder in place (the folder is not moved)
    #[command(
        after_help = "Example:\n  distributor run --pipeline reports --dry-run ./bundles/report-1\n  distributor run --pipeline reports --destination site --force ./bundles/report-1"
    )]
    Run(RunArgs),
    /// Retention pruning of one owner's outputs
    #[command(
        after_help = "Example:\n  distributor prune --pipeline reports --destination archive --dry-run\n  distributor prune --pipeline reports --destination archive --apply"
    )]
    Prune {
        #[command(flatten)]
        target: TargetArgs,
        /// Report what would be deleted, change nothing
        #[arg(long, conflicts_with = "apply", required_unless_present = "apply")]
        dry_run: bool,
        /// Delete the selected outputs
        #[arg(long)]
        apply: bool,
        /// Print the result as JSON
        #[arg(long)]
        json: bool,
    },
    /// Drop catalog records whose file is gone; report unmanaged entries
    #[command(
        name = "reconcile-state",
        after_help = "Example:\n  distributor reconcile-state --pipeline reports --destination archive --dry-run"
    )]
    ReconcileState {
        #[command(flatten)]
        target: TargetArgs,
        /// Every record of the root, not only this owner's
        #[arg(long)]
        all_owners: bool,
        /// Report, change nothing
        #[arg(long)]
        dry_run: bool,
        /// Print the result as JSON
        #[arg(long)]
        json: bool,
    },
    /// Re-hash managed outputs; report missing and mismatched files (exit 1 if any)
    #[command(
        after_help = "Example:\n  distributor verify --pipeline reports --destination archive --all-owners"
    )]
    Verify {
        #[command(flatten)]
        target: TargetArgs,
        /// Every record of the root, not only this owner's
        #[arg(long)]
        all_owners: bool,
        /// Print the result as JSON
        #[arg(long)]
        json: bool,
    },
    /// List the catalog records of a destination root
    #[command(
        after_help = "Example:\n  distributor catalog --pipeline reports --destination archive --json"
    )]
    Catalog {
        #[command(flatten)]
        target: TargetArgs,
        /// Print the records as JSON
        #[arg(long)]
        json: bool,
    },
    /// Inspect spools; move a failed bundle back to the inbox
    #[command(subcommand)]
    Spool(SpoolCommand),
    /// One screen per pipeline: spool counts, oldest waiting bundle, last failure, catalog sizes
    #[command(after_help = "Example:\n  distributor --config /etc/distributor/config.yaml status")]
    Status {
        /// Print the summary as JSON
        #[arg(long)]
        json: bool,
    },
    /// Producer helpers: seal and verify bundles (no config needed)
    #[command(subcommand)]
    Bundle(BundleCommand),
    /// Configuration helpers
    #[command(subcommand)]
    Config(ConfigCommand),
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Pipeline whose destinations receive the bundle
    #[arg(long, value_name = "P")]
    pub pipeline: String,
    /// Only these destinations (repeatable; default: all of the pipeline)
    #[arg(long = "destination", value_name = "D")]
    pub destinations: Vec<String>,
    /// Plan and report, change nothing
    #[arg(long)]
    pub dry_run: bool,
    /// Replace everything in the named destinations' roots (needs --destination)
    #[arg(long)]
    pub force: bool,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
    /// The bundle folder (holding manifest.json)
    pub bundle_dir: PathBuf,
}

/// Selects one destination root.
#[derive(Debug, Args)]
pub struct TargetArgs {
    /// Pipeline id
    #[arg(long, value_name = "P")]
    pub pipeline: String,
    /// Destination id
    #[arg(long, value_name = "D")]
    pub destination: String,
}

#[derive(Debug, Subcommand)]
pub enum SpoolCommand {
    /// List bundles in the spools (oldest first)
    #[command(
        after_help = "Example:\n  distributor spool list --failed\n  distributor spool list --pipeline reports --json"
    )]
    List {
        /// Only this pipeline
        #[arg(long, value_name = "P")]
        pipeline: Option<String>,
        /// Only failed/
        #[arg(long, conflicts_with_all = ["done", "inbox"])]
        failed: bool,
        /// Only done/
        #[arg(long, conflicts_with = "inbox")]
        done: bool,
        /// Only inbox/
        #[arg(long)]
        inbox: bool,
        /// Print the list as JSON
        #[arg(long)]
        json: bool,
    },
    /// Move failed/NAME back into the inbox (clears its result and attempt count)
    #[command(after_help = "Example:\n  distributor spool retry reports weekly-2026-06-08")]
    Retry {
        /// Pipeline id
        pipeline: String,
        /// Bundle name as shown by `spool list --failed`
        name: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum BundleCommand {
    /// Hash every regular file under DIR and write DIR/manifest.json atomically
    #[command(
        after_help = "Example:\n  distributor bundle seal ./.staging-report --id reports.2026-06-04"
    )]
    Seal {
        dir: PathBuf,
        /// Source id (letters, digits, '.', '_', '-'; up to 128)
        #[arg(long)]
        id: String,
        /// RFC 3339 creation time (default: now)
        #[arg(long, value_name = "RFC3339")]
        created: Option<String>,
    },
    /// Check a bundle against its manifest and print every problem
    #[command(after_help = "Example:\n  distributor bundle verify ./inbox/report-1")]
    Verify {
        dir: PathBuf,
        /// Print the result as JSON
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Validate the config and print a summary
    #[command(
        after_help = "Example:\n  distributor --config /etc/distributor/config.yaml config check"
    )]
    Check {
        /// Print the summary as JSON
        #[arg(long)]
        json: bool,
    },
}

/// Runs a parsed command line and returns the process exit code.
pub fn run(cli: Cli) -> u8 {
    let config = cli.config.as_deref();
    match cli.command {
        Command::Agent { once } => agent(config, once),
        Command::Prune {
            target,
            apply,
            json,
            ..
        } => with_target(
            config,
            &target,
            |t| {
                maintain::prune(t, apply, now_millis()).map(|r| (r.to_text(), r.to_json(), EXIT_OK))
            },
            json,
        ),
        Command::ReconcileState {
            target,
            all_owners,
            dry_run,
            json,
        } => with_target(
            config,
            &target,
            |t| {
                maintain::reconcile(t, all_owners, dry_run)
                    .map(|r| (r.to_text(), r.to_json(), EXIT_OK))
            },
            json,
        ),
        Command::Verify {
            target,
            all_owners,
            json,
        } => with_target(
            config,
            &target,
            |t| {
                maintain::verify(t, all_owners).map(|r| {
                    let code = if r.ok { EXIT_OK } else { EXIT_FAILURE };
                    (r.to_text(), r.to_json(), code)
                })
            },
            json,
        ),
        Command::Catalog { target, json } => with_target(
            config,
            &target,
            |t| maintain::catalog(t).map(|r| (r.to_text(), r.to_json(), EXIT_OK)),
            json,
        ),
        Command::Spool(SpoolCommand::List {
            pipeline,
            failed,
            done,
            inbox,
            json,
        }) => {
            let folders: Vec<Folder> = if failed {
                vec![Folder::Failed]
            } else if done {
                vec![Folder::Done]
            } else if inbox {
                vec![Folder::Inbox]
            } else {
                vec![Folder::Inbox, Folder::Work, Folder::Done, Folder::Failed]
            };
            spool_list(config, pipeline.as_deref(), &folders, json)
        }
        Command::Status { json } => status(config, json),
        Command::Spool(SpoolCommand::Retry { pipeline, name }) => {
            spool_retry(config, &pipeline, &name)
        }
        Command::Run(args) => run_bundle(config, &args),
        Command::Bundle(BundleCommand::Seal { dir, id, created }) => {
            seal(&dir, &id, created.as_deref())
        }
        Command::Bundle(BundleCommand::Verify { dir, json }) => verify(&dir, json),
        Command::Config(ConfigCommand::Check { json }) => config_check(cli.config.as_deref(), json),
    }
}

fn load_config(flag: Option<&Path>) -> Result<Config, String> {
    let path = config::resolve_config_path(flag);
    config::load(&path).map_err(|e| e.to_string())
}

/// Loads the config, or prints why not and returns the usage exit code.
fn config_or_usage(flag: Option<&Path>) -> Result<Config, u8> {
    load_config(flag).map_err(|e| {
        eprintln!("error: {e}");
        EXIT_USAGE
    })
}

fn print_report(report: &RunReport, json: bool) {
    if json {
        print!("{}", report.to_json());
    } else {
        print!("{}", report.to_text());
    }
}

fn run_bundle(config_flag: Option<&Path>, args: &RunArgs) -> u8 {
    let fail_config = |message: String| {
        let report =
            RunReport::new(&args.pipeline, args.dry_run).fail(Stage::Config, message, false);
        if args.json {
            print_report(&report, true);
        } else {
            eprintln!("error: {}", report.error.as_deref().unwrap_or_default());
        }
        EXIT_USAGE
    };
    if args.force && args.destinations.is_empty() {
        return fail_config(
            "--force replaces everything in a destination root, so it must name the destination: add --destination D".to_owned(),
        );
    }
    let config = match load_config(config_flag) {
        Ok(c) => c,
        Err(e) => return fail_config(e),
    };
    let Some(pipeline) = config.pipeline(&args.pipeline) else {
        let known: Vec<&str> = config.pipelines.iter().map(|p| p.id.as_str()).collect();
        return fail_config(format!(
            "no pipeline {:?} in {}; configured pipelines: {}",
            args.pipeline,
            config.file.display(),
            if known.is_empty() {
                "none".to_owned()
            } else {
                known.join(", ")
            }
        ));
    };
    let mut destinations = Vec::new();
    if args.destinations.is_empty() {
        destinations.extend(pipeline.destinations.iter());
    } else {
        for id in &args.destinations {
            match pipeline.destination(id) {
                Some(d)
                    if !destinations
                        .iter()
                        .any(|x: &&config::Destination| x.id == d.id) =>
                {
                    destinations.push(d)
                }
                Some(_) => {}
                None => {
                    let known: Vec<&str> = pipeline
                        .destinations
                        .iter()
                        .map(|d| d.id.as_str())
                        .collect();
                    return fail_config(format!(
                        "pipeline {:?} has no destination {id:?}; its destinations: {}",
                        pipeline.id,
                        known.join(", ")
                    ));
                }
            }
        }
    }
    let options = Options {
        dry_run: args.dry_run,
        force: args.force,
        lock_timeout: config.agent.lock_timeout,
    };
    let started = std::time::Instant::now();
    let report = publish::publish(pipeline, &destinations, &args.bundle_dir, &options);
    for w in &report.warnings {
        log::warn!("{}: {w}", args.bundle_dir.display());
    }
    log::info!(
        "pipeline={} bundle={} {} elapsed_ms={}",
        pipeline.id,
        args.bundle_dir.display(),
        report.actions(),
        started.elapsed().as_millis()
    );
    print_report(&report, args.json);
    report.exit_code()
}

fn seal(dir: &Path, id: &str, created: Option<&str>) -> u8 {
    let created = match created.map(parse_time).transpose() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: invalid --created: {e}");
            return EXIT_USAGE;
        }
    };
    match bundle::seal(dir, id, created) {
        Ok(m) => {
            println!(
                "sealed {} ({} files, {})",
                dir.join(bundle::MANIFEST).display(),
                m.files.len(),
                m.digest
            );
            EXIT_OK
        }
        Err(e) => {
            eprintln!("error: {e}");
            match e {
                SealError::BadId { .. } | SealError::BadCreated { .. } => EXIT_USAGE,
                _ => EXIT_FAILURE,
            }
        }
    }
}

fn verify(dir: &Path, json: bool) -> u8 {
    let result = bundle::verify(dir);
    let (ok, problems, warnings, source) = match &result {
        Ok(b) => (
            true,
            Vec::new(),
            b.warnings.clone(),
            Some((
                b.manifest.id.clone(),
                b.manifest.digest.clone(),
                b.manifest.files.len(),
            )),
        ),
        Err(BundleError::Invalid { problems }) => (
            false,
            problems.iter().map(ToString::to_string).collect(),
            Vec::new(),
            None,
        ),
        Err(e) => (false, vec![e.to_string()], Vec::new(), None),
    };
    if json {
        let doc = serde_json::json!({
            "ok": ok,
            "bundle": dir.display().to_string(),
            "id": source.as_ref().map(|s| s.0.clone()),
            "digest": source.as_ref().map(|s| s.1.clone()),
            "problems": problems,
            "warnings": warnings,
        });
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else {
        match &source {
            Some((id, digest, n)) => {
                println!("ok: {} is bundle {id} ({n} files, {digest})", dir.display())
            }
            None => println!("invalid bundle {}:", dir.display()),
        }
        for p in &problems {
            println!("  problem: {p}");
        }
        for w in &warnings {
            println!("  warning: {w}");
        }
    }
    if ok { EXIT_OK } else { EXIT_FAILURE }
}

fn config_check(flag: Option<&Path>, json: bool) -> u8 {
    let config = match load_config(flag) {
        Ok(c) => c,
        Err(e) => {
            if json {
                let doc = serde_json::json!({"ok": false, "error": e});
                println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
            } else {
                eprintln!("error: {e}");
            }
            return EXIT_USAGE;
        }
    };
    if json {
        let pipelines: Vec<serde_json::Value> = config
            .pipelines
            .iter()
            .map(|p| {
                serde_json::json!({
                    "id": p.id,
                    "inbox": p.inbox.display().to_string(),
                    "destinations": p.destinations.iter().map(|d| serde_json::json!({
                        "id": d.id,
                        "workflow": d.workflow.as_str(),
                        "root": d.root.display().to_string(),
                        "prefix": d.prefix,
                        "publish_source": d.publish_source,
                        "publish_html": d.publish_html,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        let doc = serde_json::json!({
            "ok": true,
            "file": config.file.display().to_string(),
            "spool": config.spool.display().to_string(),
            "pipelines": pipelines,
            "warnings": config.warnings(),
        });
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else {
        print!("{}", config.summary());
    }
    EXIT_OK
}

fn agent(flag: Option<&Path>, once: bool) -> u8 {
    let path = config::resolve_config_path(flag);
    match crate::agent::run(&path, once) {
        Ok(true) => EXIT_OK,
        Ok(false) => EXIT_FAILURE,
        Err(e) => {
            log::error!("{e}");
            e.exit_code()
        }
    }
}

/// Loads the config, resolves `--pipeline`/`--destination`, runs `op` and
/// prints its text or JSON.
fn with_target(
    flag: Option<&Path>,
    args: &TargetArgs,
    op: impl FnOnce(&Target<'_>) -> Result<(String, String, u8), MaintainError>,
    json: bool,
) -> u8 {
    let config = match config_or_usage(flag) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let Some(pipeline) = config.pipeline(&args.pipeline) else {
        eprintln!(
            "error: no pipeline {:?} in {}; see `distributor config check`",
            args.pipeline,
            config.file.display()
        );
        return EXIT_USAGE;
    };
    let Some(destination) = pipeline.destination(&args.destination) else {
        eprintln!(
            "error: pipeline {:?} has no destination {:?}; see `distributor config check`",
            pipeline.id, args.destination
        );
        return EXIT_USAGE;
    };
    let target = Target {
        pipeline_id: &pipeline.id,
        destination,
        lock_timeout: config.agent.lock_timeout,
    };
    match op(&target) {
        Ok((text, json_text, code)) => {
            print!("{}", if json { json_text } else { text });
            code
        }
        Err(e) => {
            eprintln!("error: {e}");
            e.exit_code()
        }
    }
}

fn spool_list(flag: Option<&Path>, pipeline: Option<&str>, folders: &[Folder], json: bool) -> u8 {
    let config = match config_or_usage(flag) {
        Ok(c) => c,
        Err(code) => return code,
    };
    if let Some(id) = pipeline
        && config.pipeline(id).is_none()
    {
        eprintln!("error: no pipeline {id:?} in {}", config.file.display());
        return EXIT_USAGE;
    }
    let mut rows = Vec::new();
    for p in config
        .pipelines
        .iter()
        .filter(|p| pipeline.is_none_or(|id| id == p.id))
    {
        match spool::list(&Spool::of(&config, p), folders) {
            Ok(r) => rows.extend(r),
            Err(e) => {
                eprintln!("error: cannot list the spool of pipeline {}: {e}", p.id);
                return EXIT_FAILURE;
            }
        }
    }
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).unwrap_or_default()
        );
        return EXIT_OK;
    }
    if rows.is_empty() {
        println!("no bundles");
    }
    let now = time::OffsetDateTime::now_utc();
    for r in &rows {
        let age = crate::catalog::parse_time(&r.modified)
            .map(|t| human_age((now - t).whole_seconds()))
            .unwrap_or_default();
        let mut line = format!(
            "{:<8} {:<20} {:<40} {age:>6} ago",
            r.spool, r.pipeline_id, r.name
        );
        if let (Some(stage), Some(error)) = (&r.stage, &r.error) {
            line.push_str(&format!("  [{stage}] {error}"));
        } else if let Some(error) = &r.error {
            line.push_str(&format!("  {error}"));
        }
        println!("{line}");
    }
    EXIT_OK
}

fn spool_retry(flag: Option<&Path>, pipeline: &str, name: &str) -> u8 {
    let config = match config_or_usage(flag) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let Some(p) = config.pipeline(pipeline) else {
        eprintln!(
            "error: no pipeline {pipeline:?} in {}",
            config.file.display()
        );
        return EXIT_USAGE;
    };
    match spool::retry(&Spool::of(&config, p), name) {
        Ok(to) => {
            println!("moved {name} back to {}", to.display());
            EXIT_OK
        }
        Err(e) => {
            eprintln!("error: {e}");
            if e.kind() == std::io::ErrorKind::InvalidInput
                || e.kind() == std::io::ErrorKind::NotFound
            {
                EXIT_USAGE
            } else {
                EXIT_FAILURE
            }
        }
    }
}

fn status(flag: Option<&Path>, json: bool) -> u8 {
    let config = match config_or_usage(flag) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let now = time::OffsetDateTime::now_utc();
    let mut pipelines = Vec::new();
    for p in &config.pipelines {
        let spool = Spool::of(&config, p);
        let rows = match spool::list(
            &spool,
            &[Folder::Inbox, Folder::Work, Folder::Done, Folder::Failed],
        ) {
            Ok(rows) => rows,
            Err(e) => {
                eprintln!("error: cannot list the spool of pipeline {}: {e}", p.id);
                return EXIT_FAILURE;
            }
        };
        let count = |folder: Folder| rows.iter().filter(|r| r.spool == folder.as_str()).count();
        let oldest_waiting = rows
            .iter()
            .find(|r| r.spool == "inbox")
            .map(|r| r.modified.clone());
        let last_failure = rows.iter().rfind(|r| r.spool == "failed");
        let destinations: Vec<serde_json::Value> = p
            .destinations
            .iter()
            .map(|d| {
                let state = std::fs::read(d.root.join(crate::catalog::STATE_FILE))
                    .ok()
                    .map(|b| crate::catalog::State::parse(&b));
                let (state_text, outputs) = match &state {
                    None => ("no catalog".to_owned(), None),
                    Some(crate::catalog::State::Catalog(c)) => {
                        ("catalog".to_owned(), Some(c.outputs.len()))
                    }
                    Some(crate::catalog::State::Legacy { schema_version }) => {
                        (format!("legacy (schema {schema_version})"), None)
                    }
                    Some(crate::catalog::State::Future { schema_version }) => {
                        (format!("future (schema {schema_version})"), None)
                    }
                    Some(crate::catalog::State::Invalid { .. }) => ("invalid".to_owned(), None),
                    Some(crate::catalog::State::Absent) => ("no catalog".to_owned(), None),
                };
                serde_json::json!({
                    "destination_id": d.id,
                    "root": d.root.display().to_string(),
                    "workflow": d.workflow.as_str(),
                    "state": state_text,
                    "outputs": outputs,
                })
            })
            .collect();
        pipelines.push(serde_json::json!({
            "pipeline_id": p.id,
            "inbox": count(Folder::Inbox),
            "work": count(Folder::Work),
            "done": count(Folder::Done),
            "failed": count(Folder::Failed),
            "oldest_waiting": oldest_waiting,
            "last_failure": last_failure.map(|r| serde_json::json!({
                "name": r.name, "modified": r.modified, "stage": r.stage, "error": r.error,
            })),
            "destinations": destinations,
        }));
    }
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&pipelines).unwrap_or_default()
        );
        return EXIT_OK;
    }
    if pipelines.is_empty() {
        println!("no pipelines in {}", config.file.display());
    }
    let age = |t: &serde_json::Value| {
        t.as_str()
            .and_then(|t| crate::catalog::parse_time(t).ok())
            .map(|t| human_age((now - t).whole_seconds()))
            .unwrap_or_default()
    };
    for p in &pipelines {
        println!(
            "pipeline {}: inbox {}  work {}  done {}  failed {}",
            p["pipeline_id"].as_str().unwrap_or_default(),
            p["inbox"],
            p["work"],
            p["done"],
            p["failed"]
        );
        if !p["oldest_waiting"].is_null() {
            println!("  oldest waiting bundle: {} ago", age(&p["oldest_waiting"]));
        }
        if let Some(f) = p["last_failure"].as_object() {
            println!(
                "  last failure: {} ({} ago) [{}] {}",
                f["name"].as_str().unwrap_or_default(),
                age(&f["modified"]),
                f["stage"].as_str().unwrap_or("?"),
                f["error"].as_str().unwrap_or_default()
            );
        }
        for d in p["destinations"].as_array().into_iter().flatten() {
            let outputs = d["outputs"]
                .as_u64()
                .map(|n| format!(", {n} outputs"))
                .unwrap_or_default();
            println!(
                "  destination {} ({}) {}: {}{outputs}",
                d["destination_id"].as_str().unwrap_or_default(),
                d["workflow"].as_str().unwrap_or_default(),
                d["root"].as_str().unwrap_or_default(),
                d["state"].as_str().unwrap_or_default(),
            );
        }
    }
    EXIT_OK
}

/// A rough age for people: seconds, minutes, hours or days.
fn human_age(seconds: i64) -> String {
    let s = seconds.max(0);
    match s {
        0..120 => format!("{s}s"),
        120..7_200 => format!("{}m", s / 60),
        7_200..172_800 => format!("{}h", s / 3_600),
        _ => format!("{}d", s / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
