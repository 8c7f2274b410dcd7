//! The signature rules of docs/contract.md §17.4, table-driven, with keys
//! made for these tests by `ssh-keygen` (never used anywhere else).

use super::*;
use std::collections::BTreeMap;
use time::macros::datetime;

/// `ssh-keygen -t ed25519 -N '' -C test-one`.
pub(super) const ED_PRIVATE: &str = "-----BEGIN OPENSSH PRIVATE KEY-----
b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW
QyNTUxOQAAACAjio6OiS6+5mYd5XNKapBZVa2Pi1Te6/eDePlZMOg+qQAAAJDZedo42Xna
OAAAAAtzc2gtZWQyNTUxOQAAACAjio6OiS6+5mYd5XNKapBZVa2Pi1Te6/eDePlZMOg+qQ
AAAECxtwrTcAD2SQoyqhIH8bta2e6GU0aYVz0CiywnwcjxdCOKjo6JLr7mZh3lc0pqkFlV
rY+LVN7r94N4+Vkw6D6pAAAACHRlc3Qtb25lAQIDBAU=
-----END OPENSSH PRIVATE KEY-----
";
pub(super) const ED: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICOKjo6JLr7mZh3lc0pqkFlVrY+LVN7r94N4+Vkw6D6p";
/// Another key (`ssh-keygen -t ecdsa -b 256`), never the signer here.
pub(super) const OTHER: &str = "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBMbCXbkzW7pkV1z2ikamiDKn/DwkWiutGuG8WVFDtMxy5DVzwOdU0yVpXmjMIuWR1smbTcj+0YWJ4XzA0itxAsA=";

pub(super) const MANIFEST: &[u8] = b"{\"m\":1}\n";
/// `ssh-keygen -Y sign -f <ED_PRIVATE> -n distributor` over [`MANIFEST`].
pub(super) const BY_SSH_KEYGEN: &str = "-----BEGIN SSH SIGNATURE-----
U1NIU0lHAAAAAQAAADMAAAALc3NoLWVkMjU1MTkAAAAgI4qOjokuvuZmHeVzSmqQWVWtj4
tU3uv3g3j5WTDoPqkAAAALZGlzdHJpYnV0b3IAAAAAAAAABnNoYTUxMgAAAFMAAAALc3No
LWVkMjU1MTkAAABAeW9K3Bt0hjbl3PQ4LukLgb9oxpkr5kCcc5vOA//pp6ovMtxfwBEn5Q
A0cgl58z6Z8GloctgOzeG+SA895F/GBg==
-----END SSH SIGNATURE-----
";

pub(super) const NOW: OffsetDateTime = datetime!(2026-12-02 12:00 UTC);

fn signers(text: &str) -> AllowedSigners {
    AllowedSigners::parse(text).unwrap()
}

fn signed(manifest: &[u8]) -> String {
    sign(ED_PRIVATE.as_bytes(), manifest, NAMESPACE)
        .unwrap()
        .unwrap()
}

#[test]
fn a_signature_written_by_ssh_keygen_is_accepted_with_the_principal_and_fingerprint() {
    let signer = check(
        MANIFEST,
        Some(BY_SSH_KEYGEN.as_bytes()),
        &signers(&format!("ci@a {ED}")),
        NAMESPACE,
        NOW,
    )
    .unwrap();
    assert_eq!(signer.principal, "ci@a");
    assert!(signer.key.starts_with("SHA256:"), "{}", signer.key);
    // Our own signature verifies the same way.
    let ours = signed(MANIFEST);
    let again = check(
        MANIFEST,
        Some(ours.as_bytes()),
        &signers(&format!("ci@a {ED}")),
        NAMESPACE,
        NOW,
    );
    assert_eq!(again.unwrap(), signer);
}

