#!/usr/bin/env bash
# The GPU proof, in one command on a machine with one CUDA GPU (an H100/H200 here, an A100 on
# Perlmutter): `bash tests/gpu/run.sh [OUTDIR]`. Installs nothing from the network: the project's
# dependencies (pyproject.toml's [project] dependencies, the one list) that the machine's python lacks
# come from wheels in $HPC_WHEELS (default ./.whl), made beforehand on a machine with an index:
#   python tests/gpu/requirements.py     # on the GPU machine: what it lacks (there: msgspec, isal, submitit,
#                                        # torch-tb-profiler, cryptography, cffi)
#   python -m pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl <those>
# A requirement with no wheel stops the command with exit 2 before any phase.
# Then, under a time limit per phase (so one stuck phase cannot eat the others):
#   0. graphed_epoch   hpc.train as a user runs it on CUDA (graph mode, DDP over NCCL, one profiled cycle
#                      with the memory categories), ResNet152 batch 128, one epoch; then eager_categories, the
#                      same eager (where the categories can be seen): run directories in OUTDIR (~70 s)
#   1. pytest -m gpu   the GPU tests (tests/gpu/test_gpu.py; HPC_GPU_TESTS: a -k expression picking some),
#                      numbers kept in gpu_tests.json
#   2. hpc.bench       ResNet152, torchvision stem, batch 128 and 2048: baseline, toolkit, each change
#                      alone, without DDP, as a CUDA graph, the profiler's cost; 512 and 1024: the main ones
#   3. hpc.bench       peak memory of a training step for the study's batch sizes (beside phase 1)
#   4. hpc.bench       the CIFAR stem at batch 512; with HPC_GPU_COMPILE=1 also with torch.compile
#   5. summarize.py    OUTDIR/results.json (everything, with device, versions, commands) + summary.md
#   study_point        only with HPC_GPU_PHASES=study_point (its own call: ~5 minutes): the paper-style script
#                      against hpc.train, whole processes of 3 epochs at the study's points, both under
#                      torchrun, the toolkit also under hpc.submit --local (tests/gpu/study_point.py;
#                      HPC_GPU_STUDY_POINTS: fraction:batch,... in place of its default points)
# The memory phase runs beside the tests (it times nothing); the tests run six at a time where
# pytest-xdist is installed. Sized to pass in one call under the device's 10-minute limit (about 7 minutes
# on an H100: results/gpu/); torch.compile adds 2-3 minutes.
# Exit status: 0 when every phase ran and every GPU test passed, 1 otherwise (the files are written
# either way); 2 when a needed package is missing (no wheel for it) or the machine has no CUDA GPU.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUTDIR=$(realpath -m "${1:-results/gpu/latest}")
PY=${PYTHON:-python3}
WHEELS=${HPC_WHEELS:-.whl}

# The dependencies first: a missing one ends the command here, before any phase.
PYPROJECT=${HPC_PYPROJECT:-pyproject.toml}  # another file only in tests/e2e/test_gpu_runner.py
if ! missing=$($PY tests/gpu/requirements.py --pyproject "$PYPROJECT"); then
    echo "tests/gpu/run.sh: cannot read the dependencies of $PYPROJECT" >&2
    exit 2
fi
if [ -n "$missing" ]; then
    site=${HPC_GPU_SITE:-/tmp/hpc-gpu-site}
    # shellcheck disable=SC2086  # one requirement per word
    if ! $PY -m pip install -q --no-index --no-deps --no-compile --find-links "$WHEELS" --target "$site" $missing; then
        echo "tests/gpu/run.sh: missing $(echo $missing) and no wheels for them in $WHEELS (see the top of this file)" >&2
        exit 2
    fi
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    still=$($PY tests/gpu/requirements.py --pyproject "$PYPROJECT")
    if [ -n "$still" ]; then
        echo "tests/gpu/run.sh: after installing from $WHEELS still missing: $(echo $still)" >&2
        exit 2
    fi
fi
if ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "tests/gpu/run.sh: no CUDA GPU visible to $PY; run the CPU suite with: bash tests/run.sh" >&2
    exit 2
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HPC_GPU_RESULTS="$OUTDIR"
# torch.compile's caches shared by the phases: a graph compiled once is not compiled again.
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/hpc-inductor-cache}

mkdir -p "$OUTDIR"
: >"$OUTDIR/phases.jsonl"
rm -f "$OUTDIR/gpu_tests.json"  # the tests add to it (several workers): this run's alone

MAIN_CONFIGS="baseline,toolkit,toolkit without DDP,toolkit + CUDA graph"
failed=0
phase() {  # phase NAME LIMIT_S COMMAND...: run it, log it, record its exit status and duration
    local name=$1 limit=$2 start rc
    shift 2
    start=$(date +%s.%N)
    echo "== $name (limit ${limit}s): $*"
    timeout -k 10 "$limit" "$@" >"$OUTDIR/$name.log" 2>&1
    rc=$?
    tail -n 25 "$OUTDIR/$name.log"
    $PY -c "import json, sys; print(json.dumps({'phase': sys.argv[1], 'rc': int(sys.argv[2]), 'seconds': round(float(sys.argv[4]) - float(sys.argv[3]), 1), 'command': sys.argv[5:]}))" \
        "$name" "$rc" "$start" "$(date +%s.%N)" "$@" >>"$OUTDIR/phases.jsonl"
    [ "$rc" = 0 ] || failed=1
}

