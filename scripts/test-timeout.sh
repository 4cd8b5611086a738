#!/usr/bin/env bash
# scripts/test-timeout.sh — cargo's target runner for scripts/test.sh: runs one test binary
# under a time limit, so a hung test fails its binary with a clear message instead of holding
# CI until the job is killed without a word.
#
#   GPUSNAP_TEST_BINARY_TIMEOUT  seconds one test binary may run (default 900)
#   GPUSNAP_TEST_DEADLINE        epoch second by which the whole `cargo test` run must end
#                                (scripts/test.sh sets it); a binary gets what is left, if less
#
# cargo calls it as `test-timeout.sh <test binary> <args...>` (CARGO_TARGET_<triple>_RUNNER).
set -uo pipefail
limit=${GPUSNAP_TEST_BINARY_TIMEOUT:-900}
why="GPUSNAP_TEST_BINARY_TIMEOUT"
if [[ -n ${GPUSNAP_TEST_DEADLINE:-} ]]; then
    left=$((GPUSNAP_TEST_DEADLINE - $(date +%s)))
    if ((left < limit)); then
        limit=$((left > 1 ? left : 1))
        why="what was left of the cargo test run's limit, GPUSNAP_TEST_TIMEOUT"
    fi
fi
bin=$1
t0=$SECONDS
# --kill-after: a binary that ignores SIGTERM is killed 30 s later. timeout signals its whole
# process group, so what the binary started with it (ctr, runc) goes too.
timeout --kill-after=30 "$limit" "$@"
rc=$?
if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    printf '\nTIMEOUT: test binary %s ran past %ss (%s) and was killed after %ss; the test running then is the one above without a result\n' \
        "$(basename "$bin")" "$limit" "$why" "$((SECONDS - t0))" >&2
fi
exit "$rc"
