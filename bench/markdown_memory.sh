#!/usr/bin/env bash
# Peak memory of rendering one big markdown file, for several shapes.
#
# For each shape it writes a bundle holding one .md file of about SIZE_MIB
# MiB, seals it, and runs `distributor run` (publish.html on, source copy
# off) under /usr/bin/time -v. It prints the peak resident set size and its
# ratio to the markdown size, and the rendering speed (input over the
# wall-clock time of the whole run, so a lower bound). limits.max_markdown_bytes
# is SIZE_MIB MiB, so a rendering may take 32 x that (docs/contract.md
# §12.3); the ratio includes the process's fixed base (a few MiB), so it
# reads a little high for small inputs. A file that needs more memory to
# render is refused (the bundle fails): `refused` and the peak of the
# refusing run.
#
# Usage: bench/markdown_memory.sh [SIZE_MIB] (default 4, the default
# limits.max_markdown_bytes; a bigger file needs that limit raised). Uses
# target/release/distributor, building it when missing; set DISTRIBUTOR to
# measure another binary.
set -euo pipefail
cd "$(dirname "$0")/.."
size_mib="${1:-4}"
bin="${DISTRIBUTOR:-target/release/distributor}"
if [ ! -x "$bin" ]; then
  cargo build --release --quiet
fi
command -v /usr/bin/time >/dev/null || { echo "needs /usr/bin/time (apt-get install time)" >&2; exit 2; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

cat >"$work/config.yaml" <<YAML
spool: ./spool
pipelines:
  - id: p
    destinations:
      - id: d
        path: ./www
        workflow: replacement
        publish: {source: false, html: true}
limits:
  max_markdown_bytes: ${size_mib}MiB
YAML

# Writes one shape of about size_mib MiB to $1.
make_markdown() {
  python3 - "$1" "$2" "$size_mib" <<'PY'
import sys
shape, out, mib = sys.argv[1], sys.argv[2], int(sys.argv[3])
# Just under the size, so that 4 stays within limits.max_markdown_bytes.
target = mib * 1024 * 1024 - 256
parts, total, i = [], 0, 0
def add(s):
    global total
    parts.append(s)
    total += len(s)
# Shapes made of a head and one piece repeated: name -> (head, piece).
REPEATED = {
    "dense_table": ("|a|b|c|d|e|f|g|h|\n|-|-|-|-|-|-|-|-|\n", "|1|2|3|4|5|6|7|8|\n"),
    "emphasis": ("", "*a* _b_ "),
    "emphasis_lines": ("", "*a* **b** _c_\n"),
    "code_spans": ("", "`a` `b` "),
    "links": ("", "[a](b) "),
    "inline_html": ("", "<b>a</b> "),
    "escapes": ("", "\\*a\\_ "),
    "strike": ("", "~~a~~ "),
    "short_lines": ("", "a\n"),
    "quotes": ("", "> a\n"),
    "entities": ("", "&amp; "),
    "dense_list": ("", "- *a* _b_\n"),
    "dense_quote": ("", "> *a* _b_\n"),
    "dense_headings": ("", "# *a* _b_\n"),
    "long_word": ("", "a_b*c"),
    "empty_headings": ("", "#\n"),
    "tasks": ("", "- [ ] a\n- [x] b\n"),
    "autolinks": ("", "<http://a> "),
    "hard_breaks": ("", "a  \n"),
    "setext": ("", "a\n-\n"),
    "thematic": ("", "***\n"),
    "empty_items": ("", "-\n"),
    "ordered_items": ("", "1.\n"),
    "html_blocks": ("", "<div>\n\n"),
    "table_inline": ("|a|b|c|\n|-|-|-|\n", "|*a*|`b`|[c](d)|\n"),
    "setext_empty": ("", "a\n=\n\n"),
    "digit_lines": ("", "1a\n"),
    "pipe_lines": ("", "|a|\n"),
    "punct_lines": ("", ".\n"),
    "short_rows": ("|a|b|c|\n|-|-|-|\n", "|a|\n"),
    "brackets": ("", "[a] "),
    "bracket_lines": ("", "[a]\n"),
    "stars": ("", "a* "),
    "star_lines": ("", "a*\n"),
    "tags": ("", "<a>"),
    "loose_backtick": ("`", "*a* _b_ "),
    # Crafted: something left open at the paragraph's start that nothing
    # after it can end (cut), or no place to cut at all (refused, see
    # docs/performance.md).
    "open_bracket": ("[x]: /u\n\n[", "*a* _b_ "),
    "open_title": ("[a](x \"", "*a* _b_ "),
    "open_tag": ("<a x=\"", "*a* _b_ "),
    "open_star": ("*a ", "a* "),
    "star_word": ("", "a*"),
}
# Crafted: left open at the paragraph's start, closed at its end, so that
# no stretch between may be cut: refused.
CLOSED = {
    "closed_bracket": ("[x]: /u\n\n[", "]\n"),
    "closed_title": ("[a](x \"", "\")\n"),
    "closed_tag": ("<a x=\"", "\">\n"),
}
if shape in CLOSED:
    head, tail = CLOSED[shape]
    add(head)
    while total < target - len(tail):
        add("*a* _b_ ")
    add(tail)
elif shape in REPEATED:
    head, piece = REPEATED[shape]
    add(head)
    while total < target:
        add(piece)
elif shape == "table":
    add("| a | b | c | d |\n|---|---|---|---|\n")
    while total < target:
        add(f"| {i} | x | y | z |\n"); i += 1
elif shape == "wide_row":
    add("|a|b|\n|-|-|\n")
    while total < target - 2:
        add("|1")
    add("|\n")
elif shape == "footnote_refs":
    while total < target - 20:
        add("[^1] ")
    add("\n\n[^1]: note\n")
elif shape == "prose":
    while total < target:
        add(f"Word {i} and more words, some_snake_case, (parens) and \"quotes\"; ")
        i += 1
elif shape == "paragraphs":
    while total < target:
        add(f"Paragraph {i} with *some* emphasis, `code`, a [link](https://example.com/{i}) and plain words that go on for a while.\n\n"); i += 1
elif shape == "headings":
    while total < target:
        add(f"## Heading {i % 1000}\n\ntext\n\n"); i += 1
elif shape == "lists":
    while total < target:
        depth = i % 8
        add("  " * depth + f"- item {i}\n"); i += 1
elif shape == "urls":
    while total < target:
        add(f"see https://example.com/page/{i}, and http://x.example/{i}.\n"); i += 1
elif shape == "refdefs":
    while total < target - 40:
        add(f"[r{i}]: /x{i}\n"); i += 1
    add("\n[r1] [r2]\n")
elif shape == "footnote_defs":
    while total < target:
        add(f"[^n{i}] [^n{i}]: note\n\n"); i += 1
elif shape == "chain":
    # Sections that, put back into the main document one round after
    # another, each close the HTML block the one before opened and open the
    # next, which swallows the next section's place; then dense emphasis.
    blocks = [("<!--", "-->"), ("<?", "?>"), ("<![CDATA[", "]]>"), ("<pre>", "</pre>"),
              ("<script>", "</script>"), ("<style>", "</style>"), ("<textarea>", "</textarea>")]
    half = "# a *b* _c_\n" * 660
    add(blocks[0][0] + "\n")
    for k, (_, close) in enumerate(blocks):
        if k + 1 < len(blocks):
            add(half + "```\n" + close + "\n" + blocks[k + 1][0] + "\n```\n" + half)
        else:
            add(half + half)
        add(close + "\n")
    add("\n")
    while total < target:
        add("*a* _b_ ")
elif shape == "nested_quotes":
    while total < target:
        add(">" * (1 + i % 30) + " a\n"); i += 1
else:
    sys.exit(f"unknown shape {shape}")
open(out, "w").write("".join(parts))
PY
}

printf '%-15s %9s %9s %6s %7s\n' shape input_MiB peak_MiB ratio MB/s
shapes="${SHAPES:-table dense_table paragraphs prose emphasis emphasis_lines code_spans links inline_html escapes strike entities short_lines quotes dense_list dense_quote dense_headings wide_row long_word empty_headings footnote_refs headings lists urls refdefs footnote_defs nested_quotes tasks autolinks hard_breaks setext thematic empty_items ordered_items html_blocks table_inline digit_lines punct_lines pipe_lines short_rows setext_empty brackets bracket_lines stars star_lines tags loose_backtick open_star chain open_bracket open_title open_tag closed_bracket closed_title closed_tag star_word}"
for shape in $shapes; do
  bundle="$work/b-$shape"
  rm -rf "$bundle" "$work/www"
  mkdir -p "$bundle"
  make_markdown "$shape" "$bundle/page.md"
  "$bin" bundle seal "$bundle" --id "bench-$shape" >/dev/null
  input=$(stat -c %s "$bundle/page.md")
  status=0
  /usr/bin/time -f '%M %e' -o "$work/time.txt" \
    "$bin" --config "$work/config.yaml" run --pipeline p "$bundle" >"$work/err.txt" 2>&1 || status=$?
  read -r peak_kib seconds < <(tail -n 1 "$work/time.txt")
  if [ "$status" -ne 0 ]; then
    # Refused for memory (the run fails the bundle), or another failure.
    if grep -q "needs more memory" "$work/err.txt"; then
      printf '%-15s %9s %9s %6s\n' "$shape" "$(python3 -c "print(f'{$input/2**20:.1f}')")" \
        "$(python3 -c "print(f'{$peak_kib/1024:.1f}')")" refused
    else
      printf '%-15s failed (exit %s): %s\n' "$shape" "$status" "$(head -c 300 "$work/err.txt")"
    fi
    continue
  fi
  python3 -c "import sys; i=$input; p=$peak_kib*1024; s=max($seconds, 0.01); print(f'{sys.argv[1]:<15} {i/2**20:9.1f} {p/2**20:9.1f} {p/i:6.1f} {i/1e6/s:7.1f}')" "$shape"
done
