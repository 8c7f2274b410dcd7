//! What a reader sees while a publication runs (docs/contract.md §7): every
//! new or changed output that is not a page appears before any page, every
//! page before the catalog, and nothing is deleted before the catalog is
//! durable. Watched for real, outside the binary: with inotify on a local
//! root, and through a proxy that records what the binary asks of
//! SeaweedFS for an s3 destination.

use std::collections::{BTreeMap, BTreeSet};
use std::mem::MaybeUninit;
use std::path::Path;

use rustix::fs::inotify;

use crate::seaweed::{Bucket, Exchange, RecordingProxy, server};
use crate::util::{Test, assert_catalog_matches_disk};

/// A page, as the contract says: a name ending in `.html` or `.htm`.
fn is_page(path: &str) -> bool {
    path.ends_with(".html") || path.ends_with(".htm")
}

/// The first version of a site: stylesheets, a script, an image, pages
/// (rendered from markdown and written as HTML) and `bulk` more
/// stylesheets; some of it goes in the second version.
fn first_version(bulk: usize) -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = [
        ("assets/site.css", "body { color: black }\n"),
        ("assets/app.js", "let v = 1;\n"),
        ("assets/old.js", "let old = 1;\n"),
        ("img/logo.png", "a logo in both versions\n"),
        ("index.md", "# Home\n\nversion one\n"),
        ("docs/guide.md", "# Guide\n\nversion one\n"),
        ("docs/old.md", "# Old\n"),
        (
            "pages/about.html",
            "<link rel=stylesheet href=../assets/site.css>one\n",
        ),
        ("gone/only.txt", "the only file of its folder\n"),
    ]
    .iter()
    .map(|(p, c)| (p.to_string(), c.to_string()))
    .collect();
    files.extend((0..bulk).map(|i| {
        (
            format!("assets/bulk/{i:02}.css"),
            format!("/* {i} one */\n"),
        )
    }));
    files
}

/// The second version: every file changed but the logo, a new stylesheet
/// and a new page, in folders the first one made (so that a watch set
/// before the publication sees everything in them).
fn second_version(bulk: usize) -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = [
        ("assets/site.css", "body { color: navy }\n"),
        ("assets/app.js", "let v = 2;\n"),
        ("assets/new.css", "p { margin: 0 }\n"),
        ("img/logo.png", "a logo in both versions\n"),
        ("index.md", "# Home\n\nversion two\n"),
        ("docs/guide.md", "# Guide\n\nversion two\n"),
        (
            "pages/about.html",
            "<link rel=stylesheet href=../assets/new.css>two\n",
        ),
        ("pages/new.htm", "<p>new page\n"),
    ]
    .iter()
    .map(|(p, c)| (p.to_string(), c.to_string()))
    .collect();
    files.extend((0..bulk).map(|i| {
        (
            format!("assets/bulk/{i:02}.css"),
            format!("/* {i} two */\n"),
        )
    }));
    files
}

/// What the second version writes: every output but the unchanged logo.
fn written(bulk: usize) -> BTreeSet<String> {
    let mut paths: BTreeSet<String> = [
        "assets/site.css",
        "assets/app.js",
        "assets/new.css",
        "index.md",
        "index.html",
        "docs/guide.md",
        "docs/guide.html",
        "pages/about.html",
        "pages/new.htm",
    ]
    .iter()
    .map(|p| p.to_string())
    .collect();
    paths.extend((0..bulk).map(|i| format!("assets/bulk/{i:02}.css")));
    paths
}

/// What the second version deletes.
const DELETED: [&str; 5] = [
    "assets/old.js",
    "docs/old.md",
    "docs/old.html",
    "gone/only.txt",
    "gone",
];

fn config(endpoint: Option<(&str, &str)>) -> String {
    let backend = match endpoint {
        None => "path: ./root".to_owned(),
        Some((bucket, endpoint)) => {
            format!(
                "backend: s3\n        bucket: {bucket}\n        path: site\n        endpoint: {endpoint}"
            )
        }
    };
    format!(
        "spool: ./spool
pipelines:
  - id: p
    destinations:
      - id: d
        {backend}
        workflow: replacement
        publish: {{source: true, html: true}}
"
    )
}

/// What happened to a name in a watched root, in the order inotify told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seen {
    /// Renamed into place or created (the catalog too).
    Appeared(String),
    Deleted(String),
}

/// An inotify watch on every folder of a root, set before a publication.
pub(crate) struct Watch {
    fd: rustix::fd::OwnedFd,
    /// Each watch's folder, relative to the root ("" for the root).
    folders: BTreeMap<i32, String>,
}

