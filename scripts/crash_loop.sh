#!/usr/bin/env bash
# Run one pytest command again and again to catch a rare hard crash of the test process (issue 23):
#
#   bash scripts/crash_loop.sh RUNS OUTDIR tests/test_spawn_launcher.py tests/test_widgets_sharding.py
#
# Each run gets a directory OUTDIR/run-N as its working directory (a core file lands there where the
# kernel's core_pattern is the plain "core"), core dumps allowed (ulimit -c unlimited), and
# PPKIT_FAULT_LOG=OUTDIR/run-N/faults.log (tests/faultlog.py: faulthandler's stacks plus a line per test
# started and ended). A run that fails keeps its directory, its output (out.txt) and, for each core, gdb's
# backtrace of every thread (gdb.txt; gdb is needed for that: apt-get install gdb). A run that passes is
# deleted. OUTDIR/summary.txt gets one line per run: its exit status and whether it left a core.
set -uo pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 RUNS OUTDIR PYTEST_ARGS..." >&2
  exit 2
fi
runs=$1 out=$(realpath -m "$2")
shift 2
repo=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$repo/.venv/bin/python}
args=()
for a in "$@"; do  # test paths relative to the repository, as in `make test`
  if [ -e "$repo/$a" ]; then args+=("$repo/$a"); else args+=("$a"); fi
done
mkdir -p "$out"
ulimit -c unlimited 2>/dev/null || echo "core dumps are not allowed here (ulimit -c): no native stacks" >&2
pattern=$(cat /proc/sys/kernel/core_pattern 2>/dev/null || echo "?")
case $pattern in core*) ;; *) echo "core_pattern is '$pattern': cores go there, not to the run's directory" >&2 ;; esac
crashed=0
for i in $(seq 1 "$runs"); do
  dir=$out/run-$i
  mkdir -p "$dir"
  (cd "$dir" && PPKIT_FAULT_LOG=$dir/faults.log PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" \
    "$python" -m pytest -q --rootdir="$repo" -c "$repo/pyproject.toml" "${args[@]}" >"$dir/out.txt" 2>&1)
  status=$?
  cores=$(find "$dir" -maxdepth 1 -name 'core*' -type f)
  for core in $cores; do
    if command -v gdb >/dev/null; then
      gdb -batch -ex "thread apply all bt 40" "$python" "$core" >>"$dir/gdb.txt" 2>&1
    fi
  done
  echo "$(date +%T) run $i: exit $status${cores:+, core}" | tee -a "$out/summary.txt"
  if [ "$status" -eq 0 ]; then rm -rf "$dir"; else crashed=$((crashed + 1)); fi
done
echo "$crashed of $runs runs failed" | tee -a "$out/summary.txt"
