"""One trace's numbers: accumulators fed a window at a time, and the trace's record.

- trace.py: one trace routed column-wise to the accumulators, its record;
- cpu.py: operators, self times, profiled steps, runtime calls;
- device.py: the device timeline (kernels, copies, idle time);
- memory.py: peak device memory; collective.py: NCCL collectives and their bandwidths;
- kernels.py: kernel classes by name; intervals.py: interval arithmetic.
"""
