"""A oneDNN float32 conv primitive with oneDNN's ReLU post-op (``max(y, 0)``, as a conv chain's finite
variant runs it) on buffers of its own, for the kernel
benchmarks (``bench/stem_conv.py``, ``bench/winograd_conv.py``): the peer rlx-cpu's own conv kernels
are measured against."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import numpy as np


def relu_conv(api: dict[str, Any], shape: tuple[int, ...], wshape: tuple[int, ...], stride: int, pad: int,
              nchw_src: bool) -> tuple[Callable[[], None], Any, str]:
    """``(run, keep, impl)``: the conv of an input of ``shape`` with weights of ``wshape`` (OIHW),
    square stride and padding, the source plain NCHW (``nchw_src``: a stem reading the model's
    input) or in the layout oneDNN picks; random data; ``keep`` holds what ``run`` reads."""
    from rlx_cpu import onednn_conv as oc

    fns = api["fns"]
    p = oc._Prim(api)
    n, c, h, w = shape
    o, _, kh, kw = wshape
    ho, wo = (h + 2 * pad - kh) // stride + 1, (w + 2 * pad - kw) // stride + 1
    src = p.md_plain(shape, (c * h * w, h * w, w, 1)) if nchw_src else p.md_any(shape)
    bias = np.zeros(o, np.float32)
    bmd = p.md_plain(bias.shape, (1,))
    pd = oc._VP()
    p.check(fns["dnnl_convolution_forward_primitive_desc_create"](
        ctypes.byref(pd), api["engine"], oc._FWD_INFERENCE, oc._CONV_DIRECT, src, p.md_any(wshape), bmd,
        p.md_any((n, o, ho, wo)), oc._dims((stride, stride)), oc._dims((0, 0)), oc._dims((pad, pad)),
        oc._dims((pad, pad)), oc._post_ops(p, False, "relu_drops_nan", None)), "conv")
    p.owned.append(("dnnl_primitive_desc_destroy", pd))
    q, xmd = fns["dnnl_primitive_desc_query_md"], oc._QUERY_EXEC_ARG_MD
    keep: list[Any] = [p, bias]

    def buf(md: Any) -> Any:
        a = oc._aligned(int(fns["dnnl_memory_desc_get_size"](md)) + 64)
        a[:] = np.random.default_rng(0).random(a.size, np.float32) - 0.5
        keep.append(a)
        return p.memory(md, a.ctypes.data)
    args = [(oc._ARG_SRC, buf(q(pd, xmd, oc._ARG_SRC))), (oc._ARG_WEIGHTS, buf(q(pd, xmd, oc._ARG_WEIGHTS))),
            (oc._ARG_DST, buf(q(pd, xmd, oc._ARG_DST))), (oc._ARG_BIAS, p.memory(bmd, bias.ctypes.data))]
    args += p.own_scratchpad(pd, keep)
    prim = p.primitive(pd)
    arr = (oc._ExecArg * len(args))(*(oc._ExecArg(a, m) for a, m in args))
    ex, stream = fns["dnnl_primitive_execute"], oc._stream(api)
    return lambda: ex(prim, stream, len(args), arr), keep, oc.impl_info(api, pd)
