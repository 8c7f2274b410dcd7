//! The command line: parses arguments, calls the library, prints results
//! and maps them to exit codes (docs/contract.md §9). The only module that prints.

use crate::config::{self, Config};
use crate::maintain;
use crate::runtime::clock::now_millis;
use crate::runtime::process_state::ProcessState;
use crate::spool::Folder;
use std::path::Path;

mod access;
mod args;
mod docs;
mod error;
mod failed;
mod intake;
mod output;
mod producer;
mod publishing;
mod queue;
mod roots;
mod spools;
mod status;

#[cfg(test)]
mod tests;

pub use args::{BundleCommand, Cli, Command, ConfigCommand, RunArgs, SpoolCommand, TargetArgs};

use producer::{seal, upload, verify};
use publishing::{agent, run_bundle};
use roots::with_target;
use spools::{spool_list, spool_retry};
use status::status;

use error::{Error, Outcome, Told, told_unless};

/// Runs a parsed command line and returns the process exit code: each
/// command returns an [`Outcome`], mapped to its code here, once
/// (docs/contract.md §9). The process is to exit then: the catalogs the
/// command remembered are left for the system to reclaim, not freed.
pub fn run(cli: Cli) -> u8 {
    let config = cli.config.as_deref();
    // The process's caches and clients, made once and passed down
    // (docs/architecture.md, "What a process keeps").
    let process = &ProcessState::default();
    let outcome = match cli.command {
        Command::Agent { once } => agent(config, once, process),
        // The renderer child answers its parent in exit codes of its own
        // protocol (render::child), not in the table of §9.
        Command::Render => return crate::render::child::serve(),
        Command::GenerateDocs { dir } => docs::generate(&dir),
        Command::Pipelines => config_for_reading(config).map(|c| {
            for p in &c.pipelines {
                println!("{}", p.id);
            }
        }),
        Command::Prune {
            target,
            apply,
            json,
            ..
        } => with_target(
            config,
            &target,
            |t| maintain::prune(t, apply, now_millis()).map(|r| (r.to_text(), r.to_json(), true)),
            json,
            false,
            process,
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
                    .map(|r| (r.to_text(), r.to_json(), true))
            },
            json,
            false,
            process,
        ),
        Command::Verify {
            target,
            all_owners,
            json,
        } => with_target(
            config,
            &target,
            |t| maintain::verify(t, all_owners).map(|r| (r.to_text(), r.to_json(), r.ok)),
            json,
            true,
            process,
        ),
        Command::Rollback {
            target,
            to,
            dry_run,
            json,
        } => with_target(
            config,
            &target,
            |t| {
                maintain::rollback(t, to.as_deref(), dry_run)
                    .map(|r| (r.to_text(), r.to_json(), true))
            },
            json,
            false,
            process,
        ),
        Command::Releases { target, json } => with_target(
            config,
            &target,
            |t| maintain::releases(t).map(|r| (r.to_text(), r.to_json(), true)),
            json,
            true,
            process,
        ),
        Command::Catalog { target, json } => with_target(
            config,
            &target,
            |t| maintain::catalog(t).map(|r| (r.to_text(), r.to_json(), true)),
            json,
            true,
            process,
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
        Command::Status { json, check } => status(config, json, check),
        Command::Spool(SpoolCommand::Retry {
            pipeline,
            name,
            all,
            allow_older,
        }) => match (pipeline, name) {
            (Some(pipeline), Some(name)) if !all => {
                spool_retry(config, &pipeline, &name, allow_older, process)
            }
            (Some(pipeline), _) => failed::retry_all(config, &pipeline, allow_older, process),
            (None, _) => failed::retry_every_pipeline(config, allow_older, process),
        },
        Command::Spool(SpoolCommand::Show {
            pipeline,
            name,
            json,
        }) => failed::show(config, &pipeline, &name, json),
        Command::Spool(SpoolCommand::Flush { pipeline }) => {
            queue::flush(config, pipeline.as_deref())
        }
        Command::Spool(SpoolCommand::Hold { pipeline }) => queue::hold(config, &pipeline),
        Command::Spool(SpoolCommand::Release { pipeline }) => queue::release(config, &pipeline),
        Command::Spool(SpoolCommand::Delete { pipeline, name }) => {
            failed::delete(config, &pipeline, &name)
        }
        Command::Run(args) => run_bundle(config, &args, process),
        Command::Bundle(BundleCommand::Seal {
            dir,
            id,
            created,
            sign,
            namespace,
        }) => seal(&dir, &id, created.as_deref(), sign.as_deref(), &namespace),
        Command::Bundle(BundleCommand::Verify {
            dir,
            signers,
            namespace,
            json,
        }) => verify(&dir, signers.as_deref(), &namespace, json, process),
        Command::Bundle(BundleCommand::Upload {
            dir,
            url,
            endpoint,
            region,
            signers,
            namespace,
            json,
        }) => upload(
            &dir,
            &url,
            &producer::Server {
                endpoint: endpoint.as_deref(),
                region: region.as_deref(),
            },
            signers.as_deref(),
            &namespace,
            json,
            process,
        ),
        Command::Config(ConfigCommand::Check { json, strict }) => {
            config_check(cli.config.as_deref(), json, strict)
        }
    };
    // The process ends now: the catalogs it remembers are left for the
    // system to reclaim at once rather than freed record by record (a
    // large root's take milliseconds to free).
    process.catalog_cache().forget_for_exit();
    match outcome {
        Ok(()) => crate::runtime::exit::EXIT_OK,
        Err(e) => {
            e.tell();
            e.exit_code()
        }
    }
}

