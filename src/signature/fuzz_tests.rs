//! Fuzzing the two texts a signature check reads (docs/reliability.md,
//! "Fuzzing"): `allowed_signers`, against a reading of which lines allow
//! a signature written here (docs/contract.md §17.3), and
//! `manifest.json.sig`, which must never let an edited signature or
//! manifest through.

use super::tests::{BY_SSH_KEYGEN, ED, MANIFEST, NOW, OTHER};
use super::*;
use crate::fuzzing::{iterations, mutate};

/// OpenSSH's wildcard match, as a table over (name, pattern) prefixes:
/// `*` any run of bytes, `?` any one byte, anything else itself.
fn glob(name: &[u8], pattern: &[u8]) -> bool {
    // row[j]: pattern[..i] matches name[..j].
    let mut row = vec![false; name.len() + 1];
    row[0] = true;
    for &p in pattern {
        let mut next = vec![false; name.len() + 1];
        if p == b'*' {
            // A star matches the empty run, or one more byte.
            next[0] = row[0];
            for j in 1..=name.len() {
                next[j] = row[j] || next[j - 1];
            }
        } else {
            for j in 1..=name.len() {
                next[j] = row[j - 1] && (p == b'?' || p == name[j - 1]);
            }
        }
        row = next;
    }
    row[name.len()]
}

/// A pattern list: some pattern matches and no `!pattern` does.
fn list_matches(name: &str, patterns: &[String]) -> bool {
    !patterns
        .iter()
        .filter_map(|p| p.strip_prefix('!'))
        .any(|p| glob(name.as_bytes(), p.as_bytes()))
        && patterns
            .iter()
            .filter(|p| !p.starts_with('!'))
            .any(|p| glob(name.as_bytes(), p.as_bytes()))
}

/// The numbers of the lines of `text` that name a signer (not blank, not
/// a comment).
fn signer_lines(text: &str) -> Vec<usize> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| {
            let l = l.trim();
            !l.is_empty() && !l.starts_with('#')
        })
        .map(|(i, _)| i + 1)
        .collect()
}

fn check_allowed_signers(text: &str) {
    let numbers = signer_lines(text);
    let signers = match AllowedSigners::parse(text) {
        Ok(signers) => signers,
        Err(e) => {
            let named = e
                .strip_prefix("line ")
                .and_then(|rest| rest.split_once(':'))
                .and_then(|(n, _)| n.parse::<usize>().ok());
            match named {
                Some(n) => assert!(numbers.contains(&n), "{e}: line {n} names no signer"),
                None => assert!(
                    numbers.is_empty() && e.starts_with("lists no signer"),
                    "{text:?}: {e}"
                ),
            }
            return;
        }
    };
    let read: Vec<usize> = signers.lines.iter().map(|l| l.line).collect();
    assert_eq!(read, numbers, "{text:?}");
    for line in &signers.lines {
        assert!(line.principals.iter().all(|p| !p.is_empty()), "{line:?}");
        if let (Some(after), Some(before)) = (line.valid_after, line.valid_before) {
            // Both read as UTC instants: each formats back in UTC.
            assert_eq!(after.offset(), time::UtcOffset::UTC);
            assert_eq!(before.offset(), time::UtcOffset::UTC);
        }
    }
    // Which lines let ssh-keygen's signature through, read here.
    let sig = SshSig::from_pem(BY_SSH_KEYGEN).unwrap();
    let allowing: Vec<&SignerLine> = signers
        .lines_for(sig.public_key())
        .filter(|l| {
            l.namespaces
                .as_ref()
                .is_none_or(|n| list_matches(NAMESPACE, n))
                && l.valid_after.is_none_or(|t| t <= NOW)
                && l.valid_before.is_none_or(|t| NOW <= t)
        })
        .collect();
    let result = check(
        MANIFEST,
        Some(BY_SSH_KEYGEN.as_bytes()),
        &signers,
        NAMESPACE,
        NOW,
    );
    match (&result, allowing.first()) {
        (Ok(signer), Some(first)) => {
            assert_eq!(signer.principal, first.principals[0], "{text:?}");
            for p in &signer.principals {
                assert!(allowing.iter().any(|l| l.principals.contains(p)), "{p}");
            }
        }
        (Err(refusal), None) => assert_ne!(refusal.reason, Reason::Malformed, "{text:?}"),
        _ => panic!("{text:?}: {result:?}, but the lines allowing it are {allowing:?}"),
    }
}

