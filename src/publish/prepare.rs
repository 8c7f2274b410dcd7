//! Preparing a bundle before any lock is taken: inspecting it (manifest,
//! file types and sizes, signature), rendering its markdown where a
//! destination wants HTML, computing each destination's outputs (their
//! precompressed siblings made too), and the signer's scopes that bound
//! what a replacement deletes. It never writes
//! and never reads the clock: the time is the publication's.

use super::content::{Content, Scratch, Spill};
use super::error::Error;
use super::precompress::{self, Planned};
use crate::bundle::{self, VerifiedBundle};
use crate::catalog::{MARKDOWN_TO_HTML, OutputKind, Sha256, SourceIdentity};
use crate::config::{self, Destination, Pipeline};
use crate::fs::hashing::{self, Hashed};
use crate::paths::RelPath;
use crate::plan::{self, Desired};
use crate::render::RenderOptions;
use crate::render::child::{ChildError, Pool, render_in_child};
use crate::report::{DestinationReport, RunReport, SourceReport};
use crate::runtime::process_state::ProcessState;
use crate::scope::Scope;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::Path;
use std::sync::Arc;

/// A markdown file read (and verified) for rendering, and its HTML.
/// Both are shared with every destination that publishes them (one copy
/// of a big page, however many destinations).
struct Page {
    /// The markdown, when the bundle's memory budget kept it (else a copy
    /// is read from the bundle again).
    markdown: Option<Arc<Content>>,
    html: Arc<Content>,
    /// The page's size and sha256, hashed once.
    hashed: Hashed,
}

/// Rendered pages, keyed by the markdown file's bundle path.
type Rendered = BTreeMap<RelPath, Page>;

/// One destination, prepared before any lock is taken.
pub(super) struct Prepared {
    pub(super) desired: Arc<[Desired]>,
    /// Outputs whose bytes the publication holds, by output path: rendered
    /// HTML, precompressed siblings, and markdown sources read and verified
    /// for rendering (staged from here rather than read from the bundle a
    /// second time).
    pub(super) in_memory: BTreeMap<RelPath, Arc<Content>>,
}

/// One destination's outputs before their siblings are made: the
/// bundle's, sorted by path, and the siblings planned for them.
struct Outputs {
    desired: Vec<Desired>,
    in_memory: BTreeMap<RelPath, Arc<Content>>,
    siblings: Vec<Planned>,
}

fn destination_report(d: &Destination) -> DestinationReport {
    DestinationReport::new(&d.id, d.root_label(), d.workflow.as_str())
}

/// A bundle inspected, rendered and mapped to each destination's outputs.
pub(super) struct Ready {
    pub(super) report: RunReport,
    pub(super) bundle: VerifiedBundle,
    pub(super) source: SourceIdentity,
    pub(super) prepared: Vec<Prepared>,
    /// Bundle files whose bytes have been hashed and matched the manifest.
    pub(super) verified: BTreeSet<RelPath>,
    /// The scopes of the principals that signed the bundle, when the
    /// pipeline limits principals (`signatures.scopes`): a replacement
    /// deletes only inside them, so that one principal never deletes what
    /// another published (docs/contract.md §17.4). `None`: everywhere.
    pub(super) delete_within: Option<Vec<Scope>>,
}

