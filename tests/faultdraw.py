"""Random faults at moments drawn from a run's own progress: the harness of tests/e2e/test_random_faults.py,
and of its long run by hand:

    .venv/bin/python tests/faultdraw.py --trials 200 --seed 1 [--out trials.jsonl]

A trial draws, from its seed alone (the same trial for the same seed, whatever the machine): the world (1
or 2 gloo ranks), a signal (KILL, TERM, INT, USR2: seed % 4, so any four seeds in a row cover them), the
rank it hits, a moment, and whether a second SIGKILL hits the resume. A moment is the k-th line rank 0
prints plus a delay of up to 0.1 s: k is a drawn fraction of RUN_LINES, the lines every uninterrupted
run prints before its last ("done"; the same each time: `reference` checks it), short of its last step,
and every step takes 0.1 s longer (slow-step), so the signal lands inside the run (set-up, a step, a
checkpoint write, the profiler's export, an evaluation, the summary), not after it.
Each trial records whether it landed (sent before the target's last line and its exit) and whether the
target caught that signal then (its /proc SigCgt): a run may die of TERM, INT or USR2 only where it had
no handler for it yet. The run is then resumed by the same command until it ends, and checked against
the uninterrupted run (the oracle): the final weights' sha256 (computed here from last.pt, not by the
toolkit), the step, a complete summary.json, no temp file anywhere, the same metrics records (kind,
step, epoch), each once, and a stop that says it stopped.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trainrun import SMOKE, start_ranks  # noqa: E402

# 2 epochs of 500 images (fraction 0.5 of 1000), batch 64 a rank: 16 steps on one rank, 8 on two
ARGS = ["--epochs", "2", "--batch-size", "64", "--set", "data.fraction=0.5", "--set", "train.checkpoint_every_steps=3",
        "--set", "train.collective_timeout_s=20", "--set", "train.log_every_steps=2"]
SIGNALS = ("KILL", "TERM", "INT", "USR2")
RUN_LINES = {1: 21, 2: 14}  # the lines rank 0 prints before "done", by world size (reference() checks it)
SLOW_STEP = {"HPC_FAULT_INJECT": "slow-step:100"}  # each step 0.1 s longer: a signal after line k lands in the run
LOST_SAID = ("lost a peer", "the group did not form", "could not reach the run's store")  # exit 5's lines


def command(data_root: Path, run_dir: Path) -> list[str]:
    return ["--config", SMOKE, "--data-root", str(data_root), "--run-dir", str(run_dir), *ARGS]


class Watch:
    """The lines a running run's ranks print, counted on rank 0's stdout as they come; `fire` sends a signal
    to a rank after rank 0's line `at`, and says whether it landed inside the run."""

    def __init__(self, procs: list[subprocess.Popen], run_dir: Path):
        self.procs, self.run_dir = procs, run_dir
        self.events = 0
        self.lock = threading.Condition()
        self.out = {i: [] for i in range(len(procs))}
        self.err = {i: [] for i in range(len(procs))}
        self.readers = [threading.Thread(target=self._read, args=(i, p.stdout, self.out), daemon=True)
                        for i, p in enumerate(procs)]
        self.readers += [threading.Thread(target=self._read, args=(i, p.stderr, self.err), daemon=True)
                         for i, p in enumerate(procs)]
        for t in self.readers:
            t.start()

    def _read(self, i: int, stream, sink: dict) -> None:
        for line in stream:
            sink[i].append(line)
            if sink is self.out and i == 0:
                with self.lock:
                    self.events += 1
                    self.lock.notify_all()

    def fire(self, at: int, delay_s: float, sig: signal.Signals, target: int, last: int) -> tuple[bool, bool]:
        """(landed: sent while the target ran, with at most `last` of rank 0's lines out, its "done" not
        yet; caught: the target had a handler for it then)."""
        with self.lock:
            while self.events < at and any(p.poll() is None for p in self.procs):
                self.lock.wait(0.05)
        time.sleep(delay_s)
        proc = self.procs[target]
        if proc.poll() is not None:
            return False, False
        caught = handles(proc.pid, sig)
        with self.lock:
            before_end = self.events <= last
        proc.send_signal(sig)
        return before_end, caught

    def finish(self, timeout_s: float = 180) -> list[tuple[int, str, str]]:
        deadline = time.monotonic() + timeout_s
        for p in self.procs:
            try:
                p.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for t in self.readers:
            t.join(10)
        return [(p.returncode, "".join(self.out[i]), "".join(self.err[i])) for i, p in enumerate(self.procs)]


