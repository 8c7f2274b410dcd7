//! Why a config could not be loaded ([`ConfigError`]) and where in the file
//! ([`Place`]). Every message names the file and says what to change.

use std::fmt;
use std::io;
use std::path::PathBuf;

use super::{CONFIG_ENV, DEFAULT_CONFIG_PATH};

/// A place in the config file: the file, and the line and column when the
/// YAML parser knows them (both 1-based).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    pub file: PathBuf,
    pub line_column: Option<(usize, usize)>,
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some((line, column)) = self.line_column {
            write!(f, " line {line} column {column}")?;
        }
        Ok(())
    }
}

/// Why a config could not be loaded. Every message names the file and says
/// what to change; all of them are configuration errors (exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "cannot read config file {}: {source}; check the path given by --config, ${CONFIG_ENV} or the default {DEFAULT_CONFIG_PATH}, and its permissions",
        file.display()
    )]
    Read { file: PathBuf, source: io::Error },

    #[error("{at}: not valid YAML: {message}; fix the syntax")]
    Syntax { at: Place, message: String },

    #[error(
        "{at}: {key:?} was retired; set \"workflow: additive\" or \"workflow: replacement\" on the destination instead"
    )]
    Retired { at: Place, key: String },

    #[error("{at}: {message}; remove the key or fix its spelling")]
    UnknownKey {
        at: Place,
        key: String,
        message: String,
    },

    #[error("{at}: {message}")]
    Invalid { at: Place, message: String },

    #[error(
        "{}: pipeline id {id:?} is used by more than one pipeline; give every pipeline its own id",
        file.display()
    )]
    DuplicatePipeline { file: PathBuf, id: String },

    #[error(
        "{}: pipeline {pipeline:?} has more than one destination with id {id:?}; destination ids must be unique within a pipeline",
        file.display()
    )]
    DuplicateDestination {
        file: PathBuf,
        pipeline: String,
        id: String,
    },

    #[error(
        "{}: pipelines {first:?} and {second:?} share the inbox {}; give each pipeline its own inbox",
        file.display(),
        inbox.display()
    )]
    SharedInbox {
        file: PathBuf,
        first: String,
        second: String,
        inbox: PathBuf,
    },

    #[error(
        "{}: destinations {first:?} and {second:?} of pipeline {pipeline:?} have the same root {}; they would contend for one catalog, so give each its own path",
        file.display(),
        root.display()
    )]
    SharedRoot {
        file: PathBuf,
        pipeline: String,
        first: String,
        second: String,
        root: PathBuf,
    },

    #[error(
        "{}: {first} and {second} overlap (one is the other or lies inside it); move one of them",
        file.display()
    )]
    Overlap {
        file: PathBuf,
        first: String,
        second: String,
    },

    #[error(
        "{}: destination {destination:?} of pipeline {pipeline:?} publishes nothing; set publish.source or publish.html to true",
        file.display()
    )]
    PublishesNothing {
        file: PathBuf,
        pipeline: String,
        destination: String,
    },
}
