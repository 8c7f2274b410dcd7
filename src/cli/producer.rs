//! The producer helpers `bundle seal`, `bundle verify` and `bundle
//! upload`: no config is needed, and the bundle folder (and, for an
//! upload, the bucket it goes to) is all they look at.

use super::{Error, Outcome, Told, told_unless};
use crate::bundle::{self, BundleError};
use crate::catalog::parse_time;
use crate::config::S3Location;
use crate::report::Stage;
use crate::runtime::process_state::ProcessState;
use crate::s3::S3Root;
use crate::signature::AllowedSigners;
use crate::text::escape::{inert, inert_os};
use std::path::Path;

/// "1 file", "2 files".
fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// "1 byte", "2 bytes".
fn count_bytes(n: u64) -> String {
    format!("{n} {}", if n == 1 { "byte" } else { "bytes" })
}

pub(super) fn seal(
    dir: &Path,
    id: &str,
    created: Option<&str>,
    sign: Option<&Path>,
    namespace: &str,
) -> Outcome {
    let created = created
        .map(parse_time)
        .transpose()
        .map_err(|e| Error::Usage(format!("invalid --created: {e}")))?;
    let sealed = bundle::seal_report(dir, id, created)?;
    let m = &sealed.manifest;
    println!(
        "sealed {} ({}, {})",
        inert_os(dir.join(bundle::MANIFEST).as_os_str()),
        count(m.files.len(), "file", "files"),
        m.digest
    );
    if !sealed.skipped.is_empty() {
        eprintln!(
            "warning: left out {} (names starting with .distributor are reserved for distributor's own files and never sealed; rename any that belong in the bundle):",
            count(sealed.skipped.len(), "reserved entry", "reserved entries")
        );
        for path in &sealed.skipped {
            eprintln!("  {path}");
        }
    }
    for w in &sealed.warnings {
        eprintln!("warning: {w}");
    }
    let Some(key) = sign else {
        return Ok(());
    };
    bundle::sign(dir, key, namespace)
        .map_err(|e| Error::Failed(inert(&e.to_string()).into_owned()))?;
    println!(
        "signed {}",
        inert_os(dir.join(crate::signature::SIGNATURE_FILE).as_os_str())
    );
    Ok(())
}

pub(super) fn verify(
    dir: &Path,
    signers: Option<&Path>,
    namespace: &str,
    json: bool,
    process: &ProcessState,
) -> Outcome {
    let checked = Checked::run(dir, signers, namespace, process)?;
    if json {
        print_json(&checked.json());
    } else {
        checked.print();
    }
    told_unless(checked.result.is_ok())
}

/// A bundle as the agent's checks found it: what `bundle verify` reports,
/// and what `bundle upload` makes sure of before it sends anything.
struct Checked<'a> {
    dir: &'a Path,
    result: Result<bundle::VerifiedBundle, BundleError>,
    /// Whether the signature was checked too (`--signers`).
    signatures: bool,
}

