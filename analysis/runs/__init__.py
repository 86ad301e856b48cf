"""Records folded into runs and sweeps, and set side by side.

- apart.py: which traces are one run (a folder of runs, TensorBoard's layout, different worlds);
- fold.py: one run's traces folded per rank, with summary.json's facts;
- ranks.py: a run's ranks compared step by step (skew, straggler);
- sweep.py: a sweep's points against their 1-GPU point;
- diff.py: two profiles side by side per step, and the term that explains their difference.
"""
