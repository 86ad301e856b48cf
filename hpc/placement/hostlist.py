"""Slurm's compact lists, expanded exactly as Slurm does: hostlists (`nid[001-004,010]`, as
`scontrol show hostnames` prints them) and task counts per node (`2(x3),1`). No torch import.

Why not submitit's parser: it expands several bracket groups as a plain cartesian product, which
disagrees with Slurm for three or more groups and for mixed zero padding. The code below follows
Slurm's own `src/common/hostlist.c` and is tested against `scontrol show hostnames`.
"""

from __future__ import annotations

from collections.abc import Iterator

from hpc.core.errors import DistEnvError, HostlistError

_SEPARATORS = "\t, "
_ULONG_MAX = 2**64 - 1
MAX_COUNT = 1 << 20  # ranks, nodes, tasks: more than any machine has; a larger value is garbage
# Slurm's limits (hostlist.c: MAX_RANGE, MAX_PREFIX_CNT): a guard against "n[0-999999999]".
_MAX_RANGE = 64 * 1024  # scontrol: a[0-65535] expands, a[0-65536] is refused
_MAX_PREFIX_CNT = 64 * 1024


def _strtoul(text: str) -> tuple[int | None, str]:
    """C's strtoul(text, &end, 10): (value or None when no digits, unparsed rest).

    Slurm parses range bounds with strtoul, so " 1" and "+1" are accepted and the *width* still
    counts the blank or sign ("a[ 1-2]" expands to a01 a02, as scontrol does).
    """
    i, n = 0, len(text)
    while i < n and text[i] in " \t\n\v\f\r":
        i += 1
    negative = i < n and text[i] == "-"
    if i < n and text[i] in "+-":
        i += 1
    j = i
    while j < n and text[j].isdigit() and text[j].isascii():
        j += 1
    if j == i:
        return None, text
    value = min(int(text[i:j]), _ULONG_MAX)
    if negative:
        value = (-value) % (_ULONG_MAX + 1)
    return value, text[j:]


def _parse_single_range(text: str, expr: str) -> tuple[int, int, int]:
    """'lo-hi' or 'n' inside brackets -> (lo, hi, width). Mirrors hostlist.c:_parse_single_range."""
    bad = HostlistError(f"invalid range {text!r} in hostlist {expr!r}")
    if "x" in text:  # Slurm reserves 'x' for multi-dimensional boxes
        raise bad
    lo_text, dash, hi_text = text.partition("-")
    if dash and hi_text.startswith("-"):
        raise bad
    width = len(lo_text)
    lo, lo_rest = _strtoul(lo_text)
    if lo is None:
        raise bad
    if dash and hi_text:  # like Slurm, text after the low bound goes unchecked only here
        hi, rest = _strtoul(hi_text)
        if hi is None or rest:
            raise bad
    else:
        if lo_rest:
            raise bad
        hi = lo
    if lo > hi:
        raise bad
    if hi - lo + 1 > _MAX_RANGE:
        raise HostlistError(f"too many hosts in range {text!r} of hostlist {expr!r}")
    return lo, hi, width


def _parse_range_list(text: str, expr: str) -> list[tuple[int, int, int]]:
    return [_parse_single_range(part, expr) for part in text.split(",")]


def _push_ranges(out: list[str], prefix: str, ranges: list[tuple[int, int, int]], expr: str, top: bool = True) -> None:
    """Expand `prefix` (which may hold earlier bracket groups) against the last group's ranges.

    Slurm expands the *rightmost* bracket of the prefix in the outer loop and recurses leftwards, so
    a[1-2]b[3-4]c[5-6] gives a1b3c5 a1b3c6 a2b3c5 a2b3c6 a1b4c5 ..., not a lexicographic product.
    A bad group met inside that recursion drops the name silently (hostlist.c keeps MAX(rc, rc1) over
    the recursive calls); only the top-level groups make the whole list invalid. scontrol agrees.
    """
    open_at = prefix.rfind("[")
    close_at = prefix.rfind("]", open_at + 1)
    # found, close_at is past open_at >= 0, so "< 0", "<= 0" and "< 1" are one test: not mutated
    if open_at < 0 or close_at < 0:  # pragma: no mutate
        for lo, hi, width in ranges:
            out.extend(f"{prefix}{v:0{width}d}" for v in range(lo, hi + 1))
        return
    head = prefix[:open_at]
    inner = prefix[open_at + 1 : close_at]
    tail = prefix[close_at + 1 :]
    try:
        prefix_ranges = _parse_range_list(inner, expr)
    except HostlistError:
        if top:
            raise
        return
    count = 0
    for lo, hi, width in prefix_ranges:
        count += hi - lo + 1
        if count > _MAX_PREFIX_CNT:
            if top:
                raise HostlistError(f"too many hosts in hostlist {expr!r}")
            return
        for value in range(lo, hi + 1):
            new_prefix = f"{head}{value:0{width}d}{tail}"
            if "[" in head:  # a nested group's errors are dropped (top=False): its expr is never read
                _push_ranges(out, new_prefix, ranges, expr, top=False)  # pragma: no mutate
            else:
                for rlo, rhi, rwidth in ranges:
                    out.extend(f"{new_prefix}{v:0{rwidth}d}" for v in range(rlo, rhi + 1))


