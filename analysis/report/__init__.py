"""What a person reads.

- tables.py: text, CSV, Markdown and JSON, and the tables that say why a run does not scale;
- figures.py: the study's figures (matplotlib);
- runfigures.py: one run's own figures (its ranks' step times, its window, its top operators and kernels);
- html.py: report.html, one self-contained page;
- hparams.py: a sweep as TensorBoard's HParams view (a session a point);
- units.py: human units.
"""
