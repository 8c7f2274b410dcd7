use super::read::read_in_halves;
use super::texts::{Fingerprints, text_path_cmp};
use super::write::{Stamps, push_record_text};
use super::*;
use crate::paths::RelPath;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A writer on a full disk.
struct Full;

impl std::io::Write for Full {
    fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
        Err(std::io::Error::from_raw_os_error(28))
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A full disk while the catalog is written keeps its errno, so that
/// the agent defers the bundle (`io_class`) instead of failing it.
#[test]
fn a_full_disk_while_writing_a_catalog_keeps_its_errno() {
    let mut catalog = Catalog::new(parse_time("2026-06-04T12:00:00Z").unwrap());
    let State::Catalog(seed) = State::parse(SEED_V4.as_bytes()) else {
        panic!("the seed parses")
    };
    // Large enough not to fit the writer's buffer.
    for i in 0..2000 {
        let mut r = seed.outputs[0].clone();
        r.path = crate::paths::RelPath::parse(&format!("p/{i:05}.html")).unwrap();
        catalog.outputs.push(r);
    }
    let whole = catalog.write_json(&mut Full).unwrap_err();
    assert_eq!(whole.raw_os_error(), Some(28), "{whole}");
    let Err(reusing) = catalog.write_json_reusing(&mut Full, None) else {
        panic!("written on a full disk")
    };
    assert_eq!(reusing.raw_os_error(), Some(28), "{reusing}");
    assert!(crate::fs::io_class::is_transient(&reusing));
}

/// The v4 example from the destination state contract, verbatim.
pub const SEED_V4: &str = r#"{
  "schema_version": 4,
  "distributor_version": "dev",
  "created_at": "2026-06-04T12:00:00Z",
  "updated_at": "2026-06-04T12:10:00Z",
  "state": {
    "mode": "catalog"
  },
  "outputs": [
    {
      "path": "report.html",
      "pipeline_id": "reports",
      "destination_id": "static-site",
      "source": {
        "id": "reports.example.2026-06-04",
        "digest": "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "created": "2026-06-04T11:55:00Z"
      },
      "kind": "generated",
      "source_path": "report.md",
      "transform": "markdown_to_html",
      "url": "https://reports.example.com/archive/report.html",
      "sha256": "sha256:abcdefabcdefabcdefabcdefabcdefabcdefabcdefabcdefabcdefabcdefabcd",
      "size": 2345,
      "created_at": "2026-06-04T12:00:00Z",
      "updated_at": "2026-06-04T12:10:00Z"
    }
  ]
}
"#;

/// The schema 1 example from the superseded contract.
const SEED_V1: &str = r#"{
  "schema_version": 1,
  "distributor_version": "dev",
  "pipeline_id": "reports",
  "destination_id": "archive",
  "published_at": "2026-06-04T12:00:00Z",
  "source": {"manifest": {"schema_version": 1, "id": "reports.example.2026-06-04",
     "digest": "sha256:...", "created": "2026-06-04T11:55:00Z",
     "files": [{"path": "report.md", "sha256": "sha256:...", "size": 1234}]}},
  "links": {"primary_url": "https://reports.example.com/archive/report.html"},
  "outputs": [{"path": "report.html", "kind": "generated", "source_path": "report.md",
     "transform": "markdown_to_html", "url": "https://reports.example.com/archive/report.html",
     "sha256": "sha256:...", "size": 2345}]
}"#;

fn seed_value() -> serde_json::Value {
    serde_json::from_str(SEED_V4).unwrap()
}

fn parse_value(v: &serde_json::Value) -> State {
    both(&serde_json::to_vec(v).unwrap())
}

/// Classifies `bytes` every way, by serde from a stream and whole, and
/// by the reader of this tool's own layout where it answers, and checks
/// that they all agree (the streamed read falls back to the whole one
/// for anything but a catalog led by its version).
fn both(bytes: &[u8]) -> State {
    let whole = State::classify(bytes);
    assert_eq!(
        State::parse(bytes),
        whole,
        "{}",
        String::from_utf8_lossy(bytes)
    );
    let read = State::read(&mut std::io::Cursor::new(bytes)).unwrap();
    assert_eq!(read, whole, "{}", String::from_utf8_lossy(bytes));
    let (streamed, _) = State::read_whole_up_to(&mut std::io::Cursor::new(bytes), 0, true).unwrap();
    assert_eq!(streamed, whole, "{}", String::from_utf8_lossy(bytes));
    whole
}

