"""Random Slurm hostlist expressions for the scontrol agreement test (valid ones and near-misses)."""

import random

_NAME_CHARS = "abnidgpux-_"
_NOISE = ["[", "]", ",", " ", "-", "x", "+", "[]", "]]", "[[", "1-", "-1"]


def _number(rng: random.Random) -> str:
    value = rng.choice([0, 1, 2, 7, 8, 9, 10, 11, 99, 100, 101, rng.randint(0, 300)])
    return str(value).zfill(rng.choice([0, 0, 1, 2, 3, 4]))


def _range(rng: random.Random) -> str:
    lo = _number(rng)
    if rng.random() < 0.4:
        return lo
    hi = int(lo) + rng.randint(0, 12)
    return f"{lo}-{str(hi).zfill(rng.choice([0, 1, 2, 3]))}"


def _group(rng: random.Random) -> str:
    return "[" + ",".join(_range(rng) for _ in range(rng.randint(1, 3))) + "]"


def _name(rng: random.Random) -> str:
    out = "".join(rng.choice(_NAME_CHARS) for _ in range(rng.randint(0, 4)))
    groups = rng.choice([0, 1, 1, 1, 2, 2, 3])
    for k in range(groups):
        out += _group(rng)
        # Text between groups is fine; after the last group Slurm rejects it (kept rare, as a check).
        if k < groups - 1 or rng.random() < 0.1:
            out += "".join(rng.choice(_NAME_CHARS + "0123") for _ in range(rng.randint(1, 3)))
    if groups == 0 and rng.random() < 0.5:
        out += _number(rng)
    return out or "n"


def expression(rng: random.Random) -> str:
    expr = rng.choice([",", ",", ",", " "]).join(_name(rng) for _ in range(rng.randint(1, 3)))
    if rng.random() < 0.15:  # near-misses: Slurm must reject or keep them exactly as we do
        pos = rng.randint(0, len(expr))
        expr = expr[:pos] + rng.choice(_NOISE) + expr[pos:]
    return expr
