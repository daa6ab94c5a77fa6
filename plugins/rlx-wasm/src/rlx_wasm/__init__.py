"""rlx-wasm: the whole LIR program as one WebAssembly module (SIMD128 kernels, planned linear memory).

``Session("wasm").compile(graph)`` runs the module in wasmtime; ``rlx export MODEL --target wasm``
writes it out with its weights and a JavaScript loader for browsers and Node.js.
"""

__version__ = "0.1.0"

from .options import set_simd, simd_enabled

__all__ = ["__version__", "set_simd", "simd_enabled"]