#[test]
fn a_catalog_reads_the_same_streamed_in_any_key_order() {
    let State::Catalog(c) = both(SEED_V4.as_bytes()) else {
        panic!("seed must be a valid catalog");
    };
    // serde_json's map orders keys by name: schema_version is not first.
    let reordered = serde_json::to_vec(&seed_value()).unwrap();
    assert!(!reordered.starts_with(b"{\"schema_version\""));
    assert_eq!(both(&reordered), State::Catalog(c.clone()));
    let text = SEED_V4.replace(
        "\"distributor_version\": \"dev\",",
        "\"distributor_version\": null,",
    );
    let State::Catalog(none) = both(text.as_bytes()) else {
        panic!("a null distributor_version is no version");
    };
    assert_eq!(none.distributor_version, None);
    for tail in ["x", "{}", "]"] {
        assert!(matches!(
            both(format!("{SEED_V4}{tail}").as_bytes()),
            State::Invalid { .. }
        ));
    }
    for (from, to) in [
        (
            "\"state\": {",
            "\"state\": {\"mode\": \"catalog\"}, \"state\": {",
        ),
        (
            "\"created_at\": \"2026-06-04T12:00:00Z\",\n  \"updated",
            "\"updated",
        ),
        (
            "\"schema_version\": 4,",
            "\"schema_version\": 4, \"schema_version\": 4,",
        ),
        ("\"schema_version\": 4,", "\"schema_version\": 4.0,"),
    ] {
        let text = SEED_V4.replacen(from, to, 1);
        assert_ne!(text, SEED_V4);
        assert!(
            matches!(both(text.as_bytes()), State::Invalid { .. }),
            "{text}"
        );
    }
}

#[test]
fn seed_v4_reads_and_writes_back_byte_for_byte() {
    let State::Catalog(c) = State::parse(SEED_V4.as_bytes()) else {
        panic!("seed must be a valid catalog");
    };
    assert_eq!(c.outputs.len(), 1);
    let r = &c.outputs[0];
    assert_eq!(r.path.as_str(), "report.html");
    assert_eq!(r.kind, OutputKind::Generated);
    assert_eq!(r.size, 2345);
    assert_eq!(String::from_utf8(c.to_json()).unwrap(), SEED_V4);
}

#[test]
fn digests_read_and_write_back_as_the_same_text() {
    let hex = "0123456789abcdef".repeat(4);
    for text in [
        format!("sha256:{hex}"),
        format!("sha256:{}", "0".repeat(64)),
        format!("sha256:{}", "f".repeat(64)),
    ] {
        let d = Sha256::parse(&text).unwrap();
        assert_eq!(d.to_string(), text);
        assert!(d == text && text.clone() == d);
        assert_eq!(serde_json::to_string(&d).unwrap(), format!("\"{text}\""));
        assert_eq!(
            serde_json::from_str::<Sha256>(&format!("\"{text}\"")).unwrap(),
            d
        );
    }
    assert_eq!(
        Sha256::parse(&format!("sha256:{hex}")).unwrap().0[..2],
        [0x01, 0x23]
    );
    for bad in [
        format!("sha256:{}", hex.to_uppercase()),
        format!("sha256:{}", &hex[1..]),
        format!("sha256:{hex}0"),
        format!("md5:{hex}"),
        hex.clone(),
        format!("sha256:{}", "g".repeat(64)),
    ] {
        assert_eq!(Sha256::parse(&bad), None, "{bad}");
        assert!(serde_json::from_str::<Sha256>(&format!("\"{bad}\"")).is_err());
    }
}

