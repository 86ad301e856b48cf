"""The why, in words.

- verdict.py: what bounds a trace, a run and a sweep point, with its evidence and remedy;
- series.py: the report's explanations of each series of points and of two sweeps;
- replicas.py: a point's replicas (a seed) as a mean and a spread, and whether a difference is beyond them;
- metric.py: which point trains better by the script's own metric, over its replicas, against their noise.
"""
