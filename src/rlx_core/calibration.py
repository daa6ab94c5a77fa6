"""Cached calibration results overlaid on the caps a plugin declares for its devices.

Read by the hub whenever it lists a backend's devices, so it sits below the hub; measuring (which
compiles and runs through a Session) is :mod:`rlx_core.calibrate`, above the runtime.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import platform
import warnings
from pathlib import Path
from typing import Any

from .errors import RLXError


def machine_id() -> str:
    raw = "|".join([platform.node(), platform.machine(), platform.processor(), str(os.cpu_count())])
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def calibration_path(backend: str, device: str) -> Path:
    # Imported on use: the hub imports this module, and discovery must not pay for the cache's imports.
    from .cache import cache_subdir, default_cache_dir

    safe = device.replace(":", "_")
    # Results, not a cache: kept under RLX_NO_CACHE=1. Where the cache root is unusable the path
    # is outside any authenticated root, so reading finds nothing and saving is skipped.
    d = cache_subdir("calibration", ignore_no_cache=True) or default_cache_dir() / "calibration"
    return d / f"{backend}-{safe}-{machine_id()}.json"


def _read_calibration(p: Path) -> str:
    """The file's text if its MAC sidecar matches (a planted or edited file is deleted, as missing)."""
    from .cache import read_sealed

    raw = read_sealed(p)
    if raw is None:
        raise FileNotFoundError(str(p))
    return raw.decode("utf-8", "replace")


def _rate(value: Any, key: str, *, zero_ok: bool = False) -> float:
    # bool is an int to Python but never a measurement; NaN and inf would poison every cost.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key} is {value!r}, not a number")
    v = float(value)
    if not math.isfinite(v) or v < 0 or (v == 0 and not zero_ok):
        raise ValueError(f"{key} is {value!r}, not a finite {'non-negative' if zero_ok else 'positive'} "
                         "number")
    return v


def apply_calibration(device: Any) -> Any:
    """Overlay cached measurements (if any) on a device's plugin-declared caps.

    A calibration file that cannot be used (unreadable, malformed, NaN or infinite numbers) is
    ignored with a warning naming it, and the device keeps its plugin defaults, its ``caps.source``
    saying why: a bad cache file must neither break the device nor, by breaking it, move the default
    device to another backend.
    """
    if not device.available:
        return device
    p = calibration_path(device.backend, device.name)
    try:
        text = _read_calibration(p)
    except FileNotFoundError:
        return device
    except OSError as e:
        return _ignored(device, p, f"it cannot be read ({e.strerror or e})")
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("peak_flops"), dict):
            raise ValueError("it has no 'peak_flops' object")
        link = data.get("host_link_bandwidth", device.caps.host_link_bandwidth)
        caps = dataclasses.replace(
            device.caps,
            peak_flops={str(k): _rate(v, f"peak_flops[{k!r}]") for k, v in data["peak_flops"].items()},
            mem_bandwidth=_rate(data.get("mem_bandwidth"), "mem_bandwidth"),
            launch_overhead=_rate(data.get("launch_overhead"), "launch_overhead", zero_ok=True),
            host_link_bandwidth=None if link is None else _rate(link, "host_link_bandwidth"),
            source=f"calibrated {data.get('date', '?')}",
            # Measured figures replace the plugin's guesses, so its caveat goes; one stored with
            # --force over a refusal says so and keeps auto-placement off the device.
            unreliable=str(data.get("unreliable") or ""))
    except (ValueError, TypeError, RLXError) as e:
        return _ignored(device, p, str(e.what if isinstance(e, RLXError) else e))
    return dataclasses.replace(device, caps=caps)


def _ignored(device: Any, path: Path, why: str) -> Any:
    warnings.warn(f"calibration file {path} for {device.name} is ignored: {why}; the device uses its "
                  f"plugin defaults (fix: run `rlx calibrate {device.backend}` again, or delete the file)",
                  RuntimeWarning, stacklevel=3)
    caps = dataclasses.replace(device.caps, source=f"{device.caps.source} (calibration file ignored: {why})")
    return dataclasses.replace(device, caps=caps)