impl<'a> Checked<'a> {
    /// Runs the agent's checks on `dir` (default limits), and checks the
    /// signature against the allowed signers file `signers` when given
    /// (a usage error when that file cannot be used).
    fn run(
        dir: &'a Path,
        signers: Option<&Path>,
        namespace: &str,
        process: &ProcessState,
    ) -> Result<Checked<'a>, Error> {
        let signers = match signers.map(|path| (path, AllowedSigners::read(path))) {
            None => None,
            Some((_, Ok(signers))) => Some(signers),
            Some((path, Err(e))) => {
                return Err(Error::Usage(format!(
                    "--signers {}: {e}",
                    inert_os(path.as_os_str())
                )));
            }
        };
        let policy = signers.as_ref().map(|signers| bundle::SignaturePolicy {
            signers,
            namespace,
            required: true,
        });
        let result = bundle::verify(dir, &bundle::Limits::default(), policy, &process.per_core());
        Ok(Checked {
            dir,
            result,
            signatures: policy.is_some(),
        })
    }

    /// Every problem found, one line each.
    fn problems(&self) -> Vec<String> {
        match &self.result {
            Ok(_) => Vec::new(),
            Err(BundleError::Invalid { problems }) => {
                problems.iter().map(ToString::to_string).collect()
            }
            Err(e) => vec![e.to_string()],
        }
    }

    /// `bundle verify --json`; `bundle upload --json` adds to it.
    fn json(&self) -> serde_json::Value {
        let bundle = self.result.as_ref().ok();
        let mut doc = serde_json::json!({
            "ok": bundle.is_some(),
            "bundle": self.dir.display().to_string(),
            "id": bundle.map(|b| b.manifest.id.clone()),
            "digest": bundle.map(|b| b.manifest.digest.clone()),
            "problems": self.problems(),
            "warnings": bundle.map(|b| b.warnings.clone()).unwrap_or_default(),
        });
        if self.signatures {
            let refused = match &self.result {
                Err(BundleError::Signature(refusal)) => Some(refusal.reason.as_str()),
                _ => None,
            };
            doc["signer"] = serde_json::json!(bundle.and_then(|b| b.signer.clone()));
            doc["signature_refused"] = serde_json::json!(refused);
        }
        doc
    }

    /// What `bundle verify` prints: the bundle or the count of problems,
    /// the signer, then each problem and warning on a line of its own.
    fn print(&self) {
        let shown_dir = inert_os(self.dir.as_os_str());
        let problems = self.problems();
        match &self.result {
            Ok(b) => println!(
                "ok: {shown_dir} is bundle {} ({}, {})",
                inert(&b.manifest.id),
                count(b.manifest.files.len(), "file", "files"),
                b.manifest.digest
            ),
            Err(_) => println!(
                "invalid bundle {shown_dir} ({}):",
                count(problems.len(), "problem", "problems")
            ),
        }
        if let Some(signer) = self.result.as_ref().ok().and_then(|b| b.signer.as_ref()) {
            println!("  signed by {}", inert(&signer.to_string()));
        }
        for p in &problems {
            println!("  problem: {}", inert(p));
        }
        for w in self.result.iter().flat_map(|b| &b.warnings) {
            println!("  warning: {}", inert(w));
        }
    }
}

fn print_json(doc: &serde_json::Value) {
    println!("{}", serde_json::to_string_pretty(doc).unwrap_or_default());
}

/// Where `bundle upload` sends its requests.
pub(super) struct Server<'a> {
    /// `--endpoint`.
    pub endpoint: Option<&'a str>,
    /// `--region`.
    pub region: Option<&'a str>,
}

impl Server<'_> {
    /// The endpoint and region: the flags, else the variables the AWS
    /// tools read, else AWS and `us-east-1`.
    fn resolve(&self) -> Result<(Option<String>, String), Error> {
        let env = |var: &'static str| {
            std::env::var(var)
                .ok()
                .filter(|v| !v.is_empty())
                .map(|v| (var, v))
        };
        let endpoint = match self.endpoint {
            Some(url) => Some(("--endpoint", url.to_owned())),
            None => env("AWS_ENDPOINT_URL_S3").or_else(|| env("AWS_ENDPOINT_URL")),
        };
        let endpoint = match endpoint {
            None => None,
            Some((from, url)) => Some(endpoint_url(from, &url)?),
        };
        let region = match self.region {
            Some(region) => region.to_owned(),
            None => env("AWS_REGION")
                .or_else(|| env("AWS_DEFAULT_REGION"))
                .map_or_else(|| "us-east-1".to_owned(), |(_, v)| v),
        };
        Ok((endpoint, region))
    }
}

