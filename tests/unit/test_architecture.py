"""The shape of the code, checked: a leaf core, every import pointing down a floor (core, a run's
description, training and analysis, the launcher, the doors), a torch-free launcher, no import cycle (function-level imports counted), small functions, no class cut in two, errors and
exit codes in one place, each package's docstring a map of its room, the README's map of the tree. Read from the source with `ast`: nothing here runs the code it checks."""

import ast
import re
from pathlib import Path


from hpc.core import errors

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("hpc", "analysis")
MAX_FUNCTION_LINES = 60
DOORS = ("train", "submit", "study", "config", "data", "distenv", "rank", "batch")  # python -m hpc.<door>


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}


def imports(path: Path, module_level_only: bool = False) -> set[str]:
    """The project modules `path` imports (`from hpc.training import data` is hpc.training.data)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name in MODULES and name.split(".")[0] in PACKAGES}


def test_the_core_is_a_leaf():
    for name, path in MODULES.items():
        if name.startswith("hpc.core"):
            assert all(dep.startswith("hpc.core") for dep in imports(path)), (name, imports(path))


# The floors, bottom up (the README's map, tests/README.md): the core; a run's description; the training
# half and the analysis side by side; the launcher; the commands' doors (hpc/<door>.py).
FLOORS = {"hpc.core": 0, "hpc.settings": 1, "hpc.placement": 1, "hpc.training": 2, "analysis": 2, "hpc.launch": 3}


def floor(name: str) -> tuple[int, str]:
    """(floor, package) of a module: hpc.<door> and the hpc package itself are the top floor."""
    for prefix, level in FLOORS.items():
        if name == prefix or name.startswith(prefix + "."):
            return level, prefix
    return len(set(FLOORS.values())), "hpc"


def upward_imports(modules: dict[str, Path]) -> list[str]:
    """Imports (function-local ones too) that do not point down a floor, other than within a package."""
    found = []
    for name, path in modules.items():
        level, package = floor(name)
        for dep in sorted(imports(path)):
            dep_level, dep_package = floor(dep)
            if dep_package != package and dep_level >= level:
                found.append(f"{name} -> {dep}")
    return found


def test_every_import_points_down_a_floor():
    assert not upward_imports(MODULES), upward_imports(MODULES)


def test_the_launcher_reaches_the_analysis_through_its_one_entry():
    for name, path in MODULES.items():
        if floor(name)[0] > FLOORS["analysis"]:
            seen = {dep for dep in imports(path) if dep.startswith("analysis")}
            assert seen <= {"analysis.api"}, (name, seen)


def test_the_floor_check_sees_a_function_local_import_up(tmp_path):
    up = tmp_path / "up.py"
    up.write_text("def f():\n    from hpc.launch.submission.plan import plan_points\n")
    side = tmp_path / "side.py"
    side.write_text("import analysis.measure.trace\n")
    assert upward_imports({"hpc.training.up": up}) == ["hpc.training.up -> hpc.launch.submission.plan"]
    assert upward_imports({"hpc.training.side": side}) == ["hpc.training.side -> analysis.measure.trace"]
    assert upward_imports({"hpc.launch.down": side}) == []


# The analysis's stages in the order they run (analysis/__init__.py): each imports only earlier ones. The
# records every stage passes on are the ground; pipeline.py (which attaches the verdicts above the stages),
# api.py and the commands stand on top.
ANALYSIS_STAGES = ("analysis.records", "analysis.read", "analysis.measure", "analysis.runs", "analysis.explain",
                   "analysis.report")


def stage(name: str) -> int:
    """A module's place in the analysis's pipeline: the index of its stage, the top past the last."""
    return next((i for i, prefix in enumerate(ANALYSIS_STAGES) if name == prefix or name.startswith(prefix + ".")),
                len(ANALYSIS_STAGES))


def imports_against_the_pipeline(modules: dict[str, Path]) -> list[str]:
    """Imports (function-local ones too) from a stage of the analysis into a later one."""
    return [f"{name} -> {dep}" for name, path in modules.items() if name.startswith("analysis")
            for dep in sorted(imports(path)) if dep.startswith("analysis") and stage(dep) > stage(name)]


def test_the_analysis_imports_follow_its_pipeline():
    """Issue 73: read -> measure -> runs -> explain -> report, verdicts attached above (pipeline.py)."""
    assert not imports_against_the_pipeline(MODULES), imports_against_the_pipeline(MODULES)
    assert [stage(m) for m in ("analysis.read.discover", "analysis.explain.verdict", "analysis.pipeline",
                               "analysis.api")] == [1, 4, 6, 6]


def test_the_pipeline_check_sees_a_stage_calling_up(tmp_path):
    up = tmp_path / "up.py"
    up.write_text("def f():\n    from analysis.explain.verdict import judge\n")
    assert imports_against_the_pipeline({"analysis.measure.trace": up}) == [
        "analysis.measure.trace -> analysis.explain.verdict"]
    assert imports_against_the_pipeline({"analysis.pipeline": up}) == []  # the top may
    assert imports_against_the_pipeline({"analysis.report.tables": up}) == []  # a later stage may


def test_the_launcher_never_imports_the_torch_half_at_module_level():
    for name, path in MODULES.items():
        if name.startswith("hpc.launch") or name in ("hpc.submit", "hpc.study", "hpc.config", "hpc.distenv"):
            top = imports(path, module_level_only=True)
            assert not {dep for dep in top if dep.startswith("hpc.training")}, (name, top)
            tree = ast.parse(path.read_text())
            names = {a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names}
            names |= {n.module for n in tree.body if isinstance(n, ast.ImportFrom) and n.module}
            assert not {n for n in names if n == "torch" or n.startswith("torch.")}, (name, names)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle in the graph, as the modules along it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if dep not in state and (found := visit(dep)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle_counting_function_level_imports():
    graph = {name: imports(path) - {name} for name, path in MODULES.items()}
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_functions_are_small():
    """Functions, not modules: a module is split by meaning (a long file of one concept is fine; a class
    is never cut in two), which test_no_class_is_cut_in_two holds."""
    too_long = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long.append(f"{name}.{node.name}: {length} lines")
    assert not too_long, too_long


def test_no_class_is_cut_in_two():
    """A class whose bases are the project's own is one idea split over two files (as `Trainer(Loop)` was):
    only the core's error family and typed records may extend a project class."""
    classes = {n.name: name for name, path in MODULES.items() for n in ast.walk(ast.parse(path.read_text()))
               if isinstance(n, ast.ClassDef)}
    split = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for base in node.bases:
                    base_name = getattr(base, "id", getattr(base, "attr", ""))
                    home = classes.get(base_name)
                    if home and home != name and not base_name.endswith(("Error", "Exception")):
                        split.append(f"{name}.{node.name}({base_name} of {home})")
    assert not split, split


