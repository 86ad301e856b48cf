"""The toolkit's errors and exit codes, in one place that imports nothing.

Every command's error path (`hpc.core.cli.run`) catches `HpcError` and turns it into one line on
stderr and the error's `exit_code`: 2 for anything the user gave (a flag, a file, the environment),
1 for a run that cannot go on. The subclasses say what kind of input was wrong:

- `UsageError`: a flag, a path, a file's contents, a job shape;
- `ConfigError`: a configuration value (YAML file, --set, a flag that sets a config key, a profile),
  named with its key, value and where it came from; a kind of UsageError;
- `DistEnvError` / `HostlistError`: launcher variables that contradict each other, or a Slurm hostlist
  Slurm would reject;
- `TraceError`: a profiler trace the analysis cannot read;
- `TrainingError`: the run itself cannot go on (a non-finite loss): exit 1;
- `WriteError`: a file could not be written whole (disk full, read-only, quota); the previous version of
  it is intact and no temp file is left: exit 1;
- `PeerLostError`: another rank of the run died or stopped answering: exit 5, on which torchrun restarts
  the worker group and the sbatch script and hpc.submit's job requeue (the run resumes from its last
  checkpoint);
- `QueueError`: Slurm's controller did not answer (squeue, sbatch, scontrol): exit 1;
- `SchemaError`: a record written by another toolkit's layout (its `schema`), refused by its reader;
- `StoreError`: the run's store cannot be trusted or held (its port taken, a value not sealed with the
  run's secret: hpc/core/meet.py): exit 1, never requeued.
"""

from __future__ import annotations

# Exit codes of every command; jobs/resnet152.sbatch tests for EXIT_PREEMPTED (pinned by a test).
EXIT_OK = 0
EXIT_FAILED = 1  # a job or run failed
EXIT_USAGE = 2  # bad input: one line on stderr, nothing written
EXIT_PREEMPTED = 3  # hpc.train stopped by SIGTERM/SIGUSR2/SIGINT after writing a checkpoint
EXIT_OOM = 4  # hpc.train ran out of CUDA memory: recorded in summary.json as the run's outcome
EXIT_PEER_LOST = 5  # hpc.train lost a peer rank (dead or silent): rerun (requeue, torchrun restart) to resume
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C ended (waiting stopped, jobs run on)
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: the reader of the output went away (`| head`); nothing more is said


class HpcError(Exception):
    """An error a command reports as one line (str() is the message) and exits with `exit_code`."""

    exit_code = EXIT_USAGE


class UsageError(HpcError, ValueError):
    """Bad input: a flag, a path, a file's contents, a job shape the cluster cannot run."""


class NoArguments(UsageError):
    """A command that acts was given no arguments: str() is its usage, printed as it is (exit 2)."""


class SchemaError(UsageError):
    """A record of a layout this toolkit does not read (a later toolkit's file): said, unlike a cut one."""


class ConfigError(UsageError):
    """A bad configuration value; the message names the key, the value and where it came from."""


class DistEnvError(HpcError, ValueError):
    """Launcher variables (torchrun, srun, submitit) that contradict each other or are incomplete."""


class HostlistError(HpcError, ValueError):
    """A Slurm hostlist expression Slurm would reject."""


class TraceError(HpcError, ValueError):
    """A profiler trace that cannot be analysed; str() says why (truncated, not a trace, ...)."""


class TrainingError(HpcError, RuntimeError):
    """The run cannot go on (a non-finite loss...): one line, exit 1."""

    exit_code = EXIT_FAILED


class WriteError(HpcError, OSError):
    """A file could not be written whole: str() names it and the cause; its previous version is intact."""

    exit_code = EXIT_FAILED


class PeerLostError(HpcError, RuntimeError):
    """A collective failed because another rank died or stopped answering: str() names it and the step."""

    exit_code = EXIT_PEER_LOST


class QueueError(HpcError, RuntimeError):
    """Slurm's controller could not be asked (squeue, sbatch, scontrol failed or timed out)."""

    exit_code = EXIT_FAILED


class StoreError(HpcError, RuntimeError):
    """The run's store cannot be trusted or held: its port taken, no secret, a value another wrote."""

    exit_code = EXIT_FAILED
