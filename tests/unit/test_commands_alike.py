"""Every command behaves alike (issue 28): `--help` is its own usage and exit 0, a command that acts given
no arguments prints its usage and exits 2, flags are never abbreviated, a mistyped flag, key or
subcommand gets a "did you mean", and the console scripts name themselves in their usage."""

import contextlib
import re
import io
import subprocess
import sys
from pathlib import Path

import pytest

from commands import call, entry

BIN = Path(sys.executable).parent
# (module, argv before --help, how its usage names it)
HELPS = [
    ("hpc.train", [], "python -m hpc.train"),
    ("hpc.submit", [], "python -m hpc.submit"),
    ("hpc.study", ["run"], "python -m hpc.study run"),
    ("hpc.study", ["status"], "python -m hpc.study status"),
    ("hpc.study", ["resubmit"], "python -m hpc.study resubmit"),
    ("hpc.config", [], "python -m hpc.config"),
    ("hpc.data", [], "python -m hpc.data"),
    ("hpc.data", ["synth"], "python -m hpc.data synth"),
    ("hpc.distenv", [], "python -m hpc.distenv"),
    ("hpc.bench", [], "python -m hpc.bench"),
    ("hpc.rank", [], "python -m hpc.rank"),
    ("hpc.batch", [], "python -m hpc.batch"),
    ("analysis", [], "python -m analysis"),
    ("analysis", ["compare"], "python -m analysis compare"),
    ("hpc.job", [], "python -m hpc.job"),
    ("hpc.job", ["log"], "python -m hpc.job log"),
    ("analysis.bench.speed", [], "python -m analysis.bench.speed"),
    ("analysis.tensorboard", [], "python -m analysis.tensorboard"),
]


def helped(module: str, argv: list[str]) -> tuple[int, str]:
    """(exit code, stdout) of `module argv --help`, run in-process as its console script runs it."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            code = entry(module)([*argv, "--help"])
        except SystemExit as e:  # argparse's --help: printed, then exit 0
            code = e.code
    return code, out.getvalue()


@pytest.mark.parametrize("module, argv, prog", HELPS, ids=[" ".join([m, *a]) for m, a, _ in HELPS])
def test_help_is_the_commands_own_usage_and_exit_0(module, argv, prog):
    code, out = helped(module, argv)
    assert code == 0 and out.startswith(f"usage: {prog} "), out[:300]


def test_the_study_command_helps_with_its_subcommands(capsys):
    outcome = call("hpc.study", ["--help"])
    assert outcome.code == 0 and "python -m hpc.study run|status|resubmit" in outcome.stdout


ACTING = [("hpc.train", "python -m hpc.train"), ("hpc.submit", "python -m hpc.submit"),
          ("hpc.data", "python -m hpc.data"), ("analysis", "python -m analysis"), ("hpc.rank", "python -m hpc.rank"),
          ("hpc.batch", "python -m hpc.batch"), ("analysis.tensorboard", "python -m analysis.tensorboard")]


@pytest.mark.parametrize("module, prog", ACTING)
def test_a_command_that_acts_given_nothing_prints_its_usage_and_exits_2(module, prog):
    """`python -m hpc.submit` alone submitted a ResNet152 job; `hpc.train` alone failed on a data root."""
    outcome = call(module, [])
    assert outcome.code == 2 and outcome.stdout == ""
    assert outcome.stderr.startswith(f"usage: {prog} ") and outcome.lines[-1] == \
        f"{prog}: no arguments given (see {prog} --help)"


def test_subcommands_given_nothing_print_their_usage_too():
    outcome = call("hpc.study", [])
    assert outcome.code == 2 and outcome.lines[0].startswith("usage: python -m hpc.study {run,status,resubmit,cancel}")
    # issue 90: the command names itself as it is typed, not `python`
    assert outcome.lines[1] == "python -m hpc.study: no command given (see python -m hpc.study --help)"
    job = call("hpc.job", [])
    assert job.code == 2 and job.lines[0].startswith("usage: python -m hpc.job ")
    assert call("hpc.study", ["status"]).lines[0].startswith("usage: python -m hpc.study status ")
    compare = call("analysis", ["compare"])
    assert compare.code == 2 and compare.lines[0].startswith("usage: python -m analysis compare ")


@pytest.mark.parametrize("command, sub", [("analysis", "compare"), ("hpc.study", "cancel"), ("hpc.study", "resubmit"),
                                          ("hpc.job", "log"), ("hpc.job", "status"), ("hpc.job", "cancel")])
def test_every_subcommand_shows_in_its_commands_help(command, sub):
    """Issue 90: `python -m analysis --help` showed only `path [other]`, not its compare."""
    code, out = helped(command, [])
    assert code == 0 and re.search(rf"\b{sub}\b", out), out


def test_flags_are_never_abbreviated_and_a_mistyped_one_gets_a_suggestion():
    outcome = call("hpc.submit", ["--gpu", "2", "--dry-run"])  # argparse took it for --gpus before
    assert outcome.code == 2 and len(outcome.lines) == 1
    assert "unrecognized arguments: --gpu 2; did you mean --gpus?" in outcome.lines[0]


def test_a_mistyped_key_or_subcommand_gets_a_suggestion_in_a_short_line():
    key = call("hpc.config", ["--set", "train.bach_size=3"])
    assert key.code == 2 and len(key.lines) == 1 and len(key.lines[0]) < 160
    assert key.lines[0].endswith("unknown key train.bach_size; did you mean batch_size?")
    far = call("hpc.config", ["--set", "train.zzz=3"])
    assert "python -m hpc.config [--profile P] prints every key" in far.lines[0] and len(far.lines[0]) < 160
    sub = call("hpc.study", ["stauts"])
    assert sub.code == 2 and sub.lines[0].endswith("did you mean status?")


@pytest.mark.parametrize("script, usage", [("hpc-study", "usage: hpc-study run "), ("hpc-analysis", "usage: hpc-analysis ")])
def test_console_scripts_name_themselves(script, usage):
    argv = [str(BIN / script), *(["run"] if script == "hpc-study" else []), "--help"]
    if not Path(argv[0]).exists():
        pytest.skip(f"{argv[0]} is not installed (pip install -e . installs the console scripts)")
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith(usage), out.stdout[:200] + out.stderr[-500:]


@pytest.mark.parametrize("module, argv, prog", [h for h in HELPS if h[:2] != ("hpc.study", [])],
                         ids=[" ".join([m, *a]) for m, a, _ in HELPS if (m, a) != ("hpc.study", [])])
def test_help_is_whole(module, argv, prog, monkeypatch):
    """Every description ends a sentence (hpc.batch's once stopped at "here, once:"), and every argument
    says what it is (hpc.study status's SWEEP_DIR once said nothing): read from the parser --help prints."""
    import argparse

    shown = []
    original = argparse.ArgumentParser.print_help
    monkeypatch.setattr(argparse.ArgumentParser, "print_help",
                        lambda self, file=None: (shown.append(self), original(self, file))[1])
    helped(module, argv)
    (parser,) = shown
    assert (parser.description or "").rstrip().endswith((".", ")")), (module, argv, parser.description)
    silent = [a.dest for a in parser._actions if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
              and a.help != argparse.SUPPRESS and not a.help]
    assert not silent, (module, argv, silent)
