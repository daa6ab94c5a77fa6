"""Plugin discovery in two phases, and the per-backend facade the rest of the core talks to.

Phase 1 lists entry points of the group ``rlx.backends`` without importing anything. Phase 2
imports one plugin when it is selected or probed. A plugin that fails to import, declares another
API major, or raises in a hook is recorded with its real cause; it never breaks ``import rlx_core``
or the other plugins.

Plugin code is trusted (it runs in this process), but its failures are contained: whatever a plugin's
import or hook raises, ``SystemExit`` and ``KeyboardInterrupt`` included, becomes a
:class:`~rlx_core.errors.PluginError` naming the plugin and the cause. Only a Ctrl-C the user really
pressed (a SIGINT seen while the plugin ran) still interrupts; see :class:`PluginCall`.

Environment:
  ``RLX_BACKENDS``                comma-separated allow-list *and* order (``cuda,cpu``).
  ``RLX_DISABLE_PLUGINS``         comma-separated backend names to skip, or ``all``.
  ``RLX_PLUGIN_IMPORT_TIMEOUT``   seconds one plugin's import may take before it is reported as broken
                                  (``rlx doctor``: default 30; library loads: no limit unless set; 0 = none).
"""

from __future__ import annotations

import os
import signal
import threading
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from types import ModuleType
from typing import Any

import pluggy

from . import API_VERSION, install_hint
from .errors import BackendNotFoundError, PluginConflictError, PluginError

GROUP = "rlx.backends"
BUILTIN = "rlx-core (builtin)"
IMPORT_TIMEOUT_ENV = "RLX_PLUGIN_IMPORT_TIMEOUT"
#: What `rlx doctor` allows one plugin's import when RLX_PLUGIN_IMPORT_TIMEOUT is unset: generous,
#: because a first import may compile or unpack (Numba, a GPU runtime) on a cold disk.
DOCTOR_IMPORT_TIMEOUT = 30.0


@dataclass(frozen=True)
class PluginEntry:
    """A backend found by discovery, before import."""

    name: str
    value: str
    distribution: str
    dist_version: str
    entry_point: Any = field(compare=False, repr=False, default=None)


def _env_list(env: Mapping[str, str], key: str) -> list[str] | None:
    from .settings import lookup

    value: list[str] | None = lookup(key).get(env)
    return value


