"""hpc.submit --local: the README's main command path, through submitit's local executor (no Slurm)."""

import json

from conftest import run_module


def test_local_two_ranks_through_submitit(tmp_path):
    proc = run_module("hpc.submit", "--local", "--gpus", "2", "--config", "profiles/smoke.yaml", "--data-root",
                      str(tmp_path / "data"), "--runs-dir", str(tmp_path / "runs"), "--max-steps", "4", timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # it ends by saying where the run, its traces and its summary are
    tail = proc.stdout.strip().splitlines()[-4:]
    assert tail[0].endswith(": done") and [line.split(":")[0].strip() for line in tail[1:]] == ["run", "traces", "summary"]
    run_dir = tmp_path / "runs" / "tiny" / tail[0].split()[1].rstrip(":")
    assert tail[1].split()[-1] == str(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [r["launcher"] for r in summary["ranks"]] == ["submitit-local", "submitit-local"]
    assert len(list((run_dir / "traces").glob("rank*.pt.trace.json"))) == 2
    assert sorted(p.name for p in (tmp_path / "runs" / "tiny").iterdir()) == [run_dir.name]  # no '%j' left over
    assert "step 4/4" in proc.stdout  # rank 0's progress was followed
    # ... after the numbers of the run it just made, from its traces: one row per rank
    lines = proc.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("profiled steps, per rank"))
    # in human units, the unit in the header (the raw integers stay in JSON and CSV)
    assert lines[at + 1].split() == ["rank", "steps", "cpu_time", "(ms)", "cuda_time", "(ms)", "kernel_calls",
                                     "peak_gpu_mem", "(MiB)", "peak_cpu_mem", "(MiB)"]
    rows = [line.split() for line in lines[at + 2:at + 4]]
    assert [r[0] for r in rows] == ["0", "1"] and all(int(r[1]) == 2 and float(r[2]) > 0 for r in rows)
    assert all(r[3:6] == ["-", "-", "-"] and 100 < float(r[6]) < 4096 for r in rows)  # a CPU run: no CUDA numbers
    # ... and what bounds it, in words: a CPU run has no GPU to judge, and says so rather than guess
    assert lines[at + 4].startswith("verdict: unknown: no device activity in the trace (a CPU run)")
    assert lines[at + 5] == tail[0]
