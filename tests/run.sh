#!/usr/bin/env bash
# The README's test command: install the package with its test extras into .venv, start the local
# Perlmutter-shaped Slurm cluster and install Chromium when we are root, and run the whole suite. Extra
# arguments go to pytest (e.g. `bash tests/run.sh -k distenv`). In CI (CI=true, whoever runs it) and as
# root every tier but the GPU one must run: a cluster that does not come up, a browser that cannot be
# installed, a tier whose tests all skip, or any test outside the GPU tier that skips without a written
# reason (tests/tiers.py ALLOWED_SKIPS) fails the run. Otherwise those tests skip, saying why.
set -euo pipefail
cd "$(dirname "$0")/.."

# As root, the machine's part (Debian's Slurm, MariaDB and munge through tests/slurm/cluster.sh, then
# Chromium and its driver for the TensorBoard browser test) is installed and started in the background
# while pip installs the package: on a fresh machine both are mostly downloads and unpacking, so side by
# side they take the longer one's time, not the sum. One chain, so that two apt-gets never race for its lock.
system_pid=""
if [ "$(id -u)" = 0 ]; then
    export HPC_REQUIRE_TIERS=1
    system_log="$(mktemp -t hpc-system.XXXXXX)"
    (
        bash tests/slurm/cluster.sh start || { echo "tests/run.sh: the Slurm cluster did not start (above)" >&2; exit 1; }
        if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
            export DEBIAN_FRONTEND=noninteractive
            (apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 \
                || { apt-get update -q >/dev/null && apt-get install -y -q chromium chromium-driver >/dev/null; }) \
                || { echo "tests/run.sh: could not install chromium and chromium-driver" >&2; exit 1; }
        fi
    ) >"$system_log" 2>&1 &
    system_pid=$!
else
    echo "tests/run.sh: not root, so no local Slurm cluster; slurm tests will skip" >&2
fi

# The package's own bytecode, compiled once: an editable install leaves none, and where
# PYTHONDONTWRITEBYTECODE is set (this machine's image sets it) no process writes any, so every rank, runner
# and command of the suite compiled hpc/ and analysis/ again (0.14 s of CPU a process, measured 2026-12-07).
python_rc=0
{ python3 -m venv .venv && .venv/bin/python -m pip install -q -e ".[test,oracle]" \
  && .venv/bin/python -m compileall -q hpc analysis tests >/dev/null \
  && .venv/bin/python -c "import torch, torchvision; print(f'torch {torch.__version__}, torchvision {torchvision.__version__}')"
} || python_rc=$?
if [ -n "$system_pid" ]; then  # waited for even when pip failed: an apt-get is never left half done
    system_rc=0
    wait "$system_pid" || system_rc=$?
    cat "$system_log" >&2
    rm -f "$system_log"
    [ "$system_rc" = 0 ] || exit 1
fi
[ "$python_rc" = 0 ] || exit "$python_rc"
export HPC_ARTIFACTS="${HPC_ARTIFACTS:-$PWD/artifacts}"  # the TensorBoard screenshot lands here

export PATH="$PWD/.venv/bin:$PATH"
if [ "$#" -gt 0 ]; then  # a selection: one pytest, as asked
    set +e
    python -m pytest "$@"
    rc=$?
    set -e
    if [ "$rc" = 5 ]; then
        echo "tests/run.sh: pytest collected no tests; that is a failure" >&2
        exit 1
    fi
    exit "$rc"
fi

# The whole suite as two pytest runs side by side: the Slurm tier, whose tests mostly wait on the cluster
# (collective timeouts, requeue holds, a controller's restart, slowed steps), beside the rest, which mostly
# computes. Each counts its own tiers (tests/tiers.py) in its own temporary folder; the Slurm tier's output
# follows the rest's. Measured on 2 cores (tests/README.md, 2026-11-30): 33 to 45 minutes in all as the
# machine's speed and the suite varied, the rest on two workers beside the Slurm tier, the cores the bound.
base="$(mktemp -d -t hpc-tests.XXXXXX)"
slurm_log="$base/slurm-tier.log"
set +e
python -m pytest -m slurm -p no:cacheprovider --durations=30 --basetemp "$base/slurm" >"$slurm_log" 2>&1 &
slurm_pid=$!
trap 'kill "$slurm_pid" 2>/dev/null' EXIT  # a run stopped here stops the other too
# The rest on two xdist workers, a test module to a worker (its module fixtures made once): many of its tests
# wait (a stop's grace time, a hang's bound), so two share the cores the Slurm tier mostly leaves idle.
python -m pytest -m "not slurm" -n 2 --dist loadfile --durations=30 --basetemp "$base/rest"
rest_rc=$?
wait "$slurm_pid"
slurm_rc=$?
trap - EXIT
set -e
echo
echo "======== the Slurm tier (python -m pytest -m slurm), run beside the rest ========"
cat "$slurm_log"
for rc in "$rest_rc" "$slurm_rc"; do
    if [ "$rc" = 5 ]; then
        echo "tests/run.sh: a pytest run collected no tests; that is a failure" >&2
        exit 1
    fi
done
echo "tests/run.sh: the rest exited $rest_rc, the Slurm tier $slurm_rc"
[ "$rest_rc" = 0 ] && [ "$slurm_rc" = 0 ] && rm -rf "$base"
[ "$rest_rc" != 0 ] && exit "$rest_rc"
exit "$slurm_rc"
