"""The RLX IR: op schemas (MIR primitives and HIR model ops), graphs, the builder and the LIR."""

from . import hir as _hir  # noqa: F401  (registers the HIR ops)
from . import mir as _mir  # noqa: F401  (registers the MIR ops)
from .builder import GraphBuilder, Tensor
from .graph import Graph, Node, Value
from .ops import indexing as _indexing  # noqa: F401  (registers scatter_reduce, topk_indices)
from .schema import REGISTRY, AttrSpec, OpSchema, get_op, register_op
from .types import Attrs, Dim, TensorType, broadcast_shapes

__all__ = ["REGISTRY", "AttrSpec", "Attrs", "Dim", "Graph", "GraphBuilder", "Node", "OpSchema",
           "Tensor", "TensorType", "Value", "broadcast_shapes", "get_op", "register_op"]
