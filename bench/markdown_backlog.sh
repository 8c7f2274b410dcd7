#!/usr/bin/env bash
# What rendering each markdown file in its own child process costs on a
# backlog: COUNT bundles (default 2000) of one small .md file each, published
# by `distributor agent --once` (publish.html on, source copy on), timed.
#
# Usage: bench/markdown_backlog.sh [COUNT] [BINARY...] (default binary:
# target/release/distributor). Given several binaries, each publishes the
# same bundles in turn, ROUNDS times (default 2), so that their times come
# from the same run.
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

# The bundles, sealed once.
mkdir -p "$work/bundles"
python3 - "$work/bundles" "$count" <<'PY'
import sys, os, hashlib, json
root, count = sys.argv[1], int(sys.argv[2])
for i in range(count):
    d = os.path.join(root, f"b-{i:05}")
    os.makedirs(d)
    text = f"# Report {i}\n\nSome *text* with a [link](https://example.com/{i}).\n\n| a | b |\n|---|---|\n| {i} | x |\n".encode()
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

printf '%-40s %6s %9s %12s\n' binary round seconds ms/bundle
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
    [ "$done_count" -eq "$count" ] || { echo "$bin: $done_count of $count done" >&2; exit 1; }
    pages=$(find "$work/www" -name '*.html' | wc -l)
    [ "$pages" -eq "$count" ] || { echo "$bin: $pages pages of $count" >&2; exit 1; }
    python3 -c "import sys; s=$end-$start; print(f'{sys.argv[1]:<40} {sys.argv[2]:>6} {s:9.2f} {s*1000/$count:12.2f}')" "$bin" "$round"
  done
done
