#!/usr/bin/env bash
# Produces a bundle the way a producer should: build it in a dot-folder
# inside the inbox (ignored by the agent), seal it (manifest.json written
# last, atomically), then rename the finished folder into place.
#
#   spool-example/produce.sh [PIPELINE] [TEXT]
#
# PIPELINE defaults to "status"; TEXT becomes the page's body. Works with a
# running agent (`cargo run -- --config spool-example/config.yaml agent`)
# or before `agent --once`.
set -euo pipefail
cd "$(dirname "$0")/.."
pipeline=${1:-status}
text=${2:-"Status checked at $(date -u +%Y-%m-%dT%H:%M:%SZ)."}
bin=target/debug/distributor
[ -x "$bin" ] || cargo build --quiet
inbox=spool-example/var/spool/$pipeline/inbox
mkdir -p "$inbox"
name="$pipeline-$(date -u +%Y%m%dT%H%M%S)-$$"
staging="$inbox/.$name"
mkdir "$staging"
printf '# %s\n\n%s\n' "$pipeline" "$text" > "$staging/index.md"
"$bin" bundle seal "$staging" --id "$name"
mv "$staging" "$inbox/$name"
echo "dropped $inbox/$name"
