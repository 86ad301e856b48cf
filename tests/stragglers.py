"""The README's straggler rule ("Verdicts", imbalance), written again here from its words as the tests'
oracle on a run's raw measurements (summary.json as the ranks wrote it), not the analysis's code: the
rank with the most own work per step is a straggler when, over 10 or more steps every rank measured, it
is above the others' median in at least 75% of them by a median excess more than twice the run's
step-to-step spread (the median over ranks of each one's interquartile range, linear quartiles), and the
others' wait for it (its median own work over the other ranks' median, over the median step) is 10% or more;
and not when its wait for a core (own_step_series' queued_ms), over the others' median at each of the 10 or
more steps every rank has one for, has a median of half that median excess or more: the machine's load."""

import statistics


def readme_straggler(summary: dict) -> int | None:
    ranks = sorted(summary["ranks"], key=lambda r: r["rank"])
    if len(ranks) < 2 or any(not (r.get("own_step_time_s") or {}).get("median") for r in ranks):
        return None
    series = [{r["own_step_series"]["first_step"] + i: v for i, v in enumerate(r["own_step_series"]["ms"])
               if v is not None} for r in ranks]
    common = sorted(set.intersection(*(set(s) for s in series)))
    own = [r["own_step_time_s"]["median"] for r in ranks]
    slow = own.index(max(own))
    if len(common) < 10:
        return None
    diffs = [series[slow][n] - statistics.median(s[n] for i, s in enumerate(series) if i != slow) for n in common]
    above = sum(d > 0 for d in diffs)

    def iqr(values):
        q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
        return q3 - q1

    spread = statistics.median(iqr([s[n] for n in common]) for s in series)
    step = statistics.median(r["step_time_s"]["median"] for r in ranks)
    wait_share = (max(own) - statistics.median(o for i, o in enumerate(own) if i != slow)) / step
    excess = statistics.median(diffs)
    holds = above >= 0.75 * len(common) and excess > 2 * spread
    if not holds or wait_share < 0.10:
        return None
    queued = [{r["own_step_series"]["first_step"] + i: v for i, v in
               enumerate(r["own_step_series"].get("queued_ms") or []) if v is not None} for r in ranks]
    waited = sorted(set.intersection(*(set(q) for q in queued)))
    if len(waited) >= 10:
        waits = [queued[slow][n] - statistics.median(q[n] for i, q in enumerate(queued) if i != slow) for n in waited]
        if statistics.median(waits) >= 0.5 * excess:
            return None
    return slow