/// Compact records write back exactly the bytes they were read from,
/// for every shape of record (source and generated by each transform,
/// with and without url, several owners and sources), in the catalog and
/// one by one.
#[test]
fn compact_records_write_back_byte_for_byte() {
    let record = |i: usize| {
        // Every transform: a page and both precompressed siblings.
        let generated = if i.is_multiple_of(2) {
            format!(
                concat!(
                    "      \"kind\": \"generated\",\n",
                    "      \"source_path\": \"report.md\",\n",
                    "      \"transform\": \"{}\",\n",
                    "      \"url\": \"https://reports.example.com/a%20b/r.html\",\n",
                ),
                ["markdown_to_html", "gzip", "brotli"][i / 2 % 3]
            )
        } else {
            "      \"kind\": \"source\",\n".to_owned()
        };
        format!(
            concat!(
                "    {{\n",
                "      \"path\": \"d{}/p{}.html\",\n",
                "      \"pipeline_id\": \"pipe{}\",\n",
                "      \"destination_id\": \"static-site\",\n",
                "      \"source\": {{\n",
                "        \"id\": \"src.{}\",\n",
                "        \"digest\": \"sha256:{:064x}\",\n",
                "        \"created\": \"2026-06-04T11:55:00.5Z\"\n",
                "      }},\n",
                "{}",
                "      \"sha256\": \"sha256:{:064x}\",\n",
                "      \"size\": {},\n",
                "      \"created_at\": \"2026-06-04T12:00:00Z\",\n",
                "      \"updated_at\": \"2026-06-04T12:10:00.125Z\"\n",
                "    }}"
            ),
            i % 3,
            i,
            i % 2,
            i % 3,
            i % 3 + 1,
            generated,
            i * 7919,
            i * 1000
        )
    };
    // Sorted by path: d0/p0, d0/p3, d1/p1, d1/p4, d2/p2, d2/p5.
    let records: Vec<String> = [0, 3, 1, 4, 2, 5].into_iter().map(record).collect();
    let head = SEED_V4.split("\"outputs\"").next().unwrap();
    let text = format!("{head}\"outputs\": [\n{}\n  ]\n}}\n", records.join(",\n"));
    let State::Catalog(c) = both(text.as_bytes()) else {
        panic!("a valid catalog: {:?}", State::parse(text.as_bytes()));
    };
    assert_eq!(String::from_utf8(c.to_json()).unwrap(), text);
    let transforms: Vec<_> = c.outputs.iter().filter_map(|r| r.transform).collect();
    assert_eq!(transforms, ["markdown_to_html", "brotli", "gzip"]);
    // Records of one owner and one source share them.
    let (a, b) = (&c.outputs[0], &c.outputs[4]);
    assert_eq!((&*a.pipeline_id, &*b.pipeline_id), ("pipe0", "pipe0"));
    assert!(Arc::ptr_eq(&a.pipeline_id, &b.pipeline_id));
    assert!(Arc::ptr_eq(&a.destination_id, &c.outputs[1].destination_id));
    assert!(Arc::ptr_eq(&c.outputs[0].source, &c.outputs[1].source));
    // One by one (as the journal writes them), compactly.
    for r in &c.outputs {
        let one = serde_json::to_string(r).unwrap();
        let again: OutputRecord = serde_json::from_str(&one).unwrap();
        assert_eq!(&again, r);
        assert_eq!(serde_json::to_string(&again).unwrap(), one);
    }
}

