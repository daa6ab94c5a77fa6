"""The ONNX model zoo (issue 17): real architectures with random weights, exported here, no downloads.

Each entry builds a seeded ``torch.nn.Module`` (torchvision, Hugging Face ``transformers`` from a tiny
``from_config`` config, or plain ``torch.nn``), its inputs for a given batch, and the names and dynamic
axes of those inputs. :func:`export` writes it with either PyTorch exporter (``legacy``: TorchScript,
``dynamo=False``; ``dynamo``: torch.export) with static or dynamic axes, cached by content;
:func:`compare` imports the file with rlx_core's ONNX loader, runs it on ``Session("cpu")`` and checks
it against ONNX Runtime on the same inputs (f32: max |rlx - ort| <= 1e-4 x max |ort|).

Used by tests/test_onnx_zoo.py and bench/onnx_zoo.py; it does not depend on rlx_conformance.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

EXPORTERS = ("legacy", "dynamo")
# Export example batch: 2, because torch.export specialises a dim whose example size is 0 or 1.
EXPORT_BATCH = 2
SEQ = 8  # text models' sequence length at export; the dynamic check also runs SEQ_ALT
SEQ_ALT = 5
RTOL = 1e-4  # times the output's scale (max |ort|)


@dataclass(frozen=True)
class Built:
    module: Any  # torch.nn.Module in eval mode
    inputs: Callable[[int, bool], tuple[Any, ...]]  # (batch, alternative sequence length) -> tensors
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    dynamic: Mapping[str, Mapping[int, str]]  # input -> {axis: symbol}


@dataclass(frozen=True)
class ZooModel:
    name: str
    family: str  # torchvision | transformers | torch
    build: Callable[[], Built] = field(repr=False)
    opsets: tuple[int, int]  # (legacy, dynamo): the zoo spreads its files over opsets 13-21
    slow: bool = False  # behind the zoo_slow marker: not in the default test run


# ---------------------------------------------------------------------------------------------
# torchvision's C++ operators

_TV_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "int sampling_ratio, bool aligned) -> Tensor",
    "_roi_align_backward(Tensor grad, Tensor rois, float spatial_scale, SymInt pooled_height, "
    "SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, SymInt width, "
    "int sampling_ratio, bool aligned) -> Tensor",
    "ps_roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "int sampling_ratio) -> (Tensor, Tensor)",
    "_ps_roi_align_backward(Tensor grad, Tensor rois, Tensor channel_mapping, float spatial_scale, "
    "SymInt pooled_height, SymInt pooled_width, int sampling_ratio, SymInt batch_size, SymInt channels, "
    "SymInt height, SymInt width) -> Tensor",
    "roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width) "
    "-> (Tensor, Tensor)",
    "_roi_pool_backward(Tensor grad, Tensor rois, Tensor argmax, float spatial_scale, SymInt pooled_height, "
    "SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, SymInt width) -> Tensor",
    "ps_roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width) "
    "-> (Tensor, Tensor)",
    "_ps_roi_pool_backward(Tensor grad, Tensor rois, Tensor channel_mapping, float spatial_scale, "
    "SymInt pooled_height, SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, "
    "SymInt width) -> Tensor",
    "qroi_align(Tensor input, Tensor rois, float input_scale, int input_zero_point, float rois_scale, "
    "int rois_zero_point, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "int sampling_ratio, bool aligned) -> Tensor",
    "deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, SymInt stride_h, "
    "SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, SymInt dilation_w, SymInt groups, "
    "SymInt offset_groups, bool use_mask) -> Tensor",
    "_deform_conv2d_backward(Tensor grad, Tensor input, Tensor weight, Tensor offset, Tensor mask, "
    "Tensor bias, SymInt stride_h, SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, "
    "SymInt dilation_w, SymInt groups, SymInt offset_groups, bool use_mask) -> (Tensor, Tensor, Tensor, "
    "Tensor, Tensor)",
)
_TV_LIB: list[Any] = []  # keeps the torch.library.Library alive (its ops vanish with it)


def torchvision() -> Any:
    """Import torchvision, also where its C++ extension cannot load.

    PyPI's torchvision 0.28.0 wheel is built against CUDA torch; beside the CPU torch 2.13.0 that the
    lock pins, its ``_C.so`` does not load and ``import torchvision`` dies registering fake kernels
    for ``torchvision::nms`` ("operator torchvision::nms does not exist"). The classification and
    segmentation models never call those operators, so declaring their schemas (copied from the
    extension) is enough to import it; detection needs a real ``nms`` (see ``_nms_reference``).
    """
    import torch

    if not _TV_LIB and not hasattr(torch.ops.torchvision, "nms"):
        lib = torch.library.Library("torchvision", "DEF")
        for schema in _TV_SCHEMAS:
            lib.define(schema)
        lib.impl("nms", _nms_reference, "CPU")
        _TV_LIB.append(lib)
    import torchvision as tv

    if _TV_LIB:
        # torchvision.ops.nms asks the extension whether its kernels loaded; the reference one has.
        tv.extension._has_ops = _ops_loaded
    return tv


def _ops_loaded() -> bool:  # a plain function: TorchScript compiles it when tracing nms
    return True


def _transformers() -> Any:
    """transformers imports torchvision when it is installed: make that import work first."""
    torchvision()
    import transformers

    return transformers


def _nms_reference(dets: Any, scores: Any, iou_threshold: float) -> Any:
    # Greedy NMS as torchvision's CPU kernel: highest score first, drop boxes with IoU > threshold.
    import torch

    order = torch.argsort(scores, descending=True, stable=True)
    x1, y1, x2, y2 = dets.unbind(1)
    area = (x2 - x1) * (y2 - y1)
    keep: list[int] = []
    suppressed = torch.zeros(dets.shape[0], dtype=torch.bool)
    for i in order.tolist():
        if suppressed[i]:
            continue
        keep.append(i)
        w = (torch.minimum(x2[i], x2) - torch.maximum(x1[i], x1)).clamp(min=0)
        h = (torch.minimum(y2[i], y2) - torch.maximum(y1[i], y1)).clamp(min=0)
        inter = w * h
        suppressed |= inter / (area[i] + area - inter) > iou_threshold
    return torch.tensor(keep, dtype=torch.int64)


# ---------------------------------------------------------------------------------------------
# Builders


def _seeded(make: Callable[[], Any]) -> Any:
    """Build under a fixed seed; give batch norms and norm affines non-trivial values; eval mode."""
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    m = make()
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, (nn.BatchNorm1d, nn.BatchNorm2d)):
                mod.running_mean.normal_(0.0, 0.1)
                mod.running_var.uniform_(0.5, 1.5)
            if isinstance(mod, (nn.BatchNorm1d, nn.BatchNorm2d, nn.LayerNorm, nn.GroupNorm)) and \
                    mod.weight is not None:
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.normal_(0.0, 0.1)
    return m.eval()


def _gen(batch: int, alt: bool) -> Any:
    import torch

    return torch.Generator().manual_seed(1000 * batch + int(alt))


def _image(c: int, hw: int) -> Callable[[int, bool], tuple[Any, ...]]:
    import torch

    return lambda b, alt: (torch.randn(b, c, hw, hw, generator=_gen(b, alt)),)


_IMG_AXES: dict[str, dict[int, str]] = {"x": {0: "batch"}}


def _vision(make: Callable[[], Any], hw: int = 64, out: tuple[str, ...] = ("y",)) -> Callable[[], Built]:
    return lambda: Built(_seeded(make), _image(3, hw), ("x",), out, _IMG_AXES)


class _First:
    """Wrap a model whose forward returns a dict or ModelOutput: return the named tensors as a tuple."""

    def __new__(cls, model: Any, keys: Sequence[str], names: Sequence[str] | None = None) -> Any:
        import torch.nn as nn

        class Wrapped(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(self, *args: Any) -> Any:
                kw = dict(zip(names, args, strict=True)) if names else {}
                out = self.model(**kw) if names else self.model(*args)
                return tuple(out[k] for k in keys)

        return Wrapped().eval()


def _tv_segmentation(kind: str) -> Callable[[], Any]:
    def make() -> Any:
        tv = torchvision()
        seg = tv.models.segmentation
        if kind == "deeplabv3":
            m = seg.deeplabv3_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=4,
                                                  aux_loss=False)
        else:  # FCN on a ResNet-18 trunk: fcn_resnet50's 35M weights add nothing but export time
            from torchvision.models._utils import IntermediateLayerGetter
            from torchvision.models.segmentation.fcn import FCN, FCNHead

            trunk = IntermediateLayerGetter(tv.models.resnet18(), {"layer4": "out"})
            m = FCN(trunk, FCNHead(512, 4))
        return _First(m, ["out"])
    return make


def _tv(fn: str, **kw: Any) -> Callable[[], Any]:
    return lambda: getattr(torchvision().models, fn)(weights=None, num_classes=10, **kw)


def _tv_convnext() -> Any:
    torchvision()  # before any torchvision submodule import
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    return ConvNeXt([CNBlockConfig(16, 32, 1), CNBlockConfig(32, 64, 1), CNBlockConfig(64, None, 1)],
                    num_classes=10)


def _tv_vit() -> Any:
    torchvision()  # before any torchvision submodule import
    import torch.nn as nn
    from torchvision.models.vision_transformer import VisionTransformer

    m = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64,
                          num_classes=10)
    nn.init.normal_(m.heads.head.weight, std=0.5)  # torchvision zero-inits the head: the output would be 0
    return m


def _tv_swin() -> Any:
    torchvision()  # before any torchvision submodule import
    from torchvision.models.swin_transformer import SwinTransformer

    return SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[2, 2], num_heads=[2, 2],
                           window_size=[4, 4], stochastic_depth_prob=0.0, num_classes=10)


def _tv_detection() -> Built:
    tv = torchvision()
    m = _seeded(lambda: tv.models.detection.retinanet_resnet50_fpn(
        weights=None, weights_backbone=None, num_classes=3, min_size=64, max_size=64))

    def inputs(b: int, alt: bool) -> tuple[Any, ...]:
        import torch

        return (torch.rand(3, 64, 64, generator=_gen(b, alt)),)  # one image: the model batches a list

    import torch.nn as nn

    class Wrapped(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = m

        def forward(self, x: Any) -> Any:
            out = self.m([x])[0]
            return out["boxes"], out["scores"], out["labels"]

    return Built(Wrapped().eval(), inputs, ("x",), ("boxes", "scores", "labels"), {})


# -- transformers ------------------------------------------------------------------------------

_TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64}
VOCAB = 100


def _ids(b: int, alt: bool, seq: int | None = None) -> Any:
    import torch

    return torch.randint(0, VOCAB, (b, seq or (SEQ_ALT if alt else SEQ)), generator=_gen(b, alt))


def _mask(ids: Any) -> Any:
    import torch

    m = torch.ones_like(ids)
    if ids.shape[0] > 1:
        m[-1, ids.shape[1] // 2:] = 0  # padding in the last row
    return m


_TEXT_AXES: dict[str, dict[int, str]] = {"input_ids": {0: "batch", 1: "seq"},
                                        "attention_mask": {0: "batch", 1: "seq"}}


def _hf(model_cls: str, config_cls: str, keys: Sequence[str] = ("last_hidden_state",),
        mask: bool = True, **cfg: Any) -> Callable[[], Built]:
    def build() -> Built:
        transformers = _transformers()

        config = getattr(transformers, config_cls)(**cfg)
        model = _seeded(lambda: getattr(transformers, model_cls)(config))
        names = ("input_ids", "attention_mask") if mask else ("input_ids",)

        def inputs(b: int, alt: bool) -> tuple[Any, ...]:
            ids = _ids(b, alt)
            return (ids, _mask(ids)) if mask else (ids,)

        return Built(_First(model, keys, names), inputs, names, tuple(keys),
                     {n: _TEXT_AXES[n] for n in names})
    return build


def _hf_text(model_cls: str, config_cls: str, **extra: Any) -> Callable[[], Built]:
    return _hf(model_cls, config_cls, vocab_size=VOCAB, max_position_embeddings=64, **_TINY, **extra)


def _hf_decoder(model_cls: str, config_cls: str, **extra: Any) -> Callable[[], Built]:
    # LLaMA-style: RoPE, RMSNorm, SwiGLU; 4 query heads over 2 key/value heads (grouped-query attention).
    return _hf(model_cls, config_cls, keys=("logits",), vocab_size=VOCAB, max_position_embeddings=64,
               num_key_value_heads=2, **_TINY, **extra)


def _hf_gpt2_past() -> Built:
    """GPT-2 decoding one step after a cached prefix: past keys/values in, logits and presents out."""
    import torch
    import torch.nn as nn
    transformers = _transformers()
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=4)
    model = _seeded(lambda: transformers.GPT2LMHeadModel(cfg))
    heads, hd, layers = 4, 8, 2

    class Step(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any, *past: Any) -> Any:
            cache = transformers.DynamicCache(config=cfg)
            for i in range(layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache,
                             use_cache=True)
            present = out.past_key_values
            flat = []
            for i in range(layers):
                layer = present.layers[i]
                flat += [layer.keys, layer.values]
            return (out.logits, *flat)

    past_names = tuple(f"past_{kv}_{i}" for i in range(layers) for kv in ("key", "value"))

    def inputs(b: int, alt: bool) -> tuple[Any, ...]:
        g = _gen(b, alt)
        plen = 3 if alt else 6
        ids = torch.randint(0, VOCAB, (b, 1), generator=g)
        mask = torch.ones(b, plen + 1, dtype=torch.int64)
        past = [torch.randn(b, heads, plen, hd, generator=g) for _ in range(2 * layers)]
        return (ids, mask, *past)

    axes: dict[str, dict[int, str]] = {"input_ids": {0: "batch"}, "attention_mask": {0: "batch", 1: "total"}}
    axes.update({n: {0: "batch", 2: "past"} for n in past_names})
    outs = ("logits", *(f"present_{kv}_{i}" for i in range(layers) for kv in ("key", "value")))
    return Built(Step().eval(), inputs, ("input_ids", "attention_mask", *past_names), outs, axes)


def _hf_seq2seq(model_cls: str, config_cls: str, **cfg: Any) -> Callable[[], Built]:
    def build() -> Built:
        transformers = _transformers()

        config = getattr(transformers, config_cls)(**cfg)
        model = _seeded(lambda: getattr(transformers, model_cls)(config))
        names = ("input_ids", "attention_mask", "decoder_input_ids")

        def inputs(b: int, alt: bool) -> tuple[Any, ...]:
            ids = _ids(b, alt)
            return ids, _mask(ids), _ids(b, alt, 4 if alt else 6)

        axes = dict(_TEXT_AXES, decoder_input_ids={0: "batch", 1: "dec_seq"})
        return Built(_First(model, ["last_hidden_state"], names), inputs, names, ("last_hidden_state",),
                     axes)
    return build


def _hf_image(model_cls: str, config_cls: str, hw: int = 32, **cfg: Any) -> Callable[[], Built]:
    def build() -> Built:
        transformers = _transformers()

        config = getattr(transformers, config_cls)(**cfg)
        model = _seeded(lambda: getattr(transformers, model_cls)(config))
        return Built(_First(model, ["last_hidden_state"], ["pixel_values"]), _image(3, hw), ("pixel_values",),
                     ("last_hidden_state",), {"pixel_values": {0: "batch"}})
    return build


def _hf_whisper(part: str) -> Callable[[], Built]:
    def build() -> Built:
        import torch
        transformers = _transformers()

        config = transformers.WhisperConfig(
            vocab_size=VOCAB, num_mel_bins=16, d_model=32, encoder_layers=2, decoder_layers=2,
            encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
            max_source_positions=16, max_target_positions=32, pad_token_id=0, bos_token_id=1,
            eos_token_id=2, decoder_start_token_id=1)
        model = _seeded(lambda: transformers.WhisperModel(config))
        if part == "encoder":
            def feats(b: int, alt: bool) -> tuple[Any, ...]:
                return (torch.randn(b, 16, 32, generator=_gen(b, alt)),)

            return Built(_First(model.encoder, ["last_hidden_state"], ["input_features"]), feats,
                         ("input_features",), ("last_hidden_state",), {"input_features": {0: "batch"}})
        dec = model.decoder

        def dec_inputs(b: int, alt: bool) -> tuple[Any, ...]:
            g = _gen(b, alt)
            return _ids(b, alt, 4 if alt else 6), torch.randn(b, 16, 32, generator=g)

        names = ("input_ids", "encoder_hidden_states")
        return Built(_First(dec, ["last_hidden_state"], names), dec_inputs, names, ("last_hidden_state",),
                     {"input_ids": {0: "batch", 1: "seq"}, "encoder_hidden_states": {0: "batch"}})
    return build


def _hf_clip(part: str) -> Callable[[], Built]:
    tiny = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    if part == "text":
        return _hf("CLIPTextModel", "CLIPTextConfig", keys=("last_hidden_state", "pooler_output"),
                   vocab_size=VOCAB, max_position_embeddings=64, eos_token_id=2, **tiny)
    return _hf_image("CLIPVisionModel", "CLIPVisionConfig", image_size=32, patch_size=8, **tiny)


# -- plain torch.nn ---------------------------------------------------------------------------

def _seq_inputs(feat: int) -> Callable[[int, bool], tuple[Any, ...]]:
    import torch

    return lambda b, alt: (torch.randn(b, SEQ_ALT if alt else SEQ, feat, generator=_gen(b, alt)),)


def _rnn(kind: str) -> Built:
    import torch.nn as nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            cls = nn.LSTM if kind == "lstm" else nn.GRU
            self.rnn = cls(16, 24, num_layers=2, batch_first=True, bidirectional=kind == "lstm")
            self.head = nn.Linear(48 if kind == "lstm" else 24, 5)

        def forward(self, x: Any) -> Any:
            return self.head(self.rnn(x)[0])

    return Built(_seeded(Net), _seq_inputs(16), ("x",), ("y",), {"x": {0: "batch", 1: "seq"}})


def _mha() -> Built:
    import torch.nn as nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = nn.MultiheadAttention(32, 4, batch_first=True)

        def forward(self, x: Any) -> Any:
            y, w = self.attn(x, x, x)
            return y, w

    return Built(_seeded(Net), _seq_inputs(32), ("x",), ("y", "weights"), {"x": {0: "batch", 1: "seq"}})


def _audio() -> Built:
    import torch
    import torch.nn as nn

    def block(cin: int, cout: int) -> Any:
        return nn.Sequential(nn.Conv1d(cin, cout, 5, stride=2, padding=2), nn.BatchNorm1d(cout), nn.ReLU(),
                             nn.MaxPool1d(2))

    def make() -> Any:
        return nn.Sequential(block(1, 16), block(16, 32), nn.Conv1d(32, 32, 3, padding=1, groups=4),
                             nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(32, 6))

    return Built(_seeded(make), lambda b, alt: (torch.randn(b, 1, 400, generator=_gen(b, alt)),), ("x",),
                 ("y",), {"x": {0: "batch"}})


def _zoo() -> list[ZooModel]:
    tv, hf, nn_ = "torchvision", "transformers", "torch"
    return [
        ZooModel("resnet18", tv, _vision(_tv("resnet18")), (13, 18)),
        ZooModel("mobilenet_v2", tv, _vision(_tv("mobilenet_v2")), (14, 19)),
        ZooModel("mobilenet_v3_small", tv, _vision(_tv("mobilenet_v3_small")), (15, 20)),
        ZooModel("efficientnet_b0", tv, _vision(_tv("efficientnet_b0")), (16, 21)),
        ZooModel("regnet_y_400mf", tv, _vision(_tv("regnet_y_400mf")), (17, 18)),
        ZooModel("convnext_tiny_cfg", tv, _vision(_tv_convnext), (17, 19)),
        ZooModel("vit_tiny_cfg", tv, _vision(_tv_vit, hw=32), (14, 20)),
        ZooModel("swin_tiny_cfg", tv, _vision(_tv_swin), (17, 21), slow=True),
        ZooModel("deeplabv3_mobilenet_v3", tv, _vision(_tv_segmentation("deeplabv3")), (16, 18)),
        ZooModel("fcn_resnet18", tv, _vision(_tv_segmentation("fcn")), (13, 20)),
        ZooModel("retinanet_resnet50_fpn", tv, _tv_detection, (17, 18), slow=True),
        ZooModel("bert", hf, _hf_text("BertModel", "BertConfig"), (14, 18)),
        ZooModel("distilbert", hf, _hf("DistilBertModel", "DistilBertConfig", vocab_size=VOCAB,
                                       max_position_embeddings=64, dim=32, n_layers=2, n_heads=4,
                                       hidden_dim=64), (14, 19)),
        ZooModel("roberta", hf, _hf_text("RobertaModel", "RobertaConfig", pad_token_id=1), (15, 20)),
        ZooModel("gpt2", hf, _hf("GPT2Model", "GPT2Config", vocab_size=VOCAB, n_positions=64, n_embd=32,
                                 n_layer=2, n_head=4), (16, 21)),
        ZooModel("gpt2_past", hf, _hf_gpt2_past, (17, 18)),
        ZooModel("t5", hf, _hf_seq2seq("T5Model", "T5Config", vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64,
                                       num_layers=2, num_heads=4, decoder_start_token_id=0), (15, 19)),
        ZooModel("bart", hf, _hf_seq2seq("BartModel", "BartConfig", vocab_size=VOCAB, d_model=32,
                                         encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                                         decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                                         max_position_embeddings=64), (14, 20)),
        ZooModel("vit_hf", hf, _hf_image("ViTModel", "ViTConfig", image_size=32, patch_size=8, **_TINY),
                 (14, 21)),
        ZooModel("clip_text", hf, _hf_clip("text"), (16, 18)),
        ZooModel("clip_vision", hf, _hf_clip("vision"), (17, 19)),
        ZooModel("whisper_encoder", hf, _hf_whisper("encoder"), (15, 20)),
        ZooModel("whisper_decoder", hf, _hf_whisper("decoder"), (16, 21)),
        ZooModel("llama", hf, _hf_decoder("LlamaForCausalLM", "LlamaConfig"), (14, 18)),
        ZooModel("mistral", hf, _hf_decoder("MistralForCausalLM", "MistralConfig"), (15, 19)),
        ZooModel("qwen2", hf, _hf_decoder("Qwen2ForCausalLM", "Qwen2Config"), (17, 20)),
        ZooModel("lstm", nn_, lambda: _rnn("lstm"), (13, 18)),
        ZooModel("gru", nn_, lambda: _rnn("gru"), (14, 21)),
        ZooModel("multihead_attention", nn_, _mha, (15, 19)),
        ZooModel("conv1d_audio", nn_, _audio, (13, 20)),
    ]


ZOO: dict[str, ZooModel] = {m.name: m for m in _zoo()}


# ---------------------------------------------------------------------------------------------
# Export, import, compare


def _versions() -> str:
    parts = []
    for dist in ("torch", "torchvision", "transformers", "onnxscript"):
        try:
            parts.append(f"{dist}-{importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            parts.append(f"{dist}-none")
    return "_".join(parts)


# Read at import: the builders in memory are the ones this content describes.
_SOURCE_DIGEST = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]


def cache_dir(root: Path) -> Path:
    """Exports are deterministic (fixed seeds): key the folder by the exporters' versions and this file."""
    return root / f"{_versions()}_{_SOURCE_DIGEST}"


