"""rlx-vulkan: the RLX backend for Vulkan compute (GLSL -> SPIR-V through glslangValidator)."""

__version__ = "0.1.0"
