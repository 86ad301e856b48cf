"""expand_hostlist agrees with `scontrol show hostnames` on thousands of generated expressions."""

import random
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hostlist_gen import expression
from hpc.core.errors import HostlistError
from hpc.placement.hostlist import expand_hostlist

pytestmark = pytest.mark.slurm  # scontrol comes with the local cluster (tests/slurm/cluster.sh)
N_EXPRESSIONS = 4000


def scontrol_hostnames(expr: str):
    r = subprocess.run(["scontrol", "show", "hostnames", "--", expr], capture_output=True, text=True, timeout=30)
    if "Invalid hostlist" in r.stderr:
        return None
    return r.stdout.split("\n")[:-1]


@pytest.fixture(scope="module")
def scontrol():
    if not shutil.which("scontrol"):
        pytest.skip("scontrol not installed (tests/slurm/cluster.sh installs it as root); literal cases "
                    "in test_distenv.py still run")
    probe = subprocess.run(["scontrol", "show", "hostnames", "n[1-2]"], capture_output=True, text=True)
    if probe.stdout.split() != ["n1", "n2"]:
        pytest.skip(f"scontrol does not answer without a cluster config: {probe.stderr.strip()[:100]}")


def test_agrees_with_scontrol_on_generated_expressions(scontrol):
    rng = random.Random(20261122)
    exprs = [expression(rng) for _ in range(N_EXPRESSIONS)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        wanted = list(pool.map(scontrol_hostnames, exprs))
    mismatches = []
    for expr, want in zip(exprs, wanted):
        try:
            got = expand_hostlist(expr)
        except HostlistError:
            got = None
        if got != want:
            mismatches.append((expr, want, got))
    valid = sum(w is not None for w in wanted)
    assert valid > N_EXPRESSIONS // 2, "the generator should produce mostly valid expressions"
    assert not mismatches, mismatches[:5]


@given(text=st.text(alphabet="nid[]-,0123456789x+ \t", max_size=24))
@settings(max_examples=300)
def test_agrees_with_scontrol_on_any_text(scontrol, text):
    """Hypothesis's text of Slurm's own characters: expanded as scontrol expands it, or refused where it is."""
    want = scontrol_hostnames(text)
    try:
        got = expand_hostlist(text)
    except HostlistError:
        got = None
    assert got == want, (text, want, got)