def test_the_doors_only_hand_over():
    for door in DOORS:
        path = REPO / "hpc" / f"{door}.py"
        assert path.read_text().count("\n") <= 25, door
        deps = imports(path)
        assert deps and all(d.startswith(("hpc.launch", "hpc.training", "hpc.settings", "hpc.placement", "hpc.core")) for d in deps), (door, deps)


def test_errors_are_one_family_defined_in_the_core():
    public = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and (node.name.endswith("Error") or node.name.endswith("Exception")):
                if not node.name.startswith("_") and name != "hpc.core.errors":
                    public.append(f"{name}.{node.name}")
    assert not public, f"public error classes outside hpc/core/errors.py: {public}"
    kinds = [v for v in vars(errors).values() if isinstance(v, type) and issubclass(v, Exception)]
    assert len(kinds) >= 7 and all(issubclass(k, errors.HpcError) for k in kinds)


def test_exit_codes_are_defined_once_and_the_sbatch_scripts_hold_no_rule_of_their_own():
    """The exit codes live in hpc/core/errors.py; the requeue rule and its one executor in
    hpc/launch/requeue.py, which both batch shells run after their step; the sbatch scripts hand
    over to that batch shell and hold no exit code, requeue or launch of their own (issue 50); their warning
    is the job's own signal to that batch shell (issue 87)."""
    from hpc.settings.rankcommand import TRAINING_REQUEUE_CODES

    for name, path in MODULES.items():
        if name != "hpc.core.errors":
            assert not re.search(r"^EXIT_\w+\s*=", path.read_text(), re.M), name
    assert TRAINING_REQUEUE_CODES == (errors.EXIT_PREEMPTED, errors.EXIT_PEER_LOST)  # both resume from a checkpoint
    for script in ("resnet152.sbatch", "run.sbatch"):
        code = [line for line in (REPO / "jobs" / script).read_text().splitlines() if not line.startswith("#")]
        assert code[-1].startswith("exec python -m hpc.batch "), script
        assert not [w for w in ("srun", "scontrol", "EXIT_", "torch.distributed.run", "trap") if w in "\n".join(code)]
        assert "#SBATCH --signal=B:USR2@180" in (REPO / "jobs" / script).read_text().splitlines(), script
    # one requeue executor (issue 73): the rule applied and `scontrol requeue` run in hpc/launch/requeue.py
    # alone, which every job's batch shell (hpc/launch/batch.py run_job: hpc.batch and submitit's BatchJob) calls
    for needle in ("may_requeue(", '"scontrol", "requeue"'):
        assert {name for name, path in MODULES.items() if needle in path.read_text()} == {"hpc.launch.requeue"}
    assert {name for name, path in MODULES.items() if "requeue_after_step(" in path.read_text()} == {
        "hpc.launch.batch", "hpc.launch.requeue"}


