"""ONNX's protobuf classes and the few helpers the importer needs on every model, without importing
the ``onnx`` package.

Why: ``import onnx`` loads its C++ extension and registers every operator schema (about 12 MB of
resident memory and a tenth of a second), although reading a model needs only the generated message
classes (2.5 MB). With protobuf's upb runtime the message classes are shared through the default
descriptor pool, so a ``ModelProto`` parsed here *is* an ``onnx.ModelProto`` once ``onnx`` is
imported too (checked: the classes are the same objects). Anything beyond the common cases (packed
4/2-bit, float8, bfloat16 and string tensors, operator schemas past the bundled table) still asks
``onnx`` itself, imported then.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

import numpy as np

from ..errors import SerializationError

_PB: list[ModuleType] = []

#: How to install what reading ONNX needs.
INSTALL_FIX = "install the ONNX package: pip install onnx"


def _standalone() -> ModuleType | None:
    """``onnx/onnx_ml_pb2.py`` executed on its own (not through ``onnx/__init__``), or None when the
    protobuf runtime would not share its classes with ``onnx``'s (only upb does)."""
    try:
        from google.protobuf.internal import api_implementation

        if api_implementation.Type() != "upb":
            return None
        spec = importlib.util.find_spec("onnx")  # finds the package without running it
    except (ImportError, ValueError):
        return None
    locs = list(spec.submodule_search_locations or []) if spec is not None else []
    path = next((os.path.join(d, "onnx_ml_pb2.py") for d in locs
                 if os.path.isfile(os.path.join(d, "onnx_ml_pb2.py"))), None)
    if path is None:
        return None
    mspec = importlib.util.spec_from_file_location("rlx_core.frontends._onnx_ml_pb2", path)
    if mspec is None or mspec.loader is None:
        return None
    mod = importlib.util.module_from_spec(mspec)
    try:
        mspec.loader.exec_module(mod)
    except Exception:  # an onnx whose generated code this protobuf cannot run: let onnx say why
        return None
    return mod


def pb() -> Any:
    """The module holding ``ModelProto``, ``TensorProto``, ``AttributeProto``... (``onnx``'s own when
    it is already imported)."""
    if "onnx" in sys.modules:
        return sys.modules["onnx"]
    if not _PB:
        mod = _standalone()
        if mod is None:
            try:
                import onnx
            except ImportError as e:
                raise SerializationError(f"reading ONNX models needs the onnx package ({e})",
                                         where="rlx_core.frontends.onnx", fix=INSTALL_FIX) from None
            mod = onnx
        _PB.append(mod)
    return _PB[0]


#: AttributeProto type name -> (the field holding the value, is it a repeated field).
_ATTR_FIELDS: dict[str, tuple[str, bool]] = {
    "FLOAT": ("f", False), "INT": ("i", False), "STRING": ("s", False), "TENSOR": ("t", False),
    "GRAPH": ("g", False), "SPARSE_TENSOR": ("sparse_tensor", False), "TYPE_PROTO": ("tp", False),
    "FLOATS": ("floats", True), "INTS": ("ints", True), "STRINGS": ("strings", True),
    "TENSORS": ("tensors", True), "GRAPHS": ("graphs", True), "SPARSE_TENSORS": ("sparse_tensors", True),
    "TYPE_PROTOS": ("type_protos", True)}
_BY_CODE: dict[int, tuple[str, bool]] = {}


def attribute_value(a: Any) -> Any:
    """``onnx.helper.get_attribute_value`` (the same values; the caller refuses references)."""
    if not _BY_CODE:
        kinds = pb().AttributeProto.AttributeType
        _BY_CODE.update({int(kinds.Value(k)): v for k, v in _ATTR_FIELDS.items()})
    field = _BY_CODE.get(int(a.type))
    if field is None:
        if a.type == pb().AttributeProto.UNDEFINED:
            return None
        raise ValueError(f"Unsupported ONNX attribute type {a.type} (attribute {a.name!r})")
    v = getattr(a, field[0])
    return list(v) if field[1] else v


#: ONNX element types read here: code -> little-endian NumPy dtype of raw_data.
#: (ONNX's wire codes, as rlx_core.frontends.onnx._ONNX_TO_DTYPE keys them.)
RAW_DTYPES: dict[int, str] = {1: "<f4", 2: "u1", 3: "i1", 4: "<u2", 5: "<i2", 6: "<i4", 7: "<i8", 9: "?",
                              10: "<f2", 11: "<f8", 12: "<u4", 13: "<u8"}
#: Element types whose typed field holds the values themselves: code -> (field, dtype).
_TYPED: dict[int, tuple[str, str]] = {1: ("float_data", "float32"), 6: ("int32_data", "int32"),
                                      7: ("int64_data", "int64"), 11: ("double_data", "float64")}


def tensor_array(t: Any) -> np.ndarray:
    """``onnx.numpy_helper.to_array`` for a tensor whose data is in the proto (no external data):
    plain numbers here, every other type by ``numpy_helper`` itself. Raises ValueError (like
    numpy_helper) when the data does not fill the dims."""
    code = int(t.data_type)
    dims = tuple(int(d) for d in t.dims)
    if not t.HasField("segment"):
        if code in RAW_DTYPES and t.HasField("raw_data"):
            arr = np.frombuffer(t.raw_data, dtype=np.dtype(RAW_DTYPES[code])).reshape(dims)
            return arr if arr.dtype.isnative else arr.astype(arr.dtype.newbyteorder("="))
        if code in _TYPED and not t.HasField("raw_data"):
            field, dt = _TYPED[code]
            return np.asarray(getattr(t, field), dtype=dt).reshape(dims)
    from onnx import numpy_helper

    return np.asarray(numpy_helper.to_array(t))
