"""`python -m hpc.rank`: the door to hpc/launch/rank/rankcli.py (one rank of your own command), its stop
signals caught before anything else loads: a Slurm time-limit warning that lands while a loaded node is
still starting the runner is a clean stop, not its death (seen: both runners killed by SIGUSR2, exit 140,
no rank started)."""

from hpc.core.stop import StopSignal

StopSignal.early()  # taken over by the runner (run_rank: StopSignal.take), with any signal already caught

from hpc.launch.rank.rankcli import cli, main  # noqa: E402  # after the handlers, on purpose

__all__ = ["cli", "main"]

if __name__ == "__main__":
    raise SystemExit(cli())