#[test]
fn legacy_and_future_versions_are_recognised() {
    assert_eq!(
        both(SEED_V1.as_bytes()),
        State::Legacy { schema_version: 1 }
    );
    for v in [2, 3] {
        let text = format!(r#"{{"schema_version": {v}, "anything": [1]}}"#);
        assert_eq!(
            State::parse(text.as_bytes()),
            State::Legacy { schema_version: v }
        );
    }
    assert_eq!(
        both(br#"{"schema_version": 5}"#),
        State::Future { schema_version: 5 }
    );
}

/// Every way a state file can be invalid, each from the contract.
#[test]
fn invalid_states_are_rejected() {
    type Edit = fn(&mut serde_json::Value);
    let cases: &[(&str, Edit)] = &[
        ("unknown top-level field", |v| v["extra"] = 1.into()),
        ("unknown output field", |v| {
            v["outputs"][0]["extra"] = 1.into()
        }),
        ("unknown source field", |v| {
            v["outputs"][0]["source"]["x"] = 1.into()
        }),
        ("unknown state field", |v| v["state"]["x"] = 1.into()),
        ("wrong mode", |v| v["state"]["mode"] = "single_owner".into()),
        ("missing outputs", |v| {
            v.as_object_mut().unwrap().remove("outputs");
        }),
        ("missing created_at", |v| {
            v.as_object_mut().unwrap().remove("created_at");
        }),
        ("bad timestamp", |v| v["updated_at"] = "yesterday".into()),
        ("size as string", |v| v["outputs"][0]["size"] = "12".into()),
        ("negative size", |v| v["outputs"][0]["size"] = (-1).into()),
        ("uppercase sha", |v| {
            v["outputs"][0]["sha256"] = format!("sha256:{}", "AB".repeat(32)).into()
        }),
        ("short sha", |v| {
            v["outputs"][0]["sha256"] = "sha256:abc".into()
        }),
        ("bad source digest", |v| {
            v["outputs"][0]["source"]["digest"] = "md5:x".into()
        }),
        ("dotdot path", |v| {
            v["outputs"][0]["path"] = "../x.html".into()
        }),
        ("absolute path", |v| {
            v["outputs"][0]["path"] = "/x.html".into()
        }),
        ("reserved path", |v| {
            v["outputs"][0]["path"] = ".distributor.lock".into()
        }),
        ("bad pipeline id", |v| {
            v["outputs"][0]["pipeline_id"] = "-x".into()
        }),
        ("bad destination id", |v| {
            v["outputs"][0]["destination_id"] = "a b".into()
        }),
        ("bad source id", |v| {
            v["outputs"][0]["source"]["id"] = "".into()
        }),
        ("bad kind", |v| v["outputs"][0]["kind"] = "copy".into()),
        ("generated without transform", |v| {
            v["outputs"][0].as_object_mut().unwrap().remove("transform");
        }),
        ("generated without source_path", |v| {
            v["outputs"][0]
                .as_object_mut()
                .unwrap()
                .remove("source_path");
        }),
        ("source with source_path", |v| {
            v["outputs"][0]["kind"] = "source".into()
        }),
        ("unknown transform", |v| {
            v["outputs"][0]["transform"] = "deflate".into()
        }),
        ("transform in another case", |v| {
            v["outputs"][0]["transform"] = "GZIP".into()
        }),
        ("bad url", |v| v["outputs"][0]["url"] = "ftp://x/y".into()),
        ("duplicate path", |v| {
            let first = v["outputs"][0].clone();
            v["outputs"].as_array_mut().unwrap().push(first);
        }),
        ("schema_version as string", |v| {
            v["schema_version"] = "4".into()
        }),
        ("schema_version zero", |v| v["schema_version"] = 0.into()),
        ("schema_version negative", |v| {
            v["schema_version"] = (-4).into()
        }),
        ("schema_version float", |v| v["schema_version"] = 4.5.into()),
        ("no schema_version", |v| {
            v.as_object_mut().unwrap().remove("schema_version");
        }),
    ];
    for (name, edit) in cases {
        let mut v = seed_value();
        edit(&mut v);
        assert!(
            matches!(parse_value(&v), State::Invalid { .. }),
            "{name}: {:?}",
            parse_value(&v)
        );
    }
    for junk in [
        &b"not json"[..],
        b"[]",
        b"4",
        b"",
        b"{\"schema_version\": 4",
    ] {
        assert!(matches!(both(junk), State::Invalid { .. }));
    }
}

#[test]
fn writes_are_sorted_and_normalised_to_utc() {
    let mut v = seed_value();
    let mut second = v["outputs"][0].clone();
    second["path"] = "a/first.html".into();
    second["created_at"] = "2026-06-04T14:00:00.250+02:00".into();
    v["outputs"].as_array_mut().unwrap().push(second);
    let State::Catalog(c) = parse_value(&v) else {
        panic!()
    };
    let text = String::from_utf8(c.to_json()).unwrap();
    let a = text.find("a/first.html").unwrap();
    let b = text.find("report.html\"").unwrap();
    assert!(a < b, "outputs sorted by path");
    assert!(text.contains("\"created_at\": \"2026-06-04T12:00:00.25Z\""));
    assert!(text.ends_with("}\n"));
    assert_eq!(both(text.as_bytes()), State::Catalog(c));
}

#[test]
fn timestamps_compare_as_instants() {
    assert_eq!(
        parse_time("2026-06-04T13:55:00+02:00").unwrap(),
        parse_time("2026-06-04T11:55:00Z").unwrap()
    );
    assert_eq!(
        format_time(parse_time("2026-06-04T13:55:00.5+02:00").unwrap()),
        "2026-06-04T11:55:00.5Z"
    );
}

proptest::proptest! {
    #[test]
    fn parse_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..300)) {
        let _ = both(&bytes);
    }
}