/// `url` (from the flag or variable `from`) as an endpoint: an http or
/// https URL of a server, without a path.
fn endpoint_url(from: &str, url: &str) -> Result<String, Error> {
    let trimmed = url.trim_end_matches('/');
    let server = trimmed
        .strip_prefix("http://")
        .or_else(|| trimmed.strip_prefix("https://"));
    match server {
        Some(server) if !server.is_empty() && !server.contains('/') => Ok(trimmed.to_owned()),
        _ => Err(Error::Usage(format!(
            "{from} {:?} is not the URL of a server; give its scheme, host and port only, such as http://127.0.0.1:8333 or https://s3.eu-central-1.amazonaws.com",
            inert(url)
        ))),
    }
}

/// `bundle upload`: checks the bundle as the agent would, then uploads it
/// into the inbox `url` names, `manifest.json` last (docs/contract.md §22.1).
pub(super) fn upload(
    dir: &Path,
    url: &str,
    server: &Server<'_>,
    signers: Option<&Path>,
    namespace: &str,
    json: bool,
    process: &ProcessState,
) -> Outcome {
    let url = bundle::InboxUrl::parse(url).map_err(|e| Error::Usage(inert(&e).into_owned()))?;
    let (endpoint, region) = server.resolve()?;
    let location = S3Location {
        bucket: url.bucket.clone(),
        path: url.prefix(),
        endpoint,
        region,
    };
    let root = S3Root::open(&location).map_err(|e| match e.stage() {
        Stage::Config => Error::Usage(e.to_string()),
        _ => Error::Failed(e.to_string()),
    })?;
    let checked = Checked::run(dir, signers, namespace, process)?;
    let mut doc = checked.json();
    doc["url"] = serde_json::json!(url.to_string());
    let bundle = match &checked.result {
        Ok(bundle) => bundle,
        Err(_) => {
            if json {
                doc["objects"] = serde_json::json!([]);
                doc["bytes"] = serde_json::json!(0);
                doc["error"] = serde_json::json!("the bundle is invalid; nothing was uploaded");
                print_json(&doc);
            } else {
                checked.print();
                eprintln!(
                    "error: nothing was uploaded; fix the bundle (`distributor bundle verify` checks it again) and upload it again"
                );
            }
            return Err(Error::Told(Told::Failure));
        }
    };
    if !json {
        for w in &bundle.warnings {
            eprintln!("warning: {}", inert(w));
        }
        if !bundle.warnings.is_empty() {
            eprintln!(
                "warning: files that {} does not list are not uploaded; seal the bundle again to include them",
                bundle::MANIFEST
            );
        }
    }
    let mut objects: Vec<bundle::Uploaded> = Vec::new();
    let uploaded = bundle::upload(bundle, &root, &url, &mut |object| {
        if !json {
            println!(
                "put s3://{}/{} ({})",
                url.bucket,
                inert(&object.key),
                count_bytes(object.size)
            );
        }
        objects.push(object.clone());
    });
    let bytes: u64 = objects.iter().map(|o| o.size).sum();
    let error = uploaded.err().map(|e| {
        let told = inert(&e.to_string()).into_owned();
        match objects.len() {
            0 => format!("{told}; nothing was uploaded"),
            n => format!(
                "{told}; the bundle is not delivered: {} was not uploaded ({} were); run the same command again to finish, it uploads them again",
                bundle::MANIFEST,
                count(n, "other object", "other objects"),
            ),
        }
    });
    if json {
        doc["ok"] = serde_json::json!(error.is_none());
        doc["objects"] = serde_json::json!(objects);
        doc["bytes"] = serde_json::json!(bytes);
        doc["error"] = serde_json::json!(error);
        print_json(&doc);
        return told_unless(error.is_none());
    }
    match error {
        Some(error) => Err(Error::Failed(error)),
        None => {
            println!(
                "ok: bundle {} ({}, {}) uploaded to {}: {}, {}, {} last",
                inert(&bundle.manifest.id),
                count(bundle.manifest.files.len(), "file", "files"),
                bundle.manifest.digest,
                inert(&url.to_string()),
                count(objects.len(), "object", "objects"),
                count_bytes(bytes),
                bundle::MANIFEST
            );
            Ok(())
        }
    }
}