def _short_cause(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    loc = f" (at {tb[-1].filename}:{tb[-1].lineno})" if tb else ""
    text = str(e)
    head = f"{type(e).__name__}: {text}" if text else type(e).__name__
    if isinstance(e, SystemExit):
        head += " (the plugin tried to exit the process; a plugin must raise an exception instead)"
    elif isinstance(e, KeyboardInterrupt):
        head += " (raised by the plugin itself, not by a Ctrl-C)"
    return f"{head}{loc}"


def import_timeout(env: Mapping[str, str], default: float | None) -> float | None:
    """Seconds from ``RLX_PLUGIN_IMPORT_TIMEOUT`` (``0`` = no limit), else ``default``."""
    from .errors import SettingError
    from .settings import PLUGIN_IMPORT_TIMEOUT

    try:
        value: float | None = PLUGIN_IMPORT_TIMEOUT.get(env)
    except SettingError as e:  # callers handle BackendNotFoundError: the hub cannot load anything
        raise BackendNotFoundError(e.what, where=e.where, fix="set it to seconds such as 30, or 0 for "
                                                              "no limit") from None
    if value is None:
        return default
    return value or None


_SIGINTS = 0  # SIGINTs seen while PluginCall watched; only ever increases


def _count_sigint(signum: int, frame: Any) -> None:
    global _SIGINTS
    _SIGINTS += 1
    signal.default_int_handler(signum, frame)  # raises KeyboardInterrupt, as without us


class PluginCall:
    """Context for running plugin code that tells the plugin's own ``KeyboardInterrupt`` from the user's.

    Both look the same once raised, so while plugin code runs on the main thread with Python's default
    SIGINT handler, a handler that counts SIGINTs is installed. A ``KeyboardInterrupt`` with no SIGINT
    seen came from the plugin and is reported as its failure; with one seen (or when watching was not
    possible: another thread, or the application installed its own handler) it is the user's and
    propagates, so Ctrl-C always stops.
    """

    def __init__(self) -> None:
        self._watching = False
        self._installed = False  # by this context, not an enclosing one: only then restore on exit
        self._before = 0

    def __enter__(self) -> PluginCall:
        self._before = _SIGINTS
        if threading.current_thread() is threading.main_thread():
            try:
                current = signal.getsignal(signal.SIGINT)
                if current is signal.default_int_handler:
                    signal.signal(signal.SIGINT, _count_sigint)
                    self._installed = True
                self._watching = self._installed or current is _count_sigint
            except (ValueError, OSError):  # embedded interpreters without signal support
                pass
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            self._installed = False
            try:
                signal.signal(signal.SIGINT, signal.default_int_handler)
            except (ValueError, OSError):
                pass

    def users(self, e: BaseException) -> bool:
        """Whether ``e`` must propagate unchanged: a real Ctrl-C (or one that cannot be ruled out),
        or a ``BaseException`` that is not an error (``GeneratorExit``)."""
        if isinstance(e, KeyboardInterrupt):
            return not self._watching or _SIGINTS != self._before
        return not isinstance(e, (Exception, SystemExit))


class Backend:
    """One loaded backend: identity, devices, claims, and calls into its hooks, each isolated."""

    def __init__(self, hub: Hub, entry: PluginEntry, plugin: Any) -> None:
        self.hub = hub
        self.entry = entry
        self.plugin = plugin
        self.name = entry.name
        self._devices: list[Any] | None = None
        self._claims: dict[str, dict[str, list[Any]]] = {}
        self._lock = threading.Lock()
        self.info = self.call("rlx_backend_info", required=True)
        from .records import BackendInfo

        if not isinstance(self.info, BackendInfo):
            raise PluginError(f"plugin {self.label} returned {type(self.info).__name__} from "
                              "rlx_backend_info, not BackendInfo",
                              fix="return rlx_core.records.BackendInfo(...)")
        core_major = int(API_VERSION.split(".")[0])
        if self.info.api_major != core_major:
            raise PluginError(
                f"plugin {self.label} targets RLX plugin API {self.info.api_version}, but rlx-core "
                f"provides API {API_VERSION}",
                where=f"backend {self.name!r}", kind="api_version",
                fix=(f"install a {entry.distribution} release built for API {core_major}.x, or an "
                     f"rlx-core that provides API {self.info.api_major}.x"))
        if self.info.name != self.name:
            raise PluginError(f"plugin {self.label} is registered as {self.name!r} but calls itself "
                              f"{self.info.name!r}", fix="make the entry-point name equal BackendInfo.name")

    @property
    def label(self) -> str:
        return f"{self.entry.distribution} {self.entry.dist_version} ({self.name})"

    # -- hook calls ------------------------------------------------------------------------------
    def call(self, hook: str, *, required: bool = False, **kwargs: Any) -> Any:
        """Call one hook of this plugin only; exceptions become PluginError naming plugin and hook."""
        impls = [i for i in getattr(self.hub.pm.hook, hook).get_hookimpls() if i.plugin is self.plugin]
        if not impls:
            if required:
                raise PluginError(f"plugin {self.label} does not implement hook {hook!r}",
                                  fix=f"add an @hookimpl def {hook}(...) to the plugin")
            return None
        impl = impls[-1]
        with PluginCall() as guard:
            try:
                return impl.function(**{k: kwargs[k] for k in impl.argnames})
            except PluginError:
                raise
            except BaseException as e:
                if guard.users(e):
                    raise
                raise PluginError(f"plugin {self.label} raised in hook {hook!r}: {_short_cause(e)}",
                                  where=f"backend {self.name!r}",
                                  fix="this is a bug in the plugin; report it to its authors, or disable "
                                      f"it with RLX_DISABLE_PLUGINS={self.name}", kind="hook") from e

    def devices(self) -> list[Any]:
        from .records import DeviceInfo

        if self._devices is None:
            devs = self.call("rlx_probe_devices", required=True) or []
            if not isinstance(devs, (list, tuple)) or not all(isinstance(d, DeviceInfo) for d in devs):
                raise PluginError(f"plugin {self.label}: rlx_probe_devices must return a list of "
                                  "DeviceInfo", fix="return [DeviceInfo(...), ...]")
            # Imported on use (it is below the hub): discovery alone never reads calibrations.
            from .calibration import apply_calibration

            self._devices = [apply_calibration(d) for d in devs]
        return self._devices

    def device(self, index: int | None = None) -> Any:
        devs = self.devices()
        if not devs:
            raise BackendNotFoundError(f"backend {self.name!r} reports no devices",
                                       fix="run `rlx doctor` to see why")
        if index is None:
            for d in devs:
                if d.available:
                    return d
            reasons = "; ".join(f"{d.name}: {d.reason}" for d in devs)
            raise BackendNotFoundError(f"backend {self.name!r} has no available device ({reasons})",
                                       fix="run `rlx doctor`, or choose another device")
        if not 0 <= index < len(devs):
            raise BackendNotFoundError(f"backend {self.name!r} has no device {index} "
                                       f"(it has {len(devs)})", fix="run `rlx doctor` to list devices")
        d = devs[index]
        if not d.available:
            raise BackendNotFoundError(f"device {d.name} is unavailable: {d.reason}",
                                       fix="run `rlx doctor`, or choose another device")
        return d

    def claims(self, device: Any) -> dict[str, list[Any]]:
        """Claims by op for ``device``, validated once."""
        from .records import KernelClaim

        with self._lock:
            if device.name not in self._claims:
                raw = self.call("rlx_kernels", required=True, device=device) or []
                by_op: dict[str, list[KernelClaim]] = {}
                for c in raw:
                    if not isinstance(c, KernelClaim):
                        raise PluginError(f"plugin {self.label}: rlx_kernels returned {c!r}",
                                          fix="return a list of KernelClaim")
                    by_op.setdefault(c.op, []).append(c)
                self._claims[device.name] = by_op
            return self._claims[device.name]

    def claim_by_name(self, device: Any, name: str) -> Any:
        for cs in self.claims(device).values():
            for c in cs:
                if c.name == name:
                    return c
        raise PluginError(f"backend {self.name!r} has no kernel {name!r}",
                          fix="clear the compile cache (rlx cache clear); the plugin changed")

    def list_of(self, hook: str, cls: type) -> list[Any]:
        out = self.call(hook) or []
        for r in out:
            if not isinstance(r, cls):
                raise PluginError(f"plugin {self.label}: {hook} returned {r!r}",
                                  fix=f"return a list of {cls.__name__}")
        return list(out)

    def compile(self, program: Any, device: Any) -> Any:
        compiled = self.call("rlx_compile", required=True, program=program, device=device)
        if not callable(getattr(compiled, "run", None)):
            raise PluginError(f"plugin {self.label}: rlx_compile returned {compiled!r} without .run",
                              fix="return an object with run(inputs) -> outputs")
        return compiled


class Hub:
    """Finds, loads and isolates backend plugins. Use :func:`hub` for the process-wide instance."""

    def __init__(self, *, env: Mapping[str, str] | None = None, autoload: bool = True,
                 import_timeout: float | None = None) -> None:
        """``import_timeout``: seconds one plugin's import may take (``None``: no limit unless
        ``RLX_PLUGIN_IMPORT_TIMEOUT`` is set); `rlx doctor` sets it so a hung import cannot hang it."""
        from . import hookspecs

        self.env = dict(os.environ if env is None else env)
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.autoload = autoload
        self.import_timeout = import_timeout
        self._entries: dict[str, list[PluginEntry]] | None = None
        self._backends: dict[str, Backend] = {}
        self._failures: dict[str, PluginError] = {}
        self._manual: dict[str, PluginEntry] = {}
        self._lock = threading.RLock()
        self._builtin_loaded = False

    # -- phase 1: list without importing ---------------------------------------------------------
    def entries(self) -> dict[str, list[PluginEntry]]:
        if self._entries is None:
            found: dict[str, list[PluginEntry]] = {}
            if self.autoload and _env_list(self.env, "RLX_DISABLE_PLUGINS") != ["all"]:
                for ep in metadata.entry_points(group=GROUP):
                    dist = getattr(ep, "dist", None)
                    dname = dist.metadata["Name"] if dist is not None else "?"
                    dver = dist.version if dist is not None else "?"
                    entry = PluginEntry(ep.name, ep.value, dname, dver, ep)
                    lst = found.setdefault(ep.name, [])
                    if all(e.distribution != dname or e.value != ep.value for e in lst):
                        lst.append(entry)
            for name, entry in self._manual.items():
                found[name] = [entry]
            self._entries = found
        return self._entries

    def names(self) -> list[str]:
        """Backend names in selection order: ``RLX_BACKENDS`` order if set, else cpu first, then a-z."""
        disabled = set(_env_list(self.env, "RLX_DISABLE_PLUGINS") or [])
        found = [n for n in self.entries() if n not in disabled]
        allow = _env_list(self.env, "RLX_BACKENDS")
        if allow is not None:
            return [n for n in allow if n not in disabled]
        return sorted(found, key=lambda n: (n != "cpu", n))

    def register(self, plugin: Any, name: str, *, distribution: str = "<in-process>",
                 version: str = "0") -> Backend:
        """Register an in-process plugin (tests, notebooks) as if it came from an entry point."""
        with self._lock:
            entry = PluginEntry(name, repr(plugin), distribution, version)
            self._manual[name] = entry
            self._entries = None
            self._backends.pop(name, None)
            self._failures.pop(name, None)
            return self._load_entry(entry, plugin)

    # -- phase 2: import on demand ---------------------------------------------------------------
    def load(self, name: str) -> Backend:
        with self._lock:
            if name in self._backends:
                return self._backends[name]
            if name in self._failures:
                raise self._failures[name]
            allow = _env_list(self.env, "RLX_BACKENDS")
            disabled = set(_env_list(self.env, "RLX_DISABLE_PLUGINS") or [])
            if name in disabled or (_env_list(self.env, "RLX_DISABLE_PLUGINS") == ["all"] and \
                    name not in self._manual):
                raise BackendNotFoundError(f"backend {name!r} is disabled by RLX_DISABLE_PLUGINS",
                                           fix="remove it from RLX_DISABLE_PLUGINS")
            if allow is not None and name not in allow:
                raise BackendNotFoundError(f"backend {name!r} is not in RLX_BACKENDS={','.join(allow)}",
                                           fix="add it to RLX_BACKENDS or unset the variable")
            entries = self.entries().get(name, [])
            if not entries:
                known = ", ".join(self.entries()) or "none"
                raise BackendNotFoundError(
                    f"no backend named {name!r} is installed (installed: {known})",
                    fix=install_hint.backend_hint(name))
            if len(entries) > 1:
                dists = " and ".join(f"{e.distribution} {e.dist_version} ({e.value})" for e in entries)
                err = PluginConflictError(f"backend name {name!r} is provided by {dists}",
                                          fix="uninstall one of these distributions", kind="conflict")
                self._failures[name] = err
                raise err
            entry = entries[0]
            try:
                plugin = self._import(entry)
            except PluginError as err:
                self._failures[name] = err
                raise
            return self._load_entry(entry, plugin)

    def _import(self, entry: PluginEntry) -> Any:
        """Import one plugin's entry point; anything it raises (or a hang past the timeout) becomes a
        PluginError naming the distribution and the cause."""
        if entry.entry_point is None:
            return None
        timeout = import_timeout(self.env, self.import_timeout)
        label = f"plugin {entry.distribution} {entry.dist_version} ({entry.name})"
        fix = (f"reinstall {entry.distribution} with its dependencies, or disable it with "
               f"RLX_DISABLE_PLUGINS={entry.name}")
        if timeout is None:
            with PluginCall() as guard:
                try:
                    return entry.entry_point.load()
                except BaseException as e:
                    if guard.users(e):
                        raise
                    raise PluginError(f"{label} failed to import: {_short_cause(e)}",
                                      where=f"entry point {entry.value}", fix=fix, kind="import") from e
        # In a worker thread: the caller can stop waiting. Signals reach only the main thread, so a
        # KeyboardInterrupt in the worker is the plugin's own, and a Ctrl-C interrupts the join below.
        box: dict[str, Any] = {}

        def work() -> None:
            try:
                box["plugin"] = entry.entry_point.load()
            except BaseException as e:
                box["error"] = e

        worker = threading.Thread(target=work, name=f"rlx-import-{entry.name}", daemon=True)
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            # The import goes on in the daemon thread (Python cannot stop it) and holds that module's
            # import lock; the failure is recorded so this hub never waits on it again.
            raise PluginError(f"{label} failed to import: the import did not finish in {timeout:g} s",
                              where=f"entry point {entry.value}", kind="timeout",
                              fix=f"find what its import waits for (network, a device, a lock); raise "
                                  f"{IMPORT_TIMEOUT_ENV} if it is only slow; or disable it with "
                                  f"RLX_DISABLE_PLUGINS={entry.name}")
        if "error" in box:
            err = box["error"]
            raise PluginError(f"{label} failed to import: {_short_cause(err)}",
                              where=f"entry point {entry.value}", fix=fix, kind="import") from err
        return box["plugin"]

    def _load_entry(self, entry: PluginEntry, plugin: Any) -> Backend:
        self._ensure_builtin()
        try:
            if isinstance(plugin, ModuleType) or plugin is not None:
                if not self.pm.is_registered(plugin):
                    self.pm.register(plugin, name=f"rlx-backend-{entry.name}")
            backend = Backend(self, entry, plugin)
            self._register_ops(backend)
        except PluginError as e:
            self._unregister(plugin)
            self._failures[entry.name] = e
            raise
        except Exception as e:  # pluggy validation errors (bad hookimpl signature ...)
            # (BaseExceptions from plugin code were turned into PluginError by Backend.call.)
            self._unregister(plugin)
            err = PluginError(f"plugin {entry.distribution} ({entry.name}) is invalid: {_short_cause(e)}",
                              fix="check its hook implementations against rlx_core.hookspecs",
                              kind="invalid")
            self._failures[entry.name] = err
            raise err from e
        self._backends[entry.name] = backend
        return backend

    def _unregister(self, plugin: Any) -> None:
        try:
            if plugin is not None and self.pm.is_registered(plugin):
                self.pm.unregister(plugin)
        except Exception:
            pass

    def _register_ops(self, backend: Backend) -> None:
        from .ir.schema import REGISTRY, OpSchema

        for schema in backend.list_of("rlx_ops", OpSchema):
            REGISTRY.register(schema)

    def _ensure_builtin(self) -> None:
        if not self._builtin_loaded:
            from . import builtin

            if not self.pm.is_registered(builtin):
                self.pm.register(builtin, name="rlx-core-builtin")
            self._builtin_loaded = True

    # -- queries --------------------------------------------------------------------------------
    def try_load(self, name: str) -> Backend | None:
        try:
            return self.load(name)
        except (PluginError, BackendNotFoundError):
            return None

    def failures(self) -> dict[str, PluginError]:
        return dict(self._failures)

    def loaded(self) -> list[Backend]:
        return [self._backends[n] for n in self.names() if n in self._backends]

    def default_backend(self) -> str:
        """The first backend in selection order that has an available device.

        A backend that is not installed, or installed for hardware this machine lacks, is passed
        over. One that is installed but broken (fails to import, two distributions claim its name,
        a hook raises, its device record is invalid) stops the search with its own error: the
        default device never moves to another backend without the user choosing it.
        """
        errors = []
        for name in self.names():
            try:
                self.load(name).device()
                return name
            except PluginError as e:
                raise type(e)(f"the default backend {name!r} is broken, so no device was chosen: {e.what}",
                              where=e.where or f"backend {name!r}",
                              fix=f"{e.fix or 'repair or reinstall it'}; or choose a device explicitly "
                                  "(--device, Session(device=...), RLX_BACKENDS); `rlx doctor` shows it",
                              kind=e.kind) from e
            except BackendNotFoundError as e:
                errors.append(f"{name}: {e.what}")
        detail = "; ".join(errors) or "no backend plugins are installed"
        raise BackendNotFoundError(f"no usable backend ({detail})",
                                   fix=f"{install_hint.default_backend_hint()}; `rlx doctor` shows why")

    def core_decompositions(self) -> list[Any]:
        from . import builtin

        return builtin.rlx_decompositions()

    def core_rewrites(self) -> list[Any]:
        from . import builtin

        return builtin.rlx_rewrites()


_HUB: Hub | None = None
_HUB_LOCK = threading.Lock()


def hub() -> Hub:
    """The process-wide hub (created on first use, reading the environment then)."""
    global _HUB
    with _HUB_LOCK:
        if _HUB is None:
            _HUB = Hub()
        return _HUB


def reset_hub(new: Hub | None = None) -> Hub:
    """Replace the process-wide hub (tests; after changing environment variables)."""
    global _HUB
    with _HUB_LOCK:
        _HUB = new or Hub()
        return _HUB


def parse_device(spec: str) -> tuple[str, int | None]:
    """``"cuda:1"`` -> ``("cuda", 1)``; ``"cpu"`` -> ``("cpu", None)``."""
    name, _, idx = spec.partition(":")
    if idx and not idx.isdigit():
        raise BackendNotFoundError(f"device {spec!r} is malformed", fix="write BACKEND or BACKEND:INDEX")
    return name, int(idx) if idx else None


def split_devices(device: str | Sequence[str] | None) -> list[str]:
    if device is None:
        return []
    if isinstance(device, str):
        return [d.strip() for d in device.split(",") if d.strip()]
    return list(device)


# -- the public listing API (rlx_core.backends / rlx_core.devices) --------------------------------


def _warn_broken(e: PluginError) -> None:
    import warnings

    # A listing must still list the healthy backends; the broken one is named, never dropped silently.
    warnings.warn(f"{e.what} (left out of the list; fix: {e.fix or 'run `rlx doctor`'})",
                  RuntimeWarning, stacklevel=3)


def backends(*, from_hub: Hub | None = None) -> list[Any]:
    """The usable backends' :class:`~rlx_core.records.BackendInfo`, in selection order.

    Like ONNX Runtime's ``get_available_providers()``: every installed backend that ``RLX_BACKENDS``
    / ``RLX_DISABLE_PLUGINS`` select and that loads (imports, speaks this plugin API). A backend that is
    installed but broken is left out with a ``RuntimeWarning`` naming its cause; ``rlx doctor`` shows
    the same records with a check per device. ``from_hub``: another :class:`Hub` than the process-wide one.
    """
    h = from_hub or hub()
    installed = h.entries()
    out: list[Any] = []
    for name in h.names():
        if name not in installed:  # named in RLX_BACKENDS but not installed: nothing to list
            continue
        try:
            out.append(h.load(name).info)
        except PluginError as e:
            _warn_broken(e)
    return out


def devices(backend: str | None = None, *, include_unavailable: bool = False,
            from_hub: Hub | None = None) -> list[Any]:
    """Devices as :class:`~rlx_core.records.DeviceInfo` (``.name`` is what ``Session`` takes: "cuda:1").

    Like ``jax.devices()``: by default the available devices of every usable backend in selection
    order (the first is where ``Session()`` runs unless told otherwise); ``backend="cuda"``: only that
    backend's (a backend that is not installed or broken raises, with the fix);
    ``include_unavailable=True`` adds the devices a backend knows but cannot use, each with its
    ``reason``.
    """
    h = from_hub or hub()
    if backend is not None:
        found = [h.load(backend)]
    else:
        found = []
        for info in backends(from_hub=h):
            found.append(h.load(info.name))
    out: list[Any] = []
    for b in found:
        try:
            devs = b.devices()
        except PluginError as e:
            if backend is not None:
                raise
            _warn_broken(e)
            continue
        out.extend(d for d in devs if include_unavailable or d.available)
    return out