impl Watch {
    /// Watches `root` and every real folder below it (never through a
    /// link: each is added with `IN_DONT_FOLLOW | IN_ONLYDIR`, after a
    /// `lstat` showed a folder).
    pub(crate) fn new(root: &Path) -> Watch {
        let fd = inotify::init(inotify::CreateFlags::NONBLOCK | inotify::CreateFlags::CLOEXEC)
            .expect("inotify_init1");
        let mut watch = Watch {
            fd,
            folders: BTreeMap::new(),
        };
        let mut pending = vec![String::new()];
        while let Some(folder) = pending.pop() {
            let path = root.join(&folder);
            let flags = inotify::WatchFlags::CREATE
                | inotify::WatchFlags::MOVED_TO
                | inotify::WatchFlags::DELETE
                | inotify::WatchFlags::DONT_FOLLOW
                | inotify::WatchFlags::ONLYDIR;
            let wd = inotify::add_watch(&watch.fd, &path, flags).expect("inotify_add_watch");
            watch.folders.insert(wd, folder.clone());
            for entry in std::fs::read_dir(&path).unwrap() {
                let entry = entry.unwrap();
                if entry.file_type().unwrap().is_dir() {
                    let name = entry.file_name().into_string().unwrap();
                    pending.push(match folder.is_empty() {
                        true => name,
                        false => format!("{folder}/{name}"),
                    });
                }
            }
        }
        watch
    }

    /// Every event queued so far, as names relative to the root; the
    /// binary's own temporary files and journal left out. A publication
    /// that has exited has queued all of its events (inotify queues each
    /// as the call that causes it returns).
    pub(crate) fn events(&self) -> Vec<Seen> {
        let mut buf = [MaybeUninit::uninit(); 1 << 16];
        let mut reader = inotify::Reader::new(&self.fd, &mut buf);
        let mut seen = Vec::new();
        loop {
            let event = match reader.next() {
                Ok(event) => event,
                Err(rustix::io::Errno::WOULDBLOCK) => return seen,
                Err(e) => panic!("reading inotify events: {e}"),
            };
            let flags = event.events();
            assert!(
                !flags.contains(inotify::ReadFlags::QUEUE_OVERFLOW),
                "the inotify queue overflowed"
            );
            let Some(name) = event.file_name() else {
                continue;
            };
            let name = name.to_str().unwrap();
            if name.starts_with(".distributor") && name != ".distributor.json" {
                continue;
            }
            let folder = &self.folders[&event.wd()];
            let path = match folder.is_empty() {
                true => name.to_owned(),
                false => format!("{folder}/{name}"),
            };
            if flags.intersects(inotify::ReadFlags::MOVED_TO | inotify::ReadFlags::CREATE) {
                seen.push(Seen::Appeared(path));
            } else if flags.contains(inotify::ReadFlags::DELETE) {
                seen.push(Seen::Deleted(path));
            }
        }
    }
}