/// Inspects the bundle (manifest, file types and sizes), renders its
/// markdown where a destination wants HTML, and computes every
/// destination's outputs. Takes no lock. The error is the finished report.
/// Pages too big to hold go to unnamed files in `scratch`. `now`: the
/// publication's time, against which a `created` in the future is told.
pub(super) fn prepare_bundle(
    pipeline: &Pipeline,
    destinations: &[&Destination],
    bundle_dir: &Path,
    dry_run: bool,
    scratch: &Path,
    process: &ProcessState,
    now: time::OffsetDateTime,
) -> Result<Ready, Box<RunReport>> {
    let mut report = RunReport::new(&pipeline.id, dry_run);
    let policy = pipeline
        .signatures
        .as_ref()
        .map(|s| bundle::SignaturePolicy {
            signers: &s.signers,
            namespace: &s.namespace,
            required: s.required,
        });
    // Unit tests may make a bundle unreadable (crate::backend::memory).
    #[cfg(test)]
    let readable = crate::backend::memory::read_bundle(bundle_dir);
    #[cfg(not(test))]
    let readable = Ok(());
    let inspected = readable
        .and_then(|()| bundle::inspect(bundle_dir, &pipeline.limits, policy, &process.per_core()));
    let bundle = match inspected {
        Ok(b) => b,
        Err(e) => {
            report.source = bundle::read_manifest(bundle_dir)
                .ok()
                .map(|m| SourceReport {
                    id: m.id.clone(),
                    digest: m.digest.clone(),
                    created: m.created_text(),
                });
            return Err(Box::new(Error::Bundle(e).fail(report)));
        }
    };
    let m = &bundle.manifest;
    report.source = Some(SourceReport {
        id: m.id.clone(),
        digest: m.digest.clone(),
        created: m.created_text(),
    });
    report.warnings = bundle.warnings.clone();
    report.signer = bundle.signer.clone();
    if let Some(why) = from_the_future(pipeline, m.created, now) {
        return Err(Box::new(Error::FromTheFuture(why).fail(report)));
    }
    if bundle.signer.is_none() && pipeline.signatures.is_some() {
        report.warnings.push(format!(
            "the bundle is not signed; pipeline {} takes it because signatures.required is false (set it to true once every producer signs)",
            pipeline.id
        ));
    }
    let source = SourceIdentity {
        id: m.id.clone(),
        digest: m.digest.clone(),
        created: m.created,
    };
    report.destinations = destinations.iter().map(|d| destination_report(d)).collect();
    // Bundle files whose bytes have been hashed and matched the manifest.
    let mut verified: BTreeSet<RelPath> = BTreeSet::new();

    // Prepare every destination's outputs (rendering included) before locking.
    // Pages rendered so far, by what shapes them (raw_html, template).
    let mut rendered: Vec<((config::RawHtml, Option<&config::HtmlTemplate>), Rendered)> =
        Vec::new();
    let mut room = Scratch::new(scratch);
    // Siblings made so far, shared by the destinations that publish them.
    let mut made = precompress::Made::new();
    let mut prepared = Vec::new();
    for (i, d) in destinations.iter().enumerate() {
        let html = if d.publish_html {
            let key = (d.raw_html, d.html_template.as_ref());
            if !rendered.iter().any(|(k, _)| *k == key) {
                match render_all(
                    &bundle,
                    d,
                    &pipeline.limits,
                    process.renderers(),
                    &mut verified,
                    &mut room,
                    &mut report.warnings,
                ) {
                    Ok(r) => rendered.push((key, r)),
                    Err(e) => return Err(Box::new(e.fail(report))),
                }
            }
            rendered.iter().find(|(k, _)| *k == key).map(|(_, r)| r)
        } else {
            None
        };
        let Outputs {
            mut desired,
            mut in_memory,
            siblings,
        } = match prepare(pipeline, d, &bundle, html) {
            Ok(p) => p,
            Err(e) => {
                report.destinations[i].error = Some(e.clone());
                let e = Error::Invalid {
                    destination: d.id.clone(),
                    why: e,
                };
                return Err(Box::new(e.fail(report)));
            }
        };
        let url = |p: &RelPath| d.base_url.as_ref().map(|b| plan::output_url(b, p));
        if let Err(e) = precompress::make(
            siblings,
            &mut desired,
            &mut in_memory,
            &url,
            &bundle,
            &mut made,
            &mut room,
            &mut verified,
            &mut report.warnings,
            &process.per_core(),
        ) {
            return Err(Box::new(e.fail(report)));
        }
        desired.sort_by(|a, b| a.path.as_str().cmp(b.path.as_str()));
        prepared.push(Prepared {
            desired: desired.into(),
            in_memory,
        });
    }

    let mut delete_within = None;
    if let (Some(signer), Some(scopes)) = (
        &bundle.signer,
        pipeline.signatures.as_ref().and_then(|s| s.scopes.as_ref()),
    ) {
        delete_within = Some(
            (signer.principals.iter())
                .filter_map(|p| scopes.get(p).cloned())
                .collect(),
        );
        let paths = prepared
            .iter()
            .flat_map(|p| p.desired.iter().map(|d| d.path.as_str()));
        match crate::signature::check_scopes(signer, scopes, paths) {
            Ok(principal) => {
                if let Some(s) = &mut report.signer {
                    s.principal = principal;
                }
            }
            Err(refusal) => {
                // The signature was valid: who tried stays in the result.
                return Err(Box::new(Error::Scope(refusal).fail(report)));
            }
        }
    }
    Ok(Ready {
        report,
        bundle,
        source,
        prepared,
        verified,
        delete_within,
    })
}