# HPC_GPU_PHASES picks phases (comma-separated); study_point is not in the default set because with the
# others it would not fit one 10-minute call: run it as its own, HPC_GPU_PHASES=study_point.
PHASES=${HPC_GPU_PHASES:-graphed_epoch,pytest,bench_torchvision,bench_torchvision_mid,memory,bench_cifar}
want() { [[ ",$PHASES," == *",$1,"* ]]; }
if want graphed_epoch; then  # the CUDA default end to end: graph check, DDP (NCCL) captured, one profiled cycle
    # with the memory categories, on 50 steps of ResNet152 at batch 128 (synthetic data: no internet there);
    # then the same eager: the categories at the peak (a replay's tensors are invisible to the memory profiler)
    for run in graphed_epoch:auto eager_categories:false; do
        phase "${run%%:*}" 200 $PY -m torch.distributed.run --standalone --nproc-per-node=1 -m hpc.train \
            --data-root /tmp/hpc-gpu-cifar100-small --run-dir "$OUTDIR/${run%%:*}" --arch resnet152 \
            --stem torchvision --batch-size 128 --epochs 1 --cuda-graph "${run#*:}" --set data.source=synthetic \
            --set data.synth_train=6400 --set data.synth_test=1000 --set profiler.profile_memory=true \
            --set profiler.memory_categories=true --set profiler.key_averages=true
    done
fi
# The memory phase measures each configuration's peak in its own process (nothing it reports is a time):
# it runs beside the tests, on the same GPU, to fit the command in one call.
mem_pid=
if want memory; then
    ( failed=0; phase memory 150 $PY -m hpc.bench --arch resnet152 --stem torchvision \
        --memory-grid 128,256,512,1024,2048 --out "$OUTDIR/memory.json"; exit $failed ) &
    mem_pid=$!
fi
# HPC_GPU_TESTS: a pytest -k expression picking some of the GPU tests (all by default). With pytest-xdist
# (the GPU machine has it), six at a time on the one GPU: each test's processes are its own, the tests
# that share the ResNet152 run stay in one worker (xdist_group).
parallel=()
$PY -c "import xdist" 2>/dev/null && parallel=(-n "${HPC_GPU_TEST_WORKERS:-6}" --dist loadgroup)
want pytest && phase pytest 330 $PY -m pytest -m gpu tests -p no:cacheprovider -q -rA --junitxml "$OUTDIR/pytest.xml" \
    "${parallel[@]}" ${HPC_GPU_TESTS:+-k "$HPC_GPU_TESTS"}
if [ -n "$mem_pid" ]; then wait "$mem_pid" || failed=1; fi
want bench_torchvision && phase bench_torchvision 200 $PY -m hpc.bench --arch resnet152 --stem torchvision \
    --batch 128,2048 --out "$OUTDIR/bench_torchvision.json"
want bench_torchvision_mid && phase bench_torchvision_mid 100 $PY -m hpc.bench --arch resnet152 --stem torchvision \
    --batch 512,1024 --only "$MAIN_CONFIGS" --out "$OUTDIR/bench_torchvision_mid.json"
want bench_cifar && phase bench_cifar 70 $PY -m hpc.bench --arch resnet152 --stem cifar --batch 512 \
    --only "$MAIN_CONFIGS" --out "$OUTDIR/bench_cifar.json"
if want study_point; then  # the paper-style script against hpc.train, whole processes (tests/gpu/study_point.py)
    DATA=${HPC_GPU_DATA:-/tmp/hpc-gpu-cifar100}
    [ -d "$DATA/cifar-100-python" ] || $PY -m hpc.data synth --root "$DATA" --train 50000 --test 10000 >/dev/null
    phase study_point 570 $PY tests/gpu/study_point.py --data-root "$DATA" --out "$OUTDIR/study_point.json" \
        --work-dir "$OUTDIR/study_point" ${HPC_GPU_STUDY_POINTS:+--points "$HPC_GPU_STUDY_POINTS"}
fi
if [ "${HPC_GPU_COMPILE:-0}" = 1 ]; then  # compiling ResNet152 takes 2-3 minutes of CPU on the H100 host
    phase bench_cifar_compile 240 $PY -m hpc.bench --arch resnet152 --stem cifar --batch 512 --compile \
        --only "toolkit + compile" --out "$OUTDIR/bench_cifar_compile.json"
fi
$PY tests/gpu/summarize.py "$OUTDIR" --command "bash tests/gpu/run.sh $*" || failed=1
exit "$failed"
