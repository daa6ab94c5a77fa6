"""Every ``RLX_*`` setting, declared once and parsed one way.

A setting is a :class:`Setting` (name, type, default, doc, owner) made by :func:`declare`; the core
declares its own below, a plugin declares its own at import (``rlx_core.settings.declare(...,
owner="rlx-mydev")``) and returns them from the ``rlx_settings`` hook so ``rlx doctor --settings``
lists them. Code reads a value with ``SETTING.get()`` (or ``.get(env)`` for a snapshot such as the
hub's), never with ``os.environ`` directly: a test (tests/test_settings.py) greps the source tree so
no undeclared ``RLX_`` name creeps back in.

Parsing: unset or empty means the default; bools accept 1/0/true/false/yes/no/on/off (any case);
ints may use ``_`` separators; lists are comma-separated. Any other value is a :class:`SettingError`
naming the variable, the value, what is allowed and the fix: a typo must never silently turn a
safety limit or a feature off.

This module is stdlib-only so ``import rlx_core`` and plugin discovery stay fast.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .errors import SettingError

SettingType = Literal["bool", "int", "float", "str", "list", "path", "choice"]
TYPES: tuple[str, ...] = ("bool", "int", "float", "str", "list", "path", "choice")
CORE = "rlx-core"

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


@dataclass(frozen=True)
class Setting:
    """One ``RLX_*`` environment setting.

    ``default`` is what :meth:`get` returns when the variable is unset or empty (``None`` when the
    owner computes it: ``default_text`` then says what it is, for docs and ``rlx doctor``)."""

    name: str
    type: SettingType
    default: Any
    doc: str
    owner: str = CORE
    choices: tuple[str, ...] = ()
    min: float | None = None
    max: float | None = None
    default_text: str | None = None

    def __post_init__(self) -> None:
        where = f"declaration of {self.name}"
        if not self.name.startswith("RLX_") or not self.name.replace("_", "").isalnum() \
                or self.name != self.name.upper():
            raise SettingError(f"setting name {self.name!r} is not an upper-case RLX_ name", where=where,
                               fix="name it RLX_<OWNER>_<WHAT>, e.g. RLX_MYDEV_THREADS")
        if self.type not in TYPES:
            raise SettingError(f"setting {self.name} has unknown type {self.type!r}", where=where,
                               fix=f"use one of {', '.join(TYPES)}")
        if (self.type == "choice") != bool(self.choices):
            raise SettingError(f"setting {self.name}: choices go with type 'choice' (and it needs them)",
                               where=where, fix="give type='choice' and choices=(...) together")
        if not self.doc.strip():
            raise SettingError(f"setting {self.name} has no doc", where=where,
                               fix="say in one sentence what it changes")

    # -- reading ------------------------------------------------------------------------------
    def raw(self, env: Mapping[str, str] | None = None) -> str | None:
        """The variable's text, or None when unset or blank."""
        value = (os.environ if env is None else env).get(self.name)
        return value if value is not None and value.strip() else None

    def source(self, env: Mapping[str, str] | None = None) -> str:
        """``"env"`` when the variable is set (non-blank), else ``"default"``."""
        return "default" if self.raw(env) is None else "env"

    def get(self, env: Mapping[str, str] | None = None) -> Any:
        """The value from ``env`` (default: ``os.environ``), parsed and checked; the default when unset."""
        raw = self.raw(env)
        return self.default if raw is None else self.parse(raw)

    def parse(self, raw: str) -> Any:
        """``raw`` as this setting's type; a :class:`SettingError` when it is not allowed."""
        text = raw.strip()
        if self.type == "bool":
            low = text.lower()
            if low in _TRUE or low in _FALSE:
                return low in _TRUE
            return self._bad(raw, "a boolean (1/0, true/false, yes/no, on/off)")
        if self.type == "int":
            try:
                value: Any = int(text.replace("_", ""))
            except ValueError:
                return self._bad(raw, f"an integer{self._range()}")
            return self._check_range(raw, value, "an integer")
        if self.type == "float":
            try:
                value = float(text)
            except ValueError:
                value = math.nan
            if not math.isfinite(value):
                return self._bad(raw, f"a number{self._range()}")
            return self._check_range(raw, value, "a number")
        if self.type == "list":
            return [p.strip() for p in text.split(",") if p.strip()]
        if self.type == "path":
            return Path(text)
        if self.type == "choice":
            if text.lower() not in self.choices:
                return self._bad(raw, f"one of {', '.join(self.choices)}")
            return text.lower()
        return text

    # -- describing ---------------------------------------------------------------------------
    def allowed(self) -> str:
        """What values are allowed, in words."""
        return {"bool": "1/0, true/false, yes/no, on/off", "int": f"integer{self._range()}",
                "float": f"number{self._range()}", "list": "comma-separated names", "path": "a path",
                "choice": "/".join(self.choices), "str": "text"}[self.type]

    def default_str(self) -> str:
        """The default, as docs and ``rlx doctor`` show it."""
        if self.default_text is not None:
            return self.default_text
        return "unset" if self.default is None else show(self.default)

    def describe(self, env: Mapping[str, str] | None = None) -> dict[str, Any]:
        """This setting as JSON-able data, with its current value (or the error of a bad one)."""
        rec: dict[str, Any] = {"name": self.name, "type": self.type, "owner": self.owner, "doc": self.doc,
                               "allowed": self.allowed(), "default": _jsonable(self.default),
                               "default_text": self.default_str(), "source": self.source(env),
                               "raw": self.raw(env), "value": None, "error": None}
        try:
            rec["value"] = _jsonable(self.get(env))
        except SettingError as e:
            rec["error"] = {"what": e.what, "where": e.where, "fix": e.fix}
        return rec

    # -- helpers ------------------------------------------------------------------------------
    def _range(self) -> str:
        lo, hi = self.min, self.max
        if lo is not None and hi is not None:
            return f" from {show(lo)} to {show(hi)}"
        if lo is not None:
            return f" >= {show(lo)}"
        return f" <= {show(hi)}" if hi is not None else ""

    def _check_range(self, raw: str, value: float, kind: str) -> Any:
        if (self.min is not None and value < self.min) or (self.max is not None and value > self.max):
            return self._bad(raw, f"{kind}{self._range()}")
        return value

    def _bad(self, raw: str, allowed: str) -> Any:
        example = f", e.g. {self.name}={show(self.default)}" if self.default not in (None, "") else ""
        raise SettingError(f"{self.name}={raw!r} is not {allowed}", where=f"environment variable {self.name}",
                           fix=f"set it to {allowed}{example}, or unset it for the default "
                               f"({self.default_str()})")


