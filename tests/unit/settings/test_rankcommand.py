"""hpc/settings/rankcommand.py: a user's command as what every rank runs: its words filled and checked, a
launcher inside it refused."""

import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpc.core.errors import UsageError
from hpc.settings.rankcommand import check_command, env_for, fill, launcher_in, python_script, words_for


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


# The placeholder grammar under fire (issue 90): templates made of literals, escaped braces, the point's fields
# with format specs (valid and not for their type), repeated and unknown fields, positional fields,
# conversions and stray braces; filled with a sweep point's values. The oracle is Python's own str.format on
# the same values: a template it fills is filled the same, one it refuses is one line, never a traceback.
SPECS = ["", ".2f", "05d", "d", "g", ">6", "x", ".1%", "+", ",", "s", "e", "%", "05.1f", "=+8", "q", "{batch}"]
FIELD = st.sampled_from(["batch", "fraction", "gpus", "nodes", "ranks", "lr", "seed", "unknown", "", "0", "batch.real"])
PIECE = st.one_of(
    st.text(alphabet=string.ascii_letters + string.digits + "-_=/. ", max_size=6),
    st.sampled_from(["{{", "}}", "{", "}"]),
    st.builds(lambda f, s: "{" + f + (":" + s if s else "") + "}", FIELD, st.sampled_from(SPECS)),
    st.builds(lambda f, c: "{" + f + "!" + c + "}", FIELD, st.sampled_from(["r", "s", "a", "z"])),
)


@given(pieces=st.lists(PIECE, max_size=6), fraction=st.sampled_from([1.0, 0.5, 0.1, 0.25]),
       batch=st.integers(1, 4096), lr=st.sampled_from([0.1, 0.001, "1e-3"]), seed=st.integers(0, 99))
def test_a_placeholder_is_filled_as_str_format_fills_it_or_refused_in_one_line(pieces, fraction, batch, lr, seed):
    from hpc.core.rundir import SweepPoint
    from hpc.settings.rankcommand import point_values

    template = "".join(pieces)
    values = point_values(SweepPoint(data_fraction=fraction, batch_size=batch, gpus=2, nodes=1,
                                     values={"lr": lr, "seed": seed}))
    try:
        expected = template.format(**values)
    except (KeyError, IndexError, ValueError, TypeError, AttributeError):
        expected = None
    try:
        got = fill(template, values, "command.args")
    except UsageError as e:
        assert str(e).startswith("command.args: ") and "\n" not in str(e), str(e)
        # refused: what str.format refuses, or what the toolkit does not take: a conversion, an attribute of a
        # field, a spec with a field inside it
        assert expected is None or any(taken_not in template for taken_not in ("!", ".real", ":{")), template
    else:
        assert got == expected, (template, got, expected)


@pytest.mark.parametrize("fraction, spec, filled", [(1.0, "", "1"), (0.5, "", "0.5"), (0.5, ".2f", "0.50"),
                                                    (1.0, ".1%", "100.0%"), (0.25, "g", "0.25")])
def test_a_fraction_fills_as_its_shortest_form_or_its_spec(fraction, spec, filled):
    from hpc.core.rundir import SweepPoint
    from hpc.settings.rankcommand import point_values

    values = point_values(SweepPoint(data_fraction=fraction, batch_size=8, gpus=1, nodes=1))
    assert fill("{fraction" + (":" + spec if spec else "") + "}", values, "s") == filled
    assert str(values["fraction"]) == format(fraction, "g")  # its text anywhere else is the same shortest form


@pytest.mark.parametrize("nodes, gpus", [(1, 4), (2, 4), (3, 2)])
def test_a_points_shape_fills_gpus_a_node_nodes_and_ranks_the_world_size(nodes, gpus):
    """{ranks} is the world size (torchrun's --nproc-per-node x --nnodes), not one node's GPUs."""
    from hpc.core.rundir import SweepPoint
    from hpc.settings.rankcommand import point_values

    values = point_values(SweepPoint(data_fraction=1.0, batch_size=8, gpus=gpus, nodes=nodes))
    assert fill("{gpus} {nodes} {ranks}", values, "s") == f"{gpus} {nodes} {nodes * gpus}"


@pytest.mark.parametrize("word, values, final, said", [
    ("{x", {}, True, "command.args: '{x': expected '}' before end of string (write {{ and }} for braces)"),
    ("{nope}", {}, True, "command.args: '{nope}': no value for {nope} (known: {batch}, {fraction}, {gpus}, {nodes}, "
                         "{ranks}, {run_dir}, {python})"),
    ("--b={batch:q}", {"batch": 8}, True, "command.args: '--b={batch:q}': Unknown format code 'q' for object of type "
                                          "'int'"),
    ("{run_dir}/w.pt", {}, True, "command.args: '{run_dir}/w.pt': no value for {run_dir}"),  # at the rank: needed
])
def test_a_word_that_cannot_be_filled_is_one_line_naming_the_word_and_what_is_known(word, values, final, said):
    with pytest.raises(UsageError) as e:
        fill(word, values, "command.args", final)
    assert str(e.value).startswith(said), str(e.value)
    assert fill("{run_dir}/w.pt", {}, "s", final=False) == "{run_dir}/w.pt"  # planned: filled when the rank starts


