"""A BERT encoder built from Hugging Face weights with the HIR builder.

:func:`build_bert_encoder` turns a ``config.json`` dict and the tensors of a BERT checkpoint
(Hugging Face names, e.g. ``encoder.layer.0.attention.self.query.weight``; a ``bert.`` prefix is
accepted) into a :class:`~rlx_core.ir.graph.Graph` with symbolic ``batch`` and ``seq`` dims:

* inputs ``input_ids`` and ``attention_mask`` (i64 ``[batch, seq]``, mask 1 = token, 0 = padding),
  plus ``token_type_ids`` when ``token_type_ids=True`` (otherwise segment 0 everywhere, as the
  Hugging Face default of all-zero token types);
* word + position + token-type embeddings, LayerNorm, then per layer: multi-head self-attention with
  the padding mask, output projection, residual + LayerNorm, feed-forward with exact GELU,
  residual + LayerNorm (post-norm, as ``BertModel``);
* output ``embeddings``: mean pooling over the valid tokens (mask-weighted, as
  sentence-transformers) or the ``[CLS]`` token, optionally L2-normalised, ``[batch, hidden]``;
  or, with ``pooling="none"``, ``last_hidden_state`` ``[batch, seq, hidden]``.

Weights are used as given (a memory-mapped safetensors file stays memory-mapped): an array that
already has the requested dtype and is C-contiguous is never copied.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..dtypes import DType
from ..errors import IRError, ShapeError
from ..ir.builder import GraphBuilder, Tensor
from ..ir.graph import Graph

POOLINGS = ("mean", "cls", "none")
#: Clamp of the per-sentence token count in mean pooling (sentence-transformers uses 1e-9).
MEAN_POOL_MIN_COUNT = 1e-9
#: ``torch.nn.functional.normalize``'s default eps: norms below it are clamped.
NORMALIZE_EPS = 1e-12


def _cfg(config: Mapping[str, Any], key: str, default: Any = None) -> Any:
    if key in config:
        return config[key]
    if default is None:
        raise IRError(f"BERT config has no {key!r}", where="build_bert_encoder config",
                      fix="pass the model's config.json as a dict")
    return default


def _floor(value: float, dt: DType) -> float:
    """``value``, raised to f16's smallest normal so the clamp does not flush to zero there."""
    return max(value, float(np.finfo(np.float16).tiny)) if dt is DType.F16 else value


