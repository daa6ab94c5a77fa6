"""The ``.rlx`` model file: one safetensors file holding a graph's weights, with the graph in its metadata.

Version 1 layout (see docs/FORMAT.md): the tensors are the parameters (name -> array) and
``__metadata__`` is ``{"format": "rlx", "schema_version": "1", "rlx_core_version": ..., "graph": <JSON>}``
where the graph JSON is :meth:`Graph.structure` in compact, key-sorted form.

:func:`load` is the strict validator: every problem is a :class:`SerializationError` that says which
node (index and name) and which field is wrong, and how to fix it. Because the container is plain
safetensors, any safetensors tool can inspect the weights of an ``.rlx`` file.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

from .. import __version__
from ..errors import SerializationError
from ..formats.safetensors import PathLike, _loads_strict, read_safetensors, write_safetensors
from .graph import Graph
from .structure import _RESAVE, _UPGRADE, decode_structure, dumps_structure

__all__ = ["FORMAT", "SCHEMA_VERSION", "SUPPORTED_SCHEMA_VERSIONS", "dumps_structure", "graph_from_structure",
           "load", "save"]

FORMAT = "rlx"
#: The graph-JSON schema this code writes. Readers refuse newer versions (see the versioning policy).
SCHEMA_VERSION = 1
SUPPORTED_SCHEMA_VERSIONS = frozenset({1})



# ---------------------------------------------------------------------------------------------
# Writing

def save(graph: Graph, path: PathLike) -> None:
    """Write ``graph`` and its weights to ``path`` atomically (a reader never sees a partial file)."""
    if not isinstance(graph, Graph):
        raise SerializationError(f"save() needs a Graph, got {type(graph).__name__}",
                                 where=f"file {os.fspath(path)}",
                                 fix="pass the result of GraphBuilder.build()")
    metadata = {"format": FORMAT, "schema_version": str(SCHEMA_VERSION), "rlx_core_version": __version__,
                "graph": dumps_structure(graph)}
    write_safetensors(path, {p.name: graph.weights[p.name] for p in graph.params}, metadata)


# ---------------------------------------------------------------------------------------------
# Reading

def load(path: PathLike, *, require_signature: Any = None, signature: PathLike | None = None) -> Graph:
    """Read and fully validate an ``.rlx`` file. Weights are read-only, zero-copy views of a memory map.

    ``require_signature``: a public key (path, PEM/OpenSSH bytes, or Ed25519PublicKey). The file must
    then carry a valid detached signature by that key (``signature``, default ``path + ".sig"``); it is
    checked before anything is parsed, else :class:`~rlx_core.errors.SignatureError` (see
    :mod:`rlx_core.signing`).
    """
    if signature is not None and require_signature is None:
        raise SerializationError("a signature file was given without the key to check it with",
                                 where=f"file {os.fspath(path)}",
                                 fix="pass require_signature=PUBLIC_KEY as well")
    if require_signature is not None:
        from ..signing import load_signed

        return load_signed(path, require_signature, signature, load)
    tensors, meta = read_safetensors(path, mmap=True)
    where = f"file {os.fspath(path)}"
    fmt = meta.get("format")
    if fmt is None:
        raise SerializationError("this is a plain safetensors file, not an RLX model: its metadata has no "
                                 "'format' key", where=where,
                                 fix="read bare weights with rlx_core.formats.safetensors.read_safetensors; "
                                     "write models with rlx_core.save(graph, path)")
    if fmt != FORMAT:
        raise SerializationError(f"metadata 'format' is {fmt!r}, not {FORMAT!r}: this is not an RLX model",
                                 where=f"{where}, metadata 'format'",
                                 fix="convert the checkpoint to an RLX graph first (build it with "
                                     "GraphBuilder and rlx_core.save it)")
    written_by = meta.get("rlx_core_version", "an unknown version")
    version = meta.get("schema_version")
    # Bounded length: int() of a many-thousand-digit string raises ValueError in CPython.
    if version is None or not re.fullmatch(r"[0-9]{1,9}", version):
        raise SerializationError(f"metadata 'schema_version' is {version!r}, not a version number",
                                 where=f"{where}, metadata 'schema_version'", fix=_RESAVE)
    if int(version) not in SUPPORTED_SCHEMA_VERSIONS:
        newer = int(version) > max(SUPPORTED_SCHEMA_VERSIONS)
        raise SerializationError(
            f"schema version {version} (written by rlx-core {written_by}) is "
            f"{'newer than' if newer else 'not one of'} the versions this rlx-core {__version__} reads "
            f"({', '.join(map(str, sorted(SUPPORTED_SCHEMA_VERSIONS)))})",
            where=f"{where}, metadata 'schema_version'", fix=_UPGRADE if newer else _RESAVE)
    text = meta.get("graph")
    if text is None:
        raise SerializationError("metadata has no 'graph' key", where=f"{where}, metadata", fix=_RESAVE)
    try:
        structure = _loads_strict(text)
    except json.JSONDecodeError as e:
        raise SerializationError(f"the graph is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}",
                                 where=f"{where}, metadata 'graph'", fix=_RESAVE) from None
    except (ValueError, RecursionError) as e:
        raise SerializationError(f"the graph is not valid JSON: {e}", where=f"{where}, metadata 'graph'",
                                 fix=_RESAVE) from None
    return graph_from_structure(structure, tensors, source=os.fspath(path))


def _register_optional_ops(structure: Mapping[str, Any]) -> None:
    """Ops defined outside the IR package (fused kernels, quantization) register on import; a saved
    graph that uses them must load in a fresh process without the user importing anything."""
    nodes = structure.get("nodes") if isinstance(structure, Mapping) else None
    # Only strings: a hostile file's op may be a list or object (unhashable); the decoder names it.
    ops = ({op for n in nodes if isinstance(n, Mapping) and isinstance(op := n.get("op"), str)}
           if isinstance(nodes, list) else set())
    from .schema import REGISTRY

    missing = {o for o in ops if isinstance(o, str) and o not in REGISTRY}
    if not missing:
        return
    import importlib

    # The core's own op modules first (cheap), then the installed plugins' ``rlx_ops`` hooks,
    # loading plugins only until every op of the file is known.
    for module in ("rlx_core.fusion", "rlx_core.quant", "rlx_core.qat"):
        try:
            importlib.import_module(module)
        except ImportError:
            continue
    missing = {o for o in missing if o not in REGISTRY}
    if missing:
        from .._hub import hub as get_hub

        hub = get_hub()
        for name in hub.names():
            hub.try_load(name)  # a broken plugin is reported by `rlx doctor`, not here
            if all(o in REGISTRY for o in missing):
                break


def graph_from_structure(structure: Mapping[str, Any], weights: Mapping[str, Any], *,
                         source: str | None = None) -> Graph:
    """Rebuild a Graph from :meth:`Graph.structure` data and its weights, validating every field;
    ops the data names that are not registered yet are looked for first (core op modules, plugins).

    ``source`` (a file name) is only used in error messages.
    """
    _register_optional_ops(structure)
    return decode_structure(structure, weights, source=source)


