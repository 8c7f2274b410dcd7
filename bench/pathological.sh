#!/usr/bin/env bash
# Time and peak memory of rendering each input of cmark-gfm's pathological
# suite (tests/data/cmark-gfm/pathological_tests.py) at its size (1x) and
# at 4 times it (4x), to show that both grow linearly (docs/rendering.md).
#
# For each input and size it writes a bundle holding the one .md file,
# seals it and publishes it with `distributor run` (publish.html on, source
# copy off, raw_html: sanitize, the default) under /usr/bin/time -v:
# the run's wall-clock time and its peak resident set size (of the run or
# of its rendering child, whichever is larger), and how much each grew
# from 1x to 4x (the peak over that of a run of an empty page, the base).
# limits.max_markdown_bytes is 64 MiB, so that no run is refused: with the
# default 4 MiB, nested_strong_emph at 4x (3.6 MB) needs more than a
# rendering may take (128 MiB) and is refused; backticks at 1x (12 MB) is
# over the default limit itself.
# The 4x of an input whose size grows with the square of its count
# (nested lists, backticks) doubles the count; a fixed one (hard link/emph,
# U+0000) is repeated 4 times.
#
# Usage: bench/pathological.sh. Uses target/release/distributor, building
# it when missing; set DISTRIBUTOR to measure another binary.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${DISTRIBUTOR:-target/release/distributor}"
if [ ! -x "$bin" ]; then
  cargo build --release --quiet
fi
bin="$(realpath "$bin")"
command -v /usr/bin/time >/dev/null || { echo "needs /usr/bin/time (apt-get install time)" >&2; exit 2; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# Writes the inputs at scale $2 into folder $1, one NAME.md each.
make_inputs() {
  python3 - "$1" "$2" <<'PY'
import itertools, os, sys
out, s = sys.argv[1], int(sys.argv[2])
q = 2 if s == 4 else 1  # for inputs whose size grows with the square
def hash_collisions(count):
    def bad(ref):
        h = 0
        for c in ref:
            h = (ord(c) + ((h << 6) & 0xFFFFFFFF) + ((h << 16) & 0xFFFFFFFF) - h) & 0xFFFFFFFF
        return h % 16 == 0
    keys = (k for k in ("x%d" % i for i in itertools.count()) if bad(k))
    bad_key = next(keys)
    return "".join("[%s]: /url\n\n[%s]\n\n" % (k, bad_key) for k in itertools.islice(keys, count - 1))
inputs = {
    "nested_strong_emph": "*a **a " * 65000 * s + "b" + " a** a*" * 65000 * s,
    "emph_closers": "a_ " * 65000 * s,
    "emph_openers": "_a " * 65000 * s,
    "link_closers": "a]" * 65000 * s,
    "link_openers": "[a" * 65000 * s,
    "mismatched": "*a_ " * 50000 * s,
    "multiple_of_3": "a**b" + "c* " * 50000 * s,
    "link_openers_emph_closers": "[ a_" * 50000 * s,
    "pattern": "[ (](" * 80000 * s,
    "hard_link_emph": "**x [a*b**c*](d)" if s == 1 else "**x [a*b**c*](d)\n\n" * s,
    "nested_brackets": "[" * 50000 * s + "a" + "]" * 50000 * s,
    "nested_quotes": "> " * 50000 * s + "a",
    "nested_lists": "".join("  " * x + "* a\n" for x in range(1000 * q)),
    "nul": "abc\0de\0" if s == 1 else "abc\0de\0\n\n" * s,
    "backticks": "".join("e" + "`" * x for x in range(1, 5000 * q)),
    "unclosed_links_a": "[a](<b" * 30000 * s,
    "unclosed_links_b": "[a](b" * 30000 * s,
    "tables": "aaa\rbbb\n-\v\n" * 30000 * s,
    "reference_collisions": hash_collisions(50000 * s),
}
for name, text in inputs.items():
    with open(os.path.join(out, name + ".md"), "w", newline="") as f:
        f.write(text)
PY
}

# Publishes $1 (a markdown file) as page.md and prints the run's peak
# resident set size in KiB and its wall-clock seconds.
measure() {
  local run="$work/run"
  rm -rf "$run"
  mkdir -p "$run/b"
  cp "$1" "$run/b/page.md"
  cat >"$run/config.yaml" <<YAML
spool: ./spool
limits:
  max_markdown_bytes: 64MiB
pipelines:
  - id: p
    destinations:
      - id: d
        path: ./www
        publish: {source: false, html: true}
YAML
  "$bin" bundle seal "$run/b" --id bench >/dev/null
  if ! (cd "$run" && /usr/bin/time -f '%M %e' -o time.txt "$bin" --config config.yaml run --pipeline p b >err.txt 2>&1); then
    echo "rendering $1 failed: $(head -c 300 "$run/err.txt")" >&2
    exit 1
  fi
  tail -n 1 "$run/time.txt"
}

for scale in 1 4; do
  mkdir -p "$work/in$scale"
  make_inputs "$work/in$scale" "$scale"
done
: >"$work/empty.md"
read -r base_kib _ < <(measure "$work/empty.md")

echo "base (an empty page): $((base_kib / 1024)) MiB"
printf '%-26s %10s %6s %7s %10s %6s %7s %7s %7s\n' input bytes_1x s_1x MiB_1x bytes_4x s_4x MiB_4x time_4x mem_4x
for input in "$work"/in1/*.md; do
  name=$(basename "$input" .md)
  read -r kib1 s1 < <(measure "$input")
  read -r kib4 s4 < <(measure "$work/in4/$name.md")
  python3 - "$name" "$(stat -c %s "$input")" "$s1" "$kib1" "$(stat -c %s "$work/in4/$name.md")" "$s4" "$kib4" "$base_kib" <<'PY'
import sys
name, b1, s1, k1, b4, s4, k4, base = sys.argv[1], *map(float, sys.argv[2:])
# Growth is shown where the 1x figure is above the noise: a run takes
# 20 ms or so whatever it renders, and a page of a few bytes the base.
grow = lambda a, b, floor: f"{b / a:.1f}x" if a >= floor else "-"
print(f"{name:<26} {int(b1):>10} {s1:>6.2f} {k1 / 1024:>7.0f} {int(b4):>10} {s4:>6.2f} {k4 / 1024:>7.0f}"
      f" {grow(s1, s4, 0.03):>7} {grow(k1 - base, k4 - base, 2048):>7}")
PY
done
