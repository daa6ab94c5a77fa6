"""Shared code generation: one C-style renderer with dialect tables (C, CUDA, Metal, OpenCL, GLSL,
WGSL, and Numba-Python for the CPU backend's generated kernels), and the one place that makes names from
model files safe in generated source (:mod:`rlx_core.codegen.names`)."""

from .names import Namer, comment, identifier, js_value, safe_comment, string_literal
from .render import DIALECTS, Dialect, render_program

__all__ = ["DIALECTS", "Dialect", "Namer", "comment", "identifier", "js_value", "render_program",
           "safe_comment", "string_literal"]