fn load_config(flag: Option<&Path>) -> Result<Config, String> {
    let path = config::resolve_config_path(flag);
    config::load(&path).map_err(|e| e.to_string())
}

/// For a command that only reads: the config, or when the file does not
/// load, the one the running agent serves (with a warning on stderr that
/// names the file's error); else the usage error of why not.
fn config_for_reading(flag: Option<&Path>) -> Result<Config, Error> {
    let path = config::resolve_config_path(flag);
    match config::in_force::load_for_reading(&path) {
        Ok((config, None)) => Ok(config),
        Ok((config, Some(warning))) => {
            eprintln!("warning: {warning}");
            Ok(config)
        }
        Err(e) => Err(Error::Usage(e.to_string())),
    }
}

/// Loads the config, or the usage error of why not.
fn config_or_usage(flag: Option<&Path>) -> Result<Config, Error> {
    load_config(flag).map_err(Error::Usage)
}

fn config_check(flag: Option<&Path>, json: bool, strict: bool) -> Outcome {
    let config = match load_config(flag) {
        Ok(c) => c,
        Err(e) if json => {
            let doc = serde_json::json!({"ok": false, "error": e});
            println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
            return Err(Error::Told(Told::Usage));
        }
        Err(e) => return Err(Error::Usage(e)),
    };
    let not_writable = access::not_writable(&config);
    let split = split_file_systems(&config);
    let shared = config::shared_roots(&config);
    let outcome = if !split.is_empty() || (strict && !not_writable.is_empty()) {
        Err(Error::Told(Told::Usage))
    } else if strict && !shared.is_empty() {
        // docs/contract.md §17.2: pipelines that can take over each
        // other's outputs.
        Err(Error::Told(Told::Failure))
    } else {
        Ok(())
    };
    if json {
        let pipelines: Vec<serde_json::Value> = config
            .pipelines
            .iter()
            .map(|p| {
                serde_json::json!({
                    "id": p.id,
                    "inbox": p.intake.is_none().then(|| p.inbox.display().to_string()),
                    "intake": intake::config_json(p),
                    "signatures": p.signatures.as_ref().map(|s| s.to_json()),
                    "destinations": p.destinations.iter().map(|d| d.to_json()).collect::<Vec<_>>(),
                })
            })
            .collect();
        let mut warnings = config.warnings();
        warnings.extend(not_writable.iter().map(access::NotWritable::to_text));
        let doc = serde_json::json!({
            "ok": outcome.is_ok(),
            "file": config.file.display().to_string(),
            "spool": config.spool.display().to_string(),
            "pipelines": pipelines,
            "warnings": warnings,
            "not_writable": not_writable,
            "shared_roots": shared,
            "errors": split,
            "hints": [SERVING_HINT],
        });
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else {
        print!("{}", config.summary());
        for n in &not_writable {
            println!("warning: {}", n.to_text());
        }
        if !config.pipelines.is_empty() {
            println!("hint: {SERVING_HINT}");
        }
        for e in &split {
            eprintln!("error: {e}");
        }
        if strict && !not_writable.is_empty() {
            eprintln!(
                "error: --strict: {} folder(s) above are not writable by user {}",
                not_writable.len(),
                access::current_user()
            );
        }
        if strict && !shared.is_empty() {
            eprintln!(
                "error: --strict: {} pair(s) of destinations above share a root and may write the same paths; give them disjoint scopes",
                shared.len()
            );
        }
    }
    outcome
}

/// What `config check` reminds whoever serves a root.
const SERVING_HINT: &str = "each root holds the tool's own .distributor* files (the catalog, its lock, its journal); a web server or bucket policy serving the root keeps them private: docs/serving.md gives the nginx, Caddy, Apache and S3 bucket-policy lines";

/// Pipelines whose inbox is on another file system than their spool
/// folder: the agent refuses to start with them (bundles move by rename),
/// so `config check` says so first. Folders not created yet are judged by
/// their nearest existing parent, where they would be created.
fn split_file_systems(config: &Config) -> Vec<String> {
    use std::os::unix::fs::MetadataExt as _;
    let device = |path: &Path| {
        access::nearest_existing(path)
            .and_then(|p| std::fs::metadata(&p).ok())
            .map(|m| m.dev())
    };
    config
        .pipelines
        .iter()
        .filter_map(|p| {
            let spool = p.spool_dir(config);
            let (Some(a), Some(b)) = (device(&p.inbox), device(&spool)) else {
                return None;
            };
            (a != b).then(|| {
                format!(
                    "pipeline {}: its inbox {} is on another file system than its spool {}; bundles move from one to the other by rename, so the agent refuses to start. Put the inbox inside the spool (leave out `inbox:`), or the spool on the inbox's file system",
                    p.id,
                    p.inbox.display(),
                    spool.display()
                )
            })
        })
        .collect()
}
