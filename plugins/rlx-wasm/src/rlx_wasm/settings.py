"""rlx-wasm's ``RLX_*`` settings, declared once (``rlx doctor --settings`` lists them; the plugin's
``rlx_settings`` hook returns :data:`SETTINGS`). Imports nothing heavy."""

from __future__ import annotations

from rlx_core.plugin import Setting, declare_setting

OWNER = "rlx-wasm"

SIMD = declare_setting("RLX_WASM_SIMD", "bool", True,
                       "Generated WebAssembly uses SIMD128 kernels (0: scalar, for engines without SIMD).",
                       owner=OWNER)

TUNE = declare_setting("RLX_WASM_TUNE", "choice", "wasmtime",
                       "Engine the in-process module's code is tuned for: wasmtime (Cranelift) or js (V8, "
                       "what `rlx export` writes); equal results, so conformance can certify either.",
                       owner=OWNER, choices=("wasmtime", "js"))

SETTINGS: list[Setting] = [SIMD, TUNE]