fn record_at(path: &str, size: u64) -> OutputRecord {
    let State::Catalog(c) = State::parse(SEED_V4.as_bytes()) else {
        panic!("seed must be a valid catalog");
    };
    let mut r = c.outputs[0].clone();
    r.path = RelPath::parse(path).unwrap();
    r.size = size;
    r
}

#[test]
fn a_large_catalog_file_read_in_halves_is_the_file_read_as_one() {
    let mut c = Catalog::new(parse_time("2026-01-01T00:00:00Z").unwrap());
    c.outputs = (0..9000)
        .map(|i| record_at(&format!("d{:02}/f{i:05}.html", i % 40), i))
        .collect();
    c.sort();
    let text = c.to_json();
    assert!(text.len() >= layout::PARTS_FROM, "{}", text.len());
    let mut file = tempfile::tempfile().unwrap();
    std::io::Write::write_all(&mut file, &text).unwrap();
    let len = text.len() as u64;
    assert_eq!(read_in_halves(&file, len).unwrap(), Some(text.clone()));
    // A file that changed size since it was measured is not taken.
    assert_eq!(read_in_halves(&file, len + 1).unwrap(), None);
    assert_eq!(read_in_halves(&file, len - 1).unwrap(), None);
    for texts in [false, true] {
        let (state, kept) = State::read_file(&file, texts).unwrap();
        assert_eq!(state, State::Catalog(c.clone()));
        assert_eq!(kept.map(|t| t.len()), texts.then_some(9000));
    }
}

#[test]
fn merging_added_records_keeps_the_path_order() {
    // (records there, records added): the sorted union, however many
    // are added and wherever they go.
    type Paths = &'static [&'static str];
    let cases: [(Paths, Paths); 10] = [
        (&[], &[]),
        (&[], &["a", "b"]),
        (&["b", "d", "f"], &["a", "c", "e", "g"]),
        (&["c", "d"], &["a", "b", "e", "f"]),
        (&["b"], &[]),
        (&["b", "d", "f"], &["a"]),
        (&["b", "d", "f"], &["g"]),
        (&["b", "d", "f", "h", "j", "l", "n", "p"], &["a", "c", "e"]),
        (&["b", "d", "f", "h", "j", "l", "n", "p"], &["c", "i", "q"]),
        (&["b", "d"], &["a", "c", "e", "f", "g"]),
    ];
    for (there, added) in cases {
        let mut records: Vec<OutputRecord> = there.iter().map(|p| record_at(p, 1)).collect();
        let added: Vec<OutputRecord> = added.iter().map(|p| record_at(p, 2)).collect();
        let mut want: Vec<(String, u64)> = records
            .iter()
            .chain(&added)
            .map(|r| (r.path.to_string(), r.size))
            .collect();
        want.sort();
        merge_by_path(&mut records, added);
        let got: Vec<(String, u64)> = records
            .iter()
            .map(|r| (r.path.to_string(), r.size))
            .collect();
        assert_eq!(got, want, "{there:?}");
    }
}

#[test]
fn a_record_written_field_by_field_is_serdes_pretty_form() {
    let seed = record_at("a/b.html", 2345);
    let mut copied = record_at("plain", 0);
    copied.kind = OutputKind::Source;
    copied.source_path = None;
    copied.transform = None;
    copied.url = None;
    let mut odd = record_at("q/\"quoted\" path \u{e9}", u64::MAX);
    odd.url = Some("https://example.org/a?b=\"c\"&d=\u{2028}".to_owned());
    odd.source = Arc::new(SourceIdentity {
        id: "src.\\\u{7f}\u{1F600}\t".to_owned(),
        digest: odd.source.digest.clone(),
        created: parse_time("2026-06-04T12:00:00.123456789+02:00").unwrap(),
    });
    odd.created_at = parse_time("1999-12-31T23:59:59.5Z").unwrap();
    odd.updated_at = parse_time("2026-06-04T12:00:00.001Z").unwrap();
    for r in [seed, copied, odd] {
        let mut pretty = Vec::new();
        serde_json::to_writer_pretty(&mut pretty, &r).unwrap();
        let expected = String::from_utf8(pretty).unwrap().replace('\n', "\n    ");
        let mut out = Vec::new();
        push_record_text(&r, &mut out, &mut Stamps::default());
        assert_eq!(String::from_utf8(out).unwrap(), expected);
    }
}

