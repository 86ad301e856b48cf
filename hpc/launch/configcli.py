"""`python -m hpc.config`: check config files and print the resolved configuration, and for
jobs/resnet152.sbatch the profile's environment for a job's shape and srun's extra words
(hpc/launch/submission/site.py). The loading itself is hpc/settings/config.py. No torch import."""

from __future__ import annotations

import dataclasses
import shlex
from typing import Any

from hpc.core.cli import Parser, run
from hpc.core.errors import EXIT_OK, ConfigError
from hpc.core.files import dump_yaml
from hpc.launch.submission.site import job_env, shell_words, srun_words
from hpc.settings.config import Layers, load_cluster, load_run_config, parse_override, require_section, set_source
from hpc.settings.schema import RUN_SECTIONS


def print_profile_lines(args: Any) -> int:
    """--exports / --srun-args: what jobs/resnet152.sbatch takes from the profile (hpc/launch/submission/site.py)."""
    if not args.profile:
        raise ConfigError(f"command line: {'--exports' if args.exports else '--srun-args'} needs --profile")
    cluster = load_cluster(args.profile)
    if args.srun_args:
        print(shell_words(srun_words(cluster)), end="")
        return EXIT_OK
    gpus = args.gpus if args.gpus is not None else cluster.gpus_per_node
    for key, value in job_env(cluster, args.nodes, gpus).items():
        print(f'[ -n "${{{key}+x}}" ] || export {key}={shlex.quote(value)}')
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    parser = Parser(
        prog="python -m hpc.config",
        description="Check config files and print the resolved configuration (defaults < YAML < --set).",
    )
    parser.add_argument("--config", help="run config YAML (data/model/train/profiler sections)")
    parser.add_argument("--profile", help="cluster profile: a name in profiles/ or a YAML path")
    parser.add_argument("--sweep", help="sweep YAML (a sweep section plus run sections)")
    parser.add_argument(
        "--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override one value (repeatable)"
    )
    parser.add_argument(
        "--exports",
        action="store_true",
        help="with --profile: print the profile's environment for a job of --nodes x --gpus as shell lines that "
        'keep any value already set (for sbatch scripts: eval "$(python -m hpc.config --profile P --exports)")',
    )
    parser.add_argument("--srun-args", action="store_true", help="with --profile: srun's extra words, one a line")
    parser.add_argument("--nodes", type=int, default=1, help="with --exports: the job's nodes (default 1)")
    parser.add_argument("--gpus", type=int, help="with --exports: its GPUs per node (default: a whole node)")
    args = parser.parse_args(argv)
    if args.exports or args.srun_args:
        return print_profile_lines(args)
    overrides = [(*parse_override(s), set_source(s)) for s in args.set]
    for dotted, _, source in overrides:
        require_section(
            dotted, RUN_SECTIONS + (("cluster",) if args.profile else ()) + (("sweep",) if args.sweep else ()), source
        )
    out: dict[str, Any] = {}
    if args.profile:
        out["cluster"] = dataclasses.asdict(
            load_cluster(args.profile, [o for o in overrides if o[0].startswith("cluster.")])
        )
    run_overrides = [o for o in overrides if not o[0].startswith(("cluster.", "sweep."))]
    if args.sweep:
        layers = Layers().add_file(args.sweep, flag="--sweep")
        for dotted, value, source in overrides:
            if not dotted.startswith("cluster."):
                layers.set(dotted, value, source)
        out["sweep"] = dataclasses.asdict(layers.build("sweep"))
        out.update(layers.run_config().to_dict())
    else:
        out.update(load_run_config(args.config, run_overrides).to_dict())
    print(dump_yaml(out), end="")
    return EXIT_OK


def cli(argv: list[str] | None = None) -> int:
    """The command (`python -m hpc.config`, or its console script): errors as one line, exit 2."""
    return run("hpc.config", main, argv)