_BUILT: dict[str, Built] = {}


def built(name: str) -> Built:
    if name not in _BUILT:
        _BUILT[name] = ZOO[name].build()
    return _BUILT[name]


def export(name: str, exporter: str, dynamic: bool, root: Path, batch: int = EXPORT_BATCH) -> Path:
    """Export ``name`` once (file cached under ``cache_dir(root)``); returns the .onnx path.

    ``batch``: the example batch (a static file is fixed to it; bench/onnx_zoo.py exports 1 and 8)."""
    import torch

    model = ZOO[name]
    opset = model.opsets[EXPORTERS.index(exporter)]
    folder = cache_dir(root)
    at = "" if batch == EXPORT_BATCH else f"-batch{batch}"
    path = folder / f"{name}-{exporter}-{'dynamic' if dynamic else 'static'}-opset{opset}{at}.onnx"
    if path.exists():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    b = built(name)
    example = b.inputs(batch, False)
    kw: dict[str, Any] = {"input_names": list(b.input_names), "output_names": list(b.output_names),
                          "opset_version": opset}
    if exporter == "dynamo":
        kw.update(external_data=False, verbose=False)
        if dynamic and b.dynamic:
            dims: dict[str, Any] = {}
            kw["dynamic_shapes"] = {
                n: {ax: dims.setdefault(s, torch.export.Dim(s, min=1 if s == "batch" else 2))
                    for ax, s in b.dynamic.get(n, {}).items()} for n in b.input_names}
            specs = [kw["dynamic_shapes"][n] for n in b.input_names]
            kw["dynamic_shapes"] = _shapes_by_argument(b.module, specs)
    elif dynamic and b.dynamic:
        kw["dynamic_axes"] = {n: dict(a) for n, a in b.dynamic.items()}
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    # Not under torch.no_grad(): there nn.MultiheadAttention takes its fused fast path
    # (aten::_native_multi_head_attention), which the TorchScript exporter cannot write.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(b.module, example, str(tmp), dynamo=exporter == "dynamo", **kw)
    os.replace(tmp, path)  # a killed export never leaves a half-written file under the final name
    return path


