#!/usr/bin/env bash
# What rendering markdown in child processes costs: COUNT small .md files
# (default 2000) published by `distributor agent --once` (publish.html on,
# source copy on), timed. SHAPE=backlog (the default): COUNT bundles of one
# file each; SHAPE=bundle: one bundle of COUNT files. RAW=1 opens each page
# with the raw HTML a README has (a centred div with an image and a title, a
# comment), which `raw_html: sanitize` (the default) sanitizes.
#
# Usage: [SHAPE=bundle] [ROUNDS=N] bench/markdown_backlog.sh [COUNT]
# [BINARY...] (default binary: target/release/distributor). Given several
# binaries, each publishes the same bundles in turn, ROUNDS times (default
# 2), so that their times come from the same run; the last lines give each
# binary's median.
set -euo pipefail
cd "$(dirname "$0")/.."
count="${1:-2000}"
shift || true
bins=("$@")
if [ "${#bins[@]}" -eq 0 ]; then
  bins=(target/release/distributor)
  [ -x "${bins[0]}" ] || cargo build --release --quiet
fi
for i in "${!bins[@]}"; do bins[$i]="$(realpath "${bins[$i]}")"; done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

shape="${SHAPE:-backlog}"
case "$shape" in
  backlog) bundles="$count" ;;
  bundle) bundles=1 ;;
  *) echo "SHAPE is backlog or bundle, not $shape" >&2; exit 2 ;;
esac

# The bundles, sealed once.
mkdir -p "$work/bundles"
python3 - "$work/bundles" "$count" "$shape" "${RAW:-0}" <<'PY'
import sys, os
root, count, shape, raw = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
for i in range(count):
    d = os.path.join(root, f"b-{i:05}" if shape == "backlog" else "b-00000")
    os.makedirs(d, exist_ok=True)
    text = f"# Report {i}\n\nSome *text* with a [link](https://example.com/{i}).\n\n| a | b |\n|---|---|\n| {i} | x |\n"
    if raw:
        text = f"<!-- generated -->\n<div align=\"center\">\n  <img src=\"logo.png\" alt=\"Logo\" width=\"120\">\n  <h1>Report {i}</h1>\n</div>\n\n" + text
    text = text.encode()
    with open(os.path.join(d, f"page-{i}.md"), "wb") as f:
        f.write(text)
PY
for d in "$work"/bundles/*; do
  "${bins[0]}" bundle seal "$d" --id "$(basename "$d")" >/dev/null
done

cat >"$work/config.yaml" <<'YAML'
spool: ./spool
pipelines:
  - id: p
    destinations:
      - id: d
        path: ./www
        workflow: additive
        publish: {source: true, html: true}
YAML

printf '%-40s %6s %9s %12s\n' binary round seconds ms/file
for round in $(seq "${ROUNDS:-2}"); do
  for bin in "${bins[@]}"; do
    rm -rf "$work/spool" "$work/www"
    mkdir -p "$work/spool/p"
    cp -a "$work/bundles" "$work/spool/p/inbox"
    start=$(date +%s.%N)
    (cd "$work" && "$bin" --config config.yaml agent --once >/dev/null 2>"$work/err.txt") \
      || { echo "$bin failed: $(tail -n 3 "$work/err.txt")" >&2; exit 1; }
    end=$(date +%s.%N)
    done_count=$(find "$work/spool/p/done" -mindepth 1 -maxdepth 1 | wc -l)
    [ "$done_count" -eq "$bundles" ] || { echo "$bin: $done_count of $bundles done" >&2; exit 1; }
    pages=$(find "$work/www" -name '*.html' | wc -l)
    [ "$pages" -eq "$count" ] || { echo "$bin: $pages pages of $count" >&2; exit 1; }
    python3 -c "import sys; s=$end-$start; print(f'{sys.argv[1]:<40} {sys.argv[2]:>6} {s:9.2f} {s*1000/$count:12.2f}')" "$bin" "$round" \
      | tee -a "$work/times.txt"
  done
done
echo "medians ($shape of $count files, ${ROUNDS:-2} rounds):"
python3 - "$work/times.txt" "$count" <<'PY'
import sys, statistics
times = {}
for line in open(sys.argv[1]):
    bin, _, seconds, _ = line.split()
    times.setdefault(bin, []).append(float(seconds))
for bin, s in times.items():
    m = statistics.median(s)
    print(f"{bin:<40} median {m:7.2f} s  {m*1000/int(sys.argv[2]):7.2f} ms/file")
PY
