//! Where a large catalog's time goes, step by step: `bench/bench.py`'s
//! `catalog` measure runs it on the catalogs it made.
//!
//! Usage: catalog_cost CATALOG
//!
//! Times, each as the median of 5 rounds: reading and parsing the file
//! (`State::read_file`, as a publication does), writing the catalog again with
//! every record formatted, writing it again taking each record's text from
//! the read (as a publication after a small change does), and freeing the
//! records. Prints one line per step in milliseconds.

use distributor::catalog::{RecordTexts, State};
use std::time::Instant;

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: catalog_cost CATALOG");
        std::process::exit(2);
    };
    let read = || {
        let file = std::fs::File::open(&path).unwrap_or_else(|e| {
            eprintln!("{path}: {e}");
            std::process::exit(1)
        });
        let start = Instant::now();
        let read = State::read_file(&file, true).unwrap_or_else(|e| {
            eprintln!("{path}: {e}");
            std::process::exit(1)
        });
        (start.elapsed().as_secs_f64() * 1000.0, read)
    };
    let (mut reads, mut fresh, mut reusing, mut frees) = (vec![], vec![], vec![], vec![]);
    let mut records = 0;
    for _ in 0..5 {
        let (ms, (state, texts)) = read();
        reads.push(ms);
        let State::Catalog(catalog) = state else {
            eprintln!("{path}: not a schema 4 catalog");
            std::process::exit(1)
        };
        records = catalog.outputs.len();
        let mut out = Vec::with_capacity(64 << 20);
        let start = Instant::now();
        let _: RecordTexts = catalog.write_json_reusing(&mut out, None).unwrap();
        fresh.push(start.elapsed().as_secs_f64() * 1000.0);
        out.clear();
        let start = Instant::now();
        let _: RecordTexts = catalog
            .write_json_reusing(&mut out, texts.as_ref())
            .unwrap();
        reusing.push(start.elapsed().as_secs_f64() * 1000.0);
        let start = Instant::now();
        drop((catalog, texts));
        frees.push(start.elapsed().as_secs_f64() * 1000.0);
    }
    println!("records {records}");
    println!("read_ms {:.1}", median(reads));
    println!("write_formatting_ms {:.1}", median(fresh));
    println!("write_reusing_ms {:.1}", median(reusing));
    println!("free_ms {:.1}", median(frees));
}