def test_a_command_line_is_a_typed_value_past_its_entry_modules():
    """Issue 73: argparse's Namespace is read where a command line is parsed (its entry module, the flags'
    own modules); the plan and its points take a SubmitRequest and never read a flag by its name."""
    typed = {name for name, path in MODULES.items() if name.startswith(("hpc.launch", "hpc.settings"))
             and "argparse.Namespace" in path.read_text()}
    assert typed == {"hpc.launch.submission.submit", "hpc.launch.submission.sbatchflags", "hpc.settings.flags"}, typed
    for name in ("hpc.launch.submission.plan", "hpc.launch.submission.points"):
        text = MODULES[name].read_text()
        assert "argparse" not in text and "request: SubmitRequest" in text, name


def test_the_fault_hook_is_parsed_in_one_place():
    for name, path in MODULES.items():
        text = path.read_text()
        if name != "hpc.core.faults":
            assert not re.search(r"""environ(\.get)?[\[(]["']HPC_FAULT_INJECT""", text), name


def test_the_tests_stand_ins_live_with_the_tests():
    """Issue 60: what a test stands in for (graph capture on a CPU, NCCL's files on a cluster without NCCL)
    is the tests' (tests/standins, files a test writes): no stand-in class or replay variable in the package."""
    for name, path in MODULES.items():
        text = path.read_text()
        assert not re.search(r"class \w*StandIn\w*\(|_REPLAY\b", text), name
        # issue 73: through one seam the tests own (HPC_GRAPH_CAPTURE): no product type has a stand_in field,
        # no product module names the tests' module
        assert not re.search(r"\bstand_?in\b|graphstandin|graph-standin", text, re.IGNORECASE), name
    assert (REPO / "tests" / "standins" / "graphstandin.py").is_file()


def test_the_run_directory_files_are_named_in_the_core():
    """Each file of the run and sweep directories is spelled in hpc/core/rundir.py and nowhere else."""
    names = ("summary.json", "metrics.jsonl", "index.json", "config.yaml", "study.json", "sweep.yaml", "last.pt")
    for name, path in MODULES.items():
        if name == "hpc.core.rundir":
            continue
        code = [n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant)
                and isinstance(n.value, str) and not n.value.startswith(("\n", " ")) and len(n.value) < 60]
        assert not [c for c in code if c in names], (name, [c for c in code if c in names])


