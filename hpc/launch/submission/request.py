"""A submission command line as one typed value (`SubmitRequest`): what `hpc.submit` and `hpc.study` parsed
and settled, handed from their entry module to the plan (hpc/launch/submission/plan.py) and the points
(points.py), with the interactive allocation it may run in (`Allocation`). argparse's Namespace stays in
the entry module: no later stage reads a flag by its name."""

from __future__ import annotations

import dataclasses

from hpc.launch.submission.sbatchflags import JobOptions

Override = tuple[str, object, str]  # (dotted config key, value, the flag or --set that gave it)


@dataclasses.dataclass(frozen=True)
class Allocation:
    """The interactive allocation this process runs in (salloc's shell): its job, nodes, and where Slurm
    says them, GPUs and CPUs per node (hpc/launch/batch.py allocation_here)."""

    job_id: str
    nodes: int
    gpus: int | None
    cpus: int | None


@dataclasses.dataclass(frozen=True)
class SubmitRequest:
    """What a submission command line asks for, before it is checked against a profile.

    Job shape: `nodes` (1 unless given or an allocation's), `gpus` per node (None: the profile's), `time`
    (minutes; None: the profile's), `name` (None: the command's or the sweep's), `options` (sbatch's
    options, checked: hpc/launch/submission/sbatchflags.py). Where: `profile` (None: perlmutter, or local
    with `local`), `runs_dir`. What runs: `config` (--config), `sweep` (its YAML), `axes` (hpc.study run's
    --axis, as typed), `overrides` (--set and the training's flags), `training_flags` (the training's own
    flags given, which a user's command refuses), `no_profile`. How: `local`, `dry_run`, `wait`,
    `max_parallel`, `analysis_account` (hpc.study's), `allocation` (the interactive allocation the run
    takes, None: a new job), `resume` (a run directory whose task is submitted again there). `notes`: what
    was chosen for the user, said once the plan holds."""

    nodes: int = 1
    gpus: int | None = None
    time: int | None = None
    name: str | None = None
    options: JobOptions = dataclasses.field(default_factory=JobOptions)
    profile: str | None = None
    runs_dir: str | None = None
    config: str | None = None
    sweep: str | None = None
    axes: tuple[str, ...] = ()
    overrides: tuple[Override, ...] = ()
    training_flags: tuple[str, ...] = ()
    no_profile: bool = False
    local: bool = False
    dry_run: bool = False
    wait: bool = False
    max_parallel: int | None = None
    analysis_account: str | None = None
    allocation: Allocation | None = None
    resume: str | None = None  # --resume RUN: RUN's own task submitted again, in RUN
    notes: tuple[str, ...] = ()

    @property
    def account(self) -> str | None:
        """-A, as given."""
        return self.options.account
