"""Loss functions as graph-building functions: ``loss = softmax_cross_entropy(g, logits, labels)``.

Each takes a :class:`~rlx_core.ir.builder.GraphBuilder`, builds the loss from IR ops and returns a
tensor (a scalar with the default ``reduction="mean"``). They differentiate through
:mod:`rlx_core.autodiff` like any other graph.
"""

from __future__ import annotations

from .errors import DTypeError, IRError, ShapeError
from .ir.builder import GraphBuilder, Tensor
from .ir.types import normalize_axis

REDUCTIONS = ("mean", "sum", "none")


def _reduce(b: GraphBuilder, t: Tensor, reduction: str) -> Tensor:
    if reduction == "mean":
        return b.op("reduce_mean", t, axes=None, keepdims=False)
    if reduction == "sum":
        return b.op("reduce_sum", t, axes=None, keepdims=False)
    if reduction == "none":
        return t
    raise IRError(f"reduction {reduction!r} is unknown", fix=f"use one of {REDUCTIONS}")


def one_hot(b: GraphBuilder, labels: Tensor, classes: int | str, *, axis: int = -1,
            dtype: object = "f32") -> Tensor:
    """``labels`` (integers) as one-hot vectors along a new ``axis`` of size ``classes``."""
    rank = labels.rank + 1
    ax = normalize_axis(axis, rank)
    lab = b.op("reshape", labels, shape=labels.shape[:ax] + (1,) + labels.shape[ax:])
    io = b.op("iota", shape=(1,) * ax + (classes,) + (1,) * (rank - ax - 1), axis=ax, dtype=labels.dtype)
    return b.op("cast", b.op("equal", lab, io), to=dtype)


def softmax_cross_entropy(b: GraphBuilder, logits: Tensor, labels: Tensor, *, axis: int = -1,
                          reduction: str = "mean") -> Tensor:
    """Cross-entropy of ``softmax(logits)`` along ``axis`` against ``labels``.

    ``labels`` are integer class indices (the shape of ``logits`` without ``axis``) or float
    targets of the shape of ``logits`` (one-hot or probabilities). Fused and numerically stable:
    one ``log_softmax`` (``x - max - log(sum(exp(x - max)))``, whose gradient is
    ``softmax - target``), then the target's log-probability is picked by a one-hot product. The
    ``"mean"`` reduction averages over every remaining element, as ``torch.nn.functional.cross_entropy``.
    """
    if not logits.dtype.is_float:
        raise DTypeError(f"softmax_cross_entropy: logits are {logits.dtype}", fix="pass float logits")
    ax = normalize_axis(axis, logits.rank)
    logp = b.op("log_softmax", logits, axis=ax)
    if labels.dtype.is_float:
        if labels.shape != logits.shape:
            raise ShapeError(f"softmax_cross_entropy: float labels {labels.shape} must have the shape of "
                             f"the logits {logits.shape}",
                             fix="pass one-hot/probability targets, or integer class indices")
        target = labels if labels.dtype == logits.dtype else b.op("cast", labels, to=logits.dtype)
    else:
        want = logits.shape[:ax] + logits.shape[ax + 1:]
        if labels.shape != want:
            raise ShapeError(f"softmax_cross_entropy: integer labels {labels.shape} must have the shape "
                             f"of the logits without the class axis, {want}",
                             fix="pass one class index per example")
        target = one_hot(b, labels, logits.shape[ax], axis=ax, dtype=logits.dtype)
    nll = b.op("neg", b.op("reduce_sum", logp * target, axes=(ax,), keepdims=False))
    return _reduce(b, nll, reduction)


cross_entropy = softmax_cross_entropy


def mse(b: GraphBuilder, pred: Tensor, target: Tensor, *, reduction: str = "mean") -> Tensor:
    """Mean squared error ``mean((pred - target)**2)`` (``torch.nn.functional.mse_loss``)."""
    d = pred - target
    return _reduce(b, d * d, reduction)


__all__ = ["REDUCTIONS", "cross_entropy", "mse", "one_hot", "softmax_cross_entropy"]
