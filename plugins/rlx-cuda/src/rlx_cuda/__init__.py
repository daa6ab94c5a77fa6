"""rlx-cuda: the RLX backend for NVIDIA GPUs (CuPy: cuBLAS, NVRTC-compiled kernels, CUDA graphs)."""

__version__ = "0.1.0"
