"""The analysis: profiler traces -> the study's numbers, tables, figures and report (no torch import).

reader.py, events.py and trace.py read one trace (a streaming reader feeding per-concern accumulators);
fold.py and sweep.py fold records into runs and sweeps; diff.py and compare.py set two runs side by side;
tables.py, figures.py and html.py write them out; __main__.py is `python -m analysis`; api.py is the
one entry the launcher uses; tensorboard.py starts TensorBoard with the profiler plugin fixed; bench.py
times the analysis against other tools.
"""