/// How far ahead of this machine's clock a bundle's `created` may be
/// where `signatures.refuse_older` holds.
const CLOCK_SKEW: time::Duration = time::Duration::hours(1);

/// Why a bundle is refused for a `created` in the future, on a pipeline
/// with `signatures.refuse_older`: every later bundle touching its paths
/// would be refused as older (docs/contract.md §17.5).
fn from_the_future(
    pipeline: &Pipeline,
    created: time::OffsetDateTime,
    now: time::OffsetDateTime,
) -> Option<String> {
    let refuse_older = pipeline.refuses_older();
    (refuse_older && created > now + CLOCK_SKEW).then(|| {
        use crate::catalog::format_time;
        format!(
            "manifest.json: created {} is more than an hour ahead of this machine's clock ({}); with signatures.refuse_older, a bundle from the future would make every later bundle of its paths look older and be refused. Seal it with the right time (check the producer's clock)",
            format_time(created),
            format_time(now)
        )
    })
}

/// Reads every markdown file of the bundle (checking its bytes against the
/// manifest) and renders it. What the bundle holds in memory is bounded by
/// `room` (see [`Scratch`]); a page that outgrows it and cannot go to the
/// scratch file stays in memory, and `warnings` say why.
fn render_all(
    bundle: &VerifiedBundle,
    d: &Destination,
    limits: &bundle::Limits,
    renderers: &Pool,
    verified: &mut BTreeSet<RelPath>,
    room: &mut Scratch,
    warnings: &mut Vec<String>,
) -> Result<Rendered, Error> {
    let md: Vec<&bundle::ManifestFile> = bundle
        .manifest
        .files
        .iter()
        .filter(|f| f.path.as_str().ends_with(".md"))
        .collect();
    let too_big: Vec<bundle::Problem> = md
        .iter()
        .filter_map(|f| bundle::markdown_too_big(f.path.as_str(), f.size, limits))
        .collect();
    if !too_big.is_empty() {
        return Err(Error::Bundle(bundle::BundleError::Invalid {
            problems: too_big,
        }));
    }
    let generated: BTreeSet<String> = md.iter().map(|f| f.path.as_str().to_owned()).collect();
    let template = d.html_template.as_ref().map(|t| &*t.text);
    let mut out = Rendered::new();
    for f in md {
        let markdown = read_listed(bundle, f)?;
        verified.insert(f.path.clone());
        let text = std::str::from_utf8(&markdown).map_err(|e| {
            Error::Bundle(bundle::BundleError::Invalid {
                problems: vec![bundle::Problem {
                    path: Some(f.path.as_str().to_owned()),
                    message: format!(
                        "not valid UTF-8 (byte {}), so it cannot be rendered to HTML; save it as UTF-8 or turn publish.html off",
                        e.valid_up_to()
                    ),
                }],
            })
        })?;
        let options = RenderOptions {
            raw_html: d.raw_html,
            source_path: f.path.as_str(),
            generated_markdown: &generated,
            template,
        };
        let mut body = Spill::new(room, text.len().saturating_mul(2) + 4096);
        // In a child process under the memory limit of docs/contract.md §12.3.
        let cap = limits.max_markdown_bytes;
        let unrenderable = |why: String| bundle::Problem {
            path: Some(f.path.as_str().to_owned()),
            message: format!("could not be rendered to HTML: {why}"),
        };
        let parts =
            render_in_child(renderers, text, &options, cap, &mut body).map_err(|e| match e {
                // Refused like a file over limits.max_markdown_bytes.
                ChildError::OverLimit(said) => Error::Bundle(bundle::BundleError::Invalid {
                    problems: vec![bundle::markdown_too_dense(f.path.as_str(), f.size, &said)],
                }),
                ChildError::Crashed(why) => Error::Bundle(bundle::BundleError::Invalid {
                    problems: vec![unrenderable(why)],
                }),
                ChildError::OverTime => Error::Bundle(bundle::BundleError::Invalid {
                    problems: vec![bundle::markdown_too_slow(f.path.as_str(), f.size)],
                }),
                ChildError::Sink(e) => Error::Prepare(e),
                ChildError::Failed(why) => Error::Renderer {
                    path: f.path.as_str().to_owned(),
                    why,
                },
            })?;
        let (body, refused) = body.finish().map_err(Error::Prepare)?;
        if let Some(why) = refused {
            let warning = format!(
                "{}: its HTML page, and any later page of this bundle too big to hold, was kept in memory ({why}); the folder must be writable by the agent's user and on a file system with O_TMPFILE (ext4, xfs, btrfs, tmpfs)",
                f.path
            );
            log::warn!("{warning}");
            warnings.push(warning);
        }
        let html = Content::page(parts, body);
        let hashed =
            hashing::copy_hashed(&mut html.reader(), None, None).map_err(Error::Prepare)?;
        let markdown = room
            .hold(markdown.len())
            .then(|| Arc::new(Content::from_bytes(markdown)));
        out.insert(
            f.path.clone(),
            Page {
                markdown,
                html: Arc::new(html),
                hashed,
            },
        );
    }
    Ok(out)
}

