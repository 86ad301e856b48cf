"""DDP's weak-scaling model: the step time and efficiency N GPUs should reach, from a 1-GPU step time,
the gradient bytes and the all-reduce bus bandwidth. No torch import: `hpc.bench` prints it for a
model on paper; `python -m analysis` feeds it the bandwidth and 1-GPU step time a sweep measured.
"""

from __future__ import annotations

# Scaling model (docs: README "Multi-GPU scaling, on paper"). Bus bandwidths are assumptions to be
# replaced by nccl-tests' all_reduce_perf on the machine: NVLink3 between Perlmutter's 4 A100s
# (4 links of 25 GB/s per pair), and one 25 GB/s Slingshot-11 NIC per GPU between nodes.
PERLMUTTER_BUSBW_GBS = {"intra_node": 200.0, "inter_node": 20.0}


def scaling_prediction(
    step_time_s: float,
    grad_bytes: float,
    gpus_per_node: int,
    nodes: int,
    busbw_gbs: dict = PERLMUTTER_BUSBW_GBS,
    backward_share: float = 2 / 3,
    bucket_bytes: float = 25e6,
) -> dict:
    """Predicted weak-scaling efficiency (per-GPU batch fixed) of DDP from a measured 1-GPU step time.

    All-reduce time = bytes x 2(n-1)/n / bus bandwidth (NCCL's ring; busbw as nccl-tests reports it),
    with the slowest link setting the pace (the NIC once there are several nodes). DDP all-reduces
    gradient buckets while backward runs: the exposed part is what does not fit under the backward
    pass (backward_share of the step), plus the last bucket, which can only start when backward ends.
    """
    n = gpus_per_node * nodes
    if n == 1:
        return {"gpus": 1, "allreduce_s": 0.0, "exposed_s": 0.0, "step_s": step_time_s, "efficiency": 1.0}
    busbw = busbw_gbs["inter_node" if nodes > 1 else "intra_node"] * 1e9
    allreduce = grad_bytes * 2 * (n - 1) / n / busbw
    last_bucket = min(bucket_bytes, grad_bytes) * 2 * (n - 1) / n / busbw
    exposed = max(0.0, allreduce - backward_share * step_time_s) + last_bucket
    step = step_time_s + exposed
    return {"gpus": n, "allreduce_s": allreduce, "exposed_s": exposed, "step_s": step, "efficiency": step_time_s / step}
