"""ONNX optional *tensor* values (issue 17): Optional, OptionalHasElement, OptionalGetElement.

RLX graphs carry tensors, so an optional is translated by its presence, which is known when the
graph is imported: a present optional is the tensor itself, an absent one (an omitted input name,
``""``) has no value. ``OptionalHasElement`` is then the constant True or False, ``OptionalGetElement``
of a present optional (or of a plain tensor) is that tensor, and of an absent one an error (ONNX
defines none). An empty ``Optional`` (no input) is refused: it has no tensor to stand for.

A graph input of type ``optional(tensor)`` is imported present (:func:`present_input`). The ONNX
backend adapter (:class:`~rlx_core.frontends.onnx_backend.PresenceRep`) keys on presence: fed None,
the input is empty and the model is prepared again without it (:func:`with_presence`), once per
presence signature. Elsewhere (``load_onnx``, staged execution) an optional input must be fed an
array; None is refused by the runtime's input check. Optionals holding sequences are
:mod:`~rlx_core.frontends.onnx_seq`'s; the handlers here pass any present value through unchanged.
The handlers register in :mod:`rlx_core.frontends.onnx`'s table (that module imports this one).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from . import onnx as _onnx
from .onnx import _Const, _handler, _Importer

# Up to opset 28 the three operators changed only by accepting more element types (each version
# lists the types of the previous one plus new ones); the translation does not look at the type.
_onnx._OP_REVIEWED.update({"Optional": 28, "OptionalHasElement": 28, "OptionalGetElement": 28})


def _present(ins: list) -> Any:
    return ins[0] if ins else None


@_handler("OptionalHasElement")
def _optional_has_element(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    return [_Const(np.asarray(_present(ins) is not None))]


@_handler("OptionalGetElement")
def _optional_get_element(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    v = _present(ins)
    if v is None:
        raise imp.unsupported("OptionalGetElement of an empty optional (ONNX defines no value for it)",
                              fix="guard it with OptionalHasElement and If, or pass the optional input")
    return [v]


@_handler("Optional")
def _optional(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    v = _present(ins)
    if v is None:
        raise imp.unsupported("an empty Optional (no input) has no tensor value, and RLX graphs carry "
                              "tensors only", fix="remove the empty optional from the exported model "
                                                  "(test OptionalHasElement on the producer instead)")
    return [v]


def present_input(vi: Any) -> Any:
    """A graph input of type ``optional(tensor)`` as its tensor (the import assumes it present; an
    empty one fed at run time is refused by :func:`check_feed`); any other input unchanged."""
    tp = vi.type
    if not (tp.HasField("optional_type") and tp.optional_type.elem_type.HasField("tensor_type")):
        return vi
    from onnx import ValueInfoProto

    out = ValueInfoProto()
    out.name = vi.name
    out.type.CopyFrom(tp.optional_type.elem_type)
    return out


def optional_tensor_inputs(proto: Any) -> list[str]:
    """The graph inputs of type ``optional(tensor)`` (fed an array, or None for an empty optional)."""
    inits = {t.name for t in proto.graph.initializer}
    return [vi.name for vi in proto.graph.input if vi.name not in inits and vi.type.HasField("optional_type")
            and vi.type.optional_type.elem_type.HasField("tensor_type")]


def with_presence(proto: Any, absent: Iterable[str]) -> Any:
    """A copy of ``proto`` in which the optional inputs ``absent`` are empty: removed from the graph
    inputs and every use of them (in subgraphs too) an omitted input ``""``, which is how ONNX writes
    an absent optional; the other optional tensor inputs become plain tensor inputs (present)."""
    from onnx import ModelProto

    gone = set(absent)
    m = ModelProto()
    m.CopyFrom(proto)
    keep = [present_input(vi) for vi in m.graph.input if vi.name not in gone]
    del m.graph.input[:]
    m.graph.input.extend(keep)

    def blank(graph: Any) -> None:
        for n in graph.node:
            for k, name in enumerate(n.input):
                if name in gone:
                    n.input[k] = ""
            for a in n.attribute:
                for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    blank(sub)

    blank(m.graph)
    return m