def _shapes_by_argument(module: Any, specs: list[Any]) -> tuple[Any, ...]:
    # torch.export matches dynamic_shapes to forward's signature: the inputs a *args takes form one tuple.
    import inspect

    params = list(inspect.signature(module.forward).parameters.values())
    fixed = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return (*specs[:len(fixed)], tuple(specs[len(fixed):]))
    return tuple(specs)


def feeds(name: str, batch: int, alt: bool = False) -> dict[str, np.ndarray]:
    b = built(name)
    return {n: t.numpy() for n, t in zip(b.input_names, b.inputs(batch, alt), strict=True)}


def check_feeds(name: str, dynamic: bool) -> list[dict[str, np.ndarray]]:
    """The export shape; a dynamic file also runs another batch (and sequence length where dynamic)."""
    out = [feeds(name, EXPORT_BATCH)]
    if dynamic and built(name).dynamic:
        out.append(feeds(name, 3, alt=True))
    return out


def ort_session(path: Path) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def max_rel_error(got: np.ndarray, ref: np.ndarray) -> float:
    """max |got - ref| / max |ref| (0 for exact ints); inf on a shape or integer mismatch."""
    if got.shape != ref.shape:
        return float("inf")
    if ref.dtype.kind in "iub":
        return 0.0 if np.array_equal(got, ref) else float("inf")
    if not ref.size:
        return 0.0
    scale = max(float(np.abs(ref).max()), 1e-6)
    return float(np.abs(got.astype(np.float64) - ref.astype(np.float64)).max()) / scale


