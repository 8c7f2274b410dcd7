//! Configuration: reading the YAML file, checking it, and resolving it into
//! the typed [`Config`] every other module works from.
//!
//! This module owns the config file format (docs/contract.md §4): key names, defaults,
//! duration syntax, the `prefix` template language, path resolution against
//! the config file's folder, and every load-time check (unknown and retired
//! keys, ids, duplicates, overlapping folders). Errors name the file and,
//! where the YAML parser knows it, the line and column.
//!
//! It must never touch the file system beyond reading the config file itself
//! and the files it names that are read and checked while building: page
//! templates (`html.template`) and `signatures.allowed_signers`: paths are resolved lexically, nothing is created, canonicalised
//! or probed, and nothing here prints or logs.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

mod check;
mod error;
pub mod in_force;
mod model;
mod raw;
mod relations;
mod shared;
mod template;
mod values;
mod yaml;

#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
mod tests;

pub use error::{ConfigError, Place};
pub use model::{
    AgentConfig, Backend, Config, Destination, Encoding, Hooks, HtmlTemplate, Intake, Limits,
    Pipeline, PrunePolicy, RawHtml, S3Location, Signatures, Workflow,
};
pub use shared::{SharedRoot, Sharer, shared_roots};
pub use values::{
    PREFIX_PLACEHOLDERS, expand_prefix, format_duration, format_size, parse_duration, parse_size,
};

use raw::{RawConfig, build};
use yaml::{find_retired_keys, yaml_error};

/// Where the agent looks for its config when neither `--config` nor
/// `$DISTRIBUTOR_CONFIG` says otherwise.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/distributor/config.yaml";
/// The spool folder when the config has no `spool` key.
pub const DEFAULT_SPOOL: &str = "/var/spool/distributor";
/// The environment variable naming the config file.
pub const CONFIG_ENV: &str = "DISTRIBUTOR_CONFIG";

/// Policy keys of earlier versions, rejected wherever they appear.
pub const RETIRED_KEYS: [&str; 4] = ["state", "reconciliation", "takeover", "transfer"];

/// Which file to read: the `--config` flag, else `$DISTRIBUTOR_CONFIG`
/// (when set and not empty), else [`DEFAULT_CONFIG_PATH`].
pub fn resolve_config_path(flag: Option<&Path>) -> PathBuf {
    choose_config_path(flag, std::env::var_os(CONFIG_ENV))
}

fn choose_config_path(flag: Option<&Path>, env: Option<OsString>) -> PathBuf {
    match (flag, env) {
        (Some(flag), _) => flag.to_path_buf(),
        (None, Some(env)) if !env.is_empty() => PathBuf::from(env),
        _ => PathBuf::from(DEFAULT_CONFIG_PATH),
    }
}

/// Reads and checks the config file at `path`.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        file: path.to_path_buf(),
        source,
    })?;
    parse(&text, path)
}

/// Checks config text as if read from `file`; relative paths inside it are
/// resolved against `file`'s folder. Reads nothing from disk but the page
/// templates the text names.
pub fn parse(text: &str, file: &Path) -> Result<Config, ConfigError> {
    find_retired_keys(text, file)?;
    let raw: RawConfig = serde_norway::from_str(text).map_err(|e| yaml_error(&e, file))?;
    build(raw, file)
}
