#!/usr/bin/env bash
# Debian's SLURM and munge for the SLURM tests: tests/slurm_testbed.py starts its own munged, slurmctld and two
# slurmd in a temporary directory (never the system's daemons, which this script does not start either).
#
#   bash scripts/install_slurm.sh    # what `make slurm` runs
#
# Already there: says which version. Missing and root with apt-get: installs slurmctld, slurmd, slurm-client and
# munge (apt-get update first, retried, waiting for a held dpkg lock). Missing otherwise: says how to install them;
# that is an error under CI=true, where the SLURM tests must run, and a note elsewhere, where they are skipped.
set -uo pipefail

PROGRAMS="slurmctld slurmd sbatch srun munged"
PACKAGES="slurmctld slurmd slurm-client munge"
. "$(dirname "$0")/lib.sh"  # in_ci, apt_retry
# the daemons live in /usr/sbin, which a non-root PATH may lack
have() { PATH="$PATH:/usr/sbin:/sbin" command -v "$1" >/dev/null; }

missing() {
    local program out=""
    for program in $PROGRAMS; do have "$program" || out="$out $program"; done
    echo "${out# }"
}

absent="$(missing)"
if [ -n "$absent" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "installing Debian's SLURM and munge for the SLURM tests (apt-get; missing: $absent)"
        # Keep apt from starting the system's munged, slurmctld and slurmd (policy-rc.d answers "not now" to
        # invoke-rc.d and deb-systemd-invoke): the tests run their own, and nothing else wants them.
        if [ ! -e /usr/sbin/policy-rc.d ]; then
            printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d
            trap 'rm -f /usr/sbin/policy-rc.d' EXIT
        fi
        # shellcheck disable=SC2086  # one word per package
        apt_retry update -qq && apt_retry install -y -qq $PACKAGES || {
            echo "could not install $PACKAGES with apt-get; the SLURM tests need them" >&2
            exit 1
        }
        absent="$(missing)"
        if [ -n "$absent" ]; then
            echo "apt-get installed $PACKAGES but $absent still cannot be found" >&2
            exit 1
        fi
    else
        msg="SLURM is missing ($absent): install it (sudo apt-get install $PACKAGES) to run the SLURM tests"
        if in_ci; then
            echo "$msg (CI=true: the SLURM tests must run)" >&2
            exit 1
        fi
        echo "$msg; until then they are skipped"
        exit 0
    fi
fi
echo "SLURM ready: $(PATH="$PATH:/usr/sbin" slurmctld -V 2>/dev/null | head -1), $(PATH="$PATH:/usr/sbin" munged -V 2>/dev/null | head -1)"
