//! Working the failed spool (docs/contract.md §14.2), like Postfix's `postsuper`:
//! `spool retry P --all`, `spool show P NAME`, `spool delete P NAME`.
//! Names and messages come from producers, so text output is made inert.

use super::{Error, Outcome, Told, config_or_usage, told_unless};
use crate::config::Config;
use crate::runtime::process_state::ProcessState;
use crate::spool::{self, Folder, Spool};
use crate::text::escape::inert;
use std::path::Path;

/// The pipeline's spool, or the error of why there is none. With
/// `reading`, a command that only reads: after a refused reload it works
/// on the config the agent serves (super::config_for_reading).
fn spool_of(flag: Option<&Path>, pipeline: &str, reading: bool) -> Result<(Config, Spool), Error> {
    let config = if reading {
        super::config_for_reading(flag)?
    } else {
        config_or_usage(flag)?
    };
    let Some(p) = config.pipeline(pipeline) else {
        return Err(Error::Usage(format!(
            "no pipeline {:?} in {}",
            inert(pipeline),
            config.file.display()
        )));
    };
    let spool = Spool::of(&config, p);
    Ok((config, spool))
}

/// `spool retry P --all`: every failed bundle back to the inbox, oldest
/// first; one that cannot be moved is reported and the rest go on.
pub(super) fn retry_all(
    flag: Option<&Path>,
    pipeline: &str,
    allow_older: bool,
    process: &ProcessState,
) -> Outcome {
    let (config, spool) = spool_of(flag, pipeline, false)?;
    let p = config
        .pipeline(pipeline)
        .expect("spool_of found the pipeline");
    if let Some(intake) = &p.intake {
        return super::intake::retry_all(p, intake);
    }
    let rows = spool::list(&spool, &[Folder::Failed]).map_err(|e| {
        Error::Failed(format!(
            "cannot list {}: {e}",
            spool.folder(Folder::Failed).display()
        ))
    })?;
    let (mut moved, mut errors) = (0usize, 0usize);
    for row in &rows {
        if !allow_older && let Some(refusal) = rolls_back(&config, p, &spool, &row.name, process) {
            errors += 1;
            eprintln!("error: {refusal}");
            continue;
        }
        match spool::retry(&spool, &row.name) {
            Ok(to) => {
                moved += 1;
                println!(
                    "moved {} back to {}",
                    inert(&row.name),
                    inert(&to.display().to_string())
                );
            }
            Err(e) => {
                errors += 1;
                eprintln!("error: {}: {}", inert(&row.name), inert(&e.to_string()));
            }
        }
    }
    println!(
        "{moved} failed bundle{} moved back to the inbox{}",
        if moved == 1 { "" } else { "s" },
        if errors > 0 {
            format!(", {errors} not moved")
        } else {
            String::new()
        }
    );
    // Each bundle not moved was told as it came.
    told_unless(errors == 0)
}

/// `spool retry --all` without a pipeline: every failed bundle of every
/// pipeline, each pipeline as `spool retry P --all` does it.
pub(super) fn retry_every_pipeline(
    flag: Option<&Path>,
    allow_older: bool,
    process: &ProcessState,
) -> Outcome {
    let config = config_or_usage(flag)?;
    // Each pipeline's error is told as it comes; the others go on, and
    // the exit code is the highest of theirs.
    let mut worst: Option<Error> = None;
    for p in &config.pipelines {
        println!("pipeline {}:", p.id);
        if let Err(e) = retry_all(flag, &p.id, allow_older, process) {
            e.tell();
            if worst.as_ref().is_none_or(|w| e.exit_code() > w.exit_code()) {
                worst = Some(e);
            }
        }
    }
    match worst {
        None => Ok(()),
        Some(e) => Err(Error::Told(Told::Error(Box::new(e)))),
    }
}

/// Why retrying `failed/<name>` is refused: publishing it would overwrite or
/// delete outputs of a source created after its own (docs/contract.md
/// §18.7), found by planning it as a dry run. `None` when it would not.
pub(super) fn rolls_back(
    config: &Config,
    p: &crate::config::Pipeline,
    spool: &Spool,
    name: &str,
    process: &ProcessState,
) -> Option<String> {
    let destinations: Vec<_> = p.destinations.iter().collect();
    let options = crate::publish::Options {
        dry_run: true,
        force: false,
        lock_timeout: config.agent.lock_timeout,
        serving: None,
        scratch: super::publishing::scratch_folder(config, p),
        process: process.clone(),
    };
    let bundle = spool.folder(Folder::Failed).join(name);
    let found = crate::publish::rollbacks(p, &destinations, &bundle, &options);
    process.renderers().stop_idle();
    if found.is_empty() {
        return None;
    }
    // On a pipeline with signatures.refuse_older the agent would refuse it
    // again (docs/contract.md §17.5): --allow-older cannot help there.
    let refuse_older = p.signatures.as_ref().is_some_and(|s| s.refuse_older);
    let anyway = if refuse_older {
        "this pipeline refuses older bundles (signatures.refuse_older), so to publish this content again, seal and sign it as a new bundle".to_owned()
    } else {
        format!(
            "to publish it anyway: distributor spool retry {} {} --allow-older",
            inert(&p.id),
            inert(name)
        )
    };
    Some(format!(
        "{}: not retried: publishing it would roll back {}. It stays in failed/; {anyway}",
        inert(name),
        inert(&crate::publish::Rollback::summary(&found)),
    ))
}