/// Reads a listed file into memory, checking size and hash.
fn read_listed(bundle: &VerifiedBundle, f: &bundle::ManifestFile) -> Result<Vec<u8>, Error> {
    let invalid =
        |p: bundle::Problem| Error::Bundle(bundle::BundleError::Invalid { problems: vec![p] });
    let file = bundle::open_listed(&bundle.dir, &f.path).map_err(Error::Bundle)?;
    let mut bytes = Vec::new();
    let got = hashing::copy_hashed(&mut (&file).take(f.size + 1), Some(&mut bytes), None)
        .map_err(Error::Prepare)?;
    if got.sha256 != f.sha256 || got.size != f.size {
        return Err(invalid(bundle::mismatch_problem(f, &got)));
    }
    Ok(bytes)
}

/// Computes one destination's desired outputs, and the siblings they get
/// (docs/contract.md §21.4); every path, siblings' too, must lie in the
/// destination's scope.
fn prepare(
    pipeline: &Pipeline,
    d: &Destination,
    bundle: &VerifiedBundle,
    html: Option<&Rendered>,
) -> Result<Outputs, String> {
    let m = &bundle.manifest;
    let prefix = config::expand_prefix(&d.prefix, &m.id, &pipeline.id, m.created)
        .map_err(|e| format!("prefix {:?}: {e}", d.prefix))?;
    let place = |path: &str| -> Result<RelPath, String> {
        let full = if prefix.is_empty() {
            path.to_owned()
        } else {
            format!("{prefix}/{path}")
        };
        RelPath::parse(&full).map_err(|e| format!("output path {full:?}: {e}"))
    };
    let url = |p: &RelPath| d.base_url.as_ref().map(|b| plan::output_url(b, p));
    let mut desired = Vec::new();
    let mut in_memory = BTreeMap::new();
    for f in &m.files {
        let page = html.and_then(|h| h.get(&f.path));
        if d.publish_source {
            let path = place(f.path.as_str())?;
            if let Some(markdown) = page.and_then(|p| p.markdown.as_ref()) {
                in_memory.insert(path.clone(), Arc::clone(markdown));
            }
            desired.push(Desired {
                url: url(&path),
                path,
                kind: OutputKind::Source,
                bundle_path: f.path.clone(),
                transform: None,
                sha256: Sha256::parse(&f.sha256).expect("a verified manifest lists sha256 digests"),
                size: f.size,
            });
        }
        if let Some(Page { html, hashed, .. }) = page {
            let stem = f
                .path
                .as_str()
                .strip_suffix(".md")
                .unwrap_or(f.path.as_str());
            let path = place(&format!("{stem}.html"))?;
            desired.push(Desired {
                url: url(&path),
                path: path.clone(),
                kind: OutputKind::Generated,
                bundle_path: f.path.clone(),
                transform: Some(MARKDOWN_TO_HTML),
                sha256: Sha256::parse(&hashed.sha256).expect("hashing gives sha256 digests"),
                size: hashed.size,
            });
            in_memory.insert(path, Arc::clone(html));
        }
    }
    plan::check_unique(&desired)?;
    desired.sort_by(|a, b| a.path.as_str().cmp(b.path.as_str()));
    let siblings = precompress::siblings(&desired, &d.precompress);
    if let Some(scope) = &d.scope {
        let paths = (desired.iter().map(|o| o.path.as_str()))
            .chain(siblings.iter().map(|s| s.path.as_str()));
        check_scope(d, scope, &prefix, paths)?;
    }
    Ok(Outputs {
        desired,
        in_memory,
        siblings,
    })
}