def compare(path: Path, feed_list: Sequence[dict[str, np.ndarray]], *, staged_ok: bool = False,
            specialised_because: str | None = None) -> float:
    """Import ``path``, compile on rlx-cpu, run every feed; the worst relative error vs ONNX Runtime.

    ``staged_ok``: the model may need staged execution (data-dependent shapes: NMS's NonZero); any other
    model must import as one RLX graph, so a regression of the symbolic-shape importer cannot hide behind
    the staged path's per-shape re-import. ``specialised_because``: the model may be shape-specialised
    (imported again per input-shape signature) for exactly this reason (a regex on ``describe()``) and
    nothing else."""
    from rlx_core.frontends.onnx_staged import load_onnx_model

    model = load_onnx_model(path, device="cpu")
    if model.staged and not staged_ok:
        text = model.describe()
        lines = [ln for ln in text.splitlines()[1:] if ln.strip()]
        if not (specialised_because and len(lines) == 1 and "shape-specialised" in lines[0]
                and re.search(specialised_because, lines[0])):
            raise AssertionError(f"{path.name} needed staged execution:\n{text}")
    sess = ort_session(path)
    worst = 0.0
    for f in feed_list:
        refs = sess.run(None, f)
        outs = model.run(f)
        if staged_ok:
            on_host = [o for o, where in model.last_origins.items() if where != "backend"]
            assert not on_host, f"{path.name}: output(s) {on_host} computed on the host, not by rlx-cpu"
        for out_name, ref in zip(model.output_names, refs, strict=True):
            if ref.dtype.kind == "f" and ref.size and not np.abs(ref).max() > 0:
                # a zero-initialised layer (torchvision's ViT head) would make any importer look right
                raise AssertionError(f"{path.name}: output {out_name!r} is all zeros; seed that layer")
            worst = max(worst, max_rel_error(np.asarray(outs[out_name]), ref))
    return worst