MAX_MODULES_IN_A_ROOM = 15
ROOM_ENTRY = re.compile(r"(?<![\w/.])(\w+(?:\.py|/))(?![\w/])")  # `name.py` or `name/`, not a longer path


def room_entries(folder: Path) -> set[str]:
    """A package folder's modules (`x.py`) and folders (`x/`), as a map of it names them."""
    return ({p.name for p in folder.glob("*.py") if p.name != "__init__.py"}
            | {f"{p.name}/" for p in folder.iterdir() if p.is_dir() and p.name != "__pycache__"})


def room_map_errors(folder: Path) -> list[str]:
    """What the package's docstring gets wrong about its folder: entries left out, and names of nothing."""
    named = set(ROOM_ENTRY.findall(ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""))
    there = room_entries(folder)
    return [f"{folder.name}: {e} not in its map" for e in sorted(there - named)] + [
        f"{folder.name}: its map names {e}, which is not there" for e in sorted(named - there)]


PACKAGE_FOLDERS = sorted({p.parent for pkg in PACKAGES for p in (REPO / pkg).rglob("__init__.py")})


def test_each_package_docstring_is_its_rooms_map():
    errors = [e for folder in PACKAGE_FOLDERS for e in room_map_errors(folder)]
    assert not errors, errors


def test_no_room_holds_more_than_fifteen_modules():
    crowded = {str(f.relative_to(REPO)): n for f in PACKAGE_FOLDERS
               if (n := len([p for p in f.glob("*.py") if p.name != "__init__.py"])) > MAX_MODULES_IN_A_ROOM}
    assert not crowded, crowded


def test_the_room_map_check_sees_a_module_left_out_and_a_name_of_nothing(tmp_path):
    room = tmp_path / "room"
    (room / "sub").mkdir(parents=True)
    (room / "a.py").write_text("")
    (room / "__init__.py").write_text('"""- a.py: here; sub/: a room; hpc/core/x.py is elsewhere."""\n')
    assert room_map_errors(room) == []
    (room / "b.py").write_text("")
    (room / "__init__.py").write_text('"""- a.py, gone.py; sub/."""\n')
    assert room_map_errors(room) == ["room: b.py not in its map", "room: its map names gone.py, which is not there"]


def test_the_developers_readme_names_every_room():
    readme = (REPO / "tests" / "README.md").read_text()
    section = readme.split("## What is where", 1)[1].split("\n## ", 1)[0]
    rooms = {str(f.relative_to(REPO)) for f in PACKAGE_FOLDERS}
    assert not {r for r in rooms if f"{r}/" not in section}, sorted(r for r in rooms if f"{r}/" not in section)


def attributes_set_outside_init(cls: ast.ClassDef) -> set[str]:
    """Attributes a class's methods assign (self.x = ...) that its __init__ does not."""
    def assigned(fn: ast.AST) -> set[str]:
        out = set()
        for node in ast.walk(fn):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, (ast.AnnAssign, ast.AugAssign)) else []
            for t in targets:
                for leaf in ast.walk(t):
                    if isinstance(leaf, ast.Attribute) and isinstance(leaf.value, ast.Name) and leaf.value.id == "self":
                        out.add(leaf.attr)
        return out

    methods = [n for n in cls.body if isinstance(n, ast.FunctionDef)]
    init = next((m for m in methods if m.name == "__init__"), None)
    fields = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    in_init = (assigned(init) if init else set()) | fields
    return {a for m in methods if m.name != "__init__" for a in assigned(m)} - in_init


def test_no_attribute_is_first_set_outside_init():
    late = {}
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and (found := attributes_set_outside_init(node)):
                late[f"{name}.{node.name}"] = sorted(found)
    assert not late, late


OUTPUT_FUNCTIONS = re.compile(r"^(main|cli|run|fail|echo|print_\w+|\w+_command)$")  # what a command prints


