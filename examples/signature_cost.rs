//! What checking a bundle's signature costs, alone: `bench/bench.py`'s
//! `signed` measure runs it over the signed bundles it made.
//!
//! Usage: signature_cost ALLOWED_SIGNERS BUNDLE...
//!
//! Reads each bundle's `manifest.json` and `manifest.json.sig` once, then
//! checks every signature (distributor's own check, as the agent makes it)
//! in rounds until a second has passed, and prints the mean time per check
//! in microseconds.

use distributor::signature::{AllowedSigners, check};
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((signers, bundles)) = args.split_first() else {
        eprintln!("usage: signature_cost ALLOWED_SIGNERS BUNDLE...");
        std::process::exit(2);
    };
    let signers = AllowedSigners::read(signers.as_ref()).unwrap_or_else(|e| {
        eprintln!("{signers}: {e}");
        std::process::exit(2)
    });
    let read = |dir: &String, name: &str| {
        std::fs::read(std::path::Path::new(dir).join(name)).unwrap_or_else(|e| {
            eprintln!("{dir}/{name}: {e}");
            std::process::exit(1)
        })
    };
    let signed: Vec<(Vec<u8>, Vec<u8>)> = bundles
        .iter()
        .map(|b| (read(b, "manifest.json"), read(b, "manifest.json.sig")))
        .collect();
    let now = time::OffsetDateTime::now_utc();
    let started = Instant::now();
    let mut checks = 0u64;
    while started.elapsed() < Duration::from_secs(1) || checks == 0 {
        for (manifest, sig) in &signed {
            if let Err(e) = check(
                manifest,
                Some(sig),
                &signers,
                distributor::signature::NAMESPACE,
                now,
            ) {
                eprintln!("a signature was refused: {e}");
                std::process::exit(1);
            }
            checks += 1;
        }
    }
    let micros = started.elapsed().as_secs_f64() * 1e6 / checks as f64;
    println!("{micros:.1}");
}
