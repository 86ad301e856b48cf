"""`python -m hpc.train` and `hpc-train`: the door to hpc/training/traincli.py. The stop signals are caught
before that module (and torch: seconds on a loaded node) is imported, so a signal during start-up is a
clean stop, not a kill (hpc/core/stop.py)."""

from hpc.core.stop import StopSignal, exit_now, ignore_after_run


def cli(argv: list[str] | None = None, keep_handlers: bool = False) -> int:
    early = StopSignal.early()  # handed back here if the command ends before a run takes it over
    try:
        from hpc.training.traincli import cli as command_cli

        return command_cli(argv)
    finally:
        if not keep_handlers:  # a process about to end keeps them (ignore_after_run)
            early.restore()


def main() -> None:
    ignore_after_run()
    exit_now(cli(keep_handlers=True))


if __name__ == "__main__":
    main()
