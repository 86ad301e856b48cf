"""GraphedStep's stand-in on a machine without CUDA: the capture a test names in HPC_GRAPH_CAPTURE
(graphstandin:CAPTURE; hpc/training/graph/graphmode.py capture_in_use imports it, the one seam; tests/conftest.py
puts this folder on PYTHONPATH for the tests and their subprocesses). It lives with the tests: no product
module names it, and no user's run takes it."""

import torch

from hpc.training.graph.cudagraph import GraphedStep
from hpc.training.graph.graphmode import Capture


class StandInStep(GraphedStep):
    """GraphedStep's stand-in on a machine without CUDA, for tests only (HPC_GRAPH_CAPTURE=graphstandin:CAPTURE):
    the warm-up runs as it does before a capture; nothing is captured, and a "replay" runs the step
    eagerly, with a replay's semantics (gradients overwritten, not added to). Everything around the
    graph (the check, the ranks' agreement, the fallback to eager) then runs for real on the CPU."""

    def record(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.warm_up(x, y)
        return torch.zeros(())  # no graph, no static loss: each "replay" returns its own

    def replay(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        assert self.x is not None and self.y is not None
        self.x.copy_(x)
        self.y.copy_(y)
        self.optimizer.zero_grad(set_to_none=True)
        return self.core(self.x, self.y)


# What a test names: graph mode on a CPU, each "replay" the eager step (GRAPH_STANDIN in tests/conftest.py)
CAPTURE = Capture("a stand-in that runs the step eagerly where a graph would replay", needs_cuda=False,
                  build=StandInStep)
