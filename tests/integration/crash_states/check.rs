//! The invariants, read off listings of the test folder: a root's catalog
//! matches its files, an output at its final name holds the bytes of a
//! publication, nothing is left of a journal or a temporary file, a file
//! the catalog does not own is untouched, and a bundle is in exactly one
//! spool folder, whole.

use super::Listing;
use super::model::Shown;
use crate::util::{is_reserved, records, sha256};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;

pub const CATALOG: &str = ".distributor.json";

/// What a root shows below `root` (a top-level link followed, as a
/// reader of a release root would), by path relative to it.
pub fn view(l: &Listing, root: &str) -> Listing {
    let base = match l.get(root) {
        Some(Shown::Symlink(t)) => {
            let t = String::from_utf8_lossy(t).into_owned();
            match root.rsplit_once('/') {
                Some((parent, _)) => format!("{parent}/{t}"),
                None => t,
            }
        }
        _ => root.to_owned(),
    };
    let prefix = format!("{base}/");
    l.iter()
        .filter_map(|(p, v)| p.strip_prefix(&prefix).map(|r| (r.to_owned(), v.clone())))
        .collect()
}

/// The regular files of a view that are outputs (not the tool's names).
pub fn outputs(v: &Listing) -> BTreeMap<String, Arc<Vec<u8>>> {
    v.iter()
        .filter(|(p, _)| !is_reserved(p))
        .filter_map(|(p, s)| match s {
            Shown::File { data, .. } => Some((p.clone(), data.clone())),
            _ => None,
        })
        .collect()
}

fn data_at<'a>(v: &'a Listing, path: &str) -> Option<&'a Arc<Vec<u8>>> {
    match v.get(path) {
        Some(Shown::File { data, .. }) => Some(data),
        _ => None,
    }
}

/// A crash state's outputs: each holds the bytes it had before the
/// command or the bytes the command left there, never others.
pub fn outputs_are_versions(
    initial: &Listing,
    reference: &Listing,
    state: &Listing,
    root: &str,
) -> Vec<String> {
    let (before, after) = (view(initial, root), view(reference, root));
    let mut found = Vec::new();
    for (path, data) in outputs(&view(state, root)) {
        let old = data_at(&before, &path) == Some(&data);
        let new = data_at(&after, &path) == Some(&data);
        if !old && !new {
            found.push(format!(
                "{root}/{path} holds {} bytes of no publication: {:?}",
                data.len(),
                String::from_utf8_lossy(&data[..data.len().min(40)])
            ));
        }
    }
    found
}

/// A release root's crash state: what its link shows is one release whole,
/// the one before the command or the one it made.
pub fn release_is_whole(
    initial: &Listing,
    reference: &Listing,
    state: &Listing,
    root: &str,
) -> Vec<String> {
    let now = outputs(&view(state, root));
    if now == outputs(&view(initial, root)) || now == outputs(&view(reference, root)) {
        return Vec::new();
    }
    vec![format!(
        "{root} shows neither the release before nor the one after: {:?}",
        now.keys().collect::<Vec<_>>()
    )]
}

/// The catalog of a view, parsed (`Err` with why when it cannot be).
pub fn catalog(v: &Listing) -> Result<Option<Value>, String> {
    match v.get(CATALOG) {
        None => Ok(None),
        Some(Shown::File { data, .. }) => serde_json::from_slice(data)
            .map(Some)
            .map_err(|e| format!("the catalog is not JSON ({e})")),
        Some(other) => Err(format!("the catalog is {}", super::model::brief(other))),
    }
}

/// A settled root, after a restart: no journal and no temporary file,
/// every record matching its file, every output recorded unless
/// `planted` (files the test put there, which must hold what they held
/// before).
pub fn settled(initial: &Listing, now: &Listing, root: &str, planted: &[&str]) -> Vec<String> {
    let v = view(now, root);
    let mut found = Vec::new();
    for path in v.keys() {
        let name = path.rsplit('/').next().unwrap_or(path);
        if name.starts_with(".distributor-tmp-") || name.starts_with(".distributor-journal") {
            found.push(format!("{root}/{path} is left over"));
        }
    }
    let recs = match catalog(&v) {
        Ok(Some(c)) => records(&c),
        Ok(None) => BTreeMap::new(),
        Err(e) => return vec![format!("{root}: {e}")],
    };
    for (path, r) in &recs {
        match data_at(&v, path) {
            None => found.push(format!("{root}/{path} is recorded but is no file")),
            Some(data) => {
                if r["size"].as_u64() != Some(data.len() as u64)
                    || r["sha256"].as_str() != Some(&sha256(data))
                {
                    found.push(format!("{root}/{path} does not hold what its record says"));
                }
            }
        }
    }
    let before = view(initial, root);
    for path in outputs(&v).keys() {
        if !recs.contains_key(path) && !planted.contains(&path.as_str()) {
            found.push(format!("{root}/{path} is on disk but not recorded"));
        }
    }
    found.extend(planted_kept(&before, &v, root, planted));
    found
}

