"""Running one graph on several processes (issue 22): meshes, the sharding passes that turn a graph
into per-rank programs (tensor, pipeline and data parallel), simulated ranks for the float64
reference, and the launch glue (``rlx launch -n N``). The transport is a backend's business:
rlx-cpu claims the collective ops with MPI (mpi4py), rlx-cuda with NCCL.

Names are imported lazily so ``import rlx_core`` does not pull the passes in."""

from __future__ import annotations

from typing import Any

from .._lazy import lazy as _lazy

_LAZY = {
    "Mesh": "mesh", "simulate": "simulate", "tensor_parallel": "sharding", "megatron_plan": "sharding",
    "Split": "sharding", "Replicated": "sharding", "pipeline_stages": "sharding",
    "PipelineRunner": "sharding", "DataParallelTrainer": "data_parallel",
    "dp_train_step_graph": "data_parallel", "DistributedSession": "session", "world": "runtime",
    "CollectiveError": "runtime",
}

__all__ = sorted(_LAZY)


_get, __dir__ = _lazy(globals(), {k: "." + v for k, v in _LAZY.items()})


def __getattr__(name: str) -> Any:
    return _get(name)
