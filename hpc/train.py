"""`python -m hpc.train`: the door to hpc/training/traincli.py, stop signals caught before torch loads."""

from hpc.core.logs import quiet_torch_cpp
from hpc.core.stop import StopSignal, exit_now, ignore_after_run


def cli(argv: list[str] | None = None, keep_handlers: bool = False) -> int:
    quiet_torch_cpp()  # read by torch's C++ core as it loads (hpc/core/logs.py)
    early = StopSignal.early()  # a signal in start-up is a clean stop; handed back if no run takes it over
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
