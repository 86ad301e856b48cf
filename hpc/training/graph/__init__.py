"""The training step as a replayed CUDA graph.

- graphmode.py: whether a run's step is graphed (train.cuda_graph), decided once, before the group;
- cudagraph.py: the whole step captured once and replayed;
- graphcheck.py: the graph's first replay compared with an eager step on every rank before it is trusted.
"""
