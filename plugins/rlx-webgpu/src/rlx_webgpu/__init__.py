"""rlx-webgpu: the RLX backend for WebGPU compute (WGSL through wgpu-py / wgpu-native), and
``rlx export --target webgpu`` (WGSL + an ES-module loader for browsers and WebGPU JS runtimes)."""

__version__ = "0.1.0"
