"""Shared code generation: one C-style renderer with dialect tables (C, CUDA, Metal, OpenCL, GLSL,
WGSL, and Numba-Python for the CPU backend's generated kernels)."""

from .render import DIALECTS, Dialect, render_program

__all__ = ["DIALECTS", "Dialect", "render_program"]
