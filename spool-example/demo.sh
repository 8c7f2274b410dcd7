#!/usr/bin/env bash
# The example in one command: seeds the inbox from the tracked sample
# bundles the way a producer should (copy to a dot-folder, then rename into
# the inbox), runs the agent once over them, and shows what it published
# and what it refused. Everything it writes lands in spool-example/var/.
set -euo pipefail
cd "$(dirname "$0")/.."
# The first build on a fresh clone takes a few minutes: cargo shows its
# progress (on stderr), so nobody waits on a silent terminal.
echo "building distributor (cargo build; the first time takes a few minutes)..." >&2
cargo build
bin=target/debug/distributor
config=spool-example/config.yaml
var=spool-example/var

rm -rf "$var"
drop() { # PIPELINE BUNDLE
  local to=$var/spool/$1/inbox
  mkdir -p "$to"
  cp -R "spool-example/bundles/$2" "$to/.$2"
  mv "$to/.$2" "$to/$2"
}
for bundle in weekly-2026-06-01 weekly-2026-06-08 broken-tampered; do
  drop reports "$bundle"
done
drop status status-2026-06-09

echo "== distributor agent --once"
status=0
"$bin" --config "$config" agent --once || status=$?

echo
echo "== published files"
(cd "$var/www" && find . -type f ! -name '.distributor.lock' | sort)
echo
echo "== status"
"$bin" --config "$config" status

# The example is meant to end with three bundles published (two reports and
# one status page) and one refused (the tampered report).
expect() { [ -e "$1" ] || { echo "demo: expected $1 to exist" >&2; exit 1; }; }
expect "$var/www/archive/2026-06-01/report.html"
expect "$var/www/archive/2026-06-08/report.html"
expect "$var/www/latest/report.html"
expect "$var/www/status/index.html"
expect "$var/spool/reports/failed/broken-tampered/.distributor-result.json"
if [ -e "$var/www/latest/details.html" ]; then
  echo "demo: the replacement destination should have dropped details.html" >&2
  exit 1
fi
[ "$status" -eq 1 ] || { echo "demo: agent --once should exit 1 (one bundle failed), got $status" >&2; exit 1; }
echo
echo "demo ok: three bundles published, the tampered one is in failed/ (agent exit status 1 is expected)"
