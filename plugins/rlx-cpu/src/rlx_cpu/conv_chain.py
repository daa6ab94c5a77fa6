"""Chains of convolutions (and max pools) whose activations stay in oneDNN's blocked layout.

Why: each oneDNN conv of :mod:`rlx_cpu.onednn_conv` reorders its NCHW input into the blocked layout
its direct kernel reads (nChw16c here) and its output back, and at batch 1 every piece of a split
conv repeats the input reorder; ResNet-18 at batch 1 spent 34 of 36 ms in its 20 convs, MLAS (ONNX
Runtime) keeps NCHWc between convs. Here a fusion rule (stage ``legal``, after
:mod:`rlx_cpu.conv_fusion` made the conv tails) collapses a run of conv / conv-tail / max_pool2d
nodes whose intermediate values nothing else reads into one ``rlx_cpu.conv_chain`` node. Two more
step kinds let MobileNet-style nets be one chain: a scalar clip (``maximum``/``minimum`` with a
constant, as ONNX Clip / ReLU6 imports), applied in place on the blocked buffer with NumPy, which
keeps NaN as the IR does (oneDNN's clip post-op gives the lower bound), or, in the variant that runs
while the chain's input is finite, as the conv's clip post-op (:data:`FUSE_CLIPS`); taken only for
bounds that keep 0 at 0, so the zero padding channels stay zero. And a residual ``add`` without
activation, folded into the plain conv2d_bias it adds to as oneDNN's sum post-op (a ``conv2d_bias``
step with ``res``: conv, then ``+ residual``). MobileNetV2 (zoo, 64x64, b1): 48 convs, 35 clips and
10 adds in one chain (each ReLU6 one ``np.clip`` pass): fastest of 50 runs 0.87-0.91 ms vs 1.62-1.72
ms before (2026-12-02, old/new alternating, 2-core machine, load ~3). And a squeeze-excitation block
(EfficientNet, MobileNetV3, RegNetY: global mean, two 1x1 convs as FCs, sigmoid or hard-sigmoid
gate, channel scale) is one ``se`` step, a Numba pass on the blocked buffer (:mod:`rlx_cpu._se_nb`),
where each SE ended a chain: EfficientNet-B0's 33 chains, 14 lone projection convs and 16 x (mean,
sigmoid, mul) became one chain (zoo, 64x64, b1: fastest of 120 runs 1.10 vs 1.97 ms;
MobileNetV3-small 0.25 vs 0.51 ms; 2026-12-02, ``SE`` on/off alternating in one process, load ~5). A
global average pool after the last conv (the classifiers' head) is the chain's last step
(:data:`MEAN`): the mean read from the blocked buffer, written as the chain's output, so neither the
output reorder nor a reduce_mean kernel runs. Its kernel reorders the chain's input once, runs every
conv on blocked source and destination (constant weights packed once when the kernel is bound; a
residual is added by the sum post-op, in place where the residual dies there), max pools with a
Numba kernel on the blocked layout (NaN wins, as the core's max_pool2d), and reorders only the
chain's output back to NCHW. The intermediates live in this thread's conv scratch
(:func:`rlx_cpu.conv.scratch`), planned so that dead values' bytes are reused.

Layouts: each conv reads its input in the layout oneDNN prefers for it (nChw16c or NHWC here; see
:data:`BRG_FIRST`), which is mostly the layout the previous conv wrote, so a chain reorders at its
edges and where the preferred layout changes (ResNet: once, after the stem's pool).

Threads: by default every conv is one primitive on an OpenMP team of the threads the load leaves
(:data:`OPENMP`, ``RLX_CPU_CONV_OPENMP``; the row pool's probe of /proc/stat picks the count and a
primitive is made once per count, so a core taken by another process shrinks the team rather than
holding every conv up; oneDNN's split gives the same bits for every count). The team's threads wait
for the next primitive spinning, so a chain of small convs (MobileNet, EfficientNet, ResNet at b1)
pays no kernel wake-up per conv. With ``RLX_CPU_CONV_OPENMP=0`` every conv is a one-thread
primitive and a conv with enough work is cut into pieces that the row pool's threads take in turn
(:mod:`rlx_cpu.parallel`): whole images, output rows (NHWC, one image: each piece reads its input
rows and the kernel's halo in place) or output channels (whole blocks in nChw16c), whichever makes a
piece read the fewest bytes (:func:`_choose_cut`: convs with big weights and small outputs, ResNet's
layer3/4, by channels); nothing is reordered per piece as :mod:`rlx_cpu.onednn_conv`'s row pieces do
(an NHWC channel piece copies its own output in); no OpenMP team is opened.

``USE = False`` (or ``RLX_CPU_CONV_CHAIN=0``) binds a chain as its member ops one at a time
(:mod:`rlx_cpu.conv`'s per-conv path on NCHW intermediates): the same graph, the old kernels, for
A/B runs. That is also what runs where oneDNN is missing, refuses a shape, or a padded conv's fed
weights hold NaN/Inf (oneDNN skips the zero padding they would multiply).
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rlx_core.plugin import (
    REGISTRY,
    Attrs,
    AttrSpec,
    DType,
    FusionRule,
    GraphBuilder,
    Node,
    OpSchema,
    Region,
    Tensor,
    TensorType,
    release_file_pages,
)

from . import settings

if TYPE_CHECKING:
    import numpy as np

CHAIN = "rlx_cpu.conv_chain"
Run = Callable[[], None]

SETTING = settings.CONV_CHAIN
#: False: chains run as their member ops one at a time (A/B runs; tests).
USE = True
#: True: every conv of a chain is one primitive on an OpenMP team of the pool's active threads
#: (when ``RLX_CPU_CONV_OPENMP`` is on, the default). False: one-thread primitives, big convs cut
#: into pieces (images, or output channel blocks) that the row pool's threads take in turn
#: (``bench/conv_ab.py --chain-pieces`` compares them). Measured 2026-12-02 13:00 UTC, quiet
#: 2-core EPYC, one process, blocks alternating (p50 ms, pieces -> team): ResNet-18 64x64 b1 3.45
#: -> 2.07, b8 9.37 -> 8.96; MobileNetV2 b1 0.61 -> 0.50, b8 5.33 -> 2.45; EfficientNet-B0 b1 1.50
#: -> 1.19, b8 8.20 -> 4.80; RegNetY-400MF b1 1.38 -> 0.80, b8 8.17 -> 4.45 (the pieces left the
#: depthwise and small convs on one thread; a team splits every conv, and its threads wait for the
#: next primitive spinning, not through a kernel wake-up). Bit-identical for every thread count.
OPENMP = True
#: Multiply-adds of a chain's convs below which its primitives are made for one thread (with the
#: team on): each primitive of a team opens an OpenMP region, ~0.5 us that a conv this small does
#: not win back. conv1d_audio (its chain: three convs, 163K multiply-adds) at b1, the whole model:
#: 22 us on the calling thread, 25 on the team (``bench/conv_ab.py --zoo conv1d_audio --batch 1
#: --chain-team``); DeepLabV3 (b1) keeps the team: 1.06 ms against 1.33 alone (``--chain-solo``).
SOLO_MACS = 500_000
#: True: where oneDNN's preferred conv for its own layout is a brgconv kernel (NHWC here) and the
#: producer's layout (ResNet's stem writes nChw16c) would give an older one, reorder once into the
#: preferred layout; the convs after it then read it as it is. False: keep the producer's layout
#: unless that gives a GEMM or reference conv. Measured in one process, 2026-12-02 (chain on/off
#: alternating, 2-core EPYC, load ~2): ResNet-18 64x64 b1 4.56 vs 6.24 ms, FCN-ResNet-18 5.37 vs
#: 6.84 ms, ResNet-18 224x224 b1 34.3 vs 36.1 ms, b8 fastest 141 vs 154 ms.
BRG_FIRST = True
#: True: a conv's pieces are cut where each reads the fewest bytes (:func:`_choose_cut`), output
#: channels included (NHWC: each piece writes a dense buffer of its own, copied into its channels).
#: False: the earlier cuts (images, else at batch 1 output rows in NHWC, channel blocks in nChw16c).
#: Measured in one process, 2026-12-02 (old/new alternating, RLX_CPU_THREADS=2, 2-core EPYC at load
#: 5-6): ResNet-18 64x64 b1, layer3's 3x3 convs 172-183 -> 156-164 us (entry minima), layer4's
#: ~340 us either way (its 9.4 MB of weights come from DRAM while other processes load it); run
#: one after another, layer3's two channel pieces take 73 us, its row pieces 86 (whole: 78).
CUT_CHANNELS = True

#: Conv ops a chain takes, with the activation their tail applies (conv_fusion's ops).
_CONV_OPS = ("conv2d_bias", "rlx_cpu.conv2d_bias_relu", "rlx_cpu.conv2d_bias_add_relu",
             "rlx_cpu.conv2d_bias_silu", "rlx_cpu.conv2d_bias_hardswish")
_POOL = "max_pool2d"
#: Scalar clip steps (ONNX Clip, ReLU6, imports as maximum then minimum with scalar constants):
#: applied in place on the blocked buffer with NumPy, which propagates NaN as the IR does
#: (oneDNN's clip post-op turns NaN into the lower bound: used only where no NaN can arise,
#: see :data:`FUSE_CLIPS`).
_CLIPS = ("maximum", "minimum")
#: True: a conv of the chain's NCHW input with few channels and a big kernel (ResNet's stem) runs on
#: rlx-cpu's direct kernel (:mod:`rlx_cpu.stem_conv`, ``RLX_CPU_STEM_CONV``), writing the layout
#: the next conv reads. ResNet-18's stem (3->64 7x7 s2, 224x224, two threads): 1.50-1.72 vs
#: 1.71-2.71 ms at b1, 10.8-12.6 vs 13.1-14.0 ms at b8 (``python bench/stem_conv.py``, two runs;
#: the model: ``bench/conv_ab.py --onednn-stem``).
STEM_CONV = True
#: True: in the chain's finite variant, 3x3 stride-1 convs run as Winograd's F(4x4, 3x3)
#: (:mod:`rlx_cpu.winograd`, ``RLX_CPU_WINOGRAD``) where :func:`rlx_cpu.winograd.worth_it` says it
#: beats oneDNN's direct conv (ResNet's layer1 and layer2). Only there: its transforms spread a NaN
#: or Inf over a 4x4 output tile, and they amplify magnitudes by at most 100 (input) x 361 (output)
#: over the direct sum's bound (|U| <= the sum of |w| over the 3x3 taps), so a conv whose output the
#: variant's bound keeps below :data:`_SAFE` keeps its intermediates below 3.7e34, within float32.
#: :func:`_finite_plan` takes a conv only where that bound holds for inputs of RMS :data:`RELU_RMS`
#: and lowers the variant's run-time limit on the input's norm to it.
WINOGRAD = True
#: Members a region needs: a single conv gains nothing (its own reorders are all it has).
MIN_MEMBERS = 2
#: Squeeze-excitation step: ``x * gate(fc2(act(fc1(reduce_mean_hw(x)))))`` with 1x1-conv FCs, as one
#: Numba pass over the blocked buffer (:mod:`rlx_cpu._se_nb`), so that an SE no longer ends a chain.
_SE = "se"
#: False: SE blocks are not chain steps (each SE ends a chain, as before; A/B runs).
SE = True
#: FC1 ops an SE step takes (its activation: none, ReLU, SiLU), the 1x1 convs' attributes.
_SE_FC1 = ("conv2d_bias", "rlx_cpu.conv2d_bias_relu", "rlx_cpu.conv2d_bias_silu")
_FC = {"strides": (1, 1), "pads": (0, 0, 0, 0), "dilations": (1, 1), "groups": 1}
#: A global average pool (``reduce_mean`` over H, W) as a chain's last step: read from the blocked
#: buffer, so the chain's output reorder and the separate reduce_mean kernel go. False: not taken.
MEAN = True
_MEAN = "reduce_mean"
#: True: a clip pair (ReLU6) right after a conv becomes the conv's clip post-op (no NumPy pass) in
#: the chain's finite variant, run while the chain's input is finite. oneDNN's clip turns NaN into
#: the lower bound where the IR keeps NaN, so the finite variant may run only where no NaN can
#: arise: a finite input and constant finite weights make none unless a value overflows, and
#: :func:`_finite_plan` bounds every value up to the last NaN-losing step (by the input's largest
#: possible magnitude) far below float32's range before the variant is made. A NaN or Inf in the
#: input runs the exact variant (NumPy clips, made on first need). MobileNetV2 (zoo, 64x64, b1):
#: 35 clips of ~5.7 us each left the chain.
FUSE_CLIPS = True
#: True: in the finite variant (see FUSE_CLIPS) max pools are oneDNN's pooling primitive on the
#: OpenMP team, whose max skips NaN where the IR's keeps it. ResNet-18 224x224 b1: the stem's pool
#: (64x112x112) took 720 us as the NumPy pass.
FINITE_POOLS = True
#: True: in the finite variant a conv's ReLU is oneDNN's own relu post-op (``max(y, 0)``, which
#: turns NaN into 0) instead of the NaN-keeping form (elu with alpha 0, then ``1 * y + 0``), which
#: evaluates an exp for every negative output. Only where the bound holds for inputs of RMS up to
#: :data:`RELU_RMS`: every ReLU conv then reads values the bound covers, so a ReLU post-op joins the
#: NaN-losing steps whose input must stay far below float32's range. Measured 2026-12-03 (2-core
#: Ice Lake VM, ``python bench/conv_ab.py --batch 1 --batch 8 --no-pool --onednn-stem --elu-relu``,
#: three runs, raw docs/device-runs/conv-ab-cpu-2026-12-03-stem.txt; ``onednn-stem`` vs ``elu-relu``
#: is this switch alone): ResNet-18 224x224 b1 17.7 vs 20.3, 21.2 vs 22.3, 25.3 vs 26.1 ms; b8
#: 118.0 vs 133.4, 164.5 vs 169.7, but 237.0 vs 200.9 ms in the noisiest run.
FINITE_RELU = True
#: Input RMS the finite variant with ReLU post-ops must cover (raw 8-bit pixels: at most 255);
#: where the weights' bound allows less, ReLUs keep the NaN-keeping form.
RELU_RMS = 256.0
_RELU_OPS = ("rlx_cpu.conv2d_bias_relu", "rlx_cpu.conv2d_bias_add_relu")
#: Largest input magnitude the finite variant is checked for: ``x . x`` (the run-time test, one
#: BLAS dot) is finite in float32 only for ``|x| < 1.9e19``.
_X_MAX = 1.9e19
#: Bound every value must stay under for the finite variant (float32 overflows at 3.4e38).
_SAFE = 1e30


def _steps(attrs: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The chain's steps. Values: 0 is ``x``, ``k + 1`` the output of step ``k``; ``w``/``b`` index
    the op's inputs. The default (no ``steps``) is one ``conv2d_bias`` of inputs 0, 1, 2 with the
    op's own conv attributes: the conformance suite's conv2d_bias cases feed it so."""
    text = attrs.get("steps") or ""
    if not text:
        conv = {k: attrs[k] for k in ("strides", "pads", "dilations", "groups")}
        return [{"op": "conv2d_bias", "src": 0, "w": 1, "b": 2, "res": None, "attrs": conv}]
    out: list[dict[str, Any]] = json.loads(str(text))
    return out