#[test]
fn writing_with_the_texts_of_an_earlier_catalog_gives_the_same_bytes() {
    let written = |c: &Catalog, before: Option<&RecordTexts>| {
        let mut out = Vec::new();
        let texts = c.write_json_reusing(&mut out, before).unwrap();
        (out, texts)
    };
    let mut c = Catalog::new(parse_time("2026-01-01T00:00:00Z").unwrap());
    // Empty, then growing, changing and shrinking; with and without
    // the texts of the catalog before, and of an unrelated one.
    let (out, mut texts) = written(&c, None);
    assert_eq!(out, c.to_json());
    let unrelated = {
        let mut u = c.clone();
        u.outputs = vec![record_at("zz", 9)];
        written(&u, None).1
    };
    let mut quoted = record_at("q/\"quoted\" path é", 3);
    quoted.url = Some("https://example.org/a?b=\"c\"".to_owned());
    let steps: [(&[&str], &[&str]); 5] = [
        (&["a/x", "a/y", "b"], &[]),
        (&["c/z"], &[]),
        (&["a/y"], &["b"]),
        (&[], &["a/x", "a/y", "c/z"]),
        (&["d"], &[]),
    ];
    for (n, (upserts, removes)) in steps.iter().enumerate() {
        c.outputs.retain(|r| !removes.contains(&r.path.as_str()));
        for p in upserts.iter() {
            c.outputs.retain(|r| r.path.as_str() != *p);
            c.outputs.push(record_at(p, n as u64 + 1));
        }
        if n == 1 {
            c.outputs.push(quoted.clone());
        }
        c.sort();
        c.updated_at += time::Duration::seconds(1);
        let expected = c.to_json();
        for before in [None, Some(&texts), Some(&unrelated)] {
            assert_eq!(
                String::from_utf8(written(&c, before).0).unwrap(),
                String::from_utf8(expected.clone()).unwrap(),
                "step {n}"
            );
        }
        let reused = written(&c, Some(&texts));
        texts = reused.1;
    }
    // A record's text is taken only for an equal record.
    let one = record_at("a", 1);
    let mut other = one.clone();
    other.updated_at += time::Duration::milliseconds(1);
    let mut c1 = c.clone();
    c1.outputs = vec![one];
    let (_, t1) = written(&c1, None);
    let mut c2 = c.clone();
    c2.outputs = vec![other];
    assert_eq!(written(&c2, Some(&t1)).0, c2.to_json());
}

