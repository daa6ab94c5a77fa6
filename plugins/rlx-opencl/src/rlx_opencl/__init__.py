"""rlx-opencl: the RLX backend for OpenCL devices (pyopencl; PoCL's CPU device in CI)."""

__version__ = "0.1.0"