def show(value: Any) -> str:
    """A value the way a user would type it in the environment."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return str(value)


def _jsonable(value: Any) -> Any:
    return str(value) if isinstance(value, Path) else value


# -- the registry ------------------------------------------------------------------------------

_REGISTRY: dict[str, Setting] = {}
_LOCK = threading.Lock()


def register(setting: Setting) -> Setting:
    """Add ``setting`` to the registry; the same declaration again (a re-import) is a no-op, a
    different one under the same name is a :class:`SettingError` naming both owners."""
    with _LOCK:
        old = _REGISTRY.get(setting.name)
        if old is not None and old != setting:
            raise SettingError(f"{setting.name} is declared twice, differently (by {old.owner} and by "
                               f"{setting.owner})", where=f"declaration of {setting.name}",
                               fix="declare each RLX_ setting once, in its owner, and import it elsewhere")
        if old is not None:
            return old
        _REGISTRY[setting.name] = setting
        return setting


def declare(name: str, type: SettingType, default: Any, doc: str, *, owner: str = CORE,
            choices: tuple[str, ...] = (), min: float | None = None, max: float | None = None,
            default_text: str | None = None) -> Setting:
    """Declare (and register) one ``RLX_*`` setting; returns it so its owner keeps a handle
    (``THREADS = declare("RLX_MYDEV_THREADS", "int", 4, "...", owner="rlx-mydev", min=1)``)."""
    return register(Setting(name, type, default, doc, owner, tuple(choices), min, max, default_text))


def lookup(name: str) -> Setting:
    """The declared setting ``name``."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise SettingError(f"no setting named {name!r} is declared", where="rlx_core.settings",
                           fix="declare it with rlx_core.settings.declare(...) in its owner") from None


