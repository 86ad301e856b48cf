"""The shape of the code, checked: a leaf core, a torch-free launcher, analysis that sees hpc only through
the core, no import cycle (function-level imports counted), small modules and functions, errors and
exit codes in one place, the README's map of the tree, and jobs pickled by earlier releases still
loading. Read from the source with `ast`: nothing here runs the code it checks."""

import ast
import pickle
import re
from pathlib import Path

import pytest

from hpc.core import errors

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("hpc", "analysis")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
DOORS = ("train", "submit", "study", "config", "data", "distenv", "bench")  # python -m hpc.<door>


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


def test_analysis_sees_hpc_only_through_the_core():
    for name, path in MODULES.items():
        if name.startswith("analysis"):
            outside = {dep for dep in imports(path) if dep.startswith("hpc") and not dep.startswith("hpc.core")}
            assert not outside, (name, outside)


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


def test_modules_and_functions_are_small():
    too_long = []
    for name, path in MODULES.items():
        lines = path.read_text().count("\n")
        if lines > MAX_MODULE_LINES:
            too_long.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long.append(f"{name}.{node.name}: {length} lines")
    assert not too_long, too_long


def test_the_doors_only_hand_over():
    for door in DOORS:
        path = REPO / "hpc" / f"{door}.py"
        assert path.read_text().count("\n") <= 25, door
        deps = imports(path)
        assert deps and all(d.startswith(("hpc.launch", "hpc.training")) for d in deps), (door, deps)


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


def test_exit_codes_are_defined_once_and_the_sbatch_script_uses_them():
    for name, path in MODULES.items():
        if name != "hpc.core.errors":
            assert not re.search(r"^EXIT_\w+\s*=", path.read_text(), re.M), name
    script = (REPO / "jobs" / "resnet152.sbatch").read_text()
    for name in ("EXIT_PREEMPTED", "EXIT_PEER_LOST"):  # both requeue: the run resumes from its checkpoint
        (code,) = re.findall(rf'^{name}=(\d+)', script, re.M)
        assert int(code) == getattr(errors, name) and f'"$rc" -eq "${name}"' in script


def test_the_fault_hook_is_parsed_in_one_place():
    for name, path in MODULES.items():
        text = path.read_text()
        if name != "hpc.core.faults":
            assert not re.search(r"""environ(\.get)?[\[(]["']HPC_FAULT_INJECT""", text), name


def test_the_run_directory_files_are_named_in_the_core():
    """Each file of the run and sweep directories is spelled in hpc/core/rundir.py and nowhere else."""
    names = ("summary.json", "metrics.jsonl", "index.json", "config.yaml", "study.json", "sweep.yaml", "last.pt")
    for name, path in MODULES.items():
        if name == "hpc.core.rundir":
            continue
        code = [n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant)
                and isinstance(n.value, str) and not n.value.startswith(("\n", " ")) and len(n.value) < 60]
        assert not [c for c in code if c in names], (name, [c for c in code if c in names])


def test_readme_map_matches_the_tree():
    readme = (REPO / "tests" / "README.md").read_text()  # the developers' document holds the map
    section = readme.split("## What is where", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`((?:hpc|analysis)/[\w/]+\.py)`", section))
    named |= {f"{d}/{m}.py" for d, ms in re.findall(r"`((?:hpc|analysis)(?:/\w+)?)/\{([\w,]+)\}\.py`", section)
              for m in ms.split(",")}
    assert all((REPO / p).is_file() for p in named), sorted(p for p in named if not (REPO / p).is_file())
    tree = {str(p.relative_to(REPO)) for p in MODULES.values() if p.name != "__init__.py"}
    assert not tree - named, f"modules the README does not place: {sorted(tree - named)}"


@pytest.mark.parametrize("golden, kind, attrs", [
    ("trainjob-submitted.pkl", "TrainJob", {"max_requeues": 3, "launcher": "torchrun", "nproc_per_node": 4,
                                            "max_restarts": 2}),
    ("analysisjob-submitted.pkl", "AnalysisJob", {"sweep_dir": "/x/sweep"}),
])
def test_jobs_pickled_by_the_earlier_layout_still_load(golden, kind, attrs):
    """A job queued (or requeued) before the layout changed holds a pickle naming hpc.submit.TrainJob or
    hpc.study.AnalysisJob; tests/golden/*-submitted.pkl were written by that release's hpc.submit."""
    delayed = pickle.loads((REPO / "tests" / "golden" / golden).read_bytes())
    job = delayed.function
    assert type(job).__name__ == kind and callable(job)
    assert {k: getattr(job, k) for k in attrs} == attrs
    if kind == "TrainJob":
        from hpc.launch.config import run_config_from_dict

        assert job.run_config["model"]["arch"] == "resnet152"
        assert job.checkpoint().function is job  # requeueing it again works
        assert run_config_from_dict(job.run_config, "golden").data.source == "cifar100"  # its keys, as today's


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
