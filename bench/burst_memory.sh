#!/usr/bin/env bash
# The memory a burst of markdown bundles takes: for each COUNT (default 10,
# 100 and 1024), that many bundles of one markdown file of SIZE KiB each
# (default 280), rendered to pages (publish.html), are renamed into the
# inbox and published by `distributor agent --once`, which gathers them into
# batches. Prints each run's peak RSS (/usr/bin/time) and the batches the
# log names. A batch holds the pages it renders until it commits; the
# batch's budget (docs/performance.md, "Bursts") bounds what it holds
# together, whatever the count.
#
# Usage: [SIZE=KiB] bench/burst_memory.sh [COUNT...] (binary:
# target/release/distributor, or $BIN)
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${BIN:-target/release/distributor}"
[ -x "$bin" ] || cargo build --release --quiet --bin distributor
bin="$(realpath "$bin")"
size_kib="${SIZE:-280}"
counts=("$@")
[ "${#counts[@]}" -gt 0 ] || counts=(10 100 1024)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# One sealed template bundle: a long document of ordinary prose, lists and
# tables (about SIZE KiB), copied for every bundle of a run.
mkdir -p "$work/template"
python3 - "$work/template/report.md" "$size_kib" <<'PY'
import sys
path, kib = sys.argv[1], int(sys.argv[2])
parts = ["# Weekly report\n\n"]
i = 0
while sum(map(len, parts)) < kib * 1024:
    parts.append(f"## Section {i}\n\nSome *text* with a [link](https://example.com/{i}) and `code`.\n\n- one\n- two\n\n| a | b |\n|---|---|\n| {i} | x |\n\n")
    i += 1
open(path, "w").write("".join(parts))
PY

printf 'count\tpeak_rss_mib\tbatches\tseconds\n'
for count in "${counts[@]}"; do
  run="$work/run-$count"
  mkdir -p "$run/spool/p/inbox" "$run/staging"
  cat >"$run/config.yaml" <<'YAML'
spool: ./spool
agent: {settle: 0s}
pipelines:
  - id: p
    destinations:
      - id: d
        path: ./www
        publish: {source: false, html: true}
YAML
  # A root with a catalog first, so that the burst goes in batches.
  cp -r "$work/template" "$run/staging/seed"
  "$bin" bundle seal "$run/staging/seed" --id seed >/dev/null
  mv "$run/staging/seed" "$run/spool/p/inbox/seed"
  (cd "$run" && "$bin" --config config.yaml agent --once 2>/dev/null)
  for i in $(seq -w 1 "$count"); do
    cp -r "$work/template" "$run/staging/b$i"
    "$bin" bundle seal "$run/staging/b$i" --id "b$i" >/dev/null
  done
  for i in $(seq -w 1 "$count"); do mv "$run/staging/b$i" "$run/spool/p/inbox/b$i"; done
  start=$(date +%s.%N)
  (cd "$run" && RUST_LOG=info /usr/bin/time -f '%M' -o "$run/rss" "$bin" --config config.yaml agent --once 2>"$run/log")
  end=$(date +%s.%N)
  rss_kib=$(tail -n 1 "$run/rss")
  batches=$(grep -o 'published a batch of [0-9]*' "$run/log" | awk '{print $5}' | paste -sd+ -)
  printf '%s\t%s\t%s\t%.1f\n' "$count" "$((rss_kib / 1024))" "${batches:-none}" "$(echo "$end - $start" | bc)"
  rm -rf "$run"
done
