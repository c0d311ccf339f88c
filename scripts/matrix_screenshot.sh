#!/usr/bin/env bash
# Screenshot of a self-contained HTML page (the conformance matrix) by a real headless browser.
#
#   scripts/matrix_screenshot.sh DIR/matrix.html docs/matrix-html.png [WIDTH,HEIGHT]
#
# Uses Debian's chromium (apt-get install -y chromium fonts-wqy-zenhei: the font draws the spec's
# Chinese sentences). The page fetches nothing, and the browser is
# kept off the network (no background networking, component updates or sync), so the picture is the
# file alone. --no-sandbox because CI containers run as root; a throwaway profile directory, removed
# afterwards. The window size is the picture's (default 1400,1800).
set -euo pipefail
if [ $# -lt 2 ]; then
    echo "usage: $0 PAGE.html OUT.png [WIDTH,HEIGHT]" >&2
    exit 2
fi
page=$(realpath "$1")
out=$(realpath -m "$2")
size=${3:-1400,1800}
[ -f "$page" ] || { echo "$0: no such page: $1" >&2; exit 2; }
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
[ -n "$browser" ] || { echo "$0: no chromium found (apt-get install -y chromium)" >&2; exit 3; }
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
mkdir -p "$(dirname "$out")"
rm -f "$out"
"$browser" --headless --no-sandbox --disable-gpu --disable-background-networking --disable-component-update \
    --disable-sync --no-first-run --hide-scrollbars --user-data-dir="$profile" \
    --screenshot="$out" --window-size="$size" "file://$page" >/dev/null 2>&1 || true
[ -s "$out" ] || { echo "$0: $browser wrote no screenshot" >&2; exit 1; }
echo "screenshot written: $out ($size)"
