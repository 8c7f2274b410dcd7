//! The manual pages and shell completions that the Debian package ships,
//! written by the hidden `distributor __generate-docs DIR` from the command
//! line's definition: every command is in them, no hidden one is, the
//! pages render, and bash completes the subcommands.

use crate::util::Test;
use clap::CommandFactory;
use distributor::cli::Cli;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Commands the pages must name whatever the enumeration below finds.
const NAMED: [&str; 7] = [
    "agent",
    "run",
    "reconcile-state",
    "spool flush",
    "spool hold",
    "bundle seal",
    "config check",
];

/// Every visible command as typed after `distributor`: the groups
/// (`spool`) and the commands in them (`spool flush`), depth first.
fn command_paths() -> Vec<(Vec<String>, bool)> {
    fn subcommands(cmd: &clap::Command, prefix: &[String], out: &mut Vec<(Vec<String>, bool)>) {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            let mut path = prefix.to_vec();
            path.push(sub.get_name().to_owned());
            let is_group = sub.has_subcommands();
            out.push((path.clone(), is_group));
            subcommands(sub, &path, out);
        }
    }
    let mut out = Vec::new();
    subcommands(&Cli::command(), &[], &mut out);
    out
}

fn hidden_commands() -> Vec<String> {
    Cli::command()
        .get_subcommands()
        .filter(|s| s.is_hide_set())
        .map(|s| s.get_name().to_owned())
        .collect()
}