def handles(pid: int, sig: signal.Signals) -> bool:
    """Whether the process has a handler for `sig` now: its SigCgt mask in /proc (the kernel's own record,
    not the toolkit's)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = next((int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigCgt:")), 0)
    return bool(mask >> (int(sig) - 1) & 1)


def launch(world: int, data_root: Path, run_dir: Path) -> Watch:
    procs = start_ranks(world, command(data_root, run_dir), {"HPC_LOG_LEVEL": "info", **SLOW_STEP})
    return Watch(procs, run_dir)


def weights_sha256(run_dir: Path) -> str:
    """The model's tensors in last.pt, hashed here: names, dtypes, shapes and bytes in name order."""
    model = torch.load(run_dir / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)["model"]
    h = hashlib.sha256()
    for name in sorted(model):
        t = model[name].contiguous()
        h.update(f"{name}{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def records(run_dir: Path) -> list[tuple]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return sorted((r["kind"], r["step"], r["epoch"]) for r in map(json.loads, lines))


def temp_files(run_dir: Path) -> list[str]:
    return sorted(str(p) for p in run_dir.rglob("*") if ".tmp" in p.name or p.name.startswith(".write-test."))


@dataclasses.dataclass
class Reference:
    """The uninterrupted run of a world size: what every faulted one must end like."""

    events: int
    sha256: str
    records: list[tuple]
    steps: int


def reference(world: int, data_root: Path, run_dir: Path) -> Reference:
    watch = launch(world, data_root, run_dir)
    results = watch.finish()
    assert all(rc == 0 for rc, _, _ in results), results
    lines = results[0][1].splitlines()
    assert lines[RUN_LINES[world]] == "done", results[0][1]  # the draws' moments are counted on these lines
    steps = json.loads((run_dir / "summary.json").read_text())["ranks"][0]["steps"]
    return Reference(watch.events, weights_sha256(run_dir), records(run_dir), steps)


@dataclasses.dataclass
class Trial:
    seed: int
    world: int
    sig: str
    target: int
    at: int
    delay_s: float
    second_kill_at: int | None
    landed: bool = False
    caught: bool = False  # the target had a handler for the signal when it was sent
    codes: list[int] = dataclasses.field(default_factory=list)
    runs: int = 0


def draw(seed: int) -> Trial:
    """The trial of a seed: from the seed alone (the module doc)."""
    rng = random.Random(seed)
    world = rng.choice((1, 2))
    lines = RUN_LINES[world] - 2  # never after the last step's line: the signal lands inside the run
    second = int(rng.random() * lines) if rng.random() < 0.3 else None
    return Trial(seed, world, SIGNALS[seed % len(SIGNALS)], rng.randrange(world), int(rng.random() * lines),
                 round(rng.uniform(0, 0.1), 3), second)


def said_it_stopped(trial: Trial, sig: str, results: list[tuple[int, str, str]], caught: bool) -> str | None:
    """What is wrong with how the faulted run ended, None if nothing."""
    for rank, (rc, out, err) in enumerate(results):
        if rc == 3 and "stopped by signal, checkpoint written" not in out and rank == 0:
            return f"rank {rank} exit 3 without saying it stopped"
        if rc == 5 and not any(said in err for said in LOST_SAID):
            return f"rank {rank} exit 5 without naming the lost peer: {err.strip().splitlines()[-1:]}"
        # death by the signal itself: SIGKILL always; the others only where the target had no handler for it
        # when it came (Python's start-up, before the door installs one: /proc's SigCgt said so)
        dies = sig == "KILL" or not caught
        if rc < 0 and not (dies and rank == trial.target and -rc == signal.Signals[f"SIG{sig}"]):
            return f"rank {rank} died of signal {-rc}"
        if not caught and sig == "INT" and rank == trial.target and err.rstrip().endswith("KeyboardInterrupt"):
            continue  # Ctrl-C before the door's handler exists (Python's start-up, ~30-60 ms): Python's own
        if rc not in (0, 3, 5) and rc >= 0:
            return f"rank {rank} exit {rc}: {err.strip().splitlines()[-1:] if err.strip() else ''}"
        if "Traceback" in err:
            return f"rank {rank} printed a traceback"
    return None


def run_trial(trial: Trial, ref: Reference, data_root: Path, run_dir: Path) -> str | None:
    """The trial, a second SIGKILL during the resume if drawn, then the resume to the end; what is wrong
    (None: it ended as the reference did)."""
    watch = launch(trial.world, data_root, run_dir)
    sig = signal.Signals[f"SIG{trial.sig}"]
    trial.landed, trial.caught = watch.fire(trial.at, trial.delay_s, sig, trial.target, RUN_LINES[trial.world])
    results = watch.finish()
    trial.codes, trial.runs = [rc for rc, _, _ in results], 1
    wrong = said_it_stopped(trial, trial.sig, results, trial.caught)
    if wrong is None and trial.second_kill_at is not None:
        watch = launch(trial.world, data_root, run_dir)
        watch.fire(trial.second_kill_at, trial.delay_s, signal.SIGKILL, trial.target, RUN_LINES[trial.world])
        results = watch.finish()
        trial.runs += 1
        wrong = said_it_stopped(trial, "KILL", results, True)  # (a KILL may always kill)
    if wrong is None:
        results = launch(trial.world, data_root, run_dir).finish()
        trial.runs += 1
        wrong = None if all(rc == 0 for rc, _, _ in results) else f"the resume ended {[r[0] for r in results]}"
    return wrong or check_end(run_dir, ref)


def check_end(run_dir: Path, ref: Reference) -> str | None:
    summary = json.loads((run_dir / "summary.json").read_text())
    if not all(r["complete"] and r["steps"] == ref.steps for r in summary["ranks"]):
        ends = [(r["complete"], r["steps"]) for r in summary["ranks"]]
        return f"summary.json not complete at step {ref.steps}: {ends}"
    if weights_sha256(run_dir) != ref.sha256:
        return "final weights differ from the uninterrupted run's"
    if temp_files(run_dir):
        return f"temp files left: {temp_files(run_dir)}"
    got = records(run_dir)
    if got != ref.records:
        return f"metrics records differ: extra {sorted(set(got) - set(ref.records))}, missing " \
               f"{sorted(set(ref.records) - set(got))}, {len(got)} vs {len(ref.records)}"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description="random faults, drawn from a seed, against an uninterrupted run")
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--work", type=Path, default=Path("/tmp/faultdraw"))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    from hpc.training import data

    args.work.mkdir(parents=True, exist_ok=True)
    data_root = args.work / "data"
    if not data_root.exists():
        data.synthesize(data_root, n_train=1000, n_test=250, seed=0)
    refs = {w: reference(w, data_root, args.work / f"straight{w}-{os.getpid()}") for w in (1, 2)}
    failures, landed, tally = 0, 0, {}
    for i in range(args.trials):
        trial = draw(args.seed * 100_000 + i)
        wrong = run_trial(trial, refs[trial.world], data_root, args.work / f"trial{trial.seed}")
        failures += wrong is not None
        landed += trial.landed
        tally[trial.sig] = tally.get(trial.sig, 0) + 1
        line = {**dataclasses.asdict(trial), "wrong": wrong}
        print(json.dumps(line), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(line) + "\n")
    print(f"{args.trials} trials, {landed} landed inside the run, signals {tally}, {failures} ended otherwise than "
          "the uninterrupted run", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
