//! `distributor __generate-docs DIR`: the manual pages and the shell
//! completions, generated from the command line's definition (args.rs) so
//! that they cannot drift from it. Nothing generated is kept in git: the
//! packaging step of `.ci/run` runs this into `target/generated/` before
//! `cargo deb`, whose assets (Cargo.toml) install what it wrote. Hidden
//! from `--help`, like `__render`.
//!
//! It writes `DIR/man/distributor.1`, which lists every command, one page
//! per command and command group (`distributor-spool.1`,
//! `distributor-spool-flush.1`, ...), and `DIR/completions/` with
//! `distributor.bash`, `_distributor` (zsh) and `distributor.fish`.

use super::{Cli, Error, Outcome};
use crate::config::{CONFIG_ENV, DEFAULT_CONFIG_PATH, DEFAULT_SPOOL};
use crate::runtime::exit::{EXIT_FAILURE, EXIT_OK, EXIT_REFUSED, EXIT_USAGE};
use clap::{Command, CommandFactory};
use clap_complete::Shell;
use clap_mangen::Man;
use clap_mangen::roff::{Roff, bold, italic, roman};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// The name the command is installed under.
const BIN: &str = "distributor";

/// Where the package puts the documentation that the pages point to.
const DOC_DIR: &str = "/usr/share/doc/distributor";

/// Writes the pages and completions into `dir`, printing each file's path.
pub(super) fn generate(dir: &Path) -> Outcome {
    let files = write_all(dir).map_err(|e| Error::Failed(e.to_string()))?;
    for file in files {
        println!("{}", file.display());
    }
    Ok(())
}

fn write_all(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let man = dir.join("man");
    create_dir(&man)?;
    for (name, text) in man_pages() {
        written.push(write(&man.join(format!("{name}.1")), text.as_bytes())?);
    }
    let completions = dir.join("completions");
    create_dir(&completions)?;
    for (shell, name) in [
        (Shell::Bash, "distributor.bash"),
        (Shell::Zsh, "_distributor"),
        (Shell::Fish, "distributor.fish"),
    ] {
        written.push(write(&completions.join(name), &completion(shell))?);
    }
    Ok(written)
}

fn create_dir(dir: &Path) -> io::Result<()> {
    std::fs::create_dir_all(dir)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))
}

/// Writes a generated page by path: the folder is the packager's build
/// output (`target/generated`), never a spool or anything a producer holds.
fn write(path: &Path, bytes: &[u8]) -> io::Result<PathBuf> {
    std::fs::write(path, bytes)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    Ok(path.to_path_buf())
}

/// The completion script for one shell. Hidden commands are left out:
/// nobody types them.
fn completion(shell: Shell) -> Vec<u8> {
    let mut buf = Vec::new();
    clap_complete::generate(shell, &mut completed_command(), BIN, &mut buf);
    with_pipeline_ids(shell, &String::from_utf8_lossy(&buf)).into_bytes()
}

/// A completion script that offers the configured pipeline ids after
/// `--pipeline` (clap_complete's scripts are static, and would offer file
/// names): the ids come from `distributor __pipelines`, with the
/// `--config` of the command line being completed when it has one (bash),
/// else the config any command finds.
fn with_pipeline_ids(shell: Shell, script: &str) -> String {
    match shell {
        Shell::Bash => {
            let helper = format!(
                "_{BIN}_pipelines() {{\n    local i config=()\n    for ((i = 1; i < ${{#COMP_WORDS[@]}} - 1; i++)); do\n        [[ ${{COMP_WORDS[i]}} == --config ]] && config=(--config \"${{COMP_WORDS[i+1]}}\")\n    done\n    {BIN} \"${{config[@]}}\" __pipelines 2>/dev/null\n}}\n\n"
            );
            let from = "--pipeline)\n                    COMPREPLY=($(compgen -f \"${cur}\"))";
            let to = format!(
                "--pipeline)\n                    COMPREPLY=($(compgen -W \"$(_{BIN}_pipelines)\" -- \"${{cur}}\"))"
            );
            format!("{helper}{}", script.replace(from, &to))
        }
        Shell::Zsh => script.replace(
            ":P:_default'",
            &format!(":P:{{compadd -- ${{(f)\"$({BIN} __pipelines 2>/dev/null)\"}}}}'"),
        ),
        Shell::Fish => script
            .lines()
            .map(|line| {
                if line.contains(" -l pipeline ") && line.ends_with(" -r") {
                    format!("{line} -f -a \"({BIN} __pipelines 2>/dev/null)\"\n")
                } else {
                    format!("{line}\n")
                }
            })
            .collect(),
        _ => script.to_owned(),
    }
}

