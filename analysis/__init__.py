"""The analysis half: profiler traces -> the study's numbers, tables and figures (no torch import).

trace.py reads one trace (a streaming reader feeding per-concern accumulators), report.py folds
records into run and sweep tables and draws figures, __main__.py is the command, tensorboard.py
starts TensorBoard with the profiler plugin fixed, bench.py times the analysis against other tools.
"""
