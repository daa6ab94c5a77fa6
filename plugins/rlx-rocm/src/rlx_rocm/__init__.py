"""rlx-rocm: the RLX backend for AMD GPUs (HIP kernels from the device kit; hiprtc + libamdhip64 through
ctypes on a ROCm machine, offline AMDGPU code objects through clang anywhere)."""

__version__ = "0.1.0"
