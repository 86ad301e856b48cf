"""The analysis: profiler traces -> the study's numbers, tables, figures and report (no torch import).

Its stages, one room each, in the order they run (each imports only those before it; the verdicts are
attached above them, by pipeline.py):

- read/: a trace file streamed and decoded a window at a time; traces found under a folder;
- measure/: one trace's numbers (the CPU side, the device timeline, memory, collectives) and its record;
- runs/: records folded into runs and sweeps; ranks compared; two runs side by side;
- explain/: the why, in words (verdicts), and the report's explanations of a series;
- report/: tables, figures, report.html, human units;
- records.py: the typed records every stage passes on;
- pipeline.py: the stages run in order, each result judged (a trace, a run, a sweep);
- api.py: the one entry the launcher uses;
- __main__.py: `python -m analysis`; compare.py: `python -m analysis compare`;
- tensorboard.py: `python -m analysis.tensorboard`, TensorBoard with the profiler plugin fixed;
  tbgate.py: the token gate in front of it; static/: the plugin's fixed pages;
- bench/: the analysis's benchmark against torch-tb-profiler and HolisticTraceAnalysis.
"""
