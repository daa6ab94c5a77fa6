"""The OpenVINO core (one per process) and the compile configuration. Imported only when a device
is probed or a program compiled: ``import openvino`` costs about a second."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from .settings import THREADS


@lru_cache(maxsize=1)
def core() -> Any:
    import openvino as ov

    return ov.Core()


def compile_config(ov_device: str) -> dict[str, Any]:
    # The CPU plugin's default inference precision is bf16 on CPUs with AVX512-BF16/AMX and its
    # default execution mode trades accuracy for speed: both would break the f32 claims.
    cfg: dict[str, Any] = {"INFERENCE_PRECISION_HINT": "f32", "EXECUTION_MODE_HINT": "ACCURACY"}
    if ov_device.split(".")[0] == "CPU" and THREADS.get():
        cfg["INFERENCE_NUM_THREADS"] = THREADS.get()
    return cfg