#[test]
fn each_way_a_signature_fails_has_its_own_reason() {
    let ours = signed(MANIFEST);
    let in_git = sign_in("git");
    let truncated = &BY_SSH_KEYGEN[..BY_SSH_KEYGEN.len() / 2];
    // (case, signature file, manifest, allowed_signers, reason)
    type Case<'a> = (&'a str, Option<&'a [u8]>, &'a [u8], String, Reason);
    let cases: Vec<Case> = vec![
        (
            "missing",
            None,
            MANIFEST,
            format!("ci@a {ED}"),
            Reason::Missing,
        ),
        (
            "empty",
            Some(b""),
            MANIFEST,
            format!("ci@a {ED}"),
            Reason::Malformed,
        ),
        (
            "binary",
            Some(b"\x00\xff-----BEGIN"),
            MANIFEST,
            format!("ci@a {ED}"),
            Reason::Malformed,
        ),
        (
            "truncated base64",
            Some(truncated.as_bytes()),
            MANIFEST,
            format!("ci@a {ED}"),
            Reason::Malformed,
        ),
        (
            "random text",
            Some(b"hello world\n"),
            MANIFEST,
            format!("ci@a {ED}"),
            Reason::Malformed,
        ),
        (
            "other manifest",
            Some(ours.as_bytes()),
            b"{\"m\":2}\n",
            format!("ci@a {ED}"),
            Reason::BadSignature,
        ),
        (
            "unknown key",
            Some(ours.as_bytes()),
            MANIFEST,
            format!("ci@a {OTHER}"),
            Reason::UnknownKey,
        ),
        (
            "namespace git",
            Some(in_git.as_bytes()),
            MANIFEST,
            format!("ci@a {ED}"),
            Reason::WrongNamespace,
        ),
        (
            "line for git only",
            Some(ours.as_bytes()),
            MANIFEST,
            format!("ci@a namespaces=\"git,file\" {ED}"),
            Reason::WrongNamespace,
        ),
        (
            "not yet",
            Some(ours.as_bytes()),
            MANIFEST,
            format!("ci@a valid-after=\"20270101Z\" {ED}"),
            Reason::NotYetValid,
        ),
        (
            "expired",
            Some(ours.as_bytes()),
            MANIFEST,
            format!("ci@a valid-before=\"20261201Z\" {ED}"),
            Reason::NoLongerValid,
        ),
    ];
    for (name, sig, manifest, allowed, reason) in cases {
        let refusal = check(manifest, sig, &signers(&allowed), NAMESPACE, NOW).unwrap_err();
        assert_eq!(refusal.reason, reason, "{name}: {refusal}");
        assert!(
            refusal.to_string().starts_with("manifest.json.sig: "),
            "{name}: {refusal}"
        );
    }
}

fn sign_in(namespace: &str) -> String {
    let key = ssh_key::PrivateKey::from_openssh(ED_PRIVATE).unwrap();
    key.sign(namespace, HashAlg::Sha512, MANIFEST)
        .unwrap()
        .to_pem(ssh_key::LineEnding::LF)
        .unwrap()
}

#[test]
fn validity_and_namespaces_are_honoured_line_by_line() {
    let ours = signed(MANIFEST);
    let cases = [
        // (allowed_signers, accepted principals)
        (
            format!("ci@a valid-after=\"20261201Z\",valid-before=\"20270101Z\" {ED}"),
            vec!["ci@a"],
        ),
        (
            format!("ci@a namespaces=\"git,distributor\" {ED}"),
            vec!["ci@a"],
        ),
        (format!("ci@a namespaces=\"dist*\" {ED}"), vec!["ci@a"]),
        // A key listed for several principals, on one line or several.
        (format!("ci@a,ci@b {ED}"), vec!["ci@a", "ci@b"]),
        (
            format!("ci@a {ED}\nci@c {OTHER}\nci@b {ED}"),
            vec!["ci@a", "ci@b"],
        ),
        // An expired line and a current one: only the current one counts.
        (
            format!("old@a valid-before=\"20260101Z\" {ED}\nnew@a {ED}"),
            vec!["new@a"],
        ),
        // Several keys for one principal.
        (format!("ci@a {OTHER}\nci@a {ED}"), vec!["ci@a"]),
    ];
    for (allowed, principals) in cases {
        let signer = check(
            MANIFEST,
            Some(ours.as_bytes()),
            &signers(&allowed),
            NAMESPACE,
            NOW,
        )
        .unwrap_or_else(|e| panic!("{allowed}: {e}"));
        assert_eq!(signer.principals, principals, "{allowed}");
        assert_eq!(signer.principal, principals[0]);
    }
}

