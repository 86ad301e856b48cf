"""hpc/settings/rankcommand.py: a user's command as what every rank runs: its words filled and checked, a
launcher inside it refused."""

import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpc.core.errors import UsageError
from hpc.settings.rankcommand import check_command, fill, launcher_in, python_script


@pytest.mark.parametrize("argv, script", [
    (["python", "train.py", "--lr", "0.1"], "train.py"),
    (["python3.11", "-u", "-W", "ignore", "a/b.py"], "a/b.py"),
    (["/usr/bin/python3", "-m", "pkg.train"], None),
    (["python", "-c", "print(1)"], None),
    (["torchrun", "train.py"], None),
    (["python"], None),
])
def test_the_script_of_a_python_command(argv, script):
    assert python_script(argv) == script


def test_a_command_that_cannot_start_is_one_line_naming_it(tmp_path):
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "data.txt").write_text("")
    check_command(["python3", "train.py"], tmp_path)
    for argv, needle in [([], "no command after it"), (["no-such-program-xyz"], "'no-such-program-xyz': not found on PATH"),
                         (["./data.txt"], "'./data.txt': not an executable file"),
                         (["python3", "missing.py"], "'missing.py': no such script")]:
        with pytest.raises(UsageError) as e:
            check_command(argv, tmp_path)
        assert needle in str(e.value) and "\n" not in str(e.value)
    check_command(["program-in-the-image", "x"], tmp_path, in_image=True)  # found in the image, not here


WORD = st.text(alphabet=string.ascii_letters + string.digits + "-_=/. {}", max_size=24)


@given(literal=st.text(alphabet=string.printable.replace("{", "").replace("}", ""), max_size=40))
def test_a_word_without_fields_is_kept_verbatim(literal):
    assert fill(literal, {"batch": 8}, "s") == literal
    assert fill(fill(literal, {"batch": 8}, "s", final=False), {"run_dir": "/r"}, "s") == literal


@given(batch=st.integers(1, 10**6), run_dir=st.text(alphabet=string.ascii_letters + "/{}", min_size=1, max_size=20),
       prefix=st.text(alphabet=string.ascii_letters + "-=", max_size=8))
def test_a_sweep_word_filled_in_two_stages_is_the_word_filled_at_once(batch, run_dir, prefix):
    """Planned (the point's values) then started (the run directory): the same as both at once, whatever
    the run directory holds (braces included)."""
    word = prefix + "{{x}}{batch}/{run_dir}"
    planned = fill(word, {"batch": batch}, "s", final=False)
    assert fill(planned, {"run_dir": run_dir}, "s") == fill(word, {"batch": batch, "run_dir": run_dir}, "s")
    assert fill(planned, {"run_dir": run_dir}, "s") == f"{prefix}{{x}}{batch}/{run_dir}"


@given(word=WORD)
def test_filling_any_word_either_fills_or_names_the_problem(word):
    try:
        out = fill(word, {"batch": 8, "gpus": 2}, "command.args")
    except UsageError as e:
        assert str(e).startswith("command.args: ") and "\n" not in str(e)
    else:
        assert "{batch}" not in out and "{gpus}" not in out


@pytest.mark.parametrize("argv, instead", [
    (["torchrun", "--nproc-per-node", "2", "train.py"], "set cluster.launcher: torchrun"),
    (["/opt/bin/torchrun", "train.py"], "set cluster.launcher: torchrun"),
    (["python", "-m", "torch.distributed.run", "--standalone", "train.py"], "set cluster.launcher: torchrun"),
    (["python3", "-u", "-mtorch.distributed.launch", "train.py"], "set cluster.launcher: torchrun"),
    (["accelerate", "launch", "train.py"], "ACCELERATE_* variables"),
    (["python", "-m", "accelerate.commands.launch", "train.py"], "ACCELERATE_* variables"),
    (["deepspeed", "train.py"], "deepspeed.init_distributed()"),
    (["mpirun", "-n", "4", "python", "train.py"], "one process per GPU itself"),
    (["srun", "python", "train.py"], "one process per GPU itself"),
])
def test_a_launcher_inside_the_command_is_refused_naming_what_to_write(tmp_path, argv, instead):
    with pytest.raises(UsageError) as e:
        check_command(argv, tmp_path)
    said = str(e.value)
    assert said.startswith(f"command line: -- '{argv[0]}': a launcher inside the command would start one on every "
                           "rank") and instead in said and "\n" not in said
    assert launcher_in(["accelerate", "config"]) is None and launcher_in(["python", "-m", "torch.utils.bottleneck"]) is None