def _tokens(expr: str) -> Iterator[str]:
    """Split on tabs, commas and blanks, except inside brackets (hostlist.c:_next_tok)."""
    i, n = 0, len(expr)
    while True:
        while i < n and expr[i] in _SEPARATORS:
            i += 1
        if i >= n:
            return
        start = parse = i
        while True:
            while i < n and expr[i] not in _SEPARATORS:
                i += 1
            jumped = False  # pragma: no mutate (None reads the same)
            # expr[i] is a separator or the end, never a bracket, and "[" is never "]": an equality below
            # cannot hold, so "<" and "<=" (and "< 0" and "< 1" where the other test follows) are one test
            while True:
                open_at = expr.find("[", parse)
                if open_at < 0 or open_at > i:  # pragma: no mutate
                    break
                close_at = expr.find("]", parse)
                if close_at < 0 or close_at < open_at:  # pragma: no mutate
                    break
                if close_at < i:  # pragma: no mutate
                    parse = close_at + 1
                    continue
                i = close_at
                jumped = True
                break
            if not jumped:
                break
        yield expr[start:i]


def _single_host(token: str) -> str:
    # A plain name round-trips, except that Slurm clamps an over-long numeric suffix to ULONG_MAX.
    j = len(token)
    while j > 0 and token[j - 1].isdigit() and token[j - 1].isascii():
        j -= 1
    if j == len(token):
        return token
    suffix = token[j:]
    return f"{token[:j]}{min(int(suffix), _ULONG_MAX):0{len(suffix)}d}"


def expand_hostlist(expr: str) -> list[str]:
    """Expand a Slurm hostlist exactly as `scontrol show hostnames` does.

    Order and duplicates are kept. Supports zero padding (width of the low bound), comma lists
    inside and outside brackets, several bracket groups per name (`gpu-a[1-2]b[01-02]`) and
    Slurm's separators (comma, blank, tab). Raises HostlistError where Slurm says "Invalid hostlist".
    """
    hosts: list[str] = []
    for token in _tokens(expr):
        open_at = token.rfind("[")
        if open_at < 0:
            hosts.append(_single_host(token))
            continue
        prefix, rest = token[:open_at], token[open_at + 1 :]
        close_at = rest.find("]")
        if close_at < 0:
            # No closing bracket: Slurm keeps the text, closing it if there was a prefix.
            hosts.append(_single_host(prefix + "]") if prefix else _single_host(rest))
            continue
        # hostlist.c lets a ',' follow; a token never holds one there (_tokens splits at it): any text errs
        if close_at + 1 < len(rest):
            raise HostlistError(f"invalid hostlist {expr!r}: text after ']' in {token!r}")
        _push_ranges(hosts, prefix, _parse_range_list(rest[:close_at], expr), expr)
    return hosts


def expand_tasks_per_node(expr: str) -> list[int]:
    """SLURM_TASKS_PER_NODE ('2(x3),1') -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for part in expr.split(","):
        part = part.strip()
        value, has_reps, reps = part.partition("(x")
        try:
            if has_reps and not reps.endswith(")"):
                raise ValueError
            count, repeat = int(value), int(reps[:-1]) if has_reps else 1
        except ValueError:
            raise DistEnvError(f"SLURM_TASKS_PER_NODE={expr[:80]!r}: cannot parse {part[:40]!r}") from None
        if not 0 < repeat <= MAX_COUNT - len(counts):  # checked before the list is made
            raise DistEnvError(
                f"SLURM_TASKS_PER_NODE={expr[:80]!r}: repeat count {repeat} makes more than {MAX_COUNT} nodes"
                if repeat > 0
                else f"SLURM_TASKS_PER_NODE={expr[:80]!r}: repeat count {repeat} must be >= 1"
            )
        counts.extend([count] * repeat)
    if not counts or any(c < 0 for c in counts):
        raise DistEnvError(f"SLURM_TASKS_PER_NODE={expr[:80]!r}: expected counts like '2(x3),1'")
    return counts