/// The command line as the completions offer it: `Cli` without its hidden
/// subcommands. clap can add subcommands but not remove them, so the top
/// level is built again from `Cli`'s parts: its name, version, about,
/// arguments, subcommands and whether one is required, all that
/// clap_complete reads of it.
fn completed_command() -> Command {
    let full = Cli::command();
    let mut cmd = Command::new(BIN)
        .version(env!("CARGO_PKG_VERSION"))
        .subcommand_required(full.is_subcommand_required_set())
        .arg_required_else_help(full.is_arg_required_else_help_set())
        .args(full.get_arguments().cloned())
        .subcommands(full.get_subcommands().filter(|s| !s.is_hide_set()).cloned());
    if let Some(about) = full.get_about() {
        cmd = cmd.about(about.clone());
    }
    cmd
}

/// The command line as the manual pages describe it: built (so every
/// subcommand knows its full name and inherits `--config`), without the
/// `help` subcommand, which needs no page.
fn documented_command() -> Command {
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    cmd
}

fn visible(cmd: &Command) -> impl Iterator<Item = &Command> {
    cmd.get_subcommands().filter(|s| !s.is_hide_set())
}

/// The page name of a built command: `distributor-spool-flush`.
fn page_name(cmd: &Command) -> String {
    cmd.get_display_name()
        .unwrap_or_else(|| cmd.get_name())
        .to_owned()
}

/// Every page, `(name, roff source)`: the top page, then one per command
/// and command group, depth first in the order `--help` lists them.
fn man_pages() -> Vec<(String, String)> {
    fn walk(cmd: &Command, parent: Option<&Command>, pages: &mut Vec<(String, String)>) {
        pages.push((page_name(cmd), page(cmd, parent)));
        for sub in visible(cmd) {
            walk(sub, Some(cmd), pages);
        }
    }
    let root = documented_command();
    let mut pages = Vec::new();
    walk(&root, None, &mut pages);
    pages
}

/// The commands that do something (not the groups), depth first.
fn leaves(cmd: &Command) -> Vec<&Command> {
    let mut out = Vec::new();
    for sub in visible(cmd) {
        if visible(sub).next().is_some() {
            out.extend(leaves(sub));
        } else {
            out.push(sub);
        }
    }
    out
}

/// One page in roff: clap_mangen's sections for the name, synopsis,
/// description and options, then ours. The top page (no parent) lists
/// every command and says what applies to all of them.
fn page(cmd: &Command, parent: Option<&Command>) -> String {
    let name = page_name(cmd);
    let man = Man::new(cmd.clone())
        .title(name.to_uppercase())
        .source(format!("{BIN} {}", env!("CARGO_PKG_VERSION")));
    let mut page = Page::default();
    page.add(|w| man.render_title(w));
    // Left-aligned and unhyphenated: the text is full of command names.
    let mut layout = Roff::new();
    layout.control("ad", ["l"]).control("nh", []);
    page.roff(&layout);
    page.add(|w| man.render_name_section(w));
    page.add(|w| man.render_synopsis_section(w));
    if parent.is_none() {
        page.roff(&description());
    } else if cmd.get_long_about().is_some() {
        page.add(|w| man.render_description_section(w));
    } else if let Some(about) = cmd.get_about() {
        // What NAME says, as a sentence, and where the rest is.
        let mut roff = Roff::new();
        roff.control("SH", ["DESCRIPTION"]);
        roff.text([roman(format!(
            "{}. The options are below; contract.md in {DOC_DIR} is the whole contract.",
            about.to_string().trim_end_matches('.')
        ))]);
        page.roff(&roff);
    }
    page.add(|w| man.render_options_section(w));
    if parent.is_none() {
        page.roff(&commands_section(cmd));
    } else if visible(cmd).next().is_some() {
        page.add(|w| man.render_subcommands_section(w));
    }
    if let Some(examples) = examples_section(cmd) {
        page.roff(&examples);
    }
    if parent.is_none() {
        page.roff(&common_sections());
    } else {
        let mut roff = Roff::new();
        exit_status(&mut roff);
        page.roff(&roff);
    }
    page.roff(&see_also(cmd, parent));
    page.text
}

