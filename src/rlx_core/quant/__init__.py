"""Quantization (placeholder while developing)."""
from . import ops as ops  # noqa: F401
