"""The analysis's benchmark, apart from the product: figures, not tests.

- speed.py: `python -m analysis.bench.speed` (`hpc-analysis-speed`): time and memory against
  torch-tb-profiler's loader and HolisticTraceAnalysis;
- bigtrace.py: big traces made from a real one, and a whole process's cost;
- manyranks.py: a real rank trace copied to many ranks, and what analysing them costs.
"""