#[test]
fn a_fingerprint_changes_with_every_field_the_text_shows() {
    let seed = record_at("a/b.html", 10);
    let key = |r: &OutputRecord| Fingerprints::default().key(r);
    assert_eq!(key(&seed), key(&seed.clone()));
    type Change = (&'static str, fn(&mut OutputRecord));
    let changes: [Change; 14] = [
        ("path", |r| r.path = RelPath::parse("a/b.htm").unwrap()),
        ("pipeline", |r| r.pipeline_id = "other".into()),
        ("destination", |r| r.destination_id = "other".into()),
        ("source id", |r| Arc::make_mut(&mut r.source).id.push('x')),
        ("source digest", |r| {
            Arc::make_mut(&mut r.source).digest.push('0')
        }),
        ("source created", |r| {
            Arc::make_mut(&mut r.source).created += time::Duration::SECOND
        }),
        ("kind", |r| r.kind = OutputKind::Source),
        ("source path", |r| r.source_path = None),
        ("transform", |r| r.transform = None),
        ("url", |r| r.url = Some("https://example.org/".to_owned())),
        ("sha256", |r| r.sha256.0[31] ^= 1),
        ("size", |r| r.size += 1),
        ("created", |r| r.created_at += time::Duration::NANOSECOND),
        ("updated", |r| r.updated_at += time::Duration::NANOSECOND),
    ];
    // One walk over all of them, as a write makes (reusing the owner's
    // fingerprint from one record to the next), gives each the
    // fingerprint it has on its own.
    let mut walk = Fingerprints::default();
    assert_eq!(walk.key(&seed), key(&seed));
    for (field, change) in changes {
        let mut r = seed.clone();
        change(&mut r);
        assert_ne!(r, seed, "{field}: the change must change the record");
        assert_ne!(key(&r), key(&seed), "{field}");
        assert_eq!(walk.key(&r), key(&r), "{field}");
        assert_eq!(walk.key(&seed), key(&seed), "{field}");
    }
    // Texts are in UTC: the same instant at another offset is the same
    // text, and the same fingerprint.
    let mut shifted = seed.clone();
    shifted.created_at = seed.created_at.to_offset(time::macros::offset!(+2));
    assert_eq!(key(&shifted), key(&seed));
}

#[test]
fn a_records_text_compares_by_its_path() {
    use std::cmp::Ordering::{Equal, Greater, Less};
    // (path in the text, path compared with, order of the text's)
    let cases = [
        ("a/b", "a/b", Equal),
        ("a/b", "a/c", Less),
        ("a/b", "a/b/c", Less),
        ("a/b/c", "a/b", Greater),
        ("a/\"q\"", "a/\"q\"", Equal),
        ("a/\"q\"", "a/b", Less),
        ("a/\"q\"", "a/", Greater),
        ("a/\"", "a/\"q", Less),
        ("a", "a\"", Less),
        ("a", "a\" b", Less),
        ("a\" b", "a", Greater),
        ("é", "e", Greater),
    ];
    for (texts, path, want) in cases {
        let mut text = Vec::new();
        push_record_text(&record_at(texts, 1), &mut text, &mut Stamps::default());
        assert_eq!(text_path_cmp(&text, path), Some(want), "{texts} vs {path}");
        assert_eq!(texts.cmp(path), want, "the order of the paths themselves");
    }
    assert_eq!(text_path_cmp(b"{\"size\": 1}", "a"), None);
}

#[test]
fn a_write_takes_the_text_of_every_unchanged_record_around_the_changes() {
    let mut c = Catalog::new(parse_time("2026-01-01T00:00:00Z").unwrap());
    // Paths with escapes among them: texts are matched by path.
    c.outputs = (0..60)
        .map(|i| match i % 7 {
            0 => record_at(&format!("f/{i:03} \"q\""), i),
            1 => record_at(&format!("f/{i:03} é"), i),
            _ => record_at(&format!("f/{i:03}"), i),
        })
        .collect();
    c.sort();
    let texts = c.write_json_reusing(&mut Vec::new(), None).unwrap();
    // (records removed, changed, added) at the start, middle and end.
    let cases: [(&[usize], &[usize], &[&str]); 4] = [
        (&[], &[], &[]),
        (&[0, 1, 2, 30, 59], &[], &[]),
        (&[], &[0, 29, 59], &["a", "f/030a", "z"]),
        (
            &[3, 4, 5, 6, 7, 8, 9, 10],
            &[11, 40],
            &["f/000", "f/025 \"new\""],
        ),
    ];
    for (removed, changed, added) in cases {
        let mut next = c.clone();
        for &i in changed {
            next.outputs[i].size += 1000;
        }
        let mut kept = Vec::new();
        for (i, r) in next.outputs.drain(..).enumerate() {
            if !removed.contains(&i) {
                kept.push(r);
            }
        }
        next.outputs = kept;
        next.outputs.extend(added.iter().map(|p| record_at(p, 7)));
        next.sort();
        let mut out = Vec::new();
        let after = next.write_json_reusing(&mut out, Some(&texts)).unwrap();
        assert_eq!(out, next.to_json(), "{removed:?} {changed:?} {added:?}");
        // Formatted now: the changed and added records, nothing else.
        let formatted = after
            .texts
            .iter()
            .filter(|(_, s)| {
                let buffer = &after.buffers[s.buffer as usize];
                !texts.buffers.iter().any(|b| Arc::ptr_eq(b, buffer))
            })
            .count();
        let expected = changed.len() + added.len();
        assert_eq!(formatted, expected, "{removed:?} {changed:?} {added:?}");
    }
}

#[test]
fn texts_read_from_the_file_are_reused_and_never_outgrow_twice_the_records() {
    let mut c = Catalog::new(parse_time("2026-01-01T00:00:00Z").unwrap());
    c.outputs = (0..300)
        .map(|i| record_at(&format!("f/{i:04}"), i))
        .collect();
    let file = c.to_json();
    let (state, texts) = State::parse_with_texts(Arc::new(file.clone()));
    assert_eq!(state, State::Catalog(c.clone()));
    let mut texts = texts.expect("a catalog as written is read with its texts");
    assert_eq!(texts.len(), 300);
    assert_eq!(texts.buffers.len(), 1, "the file itself");
    // Round after round a third of the records change: every write
    // gives the bytes of a fresh one, and the buffers behind the texts
    // stay within twice the records' own text.
    for round in 1..=6u64 {
        for r in c.outputs.iter_mut().skip(round as usize % 3).step_by(3) {
            r.size += 1000 * round;
        }
        let mut out = Vec::new();
        let next = c.write_json_reusing(&mut out, Some(&texts)).unwrap();
        assert_eq!(out, c.to_json(), "round {round}");
        let live: usize = next.texts.iter().map(|(_, s)| s.len as usize).sum();
        let held = next.held_bytes() as usize;
        assert!(
            held <= 2 * live,
            "round {round}: {held} bytes held for {live}"
        );
        assert!(next.buffers.len() <= 3, "round {round}");
        texts = next;
    }
    // Unchanged, everything comes from the buffers as they are.
    let mut out = Vec::new();
    let same = c.write_json_reusing(&mut out, Some(&texts)).unwrap();
    assert_eq!(out, c.to_json());
    assert_eq!(same.buffers.len(), texts.buffers.len());
}

#[test]
fn overlay_reads_like_the_merged_catalog_and_merges_once() {
    let now = parse_time("2026-07-01T00:00:00Z").unwrap();
    let mut base = Catalog::new(parse_time("2026-01-01T00:00:00Z").unwrap());
    base.outputs = ["a/x", "a/y", "b", "c/z", "d"]
        .iter()
        .map(|p| record_at(p, 1))
        .collect();
    let mut overlay = Overlay::new(base.clone());
    // Reference: a plain map with each step applied in order.
    let mut reference: BTreeMap<String, OutputRecord> = base
        .outputs
        .iter()
        .map(|r| (r.path.as_str().to_owned(), r.clone()))
        .collect();
    let steps: [(&[&str], &[&str]); 4] = [
        (&["a/w", "b"], &[]),
        (&[], &["a/x", "c/z"]),
        (&["c/z", "e/f"], &["d"]),
        (&["0"], &["a/w"]),
    ];
    for (n, (upserts, removes)) in steps.iter().enumerate() {
        let size = n as u64 + 2;
        let upserts: Vec<OutputRecord> = upserts.iter().map(|p| record_at(p, size)).collect();
        let removes: Vec<String> = removes.iter().map(|p| p.to_string()).collect();
        overlay.record(&upserts, &removes);
        for p in &removes {
            reference.remove(p);
        }
        for r in upserts {
            reference.insert(r.path.as_str().to_owned(), r);
        }
        let merged: Vec<&OutputRecord> = reference.values().collect();
        let seen: Vec<&OutputRecord> = overlay.iter().collect();
        assert_eq!(seen, merged, "step {n}: iter");
        for key in [
            "", "0", "a", "a/", "a/x", "a/y", "b", "b/", "c/", "c/z", "d", "e", "f",
        ] {
            assert_eq!(
                overlay.get(key),
                reference.get(key),
                "step {n}: get {key:?}"
            );
            let first = reference
                .range::<str, _>((std::ops::Bound::Included(key), std::ops::Bound::Unbounded))
                .next()
                .map(|(_, r)| r);
            assert_eq!(
                overlay.first_from(key),
                first,
                "step {n}: first_from {key:?}"
            );
        }
    }
    assert_eq!(overlay.base(), &base);
    let merged = overlay.into_catalog(now);
    let expected: Vec<OutputRecord> = reference.into_values().collect();
    assert_eq!(merged.outputs, expected);
    assert_eq!(merged.updated_at, now);
    assert_eq!(merged.created_at, base.created_at);
}