/// Pieces of roff, each rendered with roff's preamble (a string
/// definition for the apostrophe), which the page keeps once.
struct Page {
    text: String,
    preamble: String,
}

impl Default for Page {
    fn default() -> Page {
        let preamble = Roff::new().render();
        Page {
            text: preamble.clone(),
            preamble,
        }
    }
}

impl Page {
    fn add(&mut self, render: impl FnOnce(&mut dyn Write) -> io::Result<()>) {
        let mut buf = Vec::new();
        // Writing into a Vec cannot fail.
        let _ = render(&mut buf);
        let piece = String::from_utf8_lossy(&buf);
        self.text
            .push_str(piece.strip_prefix(&self.preamble).unwrap_or(&piece));
    }

    fn roff(&mut self, roff: &Roff) {
        self.add(|w| roff.to_writer(w));
    }
}

/// DESCRIPTION of the top page: what the program is for.
fn description() -> Roff {
    let mut roff = Roff::new();
    roff.control("SH", ["DESCRIPTION"]);
    roff.text([roman(
        "distributor is a file-watching spool agent. Producers drop bundles (a folder of files plus a manifest.json with every file's size and SHA-256) into a pipeline's inbox. The agent, distributor agent (run by the systemd service distributor.service), verifies each bundle, locks the destination roots, plans the publication against each root's ownership catalog and refuses to touch files it does not own, writes the outputs crash-safely and files the bundle in done/ or failed/.",
    )]);
    roff.control("PP", []);
    roff.text([roman(
        "The other commands publish one bundle by hand, show and steer the spools, seal and check bundles for producers, check the configuration, and maintain destination roots.",
    )]);
    roff
}

/// COMMANDS: every command with its usage and what it does.
fn commands_section(root: &Command) -> Roff {
    let mut roff = Roff::new();
    roff.control("SH", ["COMMANDS"]);
    roff.text([roman(
        "Each command has a page of its own with its options and examples, and prints the same with --help.",
    )]);
    for leaf in leaves(root) {
        let usage = leaf.clone().render_usage().to_string();
        let usage = usage.strip_prefix("Usage: ").unwrap_or(&usage).trim();
        roff.control("TP", []);
        roff.text([bold(usage)]);
        let about = leaf.get_about().map(|a| a.to_string()).unwrap_or_default();
        roff.text([
            roman(format!("{about}. See ")),
            bold(page_name(leaf)),
            roman("(1)."),
        ]);
    }
    roff
}

/// EXAMPLES, from the command's `after_help` (the examples --help shows).
fn examples_section(cmd: &Command) -> Option<Roff> {
    let text = cmd.get_after_help()?.to_string();
    let mut lines = text.lines();
    let first = lines.next()?;
    let mut roff = Roff::new();
    roff.control("SH", ["EXAMPLES"]);
    if first != "Example:" {
        roff.text([roman(first)]);
    }
    roff.control("PP", []);
    roff.control("RS", ["4"]);
    roff.control("nf", []);
    for line in lines {
        roff.text([roman(line.strip_prefix("  ").unwrap_or(line))]);
    }
    roff.control("fi", []);
    roff.control("RE", []);
    Some(roff)
}

/// EXIT STATUS, ENVIRONMENT and FILES: what holds for every command.
fn common_sections() -> Roff {
    let mut roff = Roff::new();
    exit_status(&mut roff);
    common_rest(&mut roff);
    roff
}

/// EXIT STATUS: the codes every command exits with.
fn exit_status(roff: &mut Roff) {
    roff.control("SH", ["EXIT STATUS"]);
    for (code, meaning) in [
        (
            EXIT_OK,
            "Success, also a dry run whose plan would succeed, and nothing to do.",
        ),
        (
            EXIT_FAILURE,
            "A runtime failure, an invalid bundle, or problems that verify found.",
        ),
        (EXIT_USAGE, "A usage or configuration error."),
        (
            EXIT_REFUSED,
            "A publication that planning refused (unmanaged content or a conflicting state), or a maintenance command that refused.",
        ),
    ] {
        roff.control("TP", []);
        roff.text([bold(code.to_string())]);
        roff.text([roman(meaning)]);
    }
    roff.control("PP", []);
    roff.text([roman(format!(
        "The contract behind these codes is contract.md §9 in {DOC_DIR}."
    ))]);
}

