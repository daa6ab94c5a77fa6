"""``rlx export MODEL --target oneapi -o DIR``: a model as OpenVINO IR, the model rlx-oneapi compiles.

The graph is dispatched and lowered for ``oneapi:0`` exactly as :class:`rlx_core.Session` does
before compiling (same claims, decompositions and rewrites; no other device), and the LIR program
becomes the OpenVINO model of :func:`rlx_oneapi.translate.build_model`. The directory holds:

* ``model.xml`` + ``model.bin``: that model saved by ``openvino.save_model`` with f32 weights
  (``compress_to_fp16=False``: the default would halve them);
* ``manifest.json``: per input and output its position, the generated IR name, the model's own name,
  RLX dtype, OpenVINO element type and shape; the RLX, rlx-oneapi and OpenVINO versions; the symbol
  bindings; and the compile configuration that keeps OpenVINO's CPU plugin in f32.

Names from the model file never reach the IR: parameters and results are named ``input_N`` and
``output_N`` (the translation itself names nothing); the model's names live in the manifest only,
where ``json`` escapes them. Nodes that rlx-oneapi does not claim are refused by the dispatcher
(:class:`rlx_core.plugin.DispatchError`, naming each node and op): nothing falls back to rlx-cpu.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlx_core.plugin import DType, Program

from . import __version__

#: What the exported model's files are called inside the output directory.
XML, BIN, MANIFEST = "model.xml", "model.bin", "manifest.json"


def lower_graph(graph: Any, bindings: Mapping[str, int] | None = None) -> Program:
    """Dispatch and lower ``graph`` for ``oneapi:0`` alone; symbols not in ``bindings`` are 1."""
    from rlx_core.plugin import Session

    bind = {s: 1 for s in graph.symbols}
    bind.update(bindings or {})
    return Session("oneapi:0", use_cache=False, lower_only=True).lower(graph, bind)


def _name_io(model: Any, program: Program) -> tuple[list[str], list[str]]:
    """Give the model's parameters, results and their tensors generated names (replacing
    OpenVINO's own); returns the input and output names in order."""
    ins = [f"input_{i}" for i in range(len(program.inputs))]
    outs = [f"output_{i}" for i in range(len(program.outputs))]
    # A Result's tensor names are its own (two Results of one value keep theirs apart); the
    # parameters are named last so an input's name survives a Result reading it directly.
    for r, port, name in zip(model.get_results(), model.outputs, outs):
        r.set_friendly_name(name)
        port.get_tensor().set_names({name})
    for p, name in zip(model.get_parameters(), ins):
        p.set_friendly_name(name)
        p.output(0).get_tensor().set_names({name})
    return ins, outs


def export_graph(graph: Any, out_dir: str | Path, *,
                 bindings: Mapping[str, int] | None = None) -> dict[str, Any]:
    """Write ``model.xml``, ``model.bin`` and ``manifest.json`` for ``graph`` into ``out_dir``;
    returns a summary (files, counts, versions)."""
    import openvino as ov

    import rlx_core

    from .runtime import compile_config
    from .translate import OV_TYPES, build_model

    program = lower_graph(graph, bindings)
    g = program.graph
    model, kernels = build_model(program)
    ins, outs = _name_io(model, program)

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ov.save_model(model, str(out / XML), compress_to_fp16=False)

    def row(i: int, ir_name: str, rlx_name: str, value: str) -> dict[str, Any]:
        t = g.types[value]
        dt: DType = t.dtype
        return {"index": i, "name": ir_name, "rlx_name": rlx_name, "dtype": dt.value,
                "element_type": OV_TYPES[dt].get_type_name(), "shape": [int(d) for d in t.shape]}

    bind = {s: 1 for s in graph.symbols}
    bind.update(bindings or {})
    manifest = {
        "format": "openvino-ir", "xml": XML, "bin": BIN, "graph": graph.name,
        "rlx": rlx_core.__version__, "rlx_oneapi": __version__, "openvino": ov.__version__,
        "precision": "f32", "bindings": {k: int(v) for k, v in sorted(bind.items())},
        # OpenVINO's CPU plugin defaults to bf16 on AVX512-BF16/AMX CPUs: compile with these (the
        # thread cap of RLX_ONEAPI_THREADS belongs to this machine, not to the artifact).
        "compile_config": {k: v for k, v in compile_config("CPU").items() if k != "INFERENCE_NUM_THREADS"},
        "inputs": [row(i, n, v.name, v.name) for i, (n, v) in enumerate(zip(ins, program.inputs))],
        "outputs": [row(i, n, pub, v) for i, (n, (pub, v)) in enumerate(zip(outs, program.outputs))],
        "kernels": len(kernels),
    }
    # ensure_ascii: a model's names may hold control or bidi characters; they stay \u-escaped.
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1, ensure_ascii=True) + "\n")
    return {"dir": str(out), "files": [XML, BIN, MANIFEST], "inputs": len(ins), "outputs": len(outs),
            "kernels": len(kernels), "openvino": ov.__version__,
            "verdict": "OpenVINO IR written (f32 weights; not executed)"}
