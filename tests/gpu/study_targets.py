"""The study-point comparison's verdicts (tests/gpu/study_point.py's rows in, the targets and the table
out), pure functions over the rows, tested on literal rows in tests/unit/test_study_targets.py.

A pair is the paper-style script and the toolkit at one point (data fraction, batch), both under the
same launcher. Targets (issue 54), each at batch 128, 1024 and 2048: the toolkit's whole process no
slower than the script's (whole ratio <= 1), and at most half of it at batch 128; its last epoch at
least 5x faster than the script's last epoch at batch 128 and 3x at 1024.
"""

from __future__ import annotations

from typing import Any

WHOLE_RATIO_MAX = {128: 0.5}  # toolkit whole / script whole; every other batch: 1.0
LAST_EPOCH_SPEEDUP_MIN = {128: 5.0, 1024: 3.0}  # script last epoch / toolkit last epoch
TARGET_BATCHES = (128, 1024, 2048)


def key(row: dict[str, Any]) -> tuple[str, int]:
    return (str(row["fraction"]), int(row["batch"]))


def pairs(rows: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(script row, toolkit row) at each point where both ran under the same launcher, in row order."""
    script = {(key(r), r["launcher"]): r for r in rows if r["side"] == "script"}
    return [(script[(key(r), r["launcher"])], r) for r in rows
            if r["side"] == "toolkit" and (key(r), r["launcher"]) in script]  # fmt: skip


def compare(script: dict[str, Any], toolkit: dict[str, Any]) -> dict[str, Any]:
    """One pair's ratios and its targets, each met, missed, or None (no target at this batch; a failed
    process: nothing to compare)."""
    batch = int(toolkit["batch"])
    ok = script["rc"] == 0 and toolkit["rc"] == 0 and script["epoch_s"] and toolkit["epoch_s"]
    whole = toolkit["whole_s"] / script["whole_s"] if ok else None
    last = script["epoch_s"][-1] / toolkit["epoch_s"][-1] if ok else None
    whole_max = WHOLE_RATIO_MAX.get(batch, 1.0) if batch in TARGET_BATCHES else None
    last_min = LAST_EPOCH_SPEEDUP_MIN.get(batch)
    return {
        "fraction": toolkit["fraction"],
        "batch": batch,
        "launcher": toolkit["launcher"],
        "whole_ratio": whole,
        "last_epoch_speedup": last,
        "whole_ratio_max": whole_max,
        "whole_met": None if whole is None or whole_max is None else whole <= whole_max,
        "last_epoch_speedup_min": last_min,
        "last_epoch_met": None if last is None or last_min is None else last >= last_min,
    }


def comparisons(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [compare(s, t) for s, t in pairs(rows)]


def _num(value: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if value is None else fmt.format(value)


def _target(met: bool | None, value: float | None, bound: float | None, sign: str) -> str:
    if bound is None:
        return f"{_num(value)} (no target)"
    word = "not measured" if met is None else ("**met**" if met else "**missed**")
    return f"{_num(value)} {sign} {bound:g}: {word}"


def markdown(doc: dict[str, Any]) -> str:
    """The rows (each epoch, the whole process) and the comparisons with their targets, as the README's."""
    lines = [f"{doc['device']}, torch {doc['torch']}, {doc['epochs']} epochs a process; the script with "
             f"{doc['workers']} DataLoader workers; the toolkit as profiles/study.yaml runs it, step mode "
             f"{doc['mode']}", "",
             "| fraction | batch | side | launcher | whole process (s) | process start to first step (s) | epochs (s) "
             "| exit |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in doc["rows"]:
        epochs = ", ".join(f"{e:.2f}" for e in r["epoch_s"]) or "-"
        first = (r.get("startup") or {}).get("to_first_step_s")  # the toolkit's own record (summary.json)
        lines.append(f"| {r['fraction']} | {r['batch']} | {r['side']} | {r['launcher']} | {r['whole_s']:.1f} | "
                     f"{_num(first)} | {epochs} | {r['rc']} |")  # fmt: skip
    lines += ["", "| fraction | batch | launcher (both) | whole: toolkit / script | last epoch: script / toolkit |",
              "|---|---|---|---|---|"]  # fmt: skip
    for c in doc["comparisons"]:
        whole = _target(c["whole_met"], c["whole_ratio"], c["whole_ratio_max"], "<=")
        last = _target(c["last_epoch_met"], c["last_epoch_speedup"], c["last_epoch_speedup_min"], ">=")
        lines.append(f"| {c['fraction']} | {c['batch']} | {c['launcher']} | {whole} | {last} |")
    return "\n".join(lines) + "\n"
