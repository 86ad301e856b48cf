"""The part of graph mode under DDP that does not need a GPU, on the CPU with DDP over gloo, 2 ranks: the
11 eager DDP iterations that capture needs (hpc/training/graph/cudagraph.py GraphedStep.warm_up) leave no trace.
After them the model, its BatchNorm buffers and the momentum are as before, and the steps that follow
are bit-identical to a twin that never warmed up, on every rank. The capture itself (CUDA streams, NCCL
inside a graph) runs only on a GPU: tests/gpu/test_gpu.py.

Run as a test; the ranks run this file as a script under torchrun.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def rank_main(out_dir: str) -> None:
    import contextlib
    import hashlib

    import torch
    import torch.distributed as tdist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from hpc.training.graph.cudagraph import GraphedStep, whole_step
    from hpc.training.graph.graphmode import DDP_WARMUP_ITERS

    tdist.init_process_group("gloo")
    rank = tdist.get_rank()
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own batch: the all-reduce matters
    x, y = torch.randn(6, 3, 8, 8, generator=gen), torch.randint(0, 10, (6,), generator=gen)

    def twin(warm: bool) -> tuple[dict, bool, list]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                              nn.Flatten(), nn.Linear(8, 10))
        ddp = DDP(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
        core = whole_step(ddp, opt, contextlib.nullcontext)
        unchanged = True
        if warm:
            before = {k: v.clone() for k, v in model.state_dict().items()}
            GraphedStep(core, model, opt, DDP_WARMUP_ITERS).warm_up(x, y)
            after = model.state_dict()
            unchanged = all(torch.equal(before[k], after[k]) for k in before) and all(
                p.grad is None for p in model.parameters())
        for _ in range(3):  # what the replays would do: steps from the restored state
            opt.zero_grad(set_to_none=True)
            core(x, y)
        params = [p.detach().clone() for p in model.parameters()]
        return {k: v.clone() for k, v in model.state_dict().items()}, unchanged, params

    warmed, unchanged, params = twin(True)
    plain, _, _ = twin(False)
    # The weights, not the BatchNorm running stats: DDP broadcasts those from rank 0 at each forward's
    # start, so after a step each rank holds its own (the trainer broadcasts them before evaluating).
    digest = hashlib.sha256(b"".join(p.numpy().tobytes() for p in params)).hexdigest()
    digests: list = [None] * tdist.get_world_size()
    tdist.all_gather_object(digests, digest)
    same = all(torch.equal(warmed[k], plain[k]) for k in plain)
    result = {"rank": rank, "restored": unchanged, "same_as_unwarmed": same, "ranks_agree": len(set(digests)) == 1}
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    tdist.barrier()  # tear down together: a peer closing its sockets early aborts gloo's threads (as the trainer)
    tdist.destroy_process_group()
    # No C++ static destructors: after DDP over gloo they abort now and then (as hpc.train's door does)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def test_warm_up_for_capture_leaves_no_trace_under_ddp_on_two_gloo_ranks(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", __file__, str(tmp_path)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for r in results:
        assert r["restored"], r  # weights, BatchNorm buffers back; no gradient left
        assert r["same_as_unwarmed"], r  # momentum restored too: the following steps are the same steps
        assert r["ranks_agree"], r  # DDP averaged the two ranks' different gradients


if __name__ == "__main__":
    rank_main(sys.argv[1])