def prints_outside_output_functions(path: Path) -> list[str]:
    """`print(` calls not inside a function whose job is the command's output (its name says so)."""
    found = []

    def visit(node: ast.AST, owner: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else owner
            if isinstance(child, ast.Call) and getattr(child.func, "id", "") == "print":
                if owner is None or not OUTPUT_FUNCTIONS.match(owner):
                    found.append(f"{path.relative_to(REPO)}:{child.lineno} in {owner}")
            visit(child, name)

    visit(ast.parse(path.read_text()), None)
    return found


def test_print_only_in_the_commands_output_functions():
    """Everything else a command says goes through logging, so --log-level turns it up or down."""
    found = [line for path in MODULES.values() for line in prints_outside_output_functions(path)]
    assert not found, found


def test_one_logger_per_module_named_after_it():
    for name, path in MODULES.items():
        if name == "hpc.core.logs":  # the set-up, which configures the roots
            continue
        calls = [n for n in ast.walk(ast.parse(path.read_text()))
                 if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "getLogger"
                 and not (n.args and isinstance(n.args[0], ast.Constant)  # another library's, set up here
                          and not str(n.args[0].value).startswith(PACKAGES))]
        assert len(calls) <= 1, name
        assert all(len(c.args) == 1 and getattr(c.args[0], "id", "") == "__name__" for c in calls), name


STARTUP_HOOK_MODULES = ("autoprofile.py", "scriptoom.py", "scriptaccelerate.py", "steptimes.py")  # loaded in every process of a command: torch only once the script has it


def test_the_torch_half_is_typed_with_torchs_types():
    """`Any` in hpc/training only where a value is truly open (JSON payloads' dict[str, Any] aside), each
    with its reason on the line; torch imported at the top, not inside functions (lazy imports stay for
    torchvision, TensorBoard and torch's private memory profiler, each heavy or optional; and in the
    start-up hook's modules, loaded at start-up in every Python process of a user's command, torch is
    imported only once the user's script has imported it)."""
    open_any, local_torch = [], []
    for path in sorted((REPO / "hpc" / "training").rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            bare = re.sub(r"(dict|Mapping)\[str, Any\]", "", line)
            if re.search(r"\bAny\b", bare) and not bare.lstrip().startswith(("from typing", "#")):
                open_any.append(f"{path.name}:{n}")
                assert "#" in line, f"{path.name}:{n}: an open value says why: {line.strip()}"
            if re.match(r"\s+(import torch\b|from torch\b)", line) and "_memory_profiler" not in line \
                    and "tensorboard" not in line and path.name not in STARTUP_HOOK_MODULES:
                local_torch.append(f"{path.name}:{n}")
    assert len(open_any) < 15, open_any
    assert not local_torch, local_torch


UNIT_ROOMS = ("core", "settings", "placement", "training", "launch", "analysis")  # the floors' packages
SPANNING = {"test_architecture.py", "test_bad_input.py", "test_commands_alike.py", "test_properties_commands.py",
            "test_properties_files.py", "test_shared_machine_parts.py", "test_study_targets.py", "test_tiers.py"}


def test_unit_tests_are_laid_out_like_the_packages():
    """A package's unit tests live in tests/unit/<its name>/; at the top only what spans the packages."""
    unit = REPO / "tests" / "unit"
    top = {p.name for p in unit.glob("test_*.py")}
    assert top <= SPANNING, sorted(top - SPANNING)
    rooms = {p.name for p in unit.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert rooms == set(UNIT_ROOMS), rooms
    assert all(any((unit / room).glob("test_*.py")) for room in UNIT_ROOMS)


# Every word of hpc/core/ending.py's vocabulary: how a rank ended, how a run ended, a point's state (issue 73)
STATE_WORDS = {"running", "ok", "stopped", "oom", "failed", "killed", "interrupted", "peer", "lost", "done",
               "preempted", "cancelled", "pending", "requeued", "timeout", "missing", "unknown", "unfinished"}
# The same letters with another meaning, each named with it: not a state
OTHER_MEANINGS = {
    ("hpc.training.inject", "oom"): "a fault's kind (HPC_FAULT_INJECT's grammar)",
    ("hpc.training.graph.graphcheck", "failed"): "the graph check's result",
    ("hpc.training.checkpoint", "missing"): "a checkpoint's key, absent",
    ("hpc.training.traincli", "ok"): "the text of a probe file",
    ("hpc.training.memcat", "unknown"): "torch's memory category",
    ("analysis.explain.verdict", "unknown"): "a bound the evidence does not name",
    ("analysis.measure.collective", "unknown"): "a collective of no known kind",
    ("analysis.bench.speed", "failed"): "a benchmark's line when its child said nothing",
}


def state_words_spelled(text: str) -> list[str]:
    """The string constants of `text` that are state words, but for field names: a dict's key, a subscript,
    `.get`'s or `.setdefault`'s key, the left of `in` (a record's "oom" field is not the oom state)."""
    tree = ast.parse(text)
    fields: set[int] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Dict):
            fields |= {id(k) for k in n.keys if k is not None}
        elif isinstance(n, ast.Subscript):
            fields.add(id(n.slice))
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("get", "setdefault"):
            fields |= {id(a) for a in n.args[:1]}
        elif isinstance(n, ast.Compare) and isinstance(n.ops[0], (ast.In, ast.NotIn)):
            fields.add(id(n.left))
        elif isinstance(n, ast.For) and isinstance(n.iter, ast.Tuple):  # `for key in ("config", "oom")`
            fields |= {id(e) for e in n.iter.elts}
    return [n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and n.value in STATE_WORDS and id(n) not in fields]


def test_every_state_is_spelled_in_one_module():
    """Issue 73: the states' words (hpc/core/ending.py RankEnd, Outcome, PointState; Slurm's table with them)
    spelled nowhere else as strings: every writer and reader (runner, job, batch shell, follower, status,
    study, analysis) names them through the enums; the same letters meaning another thing are listed."""
    from hpc.core.ending import Outcome, PointState, RankEnd

    assert STATE_WORDS == {str(w) for w in (*RankEnd, *Outcome, *PointState)}
    spelled = {(name, word) for name, path in MODULES.items() if name != "hpc.core.ending"
               for word in state_words_spelled(path.read_text())}
    assert spelled == set(OTHER_MEANINGS), sorted(spelled ^ set(OTHER_MEANINGS))


def test_slurm_state_words_are_spelled_in_one_module():
    """Slurm's job states (CANCELLED, TIMEOUT, ...) are read through ending.py's one table and its
    SLURM_CANCELLED; no other module spells one."""
    from hpc.core.ending import SLURM_STATES

    spelled = {name: found for name, path in MODULES.items() if name != "hpc.core.ending"
               if (found := [n.value for n in ast.walk(ast.parse(path.read_text()))
                             if isinstance(n, ast.Constant) and n.value in SLURM_STATES])}
    assert not spelled, spelled


def test_the_spelling_check_sees_a_word_spelled_by_hand():
    assert state_words_spelled('if record.get("kind") == "interrupted": pass') == ["interrupted"]
    assert state_words_spelled('x = "stopped by signal, checkpoint written"') == []
    assert state_words_spelled('state = "pending" if queued else "missing"') == ["pending", "missing"]
    # a record's field of the same letters is not a state
    assert state_words_spelled('f = {"oom": 1}; r["failed"]; r.get("oom"); "oom" in r') == []
    assert state_words_spelled('x = r.get("kind", "done")') == ["done"]


def test_signal_handlers_are_installed_in_one_module():
    """One signal path (issue 89): every handler is installed through hpc/core/stop.py (StopSignal for a
    training or a rank, Caught for a waiting loop), so what a signal means is read in one place."""
    installing = sorted(name for name, path in MODULES.items()
                        for node in ast.walk(ast.parse(path.read_text()))
                        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("signal.signal", "signal"))
    assert set(installing) == {"hpc.core.stop"}, installing
