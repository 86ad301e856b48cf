"""Reading traces.

- reader.py: a Chrome/Kineto trace file streamed, its events a window at a time;
- events.py: a window's events decoded by msgspec into typed structs by phase;
- discover.py: the trace files under a folder, or a run's; the warnings of what was skipped;
- metrics.py: a script's own metrics (loss, accuracy) from what its loggers wrote, and the one judged by.
"""
