//! End-to-end checksums into the store (docs/object-storage.md,
//! "Servers"), against the real SeaweedFS of `seaweed::server`, whichever
//! way it behaves: the test finds out for itself whether the server
//! refuses a PUT whose `x-amz-checksum-sha256` does not match its body,
//! then checks that a publication logged the same verdict once for the
//! bucket, and that every output PUT carried the SHA-256 of its bytes
//! exactly when the server verifies it (each part's, for a multipart
//! upload).

use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::{ClientOptions, HeaderMap, HeaderValue, ObjectStoreExt as _, PutPayload};
use sha2::{Digest as _, Sha256};

use crate::seaweed::{Bucket, Exchange, RecordingProxy, credentials, server};
use crate::util::Test;

/// Base64 (standard alphabet, padded), as S3 writes checksums.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn sha256_b64(bytes: &[u8]) -> String {
    base64(&Sha256::digest(bytes))
}

/// What the server does with a PUT whose checksum header is `claimed`
/// (sent as it is, signed): stored or refused. Asked of a client of the
/// test's own, not of distributor.
fn stored_with_checksum(bucket: &Bucket, key: &str, body: &'static [u8], claimed: &str) -> bool {
    let mut headers = HeaderMap::new();
    headers.insert(
        "x-amz-checksum-sha256",
        HeaderValue::from_str(claimed).unwrap(),
    );
    let creds = credentials();
    let store = AmazonS3Builder::new()
        .with_bucket_name(&bucket.location.bucket)
        .with_region("us-east-1")
        .with_endpoint(&server().endpoint)
        .with_client_options(ClientOptions::new().with_default_headers(headers))
        .with_allow_http(true)
        .with_access_key_id(&creds.key_id)
        .with_secret_access_key(&creds.secret)
        .build()
        .expect("client");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let put = rt.block_on(store.put(&Path::from(key), PutPayload::from_static(body)));
    let stored = bucket.get(key.strip_prefix("site/").unwrap()).is_some();
    assert_eq!(put.is_ok(), stored, "{key}: PUT {put:?}, stored {stored}");
    if let Err(e) = put {
        // Refused for its body, not unsent or failed otherwise.
        assert!(e.to_string().contains("400"), "{key}: {e}");
    }
    stored
}

#[test]
fn output_puts_carry_their_sha256_exactly_when_the_server_verifies_it() {
    // What the server does, found out first.
    let bucket = Bucket::new("site");
    let body = b"checked body\n";
    let wrong_stored =
        stored_with_checksum(&bucket, "site/probe-wrong", body, &sha256_b64(b"other"));
    let right_stored = stored_with_checksum(&bucket, "site/probe-right", body, &sha256_b64(body));
    let verifies = !wrong_stored && right_stored;
    eprintln!("SeaweedFS verifies x-amz-checksum-sha256: {verifies}");
    bucket.root.delete("probe-wrong").unwrap();
    bucket.root.delete("probe-right").unwrap();

    // Two destinations in that bucket, reached through a recording proxy.
    let mirror = Bucket::at(distributor::config::S3Location {
        path: "mirror".into(),
        ..bucket.location.clone()
    });
    let proxy = RecordingProxy::start(&server().endpoint);
    let t = Test::new();
    t.config(&format!(
        "spool: ./spool
pipelines:
  - id: p
    destinations:
      - id: web
        backend: s3
        bucket: {b}
        path: site
        endpoint: {e}
      - id: mirror
        backend: s3
        bucket: {b}
        path: mirror
        endpoint: {e}
",
        b = bucket.location.bucket,
        e = proxy.endpoint
    ));
    // A file over one part (8 MiB) goes up as a multipart upload.
    let big: Vec<u8> = (0..9 * 1024 * 1024u32)
        .map(|i| (i * 7 % 251) as u8)
        .collect();
    let files: Vec<(&str, &[u8])> = vec![
        ("index.html", b"<p>hi</p>"),
        ("data/table.csv", b"a,b\n1,2\n"),
        ("big.bin", &big),
    ];
    let b = t.sealed("b1", &files);
    let creds = credentials();
    let out = t
        .cmd()
        .env("AWS_ACCESS_KEY_ID", &creds.key_id)
        .env("AWS_SECRET_ACCESS_KEY", &creds.secret)
        .env("RUST_LOG", "info")
        .args(["--config", "config.yaml", "run", "--pipeline", "p"])
        .arg(&b)
        .output();
    out.expect_code(0);

    // The log says once for the bucket what the server does.
    let verdicts: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("x-amz-checksum-sha256"))
        .collect();
    assert_eq!(verdicts.len(), 1, "one verdict per bucket:\n{}", out.stderr);
    let said = if verifies {
        "the server verifies x-amz-checksum-sha256"
    } else {
        "the server does not verify x-amz-checksum-sha256"
    };
    assert!(verdicts[0].contains(said), "{verifies}: {}", verdicts[0]);

    // Every output PUT carried its bytes' SHA-256, or none at all.
    let log = proxy.take();
    let ok = |e: &Exchange| e.method == "PUT" && (200..300).contains(&e.status);
    let bucket_name = &bucket.location.bucket;
    let mut single = Vec::new();
    let mut parts = 0;
    for e in log.iter().filter(|e| ok(e)) {
        let (path, query) = e.target.split_once('?').unwrap_or((&e.target, ""));
        let Some(key) = path.strip_prefix(&format!("/{bucket_name}/")) else {
            continue;
        };
        let rel = key.split_once('/').map_or(key, |(_, rel)| rel);
        if rel.starts_with(".distributor") {
            continue;
        }
        if query.contains("partNumber=") {
            parts += 1;
            assert_eq!(e.checksum.is_some(), verifies, "part of {key}: {e:?}");
            continue;
        }
        let body: &[u8] = match rel {
            // The empty placeholder that claims a multipart upload's key.
            "big.bin" => b"",
            rel => files.iter().find(|(p, _)| *p == rel).expect("an output").1,
        };
        let want = verifies.then(|| sha256_b64(body));
        assert_eq!(e.checksum, want, "{key}");
        single.push(key.to_owned());
    }
    single.sort();
    assert_eq!(
        single,
        [
            "mirror/big.bin",
            "mirror/data/table.csv",
            "mirror/index.html",
            "site/big.bin",
            "site/data/table.csv",
            "site/index.html"
        ]
    );
    assert_eq!(parts, 4, "two parts of big.bin per destination");
    // And the objects are whole.
    for root in [&bucket, &mirror] {
        let records = root.assert_records_match_objects();
        assert_eq!(records.len(), files.len());
    }
}
