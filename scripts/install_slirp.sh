#!/usr/bin/env bash
# Debian's slirp4netns: the way out of the private network that a shared machine's ranks run in (downloads, hubs,
# loggers), which lets nothing in (ppkit/transport/private_net.py, docs/isolation.md). tests/test_rank_network.py
# fetches through it; the hub and isolation tests run learners whose ranks use it.
#
#   bash scripts/install_slirp.sh    # what `make hub` runs too
#
# Already there: says which version. Missing and root with apt-get: installs it (apt-get update first, retried,
# waiting for a held dpkg lock). Missing otherwise: says how to install it; that is an error under CI=true, where
# the test of a rank's way out must run, and a note elsewhere, where it is skipped.
set -uo pipefail

. "$(dirname "$0")/lib.sh"  # apt_install_or_skip

if ! command -v slirp4netns >/dev/null; then
    apt_install_or_skip slirp4netns "the tests of a private network's way out (tests/test_rank_network.py)"
fi
echo "slirp4netns ready: $(slirp4netns --version | head -1)"
