//! Why a bundle cannot be used: [`BundleError`] and the per-file
//! [`Problem`]s it carries, each naming the file and what to do.

use super::MANIFEST;
use crate::fs::io_class;
use std::fmt;
use std::io;
use std::path::PathBuf;

/// One thing wrong with a bundle, with the file it concerns and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub path: Option<String>,
    pub message: String,
}

impl Problem {
    pub(super) fn at(path: impl Into<String>, message: impl Into<String>) -> Problem {
        Problem {
            path: Some(path.into()),
            message: message.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.path {
            Some(path) => write!(f, "{path}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

/// Why a bundle cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// The bundle folder or its `manifest.json` could not be opened or read.
    /// `message` says what happened and what to do; `io` keeps the original
    /// error when there was one.
    #[error("{}: {message}", path.display())]
    Unreadable {
        path: PathBuf,
        message: String,
        io: Option<io::Error>,
    },
    /// `manifest.json` is not valid JSON, does not follow the schema, or is
    /// inconsistent in itself (duplicate paths, wrong digest).
    #[error("{}", manifest_location(.line, .column, .message))]
    Manifest {
        line: Option<usize>,
        column: Option<usize>,
        message: String,
    },
    /// The manifest is fine but the files are not: every problem found.
    #[error("{}", invalid_summary(.problems))]
    Invalid { problems: Vec<Problem> },
    /// The pipeline takes signed bundles and this one's signature was
    /// refused (docs/contract.md §17.4).
    #[error(transparent)]
    Signature(crate::signature::SignatureRefusal),
}

impl BundleError {
    /// True when retrying later may succeed (a passing I/O condition such as
    /// running out of file descriptors or an I/O error), false when the
    /// bundle itself is wrong.
    pub fn is_transient(&self) -> bool {
        match self {
            BundleError::Unreadable { io: Some(e), .. } => io_class::is_transient_reading_bundle(e),
            _ => false,
        }
    }

    pub(super) fn manifest(message: impl Into<String>) -> BundleError {
        BundleError::Manifest {
            line: None,
            column: None,
            message: message.into(),
        }
    }

    pub(super) fn manifest_at(
        line: usize,
        column: usize,
        message: impl Into<String>,
    ) -> BundleError {
        BundleError::Manifest {
            line: Some(line),
            column: Some(column),
            message: message.into(),
        }
    }
}

fn manifest_location(line: &Option<usize>, column: &Option<usize>, message: &str) -> String {
    match (*line, *column) {
        (Some(line), Some(column)) => format!("{MANIFEST} line {line} column {column}: {message}"),
        (Some(line), None) => format!("{MANIFEST} line {line}: {message}"),
        _ => format!("{MANIFEST}: {message}"),
    }
}

/// Problems named in one [`BundleError::Invalid`] message; the rest are
/// counted. The message is one line (it goes into logs and the result
/// JSON); `bundle verify` prints every problem on its own line.
pub const PROBLEMS_SHOWN: usize = 10;

fn invalid_summary(problems: &[Problem]) -> String {
    let n = problems.len();
    let list: Vec<String> = problems
        .iter()
        .take(PROBLEMS_SHOWN)
        .map(Problem::to_string)
        .collect();
    let more = if n > PROBLEMS_SHOWN {
        format!(
            "; and {} more (distributor bundle verify DIR lists each)",
            n - PROBLEMS_SHOWN
        )
    } else {
        String::new()
    };
    format!(
        "bundle does not match {MANIFEST} ({n} problem{}): {}{more}",
        if n == 1 { "" } else { "s" },
        list.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_summary_counts_and_caps_the_list() {
        let problems = |n: usize| -> Vec<Problem> {
            (0..n)
                .map(|i| Problem::at(format!("f{i}"), "gone"))
                .collect()
        };
        assert_eq!(
            invalid_summary(&problems(1)),
            "bundle does not match manifest.json (1 problem): f0: gone"
        );
        let many = invalid_summary(&problems(78));
        assert!(
            many.starts_with(
                "bundle does not match manifest.json (78 problems): f0: gone; f1: gone;"
            ),
            "{many}"
        );
        assert!(many.contains("f9: gone; and 68 more"), "{many}");
        assert!(!many.contains("f10"), "{many}");
        assert!(!many.contains('\n'), "{many}");
    }
}
