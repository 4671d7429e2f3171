#!/usr/bin/env bash
# Debian's chromium for the browser tests in tests/browser/ (Playwright drives it; it never downloads a browser).
#
#   bash scripts/install_chromium.sh    # what `make browser` runs
#
# Already there: checks that it starts headless. Missing and root with apt-get: installs it (apt-get update
# first, retried, waiting for a held dpkg lock). Missing otherwise: says how to install it; that is an error
# under CI=true, where the browser tests must run, and a note elsewhere, where they are skipped.
set -uo pipefail

CHROMIUM="${PPKIT_CHROMIUM:-/usr/bin/chromium}"
. "$(dirname "$0")/lib.sh"  # apt_install_or_skip

if [ ! -x "$CHROMIUM" ]; then
    apt_install_or_skip chromium "the browser tests (tests/browser)"
fi

# A browser that is installed but cannot start would only show up as a confusing test failure later.
profile="$(mktemp -d)"
trap 'rm -rf "$profile"' EXIT
if ! out="$(timeout 60 "$CHROMIUM" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync --user-data-dir="$profile" \
    --dump-dom 'data:text/html,<p>chromium-ok</p>' 2>&1)" || [[ "$out" != *chromium-ok* ]]; then
    echo "$CHROMIUM is installed but did not start headless:" >&2
    echo "$out" | tail -20 >&2
    exit 1
fi
echo "chromium ready: $("$CHROMIUM" --version 2>/dev/null | head -1)"
