//! Shared roots (docs/contract.md §17.2): destinations of different
//! pipelines whose roots are one folder (or bucket path), or one inside the
//! other, and whose scopes overlap. Such pipelines can overwrite and take
//! over each other's outputs, so `config check` names every such pair with
//! the fix. Roots are compared as text, never looked up on disk.

use std::path::{Component, Path};

use serde::Serialize;

use super::model::{Backend, Config, Destination, Pipeline};
use super::relations::clash_key;
use crate::paths::RelPath;
use crate::scope::Scope;

/// One destination of a [`SharedRoot`] pair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Sharer {
    pub pipeline_id: String,
    pub destination_id: String,
    /// The root, as reports show it (a folder, or `s3://bucket/path`).
    pub root: String,
    /// The scope's entries; `None` for the whole root.
    pub scope: Option<Vec<String>>,
}

/// Two destinations of different pipelines that may write the same paths.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SharedRoot {
    /// The destination whose root holds the other's (or the first of two
    /// on one root).
    pub outer: Sharer,
    pub inner: Sharer,
    /// Where the inner root lies in the outer one; `None` when the roots
    /// are the same.
    pub inside: Option<String>,
    /// What to change.
    pub fix: String,
}

impl SharedRoot {
    /// The warning `config check` prints.
    pub fn to_text(&self) -> String {
        let (o, i) = (&self.outer, &self.inner);
        let name = |s: &Sharer| {
            format!(
                "destination {:?} of pipeline {:?} (root {})",
                s.destination_id, s.pipeline_id, s.root
            )
        };
        let scope = |s: &Sharer| match &s.scope {
            None => "no scope, the whole root".to_owned(),
            Some(entries) => format!("scope {entries:?}"),
        };
        let (how, harm) = match &self.inside {
            None => (
                "share one root".to_owned(),
                "each pipeline can overwrite and take over the other's outputs there",
            ),
            // Two catalogs: a file of one is unmanaged content to the other.
            Some(sub) => (
                format!("lie one inside the other (the second at {sub}/ of the first)"),
                "both pipelines can write the same files there, so each can block the other's publications (fail_unmanaged), and a forced publication (--force) of the first deletes the second's files",
            ),
        };
        format!(
            "{} and {} {how}, and their scopes overlap ({}; {}): {harm}; {}",
            name(o),
            name(i),
            scope(o),
            scope(i),
            self.fix
        )
    }
}

/// Every pair of destinations of different pipelines whose roots are the
/// same or nested and whose scopes overlap, in config order.
pub fn shared_roots(config: &Config) -> Vec<SharedRoot> {
    let mut found = Vec::new();
    for (i, p) in config.pipelines.iter().enumerate() {
        for q in &config.pipelines[i + 1..] {
            for a in &p.destinations {
                for b in &q.destinations {
                    if let Some(shared) = pair(p, a, q, b) {
                        found.push(shared);
                    }
                }
            }
        }
    }
    found
}

/// How two roots relate.
enum Roots {
    Apart,
    Same,
    /// The second lies in the first, at this folder of it.
    FirstHolds(Option<RelPath>),
    SecondHolds(Option<RelPath>),
}

/// The pair `a` (of pipeline `p`) and `b` (of `q`), when they may write
/// the same paths.
fn pair(p: &Pipeline, a: &Destination, q: &Pipeline, b: &Destination) -> Option<SharedRoot> {
    let ((outer_p, outer), (inner_p, inner), sub) = match relate(a, b) {
        Roots::Apart => return None,
        Roots::Same => ((p, a), (q, b), None),
        Roots::FirstHolds(sub) => ((p, a), (q, b), Some(sub)),
        Roots::SecondHolds(sub) => ((q, b), (p, a), Some(sub)),
    };
    let overlap = match &sub {
        None => match (&outer.scope, &inner.scope) {
            (Some(x), Some(y)) => x.overlaps(y),
            _ => true,
        },
        // A folder the scope rules cannot name (never for roots the config
        // resolved): count it as overlapping.
        Some(None) => true,
        Some(Some(sub)) => {
            let seen_from_outer = match &inner.scope {
                Some(s) => s.under(sub),
                None => Scope::folder(sub),
            };
            outer
                .scope
                .as_ref()
                .is_none_or(|s| s.overlaps(&seen_from_outer))
        }
    };
    if !overlap {
        return None;
    }
    let sharer = |p: &Pipeline, d: &Destination| Sharer {
        pipeline_id: p.id.clone(),
        destination_id: d.id.clone(),
        root: d.root_label(),
        scope: d.scope.as_ref().map(|s| s.entries().to_vec()),
    };
    let inside = sub.map(|s| s.map_or_else(|| "?".to_owned(), |s| s.to_string()));
    let fix = match &inside {
        None => format!(
            "give each destination a scope, the two disjoint (such as scope: [\"{}/\"] for {:?} and scope: [\"{}/\"] for {:?}); see docs/security.md",
            outer_p.id, outer.id, inner_p.id, inner.id
        ),
        Some(sub) => format!(
            "give each destination a scope, the two disjoint once {:?}'s paths are read as {sub}/... (the simplest: a scope for {:?} that leaves out {sub}/); see docs/security.md",
            inner.id, outer.id
        ),
    };
    Some(SharedRoot {
        outer: sharer(outer_p, outer),
        inner: sharer(inner_p, inner),
        inside,
        fix,
    })
}

fn relate(a: &Destination, b: &Destination) -> Roots {
    match (&a.backend, &b.backend) {
        (Backend::Local, Backend::Local) => {
            let (x, y) = (clash_key(&a.root), clash_key(&b.root));
            if x == y {
                Roots::Same
            } else if let Ok(rest) = y.strip_prefix(&x) {
                Roots::FirstHolds(folder(rest))
            } else if let Ok(rest) = x.strip_prefix(&y) {
                Roots::SecondHolds(folder(rest))
            } else {
                Roots::Apart
            }
        }
        // One bucket on one server (region aside: a bucket name is the
        // same bucket whatever region a client names).
        (Backend::S3(x), Backend::S3(y)) if x.bucket == y.bucket && x.endpoint == y.endpoint => {
            let below = |outer: &str, inner: &str| {
                if outer.is_empty() {
                    Some(inner.to_owned())
                } else {
                    inner
                        .strip_prefix(outer)
                        .and_then(|r| r.strip_prefix('/'))
                        .map(str::to_owned)
                }
            };
            if x.path == y.path {
                Roots::Same
            } else if let Some(rest) = below(&x.path, &y.path) {
                Roots::FirstHolds(RelPath::parse(&rest).ok())
            } else if let Some(rest) = below(&y.path, &x.path) {
                Roots::SecondHolds(RelPath::parse(&rest).ok())
            } else {
                Roots::Apart
            }
        }
        _ => Roots::Apart,
    }
}

/// A relative folder of a root as a clean relative path, if it is one.
fn folder(rest: &Path) -> Option<RelPath> {
    let segments: Option<Vec<&str>> = rest
        .components()
        .map(|c| match c {
            Component::Normal(s) => s.to_str(),
            _ => None,
        })
        .collect();
    RelPath::parse(&segments?.join("/")).ok()
}