/// ENVIRONMENT and FILES, for the top page.
fn common_rest(roff: &mut Roff) {
    roff.control("SH", ["ENVIRONMENT"]);
    roff.control("TP", []);
    roff.text([bold(CONFIG_ENV)]);
    roff.text([roman(format!(
        "The config file when --config is not given (when set and not empty); else {DEFAULT_CONFIG_PATH}."
    ))]);
    roff.control("TP", []);
    roff.text([bold("RUST_LOG")]);
    roff.text([roman(
        "What is logged to standard error: a level (error, warn, info, debug, trace) or a filter such as info,distributor::agent=debug. The default is info.",
    )]);

    roff.control("SH", ["FILES"]);
    for (path, what) in [
        (DEFAULT_CONFIG_PATH, "The configuration, see config.md."),
        (
            DEFAULT_SPOOL,
            "The spool when the configuration names none. A pipeline's work/, done/ and failed/ are in <spool>/<pipeline>/, and so is its inbox/ unless the pipeline names another.",
        ),
        (
            "/usr/lib/systemd/system/distributor.service",
            "The service that runs distributor agent.",
        ),
        (
            DOC_DIR,
            "The documentation: README.md first, install.md, operations.md, troubleshooting.md, config.md, producers.md and the other pages.",
        ),
    ] {
        roff.control("TP", []);
        roff.text([italic(path)]);
        roff.text([roman(what)]);
    }
}

/// SEE ALSO: the top page links every command's page; a command's page
/// links the top page and its group's.
fn see_also(cmd: &Command, parent: Option<&Command>) -> Roff {
    let pages: Vec<String> = match parent {
        None => visible(cmd).map(page_name).collect(),
        Some(parent) => {
            let mut pages = vec![BIN.to_owned()];
            if parent.get_name() != BIN {
                pages.push(page_name(parent));
            }
            pages
        }
    };
    let mut roff = Roff::new();
    roff.control("SH", ["SEE ALSO"]);
    let mut line = Vec::new();
    for (i, page) in pages.into_iter().enumerate() {
        if i > 0 {
            line.push(roman(", "));
        }
        line.push(bold(page));
        line.push(roman("(1)"));
    }
    line.push(roman(format!("; the documentation in {DOC_DIR}.")));
    roff.text(line);
    roff
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(cmd: &Command) -> Vec<String> {
        cmd.get_subcommands()
            .map(|s| s.get_name().to_owned())
            .collect()
    }

    #[test]
    fn the_command_is_hidden_from_help() {
        use clap::Parser;
        let cli = Cli::try_parse_from([BIN, "__generate-docs", "out"]).unwrap();
        assert!(matches!(
            cli.command,
            super::super::Command::GenerateDocs { .. }
        ));
        let help = Cli::command().render_help().to_string();
        assert!(!help.contains("__generate-docs"), "{help}");
    }

    #[test]
    fn completions_offer_every_visible_command_and_no_hidden_one() {
        let full = Cli::command();
        let completed = completed_command();
        let visible: Vec<String> = visible(&full).map(|s| s.get_name().to_owned()).collect();
        assert_eq!(names(&completed), visible);
        assert!(full.get_subcommands().any(|s| s.is_hide_set()));
        assert_eq!(
            completed.get_arguments().count(),
            full.get_arguments().count()
        );
    }

    #[test]
    fn there_is_a_page_per_command_and_group() {
        let pages = man_pages();
        let names: Vec<&str> = pages.iter().map(|(n, _)| n.as_str()).collect();
        for name in [
            "distributor",
            "distributor-spool",
            "distributor-spool-flush",
            "distributor-config-check",
            "distributor-reconcile-state",
        ] {
            assert!(names.contains(&name), "{name} in {names:?}");
        }
        assert!(
            !names
                .iter()
                .any(|n| n.contains("__") || n.ends_with("-help"))
        );
        // The preamble is kept once per page.
        let preamble = Roff::new().render();
        for (name, text) in &pages {
            assert!(text.starts_with(&preamble), "{name}");
            assert_eq!(text.matches(preamble.as_str()).count(), 1, "{name}");
        }
    }
}
