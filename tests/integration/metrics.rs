//! `agent.metrics_file`: the agent writes Prometheus text that node_exporter's
//! textfile collector can read, with the counts an operator alerts on.

use crate::util::{Test, assert_catalog_matches_disk, metric};
use std::fs;

#[test]
fn agent_once_writes_metrics_in_the_prometheus_text_format() {
    let t = Test::new();
    t.config(
        "spool: ./spool
agent: {metrics_file: ./metrics.prom}
pipelines:
  - id: p
    destinations:
      - id: d
        path: ./root
",
    );
    let good = t.bundle("good", &[("a.txt", "twelve bytes")]);
    let bad = t.bundle("bad", &[("b.txt", "bbbb")]);
    fs::write(bad.join("b.txt"), "BBBB").unwrap();
    t.mkdir("spool/p/inbox");
    fs::rename(&good, t.join("spool/p/inbox/good")).unwrap();
    fs::rename(&bad, t.join("spool/p/inbox/bad")).unwrap();
    t.run(&["agent", "--once"]).expect_code(1);

    let text = fs::read_to_string(t.join("metrics.prom")).unwrap();
    for line in [
        "distributor_bundles_done_total{pipeline=\"p\"} 1",
        "distributor_bundles_failed_total{pipeline=\"p\"} 1",
        "distributor_published_bytes_total{pipeline=\"p\"} 12",
        "distributor_spool_bundles{pipeline=\"p\",spool=\"done\"} 1",
        "distributor_spool_bundles{pipeline=\"p\",spool=\"failed\"} 1",
        "distributor_spool_bundles{pipeline=\"p\",spool=\"inbox\"} 0",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in:\n{text}"
        );
    }
    assert!(text.contains(
        "distributor_destination_last_success_timestamp_seconds{pipeline=\"p\",destination=\"d\"} "
    ));
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (_, value) = line.rsplit_once(' ').unwrap();
        assert!(value.parse::<f64>().is_ok(), "bad sample line {line:?}");
    }
    let names: Vec<_> = fs::read_dir(t.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("metrics"))
        .collect();
    assert_eq!(names, ["metrics.prom"], "no temporary file left next to it");
}

/// The copy across file systems is the slow path of a small publication
/// (outputs are staged at the top of the root and renamed into their
/// folders): an ordinary root never takes it, for new or existing folders.
/// One pipeline `p` publishing to `./root` under `{source_id}/`, with its
/// metrics in `./metrics.prom`.
const PREFIXED: &str = "spool: ./spool
agent: {settle: 0s, metrics_file: ./metrics.prom}
pipelines:
  - id: p
    destinations:
      - id: d
        path: ./root
        prefix: \"{source_id}/\"
";

/// Makes the bundle `name` of `files` and drops it into `p`'s inbox.
fn drop_bundle(t: &Test, name: &str, files: &[(&str, &str)]) {
    let b = t.bundle(name, files);
    fs::rename(&b, t.join(&format!("spool/p/inbox/{name}"))).unwrap();
}

#[test]
fn nested_bundles_in_an_ordinary_root_are_renamed_into_place_never_copied() {
    let t = Test::new();
    t.config(PREFIXED);
    t.mkdir("spool/p/inbox");
    for (i, name) in ["first", "second", "third"].iter().enumerate() {
        // One bundle per run: each is a single publication, not a batch.
        let report = format!("# report {i}\n");
        drop_bundle(
            &t,
            name,
            &[
                ("r/2026/report.md", report.as_str()),
                ("r/2026/page.html", "<p>page</p>\n"),
                ("r/data.bin", "data"),
            ],
        );
        let out = t.once();
        out.expect_code(0);
        assert!(
            !out.stderr.contains("another file system"),
            "{}",
            out.stderr
        );
        assert_eq!(metric(&t, "cross_device_copies_total"), "0");
        assert_eq!(
            fs::read_to_string(t.join(&format!("root/{name}/r/2026/report.md"))).unwrap(),
            report
        );
    }
    assert_catalog_matches_disk(&t.join("root"));
}

/// A small publication is made durable by one barrier of the file system
/// (`syncfs`) unless the machine has much else waiting to be written back,
/// which a barrier would wait for too; then it fsyncs its files and folders
/// one by one, says so at debug level and counts it. A large one (here a
/// batch of 18 outputs) always uses barriers. The debug build takes what
/// waits to be written from `DISTRIBUTOR_TEST_UNWRITTEN`.
#[test]
fn small_publications_fsync_file_by_file_only_while_much_else_waits_to_be_written() {
    let busy = "18446744073709551615";
    // (what waits to be written, bundles dropped at once, file-by-file count)
    for (unwritten, bundles, counted) in [("0", 1, "0"), (busy, 1, "1"), (busy, 6, "0")] {
        let t = Test::new();
        t.config(PREFIXED);
        // The root has a catalog already, so that the agent's bundles are
        // published (alone or in a batch) into it as they are.
        let first = t.bundle("first", &[("x.txt", "x")]);
        t.publish("p", &first, &[]).expect_code(0);
        t.mkdir("spool/p/inbox");
        for i in 0..bundles {
            drop_bundle(
                &t,
                &format!("b{i}"),
                &[
                    ("r/report.md", "# r\n"),
                    ("r/page.html", "<p>p</p>\n"),
                    ("data.bin", "d"),
                ],
            );
        }
        let out = t
            .agent_cmd()
            .env("RUST_LOG", "distributor=debug")
            .env("DISTRIBUTOR_TEST_UNWRITTEN", unwritten)
            .args(["agent", "--once"])
            .output();
        out.expect_code(0);
        let what = format!("{unwritten} waiting, {bundles} bundles");
        assert_eq!(metric(&t, "file_by_file_syncs_total"), counted, "{what}");
        assert_eq!(
            out.stderr
                .contains("fsyncing the publication's files one by one"),
            counted != "0",
            "{what}: {}",
            out.stderr
        );
        assert_eq!(t.recorded("root").len(), 1 + 3 * bundles, "{what}");
        assert_catalog_matches_disk(&t.join("root"));
    }
}