/// Checks the order of `seen` (appearances and deletions in a root, in
/// the order they happened) against what the second version writes and
/// deletes.
#[track_caller]
fn assert_local_order(seen: &[Seen], bulk: usize, what: &str) {
    let at = |want: &dyn Fn(&Seen) -> bool| -> Vec<usize> {
        seen.iter()
            .enumerate()
            .filter(|(_, s)| want(s))
            .map(|(i, _)| i)
            .collect()
    };
    let appeared: BTreeSet<String> = seen
        .iter()
        .filter_map(|s| match s {
            Seen::Appeared(p) if p != ".distributor.json" => Some(p.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(appeared, written(bulk), "{what}: the names that appeared");
    let deleted: BTreeSet<&str> = seen
        .iter()
        .filter_map(|s| match s {
            Seen::Deleted(p) => Some(p.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(deleted, DELETED.into(), "{what}: the names deleted");

    let catalog = at(&|s| *s == Seen::Appeared(".distributor.json".into()));
    let [catalog] = catalog[..] else {
        panic!("{what}: the catalog was renamed into place {catalog:?} times: {seen:?}");
    };
    let others =
        at(&|s| matches!(s, Seen::Appeared(p) if !is_page(p) && !p.starts_with(".distributor")));
    let pages = at(&|s| matches!(s, Seen::Appeared(p) if is_page(p)));
    let deletions = at(&|s| matches!(s, Seen::Deleted(_)));
    let last_other = others.iter().max().unwrap();
    let first_page = pages.iter().min().unwrap();
    let last_page = pages.iter().max().unwrap();
    let first_deletion = deletions.iter().min().unwrap();
    assert!(
        last_other < first_page,
        "{what}: a page appeared before {:?}: {seen:#?}",
        seen[*last_other]
    );
    assert!(
        last_page < &catalog,
        "{what}: a page appeared after the catalog: {seen:#?}"
    );
    assert!(
        first_deletion > &catalog,
        "{what}: {:?} was deleted before the catalog was in place: {seen:#?}",
        seen[*first_deletion]
    );
}

/// A replacement watched with inotify: the new and changed outputs that
/// are not pages appear first, then the pages, then the catalog, and the
/// dropped outputs (and the folder they leave empty) go after it. A small
/// change (staged at the top of the root, renamed one by one) and a large
/// one (staged beside its targets, renamed on several threads).
#[test]
fn a_local_replacement_shows_other_outputs_then_pages_then_the_catalog_then_deletes() {
    for (what, bulk) in [("small", 0), ("large", 24)] {
        let t = Test::new();
        t.config(&config(None));
        let v1 = t.bundle_at("v1", "site", "2026-06-01T00:00:00Z", &first_version(bulk));
        let v2 = t.bundle_at("v2", "site", "2026-06-02T00:00:00Z", &second_version(bulk));
        t.publish("p", &v1, &[]).expect_code(0);

        let root = t.join("root");
        let watch = Watch::new(&root);
        let out = t.publish("p", &v2, &[]);
        out.expect_code(0);
        assert_eq!(out.dest()["action"], "replace_catalog", "{what}");
        assert_local_order(&watch.events(), bulk, what);
        assert_catalog_matches_disk(&root);
    }
}

/// The key of an output or catalog in `target` (`/<bucket>/site/<key>?...`),
/// when the request is about one.
fn key_of<'a>(target: &'a str, bucket: &str) -> Option<&'a str> {
    let path = target.split('?').next()?;
    path.strip_prefix('/')?
        .strip_prefix(bucket)?
        .strip_prefix("/site/")
}

/// The same replacement in a bucket, through a proxy that records when
/// each request reached SeaweedFS's side and when its answer came back:
/// the first page PUT starts after every other output's PUT succeeded,
/// the catalog PUT after every page's, and every DELETE after the catalog.
#[test]
fn an_s3_replacement_puts_other_outputs_then_pages_then_the_catalog_then_deletes() {
    let bulk = 20;
    let bucket = Bucket::new("site");
    let proxy = RecordingProxy::start(&server().endpoint);
    let name = bucket.location.bucket.clone();
    let t = Test::new();
    t.config(&config(Some((&name, &proxy.endpoint))));
    let v1 = t.bundle_at("v1", "site", "2026-06-01T00:00:00Z", &first_version(bulk));
    let v2 = t.bundle_at("v2", "site", "2026-06-02T00:00:00Z", &second_version(bulk));
    let creds = server().credentials();
    let publish = |bundle: &Path| {
        let out = t
            .cmd()
            .env("AWS_ACCESS_KEY_ID", &creds.key_id)
            .env("AWS_SECRET_ACCESS_KEY", &creds.secret)
            .args([
                "--config",
                "config.yaml",
                "run",
                "--json",
                "--pipeline",
                "p",
            ])
            .arg(bundle)
            .output();
        out.expect_code(0);
        out
    };
    publish(&v1);
    proxy.take();
    let out = publish(&v2);
    assert_eq!(out.dest()["action"], "replace_catalog");
    let log = proxy.take();

    let ok = |e: &Exchange| (200..300).contains(&e.status);
    let puts: Vec<(&str, &Exchange)> = log
        .iter()
        .filter(|e| e.method == "PUT" && ok(e))
        .filter_map(|e| Some((key_of(&e.target, &name)?, e)))
        .filter(|(key, _)| !key.starts_with(".distributor"))
        .collect();
    let put_keys: BTreeSet<String> = puts.iter().map(|(k, _)| k.to_string()).collect();
    assert_eq!(put_keys, written(bulk), "the objects written");
    // A DELETE of one key, or a multi-object delete naming keys.
    let deletes: Vec<(&str, &Exchange)> = log
        .iter()
        .filter(|e| ok(e))
        .flat_map(|e| {
            let keys: Vec<&str> = match e.method.as_str() {
                "DELETE" => key_of(&e.target, &name).into_iter().collect(),
                "POST" => e
                    .deletes
                    .iter()
                    .filter_map(|k| k.strip_prefix("site/"))
                    .collect(),
                _ => Vec::new(),
            };
            keys.into_iter().map(move |k| (k, e))
        })
        .filter(|(key, _)| !key.starts_with(".distributor"))
        .collect();
    let deleted: BTreeSet<&str> = deletes.iter().map(|(k, _)| *k).collect();
    // No folder in a bucket.
    assert_eq!(
        deleted,
        DELETED[..4].iter().copied().collect(),
        "the objects deleted"
    );
    let catalog: Vec<&Exchange> = log
        .iter()
        .filter(|e| {
            e.method == "PUT" && ok(e) && key_of(&e.target, &name) == Some(".distributor.json")
        })
        .collect();
    let [catalog] = catalog[..] else {
        panic!("{} catalog PUTs succeeded: {log:#?}", catalog.len());
    };

    let (pages, others): (Vec<_>, Vec<_>) = puts.iter().partition(|(k, _)| is_page(k));
    let first_page = pages.iter().min_by_key(|(_, e)| e.started).unwrap();
    for (key, e) in &others {
        assert!(
            e.answered < first_page.1.started,
            "{key} was still being PUT when the page {} was sent: {log:#?}",
            first_page.0
        );
    }
    for (key, e) in &pages {
        assert!(
            e.answered < catalog.started,
            "the catalog was sent before the page {key} was stored: {log:#?}"
        );
    }
    for (key, e) in &deletes {
        assert!(
            e.started > catalog.answered,
            "{key} was deleted before the catalog was stored: {log:#?}"
        );
    }
    bucket.assert_records_match_objects();
}
