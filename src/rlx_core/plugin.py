"""The public plugin API of RLX: everything a backend plugin, an exporter or a plugin's tests may use.

A plugin imports from here (and from the ``rlx_core`` top level) only; every other ``rlx_core``
module is private and may change in any release. CI enforces it: the import contract in
``pyproject.toml`` (``[tool.importlinter]``) and ``tests/test_import_contract.py`` fail on a plugin,
``rlx_conformance`` or a scaffold template that imports a private module, and on one plugin
importing another.

Versioning promise: the names in ``__all__`` keep their meaning and signature for as long as
:data:`PLUGIN_API_VERSION`'s major stays the same. Adding a name or an optional argument raises the
minor; removing or changing one raises the major, and the hub refuses a plugin whose
``BackendInfo.api_version`` has another major (with a message naming both versions). A plugin
declares the version it was written against with ``api_version=PLUGIN_API_VERSION``.
Names marked *provisional* below are public but may still move within a major (each says why).

What is here, by role:

* hooks and records: ``hookimpl``; ``BackendInfo``, ``DeviceInfo``, ``DeviceCaps``, ``KernelClaim``,
  ``NodeVariant``, ``Decomposition``, ``Rewrite``, ``CompiledProgram`` (what ``rlx_compile`` returns),
  ``BufferBinding`` (the optional capability of a compiled program that resident training needs),
  ``ExporterInfo`` (an ``rlx export`` target, hook ``rlx_exporters``); ``FusionRule`` and ``Region``
  (patterns proposing regions a backend claims, hook ``rlx_fusion_rules``; since 1.1);
* IR: ``Graph``, ``Node``, ``Value``, ``GraphBuilder``, ``Tensor``, ``TensorType``, ``Dim``,
  ``Attrs``, ``DType``, ``OpSchema``, ``AttrSpec``, ``REQUIRED`` (an attribute's default when it has
  none), ``REGISTRY``, ``register_op``, ``get_op``, ``HIR_OPS`` (the core's HIR ops),
  ``broadcast_shapes``, ``normalize_axis``, ``slice_params``, ``masked_score``, ``MASK_KINDS``
  (attention's mask kinds), ``evaluate`` (the float64 reference), ``to_reference`` (an array in the
  reference's precision), ``device_error`` (the error a kernel raises for an index out of range);
* LIR: ``Program``, ``Step``, ``Transfer``, ``BufferPlan``, ``lower``; ``Access`` (a step's typed
  read/write sets: ``Step.reads``/``writes``) and ``conflicts`` (RAW/WAR/WAW between two steps);
* errors: ``RLXError`` and its subclasses;
* settings: ``declare_setting`` (``rlx_core.settings.declare``), ``Setting``, ``SettingError``: a
  plugin's ``RLX_*`` variables, declared once and returned from the ``rlx_settings`` hook;
* the on-disk cache: ``cache_subdir``, ``read_entry``, ``write_entry``, ``publish_file``,
  ``seal_file``, ``verify_file``, ``read_sealed``, ``seal_tree``, ``verify_tree``, ``source_stamp``;
* memory: ``release_file_pages`` (a memory-mapped weight's pages out of the RSS once packed),
  ``release_library_pages`` (a big shared library's code pages, touched once by its loader);
* code generation: ``identifier``, ``Namer``, ``safe_comment``, ``comment``, ``string_literal``,
  ``js_value`` (names from model files made safe in generated source); ``Dialect``, ``DIALECTS``,
  ``render_op``, ``render_program``, ``NUMBA_PRELUDE`` (the C-style renderer);
  ``FUSED``, ``FUSIBLE``, ``encode_fused``, ``decode_fused`` (a ``fused_elementwise`` node's program);
* the device kit (:mod:`rlx_core.devicekit`, for code-generating device backends):
  ``render_check``, ``check_ops``, ``renders``, ``dtypes_in``, ``all_of``, ``single_op_program``,
  ``program_of``, ``elementwise_claims``, ``fused_claim`` (claims); ``Compiler``, ``tool_version``
  (cached builds); ``Launch``, ``Allocator``, ``HostAllocator``, ``Runtime``, ``KitProgram``,
  ``Replay``, ``CtypesRuntime`` (running); ``cstyle`` (the C-style kernel library: templates and
  ``cstyle.launches`` lowering LIR steps, for any ``KernelDialect``), ``KERNEL_DIALECTS`` (Metal,
  OpenCL; since 1.1); ``glsl`` (the GLSL compute-shader library: templates, ``glsl.GlslProgram``
  lowering LIR steps to dispatches, ``glsl.claims``, for any ``GlslFlavour``), ``GLSL_FLAVOURS``
  (Vulkan, OpenGL; since 1.1); ``hlsl`` (the HLSL compute-shader library: ``hlsl.HlslProgram``,
  ``hlsl.claims``, ``hlsl.translate``); ``vulkan`` (the Vulkan runtime: context, buffers, SPIR-V pipelines,
  command-buffer record + replay, ``vulkan.SpirvCompiler``);
* linear algebra: ``linalg`` (the CSR/solver/factorization ops' shared definitions: ``csr_rows``,
  ``sign_fix``, ``lu_reference``, ``cg_reference`` ..., so kernels follow the references' conventions);
* quantized ops: ``register_quant_ops``, ``quantize_graph``, ``softmax_lut``, ``pool_geometry``;
* exporters (``rlx export --target T``): ``export_options``, ``echo_json``, ``parse_pairs``,
  ``parse_bindings``, ``check_bindings``, ``load_model``, ``load_command_model``;
* running: ``Session``, ``Executable``, ``Hub``, ``Backend``, ``parse_device`` (the conformance case
  generators and model graphs are ``rlx_conformance``'s API: a plugin's tests import them from there);
* provisional demo models, to leave the core with issue 15 step 4 (demos out of the core import
  path): ``MiniLM``, ``split_digits``, ``train_mlp``, ``train_cnn``.

``import rlx_core.plugin`` is cheap: each name is imported from its home on first use, so a plugin
that uses only records and ``hookimpl`` never loads the IR or NumPy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import API_VERSION
from ._lazy import lazy as _lazy

#: The version of this module's promise; the same value the hub compares a plugin's
#: ``BackendInfo.api_version`` with (only the major must match).
PLUGIN_API_VERSION: str = API_VERSION

# Where each public name lives today (its home may move; only this table follows). A value
# "module:attr" imports ``attr`` under another public name.
_LAZY: dict[str, str] = {
    # hooks and records
    "hookimpl": "rlx_core.hookspecs",
    "BackendInfo": "rlx_core.records",
    "DeviceInfo": "rlx_core.records",
    "DeviceCaps": "rlx_core.records",
    "KernelClaim": "rlx_core.records",
    "NodeVariant": "rlx_core.records",
    "Decomposition": "rlx_core.records",
    "Rewrite": "rlx_core.records",
    "CompiledProgram": "rlx_core.records",
    "BufferBinding": "rlx_core.records",
    "ExporterInfo": "rlx_core.records",
    "FusionRule": "rlx_core.records",
    "Region": "rlx_core.records",
    # IR
    "DType": "rlx_core.dtypes",
    "Graph": "rlx_core.ir.graph",
    "Node": "rlx_core.ir.graph",
    "Value": "rlx_core.ir.graph",
    "GraphBuilder": "rlx_core.ir.builder",
    "Tensor": "rlx_core.ir.builder",
    "TensorType": "rlx_core.ir.types",
    "Dim": "rlx_core.ir.types",
    "Attrs": "rlx_core.ir.types",
    "broadcast_shapes": "rlx_core.ir.types",
    "normalize_axis": "rlx_core.ir.types",
    "OpSchema": "rlx_core.ir.schema",
    "AttrSpec": "rlx_core.ir.schema",
    "REQUIRED": "rlx_core.ir.schema",
    "REGISTRY": "rlx_core.ir.schema",
    "register_op": "rlx_core.ir.schema",
    "get_op": "rlx_core.ir.schema",
    "slice_params": "rlx_core.ir.mir",
    "masked_score": "rlx_core.ir.hir",
    "MASK_KINDS": "rlx_core.ir.hir",
    "HIR_OPS": "rlx_core.ir.hir",
    "device_error": "rlx_core.ir.indices",
    "evaluate": "rlx_core.ir.reference",
    "to_reference": "rlx_core.ir.reference",
    # LIR
    "Program": "rlx_core.lir",
    "Step": "rlx_core.lir",
    "Transfer": "rlx_core.lir",
    "BufferPlan": "rlx_core.lir",
    "lower": "rlx_core.lir",
    "Access": "rlx_core.lir",
    "conflicts": "rlx_core.lir",
    # errors
    "RLXError": "rlx_core.errors",
    "IRError": "rlx_core.errors",
    "ShapeError": "rlx_core.errors",
    "DTypeError": "rlx_core.errors",
    "SerializationError": "rlx_core.errors",
    "SignatureError": "rlx_core.errors",
    "PluginError": "rlx_core.errors",
    "PluginConflictError": "rlx_core.errors",
    "BackendNotFoundError": "rlx_core.errors",
    "DispatchError": "rlx_core.errors",
    "InputError": "rlx_core.errors",
    "CalibrationError": "rlx_core.errors",
    "CapabilityError": "rlx_core.errors",
    # settings
    "Setting": "rlx_core.settings",
    "SettingError": "rlx_core.errors",
    "declare_setting": "rlx_core.settings:declare",
    # the on-disk cache
    "cache_subdir": "rlx_core.cache",
    "read_entry": "rlx_core.cache",
    "write_entry": "rlx_core.cache",
    "publish_file": "rlx_core.cache",
    "seal_file": "rlx_core.cache",
    "verify_file": "rlx_core.cache",
    "read_sealed": "rlx_core.cache",
    "seal_tree": "rlx_core.cache",
    "verify_tree": "rlx_core.cache",
    "source_stamp": "rlx_core.cache",
    # code generation
    "identifier": "rlx_core.codegen.names",
    "Namer": "rlx_core.codegen.names",
    "safe_comment": "rlx_core.codegen.names",
    "comment": "rlx_core.codegen.names",
    "string_literal": "rlx_core.codegen.names",
    "js_value": "rlx_core.codegen.names",
    "Dialect": "rlx_core.codegen.render",
    "DIALECTS": "rlx_core.codegen.render",
    "render_op": "rlx_core.codegen.render",
    "render_program": "rlx_core.codegen.render",
    "NUMBA_PRELUDE": "rlx_core.codegen.render",
    "FUSED": "rlx_core.fusion",
    "FUSIBLE": "rlx_core.fusion",
    "encode_fused": "rlx_core.fusion:encode",
    "decode_fused": "rlx_core.fusion:decode",
    # the device kit (code-generating device backends)
    "cstyle": "rlx_core.devicekit.cstyle:",
    "KernelDialect": "rlx_core.devicekit.cstyle",
    "KERNEL_DIALECTS": "rlx_core.devicekit.cstyle",
    "glsl": "rlx_core.devicekit.glsl:",
    "GlslFlavour": "rlx_core.devicekit.glsl",
    "GLSL_FLAVOURS": "rlx_core.devicekit.glsl",
    "hlsl": "rlx_core.devicekit.hlsl:",
    "vulkan": "rlx_core.devicekit.vulkan:",
    "single_op_program": "rlx_core.devicekit",
    "program_of": "rlx_core.devicekit",
    "render_check": "rlx_core.devicekit",
    "check_ops": "rlx_core.devicekit",
    "renders": "rlx_core.devicekit",
    "dtypes_in": "rlx_core.devicekit",
    "all_of": "rlx_core.devicekit",
    "elementwise_claims": "rlx_core.devicekit",
    "fused_claim": "rlx_core.devicekit",
    "Compiler": "rlx_core.devicekit",
    "tool_version": "rlx_core.devicekit",
    "Launch": "rlx_core.devicekit",
    "Allocator": "rlx_core.devicekit",
    "HostAllocator": "rlx_core.devicekit",
    "CtypesRuntime": "rlx_core.devicekit",
    "Runtime": "rlx_core.devicekit",
    "KitProgram": "rlx_core.devicekit",
    "Replay": "rlx_core.devicekit",
    # linear algebra (the op family module: CSR helpers and the factorizations' conventions)
    "linalg": "rlx_core.ir.ops.linalg:",
    # quantized ops
    "quantize_graph": "rlx_core.quant",
    "softmax_lut": "rlx_core.quant.fixedpoint",
    "pool_geometry": "rlx_core.quant.ops",
    # exporters
    "export_options": "rlx_core.cliutil",
    "echo_json": "rlx_core.cliutil",
    "parse_pairs": "rlx_core.cliutil",
    "parse_bindings": "rlx_core.cliutil",
    "check_bindings": "rlx_core.cliutil",
    "load_model": "rlx_core.cliutil",
    "load_command_model": "rlx_core.cliutil",
    # running
    "Session": "rlx_core.runtime",
    "Executable": "rlx_core.runtime",
    "Hub": "rlx_core._hub",
    "Backend": "rlx_core._hub",
    "parse_device": "rlx_core._hub",
    # provisional demo models
    "MiniLM": "rlx_core.models.minilm",
    # collectives (issue 22): the process group collective kernels talk through
    "collective_world": "rlx_core.distributed.runtime:world",
    "CollectiveError": "rlx_core.errors",
    "run_world_conformance": "rlx_core.distributed.conformance:run_world",
    "split_digits": "rlx_core.quant.examples",
    "release_file_pages": "rlx_core.pages",
    "release_library_pages": "rlx_core.pages",
    "train_mlp": "rlx_core.quant.examples",
    "train_cnn": "rlx_core.quant.examples",
}

# Literal, so a type checker and ruff see each re-export; tests check it matches _LAZY.
__all__ = [
    "PLUGIN_API_VERSION", "API_VERSION", "register_quant_ops", "hookimpl", "BackendInfo", "DeviceInfo",
    "DeviceCaps", "KernelClaim", "NodeVariant", "Decomposition", "Rewrite", "CompiledProgram", "DType",
    "ExporterInfo", "Access", "conflicts",
    "Graph", "Node", "Value", "GraphBuilder", "Tensor", "TensorType", "Dim", "Attrs",
    "broadcast_shapes", "normalize_axis", "OpSchema", "AttrSpec", "REGISTRY", "register_op", "get_op",
    "slice_params", "masked_score", "device_error", "evaluate", "Program", "Step", "Transfer",
    "BufferPlan", "lower", "RLXError", "IRError", "ShapeError", "DTypeError", "SerializationError",
    "SignatureError", "PluginError", "PluginConflictError", "BackendNotFoundError", "DispatchError",
    "InputError", "CalibrationError", "SettingError", "Setting", "declare_setting", "cache_subdir",
    "read_entry", "write_entry", "publish_file", "seal_file", "verify_file", "read_sealed", "seal_tree",
    "release_file_pages", "release_library_pages",
    "verify_tree", "source_stamp", "identifier", "Namer", "safe_comment", "comment", "string_literal",
    "js_value", "Dialect", "DIALECTS", "render_op", "render_program", "NUMBA_PRELUDE", "FUSED",
    "FUSIBLE", "encode_fused", "decode_fused", "quantize_graph", "softmax_lut", "pool_geometry",
    "export_options", "echo_json", "parse_pairs", "parse_bindings", "check_bindings", "load_model",
    "load_command_model", "Session", "Executable", "Hub", "Backend", "parse_device",
    "collective_world", "CollectiveError", "run_world_conformance",
    "REQUIRED", "HIR_OPS", "MASK_KINDS", "to_reference", "MiniLM", "split_digits", "train_mlp", "train_cnn",
    "single_op_program", "program_of", "render_check", "check_ops", "renders", "dtypes_in", "all_of",
    "elementwise_claims", "fused_claim", "Compiler", "tool_version", "Launch", "Allocator",
    "HostAllocator", "Runtime", "KitProgram", "Replay", "CtypesRuntime",
    "BufferBinding", "CapabilityError", "FusionRule", "Region", "cstyle", "KernelDialect", "KERNEL_DIALECTS",
    "glsl", "GlslFlavour", "GLSL_FLAVOURS", "hlsl", "vulkan", "linalg",
]

if TYPE_CHECKING:  # what a type checker and an editor see; at run time __getattr__ imports lazily
    from rlx_core._hub import Backend, Hub, parse_device
    from rlx_core.cache import (
        cache_subdir,
        publish_file,
        read_entry,
        read_sealed,
        seal_file,
        seal_tree,
        source_stamp,
        verify_file,
        verify_tree,
        write_entry,
    )
    from rlx_core.cliutil import (
        check_bindings,
        echo_json,
        export_options,
        load_command_model,
        load_model,
        parse_bindings,
        parse_pairs,
    )
    from rlx_core.codegen.names import Namer, comment, identifier, js_value, safe_comment, string_literal
    from rlx_core.codegen.render import DIALECTS, NUMBA_PRELUDE, Dialect, render_op, render_program
    from rlx_core.devicekit import (
        Allocator,
        Compiler,
        CtypesRuntime,
        HostAllocator,
        KitProgram,
        Launch,
        Replay,
        Runtime,
        all_of,
        check_ops,
        cstyle,
        dtypes_in,
        elementwise_claims,
        fused_claim,
        glsl,
        hlsl,
        program_of,
        render_check,
        renders,
        single_op_program,
        tool_version,
        vulkan,
    )
    from rlx_core.devicekit.cstyle import KERNEL_DIALECTS, KernelDialect
    from rlx_core.devicekit.glsl import GLSL_FLAVOURS, GlslFlavour
    from rlx_core.distributed.conformance import run_world as run_world_conformance
    from rlx_core.distributed.runtime import world as collective_world
    from rlx_core.dtypes import DType
    from rlx_core.errors import (
        BackendNotFoundError,
        CalibrationError,
        CapabilityError,
        CollectiveError,
        DispatchError,
        DTypeError,
        InputError,
        IRError,
        PluginConflictError,
        PluginError,
        RLXError,
        SerializationError,
        SettingError,
        ShapeError,
        SignatureError,
    )
    from rlx_core.fusion import FUSED, FUSIBLE
    from rlx_core.fusion import decode as decode_fused
    from rlx_core.fusion import encode as encode_fused
    from rlx_core.hookspecs import hookimpl
    from rlx_core.ir.builder import GraphBuilder, Tensor
    from rlx_core.ir.graph import Graph, Node, Value
    from rlx_core.ir.hir import HIR_OPS, MASK_KINDS, masked_score
    from rlx_core.ir.indices import device_error
    from rlx_core.ir.mir import slice_params
    from rlx_core.ir.ops import linalg
    from rlx_core.ir.reference import evaluate, to_reference
    from rlx_core.ir.schema import REGISTRY, REQUIRED, AttrSpec, OpSchema, get_op, register_op
    from rlx_core.ir.types import Attrs, Dim, TensorType, broadcast_shapes, normalize_axis
    from rlx_core.lir import Access, BufferPlan, Program, Step, Transfer, conflicts, lower
    from rlx_core.models.minilm import MiniLM
    from rlx_core.pages import release_file_pages, release_library_pages
    from rlx_core.quant import quantize_graph
    from rlx_core.quant.examples import split_digits, train_cnn, train_mlp
    from rlx_core.quant.fixedpoint import softmax_lut
    from rlx_core.quant.ops import pool_geometry
    from rlx_core.records import (
        BackendInfo,
        BufferBinding,
        CompiledProgram,
        Decomposition,
        DeviceCaps,
        DeviceInfo,
        ExporterInfo,
        FusionRule,
        KernelClaim,
        NodeVariant,
        Region,
        Rewrite,
    )
    from rlx_core.runtime import Executable, Session
    from rlx_core.settings import Setting
    from rlx_core.settings import declare as declare_setting


def register_quant_ops() -> tuple[str, ...]:
    """Make sure the INT8 ops of the quantization package are in :data:`REGISTRY` (importing it
    registers them) and return their names in registration order; call it before claiming,
    building or loading quantized ops."""
    from rlx_core.quant import QUANT_OPS

    return QUANT_OPS


_get, __dir__ = _lazy(globals(), _LAZY,
                      ": the plugin API is rlx_core.plugin.__all__ (everything else in rlx_core is private)")


def __getattr__(name: str) -> Any:
    return _get(name)