def _step_attrs(st: Mapping[str, Any]) -> Attrs:
    schema: OpSchema = REGISTRY.get(st["op"])
    attrs: Attrs = schema.check_attrs(dict(st["attrs"]), CHAIN)
    return attrs


def _is_conv(st: Mapping[str, Any]) -> bool:
    return bool(st["op"] not in (_POOL, _SE, _MEAN) and st["op"] not in _CLIPS)


def _step_inputs(st: Mapping[str, Any], vals: Sequence[Any], xs: Sequence[Any]) -> list[Any]:
    if st["op"] == _SE:
        return [vals[st["src"]], xs[st["w"]], xs[st["b"]], xs[st["w2"]], xs[st["b2"]]]
    ins = [vals[st["src"]]]
    if _is_conv(st):
        ins += [xs[st["w"]], xs[st["b"]]]
    if st.get("res") is not None:
        ins.append(vals[st["res"]])
    return ins


def _se_ops(st: Mapping[str, Any], ins: Sequence[Any], op: Callable[[str, list[Any], dict[str, Any]], Any],
            const: Callable[[float], Any]) -> Any:
    """An SE step as its original ops (``op(name, inputs, attrs)``; ``ins``: the step's inputs)."""
    x, w1, b1, w2, b2 = ins
    z = op(st["fc1"], [op("reduce_mean", [x], {"axes": (2, 3), "keepdims": True}), w1, b1], _FC)
    z = op("conv2d_bias", [z, w2, b2], _FC)
    gate = st["gate"]
    if gate[0] == "sigmoid":
        z = op("sigmoid", [z], {})
    else:  # ONNX HardSigmoid as the importer writes it: min(max(a*z + b, lo), hi)
        for name, c in zip(("mul", "add", "maximum", "minimum"), gate[1:]):
            z = op(name, [z, const(c)], {})
    return op("mul", [z, x], {})


def _plain(st: Mapping[str, Any]) -> bool:
    """A ``conv2d_bias`` step with a residual: the conv, then ``+ residual`` (no activation)."""
    return bool(st["op"] == "conv2d_bias" and st.get("res") is not None)


