"""What a person reads.

- tables.py: text, CSV, Markdown and JSON, and the tables that say why a run does not scale;
- figures.py: the study's figures (matplotlib);
- html.py: report.html, one self-contained page;
- units.py: human units.
"""