/// Runs the hidden command into `<test>/out` and returns that folder.
fn generate(t: &Test) -> PathBuf {
    let out = t.cmd().args(["__generate-docs", "out"]).output();
    out.expect_code(0);
    for file in ["man/distributor.1", "completions/distributor.bash"] {
        assert!(
            out.stdout.lines().any(|l| l == format!("out/{file}")),
            "it prints what it wrote:\n{}",
            out.stdout
        );
    }
    t.join("out")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Roff source with its escaped dashes as the reader sees them.
fn unescaped(roff: &str) -> String {
    roff.replace("\\-", "-")
}

#[test]
fn the_top_page_names_every_command_and_each_has_a_page() {
    let t = Test::new();
    let dir = generate(&t);
    let top = unescaped(&read(&dir.join("man/distributor.1")));
    let paths = command_paths();
    assert!(paths.len() >= NAMED.len(), "{paths:?}");
    for named in NAMED {
        assert!(
            paths.iter().any(|(p, _)| p.join(" ") == named),
            "{named} is a command"
        );
    }
    for (path, is_group) in &paths {
        let page = format!("distributor-{}", path.join("-"));
        assert!(
            dir.join(format!("man/{page}.1")).is_file(),
            "{page}.1 is written"
        );
        // Every page says what its command does and how it exits.
        let text = unescaped(&read(&dir.join(format!("man/{page}.1"))));
        for section in ["DESCRIPTION", "EXIT STATUS"] {
            assert!(text.contains(section), "{page}.1 has no {section}:\n{text}");
        }
        if !is_group {
            let usage = format!("distributor {}", path.join(" "));
            assert!(top.contains(&usage), "distributor.1 names {usage}:\n{top}");
            assert!(top.contains(&page), "distributor.1 points to {page}");
        }
    }
    let pages: Vec<_> = std::fs::read_dir(dir.join("man"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(pages.len(), paths.len() + 1, "{pages:?}");
    for hidden in hidden_commands() {
        assert!(!top.contains(&hidden), "distributor.1 hides {hidden}");
        assert!(!pages.iter().any(|p| p.contains(&hidden)), "{pages:?}");
    }
    for section in [
        "SYNOPSIS",
        "COMMANDS",
        "EXIT STATUS",
        "ENVIRONMENT",
        "FILES",
    ] {
        assert!(top.contains(section), "distributor.1 has {section}");
    }
    assert!(top.contains("DISTRIBUTOR_CONFIG"));

    // A command's page carries its options and its --help examples.
    let flush = unescaped(&read(&dir.join("man/distributor-spool-flush.1")));
    assert!(flush.contains("distributor spool flush reports"), "{flush}");
    assert!(flush.contains("--config"), "{flush}");
    let check = unescaped(&read(&dir.join("man/distributor-config-check.1")));
    assert!(check.contains("--strict"), "{check}");
}

#[test]
fn the_completions_offer_every_command_and_no_hidden_one() {
    let t = Test::new();
    let dir = generate(&t);
    let hidden = hidden_commands();
    assert!(!hidden.is_empty());
    for file in ["distributor.bash", "_distributor", "distributor.fish"] {
        let text = read(&dir.join("completions").join(file));
        let words: BTreeSet<&str> = text
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
            .collect();
        for (path, _) in command_paths() {
            let name = path.last().unwrap();
            assert!(words.contains(name.as_str()), "{file} offers {name}");
        }
        for name in &hidden {
            // The scripts call `distributor __pipelines` for the ids they
            // offer after --pipeline; they never offer it.
            let calls = format!("distributor {name} 2>/dev/null");
            let rest = text
                .replace(&calls, "")
                .replace(&format!("\"${{config[@]}}\" {name} 2>"), "");
            assert!(!rest.contains(name.as_str()), "{file} offers {name}");
        }
    }

    // Run the bash completion the way bash does after `distributor <group> `.
    if Command::new("bash").arg("--version").output().is_err() {
        eprintln!("skipped running the bash completion: bash is not installed");
        return;
    }
    let script = dir.join("completions/distributor.bash");
    // The binary on PATH: the script asks it for the pipelines' ids.
    let path = crate::util::path_with_binary();
    let complete = |words: &[&str]| -> BTreeSet<String> {
        let out = Command::new("bash")
            .arg("--norc")
            .arg("-c")
            .arg(
                r#"source "$1"; shift
                COMP_WORDS=("$@" ""); COMP_CWORD=$#
                _distributor distributor "" "${COMP_WORDS[COMP_CWORD-1]}"
                printf '%s\n' "${COMPREPLY[@]}""#,
            )
            .arg("bash")
            .arg(&script)
            .args(words)
            .env("PATH", &path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    };
    // After --pipeline: the configured pipelines' ids (of the --config on
    // the line), not file names.
    t.config(
        "spool: ./spool\npipelines:\n  - id: alpha\n    destinations: [{id: d, path: ./a}]\n  - id: beta\n    destinations: [{id: d, path: ./b}]\n",
    );
    let config = t.join("config.yaml");
    let words = [
        "distributor",
        "--config",
        config.to_str().unwrap(),
        "spool",
        "list",
        "--pipeline",
    ];
    assert_eq!(
        complete(&words),
        BTreeSet::from(["alpha".to_owned(), "beta".to_owned()])
    );
    let top = complete(&["distributor"]);
    for (path, _) in command_paths().iter().filter(|(p, _)| p.len() == 1) {
        assert!(
            top.contains(&path[0]),
            "`distributor ` offers {path:?}: {top:?}"
        );
    }
    for name in &hidden {
        assert!(!top.contains(name), "`distributor ` offers {name}: {top:?}");
    }
    for (group, _) in command_paths().iter().filter(|(_, is_group)| *is_group) {
        let mut words = vec!["distributor"];
        words.extend(group.iter().map(String::as_str));
        let offered = complete(&words);
        for (path, _) in command_paths()
            .iter()
            .filter(|(p, _)| p.len() == group.len() + 1 && p.starts_with(group))
        {
            let name = path.last().unwrap();
            assert!(
                offered.contains(name),
                "`distributor {} ` offers {name}: {offered:?}",
                group.join(" ")
            );
        }
    }
}

#[test]
fn man_renders_every_page() {
    if Command::new("man").arg("--version").output().is_err() {
        eprintln!("skipped: man is not installed, so the pages are not rendered");
        return;
    }
    let t = Test::new();
    let dir = generate(&t);
    for entry in std::fs::read_dir(dir.join("man")).unwrap() {
        let page = entry.unwrap().path();
        let out = Command::new("man")
            .args(["--warnings", "-E", "UTF-8", "-l"])
            .arg(&page)
            .env("MANWIDTH", "100")
            .env("MANPAGER", "cat")
            .env("PAGER", "cat")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "man -l {}: {stderr}", page.display());
        assert!(
            stderr.trim().is_empty(),
            "man warns about {}:\n{stderr}",
            page.display()
        );
        assert!(stdout.contains("NAME"), "{stdout}");
        if page.ends_with("distributor.1") {
            for named in NAMED {
                let usage = format!("distributor {named}");
                assert!(stdout.contains(&usage), "man shows {usage}:\n{stdout}");
            }
        }
    }
}

#[test]
fn every_command_and_group_has_an_example_in_its_help() {
    let t = Test::new();
    for (path, _) in command_paths() {
        let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
        args.push("--help");
        let out = t.cmd().args(&args).output();
        out.expect_code(0);
        let example = path.join(" ");
        assert!(
            (out.stdout.contains("Example:") || out.stdout.contains("Examples:"))
                && out.stdout.contains(&example),
            "`distributor {}` has an example:\n{}",
            args.join(" "),
            out.stdout
        );
    }
}
