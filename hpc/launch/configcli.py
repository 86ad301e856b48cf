"""`python -m hpc.config`: check config files and print the resolved configuration, and for
jobs/resnet152.sbatch the profile's environment for a job's shape and srun's extra words
(hpc/launch/submission/site.py). The loading itself is hpc/settings/config.py. No torch import."""

from __future__ import annotations

import dataclasses
import shlex
from typing import Any

from hpc.core.cli import Parser, run, suggestion
from hpc.core.errors import EXIT_OK, ConfigError
from hpc.core.files import dump_yaml
from hpc.launch.submission.sbatchflags import profile_flags
from hpc.launch.submission.site import job_env, shell_words, srun_words
from hpc.settings.config import Layers, load_cluster, load_run_config, parse_override, require_section, set_source
from hpc.settings.reference import VARIABLES, KeyDoc, key_docs
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


def explained(docs: list[KeyDoc], wanted: str) -> list[KeyDoc]:
    """The keys `--explain` names: all, a section's, or one; else one line with the nearest key."""
    if wanted == "all":
        return docs
    chosen = [d for d in docs if d.key == wanted or d.key.startswith(wanted + ".")]
    if not chosen:
        raise ConfigError(f"command line: --explain {wanted}: no such key{suggestion(wanted, [d.key for d in docs])}")
    return chosen


def all_key_docs() -> list[KeyDoc]:
    """Every key with every flag that sets it, hpc.submit's sbatch options for the profile's included."""
    return key_docs({**profile_flags(), "cluster.gpus_per_node": ("--gpus", "--gpus-per-node")})


def print_explained(docs: list[KeyDoc]) -> None:
    for d in docs:
        flags = " ".join(d.flags)
        print(f"{d.key}: {d.type} (default {d.default})" + (f"; set by {flags}" if flags else ""))
        print(f"    {d.meaning}")


def print_variables() -> None:
    width = max(map(len, VARIABLES))
    for name, v in VARIABLES.items():
        print(
            f"{name:<{width}}  set by {v.set_by:<11}  {v.meaning}"
            + (f" (default {v.default})" if v.default != "-" else "")
        )


def reference_markdown() -> str:
    """docs/reference.md: every key and every HPC_* variable, made from the code (a test holds the file to it)."""
    lines = [
        "# Reference: every config key and environment variable",
        "",
        "Made by `python -m hpc.config --reference` from the schema (hpc/settings/schema.py, cluster.py: each "
        "key's comment is its meaning) and hpc/settings/reference.py; a test holds this file to it. A key is set "
        "by a `--config` YAML's section, `--set section.key=value`, or the flags named.",
    ]
    section = ""
    for d in all_key_docs():
        if d.key.split(".")[0] != section:
            section = d.key.split(".")[0]
            lines += ["", f"## `{section}`", "", "| key | type | default | set by | meaning |", "|---|---|---|---|---|"]
        flags = ", ".join(f"`{f}`" for f in d.flags) or "-"
        lines.append(f"| `{d.key}` | {d.type} | `{d.default}` | {flags} | {cell(d.meaning)} |")
    lines += ["", "## Environment variables", "", "| variable | set by | meaning | default |", "|---|---|---|---|"]
    for name, v in VARIABLES.items():
        lines.append(f"| `{name}` | {v.set_by} | {cell(v.meaning)} | {cell(v.default)} |")
    return "\n".join(lines) + "\n"


def cell(text: str) -> str:
    return text.replace("|", "\\|")


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
    parser.add_argument(
        "--explain",
        nargs="?",
        const="all",
        metavar="KEY",
        help="what each key means, its type, default and the flags that set it (a key, a section, or all)",
    )
    parser.add_argument("--variables", action="store_true", help="every HPC_* environment variable, and its meaning")
    parser.add_argument("--reference", action="store_true", help="both, as Markdown (docs/reference.md)")
    args = parser.parse_args(argv)
    if args.exports or args.srun_args:
        return print_profile_lines(args)
    if args.explain is not None:
        print_explained(explained(all_key_docs(), args.explain))
        return EXIT_OK
    if args.variables or args.reference:
        print_variables() if args.variables else print(reference_markdown(), end="")
        return EXIT_OK
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
