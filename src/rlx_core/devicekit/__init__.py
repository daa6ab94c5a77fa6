"""The device kit: what every code-generating device backend shares (issue 15, step 3).

A kit backend is tinygrad's "device = allocator + renderer + program loader", on the LIR:

* **claims** (:mod:`.claims`): which elementwise variants the backend's dialect can render, decided by
  rendering them (one memoised render check, :func:`render_check`), and the claim list that follows
  (:func:`elementwise_claims`, :func:`fused_claim`);
* **compile** (:mod:`.compiler`): :class:`Compiler` turns a kernel source into a binary, memoised in
  the process and cached on disk under :func:`rlx_core.cache.cache_subdir`, authenticated before use,
  keyed by dialect + compiler identity (tool version, flags, headers) + source;
* **C-style kernels** (:mod:`.cstyle`): one kernel library (templates, lowering of LIR steps to
  launches) for every C-style device language, the language a :class:`~.cstyle.KernelDialect`
  (Metal, OpenCL): a new C-style target is a dialect plus a runtime shim;
* **GLSL kernels** (:mod:`.glsl`): one compute-shader library (templates, lowering of LIR steps
  to dispatches, claims) for every GLSL API, the API a :class:`~.glsl.GlslFlavour` (Vulkan,
  OpenGL 4.3): a new GLSL target is a flavour plus a runtime shim;
* **run** (:mod:`.program`): :class:`KitProgram` walks the LIR once (constants uploaded once, one
  arena laid out by the buffer plan, each step lowered to :class:`Launch` es by the backend), has the
  backend's :class:`Runtime` load and bind them, and per run copies inputs in, launches, copies
  outputs out; :class:`Replay` is the record-once/replay-per-run capability (CUDA graphs, Vulkan
  command buffers) for runtimes whose API has it.

A new target (OpenCL, WebGPU, HIP, ...) is a :class:`~rlx_core.codegen.render.Dialect` plus kernel
templates, a ``lower(step, program) -> [Launch]``, an :class:`Allocator`, a :class:`Compiler` and a
:class:`Runtime` (see ``docs/AUTHORING.md``, "A code-generating backend on the device kit").
Public through :mod:`rlx_core.plugin`. Importing this package is cheap: names load on first use.
"""

from __future__ import annotations

from typing import Any

from .._lazy import lazy as _lazy

_HOME = {
    "single_op_program": "claims", "program_of": "claims", "render_check": "claims", "renders": "claims",
    "check_ops": "claims",
    "dtypes_in": "claims", "all_of": "claims", "elementwise_claims": "claims", "fused_claim": "claims",
    "Compiler": "compiler", "tool_version": "compiler",
    "Launch": "program", "Allocator": "program", "HostAllocator": "program", "Runtime": "program",
    "CtypesRuntime": "program",
    "KitProgram": "program", "Replay": "program",
    "KernelDialect": "cstyle", "KERNEL_DIALECTS": "cstyle",
    "GlslFlavour": "glsl", "GLSL_FLAVOURS": "glsl",
}

__all__ = sorted(_HOME)


_get, __dir__ = _lazy(globals(), {k: "." + v for k, v in _HOME.items()})


def __getattr__(name: str) -> Any:
    return _get(name)