/// `allowed_signers`: any text is read or refused naming a line, and the
/// lines read let a signature through exactly as the contract says.
#[test]
fn fuzz_allowed_signers() {
    let file = format!(
        "# signers\n\nci@a,ci@b {ED} deploy key\nops@x namespaces=\"git,distributor\",valid-after=\"20260101Z\",valid-before=\"202701011230Z\" {ED}\n\"quoted@p\" {OTHER}\n"
    );
    let short = format!("ci@a namespaces=\"d*r,!git\" {ED}\n");
    let seeds: Vec<&[u8]> = vec![file.as_bytes(), short.as_bytes()];
    let dictionary: &[&[u8]] = &[
        b"namespaces=\"",
        b"valid-after=\"",
        b"valid-before=\"",
        b"cert-authority",
        b"\"",
        b",",
        b" ",
        b"\n",
        b"#",
        b"*",
        b"?",
        b"!",
        b"distributor",
        b"20261202120000Z",
        b"20261202Z",
        b"99991231Z",
        ED.as_bytes(),
        b"ssh-ed25519",
        b"AAAA",
        b"=",
    ];
    bolero::check!(name = "allowed_signers")
        .with_iterations(iterations(3_000))
        .for_each(|input: &[u8]| {
            if let Ok(text) = std::str::from_utf8(input) {
                check_allowed_signers(text);
            }
            if let Some(edited) = mutate(input, &seeds, dictionary) {
                check_allowed_signers(&String::from_utf8_lossy(&edited));
            }
        });
}

/// `manifest.json.sig`: any bytes are read or refused with a reason, and
/// nothing but ssh-keygen's own signature over the very manifest it signed
/// is accepted.
#[test]
fn fuzz_signature_file() {
    let signers = AllowedSigners::parse(&format!("ci@a {ED}")).unwrap();
    let original = SshSig::from_pem(BY_SSH_KEYGEN).unwrap();
    let seeds: &[&[u8]] = &[BY_SSH_KEYGEN.as_bytes(), MANIFEST];
    let dictionary: &[&[u8]] = &[
        b"-----BEGIN SSH SIGNATURE-----\n",
        b"-----END SSH SIGNATURE-----\n",
        b"U1NIU0lH",
        b"AAAA",
        b"=",
        b"\n",
        b"\r\n",
        b" ",
        b"{\"m\":2}\n",
    ];
    let check_pair = |manifest: &[u8], signature: &[u8]| match check(
        manifest,
        Some(signature),
        &signers,
        NAMESPACE,
        NOW,
    ) {
        Ok(signer) => {
            assert_eq!(manifest, MANIFEST, "an edited manifest verified");
            let text = std::str::from_utf8(signature).expect("accepted as text");
            assert_eq!(SshSig::from_pem(text).ok().as_ref(), Some(&original));
            assert_eq!(signer.principal, "ci@a");
        }
        Err(refusal) => {
            let readable = std::str::from_utf8(signature)
                .ok()
                .filter(|t| {
                    t.bytes()
                        .all(|b| b.is_ascii_graphic() || b.is_ascii_whitespace())
                })
                .and_then(|t| SshSig::from_pem(t).ok());
            assert_eq!(
                refusal.reason == Reason::Malformed,
                readable.is_none(),
                "{refusal}"
            );
            assert!(refusal.message.contains("; "), "no fix named: {refusal}");
        }
    };
    bolero::check!(name = "signature_file")
        .with_iterations(iterations(1_000))
        .for_each(|input: &[u8]| {
            check_pair(MANIFEST, input);
            let Some(edited) = mutate(input, seeds, dictionary) else {
                return;
            };
            // The first byte chose the seed: an edited signature over
            // the manifest, or the signature over an edited manifest.
            if input[0].is_multiple_of(2) {
                check_pair(MANIFEST, &edited);
            } else {
                check_pair(&edited, BY_SSH_KEYGEN.as_bytes());
            }
        });
}

#[test]
fn the_reference_glob_matches_as_openssh_does() {
    let list = |s: &str| s.split(',').map(str::to_owned).collect::<Vec<_>>();
    for (name, patterns, wanted) in [
        ("distributor", "dist*", true),
        ("distributor", "distribut?r", true),
        ("distributor", "*,!distributor", false),
        ("distributor", "d*r,!git", true),
        ("distributor", "distributo", false),
        ("", "*", true),
        ("", "?", false),
    ] {
        assert_eq!(list_matches(name, &list(patterns)), wanted, "{patterns}");
    }
}