/// Files the test planted in a root still hold what they held.
pub fn planted_kept(before: &Listing, now: &Listing, root: &str, planted: &[&str]) -> Vec<String> {
    planted
        .iter()
        .filter(|p| data_at(before, p) != data_at(now, p))
        .map(|p| format!("{root}/{p}, a file the catalog does not own, was changed or removed"))
        .collect()
}

/// The record fields that say which bytes of which publication a path
/// holds (the times aside).
fn owned(catalog: Option<Value>) -> BTreeMap<String, String> {
    catalog
        .map(|c| {
            records(&c)
                .into_iter()
                .map(|(p, r)| {
                    let key = ["pipeline_id", "destination_id", "kind", "sha256", "size"]
                        .iter()
                        .map(|k| r[*k].to_string())
                        .chain([r["source"]["id"].to_string()])
                        .collect::<Vec<_>>()
                        .join(" ");
                    (p, key)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// After a restart, a root holds what the command left when it was not
/// interrupted: the same outputs and records.
/// Up to five keys whose values differ between `a` and `b` (either side
/// missing counts).
fn first_differences<'m, V: PartialEq>(
    a: &'m BTreeMap<String, V>,
    b: &'m BTreeMap<String, V>,
) -> Vec<&'m String> {
    a.keys()
        .chain(b.keys())
        .filter(|p| a.get(*p) != b.get(*p))
        .take(5)
        .collect()
}

pub fn as_reference(reference: &Listing, now: &Listing, root: &str) -> Vec<String> {
    let (want, got) = (view(reference, root), view(now, root));
    let mut found = Vec::new();
    let (a, b) = (outputs(&want), outputs(&got));
    if a != b {
        let differ = first_differences(&a, &b);
        found.push(format!(
            "{root} differs from the uncrashed run at {differ:?}"
        ));
    }
    let (a, b) = (
        owned(catalog(&want).ok().flatten()),
        owned(catalog(&got).ok().flatten()),
    );
    if a != b {
        let differ = first_differences(&a, &b);
        found.push(format!(
            "{root}'s records differ from the uncrashed run's at {differ:?}"
        ));
    }
    found
}

/// Where each bundle of spool `pipeline` (by manifest id) is:
/// `(folder, name)` for every copy found in inbox, work, done, failed.
pub fn bundles(l: &Listing, pipeline: &str) -> BTreeMap<String, Vec<(String, String)>> {
    let mut out: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for folder in ["inbox", "work", "done", "failed"] {
        let prefix = format!("spool/{pipeline}/{folder}/");
        for (path, shown) in l.range(prefix.clone()..) {
            let Some(rest) = path.strip_prefix(&prefix) else {
                break;
            };
            let Some((name, "manifest.json")) = rest.split_once('/') else {
                continue;
            };
            let Shown::File { data, .. } = shown else {
                continue;
            };
            let id = serde_json::from_slice::<Value>(data)
                .ok()
                .and_then(|m| m["id"].as_str().map(str::to_owned))
                .unwrap_or_else(|| format!("<unreadable manifest at {path}>"));
            out.entry(id)
                .or_default()
                .push((folder.to_owned(), name.to_owned()));
        }
    }
    out
}

/// The files a producer put in a bundle folder (the agent's own aside).
fn bundle_files(l: &Listing, dir: &str) -> BTreeMap<String, Arc<Vec<u8>>> {
    let prefix = format!("{dir}/");
    l.range(prefix.clone()..)
        .take_while(|(p, _)| p.starts_with(&prefix))
        .filter(|(p, _)| !is_reserved(p))
        .filter_map(|(p, s)| match s {
            Shown::File { data, .. } => Some((p[prefix.len()..].to_owned(), data.clone())),
            _ => None,
        })
        .collect()
}

/// Every bundle the spool started with is in exactly one of its folders,
/// with the files it had; returns the violations and each bundle's folder.
pub fn spool_whole(
    initial: &Listing,
    now: &Listing,
    pipeline: &str,
) -> (Vec<String>, BTreeMap<String, String>) {
    let (before, after) = (bundles(initial, pipeline), bundles(now, pipeline));
    let mut found = Vec::new();
    let mut place = BTreeMap::new();
    for (id, was) in &before {
        let (from_folder, from_name) = &was[0];
        let from = format!("spool/{pipeline}/{from_folder}/{from_name}");
        match after.get(id).map(Vec::as_slice) {
            None | Some([]) => found.push(format!("bundle {id} is in no spool folder")),
            Some([(folder, name)]) => {
                let at = format!("spool/{pipeline}/{folder}/{name}");
                if bundle_files(initial, &from) != bundle_files(now, &at) {
                    found.push(format!(
                        "bundle {id} in {folder}/{name} lost or changed files"
                    ));
                }
                place.insert(id.clone(), folder.clone());
            }
            Some(many) => found.push(format!("bundle {id} is in more than one place: {many:?}")),
        }
    }
    for id in after.keys() {
        if !before.contains_key(id) {
            found.push(format!("bundle {id} appeared"));
        }
    }
    (found, place)
}
