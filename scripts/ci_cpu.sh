#!/usr/bin/env bash
# The CPU-seconds of `bash .ci/run` on a fresh clone of HEAD, beside that day's `import verl`: the figures of the
# CI table in docs/benchmarks.md (issue 55's budget is 1,800 CPU-seconds, user plus system, of the whole run).
#
#   bash scripts/ci_cpu.sh [CLONE_DIR]        (default: a new folder under /tmp)
#
# Every process of the run is counted, Ray's daemonized ones included: as root on a cgroup-v1 machine the run goes
# into a cpuacct cgroup of its own, which its children cannot leave; elsewhere the machine's busy time from
# /proc/stat before and after (keep the machine otherwise idle then). `import verl` is timed in the clone's venv
# after the run, three times, the smallest kept.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
clone="${1:-$(mktemp -d /tmp/rllm-ci-cpu-XXXX)}"
rm -rf "$clone" && git clone -q "$repo" "$clone"
commit=$(git -C "$clone" rev-parse --short HEAD)

group=""
if [ "$(id -u)" = 0 ] && [ -w /sys/fs/cgroup/cpuacct ]; then
    group="/sys/fs/cgroup/cpuacct/rllm-ci-$$"
    mkdir -p "$group"
fi
busy() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat; }  # user nice system irq softirq steal
ticks=$(getconf CLK_TCK)
before=$(busy)
start=$(date +%s)
status=0
(
    if [ -n "$group" ]; then echo "$BASHPID" > "$group/cgroup.procs"; fi
    cd "$clone" && CI=true bash .ci/run
) > "$clone.log" 2>&1 || status=$?
wall=$(( $(date +%s) - start ))
after=$(busy)
if [ -n "$group" ]; then
    cpu=$(awk '{printf "%.0f", $1 / 1e9}' "$group/cpuacct.usage")
    how="cpuacct cgroup of the run"
    rmdir "$group" 2>/dev/null || true
else
    cpu=$(( (after - before) / ticks ))
    how="/proc/stat, whole machine"
fi
verl=$(for _ in 1 2 3; do
    "$clone/.venv/bin/python" -c 'import resource, verl; r = resource.getrusage(resource.RUSAGE_SELF); print(f"{r.ru_utime + r.ru_stime:.1f}")'
done | sort -n | head -1)
tests=$(grep -Eo '[0-9]+ passed.* in [0-9.]+s' "$clone.log" | tail -1 || true)
echo "commit $commit: .ci/run exit $status, ${wall} s wall, ${cpu} CPU-seconds ($how); import verl ${verl} CPU-s"
echo "tests: ${tests:-see $clone.log}"
exit "$status"