/// `spool show P NAME`: the result of a failed or done bundle.
pub(super) fn show(flag: Option<&Path>, pipeline: &str, name: &str, json: bool) -> Outcome {
    let (config, spool) = spool_of(flag, pipeline, true)?;
    let p = config
        .pipeline(pipeline)
        .expect("spool_of found the pipeline");
    let (folder, path, result) = match &p.intake {
        Some(intake) => super::intake::result(p, intake, name)?,
        None => {
            // In failed/, also a link or file that stood in for a bundle
            // when it was claimed (its result is the agent's own copy).
            let found = [Folder::Failed, Folder::Done].into_iter().find(|&f| {
                let path = spool.folder(f).join(name);
                !name.contains('/')
                    && !name.starts_with('.')
                    && (spool::is_real_folder(&path)
                        || (f == Folder::Failed && std::fs::symlink_metadata(&path).is_ok()))
            });
            let Some(folder) = found else {
                return Err(Error::Usage(format!(
                    "no failed or done bundle {:?} in pipeline {pipeline}; list them with `distributor spool list --pipeline {pipeline}`",
                    inert(name)
                )));
            };
            let path = spool.folder(folder).join(name).display().to_string();
            (folder, path, spool::read_result(&spool, folder, name))
        }
    };
    // A failed bundle's result is the agent's own copy; the bundle's copy,
    // which its producer can change, is only ever shown marked unverified.
    let unverified = result.as_ref().is_ok_and(|r| r.unverified);
    if json {
        let doc = match &result {
            Ok(r) if r.unverified => serde_json::json!({
                "pipeline_id": pipeline,
                "spool": folder.as_str(),
                "name": name,
                "path": path,
                "result": null,
                "unverified_result": r.doc,
                "error": spool::UNVERIFIED,
            }),
            _ => serde_json::json!({
                "pipeline_id": pipeline,
                "spool": folder.as_str(),
                "name": name,
                "path": path,
                "result": result.as_ref().ok().map(|r| &r.doc),
                "error": result.as_ref().err(),
            }),
        };
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
        return told_unless(result.is_ok() && !unverified);
    }
    println!("bundle {} in {}", inert(name), inert(&path));
    let doc = match result {
        Ok(r) => r.doc,
        Err(why) => {
            println!("  result: {}", inert(&why));
            return told_unless(false);
        }
    };
    if unverified {
        println!(
            "  UNVERIFIED: the agent kept no copy of this bundle's result; what follows is the bundle's own {}, which its producer can change",
            spool::RESULT_FILE
        );
    }
    let marked = if unverified { " (unverified)" } else { "" };
    let text = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => inert(s).into_owned(),
        serde_json::Value::Null => "-".to_owned(),
        other => inert(&other.to_string()).into_owned(),
    };
    println!("  ok{marked}: {}", text(&doc["ok"]));
    if !doc["stage"].is_null() {
        println!("  failed at{marked}: {}", text(&doc["stage"]));
        println!("  error{marked}: {}", text(&doc["error"]));
    }
    if let Some(source) = doc["source"].as_object() {
        println!(
            "  source: {} (created {})",
            text(&source["id"]),
            text(&source["created"])
        );
    }
    if let Some(signer) = doc["signer"].as_object() {
        println!(
            "  signer{marked}: {} (key {})",
            text(&signer["principal"]),
            text(&signer["key"])
        );
    }
    for d in doc["destinations"].as_array().into_iter().flatten() {
        let count = |key: &str| d[key].as_array().map_or(0, Vec::len);
        println!(
            "  destination {}: {} ({} written, {} deleted{})",
            text(&d["destination_id"]),
            text(&d["action"]),
            count("writes"),
            count("deletes"),
            if d["error"].is_null() {
                String::new()
            } else {
                format!("; {}", text(&d["error"]))
            }
        );
    }
    for h in doc["hooks"].as_array().into_iter().flatten() {
        let output = h["output"].as_str().unwrap_or_default();
        let first = output.lines().find(|l| !l.trim().is_empty());
        println!(
            "  hook of {}{marked}: {} in {} ms{}",
            text(&h["destination_id"]),
            match h["error"].as_str() {
                Some(e) => inert(e).into_owned(),
                None => format!("exited {}", text(&h["exit"])),
            },
            text(&h["elapsed_ms"]),
            first.map_or_else(String::new, |l| format!("; output: {}", inert(l)))
        );
    }
    told_unless(!unverified)
}

/// `spool delete P NAME`: removes a failed bundle.
pub(super) fn delete(flag: Option<&Path>, pipeline: &str, name: &str) -> Outcome {
    let (config, spool) = spool_of(flag, pipeline, false)?;
    if let Some(p) = config.pipeline(pipeline)
        && let Some(intake) = &p.intake
    {
        return super::intake::delete(p, intake, name);
    }
    let removed = spool::delete(&spool, name)?;
    println!(
        "removed {} ({} file{}, {} bytes)",
        inert(&removed.path.display().to_string()),
        removed.files,
        if removed.files == 1 { "" } else { "s" },
        removed.bytes
    );
    Ok(())
}