@pytest.mark.parametrize("argv, name", [
    (["python", "train.py", "--lr", "0.1"], "train"),
    (["python", "-m", "pkg.sub.train"], "train"),
    (["python3", "-mpkg.mod"], "mod"),
    (["python", "-m", "train"], "train"),  # a module of one part
    (["python", "-m", "pkg."], "command"),  # no last part: no name to take
    (["./run.sh", "x"], "run"),
    (["/usr/bin/env"], "env"),
    ([], "command"),
    (["."], "command"),  # a program with no stem
])
def test_a_jobs_name_is_its_script_its_modules_last_part_or_its_program(argv, name):
    from hpc.settings.rankcommand import job_name

    assert job_name(argv) == name


@pytest.mark.parametrize("argv, script, module", [
    (["python", "-X", "dev", "t.py"], "t.py", None),  # -X and -W take the next word
    (["python", "--check-hash-based-pycs", "always", "t.py"], "t.py", None),
    (["python", "-W"], None, None),  # an option's word missing: no script, no traceback
    (["python", "-m"], None, None),
    (["python", "-u", "-m", "pkg.x"], None, "pkg.x"),
    (["bash", "-m", "x"], None, None),  # not python: neither
    ([], None, None),
])
def test_a_python_commands_script_and_module_as_python_reads_its_options(argv, script, module):
    from hpc.settings.rankcommand import python_module

    assert (python_script(argv), python_module(argv)) == (script, module)


@pytest.mark.parametrize("argv, training, codes", [
    (["hpc-train", "--config", "c.yaml"], True, (3, 5)),
    (["/opt/bin/hpc-train"], True, (3, 5)),
    (["python", "-m", "hpc.train", "--config", "c.yaml"], True, (3, 5)),
    (["python", "train.py"], False, (3,)),
    (["python", "-m", "hpc.training"], False, (3,)),
])
def test_the_toolkits_training_given_as_a_command_keeps_its_requeue_codes(argv, training, codes):
    from hpc.settings.rankcommand import runs_training, user_command

    task = user_command(argv, "/", {"enabled": True}, 60)
    assert runs_training(argv) == training and task.requeue_codes == codes
    assert (task.profiler is None) == training  # it profiles itself: no start-up hook


def test_launchers_of_every_kind_are_named_and_nothing_else():
    assert [launcher_in(a) for a in (["mpiexec", "-n", "2", "python", "t.py"], ["srun", "python", "t.py"],
                                      ["deepspeed", "t.py"], ["python", "-m", "torch.distributed.launch", "t.py"],
                                      [], ["python", "t.py"])] == [
        "mpirun", "mpirun", "deepspeed", "torchrun", None, None]


def test_an_empty_command_is_refused_in_its_whole_line(tmp_path):
    with pytest.raises(UsageError) as e:
        check_command([], tmp_path)
    assert str(e.value) == "command line: --: no command after it (e.g. -- python train.py)"


def test_a_field_kept_for_the_rank_keeps_its_spec_and_a_fraction_prints_as_python_does():
    from hpc.settings.rankcommand import Fraction

    assert fill("{run_dir:>12}/{batch:03d}", {"batch": 8}, "s", final=False) == "{run_dir:>12}/008"
    assert fill(fill("{run_dir:>4}", {}, "s", final=False), {"run_dir": "/r"}, "s") == "  /r"
    assert str(Fraction(1e-5)) == f"{Fraction(1e-5)}" == "1e-05" and f"{Fraction(0.5):.2f}" == "0.50"


def test_a_points_values_fill_its_placeholders_and_a_config_key_is_not_one():
    from hpc.core.rundir import SweepPoint
    from hpc.settings.rankcommand import point_values

    values = point_values(SweepPoint(data_fraction=1.0, batch_size=8, gpus=2, nodes=3,
                                     values={"lr": 0.1, "train.lr": 0.2}))
    assert values == {"batch": 8, "fraction": 1.0, "gpus": 2, "nodes": 3, "ranks": 6, "lr": 0.1}


def test_a_task_is_written_and_read_whole_and_its_unfillable_words_name_where_they_stand():
    import json

    from hpc.core.ending import RankCommand, decode_task, encode_task
    from hpc.settings.rankcommand import training_command, user_command

    task = user_command(["python", "t.py"], "/w", None, 60, args=("{run_dir}/o",), env={"OUT": "{run_dir}/e"})
    written = json.loads(encode_task(task))
    assert written["words"] == ["python", "t.py", "{run_dir}/o"] and type(written["requeue_codes"]) is list
    assert decode_task(json.dumps(written).encode()) == task
    assert training_command({"train": {}}, "/w", "n", 77).stop_grace_s == 77
    broken = RankCommand(("{nope}",), "/w", "n", env={"K": "{gone}"})
    for call, said in ((lambda: words_for(broken, "/r", "py"), "task: '{nope}': no value for {nope}"),
                       (lambda: env_for(broken, "/r"), "command.env.K: '{gone}': no value for {gone}")):
        with pytest.raises(UsageError) as e:
            call()
        assert str(e.value).startswith(said), str(e.value)
