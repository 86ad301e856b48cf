"""HF Accelerate and HF Trainer as their documentation writes them (issue 52). tests/scripts/accelerate_ddp.py
(`Accelerator()`, `prepare`, `accelerator.backward`, `save_state`/`load_state`) through `hpc.submit --local`
on two CPU ranks as `accelerate launch` would start it: the user's accelerate config (where `accelerate
config` writes it, under HF_HOME) applied, its mixed precision recorded in summary.json; without a config,
the two ranks are still one world of two (Accelerate itself prints which process of how many it is: the
oracle), profiled through Accelerate's wrapped optimizer; stopped by Ctrl-C after its first save_state,
the same command again resumes to the uninterrupted run's weights. HF Trainer (tests/scripts/hf_trainer.py)
builds the same state: the same config, the same world (it probes for accelerate before importing it; the
hook waits for the import itself)."""

import importlib.util
import json
import re
import signal
import subprocess
import time

import pytest

from test_own_script import ENV, PY, REPO, assert_a_window_step_an_optimizer_step, run_dir_of

# A test extra (pyproject's [test]): without it these tests fail to collect; they never vanish.
assert importlib.util.find_spec("accelerate"), "Accelerate is a test extra: pip install -e .[test]"
pytestmark = pytest.mark.slow
SCRIPT = REPO / "tests" / "scripts" / "accelerate_ddp.py"
TRAINER = REPO / "tests" / "scripts" / "hf_trainer.py"
CONFIG = "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nmixed_precision: bf16\n" \
         "num_machines: 1\nnum_processes: 2\nuse_cpu: false\n"


def submit_accelerate(tmp_path, config: str | None, script=SCRIPT, *args: str) -> subprocess.Popen:
    home = tmp_path / "hf"  # accelerate's default config file is $HF_HOME/accelerate/default_config.yaml
    if config is not None and not home.exists():
        (home / "accelerate").mkdir(parents=True)
        (home / "accelerate" / "default_config.yaml").write_text(config)
    return subprocess.Popen([PY, "-m", "hpc.submit", "--local", "--gpus", "2", "--runs-dir", str(tmp_path / "runs"),
                             "--", PY, str(script), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=tmp_path, env={**ENV, "HF_HOME": str(home)})


def run_accelerate(tmp_path, config: str | None, script=SCRIPT, *args: str):
    proc = submit_accelerate(tmp_path, config, script, *args)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    run = run_dir_of(out)
    said = [(run / "logs" / f"rank{rank}.out").read_text() for rank in (0, 1)]
    return run, json.loads((run / "summary.json").read_text()), said


def test_accelerate_stopped_resumes_from_its_saved_state_to_the_uninterrupted_weights(tmp_path):
    """With the config: the uninterrupted run (its view, steps and windows as below), then Ctrl-C after
    the first epoch's save_state (not done), and the same command again resuming from it."""
    run, summary, said = run_accelerate(tmp_path, CONFIG, SCRIPT)
    assert_accelerates_own_view(run, summary, said, "bf16")
    expected = re.findall(r"final weights sha256 (\w+)", said[0])
    saved = tmp_path / "state"
    proc = submit_accelerate(tmp_path, CONFIG, SCRIPT, "--checkpoint-dir", str(saved), "--step-sleep", "0.25")
    deadline = time.monotonic() + 300
    while not [p for p in (tmp_path / "runs").glob("*/*/logs/rank0.out") if "saved epoch_0" in p.read_text()]:
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3 and "hpc: stopped (SIGINT)" in err and "sha256" not in out, out + err
    again, summary, said = run_accelerate(tmp_path, CONFIG, SCRIPT, "--checkpoint-dir", str(saved))
    assert "resumed from epoch_0" in said[0] and summary["outcome"] == "done", said
    assert [r["steps"] for r in summary["ranks"]] == [8, 8]  # the second epoch alone
    assert len(expected) == 1 and re.findall(r"final weights sha256 (\w+)", said[0]) == expected, said[0]


def assert_accelerates_own_view(run, summary, said, precision: str) -> None:
    for rank, text in enumerate(said):  # Accelerate's own view of the world it is in
        assert re.search(rf"process {rank} of 2: mixed precision {precision}, device cpu", text), text
    # 256 samples, batch 16, split over 2 processes, 2 epochs: 16 optimizer steps each (32 if each trained alone)
    assert [(r["rank"], r["steps"], r["mixed_precision"]) for r in summary["ranks"]] == [(0, 16, precision),
                                                                                         (1, 16, precision)]
    for rank in (0, 1):
        assert_a_window_step_an_optimizer_step(run, rank)


def test_accelerate_without_a_config_is_still_one_world(tmp_path):
    assert_accelerates_own_view(*run_accelerate(tmp_path, None), "no")


def test_hf_trainer_runs_in_one_world_with_the_users_accelerate_config(tmp_path):
    assert importlib.util.find_spec("transformers"), "transformers is a test extra: pip install -e .[test]"
    run, summary, said = run_accelerate(tmp_path, CONFIG, TRAINER)
    for rank, text in enumerate(said):  # the Trainer's Accelerate state: one world of two, the config's precision
        assert re.search(rf"process {rank} of 2: mixed precision bf16, device cpu\S*, 16 steps", text), text
    assert [(r["rank"], r["steps"], r["mixed_precision"]) for r in summary["ranks"]] == [(0, 16, "bf16"),
                                                                                         (1, 16, "bf16")]
    for rank in (0, 1):
        assert_a_window_step_an_optimizer_step(run, rank)


@pytest.mark.slurm
def test_accelerate_on_two_nodes_of_the_slurm_cluster(slurm_cluster, tmp_path):
    """2 nodes x 1 task: one world of two across the nodes, the config's mixed precision on both."""
    from test_own_script_slurm import TWO_BY_ONE

    home = tmp_path / "hf"
    (home / "accelerate").mkdir(parents=True)
    (home / "accelerate" / "default_config.yaml").write_text(CONFIG)
    r = subprocess.run([PY, "-m", "hpc.submit", *TWO_BY_ONE, "--export", f"ALL,HF_HOME={home}", "--runs-dir",
                        str(tmp_path / "runs"), "--no-profile", "--wait", "--", PY, str(SCRIPT)],
                       capture_output=True, text=True, cwd=REPO, env=ENV, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run = run_dir_of(r.stdout)
    for rank in (0, 1):
        text = (run / "logs" / f"rank{rank}.out").read_text()
        assert re.search(rf"process {rank} of 2: mixed precision bf16, device cpu", text), text
    summary = json.loads((run / "summary.json").read_text())
    assert [(x["node_rank"], x["steps"], x["mixed_precision"]) for x in summary["ranks"]] == [(0, 16, "bf16"),
                                                                                              (1, 16, "bf16")]
