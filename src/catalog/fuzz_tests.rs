//! Fuzzing the catalog's readers against each other (docs/reliability.md,
//! "Fuzzing"). serde_json reading the whole text ([`State::classify`]) is
//! the oracle; the reader of this tool's own layout (`layout`, in one part
//! or several), the streamed reader and the readers that keep record texts
//! must give the very same state for the same bytes, or (the layout
//! reader alone, as documented) decline and leave the bytes to serde.

use super::layout;
use super::tests::SEED_V4;
use super::texts::Fingerprints;
use super::write::push_record_text;
use super::*;
use crate::fuzzing::{Tally, iterations, mutate};
use crate::paths::RelPath;
use std::io::Cursor;
use std::sync::Arc;

fn shown(bytes: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(bytes)
}

/// Reads `bytes` every way there is and holds each to serde's reading.
fn check_catalog(bytes: &[u8], tally: &Tally) {
    let serde = State::classify(bytes);
    tally.saw(matches!(serde, State::Catalog(_)));
    assert_eq!(State::parse(bytes), serde, "parse: {}", shown(bytes));
    let read = State::read(&mut Cursor::new(bytes)).unwrap();
    assert_eq!(read, serde, "read: {}", shown(bytes));
    let (streamed, _) = State::read_whole_up_to(&mut Cursor::new(bytes), 0, true).unwrap();
    assert_eq!(streamed, serde, "streamed: {}", shown(bytes));
    let buffer: Buffer = Arc::new(bytes.to_vec());
    let (with_texts, texts) = State::parse_with_texts(buffer);
    assert_eq!(with_texts, serde, "with texts: {}", shown(bytes));
    let fast = layout::read(bytes, true);
    for parts in 1..=4 {
        assert_eq!(
            layout::read_in_parts(bytes, true, Some(parts)),
            fast,
            "{parts} parts: {}",
            shown(bytes)
        );
    }
    if let Some((catalog, spans)) = &fast {
        // The layout reader answers only for text this tool wrote, byte
        // for byte, and each span is a record's text as written.
        assert_eq!(&catalog.to_json()[..], bytes);
        assert_eq!(spans.len(), catalog.outputs.len());
        for (r, (key, span)) in catalog.outputs.iter().zip(spans) {
            assert_eq!(*key, Fingerprints::default().key(r));
            let mut own = Vec::new();
            push_record_text(r, &mut own, &mut Default::default());
            assert_eq!(&bytes[span.clone()], &own[..]);
        }
    }
    if let State::Catalog(catalog) = &serde {
        // What this tool writes of it reads back the same, by the layout
        // reader unless a string in it is escaped (documented: serde reads
        // those), and with the texts just read it writes the same bytes.
        let written = catalog.to_json();
        match layout::read(&written, false) {
            Some((again, _)) => assert_eq!(&again, catalog),
            None => assert!(
                written.contains(&b'\\'),
                "the layout reader declined its own text: {}",
                shown(&written)
            ),
        }
        let mut reusing = Vec::new();
        catalog
            .write_json_reusing(&mut reusing, texts.as_ref())
            .unwrap();
        assert_eq!(reusing, written);
    }
}

/// A catalog as this tool writes it, its records made from `bytes`:
/// paths, sizes, kinds, urls and fractions of seconds the bytes choose.
fn written_from(bytes: &[u8]) -> Vec<u8> {
    const SEGMENTS: [&str; 8] = [
        "a", "b.html", "é", "x y", "\"q\"", "\\", "\u{2028}", "😀.md",
    ];
    let State::Catalog(seed) = State::classify(SEED_V4.as_bytes()) else {
        unreachable!("the seed is a catalog")
    };
    let mut catalog = seed.clone();
    catalog.outputs.clear();
    for (i, r) in bytes.chunks(4).take(12).enumerate() {
        let [a, b, c, d] = [0, 1, 2, 3].map(|k| r.get(k).copied().unwrap_or(0));
        let segment = |x: u8| SEGMENTS[usize::from(x) % SEGMENTS.len()];
        let Ok(path) = RelPath::parse(&format!("{i}{}/{}", segment(a), segment(b))) else {
            continue;
        };
        let mut record = seed.outputs[0].clone();
        record.path = path;
        record.size = u64::from(c) << (d % 64);
        record.url = (d % 3 != 0).then(|| format!("https://example.org/{}", segment(c)));
        record.kind = if d % 2 == 0 {
            OutputKind::Source
        } else {
            OutputKind::Generated
        };
        record.transform = (d % 2 == 1).then_some(TRANSFORMS[usize::from(c) % TRANSFORMS.len()]);
        record.source_path = record.transform.map(|_| RelPath::parse("src.md").unwrap());
        record.updated_at = record
            .updated_at
            .replace_nanosecond(u32::from(b) * 3_900_000)
            .unwrap();
        catalog.outputs.push(record);
    }
    catalog.sort();
    catalog.to_json()
}

/// Every reader of a catalog reads any bytes as serde_json does.
#[test]
fn fuzz_catalog_readers() {
    let State::Catalog(seed) = State::classify(SEED_V4.as_bytes()) else {
        panic!("the seed is a catalog")
    };
    let written = seed.to_json();
    let several = written_from(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]);
    let empty = Catalog::new(seed.created_at).to_json();
    let seeds: Vec<&[u8]> = vec![SEED_V4.as_bytes(), &written, &several, &empty];
    let dictionary: &[&[u8]] = &[
        b"\"path\": \"",
        b"\"kind\": \"generated\"",
        b"\"kind\": \"source\"",
        b"\"transform\": \"gzip\"",
        b"\"source_path\": null",
        b"\"url\": null",
        b"\"size\": 18446744073709551615",
        b"\"schema_version\": 4",
        b"\"schema_version\": 3",
        b"\"mode\": \"catalog\"",
        b"\"distributor_version\": null,",
        b"2026-06-04T12:00:00.5Z",
        b"2026-06-04T14:00:00+02:00",
        b"\\u0061",
        b"\\\"",
        b"\n    },\n    {\n      \"path\": ",
        b"\n  ]\n}\n",
        b"sha256:",
        b".distributor",
        b"    ",
        b"\n",
        b",",
        b"{",
        b"}",
        b"[",
        b"]",
        b"\"",
        b"0",
    ];
    let tally = &Tally::new("catalog_readers", "catalogs");
    bolero::check!(name = "catalog_readers")
        .with_iterations(iterations(1_500))
        .for_each(|input: &[u8]| {
            check_catalog(input, tally);
            if let Some(edited) = mutate(input, &seeds, dictionary) {
                check_catalog(&edited, tally);
            }
            check_catalog(&written_from(input), tally);
        });
}