def all_settings() -> list[Setting]:
    """Every declared setting: the core's first, then by owner and name."""
    with _LOCK:
        items = list(_REGISTRY.values())
    return sorted(items, key=lambda s: (s.owner != CORE, s.owner, s.name))


# -- the core's settings -----------------------------------------------------------------------

BACKENDS = declare(
    "RLX_BACKENDS", "list", None,
    "Backends that may be used, in the order the default device is chosen (e.g. cuda,cpu).",
    default_text="every installed backend, cpu first")
DISABLE_PLUGINS = declare(
    "RLX_DISABLE_PLUGINS", "list", None,
    "Backend names never to load (e.g. vulkan,metal), or `all` to load no plugin.", default_text="none")
PLUGIN_IMPORT_TIMEOUT = declare(
    "RLX_PLUGIN_IMPORT_TIMEOUT", "float", None,
    "Seconds one plugin's import may take before it is reported as broken; 0 = no limit.", min=0,
    default_text="30 in rlx doctor, else no limit")
CACHE_DIR = declare(
    "RLX_CACHE_DIR", "path", None, "The compile-cache directory (created 0700; must be private).",
    default_text="$XDG_CACHE_HOME/rlx, else ~/.cache/rlx")
NO_CACHE = declare(
    "RLX_NO_CACHE", "bool", False,
    "Compile in memory only: no on-disk compile cache (calibration results are still read).")
DEBUG = declare("RLX_DEBUG", "bool", False, "The CLI shows Python tracebacks (same as --debug).")
DISPATCH_REPORT = declare(
    "RLX_DISPATCH_REPORT", "bool", False, "Print the dispatch report of every compiled graph to stderr.")
FUSION = declare("RLX_FUSION", "bool", True,
                 "Fuse chains of elementwise ops the backend runs natively into one kernel.")
MAX_SPECIALIZATIONS = declare(
    "RLX_MAX_SPECIALIZATIONS", "int", 16,
    "Input-shape specialisations each executable keeps compiled (least recently used dropped).", min=1)
ONNX_FOLD_MAX_ELEMENTS = declare(
    "RLX_ONNX_FOLD_MAX_ELEMENTS", "int", 1 << 24,
    "Largest tensor (elements) a constant fold may create from smaller inputs (ONNX import, and "
    "compile: rlx_core.fold).", min=0)
ONNX_FOLD_MAX_BYTES = declare(
    "RLX_ONNX_FOLD_MAX_BYTES", "int", 64 << 20,
    "Total bytes constant folding may create, per model (ONNX import) and per compiled graph, on "
    "top of twice the model's own tensor bytes.", min=0)
ONNX_MMAP = declare(
    "RLX_ONNX_MMAP", "bool", True,
    "An ONNX model's large initializers in external data are read-only memory maps of that file, not "
    "copies: a backend that packs them gives their pages back (0: copies, as before).")
ONNX_STAGED_CACHE = declare(
    "RLX_ONNX_STAGED_CACHE", "int", 16,
    "Compiled stages a staged ONNX model (run-time shape values, data-dependent shapes) keeps per "
    "boundary, least recently used first out.", min=1)
ONNX_DEVICE = declare(
    "RLX_ONNX_DEVICE", "str", None,
    "The RLX device the ONNX backend (onnx.backend API) runs every model on (e.g. cpu, cuda:1).",
    default_text="mapped from the ONNX device (CPU -> cpu, CUDA:1 -> cuda:1)")
BENCH_THREADS = declare(
    "RLX_BENCH_THREADS", "int", None,
    "Threads `rlx bench` and the bench/micro microbenchmarks give every engine they compare.", min=1,
    default_text="the CPU count")
COLLECTIVE_TIMEOUT = declare(
    "RLX_COLLECTIVE_TIMEOUT", "float", 300.0,
    "Seconds a collective (all_reduce, send, recv ...) may wait for its peer ranks before it fails with "
    "an error naming the rank and the collective.", min=0.001)
REQUIRE_SIGNATURE = declare(
    "RLX_REQUIRE_SIGNATURE", "path", None,
    "A public key: `rlx run`/`rlx explain` refuse a model without a valid signature by it.")


__all__ = ["CORE", "Setting", "SettingError", "SettingType", "TYPES", "all_settings", "declare", "lookup",
           "register", "show"]
