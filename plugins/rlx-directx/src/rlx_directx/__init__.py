"""rlx-directx: the RLX backend for HLSL compute shaders (compiled to SPIR-V, run on Vulkan)."""

__version__ = "0.1.0"