class _Weights:
    """HF-named weight lookup: optional ``bert.`` prefix, dtype check, zero-copy when possible."""

    def __init__(self, weights: Mapping[str, np.ndarray], dtype: DType) -> None:
        self.weights = weights
        self.dtype = dtype
        self.prefix = ""
        if "embeddings.word_embeddings.weight" not in weights and \
                "bert.embeddings.word_embeddings.weight" in weights:
            self.prefix = "bert."

    def __call__(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        key = self.prefix + name
        if key not in self.weights:
            raise IRError(f"BERT weight {key!r} is missing", where="build_bert_encoder weights",
                          fix="pass the checkpoint's tensors with Hugging Face names "
                              "(e.g. read_safetensors('model.safetensors')[0])")
        arr = self.weights[key]
        if tuple(arr.shape) != shape:
            raise ShapeError(f"BERT weight {key!r} has shape {tuple(arr.shape)}, the config implies {shape}",
                             where="build_bert_encoder weights",
                             fix="check that config.json belongs to these weights")
        want = self.dtype.np
        if arr.dtype == want and arr.flags.c_contiguous:
            return arr  # zero-copy: memory-mapped weights stay memory-mapped
        return np.ascontiguousarray(arr, dtype=want)


def build_bert_encoder(config: Mapping[str, Any], weights: Mapping[str, np.ndarray], *,
                       dtype: DType | str = "f32", pooling: str = "mean", normalize: bool = True,
                       token_type_ids: bool = False, name: str = "bert_encoder") -> Graph:
    """Build a BERT encoder graph (see the module docstring for inputs and outputs).

    ``config`` is the Hugging Face ``config.json`` (``hidden_size``, ``num_hidden_layers``,
    ``num_attention_heads``, ``intermediate_size``, ``layer_norm_eps``, ``hidden_act``, ...);
    ``weights`` maps Hugging Face tensor names to arrays. ``pooling`` is ``"mean"`` (mask-weighted
    mean of the last hidden states), ``"cls"`` (the first token) or ``"none"``.
    """
    dt = DType.parse(dtype)
    if not dt.is_float:
        raise IRError(f"build_bert_encoder: dtype {dt} is not a float dtype", fix="use f32, f16, bf16 or f64")
    if pooling not in POOLINGS:
        raise IRError(f"build_bert_encoder: unknown pooling {pooling!r}",
                      fix=f"choose one of {', '.join(POOLINGS)}")
    if normalize and pooling == "none":
        raise IRError("build_bert_encoder: normalize=True needs a pooled output",
                      fix="choose pooling='mean' or 'cls', or pass normalize=False")
    hidden = int(_cfg(config, "hidden_size"))
    layers = int(_cfg(config, "num_hidden_layers"))
    heads = int(_cfg(config, "num_attention_heads"))
    inter = int(_cfg(config, "intermediate_size"))
    vocab = int(_cfg(config, "vocab_size"))
    max_pos = int(_cfg(config, "max_position_embeddings"))
    type_vocab = int(_cfg(config, "type_vocab_size", 2))
    eps = float(_cfg(config, "layer_norm_eps", 1e-12))
    act = str(_cfg(config, "hidden_act", "gelu"))
    pos_type = str(_cfg(config, "position_embedding_type", "absolute"))
    if act not in ("gelu", "gelu_new", "gelu_pytorch_tanh"):
        raise IRError(f"build_bert_encoder: hidden_act {act!r} is not supported",
                      fix="supported: gelu (exact), gelu_new / gelu_pytorch_tanh (tanh approximation)")
    if pos_type != "absolute":
        raise IRError(f"build_bert_encoder: position_embedding_type {pos_type!r} is not supported",
                      fix="only absolute position embeddings are implemented")
    if hidden % heads:
        raise ShapeError(f"build_bert_encoder: hidden_size {hidden} is not divisible by "
                         f"num_attention_heads {heads}", fix="check config.json")
    head_dim = hidden // heads
    approximate = "none" if act == "gelu" else "tanh"
    w = _Weights(weights, dt)

    g = GraphBuilder(name)
    ids = g.input("input_ids", "i64", ("batch", "seq"))
    mask = g.input("attention_mask", "i64", ("batch", "seq"))
    types = g.input("token_type_ids", "i64", ("batch", "seq")) if token_type_ids else None

    def param(hf: str, shape: tuple[int, ...]) -> Tensor:
        return g.param(hf, w(hf, shape))

    def linear(x: Tensor, hf: str, n_out: int, n_in: int) -> Tensor:
        return g.linear(x, param(f"{hf}.weight", (n_out, n_in)), param(f"{hf}.bias", (n_out,)))

    def layer_norm(x: Tensor, hf: str) -> Tensor:
        return g.layer_norm(x, param(f"{hf}.weight", (hidden,)), param(f"{hf}.bias", (hidden,)), eps=eps)

    # -- embeddings ------------------------------------------------------------------------------
    h = g.embedding(param("embeddings.word_embeddings.weight", (vocab, hidden)), ids)
    pos_table = param("embeddings.position_embeddings.weight", (max_pos, hidden))
    positions = g.iota(shape=("seq",), axis=0, dtype=DType.I64)
    h = h + g.embedding(pos_table, positions)  # (seq, hidden) broadcasts over batch
    type_table = param("embeddings.token_type_embeddings.weight", (type_vocab, hidden))
    if types is not None:
        h = h + g.embedding(type_table, types)
    else:  # all-zero token types: row 0 of the table, broadcast (a slice of the param, no copy)
        h = h + g.slice(type_table, starts=(0,), stops=(1,), axes=(0,))
    h = layer_norm(h, "embeddings.LayerNorm")

    # -- encoder layers ----------------------------------------------------------------------------
    scale = 1.0 / math.sqrt(head_dim)

    def split_heads(x: Tensor) -> Tensor:  # (B, S, H*D) -> (B, H, S, D)
        return x.reshape("batch", "seq", heads, head_dim).transpose(0, 2, 1, 3)

    for i in range(layers):
        p = f"encoder.layer.{i}"
        q = split_heads(linear(h, f"{p}.attention.self.query", hidden, hidden))
        k = split_heads(linear(h, f"{p}.attention.self.key", hidden, hidden))
        v = split_heads(linear(h, f"{p}.attention.self.value", hidden, hidden))
        ctx = g.attention(q, k, v, mask, mask="padding", scale=scale)
        ctx = ctx.transpose(0, 2, 1, 3).reshape("batch", "seq", hidden)
        h = layer_norm(linear(ctx, f"{p}.attention.output.dense", hidden, hidden) + h,
                       f"{p}.attention.output.LayerNorm")
        ff = g.gelu(linear(h, f"{p}.intermediate.dense", inter, hidden), approximate=approximate)
        h = layer_norm(linear(ff, f"{p}.output.dense", hidden, inter) + h, f"{p}.output.LayerNorm")

    # -- pooling -----------------------------------------------------------------------------------
    if pooling == "none":
        g.output(h, "last_hidden_state")
        return g.build()
    if pooling == "cls":
        # gather, not slice: slicing 0:1 out of the symbolic seq dim is rejected before specialising
        pooled = g.gather(h, g.const(0, DType.I64), axis=1)  # (B, hidden)
    else:
        m = mask.astype(dt).reshape("batch", "seq", 1)
        total = (h * m).sum(axes=1)  # (B, hidden)
        count = g.maximum(m.sum(axes=1), g.const(_floor(MEAN_POOL_MIN_COUNT, dt), dt))  # (B, 1)
        pooled = total / count
    if normalize:
        norm = g.sqrt((pooled * pooled).sum(axes=1, keepdims=True))
        pooled = pooled / g.maximum(norm, g.const(_floor(NORMALIZE_EPS, dt), dt))
    g.output(pooled, "embeddings")
    return g.build()


__all__ = ["POOLINGS", "build_bert_encoder"]
