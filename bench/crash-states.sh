#!/usr/bin/env bash
# The full crash-state exploration (docs/reliability.md, "Crash states"):
# every scenario of tests/integration/crash_states with the bounds that
# `cargo test` samples lifted. Each scenario's command is recorded with
# strace, every crash state the model allows within the full bounds is
# written back into its test folder, the restart is run on it twice and
# the invariants are checked. Prints one line per scenario (operations,
# crash points, states enumerated, distinct, checked, violations,
# seconds) and the totals; exits 1 on any violation.
#
# Usage: bench/crash-states.sh [NAME] (NAME: part of a scenario's test
# name, e.g. agent_once). THREADS (default 2) scenarios run at once;
# DISTRIBUTOR_CRASH_STATES=count counts the states without checking them.
# Uses the debug build, as the tests do (it has the crash points).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v strace >/dev/null || { echo "needs strace (scripts/install-test-deps installs it)" >&2; exit 2; }
log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$(date +%s)
status=0
DISTRIBUTOR_CRASH_STATES="${DISTRIBUTOR_CRASH_STATES:-full}" \
  cargo test --quiet --test integration "crash_states::scenarios::${1:-}" -- \
  --test-threads="${THREADS:-2}" --nocapture >"$log" 2>&1 || status=$?
grep -oE "crash-states [a-z0-9-]+: .*" "$log" | sort || true
awk '/crash-states [a-z0-9-]+: / {
  for (i = 1; i <= NF; i++) {
    if ($(i + 1) ~ /^distinct/) d += $i
    if ($(i + 1) ~ /^checked/) c += $i
    if ($(i + 1) ~ /^violations/) v += $i
  }
  n++
} END { printf "total: %d scenarios, %d distinct states, %d checked, %d violations", n, d, c, v }' "$log"
echo ", $(($(date +%s) - start)) s"
if [ "$status" -ne 0 ]; then
  grep -E -A 12 'break an invariant|panicked' "$log" | head -60 >&2
  exit 1
fi