def _infer(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    vals: list[TensorType] = [ts[0]]
    for st in _steps(attrs):
        if st["op"] in _CLIPS or st["op"] == _SE:  # the source's type
            vals.append(vals[st["src"]])
            continue
        if _plain(st):
            (t,) = REGISTRY.get(st["op"]).infer(_step_inputs(st, vals, ts)[:3], _step_attrs(st))
            vals.append(t)
            continue
        (t,) = REGISTRY.get(st["op"]).infer(_step_inputs(st, vals, ts), _step_attrs(st))
        vals.append(t)
    return [vals[-1]]


def _reference(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    import numpy as np

    vals: list[np.ndarray] = [xs[0]]
    for st in _steps(attrs):
        src = vals[st["src"]]
        if st["op"] in _CLIPS:
            c = np.asarray(st["c"], src.dtype)
            vals.append(REGISTRY.get(st["op"]).reference([src, c], Attrs({}))[0])
            continue
        if st["op"] == _SE:
            def ref(name: str, a: list[Any], at: dict[str, Any]) -> Any:
                schema = REGISTRY.get(name)
                return schema.reference(a, schema.check_attrs(dict(at), CHAIN))[0]
            vals.append(_se_ops(st, _step_inputs(st, vals, xs), ref,
                                lambda c, t=src.dtype: np.asarray(c, t)))  # type: ignore[misc]
            continue
        sins = _step_inputs(st, vals, xs)
        if _plain(st):
            (y,) = REGISTRY.get(st["op"]).reference(sins[:3], _step_attrs(st))
            (y,) = REGISTRY.get("add").reference([y, sins[3]], Attrs({}))
        else:
            (y,) = REGISTRY.get(st["op"]).reference(sins, _step_attrs(st))
        vals.append(y)
    return [vals[-1]]


def _decompose(g: GraphBuilder, ins: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Tensor]:
    vals: list[Tensor] = [ins[0]]
    for st in _steps(attrs):
        if st["op"] in _CLIPS:
            vals.append(g.op(st["op"], vals[st["src"]], g.const(float(st["c"]), "f32"), name=None))
            continue
        if st["op"] == _SE:
            vals.append(_se_ops(st, _step_inputs(st, vals, ins),
                                lambda name, a, at: g.op(name, *a, name=None, **at),
                                lambda c: g.const(float(c), "f32")))
            continue
        sins = _step_inputs(st, vals, ins)
        if _plain(st):
            y = g.op(st["op"], *sins[:3], name=None, **dict(_step_attrs(st)))
            vals.append(g.op("add", y, sins[3], name=None))
            continue
        vals.append(g.op(st["op"], *sins, name=None, **dict(_step_attrs(st))))
    return [vals[-1]]


def _flops(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> float:
    vals: list[TensorType] = [ins[0]]
    total = 0.0
    for st in _steps(attrs):
        if st["op"] in _CLIPS:
            t = vals[st["src"]]
            total += float(t.numel())
            vals.append(t)
            continue
        if st["op"] == _SE:  # the mean and the scale pass, the two FCs (2 flops a weight an image)
            t = vals[st["src"]]
            images = t.shape[0] if isinstance(t.shape[0], int) else 1
            total += 2.0 * float(t.numel()) + 4.0 * float(ins[st["w"]].numel()) * images
            vals.append(t)
            continue
        schema = REGISTRY.get(st["op"])
        sins = _step_inputs(st, vals, ins)
        sat = _step_attrs(st)
        if _plain(st):
            sins = sins[:3]
        (t,) = schema.infer(sins, sat)
        total += float(schema.flops(sins, [t], sat))
        vals.append(t)
    return total


def _condition(xs: Sequence[np.ndarray], attrs: Attrs) -> tuple[int, float]:
    """The conformance tolerance (terms summed per output, their magnitude): every conv's
    ``ci*kh*kw`` products plus bias and residual, the magnitude from the chain run on ``|inputs|``
    (an upper bound on every intermediate's size)."""
    import numpy as np

    a = [np.where(np.isfinite(v), np.abs(np.asarray(v, np.float64)), 0.0) for v in xs]
    terms = 0
    for st in _steps(attrs):
        if _is_conv(st):
            _, cg, kh, kw = a[st["w"]].shape
            terms += cg * kh * kw + 1 + (st.get("res") is not None)
        elif st["op"] == _SE:  # the two FCs' sums and the scale (the mean sums in float64)
            r, c = a[st["w"]].shape[:2]
            terms += r + c + 3
    (mag,) = _reference(a, attrs)
    return terms, float(mag.max()) if mag.size else 0.0


@functools.cache
def _schemas() -> tuple[OpSchema, ...]:
    from dataclasses import replace

    conv = REGISTRY.get("conv2d_bias")
    spec = REGISTRY.get("add").cases
    cases = None if spec is None else replace(spec, family="conv2d_bias", domains=(), overflow=False)
    return (OpSchema(
        CHAIN, ("x", "params*"), _infer, reference=_reference, level="hir", category="conv",
        dtypes=(DType.F32,), attrs=(AttrSpec("steps", "str", default=""), *conv.attrs),
        decompose=_decompose, flops=_flops, provider="rlx-cpu", differentiable=False, amp="low",
        accumulates=True, cases=cases, extra={"condition": _condition},
        doc="A chain of conv2d_bias / conv-tail / max_pool2d / clip / squeeze-excitation ops, maybe "
            "ending in a global mean (``steps``, JSON) run with the "
            "activations in oneDNN's blocked layout between them; without ``steps``, one conv2d_bias"),)


def ops() -> list[OpSchema]:
    return list(_schemas())


# -- the fusion rule -----------------------------------------------------------------------------

def find_conv_chains(g: Any) -> list[Region]:
    """Regions of consecutive chainable nodes (f32 convs with constant, finite weights and bias,
    their fused tails, max_pool2d) reading one activation from outside (the first conv's input;
    residuals must come from inside), whose values other than the last nothing outside reads."""
    import numpy as np

    if not SETTING.get():
        return []
    outs = set(g.outputs)
    cons = g.consumers

    def scalar(v: str) -> float | None:
        arr = g.weights.get(v)
        if arr is None or np.size(arr) != 1 or np.ndim(arr) > 4 or not np.isfinite(arr).all():
            return None
        return float(np.asarray(arr).reshape(()))

    def clip_of(n: Node) -> tuple[str, float] | None:
        """(the activation, the bound) of ``maximum``/``minimum`` with a finite scalar constant
        that keeps 0 at 0 (the zero padding channels of a blocked layout must stay zero)."""
        if n.op not in _CLIPS or len(n.inputs) != 2:
            return None
        for a, b in (n.inputs, n.inputs[::-1]):
            c = scalar(b)
            if c is not None and scalar(a) is None and g.types[a] == g.types[n.outputs[0]]:
                return (a, c) if (c <= 0.0 if n.op == "maximum" else c >= 0.0) else None
        return None

    def add_of(n: Node, made: set[str], x: str) -> tuple[str, str] | None:
        """(the plain conv2d_bias output, the residual) of ``add(conv, residual)`` whose conv only
        this add reads: the conv takes the residual with oneDNN's sum post-op."""
        if n.op != "add" or len(n.inputs) != 2 or n.inputs[0] == n.inputs[1]:
            return None
        for y, r in (n.inputs, n.inputs[::-1]):
            p = prod.get(y)
            if (p is not None and p.op == "conv2d_bias" and y in made
                    and (r == x or (r in made and pos[prod[r].name] < pos[p.name]))
                    and y not in outs and len(cons.get(y, ())) == 1 and g.types[y] == g.types[r]
                    and g.types[r] == g.types[n.outputs[0]]):
                return y, r
        return None

    prod = {n.outputs[0]: n for n in g.nodes if n.outputs}
    pos = {n.name: k for k, n in enumerate(g.nodes)}
    ses = _se_blocks(g, outs, scalar) if SE else {}

    def chainable(n: Node) -> bool:
        t = g.types[n.outputs[0]]
        if len(n.outputs) != 1 or t.dtype != DType.F32 or t.rank != 4:
            return False
        if n.op == _POOL or n.op == "add":
            return True
        if n.op in _CLIPS:
            return clip_of(n) is not None
        if n.op not in _CONV_OPS:
            return False
        w, b = n.inputs[1], n.inputs[2]
        if not (w in g.weights and b in g.weights and g.types[n.inputs[0]].dtype == DType.F32):
            return False
        finite = bool(np.isfinite(np.asarray(g.weights[w])).all())
        release_file_pages(g.weights[w])  # read once to check: a memory-mapped weight's pages leave the RSS
        return finite

    regions: list[Region] = []
    nodes = list(g.nodes)
    i = 0
    while i < len(nodes):
        first = nodes[i]
        # The first member is a conv reading the chain's one outside activation (no residual).
        if not (chainable(first) and first.op in _CONV_OPS and first.op != "rlx_cpu.conv2d_bias_add_relu"):
            i += 1
            continue
        members = [first]
        made = {first.outputs[0]}
        taken: set[str] = set()  # SE nodes taken with their reduce_mean
        for n in nodes[i + 1:]:
            if n.name in taken:
                continue
            se = ses.get(n.name)
            if se is not None and se["src"] in made:  # the whole SE block: one step
                members += se["nodes"]
                made.update(m.outputs[0] for m in se["nodes"])
                taken.update(m.name for m in se["nodes"])
                continue
            if MEAN and n.op == _MEAN and _global_mean(g, n) and n.inputs[0] in made:
                members.append(n)  # its (N, C[, 1, 1]) output ends the chain
                break
            if not chainable(n):
                if any(v in made for v in n.inputs):  # a value escapes: the chain ends here
                    break
                continue  # an unrelated node in between
            if n.op == "add":
                ar = add_of(n, made, first.inputs[0])
                acts = list(n.inputs) if ar is not None else [""]
            elif n.op in _CLIPS:
                acts = [clip_of(n)[0]]  # type: ignore[index]
            else:
                acts = [n.inputs[0]] + ([n.inputs[3]] if n.op == "rlx_cpu.conv2d_bias_add_relu" else [])
            if not all(v in made or v == first.inputs[0] for v in acts):
                if any(v in made for v in n.inputs):
                    break
                continue
            members.append(n)
            made.add(n.outputs[0])
        members = _trim(members, cons, outs)
        region = _region(g, members, ses) if len(members) >= MIN_MEMBERS else None
        if region is not None:
            regions.append(region)
        i = nodes.index(members[-1]) + 1 if members else i + 1
    return regions


def _se_blocks(g: Any, outs: set[str], scalar: Callable[[str], float | None]) -> dict[str, dict[str, Any]]:
    """Squeeze-excitation blocks by their reduce_mean's name: ``reduce_mean(x, (2, 3), keepdims)``
    -> 1x1 conv + bias (+ ReLU or SiLU) -> 1x1 conv + bias -> sigmoid, or the importer's
    HardSigmoid (``mul``/``add`` by finite scalars, then ``maximum``/``minimum``) -> ``mul`` with x,
    the FCs' weights finite constants, every value but the last read only by the next of these."""
    import numpy as np

    cons = g.consumers

    def only(v: str) -> Node | None:
        c = cons.get(v, ())
        return c[0] if len(c) == 1 and v not in outs and len(c[0].outputs) == 1 else None

    def fc(n: Node | None, ops: tuple[str, ...], shape: tuple[int, int]) -> bool:
        if n is None or n.op not in ops or len(n.inputs) != 3:
            return False
        w, b = (g.weights.get(v) for v in n.inputs[1:])
        at = {k: tuple(v) if isinstance(v, (list, tuple)) else v for k, v in n.attrs.items()}
        return (w is not None and b is not None and w.shape == (*shape, 1, 1) and b.shape == shape[:1]
                and w.dtype == np.float32 and b.dtype == np.float32
                and all(at.get(k, d) == d for k, d in _FC.items())
                and bool(np.isfinite(w).all() and np.isfinite(b).all()))

    found: dict[str, dict[str, Any]] = {}
    for n in g.nodes:
        if n.op != "reduce_mean" or len(n.inputs) != 1 or len(n.outputs) != 1:
            continue
        x = n.inputs[0]
        t = g.types[x]
        axes = n.attrs.get("axes")
        if (t.dtype != DType.F32 or t.rank != 4 or not n.attrs.get("keepdims") or axes is None
                or sorted(int(a) % 4 for a in axes) != [2, 3] or not isinstance(t.shape[1], int)):
            continue
        c = int(t.shape[1])
        f1 = only(n.outputs[0])
        if f1 is None or len(f1.inputs) != 3 or f1.inputs[0] != n.outputs[0] or f1.inputs[1] not in g.weights:
            continue
        r = int(np.shape(g.weights[f1.inputs[1]])[0])
        f2 = only(f1.outputs[0])
        if not (fc(f1, _SE_FC1, (r, c)) and fc(f2, ("conv2d_bias",), (c, r))) or f2 is None:
            continue
        if f2.inputs[0] != f1.outputs[0]:
            continue
        nodes: list[Node] = [n, f1, f2]
        gate: list[Any] | None = None
        z, m = f2.outputs[0], only(f2.outputs[0])
        if m is not None and m.op == "sigmoid":
            nodes.append(m)
            gate, z, m = ["sigmoid"], m.outputs[0], only(m.outputs[0])
        else:
            consts: list[float] = []
            for op in ("mul", "add", "maximum", "minimum"):
                if m is None or m.op != op or len(m.inputs) != 2 or z not in m.inputs:
                    break
                k = scalar(m.inputs[1] if m.inputs[0] == z else m.inputs[0])
                if k is None or m.inputs[0] == m.inputs[1]:
                    break
                consts.append(k)
                nodes.append(m)
                z, m = m.outputs[0], only(m.outputs[0])
            else:
                gate = ["hard", *consts]
        if (gate is None or m is None or m.op != "mul" or sorted(m.inputs) != sorted((z, x)) or z == x
                or g.types[m.outputs[0]] != t or any(g.types[v].dtype != DType.F32 for v in (z,))):
            continue
        nodes.append(m)
        found[n.name] = {"src": x, "nodes": nodes, "gate": gate}
    return found


def _global_mean(g: Any, n: Node) -> bool:
    """``reduce_mean`` of an f32 NCHW value over H and W."""
    if len(n.inputs) != 1 or len(n.outputs) != 1:
        return False
    t, axes = g.types[n.inputs[0]], n.attrs.get("axes")
    return bool(t.dtype == DType.F32 and t.rank == 4 and isinstance(axes, tuple)
                and sorted(int(a) % 4 for a in axes) == [2, 3] and g.types[n.outputs[0]].dtype == DType.F32)


def _trim(members: list[Node], cons: Mapping[str, Any], outs: set[str]) -> list[Node]:
    """The longest prefix whose values, all but the last, only members read."""
    while members:
        names = {m.name for m in members}
        cut = next((k for k, m in enumerate(members[:-1])
                    if m.outputs[0] in outs or any(c.name not in names for c in cons.get(m.outputs[0], ()))),
                   None)
        if cut is None:
            return members
        members = members[:cut + 1]
    return members


def _region(g: Any, members: list[Node], ses: Mapping[str, dict[str, Any]] | None = None) -> Region | None:
    import numpy as np

    x = members[0].inputs[0]
    params: list[str] = []
    val = {x: 0}
    steps: list[dict[str, Any]] = []

    def param(name: str) -> int:
        if name not in params:
            params.append(name)
        return params.index(name) + 1

    prod = {m.outputs[0]: m for m in members}
    inside: set[str] = set()  # the nodes of SE steps after their reduce_mean
    names = {m.name for m in members}
    for n in members:
        if n.name in inside:
            continue
        se = (ses or {}).get(n.name)
        if se is not None:
            if not all(m.name in names for m in se["nodes"]):
                return None  # find_conv_chains takes an SE whole; never a wrong chain
            f1, f2 = se["nodes"][1], se["nodes"][2]
            steps.append({"op": _SE, "src": val[se["src"]], "res": None, "attrs": {}, "fc1": f1.op,
                          "w": param(f1.inputs[1]), "b": param(f1.inputs[2]), "w2": param(f2.inputs[1]),
                          "b2": param(f2.inputs[2]), "gate": se["gate"]})
            inside.update(m.name for m in se["nodes"])
            val[se["nodes"][-1].outputs[0]] = len(steps)
            continue
        if n.op == "add":  # folded into its conv step: conv2d_bias with a residual (sum post-op)
            for y, r in (n.inputs, n.inputs[::-1]):
                k = val.get(y)
                if (k is not None and y in prod and prod[y].op == "conv2d_bias"
                        and steps[k - 1]["res"] is None and val.get(r, k) < k):
                    steps[k - 1]["res"] = val[r]
                    val[n.outputs[0]] = k
                    break
            else:
                return None  # find_conv_chains checked it; never a wrong chain
            continue
        if n.op == _MEAN:
            steps.append({"op": _MEAN, "src": val[n.inputs[0]], "res": None,
                          "attrs": {"axes": [2, 3], "keepdims": bool(n.attrs.get("keepdims"))}})
            val[n.outputs[0]] = len(steps)
            continue
        if n.op in _CLIPS:
            c, src = (n.inputs[1], n.inputs[0]) if n.inputs[0] in val else (n.inputs[0], n.inputs[1])
            bound = float(np.asarray(g.weights[c]).reshape(()))
            steps.append({"op": n.op, "src": val[src], "res": None, "c": bound, "attrs": {}})
            val[n.outputs[0]] = len(steps)
            continue
        at = {a: list(v) if isinstance(v, tuple) else v for a, v in n.attrs.items()}
        st: dict[str, Any] = {"op": n.op, "src": val[n.inputs[0]], "res": None, "attrs": at}
        if n.op != _POOL:
            st["w"], st["b"] = param(n.inputs[1]), param(n.inputs[2])
        if n.op == "rlx_cpu.conv2d_bias_add_relu":
            st["res"] = val[n.inputs[3]]
        steps.append(st)
        val[n.outputs[0]] = len(steps)
    if val[members[-1].outputs[0]] != len(steps):  # the chain's output must be its last step's
        return None
    node = Node(f"{members[0].name}/chain", CHAIN, (x, *params), members[-1].outputs,
                Attrs({"steps": json.dumps(steps, separators=(",", ":"))}))
    return Region(tuple(m.name for m in members), (node,))


def find_squeezed_means(g: Any) -> list[Region]:
    """A 1-D conv net's global average pool as importers write it: the (N, C, 1, W) conv output
    reshaped to (N, C, W), then ``reduce_mean`` over W. It becomes the mean over (H, W) of the 4-D
    value (the same elements and count), then the reshape to the mean's shape, so the chain rule
    (stage ``legal``) takes the mean as its last step (:data:`MEAN`): conv1d_audio runs as the chain
    and its linear, without a separate reduce_mean or the chain's output reorder."""
    if not (SETTING.get() and MEAN):
        return []
    regions: list[Region] = []
    for r in g.nodes:
        m = g.sole_reader(r.outputs[0]) if r.op == "reshape" else None
        if m is None:
            continue
        t, y = g.types[r.inputs[0]], g.types[r.outputs[0]]
        if (t.dtype != DType.F32 or t.rank != 4 or t.shape[2] != 1 or y.shape != (*t.shape[:2], t.shape[3])
                or r.inputs[0] in g.weights
                or not all(isinstance(d, int) for d in t.shape)):  # the reshape's shape is concrete
            continue
        axes = m.attrs.get("axes")
        if (m.op != _MEAN or len(m.inputs) != 1 or not isinstance(axes, tuple)
                or [int(a) % 3 for a in axes] != [2] or g.types[m.outputs[0]].dtype != DType.F32):
            continue
        pooled = f"{m.name}/hw"
        regions.append(Region((r.name, m.name), (
            Node(f"{m.name}/mean_hw", _MEAN, (r.inputs[0],), (pooled,),
                 Attrs({"axes": (2, 3), "keepdims": True})),
            Node(f"{m.name}/reshape", "reshape", (pooled,), m.outputs,
                 Attrs({"shape": g.types[m.outputs[0]].shape})))))
    return regions


SQUEEZED_MEANS = FusionRule(
    "rlx_cpu.squeezed_means", find_squeezed_means, stage="graph", provider="rlx-cpu",
    doc="reduce_mean over W of a (N, C, 1, W) value reshaped to (N, C, W) becomes the mean over (H, W) "
        "then the reshape, so a conv chain ends in it")

RULE = FusionRule("rlx_cpu.conv_chains", find_conv_chains, stage="legal", provider="rlx-cpu",
                  doc="runs of convs (with their fused tails) and max pools become one rlx_cpu.conv_chain: "
                      "activations stay in oneDNN's blocked layout between them")


# -- the kernel ----------------------------------------------------------------------------------

def _act(op: str, attrs: Attrs) -> Any:
    if op in ("rlx_cpu.conv2d_bias_relu", "rlx_cpu.conv2d_bias_add_relu"):
        return "relu"
    if op == "rlx_cpu.conv2d_bias_silu":
        return "silu"
    if op == "rlx_cpu.conv2d_bias_hardswish":
        return ("hardswish", float(attrs["alpha"]), float(attrs["beta"]))  # type: ignore[arg-type]
    return ""


def _conv_args(attrs: Attrs) -> tuple[tuple[int, int], tuple[int, int, int, int], tuple[int, int], int]:
    s, p, d = attrs["strides"], attrs["pads"], attrs["dilations"]
    assert isinstance(s, tuple) and isinstance(p, tuple) and isinstance(d, tuple)
    return ((int(s[0]), int(s[1])), (int(p[0]), int(p[1]), int(p[2]), int(p[3])), (int(d[0]), int(d[1])),
            int(attrs["groups"]))  # type: ignore[arg-type]


def _pool_args(attrs: Attrs) -> tuple[int, int, int, int, int, int]:
    k, s, p = attrs["kernel"], attrs["strides"], attrs["pads"]
    assert isinstance(k, tuple) and isinstance(p, tuple)
    kh, kw = int(k[0]), int(k[1])
    sh, sw = (kh, kw) if s is None else (int(s[0]), int(s[1]))  # type: ignore[index]
    return kh, kw, sh, sw, int(p[0]), int(p[1])


def _conv_macs(x_shape: tuple[int, ...], xs: Sequence[np.ndarray], steps: Sequence[Mapping[str, Any]]
               ) -> int:
    """The multiply-adds of the chain's convs (what decides whether a team pays for itself)."""
    shapes = _shapes(x_shape, xs, steps)
    total = 0
    for k, st in enumerate(steps):
        if _is_conv(st):
            n, oc, ho, wo = shapes[k + 1]
            total += n * oc * ho * wo * math.prod(xs[st["w"]].shape[1:])
    return total


def _shapes(x_shape: tuple[int, ...], xs: Sequence[np.ndarray], steps: Sequence[Mapping[str, Any]]
            ) -> list[tuple[int, ...]]:
    """Every value's shape (value 0: the chain's input)."""
    shapes = [x_shape]
    for st in steps:
        if st["op"] in _CLIPS or st["op"] == _SE:
            shapes.append(shapes[st["src"]])
            continue
        if st["op"] == _MEAN:
            n, c = shapes[st["src"]][:2]
            shapes.append((n, c, 1, 1) if st["attrs"]["keepdims"] else (n, c))
            continue
        n, _, h, w = shapes[st["src"]]
        at = _step_attrs(st)
        if st["op"] == _POOL:
            kh, kw, sh, sw, _pt, _pl = _pool_args(at)
            pads = at["pads"]
            assert isinstance(pads, tuple)
            c = shapes[st["src"]][1]
            shapes.append((n, c, (h + int(pads[0]) + int(pads[2]) - kh) // sh + 1,
                           (w + int(pads[1]) + int(pads[3]) - kw) // sw + 1))
            continue
        (sh, sw), (pt, pl, pb, pr), (dh, dw), _g = _conv_args(at)
        oc, _, kh, kw = xs[st["w"]].shape
        shapes.append((n, oc, (h + pt + pb - dh * (kh - 1) - 1) // sh + 1,
                       (w + pl + pr - dw * (kw - 1) - 1) // sw + 1))
    return shapes


class _Finite:
    """What the finite variant does with oneDNN's NaN-losing forms (:data:`FUSE_CLIPS`,
    :data:`FINITE_POOLS`, :data:`FINITE_RELU`): conv step -> (lo, hi) of the clip pair fused as its
    post-op, whether max pools and ReLUs are oneDNN's, the conv steps that may run as Winograd's
    F(4x4, 3x3) (:data:`WINOGRAD`), and the largest input norm ``||x||_2`` (which bounds every
    ``|x|``) the bound holds for."""

    def __init__(self, fuse: dict[int, tuple[float, float]], pools: bool, relus: bool = False,
                 limit: float = _X_MAX, wino: frozenset[int] = frozenset()) -> None:
        self.fuse, self.pools, self.relus, self.limit, self.wino = fuse, pools, relus, limit, wino


def _winograd_steps(steps: Sequence[Mapping[str, Any]], ins: Sequence[np.ndarray]) -> set[int]:
    """The conv steps whose shapes Winograd's kernel takes where it is the faster (its layouts are
    checked when the chain is planned)."""
    from . import winograd as wg

    if not WINOGRAD or ins[0].ndim != 4 or wg.why_not() is not None:
        return set()
    shapes = _shapes(ins[0].shape, ins, steps)
    out = set()
    for k, st in enumerate(steps):
        if not _is_conv(st):
            continue
        strides, _, dil, g = _conv_args(_step_attrs(st))
        w = ins[st["w"]]
        if (g == 1 and strides == (1, 1) and dil == (1, 1) and w.shape[2:] == (3, 3)
                and wg.worth_it(shapes[st["src"]], w.shape, shapes[k + 1])):
            out.add(k)
    return out


def _finite_plan(steps: Sequence[Mapping[str, Any]], ins: Sequence[np.ndarray]) -> _Finite | None:
    """The finite variant of a chain, or None where it would change nothing or where a value the
    NaN-losing steps read could overflow (to Inf, then NaN) for an input below :data:`_X_MAX`.

    Clip pairs (maximum then minimum, or the other way round) that alone read a conv's output are
    fused into it; max pools become oneDNN's. Bounds are affine in the input's magnitude M: value
    ``v`` is at most ``a[v] * M + c[v]``. A conv multiplies by its largest row sum of |w| and adds
    its largest |bias| (and the residual's bound); ReLU, SiLU, hard-swish, pools, means and gates
    in [0, 1] never grow a magnitude; a clip pair bounds its output by its bounds whatever its
    input. Only values up to the last NaN-losing step's input must stay below :data:`_SAFE`: a NaN
    made after it runs through the same exact steps in both variants. With ReLU post-ops as
    NaN-losing steps (:data:`FINITE_RELU`) the input's norm is bounded at run time by the largest
    ``M`` that keeps them below it, taken only where that allows inputs of RMS :data:`RELU_RMS`;
    else the plan is as without them (``M`` = :data:`_X_MAX`, the dot's own overflow)."""
    import numpy as np

    readers: dict[int, int] = {}
    for st in steps:
        for v in {st["src"], st.get("res")} - {None}:
            readers[v] = readers.get(v, 0) + 1
    fuse: dict[int, tuple[float, float]] = {}
    lossy: list[int] = []  # the values the NaN-losing steps read
    for k in range(len(steps) - 2):
        c1, c2 = steps[k + 1], steps[k + 2]
        if (FUSE_CLIPS and _is_conv(steps[k]) and {c1["op"], c2["op"]} == set(_CLIPS)
                and c1["src"] == k + 1 and c2["src"] == k + 2 and readers.get(k + 1) == 1
                and readers.get(k + 2) == 1):
            first, second = float(c1["c"]), float(c2["c"])
            lo, hi = (first, second) if c1["op"] == "maximum" else (second, first)
            if lo <= hi:
                fuse[k] = (lo, hi)
                lossy.append(k + 1)
    pools = FINITE_POOLS and any(st["op"] == _POOL for st in steps)
    if pools:
        lossy += [st["src"] for st in steps if st["op"] == _POOL]
    relu = [k + 1 for k, st in enumerate(steps) if FINITE_RELU and st["op"] in _RELU_OPS]
    wino = _winograd_steps(steps, ins)
    if not lossy and not relu and not wino:
        return None

    def gain(w: np.ndarray) -> float:
        """The largest sum of |w| over one output's inputs (float64 sums), 64 outputs at a time: a
        float64 copy of ResNet-18's weights raised its peak RSS by 20 MB, their file pages by 8."""
        rows = w.reshape(w.shape[0], -1)
        g = max(float(np.abs(rows[i:i + 64]).sum(axis=1, dtype=np.float64).max())
                for i in range(0, rows.shape[0], 64))
        release_file_pages(w)  # a memory-mapped file's pages just read leave the RSS again
        return g

    def most(b: np.ndarray) -> float:
        return float(np.abs(b.astype(np.float64)).max()) if b.size else 0.0

    a, c = [1.0], [0.0]
    #: per value: the bounds (a, c) of it and of what its step made inside (an SE's FCs)
    bounds: list[list[tuple[float, float]]] = [[(1.0, 0.0)]]
    for st in steps:
        sa, sc = a[st["src"]], c[st["src"]]
        op = st["op"]
        keys = ("w", "b", "w2", "b2") if op == _SE else ("w", "b") if _is_conv(st) else ()
        if any(ins[st[key]].flags.writeable for key in keys):
            return None  # fed weights may hold NaN at run time
        inner: list[tuple[float, float]] = []
        if op == _SE:
            w1, b1, w2, b2 = (ins[st[key]] for key in keys)
            h = (sa * gain(w1), sc * gain(w1) + most(b1))  # FC1 (its ReLU/SiLU never grows it)
            z = (h[0] * gain(w2), h[1] * gain(w2) + most(b2))  # FC2, before the gate
            inner = [h, z]
            gate = st["gate"]
            gm = 1.0 if gate[0] == "sigmoid" else max(abs(float(gate[3])), abs(float(gate[4])))
            na, nc = sa * gm, sc * gm
        elif op in _CLIPS:
            prev = steps[st["src"] - 1] if st["src"] > 0 else None
            if prev is not None and {prev["op"], op} == set(_CLIPS):  # a pair: out within its bounds
                na, nc = 0.0, max(abs(float(prev["c"])), abs(float(st["c"])))
            else:  # max(x, lo) or min(x, hi): at most max(|x|, |bound|)
                na, nc = sa, max(sc, abs(float(st["c"])))
        elif op in (_POOL, _MEAN):
            na, nc = sa, sc
        elif _is_conv(st):
            g = gain(ins[st["w"]])
            na, nc = sa * g, sc * g + most(ins[st["b"]])
            if st.get("res") is not None:
                na, nc = na + a[st["res"]], nc + c[st["res"]]
        else:
            return None
        a.append(na)
        c.append(nc)
        bounds.append([(na, nc), *inner])

    def limit(upto: int) -> float:
        """The largest input magnitude that keeps values 0..upto below _SAFE."""
        lim = math.inf
        for ab, cb in itertools.chain.from_iterable(bounds[:upto + 1]):
            if cb >= _SAFE:
                return 0.0
            if ab > 0:
                lim = min(lim, (_SAFE - cb) / ab)
        return lim

    need = RELU_RMS * math.sqrt(ins[0].size)
    # Winograd convs (see WINOGRAD) whose output stays below _SAFE for inputs of RMS RELU_RMS; the
    # run-time check then bounds the input's norm by the lowest such limit
    wino = {k for k in wino if limit(k + 1) >= need}
    cap = min([limit(k + 1) for k in wino], default=math.inf)
    if relu:
        lim = limit(max(lossy + relu))
        if lim >= need:
            return _Finite(fuse, pools, True, min(lim, cap, _X_MAX), frozenset(wino))
    if lossy and limit(max(lossy)) > _X_MAX:
        return _Finite(fuse, pools, limit=min(cap, _X_MAX), wino=frozenset(wino))
    lim = min(cap, limit(max(lossy)) if lossy else math.inf)
    if wino and lim >= need:  # the NaN-losing steps bounded as far as the Winograd convs are
        return _Finite(fuse, pools, limit=min(lim, _X_MAX), wino=frozenset(wino))
    return None


def _finite_variant(api: dict[str, Any], ins: Sequence[np.ndarray], o: np.ndarray,
                   steps: Sequence[Mapping[str, Any]], shared: dict[Any, Any], pl: Any,
                   exact: Callable[[], Any]) -> Run | None:
    """The chain's finite variant (clip pairs as conv post-ops, oneDNN's max pools: see
    :data:`FUSE_CLIPS`), run while ``x . x`` is finite (no NaN or Inf in the input), else the exact
    variant; None where the chain has no such step or its bound check fails."""

    import numpy as np

    from .onednn_conv import OneDNNError
    from .parallel import PerTeam

    x = ins[0]
    plan = _finite_plan(steps, ins) if x.flags.c_contiguous else None
    if plan is None:
        return None
    try:
        teams = PerTeam(lambda n: _Blocked(api, ins, o, steps, n, shared, finite=plan), pl)
    except (OneDNNError, _Unsupported):
        return None
    xf = x.reshape(-1)
    dot, most = np.dot, plan.limit * plan.limit  # ``x . x`` in float32: inf from |x| ~1.8e19 on

    def run() -> None:
        if dot(xf, xf) < most:  # also False for NaN
            teams.get().run()
        else:
            exact().get().run()
    run.onednn_impl = teams.full.impls  # type: ignore[attr-defined]
    return run


def k_conv_chain(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    steps = _steps(attrs)
    o = outs[0]
    from . import onednn_conv

    api = onednn_conv._api() if onednn_conv.USE else None
    if not (USE and SETTING.get()) or api is None or any(a.dtype.name != "float32" for a in ins):
        return _per_op(ins, o, steps)
    from .parallel import SOLO, PerTeam, TeamSize, pool

    pl: TeamSize = pool()
    if _conv_macs(ins[0].shape, ins, steps) < SOLO_MACS:
        pl = SOLO
    shared: dict[Any, Any] = {}  # packed constant weights, shared by the thread-count variants
    try:
        if OPENMP and settings.CONV_OPENMP.get():
            exact_teams: list[PerTeam[_Blocked]] = []

            def exact() -> PerTeam[_Blocked]:
                if not exact_teams:  # with a finite variant: made on the first input holding NaN/Inf
                    exact_teams.append(PerTeam(lambda n: _Blocked(api, ins, o, steps, n, shared), pl))
                return exact_teams[0]
            finite = _finite_variant(api, ins, o, steps, shared, pl, exact)
            if finite is not None:
                fast = finite
            else:
                teams = exact()

                def fast() -> None:
                    teams.get().run()
                fast.onednn_impl = teams.full.impls  # type: ignore[attr-defined]
        else:  # one-thread primitives; big convs cut into pieces for the row pool
            one = _Blocked(api, ins, o, steps, 1, shared, split=pl.threads)

            def fast() -> None:
                one.run()
            fast.onednn_impl = one.impls  # type: ignore[attr-defined]
    except (onednn_conv.OneDNNError, _Unsupported):
        return _per_op(ins, o, steps)
    # oneDNN skips the zero padding that NaN/Inf weights would multiply (the reference gives NaN):
    # fed weights of padded convs are checked every run (constants were checked by the rule).
    fed = [ins[st["w"]] for st in steps if _is_conv(st) and ins[st["w"]].flags.writeable
           and any(_conv_args(_step_attrs(st))[1])]
    if not fed:
        return fast
    import numpy as np

    slow: list[Run] = []  # bound on first need: it holds NCHW intermediates and its own packed weights

    def checked() -> None:
        if all(np.isfinite(w).all() for w in fed):
            fast()
            return
        if not slow:
            slow.append(_per_op(ins, o, steps))
        slow[0]()
    checked.onednn_impl = fast.onednn_impl  # type: ignore[attr-defined]
    return checked


def _per_op(ins: Sequence[np.ndarray], o: np.ndarray, steps: Sequence[Mapping[str, Any]]) -> Run:
    """The chain as its member ops one after another on NCHW intermediates of its own."""
    import numpy as np

    from .conv import conv2d_float
    from .pooling import k_max_pool2d

    shapes = _shapes(ins[0].shape, ins, steps)
    vals: list[np.ndarray] = [ins[0]]
    runs: list[Run] = []
    for k, st in enumerate(steps):
        out = o if k == len(steps) - 1 else np.empty(shapes[k + 1], o.dtype)
        if st["op"] == _SE:
            runs.append(_se_numpy(st, vals[st["src"]], ins, out))
            vals.append(out)
            continue
        if st["op"] == _MEAN:
            runs.append(_mean_numpy(vals[st["src"]], out))
            vals.append(out)
            continue
        at = _step_attrs(st)
        if st["op"] in _CLIPS:
            runs.append(_clip_run(getattr(np, st["op"]), vals[st["src"]], np.float32(st["c"]), out))
        elif st["op"] == _POOL:
            runs.append(k_max_pool2d([vals[st["src"]]], [out], at))
        else:
            strides, pads, dil, g = _conv_args(at)
            res = None if st.get("res") is None else vals[st["res"]]
            runs.append(conv2d_float(vals[st["src"]], ins[st["w"]], out, strides, pads, dil, g,
                                     ins[st["b"]], res, _act(st["op"], at)))
        vals.append(out)

    def run() -> None:
        for r in runs:
            r()
    return run


def _se_numpy(st: Mapping[str, Any], x: np.ndarray, ins: Sequence[np.ndarray], out: np.ndarray) -> Run:
    """An SE step with NumPy on NCHW (the per-op path): float32 FCs, NaN propagating as the IR's ops."""
    import numpy as np

    w1, b1 = ins[st["w"]][:, :, 0, 0], ins[st["b"]]
    w2, b2 = ins[st["w2"]][:, :, 0, 0], ins[st["b2"]]
    gate = st["gate"]

    def run() -> None:
        m = x.mean(axis=(2, 3), dtype=np.float64).astype(np.float32)
        with np.errstate(over="ignore", invalid="ignore"):
            h = m @ w1.T + b1
            if st["fc1"] == "rlx_cpu.conv2d_bias_relu":
                h = np.maximum(h, np.float32(0))
            elif st["fc1"] == "rlx_cpu.conv2d_bias_silu":
                h = h / (np.float32(1) + np.exp(-h))
            z = h @ w2.T + b2
            if gate[0] == "sigmoid":
                z = np.float32(1) / (np.float32(1) + np.exp(-z))
            else:
                a, b, lo, hi = (np.float32(v) for v in gate[1:])
                z = np.minimum(np.maximum(z * a + b, lo), hi)
        np.multiply(x, z[:, :, None, None], out=out)
    return run


def _mean_numpy(x: np.ndarray, out: np.ndarray) -> Run:
    import numpy as np

    def run() -> None:
        out[...] = x.mean(axis=(2, 3), dtype=np.float64).reshape(out.shape)
    return run


def _clip_run(fn: Any, x: np.ndarray, c: Any, out: np.ndarray) -> Run:
    def run() -> None:
        fn(x, c, out=out)  # NumPy's maximum/minimum propagate NaN, as the IR's do
    return run


class _Unsupported(Exception):
    """A layout the blocked chain does not handle (the per-op path runs instead)."""


_QUERY_STRIDES = 14  # dnnl_query_strides
_QUERY_NDIMS, _QUERY_DIMS = 256, 257  # dnnl_query_ndims_s32, dnnl_query_dims
_QUERY_INNER_NBLKS, _QUERY_INNER_BLKS, _QUERY_INNER_IDXS = 263, 264, 265


def _kind(kernel: Any) -> str:
    """Which implementation a pool/mean kernel is, for the chain's impl list (what `rlx explain` shows)."""
    return "numba" if kernel.__module__.endswith("_nb") else "numpy"


def _lanes_view(shape: Sequence[int], lay: tuple[int, tuple[int, ...], bool]
                ) -> tuple[int, int, int, int, int]:
    """(N, channel blocks, H, W, lanes) of a value in the layout ``_layout`` found (NHWC: one block)."""
    n, c, h, w = (int(d) for d in shape)
    blk, _, nhwc = lay
    return (n, 1, h, w, c) if nhwc else (n, -(-c // blk), h, w, blk)


def _layout(fns: Mapping[str, Any], md: Any) -> tuple[int, tuple[int, ...], bool] | None:
    """(channel block, outer strides, NHWC?) of a dense 4-D memory descriptor: plain NCHW (block
    1), blocked only along channels with its outer dims in N, C-blocks, H, W order (nChw16c), or
    NHWC (block: all the channels); None otherwise."""
    q = fns["dnnl_memory_desc_query"]
    nd = ctypes.c_int()
    if q(md, _QUERY_NDIMS, ctypes.byref(nd)) != 0 or nd.value != 4:
        return None
    nblks = ctypes.c_int()
    ptr = ctypes.POINTER(ctypes.c_int64)()
    if q(md, _QUERY_INNER_NBLKS, ctypes.byref(nblks)) != 0 or q(md, _QUERY_STRIDES, ctypes.byref(ptr)) != 0:
        return None
    strides = tuple(int(ptr[i]) for i in range(4))
    q(md, _QUERY_DIMS, ctypes.byref(ptr))
    n, c, h, w = (int(ptr[i]) for i in range(4))
    if nblks.value == 0:
        blk = 1
    elif nblks.value == 1:
        q(md, _QUERY_INNER_BLKS, ctypes.byref(ptr))
        blk = int(ptr[0])
        q(md, _QUERY_INNER_IDXS, ctypes.byref(ptr))
        if int(ptr[0]) != 1:
            return None
    else:
        return None
    if blk == 1 and strides == (h * w * c, 1, w * c, c):
        return c, strides, True
    cb = -(-c // blk)
    if strides != (cb * h * w * blk, h * w * blk, w * blk, blk):
        return None
    return blk, strides, False


Cut = tuple[int, int, int, int, int, int]  # image from, to, output channel from, to, output row from, to


Lay = tuple[int, tuple[int, ...], bool]  # what _layout gives


def _choose_cut(oshape: tuple[int, ...], idims: tuple[int, ...], wsize: int, g: int, add: bool, split: int,
                most: int, src_lay: Lay, dst_lay: Lay, geo: tuple[int, int, int, int]
                ) -> list[tuple[str, list[Cut]]]:
    """The ways to cut a conv into pieces (``"images"``, ``"rows"``, ``"channels"``), the one whose
    pieces read the fewest bytes first (the next ones: what to try where oneDNN has no fast conv
    for it). Why bytes: a piece of a conv with big weights and a small output (ResNet's layer4 at
    batch 1: 9.4 MB of weights, 2x2 outputs) is bound by reading its weights, which every image
    or row piece reads whole and a channel piece reads only its share of; a piece of a conv with
    small weights and big activations is bound by those, which every channel piece reads whole.
    The cuts depend only on the shapes and ``split`` (the pool's threads), never on the load."""
    n, oc, ho, _ = oshape
    kh, sh, _, dh = geo
    k = min(split, most)
    h_in = idims[2]
    i_floats = float(n * idims[1] * idims[2] * idims[3])
    o_floats = float(n * oc * ho * oshape[3])
    nhwc = bool(src_lay[2] and dst_lay[2])
    ways: list[tuple[float, int, str, list[Cut]]] = []  # (floats a piece reads and writes, rank, ...)
    if n >= split:
        ki = min(n, 2 * split, most)
        if ki >= 2:
            share = -(-n // ki) / n
            ways.append((wsize + (i_floats + o_floats) * share, 0, "images",
                         [(n * i // ki, n * (i + 1) // ki, 0, oc, 0, ho) for i in range(ki)]))
    elif n == 1 and nhwc:
        kr = min(k, ho)
        if kr >= 2:
            rows = -(-ho // kr)
            in_rows = min(h_in, (rows - 1) * sh + dh * (kh - 1) + 1)
            ways.append((wsize + i_floats * in_rows / h_in + o_floats * rows / ho, 1, "rows",
                         [(0, 1, 0, oc, ho * i // kr, ho * (i + 1) // kr) for i in range(kr)]))
    if g == 1 and not dst_lay[2] and n == 1:  # nChw16c: whole channel blocks, contiguous in one image
        blk = dst_lay[0]
        if not CUT_CHANNELS:  # the earlier cut: equal pieces of whole blocks, at batch 1 only
            kc = k
            while kc > 1 and (oc % kc or (oc // kc) % blk):
                kc -= 1
            if n == 1 and kc >= 2 and not ways:
                return [("channels", [(0, 1, oc * i // kc, oc * (i + 1) // kc, 0, ho) for i in range(kc)])]
            return [(kind, cuts) for *_, kind, cuts in ways]
        extra = 1.0
    elif g == 1 and nhwc and CUT_CHANNELS:  # NHWC: dense buffers of 16-channel multiples, copied
        blk = 16
        extra = 3.0 + add  # the piece's buffer written and read, its channels written (and filled)
    else:
        return [(kind, cuts) for *_, kind, cuts in ways]
    if not CUT_CHANNELS:
        return [(kind, cuts) for *_, kind, cuts in ways]
    blocks = -(-oc // blk)
    kc = min(k, blocks)
    if kc >= 2:
        bounds = [min(oc, blk * (blocks * i // kc)) for i in range(kc + 1)]
        widest = max(c1 - c0 for c0, c1 in itertools.pairwise(bounds))
        ways.append((wsize * widest / oc + i_floats + extra * o_floats * widest / oc, 2, "channels",
                     [(0, n, c0, c1, 0, ho) for c0, c1 in itertools.pairwise(bounds)]))
    ways.sort(key=lambda t: (t[0], t[1]))
    return [(kind, cuts) for *_, kind, cuts in ways]


class _Blocked:
    """The chain's primitives for ``threads`` OpenMP threads over planned scratch bytes."""

    def __init__(self, api: dict[str, Any], ins: Sequence[np.ndarray], o: np.ndarray,
                 steps: Sequence[Mapping[str, Any]], threads: int, shared: dict[Any, Any],
                 split: int = 1, finite: _Finite | None = None) -> None:
        from .onednn_conv import _Prim

        self.api, self.threads, self.split = api, threads, split
        #: conv step -> (lo, hi) of the clip pair after it, applied as its post-op (see FUSE_CLIPS)
        self.fuse = dict(finite.fuse) if finite else {}
        #: max pools as oneDNN primitives (see FINITE_POOLS)
        self.onednn_pools = bool(finite and finite.pools)
        #: ReLUs as oneDNN's relu post-op (see FINITE_RELU)
        self.fast_relu = bool(finite and finite.relus)
        #: conv steps that may run as Winograd's F(4x4, 3x3): bounded by the finite variant's check
        self.wino = finite.wino if finite else frozenset()
        if finite and split > 1:
            raise _Unsupported("the finite variant is for the OpenMP team's chains (no conv pieces)")
        #: scratch areas of conv pieces (see _piece_area): (memory, area), each area's bytes
        self.piece_sp: list[tuple[Any, int]] = []
        self.piece_sp_nb: list[int] = []
        self.p = _Prim(api)
        self.keep: list[Any] = [list(ins), o]
        self.entries: list[tuple[Any, Any] | Run] = []  # (primitive, args) or a Python step
        self.impls: list[str] = []
        get_t, set_t = api["omp"]
        prev = get_t()
        set_t(threads)  # a primitive's work split is fixed for the thread count it is made with
        try:
            self._plan(ins, o, steps, shared)
        finally:
            set_t(prev)

    def _plan(self, ins: Sequence[np.ndarray], o: np.ndarray, steps: Sequence[Mapping[str, Any]],
              shared: dict[Any, Any]) -> None:
        from .onednn_conv import _ARG_BIAS, _ARG_DST, _ARG_SRC, _ARG_WEIGHTS, _strides_elems, impl_info

        p, fns = self.p, self.p.fns
        eq, size = fns["dnnl_memory_desc_equal"], fns["dnnl_memory_desc_get_size"]
        q = fns["dnnl_primitive_desc_query_md"]
        from .onednn_conv import _QUERY_EXEC_ARG_MD as XMD

        x = ins[0]
        last: dict[int, int] = {}  # value -> the last step reading it
        for k, st in enumerate(steps):
            last[st["src"]] = k
            if st.get("res") is not None:
                last[st["res"]] = k
        arena = _Arena()
        self.sp: list[Any] = []  # scratchpad memories (all at one offset: steps run one at a time)
        self.sp_nb = 0
        # value -> (md, memory, scratch offset or None for arrays of the program)
        vals: dict[int, tuple[Any, Any, int | None]] = {}
        x_md = self._x_md = p.md_plain(x.shape, _strides_elems(x))
        vals[0] = (x_md, p.memory(x_md, x.ctypes.data), None)
        # value -> ("s", scratch offset) or ("p", pointer into the program's arena)
        where: dict[int, tuple[str, int]] = {0: ("p", x.ctypes.data)}
        shapes = _shapes(x.shape, ins, steps)
        o_md = p.md_plain(o.shape, _strides_elems(o))

        def scratch_mem(md: Any, off: int) -> Any:
            mem = p.memory(md, 0)
            p.in_scratch.append((mem, off))
            return mem

        def step(prim: Any, pairs: list[tuple[int, Any]]) -> None:
            from .onednn_conv import _ExecArg

            arr = (_ExecArg * len(pairs))(*(_ExecArg(a, m) for a, m in pairs))
            self.keep.append(arr)
            self.entries.append((prim, arr))

        def scratchpad(pd: Any) -> list[tuple[int, Any]]:
            from .onednn_conv import _ARG_SCRATCHPAD

            md = q(pd, XMD, _ARG_SCRATCHPAD)
            if not md or size(md) == 0:
                return []
            self.sp_nb = max(self.sp_nb, -(-int(size(md)) // 64) * 64)
            mem = p.memory(md, 0)
            self.sp.append(mem)
            return [(_ARG_SCRATCHPAD, mem)]

        def reorder(src_md: Any, dst_md: Any, src: Any, dst: Any) -> None:
            from .onednn_conv import _ARG_FROM, _ARG_TO

            pd = ctypes.c_void_p()
            eng = self.api["engine"]
            p.check(fns["dnnl_reorder_primitive_desc_create"](ctypes.byref(pd), src_md, eng, dst_md, eng,
                                                               p.attr()), "reorder")
            p.owned.append(("dnnl_primitive_desc_destroy", pd))
            step(p.primitive(pd), [(_ARG_FROM, src), (_ARG_TO, dst), *scratchpad(pd)])

        def free_after(k: int, *values: int) -> None:
            for v in values:
                off = vals[v][2]
                if last.get(v) == k and off is not None:
                    arena.free(off, k)

        def same_layout_dst(k: int, st: Mapping[str, Any], src_md: Any, src_mem: Any, src_off: int
                            ) -> tuple[int, Any]:
            """(offset, memory) of a step writing its source's layout: in place where the source
            dies here, else a new arena block."""
            if last.get(st["src"]) == k:
                last[st["src"]] = -1
                return src_off, src_mem
            off = arena.alloc(int(size(src_md)), k)
            return off, scratch_mem(src_md, off)

        def same_layout_done(k: int, st: Mapping[str, Any], src_md: Any, dst_mem: Any, off: int,
                             final: bool) -> None:
            free_after(k, st["src"])
            vals[k + 1] = (src_md, dst_mem, off)
            where[k + 1] = ("s", off)
            if final:
                reorder(src_md, o_md, dst_mem, p.memory(o_md, o.ctypes.data))

        for k, st in enumerate(steps):
            src_md, src_mem, _ = vals[st["src"]]
            final = k == len(steps) - 1
            if st["op"] == _SE:
                src_off = vals[st["src"]][2]
                lay = _layout(fns, src_md)
                if src_off is None or lay is None:
                    raise _Unsupported("an SE of a value outside the chain's scratch or on an odd layout")
                blk, _, nhwc = lay
                c = shapes[st["src"]][1]
                off, dst_mem = same_layout_dst(k, st, src_md, src_mem, src_off)
                view = _lanes_view(shapes[st["src"]], lay)
                self.entries.append(self._se_run(st, ins, src_off, off, view, c))
                self.impls.append(f"se:numba:{'nhwc' if nhwc else f'blocked{blk}'}")
                same_layout_done(k, st, src_md, dst_mem, off, final)
                continue
            if st["op"] == _MEAN:
                lay, src_off = _layout(fns, src_md), vals[st["src"]][2]
                if not final or src_off is None or lay is None or not o.flags.c_contiguous:
                    raise _Unsupported("a mean that is not the chain's last step, or on an odd layout")
                blk, _, nhwc = lay
                n, c = shapes[st["src"]][:2]
                run = self._mean_run(src_off, _lanes_view(shapes[st["src"]], lay), o.reshape(n, c))
                self.entries.append(run)
                self.impls.append(f"mean:{run.kind}:{'nhwc' if nhwc else f'blocked{blk}'}")  # type: ignore[attr-defined]
                continue
            at = _step_attrs(st)
            if st["op"] in _CLIPS:
                src_off = vals[st["src"]][2]
                if src_off is None:
                    raise _Unsupported("a clip of a value outside the chain's scratch")
                nb = int(size(src_md))
                off, dst_mem = same_layout_dst(k, st, src_md, src_mem, src_off)
                if k - 1 in self.fuse or k - 2 in self.fuse:  # done by the conv's post-op, in place
                    same_layout_done(k, st, src_md, dst_mem, off, final)
                    continue
                lo, hi = (float(st["c"]), None) if st["op"] == "maximum" else (None, float(st["c"]))
                prev = getattr(self.entries[-1], "clip", None) if self.entries else None
                if (prev is not None and prev[0] == k == st["src"] and off == prev[2] and
                        (lo is None) != (prev[3] is None) and (hi is None) != (prev[4] is None)):
                    # maximum then minimum (ReLU6) on the buffer the previous clip wrote: one pass
                    lo, hi = (prev[3], hi) if lo is None else (lo, prev[4])
                    self.entries[-1] = self._clip_entry(lo, hi, prev[1], off, nb, k + 1)
                    self.impls[-1] = "clip:numpy"
                else:
                    self.entries.append(self._clip_entry(lo, hi, src_off, off, nb, k + 1))
                    self.impls.append(f"{st['op']}:numpy")
                same_layout_done(k, st, src_md, dst_mem, off, final)
                continue
            if st["op"] == _POOL:
                lay = _layout(fns, src_md)
                if lay is None:
                    raise _Unsupported("max pool on an unexpected layout")
                blk, _, nhwc = lay
                n, c, ho, wo = shapes[k + 1]
                planes = n if nhwc else n * -(-c // blk)  # (planes, H, W, lanes) views of the layout
                dst_md = p.md_like(src_md, (n, c, ho, wo))
                off = arena.alloc(int(size(dst_md)), k)
                dst_mem = scratch_mem(dst_md, off)
                src_off = vals[st["src"]][2]
                if self.onednn_pools:  # the finite variant: oneDNN's max skips NaN (none can arise)
                    pd = self._pool_pd(src_md, dst_md, at)
                    step(p.primitive(pd), [(_ARG_SRC, src_mem), (_ARG_DST, dst_mem), *scratchpad(pd)])
                    self.impls.append(impl_info(self.api, pd))
                else:
                    src_shape = (planes, shapes[st["src"]][2], shapes[st["src"]][3], blk)
                    run = self._pool_run(src_off, x if src_off is None else None, src_shape,
                                         off, (planes, ho, wo, blk), _pool_args(at))
                    self.entries.append(run)
                    self.impls.append(f"max_pool2d:{run.kind}:"  # type: ignore[attr-defined]
                                      f"{'nhwc' if nhwc else f'blocked{blk}'}")
                free_after(k, st["src"])
                vals[k + 1] = (dst_md, dst_mem, off)
                where[k + 1] = ("s", off)
                if final:
                    reorder(dst_md, o_md, dst_mem, p.memory(o_md, o.ctypes.data))
                continue
            w, b = ins[st["w"]], ins[st["b"]]
            strides, pads, dil, g = _conv_args(at)
            res = st.get("res")
            pd, w_md, w_user = self._conv_pd(src_md, w, b, shapes[k + 1], strides, pads, dil, g,
                                             res is not None, self._act(st["op"], at), clip=self.fuse.get(k))
            want = q(pd, XMD, _ARG_SRC)
            src_at = where[st["src"]]
            if not eq(want, src_md):  # a layout change the conv would not read itself
                off = arena.alloc(int(size(want)), k)
                tmp = scratch_mem(want, off)
                reorder(src_md, want, src_mem, tmp)
                arena.free(off, k)
                src_mem, src_md, src_at = tmp, want, ("s", off)
            dst_md = q(pd, XMD, _ARG_DST)
            if final and eq(dst_md, o_md):
                dst_mem, off_d = p.memory(o_md, o.ctypes.data), None
                if res is not None:  # the sum post-op adds what the output holds
                    reorder(vals[res][0], dst_md, vals[res][1], dst_mem)
            elif (res is not None and last.get(res) == k and res != st["src"] and vals[res][2] is not None
                  and eq(vals[res][0], dst_md)):
                dst_mem, off_d = vals[res][1], vals[res][2]  # the sum post-op adds in place: res dies here
                last[res] = -1  # its bytes are the output's now
            else:
                off_d = arena.alloc(int(size(dst_md)), k)
                dst_mem = scratch_mem(dst_md, off_d)
                if res is not None:
                    reorder(vals[res][0], dst_md, vals[res][1], dst_mem)
            dst_at = ("p", o.ctypes.data) if off_d is None else ("s", off_d)
            wino = self._winograd(k, st, at, src_md, src_at, dst_md, off_d, ins, shapes, arena, shared)
            if wino is not None:
                self.entries.append(wino)
                self.impls.append(wino.impl)  # type: ignore[attr-defined]
                free_after(k, st["src"], *(() if res is None else (res,)))
                vals[k + 1] = (dst_md, dst_mem, off_d)
                where[k + 1] = dst_at
                if final:
                    reorder(dst_md, o_md, dst_mem, p.memory(o_md, o.ctypes.data))
                continue
            stem = self._stem_conv(k, steps, at, src_md, dst_md, off_d, x, ins, shapes, arena)
            if stem is not None:
                self.entries.append(stem)
                self.impls.append(stem.impl)  # type: ignore[attr-defined]
                if stem.nhwc:  # type: ignore[attr-defined]
                    assert off_d is not None
                    oshape = shapes[k + 1]
                    dst_md = p.md_plain(oshape, (oshape[1] * oshape[2] * oshape[3], 1, oshape[3] * oshape[1],
                                                 oshape[1]))
                    dst_mem = scratch_mem(dst_md, off_d)
                free_after(k, st["src"])
                vals[k + 1] = (dst_md, dst_mem, off_d)
                where[k + 1] = dst_at
                continue
            pieces = None if self.split < 2 else self._pieces(
                scratch_mem, src_md, src_at, dst_md, dst_at, w, b, shapes[k + 1], strides, pads, dil, g,
                res is not None, self._act(st["op"], at), shared, reorder)
            if pieces is not None:
                self.entries.append(pieces)
                self.impls.append(pieces.impl)  # type: ignore[attr-defined]
            else:
                w_mem = self._weights(w, w_md, w_user, shared, reorder)
                args = [(_ARG_SRC, src_mem), (_ARG_WEIGHTS, w_mem), (_ARG_DST, dst_mem), *scratchpad(pd),
                        (_ARG_BIAS, p.memory(p.md_plain(b.shape, _strides_elems(b)), b.ctypes.data))]
                step(p.primitive(pd), args)
                self.impls.append(impl_info(self.api, pd))
            free_after(k, st["src"], *(() if res is None else (res,)))
            vals[k + 1] = (dst_md, dst_mem, off_d)
            where[k + 1] = dst_at
            if final and off_d is not None:
                reorder(dst_md, o_md, dst_mem, p.memory(o_md, o.ctypes.data))
        self.sp_off = arena.top
        for mem in self.sp:
            p.in_scratch.append((mem, self.sp_off))
        top = arena.top + self.sp_nb
        for j, nb in enumerate(self.piece_sp_nb):  # each piece's scratchpad area after that
            for mem, jj in self.piece_sp:
                if jj == j:
                    p.in_scratch.append((mem, top))
            top += nb
        p.scratch_nb = top
        self.where = -1
        self.views: dict[int, Any] = {}

    def _stem_conv(self, k: int, steps: Sequence[Mapping[str, Any]], at: Attrs, src_md: Any, dst_md: Any,
                    off_d: int | None, x: np.ndarray, ins: Sequence[np.ndarray],
                    shapes: Sequence[tuple[int, ...]], arena: _Arena) -> Run | None:
        """The conv as rlx-cpu's direct kernel (:mod:`rlx_cpu.stem_conv`) where it takes it: the
        chain's own NCHW input with at most ``MAX_CHANNELS`` channels (a stem), a kernel of at least
        ``MIN_TAPS`` taps, output channels a multiple of ``OC_MULTIPLE`` (where it is the faster:
        :mod:`rlx_cpu.stem_conv`), one group, no dilation or residual, an activation it has, on the
        OpenMP team (the chain of one-thread pieces keeps oneDNN's, whose bits its one-thread
        variant must match); None otherwise. It writes NHWC where the next conv reading its
        output (through max pools) prefers that (ResNet's layer1: two reorders fewer, one of them
        for the residual), else oneDNN's nChw16c (``run.nhwc`` says which)."""
        from . import stem_conv as sc

        st, oshape = steps[k], shapes[k + 1]
        if not (STEM_CONV and OPENMP and settings.CONV_OPENMP.get() and self.split < 2 and off_d is not None
                and st["src"] == 0 and st.get("res") is None and sc.why_not() is None
                and self.api.get("gomp")):
            return None
        w, b = ins[st["w"]], ins[st["b"]]
        strides, pads, dil, g = _conv_args(at)
        lay = _layout(self.p.fns, dst_md)
        if (g != 1 or dil != (1, 1) or w.shape[1] > sc.MAX_CHANNELS or w.shape[0] % sc.OC_MULTIPLE
                or w.shape[2] * w.shape[3] < sc.MIN_TAPS or x.ndim != 4
                or not x.flags.c_contiguous or w.flags.writeable or lay is None or lay[0] != 16 or lay[2]
                or not self.p.fns["dnnl_memory_desc_equal"](src_md, self._x_md)):
            return None
        act = self._act(st["op"], at)
        if not isinstance(act, str) or act not in sc.ACT:
            return None
        nhwc = self._next_conv_wants_nhwc(k, steps, ins, shapes)
        try:
            conv = sc.StemConv(x.shape, w, b, oshape, strides, pads, act, self.fuse.get(k), self.api["gomp"],
                                sc.ISA, nhwc)
        except ValueError:
            return None
        pad_off = arena.alloc(conv.pad_nbytes, k)
        arena.free(pad_off, k)
        xa = x.ctypes.data

        def run() -> None:
            base = self.buf.ctypes.data + self.shift
            conv.run(xa, base + pad_off, base + off_d, self.threads)
        run.impl = conv.impl  # type: ignore[attr-defined]
        run.nhwc = nhwc  # type: ignore[attr-defined]
        self.keep.append(conv)
        return run

    def _winograd(self, k: int, st: Mapping[str, Any], at: Attrs, src_md: Any, src_at: tuple[str, int],
                  dst_md: Any, off_d: int | None, ins: Sequence[np.ndarray],
                  shapes: Sequence[tuple[int, ...]], arena: _Arena, shared: dict[Any, Any]) -> Run | None:
        """The conv as Winograd's F(4x4, 3x3) (:mod:`rlx_cpu.winograd`) where it takes it and is the
        faster: the finite variant (see :data:`WINOGRAD`) on the OpenMP team, a 3x3 stride-1 conv
        of one group whose source and destination oneDNN keeps in NHWC, output bounded by the
        variant's plan, constant weights; None otherwise. A residual is already in the destination
        (the sum post-op's contract): the kernel adds it in place."""
        from . import winograd as wg

        if not (WINOGRAD and OPENMP and settings.CONV_OPENMP.get() and self.split < 2 and off_d is not None
                and k in self.wino and self.api.get("gomp")):
            return None
        # the shape rule and constant weights: checked by _winograd_steps when the plan took step k
        w, b = ins[st["w"]], ins[st["b"]]
        _, pads, _, _ = _conv_args(at)
        xs, oshape = shapes[st["src"]], shapes[k + 1]
        fns = self.p.fns
        lay_s, lay_d = _layout(fns, src_md), _layout(fns, dst_md)
        if lay_s is None or not lay_s[2] or lay_d is None or not lay_d[2]:
            return None
        act = self._act(st["op"], at)
        if not isinstance(act, str) or act not in wg.ACT:
            return None
        key = ("winograd", id(w))  # the transformed weights, shared by the thread-count variants
        try:
            conv = wg.WinogradConv(xs, w, b, oshape, pads, act, self.fuse.get(k), self.api["gomp"], wg.ISA,
                                   u=shared.get(key))
        except ValueError:
            return None
        if key not in shared:
            shared[key] = conv.u
            release_file_pages(w)  # the transformed copy runs: a memory-mapped original's pages leave
        sc_off = arena.alloc(conv.scratch_nbytes(self.threads), k)
        arena.free(sc_off, k)
        res = st.get("res") is not None
        kind, src_where = src_at

        def run() -> None:
            base = self.buf.ctypes.data + self.shift
            y = base + off_d
            conv.run(base + src_where if kind == "s" else src_where, y if res else 0, y, base + sc_off,
                     self.threads)
        run.impl = conv.impl  # type: ignore[attr-defined]
        self.keep.append(conv)
        return run

    def _next_conv_wants_nhwc(self, k: int, steps: Sequence[Mapping[str, Any]], ins: Sequence[np.ndarray],
                              shapes: Sequence[tuple[int, ...]]) -> bool:
        """Whether the first conv reading step ``k``'s output (directly or through max pools)
        prefers an NHWC source in oneDNN (its brgconv kernels here)."""
        from .onednn_conv import _ARG_SRC, OneDNNError
        from .onednn_conv import _QUERY_EXEC_ARG_MD as XMD

        v = k + 1
        for k2 in range(k + 1, len(steps)):
            st2 = steps[k2]
            if v not in (st2["src"], st2.get("res")):
                continue
            if st2["op"] == _POOL and st2["src"] == v:
                v = k2 + 1
                continue
            if not _is_conv(st2) or st2["src"] != v:
                return False
            at2 = _step_attrs(st2)
            strides, pads, dil, g = _conv_args(at2)
            try:
                pd, _, _ = self._conv_pd(self.p.md_any(shapes[v]), ins[st2["w"]], ins[st2["b"]],
                                         shapes[k2 + 1], strides, pads, dil, g, st2.get("res") is not None,
                                         self._act(st2["op"], at2))
            except (OneDNNError, _Unsupported):  # no preference then: oneDNN's own layout
                return False
            lay = _layout(self.p.fns, self.p.fns["dnnl_primitive_desc_query_md"](pd, XMD, _ARG_SRC))
            return bool(lay is not None and lay[2])
        return False

    def _act(self, op: str, attrs: Attrs) -> Any:
        act = _act(op, attrs)
        return "relu_drops_nan" if act == "relu" and self.fast_relu else act

    def _pool_pd(self, src_md: Any, dst_md: Any, at: Attrs) -> Any:
        """oneDNN's max pooling (forward inference) from ``src_md`` into ``dst_md``, same layout."""
        from .onednn_conv import _FWD_INFERENCE, _POOLING_MAX, _VP, _dims

        p = self.p
        kh, kw, sh, sw, pt, pl = _pool_args(at)
        pads = at["pads"]
        assert isinstance(pads, tuple)
        pd = _VP()
        p.check(p.fns["dnnl_pooling_forward_primitive_desc_create"](
            ctypes.byref(pd), self.api["engine"], _FWD_INFERENCE, _POOLING_MAX, src_md, dst_md,
            _dims((sh, sw)), _dims((kh, kw)), _dims((0, 0)), _dims((pt, pl)),
            _dims((int(pads[2]), int(pads[3]))), p.attr()), "pooling primitive_desc")
        p.owned.append(("dnnl_primitive_desc_destroy", pd))
        return pd

    def _conv_pd(self, src_md: Any, w: np.ndarray, b: np.ndarray, oshape: tuple[int, ...],
                 strides: tuple[int, int], pads: tuple[int, int, int, int], dil: tuple[int, int], g: int,
                 add: bool, act: Any, dst: Any = None, clip: tuple[float, float] | None = None
                 ) -> tuple[Any, Any, Any]:
        """(the conv's primitive descriptor, its weights md, the user's weights md). Source and
        destination in the layout oneDNN picks; where it picks another source layout than the
        producer's, the producer's is tried first (a reorder is the last resort)."""
        from .onednn_conv import (
            _CONV_DIRECT,
            _FWD_INFERENCE,
            _VP,
            OneDNNError,
            _dims,
            _post_ops,
            _strides_elems,
            impl_info,
            weight_dims,
        )

        p, fns = self.p, self.p.fns
        oc, ci, kh, kw = w.shape
        wshape, wstr = weight_dims(w, g)
        w_user = p.md_plain(wshape, wstr)
        b_md = p.md_plain(b.shape, _strides_elems(b))
        (sh, sw), (pt, pl, pb, pr), (dh, dw) = strides, pads, dil
        q = fns["dnnl_primitive_desc_query_md"]
        from .onednn_conv import _ARG_WEIGHTS
        from .onednn_conv import _QUERY_EXEC_ARG_MD as XMD

        def make(src: Any) -> Any:
            pd = _VP()
            st = fns["dnnl_convolution_forward_primitive_desc_create"](
                ctypes.byref(pd), self.api["engine"], _FWD_INFERENCE, _CONV_DIRECT, src, p.md_any(wshape),
                b_md, p.md_any(oshape) if dst is None else dst, _dims((sh, sw)), _dims((dh - 1, dw - 1)),
                _dims((pt, pl)), _dims((pb, pr)), _post_ops(p, add, act, clip))
            if st != 0:
                return None
            p.owned.append(("dnnl_primitive_desc_destroy", pd))
            return pd

        eq = fns["dnnl_memory_desc_equal"]
        if dst is not None:  # a piece: its layouts are the whole conv's
            pd = make(src_md)
            if pd is None or impl_info(self.api, pd).startswith("ref"):
                raise _Unsupported("no fast conv for these layouts")
            return pd, q(pd, XMD, _ARG_WEIGHTS), w_user
        from .onednn_conv import _ARG_SRC

        shape = tuple(int(v) for v in self._dims_of(src_md))
        best = make(p.md_any(shape))  # the layout oneDNN prefers for this conv
        if best is not None and eq(q(best, XMD, _ARG_SRC), src_md):
            return best, q(best, XMD, _ARG_WEIGHTS), w_user
        # The producer's layout, unless oneDNN then falls back to its GEMM or reference convs
        # (EfficientNet's depthwise convs on plain NCHW: 10x slower than a reorder and its own).
        pd = make(src_md)
        have = "" if pd is None else impl_info(self.api, pd)
        brg = BRG_FIRST and best is not None and impl_info(self.api, best).startswith("brg")
        if have and not have.startswith(("ref", "x64:gemm", "gemm")) and (have.startswith("brg") or not brg):
            return pd, q(pd, XMD, _ARG_WEIGHTS), w_user
        if best is None:
            best = pd
        if best is None or impl_info(self.api, best).startswith("ref"):
            raise OneDNNError("oneDNN has no fast conv for a conv of the chain", where="rlx_cpu.conv_chain",
                              fix="none needed: the chain runs its ops one at a time")
        return best, q(best, XMD, _ARG_WEIGHTS), w_user

    def _pieces(self, scratch_mem: Callable[[Any, int], Any], src_md: Any, src_at: tuple[str, int],
                dst_md: Any, dst_at: tuple[str, int], w: np.ndarray, b: np.ndarray, oshape: tuple[int, ...],
                strides: tuple[int, int], pads: tuple[int, int, int, int], dil: tuple[int, int], g: int,
                add: bool, act: Any, shared: dict[Any, Any],
                reorder: Callable[[Any, Any, Any, Any], None]) -> Run | None:
        """The conv as one-thread primitives on independent pieces that the row pool's threads take
        in turn, or None where it is not worth it or the layouts do not allow it: whole images,
        output rows (NHWC, one image: each piece reads its input rows and the kernel's halo in
        place) or output channels (every piece reads the whole input and only its channels'
        weights), whichever makes each piece read the fewest bytes (:func:`_choose_cut`). Nothing
        is reordered per piece but an NHWC channel piece's output: oneDNN has only its reference
        conv for a destination whose channels are a strided slice, so the piece writes a dense
        buffer of its own (holding the residual first, for the sum post-op) and copies it into
        its channels. A thread on a core another process takes runs fewer pieces."""
        from .onednn_conv import MIN_MACS_PER_PIECE

        fns = self.p.fns
        n, oc, ho, wo = oshape
        src_lay, dst_lay = _layout(fns, src_md), _layout(fns, dst_md)
        if src_lay is None or dst_lay is None:
            return None
        most = n * oc * ho * wo * int(w[0].size) // MIN_MACS_PER_PIECE
        if min(self.split, most) < 2 or w.flags.writeable:  # fed weights: packed every run by the whole conv
            return None
        dims = self._dims_of(src_md)
        geo = (int(w.shape[2]), strides[0], pads[0], dil[0])
        kinds = _choose_cut(oshape, dims, int(w.size), g, add, self.split, most, src_lay, dst_lay, geo)
        for kind, cuts in kinds:
            run = self._cut_runs(kind, cuts, scratch_mem, src_md, src_at, dst_md, dst_at, w, b, oshape,
                                 strides, pads, dil, g, add, act, shared, reorder, src_lay, dst_lay)
            if run is not None:
                return run
        return None

    def _cut_runs(self, kind: str, cuts: Sequence[tuple[int, int, int, int, int, int]],
                  scratch_mem: Callable[[Any, int], Any], src_md: Any, src_at: tuple[str, int],
                  dst_md: Any, dst_at: tuple[str, int], w: np.ndarray, b: np.ndarray, oshape: tuple[int, ...],
                  strides: tuple[int, int], pads: tuple[int, int, int, int], dil: tuple[int, int], g: int,
                  add: bool, act: Any, shared: dict[Any, Any], reorder: Callable[[Any, Any, Any, Any], None],
                  src_lay: Lay, dst_lay: Lay) -> Run | None:
        """The pieces ``cuts`` (image from, to, output channel from, to, output row from, to) as
        one run for the row pool, or None where oneDNN gives no fast conv for a piece."""
        from .onednn_conv import (
            _ARG_BIAS,
            _ARG_DST,
            _ARG_SCRATCHPAD,
            _ARG_SRC,
            _ARG_WEIGHTS,
            _QUERY_EXEC_ARG_MD,
            _ExecArg,
            _execute,
            _strides_elems,
            impl_info,
        )

        p, fns = self.p, self.p.fns
        n, oc, ho, wo = oshape
        q = fns["dnnl_primitive_desc_query_md"]
        size = fns["dnnl_memory_desc_get_size"]
        c_in, h_in, w_in = self._dims_of(src_md)[1:]
        (sh, _), (pt, pl, _, pr), dh = strides, pads, dil[0]
        kh = int(w.shape[2])
        # NHWC channel pieces write a dense buffer of their own (see _pieces)
        own = kind == "channels" and bool(dst_lay[2])

        def mem(md: Any, at: tuple[str, int], shift: int) -> Any:
            return scratch_mem(md, at[1] + shift) if at[0] == "s" else p.memory(md, at[1] + shift)

        runs: list[list[tuple[Any, Any]]] = []
        keep: list[Any] = []
        impl = ""
        for j, (n0, n1, c0, c1, r0, r1) in enumerate(cuts):
            # Input rows lo:hi that output rows r0:r1 read (outside the input: padding).
            lo, hi = r0 * sh - pt, (r1 - 1) * sh - pt + dh * (kh - 1) + 1
            if lo >= h_in or hi <= 0:  # a piece reading padding only
                return None
            rows = (r0, r1) != (0, ho)
            a, z = (max(lo, 0), min(hi, h_in)) if rows else (0, h_in)
            ppads = (max(-lo, 0), pl, max(hi - h_in, 0), pr) if rows else pads
            s_whole = (n0, n1, a, z) == (0, n, 0, h_in)
            s_md = src_md if s_whole else p.md_like(src_md, (n1 - n0, c_in, z - a, w_in))
            pshape = (n1 - n0, c1 - c0, r1 - r0, wo)
            whole = (n0, n1, c0, c1, r0, r1) == (0, n, 0, oc, 0, ho)
            if own:  # the piece's channels of the NHWC destination: a strided slice
                d_md = p.md_plain(pshape, dst_lay[1])
                cc = c1 - c0
                t_md = p.md_plain(pshape, (ho * wo * cc, 1, wo * cc, cc))
            else:
                d_md = dst_md if whole else p.md_like(dst_md, pshape)
                t_md = d_md
            s_shift = 4 * (n0 * src_lay[1][0] + a * src_lay[1][2])
            d_shift = 4 * (n0 * dst_lay[1][0] + (c0 // dst_lay[0]) * dst_lay[1][1] + r0 * dst_lay[1][2])
            if own:
                d_shift = 4 * (n0 * dst_lay[1][0] + c0)
            wp, bp = w[c0:c1], b[c0:c1]
            try:
                pd, w_md, w_user = self._conv_pd(s_md, wp, bp, pshape, strides, ppads, dil, g, add, act,
                                                 dst=t_md)
            except _Unsupported:
                if kind == "channels":
                    return None  # the next cut kind is tried
                raise
            piece_impl = impl_info(self.api, pd)
            if kind == "channels" and not piece_impl.startswith(("brg", "jit")):
                return None
            if not fns["dnnl_memory_desc_equal"](q(pd, _QUERY_EXEC_ARG_MD, _ARG_SRC), s_md):
                return None
            w_mem = self._weights(wp, w_md, w_user, shared, reorder, (id(w), c0, c1))
            d_mem = mem(d_md, dst_at, d_shift)
            steps: list[tuple[Any, Any]] = []
            if own:
                t_mem = self._piece_area(2 * j + 1, t_md)
                if add:  # the sum post-op adds what the piece's buffer holds: the residual's channels
                    copy = self._copy(d_md, t_md, d_mem, t_mem)
                    if copy is None:
                        return None
                    steps.append(copy)
            else:
                t_mem = d_mem
            args = [(_ARG_SRC, mem(s_md, src_at, s_shift)), (_ARG_WEIGHTS, w_mem), (_ARG_DST, t_mem),
                    (_ARG_BIAS, p.memory(p.md_plain(bp.shape, _strides_elems(bp)), bp.ctypes.data))]
            sp = q(pd, _QUERY_EXEC_ARG_MD, _ARG_SCRATCHPAD)
            if sp and size(sp):
                args.append((_ARG_SCRATCHPAD, self._piece_area(2 * j, sp)))
            arr = (_ExecArg * len(args))(*(_ExecArg(a, m) for a, m in args))
            keep.append(arr)
            steps.append((p.primitive(pd), arr))
            if own:
                copy = self._copy(t_md, d_md, t_mem, d_mem)
                if copy is None:
                    return None
                steps.append(copy)
            runs.append(steps)
            impl = piece_impl
        self.keep.extend(keep)
        api, held = self.api, self.keep

        def some(lo: int, hi: int) -> None:
            _execute(api, [s for r in runs[lo:hi] for s in r], 1, held)

        from .parallel import pool

        rp = pool()
        parts = min(rp.threads, len(runs))

        def run() -> None:
            rp.run(some, len(runs), (), parts, len(runs))
        run.impl = f"{impl} {kind} x{len(runs)}"  # type: ignore[attr-defined]
        return run

    def _piece_area(self, area: int, md: Any) -> Any:
        """A memory in the conv scratch's piece area ``area`` (after the chain's values: area 2j
        holds piece j's conv scratchpad, 2j + 1 piece j's own output buffer), which piece j of
        every cut conv shares: a conv's pieces run at once, convs one after another. In the
        thread's scratch, not in buffers of their own, so that they add no memory per conv."""
        mem = self.p.memory(md, 0)
        while len(self.piece_sp_nb) <= area:
            self.piece_sp_nb.append(0)
        nb = int(self.p.fns["dnnl_memory_desc_get_size"](md))
        self.piece_sp_nb[area] = max(self.piece_sp_nb[area], -(-nb // 64) * 64)
        self.piece_sp.append((mem, area))
        return mem

    def _copy(self, src_md: Any, dst_md: Any, src: Any, dst: Any) -> tuple[Any, Any] | None:
        """A reorder (a plain copy between strides here) as a piece's step, or None where it would
        need a scratchpad (pieces run at once; they have only their conv's)."""
        from .onednn_conv import _ARG_FROM, _ARG_SCRATCHPAD, _ARG_TO, _QUERY_EXEC_ARG_MD, _ExecArg

        p, fns = self.p, self.p.fns
        pd = ctypes.c_void_p()
        eng = self.api["engine"]
        made = fns["dnnl_reorder_primitive_desc_create"](ctypes.byref(pd), src_md, eng, dst_md, eng, p.attr())
        if made != 0:
            return None
        p.owned.append(("dnnl_primitive_desc_destroy", pd))
        sp = fns["dnnl_primitive_desc_query_md"](pd, _QUERY_EXEC_ARG_MD, _ARG_SCRATCHPAD)
        if sp and fns["dnnl_memory_desc_get_size"](sp):
            return None
        arr = (_ExecArg * 2)(_ExecArg(_ARG_FROM, src), _ExecArg(_ARG_TO, dst))
        self.keep.append(arr)
        return p.primitive(pd), arr

    def _dims_of(self, md: Any) -> tuple[int, ...]:
        ptr = ctypes.POINTER(ctypes.c_int64)()
        self.p.fns["dnnl_memory_desc_query"](md, _QUERY_DIMS, ctypes.byref(ptr))
        return tuple(int(ptr[i]) for i in range(4))

    def _weights(self, w: np.ndarray, w_md: Any, w_user: Any, shared: dict[Any, Any],
                 reorder: Callable[[Any, Any, Any, Any], None], key: Any = None) -> Any:
        """The weights in the conv's layout: packed once now when they are constants (shared with
        the other thread-count variants where the layout is the same), else every run."""
        from .onednn_conv import _aligned, _execute

        p, fns = self.p, self.p.fns
        eq, size = fns["dnnl_memory_desc_equal"], fns["dnnl_memory_desc_get_size"]
        w_src = p.memory(w_user, w.ctypes.data)
        if eq(w_md, w_user):
            return w_src
        if not w.flags.writeable:
            for prev_md, prev_mem, owner in shared.get(key or id(w), ()):
                if eq(prev_md, w_md):
                    self.keep.append(owner)
                    return prev_mem
        wb = _aligned(int(size(w_md)))
        self.keep.append(wb)
        w_mem = p.memory(w_md, wb.ctypes.data)
        if w.flags.writeable:
            reorder(w_user, w_md, w_src, w_mem)  # fed weights: packed every run, before the conv
            return w_mem
        # Pack now, with a reorder of its own (run once here, not one of the chain's steps).
        entries, sp_before, sp_nb = self.entries, list(self.sp), self.sp_nb
        self.entries = []
        reorder(w_user, w_md, w_src, w_mem)
        pack, self.entries = self.entries, entries
        for mem in self.sp[len(sp_before):]:  # its scratchpad, if any: a buffer for this one run
            pad = _aligned(self.sp_nb)
            self.keep.append(pad)
            p.check(fns["dnnl_memory_set_data_handle"](mem, ctypes.c_void_p(pad.ctypes.data)),
                    "set_data_handle")
        self.sp, self.sp_nb = sp_before, sp_nb
        _execute(self.api, pack, 1)  # type: ignore[arg-type]  # reorders only
        release_file_pages(w)  # the packed copy runs: a memory-mapped original's pages leave the RSS
        shared.setdefault(key or id(w), []).append((w_md, w_mem, (p, wb, w)))
        return w_mem

    def _clip_entry(self, lo: float | None, hi: float | None, src_off: int, dst_off: int, nbytes: int,
                    value: int) -> Run:
        """``maximum`` with ``lo`` and/or ``minimum`` with ``hi`` over the whole blocked buffer (its
        zero padding channels stay zero: the rule takes only bounds that keep 0 at 0), as one
        ``np.clip`` pass where both are given (NaN stays NaN, as the IR's maximum/minimum keep it)."""
        import numpy as np

        views: dict[str, Any] = {}
        lv, hv = (None if lo is None else np.float32(lo)), (None if hi is None else np.float32(hi))

        def run() -> None:
            if views.get("at") is not self.buf:  # the thread's scratch moved (or another thread runs)
                a, b = self.shift + src_off, self.shift + dst_off
                views.update(at=self.buf, x=self.buf[a:a + nbytes].view(np.float32),
                             o=self.buf[b:b + nbytes].view(np.float32))
            if lv is not None and hv is not None:
                np.clip(views["x"], lv, hv, out=views["o"])
            elif lv is not None:
                np.maximum(views["x"], lv, out=views["o"])
            elif hv is not None:
                np.minimum(views["x"], hv, out=views["o"])
        #: (the value it writes, source and destination offsets, lower and upper bound)
        run.clip = (value, src_off, dst_off, lo, hi)  # type: ignore[attr-defined]
        return run

    def _se_run(self, st: Mapping[str, Any], ins: Sequence[np.ndarray], src_off: int, dst_off: int,
                view: tuple[int, int, int, int, int], c: int) -> Run:
        """An SE step on the blocked buffer (``view``: its (N, blocks, H, W, lanes) shape), in place
        where ``dst_off`` is ``src_off``; images are cut for the row pool's threads where there is
        enough work."""
        import numpy as np

        from . import _se_nb as nb

        if any(ins[st[k]].flags.writeable for k in ("w", "b", "w2", "b2")):
            raise _Unsupported("fed SE weights")  # transposed once here: constants only
        w1t = np.ascontiguousarray(ins[st["w"]][:, :, 0, 0].T, np.float32)
        w2t = np.ascontiguousarray(ins[st["w2"]][:, :, 0, 0].T, np.float32)
        b1 = np.ascontiguousarray(ins[st["b"]], np.float32)
        b2 = np.ascontiguousarray(ins[st["b2"]], np.float32)
        act = {"rlx_cpu.conv2d_bias_relu": nb.RELU,
               "rlx_cpu.conv2d_bias_silu": nb.SILU}.get(st["fc1"], nb.NONE)
        gate = st["gate"]
        hard = gate[0] != "sigmoid"
        ga, gb, glo, ghi = (float(v) for v in gate[1:]) if hard else (1.0, 0.0, 0.0, 1.0)
        args = (c, w1t, b1, act, w2t, b2, nb.HARD if hard else nb.SIGMOID, ga, gb, glo, ghi)
        images = view[0]
        size = 4 * int(np.prod(view))
        views: dict[str, Any] = {}

        def run() -> None:
            if views.get("at") is not self.buf:  # the thread's scratch moved (or another thread runs)
                a, b = self.shift + src_off, self.shift + dst_off
                views.update(at=self.buf, x=self.buf[a:a + size].view(np.float32).reshape(view),
                             o=self.buf[b:b + size].view(np.float32).reshape(view))
            from .parallel import pool

            x, o = views["x"], views["o"]
            pl_ = pool()
            parts = min(pl_.active, images, max(1, x.size // 65536))
            if parts > 1:
                pl_.run(nb.se_blocked, images, (x, o, *args), parts)
            else:
                nb.se_blocked(x, o, *args, 0, images)
        # Compile (or load from Numba's cache) now, not on the first run.
        z = np.zeros((1, 1, 1, 1, 1), np.float32)
        nb.se_blocked(z, z.copy(), 1, np.zeros((1, 1), np.float32), np.zeros(1, np.float32), act,
                      np.zeros((1, 1), np.float32), np.zeros(1, np.float32), args[6], ga, gb, glo, ghi, 0, 1)
        return run

    def _mean_run(self, src_off: int, view: tuple[int, int, int, int, int], o: np.ndarray) -> Run:
        import numpy as np

        from ._pool_np import mean_kernel

        mean_blocked = mean_kernel()
        size = 4 * int(np.prod(view))
        views: dict[str, Any] = {}
        c = int(o.shape[1])

        def run() -> None:
            if views.get("at") is not self.buf:  # the thread's scratch moved (or another thread runs)
                a = self.shift + src_off
                views.update(at=self.buf, x=self.buf[a:a + size].view(np.float32).reshape(view))
            mean_blocked(views["x"], o, c, 0, view[0])
        z = np.zeros((1, 1, 1, 1, 1), np.float32)
        mean_blocked(z, np.zeros((1, 1), np.float32), 1, 0, 1)  # compile (or load) now
        run.kind = _kind(mean_blocked)  # type: ignore[attr-defined]
        return run

    def _pool_run(self, src_off: int | None, src_arr: np.ndarray | None, src_shape: tuple[int, ...],
                  dst_off: int, dst_shape: tuple[int, ...], args: tuple[int, int, int, int, int, int]) -> Run:
        from ._pool_np import blocked_kernel

        max_pool_blocked = blocked_kernel()
        kh, kw, sh, sw, pt, pl = args
        views: dict[str, Any] = {}

        def view(off: int, shape: tuple[int, ...]) -> np.ndarray:
            import numpy as np

            start = self.shift + off
            arr: np.ndarray = self.buf[start:start + 4 * int(np.prod(shape))].view(np.float32)
            return arr.reshape(shape)

        def run() -> None:
            if views.get("at") is not self.buf:  # the thread's scratch moved (or another thread runs)
                if src_arr is not None:
                    xs = src_arr.reshape(src_shape)
                else:
                    assert src_off is not None
                    xs = view(src_off, src_shape)
                views.update(at=self.buf, x=xs, o=view(dst_off, dst_shape))
            from .parallel import pool

            xs, os_ = views["x"], views["o"]
            planes = dst_shape[0]
            pl_ = pool()
            parts = min(pl_.active, planes, max(1, os_.size * kh * kw // 262144))
            if parts > 1:
                pl_.run(max_pool_blocked, planes, (xs, os_, kh, kw, sh, sw, pt, pl), parts)
            else:
                max_pool_blocked(xs, os_, kh, kw, sh, sw, pt, pl, 0, planes)
        # Compile (or load from Numba's cache) now, not on the first run.
        import numpy as np

        z = np.zeros((1, 1, 1, 1), np.float32)
        max_pool_blocked(z, z.copy(), 1, 1, 1, 1, 0, 0, 0, 1)
        run.kind = _kind(max_pool_blocked)  # type: ignore[attr-defined]
        return run

    def run(self) -> None:
        from .conv import scratch
        from .onednn_conv import OneDNNError, _stream

        p, api = self.p, self.api
        fns = api["fns"]
        self.buf = buf = scratch(p.scratch_nb + 64)
        base = -(-buf.ctypes.data // 64) * 64
        self.shift = base - buf.ctypes.data
        if base != self.where:
            for mem, off in p.in_scratch:
                p.check(fns["dnnl_memory_set_data_handle"](mem, ctypes.c_void_p(base + off)),
                        "memory_set_data_handle")
            self.where = base
        get_t, set_t = api["omp"]
        prev = get_t()
        if prev != self.threads:
            set_t(self.threads)
        try:
            ex, stream = fns["dnnl_primitive_execute"], _stream(api)
            for e in self.entries:
                if callable(e):  # a NumPy step: the primitives before it are done (see _execute)
                    e()
                    continue
                prim, args = e
                st = ex(prim, stream, len(args), args)
                if st != 0:
                    raise OneDNNError(f"oneDNN failed in a conv chain at run time (status {st})",
                                      where="rlx_cpu.conv_chain",
                                      fix="set RLX_CPU_CONV_CHAIN=0 (or RLX_CPU_ONEDNN=0), and report it")
        finally:
            if prev != self.threads:
                set_t(prev)


class _Arena:
    """Offsets in the chain's scratch: a value's block is free again after its last reader."""

    def __init__(self) -> None:
        self.top = 0
        self.blocks: list[list[int]] = []  # [offset, size, free from step]

    def alloc(self, nbytes: int, step: int) -> int:
        nbytes = -(-max(nbytes, 1) // 64) * 64
        fits = [b for b in self.blocks if b[2] <= step and b[1] >= nbytes]
        if fits:
            b = min(fits, key=lambda b: b[1])
            b[2] = 1 << 62
            return b[0]
        off = self.top
        self.top += nbytes
        self.blocks.append([off, nbytes, 1 << 62])
        return off

    def free(self, off: int, step: int) -> None:
        for b in self.blocks:
            if b[0] == off:
                b[2] = step + 1