/// How many paths outside the scope an error names.
const OUTSIDE_NAMED: usize = 5;

/// Every output must lie inside the destination's scope (docs/contract.md
/// §17.1); the error names the first few that do not, the destination and
/// its scope.
fn check_scope<'p>(
    d: &Destination,
    scope: &Scope,
    prefix: &str,
    paths: impl Iterator<Item = &'p str>,
) -> Result<(), String> {
    let mut outside: Vec<&str> = paths.filter(|p| !scope.contains(p)).collect();
    outside.sort_unstable();
    let Some(first) = outside.first() else {
        return Ok(());
    };
    let prefixed = if prefix.is_empty() {
        String::new()
    } else {
        format!(" (output paths are the prefix {prefix}/ followed by the bundle's paths)")
    };
    let what = if outside.len() == 1 {
        format!(
            "output {first:?} is outside destination {}'s scope {scope}{prefixed}",
            d.id
        )
    } else {
        let quoted: Vec<String> = outside.iter().map(|p| format!("{p:?}")).collect();
        format!(
            "{} outputs are outside destination {}'s scope {scope}{prefixed}: {}",
            outside.len(),
            d.id,
            crate::text::wording::first_few(&quoted, OUTSIDE_NAMED, ", ")
        )
    };
    Err(format!(
        "{what}; nothing was published. The producer must keep its files inside the scope, or the operator widens the destination's scope in the configuration"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Stage;

    #[test]
    fn markdown_read_for_rendering_is_staged_from_memory_not_read_again() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("bundle");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("a.md"), "# A\n").unwrap();
        std::fs::write(dir.join("b.txt"), "b\n").unwrap();
        bundle::seal(&dir, "b-1", None).unwrap();
        let config = config::parse(
            "spool: ./spool
pipelines:
  - id: p
    destinations:
      - id: d
        path: ./www
        publish: {source: true, html: true}
",
            &tmp.path().join("config.yaml"),
        )
        .unwrap();
        let pipeline = &config.pipelines[0];
        let destination = &pipeline.destinations[0];
        let Ok(ready) = prepare_bundle(
            pipeline,
            &[destination],
            &dir,
            false,
            tmp.path(),
            &ProcessState::default(),
            crate::runtime::clock::now_millis(),
        ) else {
            panic!("the bundle is valid");
        };
        let in_memory = &ready.prepared[0].in_memory;
        let at = |p: &str| in_memory.get(&RelPath::parse(p).unwrap());
        assert_eq!(at("a.md").and_then(|b| b.as_slice()), Some(&b"# A\n"[..]));
        let html = at("a.html").expect("the page is held");
        assert!(!html.is_spilled());
        let mut page = String::new();
        html.reader().read_to_string(&mut page).unwrap();
        assert!(page.starts_with("<!DOCTYPE html>"), "{page}");
        assert!(page.contains("<h1"), "{page}");
        assert!(
            at("b.txt").is_none(),
            "other files are copied from the bundle"
        );
        assert!(ready.verified.contains(&RelPath::parse("a.md").unwrap()));
    }

    /// Prepares a bundle of `files` (sealed with source id `src-1`) for
    /// the destinations of pipeline `p` in `destinations` (YAML).
    fn prepare_for(
        destinations: &str,
        files: &[&str],
    ) -> (tempfile::TempDir, Result<Ready, Box<RunReport>>) {
        let files: Vec<(&str, Vec<u8>)> = files
            .iter()
            .map(|f| (*f, format!("# {f}\n").into_bytes()))
            .collect();
        prepare_bytes(destinations, &files, |_| {})
    }

    /// Prepares a bundle of `files` (path, bytes; source id `src-1`) for
    /// the destinations of pipeline `p` in `destinations` (YAML), with a
    /// scratch folder for what is too big to hold.
    fn prepare_bytes(
        destinations: &str,
        files: &[(&str, Vec<u8>)],
        after_sealing: impl FnOnce(&Path),
    ) -> (tempfile::TempDir, Result<Ready, Box<RunReport>>) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("bundle");
        for (f, bytes) in files {
            let path = dir.join(f);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, bytes).unwrap();
        }
        bundle::seal(&dir, "src-1", None).unwrap();
        after_sealing(&dir);
        let config = config::parse(
            &format!("spool: ./spool\npipelines:\n  - id: p\n    destinations:\n{destinations}"),
            &tmp.path().join("config.yaml"),
        )
        .unwrap();
        let pipeline = &config.pipelines[0];
        let all: Vec<&Destination> = pipeline.destinations.iter().collect();
        let result = prepare_bundle(
            pipeline,
            &all,
            &dir,
            false,
            tmp.path(),
            &ProcessState::default(),
            crate::runtime::clock::now_millis(),
        );
        (tmp, result)
    }

    /// Bytes that do not compress (xorshift), `len` of them.
    fn noise(len: usize) -> Vec<u8> {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    fn read_all(content: &Content) -> Vec<u8> {
        let mut out = Vec::new();
        content.reader().read_to_end(&mut out).unwrap();
        out
    }

    fn gunzip(bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(bytes)
            .read_to_end(&mut out)
            .unwrap();
        out
    }

    #[test]
    fn siblings_are_prepared_held_like_pages_and_shared_by_destinations() {
        let css = "body { color: black; }\n".repeat(100);
        let md = "# Title\n\nSome words, again and again.\n".repeat(60);
        let big = noise(crate::publish::content::SPILL_FROM + 10);
        let files = [
            ("a.css", css.clone().into_bytes()),
            ("small.css", b"p {}\n".to_vec()),
            ("doc.md", md.clone().into_bytes()),
            ("big.txt", big.clone()),
            ("logo.png", noise(4096)),
        ];
        let keys = "        precompress: [gzip, br]\n        publish: {source: true, html: true}\n        links: {base_url: \"https://x.example/\"}\n";
        let d = format!(
            "      - id: one\n        path: ./one\n{keys}      - id: two\n        path: ./two\n{keys}      - id: plain\n        path: ./plain\n"
        );
        let (_tmp, result) = prepare_bytes(&d, &files, |_| {});
        let Ok(ready) = result else {
            panic!("{:?}", result.err().unwrap().error);
        };
        let paths = |p: &Prepared| -> Vec<String> {
            p.desired
                .iter()
                .map(|d| d.path.as_str().to_owned())
                .collect()
        };
        let one = &ready.prepared[0];
        assert_eq!(
            paths(one),
            [
                "a.css",
                "a.css.br",
                "a.css.gz",
                "big.txt",
                "big.txt.br",
                "big.txt.gz",
                "doc.html",
                "doc.html.br",
                "doc.html.gz",
                "doc.md",
                "doc.md.br",
                "doc.md.gz",
                "logo.png",
                "small.css",
            ]
        );
        assert_eq!(
            paths(&ready.prepared[2]).len(),
            5,
            "no precompress, no siblings"
        );
        let at = |p: &Prepared, path: &str| {
            let d = p
                .desired
                .iter()
                .find(|d| d.path.as_str() == path)
                .unwrap()
                .clone();
            let held = Arc::clone(&p.in_memory[&d.path]);
            (d, held)
        };
        let (gz, held) = at(one, "a.css.gz");
        assert_eq!(gunzip(&read_all(&held)), css.as_bytes());
        assert_eq!(gz.kind, OutputKind::Generated);
        assert_eq!(gz.transform, Some(crate::catalog::GZIP));
        assert_eq!(gz.bundle_path.as_str(), "a.css");
        assert_eq!(gz.url.as_deref(), Some("https://x.example/a.css.gz"));
        let hashed = hashing::copy_hashed(&mut held.reader(), None, None).unwrap();
        assert_eq!(
            (gz.sha256.to_string(), gz.size),
            (hashed.sha256, hashed.size)
        );
        // The page's siblings are made from the page, the markdown's from
        // the markdown; both come from doc.md.
        let (page, _) = at(one, "doc.html");
        let (page_gz, page_gz_held) = at(one, "doc.html.gz");
        assert_eq!(page_gz.bundle_path.as_str(), "doc.md");
        let html = read_all(&one.in_memory[&page.path]);
        assert_eq!(gunzip(&read_all(&page_gz_held)), html);
        let (md_br, _) = at(one, "doc.md.br");
        assert_eq!(md_br.transform, Some(crate::catalog::BROTLI));
        // A big sibling goes to the scratch file, as a big page does.
        let (_, big_gz) = at(one, "big.txt.gz");
        assert!(big_gz.is_spilled());
        assert_eq!(gunzip(&read_all(&big_gz)), big);
        assert!(ready.verified.contains(&RelPath::parse("big.txt").unwrap()));
        // The second destination shares the first one's siblings.
        let (_, again) = at(&ready.prepared[1], "big.txt.gz");
        assert!(Arc::ptr_eq(&big_gz, &again));
    }

    #[test]
    fn a_file_changed_since_sealing_fails_the_bundle_when_it_is_compressed() {
        let css = "body { color: black; }\n".repeat(100).into_bytes();
        let d = "      - id: www\n        path: ./www\n        precompress: [br]\n";
        let (_tmp, result) = prepare_bytes(d, &[("a.css", css.clone())], |dir| {
            let mut changed = css.clone();
            changed[0] = b'B';
            std::fs::write(dir.join("a.css"), changed).unwrap();
        });
        let Err(report) = result else {
            panic!("should fail");
        };
        assert_eq!(report.stage, Some(Stage::Verify));
        let error = report.error_text();
        assert!(error.contains("a.css"), "{error}");
        assert!(error.contains("sha256"), "{error}");
    }

    #[test]
    fn siblings_lie_in_the_scope_like_every_output() {
        let css = "body { color: black; }\n".repeat(100).into_bytes();
        let d = "      - id: www\n        path: ./www\n        precompress: [gzip]\n        scope: [\"a.css\"]\n";
        let (_tmp, result) = prepare_bytes(d, &[("a.css", css)], |_| {});
        let Err(report) = result else {
            panic!("should fail");
        };
        let error = report.error_text();
        assert!(
            error.contains("output \"a.css.gz\" is outside destination www's scope"),
            "{error}"
        );
    }

    #[test]
    fn outputs_inside_the_scope_are_prepared() {
        // (destination keys, bundle files)
        let cases: &[(&str, &[&str])] = &[
            (
                "scope: [\"reports/\", \"index.html\"]",
                &["reports/a.txt", "reports/2026/b.txt", "index.html"],
            ),
            // The scope holds the outputs: the rendered page too.
            (
                "scope: [\"reports/\"]\n        publish: {source: true, html: true}",
                &["reports/a.md"],
            ),
            // After the prefix, with the source id filled in.
            (
                "prefix: \"{source_id}/\"\n        scope: [\"src-1/\"]",
                &["a.txt", "sub/b.txt"],
            ),
        ];
        for (keys, files) in cases {
            let d = format!("      - id: www\n        path: ./www\n        {keys}\n");
            let (_tmp, result) = prepare_for(&d, files);
            let Ok(ready) = result else {
                panic!("{keys}: {:?}", result.err().unwrap().error);
            };
            assert!(!ready.prepared[0].desired.is_empty());
        }
    }

    #[test]
    fn an_output_outside_the_scope_fails_the_bundle_at_verify() {
        // (destination keys, bundle files, words the error must hold)
        let cases: &[(&str, &[&str], &[&str])] = &[
            (
                "scope: [\"reports/\", \"index.html\"]",
                &["reports/a.txt", "secret/x.html"],
                &[
                    "output \"secret/x.html\" is outside destination www's scope [\"reports/\", \"index.html\"]",
                    "widens the destination's scope",
                ],
            ),
            // A folder entry does not hold the folder's own name, nor a
            // sibling that starts the same.
            (
                "scope: [\"reports/\"]",
                &["reportsx/a.txt"],
                &["output \"reportsx/a.txt\" is outside"],
            ),
            // The page rendered from an in-scope name counts too.
            (
                "scope: [\"a.md\"]\n        publish: {source: true, html: true}",
                &["a.md"],
                &["output \"a.html\" is outside"],
            ),
            // The prefix comes first.
            (
                "prefix: \"{source_id}/\"\n        scope: [\"reports/\"]",
                &["reports/a.txt"],
                &[
                    "output \"src-1/reports/a.txt\" is outside",
                    "the prefix src-1/ followed by the bundle's paths",
                ],
            ),
            // Many: the first few are named, the rest counted.
            (
                "scope: [\"ok/\"]",
                &["ok/x", "b1", "b2", "b3", "b4", "b5", "b6", "b7"],
                &[
                    "7 outputs are outside destination www's scope [\"ok/\"]: \"b1\", \"b2\", \"b3\", \"b4\", \"b5\" and 2 more;",
                ],
            ),
        ];
        for (keys, files, want) in cases {
            let d = format!("      - id: www\n        path: ./www\n        {keys}\n");
            let (_tmp, result) = prepare_for(&d, files);
            let Err(report) = result else {
                panic!("{keys} {files:?}: should fail");
            };
            assert_eq!(report.stage, Some(Stage::Verify), "{keys}");
            assert!(!report.transient(), "{keys}");
            assert_eq!(report.exit_code(), crate::runtime::exit::EXIT_FAILURE);
            let error = report.error_text();
            for w in *want {
                assert!(error.contains(w), "{keys}: {w:?} not in\n{error}");
            }
            assert!(!error.contains("b6"), "only the first few: {error}");
            let d = &report.destinations[0];
            assert!(
                d.error
                    .as_deref()
                    .unwrap()
                    .contains("outside destination www's scope"),
                "{d:?}"
            );
        }
    }

    #[test]
    fn one_destination_out_of_scope_fails_the_bundle_for_all_of_them() {
        let d = "      - id: open\n        path: ./open\n      - id: www\n        path: ./www\n        scope: [\"reports/\"]\n";
        let (_tmp, result) = prepare_for(d, &["reports/a.txt", "other.txt"]);
        let Err(report) = result else {
            panic!("should fail");
        };
        let error = report.error_text();
        assert!(
            error.starts_with("bundle is invalid for destination www: output \"other.txt\""),
            "{error}"
        );
        assert_eq!(report.destinations[0].error, None, "{report:?}");
    }
}