#[test]
fn the_boundaries_of_validity_are_inclusive() {
    let ours = signed(MANIFEST);
    let at = |allowed: &str, now| {
        check(
            MANIFEST,
            Some(ours.as_bytes()),
            &signers(allowed),
            NAMESPACE,
            now,
        )
    };
    let window = format!("ci@a valid-after=\"202612021200Z\",valid-before=\"202612021300Z\" {ED}");
    assert!(at(&window, datetime!(2026-12-02 12:00 UTC)).is_ok());
    assert!(at(&window, datetime!(2026-12-02 13:00 UTC)).is_ok());
    assert_eq!(
        at(&window, datetime!(2026-12-02 11:59:59 UTC))
            .unwrap_err()
            .reason,
        Reason::NotYetValid
    );
    assert_eq!(
        at(&window, datetime!(2026-12-02 13:00:01 UTC))
            .unwrap_err()
            .reason,
        Reason::NoLongerValid
    );
}

#[test]
fn reasons_round_trip_through_their_spelling() {
    for reason in Reason::ALL {
        assert_eq!(Reason::parse(reason.as_str()), Some(reason));
    }
}

#[test]
fn principal_scopes_hold_every_output_or_refuse_naming_them() {
    let scope = |entries: &[&str]| {
        crate::scope::Scope::parse(&entries.iter().map(|e| e.to_string()).collect::<Vec<_>>())
            .unwrap()
    };
    let scopes: BTreeMap<String, crate::scope::Scope> = [
        ("ci@a".to_owned(), scope(&["a/"])),
        ("ci@b".to_owned(), scope(&["b/", "index.html"])),
    ]
    .into();
    let signer = |principals: &[&str]| Signer {
        principal: principals[0].to_owned(),
        key: "SHA256:test".to_owned(),
        principals: principals.iter().map(|p| p.to_string()).collect(),
    };
    // (principals of the key, outputs, Ok(reported principal) or Err(words in the refusal))
    type Case<'a> = (&'a [&'a str], &'a [&'a str], Result<&'a str, &'a [&'a str]>);
    let cases: Vec<Case> = vec![
        (&["ci@a"], &["a/x.html", "a/y/z.txt"], Ok("ci@a")),
        (
            &["ci@a"],
            &["a/x.html", "b/x.html"],
            Err(&["\"b/x.html\"", "ci@a [\"a/\"]"]),
        ),
        (&["ci@b"], &["index.html", "b/1"], Ok("ci@b")),
        // A key listed for both may publish into either; reported as the
        // one whose scope holds everything.
        (&["ci@a", "ci@b"], &["b/1", "index.html"], Ok("ci@b")),
        (&["ci@a", "ci@b"], &["a/1", "b/1"], Ok("ci@a")),
        // A principal without an entry may publish nothing.
        (
            &["ci@c"],
            &["a/1"],
            Err(&["ci@c may publish nothing", "no entry"]),
        ),
        (&["ci@c", "ci@a"], &["a/1"], Ok("ci@a")),
        // Paths are compared by whole segments.
        (&["ci@a"], &["ab/1"], Err(&["\"ab/1\""])),
        (&["ci@a"], &["a"], Err(&["\"a\""])),
    ];
    for (principals, paths, wanted) in cases {
        let got = check_scopes(&signer(principals), &scopes, paths.iter().copied());
        match (got, wanted) {
            (Ok(p), Ok(want)) => assert_eq!(p, want, "{principals:?} {paths:?}"),
            (Err(refusal), Err(words)) => {
                assert_eq!(refusal.reason, Reason::OutsideScope);
                for w in words {
                    assert!(refusal.message.contains(w), "{w:?} not in {refusal}");
                }
            }
            (got, want) => panic!("{principals:?} {paths:?}: got {got:?}, wanted {want:?}"),
        }
    }
    // Many outside: the first five are named, the rest counted.
    let many: Vec<String> = (0..8).map(|i| format!("z/{i}")).collect();
    let refusal =
        check_scopes(&signer(&["ci@a"]), &scopes, many.iter().map(String::as_str)).unwrap_err();
    assert!(refusal.message.contains("8 outputs are"), "{refusal}");
    assert!(refusal.message.contains("and 3 more"), "{refusal}");
}
