"""One private, authenticated on-disk cache for RLX and its plugins.

Threat model: the cache directory belongs to the user. Anything under it may have been written by
someone else if the directory was ever shared, restored from elsewhere or left writable, so every
entry is authenticated (HMAC-SHA256 with a per-user key that never leaves the cache root) before it
is loaded, unpickled or dlopened; an entry that fails is deleted and rebuilt (a debug log line, no
error). Public API for core and plugins:

* :func:`cache_root` / :func:`cache_subdir`: the validated root (``$RLX_CACHE_DIR``, else
  ``$XDG_CACHE_HOME/rlx``, else ``~/.cache/rlx``; created 0700) and a per-user subdirectory of it,
  or None when caching is off (``RLX_NO_CACHE=1``, read-only, missing, unsafe). Callers then build in
  memory (or in a private temporary directory); the reason is warned about once per process.
* :func:`write_entry` / :func:`read_entry`: one self-authenticating file (magic + tag + data).
* :func:`publish_file` / :func:`verify_file` / :func:`read_sealed`: files another program reads
  itself (a dlopened library, Numba's index and data files, readable JSON) carry a ``.mac`` sidecar.
* :func:`seal_tree` / :func:`verify_tree`: a build directory (Icarus ``.vvp`` and its memory files,
  firmware objects) carries an authenticated manifest of every file's sha256.

Tags bind the file's *name* (every cache file name carries its content key: a graph hash, a
source hash), so a valid entry cannot be served under another name. Verify-then-load is safe from
TOCTOU races only because the root is a directory that only the user can write (checked here).

The compile cache (:class:`CompileCache`) stores legalized graphs keyed by graph hash, backend
version and device as one authenticated entry: a JSON header (structure, plans, assignments) and
the raw bytes of the constants legalization made (no pickle). Entries are written atomically, so a
crash or two processes racing never leave a torn entry. The key also stamps the source files of
rlx_core and of the backend's package (newest modification time and count).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import logging
import os
import secrets
import shutil
import stat
import struct
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import API_VERSION, __version__, settings
from .dispatch import Assignment, Legalized, Plan
from .ir.graph import Graph
from .ir.structure import decode_structure

__all__ = [
    "SUBDIRS", "CacheWarning", "CompileCache", "auth_stats", "cache_root", "cache_subdir",
    "clear", "default_cache_dir", "describe", "publish_file", "read_entry", "read_sealed", "seal_file",
    "seal_tree", "secure_dir", "verify_file", "verify_tree", "write_entry",
]

FORMAT = 2  # 1 was a pickle; 2 is an authenticated JSON header + raw constant bytes
KEY_FILE = "auth.key"
KEY_BYTES = 32
MAGIC = b"RLXAUTH1"
TAG_BYTES = 32
SIDECAR = ".mac"
MANIFEST = ".rlx-manifest"
#: The core's own caches under the root (name -> what it holds). A plugin's cache describes itself:
#: ``cache_subdir(name, about=...)`` keeps its text in the folder's ``.about`` file, so that
#: `rlx cache info` names it in a process that never imported the plugin (the core names no backend).
SUBDIRS: dict[str, str] = {
    "compile": "legalized graphs (core compile cache)",
    "bench": "`rlx bench` exported ONNX models",
    "calibration": "`rlx calibrate` results (kept by `rlx cache clear` unless --calibration)",
}
ABOUT = ".about"

log = logging.getLogger("rlx_core.cache")


class CacheWarning(RuntimeWarning):
    """The on-disk cache is unusable (unsafe, read-only, full): RLX compiles in memory instead."""


_LOCK = threading.Lock()
_KEYS: dict[str, bytes] = {}       # validated root (str) -> its key
_WARNED: set[str] = set()
_STATS = {"seconds": 0.0, "bytes": 0, "checks": 0}


def _uid() -> int:
    """The user that must own the cache (a function so tests can pretend to be someone else)."""
    return os.geteuid()


def _writable(path: Path) -> bool:
    return os.access(path, os.W_OK | os.X_OK)


def _warn_once(message: str) -> None:
    with _LOCK:
        if message in _WARNED:
            return
        _WARNED.add(message)
    warnings.warn(message, CacheWarning, stacklevel=3)


def default_cache_dir() -> Path:
    """Where the cache root is configured to be (not checked: use :func:`cache_root`)."""
    env: Path | None = settings.CACHE_DIR.get()
    if env is not None:
        return env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rlx"


def auth_stats() -> dict[str, float]:
    """Time and bytes spent authenticating cache files in this process (for bench/cache_auth.py)."""
    return dict(_STATS)


# -- directories -----------------------------------------------------------------------------------

def _unsafe_dir(st: os.stat_result, what: str) -> str | None:
    if not stat.S_ISDIR(st.st_mode):
        return f"{what} is not a directory"
    if st.st_uid != _uid():
        return f"{what} is owned by uid {st.st_uid}, not by the current user ({_uid()})"
    if st.st_mode & 0o022:
        return f"{what} is writable by {'others' if st.st_mode & 0o002 else 'its group'} " \
               f"(mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _unsafe_ancestors(path: Path) -> str | None:
    """Someone who can rename entries of a parent can swap the whole cache: every existing parent
    must belong to us or to root, and be writable by others only with the sticky bit (/tmp)."""
    for parent in path.parents:
        try:
            st = os.stat(parent)
        except OSError:
            continue
        if st.st_uid not in (0, _uid()):
            return f"its parent {parent} is owned by uid {st.st_uid}"
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            return f"its parent {parent} is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _load_key(root: Path) -> bytes | str:
    """The root's key (created 0600 atomically on first use), or why it cannot be used."""
    p = root / KEY_FILE
    for _ in range(2):
        try:
            fd = os.open(p, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            # mkstemp creates the file 0600; link() publishes it only if no other process won.
            fd_new, tmp = tempfile.mkstemp(dir=root, prefix=".key-")
            try:
                os.write(fd_new, secrets.token_bytes(KEY_BYTES))
                os.fsync(fd_new)
            finally:
                os.close(fd_new)
            try:
                os.link(tmp, p)
            except FileExistsError:
                pass
            finally:
                os.unlink(tmp)
            continue
        except OSError as e:
            return f"its key {p} cannot be read ({e.strerror})"
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != _uid():
                return f"its key {p} is not a file owned by the current user"
            if st.st_mode & 0o077:
                return f"its key {p} is readable or writable by others (mode {stat.S_IMODE(st.st_mode):o})"
            key = os.read(fd, KEY_BYTES + 1)
        finally:
            os.close(fd)
        if len(key) != KEY_BYTES:
            return f"its key {p} is not {KEY_BYTES} bytes"
        return key
    return f"its key {p} could not be created"


def _check_root(path: str | os.PathLike[str]) -> tuple[Path | None, str | None]:
    p = Path(path).expanduser()
    try:
        p.mkdir(mode=0o700, parents=True, exist_ok=True)
        real = p.resolve()  # a symlinked root (~/.cache on another disk) is checked where it points
        why = _unsafe_dir(os.stat(real), f"{real}") or _unsafe_ancestors(real)
        if why is None and not _writable(real):
            why = f"{real} is read-only"
        if why is None:
            with _LOCK:
                key = _KEYS.get(str(real))
            if key is None:
                got = _load_key(real)
                if isinstance(got, str):
                    why = got
                else:
                    with _LOCK:
                        _KEYS[str(real)] = got
    except OSError as e:
        why = f"{p} cannot be used ({e.strerror or e})"
    return (None, why) if why is not None else (real, None)


def secure_dir(path: str | os.PathLike[str]) -> Path | None:
    """``path`` as an authenticated cache root: created 0700 if missing; None (one
    :class:`CacheWarning`) if it is unsafe (not ours, group/world-writable, an unsafe parent, a
    key others can read) or unusable (read-only, cannot be created)."""
    real, why = _check_root(path)
    if why is not None:
        _warn_once(f"RLX cache disabled, compiling in memory: {why} "
                   f"(set RLX_CACHE_DIR to a private directory, or RLX_NO_CACHE=1 to silence this)")
    return real


def cache_root() -> Path | None:
    """The validated cache root, or None when caching is off (see :func:`secure_dir`)."""
    if settings.NO_CACHE.get():
        return None
    return secure_dir(default_cache_dir())


def cache_subdir(name: str, *, ignore_no_cache: bool = False, about: str | None = None) -> Path | None:
    """``<root>/<name>``, created 0700; None when caching is off or the subdirectory is unsafe
    (a symlink, not ours, writable by others: subdirectories are never followed).
    ``ignore_no_cache``: results rather than a cache (calibration) survive ``RLX_NO_CACHE=1``.
    ``about``: one line saying what the folder holds, for `rlx cache info` (plugins should pass it)."""
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"bad cache subdirectory name {name!r}")
    root = secure_dir(default_cache_dir()) if ignore_no_cache else cache_root()
    if root is None:
        return None
    d = root / name
    try:
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
        st = os.lstat(d)
        why = ("it is a symlink" if stat.S_ISLNK(st.st_mode) else None) or _unsafe_dir(st, str(d))
        if why is None and not _writable(d):
            why = f"{d} is read-only"
    except OSError as e:
        why = f"{d} cannot be used ({e.strerror or e})"
    if why is not None:
        _warn_once(f"RLX cache {name!r} disabled, building in memory: {why}")
        return None
    if about is not None and _read_about(d) != _clean_about(about):
        try:
            (d / ABOUT).write_text(_clean_about(about) + "\n")
        except OSError:
            pass  # only a description: a full disk must not stop the cache
    return d


def _clean_about(text: str) -> str:
    # Shown on a terminal: printable ASCII only, one short line.
    return "".join(c if " " <= c <= "~" else "?" for c in text)[:120].strip()


def _read_about(d: Path) -> str | None:
    p = d / ABOUT
    try:
        st = os.lstat(p)
        if not stat.S_ISREG(st.st_mode) or st.st_size > 1024:
            return None
        return _clean_about(p.read_text(errors="replace").splitlines()[0])
    except (OSError, IndexError):
        return None


# -- authentication -------------------------------------------------------------------------------

def _key_for(path: Path) -> bytes | None:
    """The key of the validated root that holds ``path`` (the longest one: roots may nest in tests)."""
    s = str(path)
    best, key = -1, None
    with _LOCK:
        for root, k in _KEYS.items():
            if (s.startswith(root + os.sep)) and len(root) > best:
                best, key = len(root), k
    return key


def _tag(key: bytes, name: str, chunks: Iterator[bytes] | bytes | memoryview) -> bytes:
    t0 = time.perf_counter()
    h = hmac.new(key, b"rlx-cache-v1\0" + name.encode() + b"\0", hashlib.sha256)
    n = 0
    for c in ([chunks] if isinstance(chunks, (bytes, bytearray, memoryview)) else chunks):
        h.update(c)
        n += len(c)
    _STATS["seconds"] += time.perf_counter() - t0
    _STATS["bytes"] += n
    _STATS["checks"] += 1
    return h.digest()


def _discard(path: Path, why: str) -> None:
    log.debug("cache entry %s discarded (%s); it will be rebuilt", path, why)
    for p in (path, path.with_name(path.name + SIDECAR)):
        try:
            p.unlink()
        except OSError:
            pass


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _write_failed(path: Path, e: OSError) -> None:
    # A full disk or a directory made read-only meanwhile: keep going in memory, say so once.
    _warn_once(f"RLX cache write failed under {path.parent} ({e.strerror or e}); results are not cached")


def write_entry(path: str | os.PathLike[str], data: bytes) -> bool:
    """Write ``data`` atomically with its tag; False (nothing written) if ``path`` is not inside a
    validated cache root or the write fails."""
    p = Path(path)
    key = _key_for(p)
    if key is None:
        return False
    try:
        p.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        _atomic_write(p, MAGIC + _tag(key, p.name, data) + data)
    except OSError as e:
        _write_failed(p, e)
        return False
    return True


def read_entry(path: str | os.PathLike[str]) -> bytes | None:
    """The data of an authenticated entry, or None (missing; or failing, then deleted)."""
    p = Path(path)
    key = _key_for(p)
    if key is None:
        return None
    try:
        with open(p, "rb") as f:
            raw = f.read()
    except OSError:
        return None
    head = len(MAGIC) + TAG_BYTES
    if len(raw) < head or raw[:len(MAGIC)] != MAGIC:
        _discard(p, "not an authenticated entry")
        return None
    data = memoryview(raw)[head:]
    if not hmac.compare_digest(raw[len(MAGIC):head], _tag(key, p.name, data)):
        _discard(p, "authentication failed")
        return None
    return bytes(data)


def _file_chunks(f: Any) -> Iterator[bytes]:
    while chunk := f.read(1 << 20):
        yield chunk


def publish_file(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> bool:
    """Tag ``src``'s content as ``dst`` (sidecar ``dst.mac``), then move ``src`` to ``dst``: a
    reader never sees ``dst`` without its sidecar. False if ``dst`` is outside a validated root
    (``src`` is then left where it is)."""
    s, d = Path(src), Path(dst)
    key = _key_for(d)
    if key is None:
        return False
    try:
        with open(s, "rb") as f:
            tag = _tag(key, d.name, _file_chunks(f))
        _atomic_write(d.with_name(d.name + SIDECAR), tag)
        os.replace(s, d)
    except OSError as e:
        _write_failed(d, e)
        return False
    return True


def seal_file(path: str | os.PathLike[str]) -> bool:
    """Tag a file that is already in place (written by another library, e.g. Numba)."""
    p = Path(path)
    key = _key_for(p)
    if key is None:
        return False
    try:
        with open(p, "rb") as f:
            tag = _tag(key, p.name, _file_chunks(f))
        _atomic_write(p.with_name(p.name + SIDECAR), tag)
    except OSError as e:
        _write_failed(p, e)
        return False
    return True


def _sidecar_ok(p: Path, key: bytes, content: bytes | None) -> bool:
    try:
        want = p.with_name(p.name + SIDECAR).read_bytes()
        if content is None:
            with open(p, "rb") as f:
                got = _tag(key, p.name, _file_chunks(f))
        else:
            got = _tag(key, p.name, content)
    except OSError:
        return False
    return hmac.compare_digest(want, got)


def verify_file(path: str | os.PathLike[str]) -> bool:
    """Does ``path`` exist and match its sidecar? A file that does not is deleted (with the sidecar).
    The caller then loads it from the same path: safe because only the user can write there."""
    p = Path(path)
    key = _key_for(p)
    if key is None or not p.is_file():
        return False
    if _sidecar_ok(p, key, None):
        return True
    _discard(p, "authentication failed")
    return False


def read_sealed(path: str | os.PathLike[str]) -> bytes | None:
    """The content of a file with a sidecar (read once, then checked: no TOCTOU), or None."""
    p = Path(path)
    key = _key_for(p)
    if key is None:
        return None
    try:
        data = p.read_bytes()
    except OSError:
        return None
    if _sidecar_ok(p, key, data):
        return data
    _discard(p, "authentication failed")
    return None


def _tree_files(d: Path) -> dict[str, Path]:
    out = {}
    for f in sorted(d.rglob("*")):
        if f.name != MANIFEST and (f.is_file() or f.is_symlink()):
            out[f.relative_to(d).as_posix()] = f
    return out


def _sha256_file(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for c in _file_chunks(f):
            h.update(c)
    return h.hexdigest()


def seal_tree(work: str | os.PathLike[str], name: str) -> bool:
    """Write an authenticated manifest (every file's sha256) into the build directory ``work``,
    which will be published as ``<...>/<name>`` (the name is bound into the manifest)."""
    w = Path(work)
    t0 = time.perf_counter()
    files = {rel: _sha256_file(f) for rel, f in _tree_files(w).items()}
    _STATS["seconds"] += time.perf_counter() - t0
    return write_entry(w / MANIFEST, json.dumps({"name": name, "files": files}, sort_keys=True).encode())


def verify_tree(d: str | os.PathLike[str]) -> bool:
    """Is directory ``d`` exactly what its manifest says (same files, same bytes, same name)?
    A directory that is not is deleted."""
    p = Path(d)
    if not p.is_dir():
        return False
    raw = read_entry(p / MANIFEST)
    ok = False
    if raw is not None:
        t0 = time.perf_counter()
        try:
            m = json.loads(raw)
            have = _tree_files(p)
            ok = (m.get("name") == p.name and set(have) == set(m["files"])
                  and not any(f.is_symlink() for f in have.values())
                  and all(_sha256_file(have[r]) == h for r, h in m["files"].items()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            ok = False
        _STATS["seconds"] += time.perf_counter() - t0
    if not ok:
        log.debug("cache directory %s discarded (manifest missing or not matching); it will be rebuilt", p)
        shutil.rmtree(p, ignore_errors=True)
    return ok


def describe() -> dict[str, Any]:
    """What `rlx cache info` shows: the root, whether it is safe and keyed, and every subdirectory's
    entries and bytes (sidecars and manifests not counted as entries)."""
    root = default_cache_dir()
    info: dict[str, Any] = {"dir": str(root), "no_cache": settings.NO_CACHE.get(), "safe": False,
                            "authenticated": False, "why": None, "caches": {}}
    if root.is_dir():
        real, why = _check_root(root)
        info["safe"] = info["authenticated"] = real is not None
        info["why"] = why
    else:
        info["why"] = f"{root} does not exist yet (created on first use)"
    names = dict(SUBDIRS)
    if root.is_dir():  # a third-party plugin's cache_subdir() shows up too
        for d in sorted(root.iterdir()):
            if d.is_dir() and not d.is_symlink() and not d.name.startswith(".") and d.name not in names:
                names[d.name] = _read_about(d) or "plugin cache"
    for name, what in names.items():
        d = root / name
        files = [f for f in d.rglob("*") if f.is_file() and not f.is_symlink()] if d.is_dir() else []
        entries = [f for f in files if not f.name.endswith(SIDECAR) and f.name not in (MANIFEST, ABOUT)
                   and not f.name.startswith(".tmp-")]
        info["caches"][name] = {"dir": str(d), "what": what, "entries": len(entries),
                                "bytes": sum(f.stat().st_size for f in files)}
    return info


# -- the compile cache ------------------------------------------------------------------------------

@functools.cache
def source_stamp(package_dir: str) -> str:
    """``"<newest mtime_ns>:<file count>"`` of the ``.py`` files under ``package_dir`` (once a
    process: a few milliseconds for rlx_core's ~100 files)."""
    latest, count = 0, 0
    for p in Path(package_dir).rglob("*.py"):
        try:
            latest = max(latest, p.stat().st_mtime_ns)
        except OSError:
            continue
        count += 1
    return f"{latest}:{count}"


def _package_dir(module_name: str | None) -> str:
    mod = sys.modules.get(module_name or "")
    f = getattr(mod, "__file__", None)
    return str(Path(f).parent) if f else ""


def _no_json(v: Any) -> Any:
    raise TypeError(f"not cacheable: {type(v).__name__}")


_ALIGN = 64


def encode_entry(header: dict[str, Any], consts: dict[str, Any]) -> bytes:
    """``<u64 header length><JSON header><const bytes, 64-aligned>``: the header lists every
    constant's dtype, shape and offset (a safetensors-like layout, no pickle)."""
    import numpy as np

    from .dtypes import DType

    table, blobs, off = {}, [], 0
    for name, v in consts.items():
        a = np.asarray(v)  # (not ascontiguousarray: it turns 0-d constants into 1-d ones)
        pad = -off % _ALIGN
        blobs.append(b"\0" * pad)
        off += pad
        table[name] = {"dtype": DType.parse(a.dtype).value, "shape": list(a.shape), "offset": off,
                       "nbytes": a.nbytes}
        blobs.append(a.tobytes(order="C"))
        off += a.nbytes
    head = json.dumps({**header, "consts": table}, default=_no_json, separators=(",", ":")).encode()
    return b"".join([struct.pack("<Q", len(head)), head, *blobs])


def decode_entry(data: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
    import numpy as np

    from .dtypes import DType

    (n,) = struct.unpack_from("<Q", data)
    header = json.loads(data[8:8 + n])
    base = 8 + n
    consts = {}
    for name, c in header.pop("consts").items():
        dt = DType(c["dtype"]).np
        count = int(np.prod(c["shape"], dtype=np.int64))
        if count * dt.itemsize != c["nbytes"] or base + c["offset"] + c["nbytes"] > len(data):
            raise ValueError(f"constant {name!r} does not fit the entry")
        # copy: aligned and writable like any other weight (consts are small next to the params)
        consts[name] = np.frombuffer(data, dt, count, base + c["offset"]).reshape(c["shape"]).copy()
    return header, consts


class CompileCache:
    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        #: An explicit directory is its own authenticated root (with its own key).
        self._explicit = Path(root) if root is not None else None
        self.hits = 0
        self.misses = 0

    @property
    def root(self) -> Path:
        return self._explicit if self._explicit is not None else default_cache_dir() / "compile"

    def _dir(self) -> Path | None:
        return secure_dir(self._explicit) if self._explicit is not None else cache_subdir("compile")

    def key(self, graph: Graph, backend: Any, device: Any, variant: str = "") -> str:
        h = hashlib.sha256()
        stamps = [source_stamp(d) if d else "" for d in (
            _package_dir(__package__), _package_dir(getattr(backend.plugin, "__name__", None)))]
        for part in (graph.fingerprint, backend.name, backend.entry.distribution, backend.info.version,
                     __version__, API_VERSION, device.name, str(FORMAT), variant, *stamps):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()

    def path(self, key: str, root: Path | None = None) -> Path:
        return (root or self.root) / key[:2] / f"{key}.rlxc"

    def load(self, graph: Graph, backend: Any, device: Any, variant: str = "") -> Legalized | None:
        d = self._dir()
        raw = read_entry(self.path(self.key(graph, backend, device, variant), d)) if d else None
        if raw is None:
            self.misses += 1
            return None
        try:
            data, consts = decode_entry(raw)
            if data.get("format") != FORMAT:
                raise ValueError("old cache format")
            weights = dict(graph.weights)
            weights.update(consts)
            legal_graph = decode_structure(data["structure"], weights)
            assignments = {n: Assignment(backend.claim_by_name(device, c), o, path)
                           for n, (c, o, path) in data["assignments"].items()}
            plans = {n: _plan_from(p) for n, p in data["plans"].items()}
        except Exception as e:  # authentic but stale (an op or claim gone): rebuilt, never trusted
            log.debug("compile cache entry unusable (%s: %s); rebuilding", type(e).__name__, e)
            self.misses += 1
            return None
        self.hits += 1
        legal = Legalized(legal_graph, assignments, plans, tuple(tuple(x) for x in data["outputs"]),
                          backend.name, device.name)
        legal.extra.update(data.get("extra", {}))
        return legal

    def store(self, graph: Graph, backend: Any, device: Any, legal: Legalized, variant: str = "") -> None:
        d = self._dir()
        if d is None:
            return
        orig = set(graph.weights)
        header = {
            "format": FORMAT,
            "structure": legal.graph.structure(),
            "assignments": {n: (a.claim.name, a.origin, a.path) for n, a in legal.assignments.items()},
            "plans": {n: _plan_to(p) for n, p in legal.plans.items()},
            "outputs": [list(x) for x in legal.outputs],
            "extra": {k: legal.extra[k] for k in ("fused", "fused_origins", "kernels") if k in legal.extra},
        }
        try:
            data = encode_entry(header, {k: v for k, v in legal.graph.weights.items() if k not in orig})
        except (TypeError, ValueError) as e:  # something not JSON-able: not cached, still compiled
            log.debug("compile cache: entry not stored (%s)", e)
            return
        write_entry(self.path(self.key(graph, backend, device, variant), d), data)

    def clear(self) -> int:
        n = 0
        if self.root.is_dir():
            for f in self.root.rglob("*"):
                if f.suffix in (".rlxc", ".pkl") and f.is_file():
                    f.unlink(missing_ok=True)
                    n += 1
        return n


class _CachedVariant:
    """Enough of a NodeVariant for the report when it comes from the cache."""

    def __init__(self, op: str, text: str) -> None:
        self.op = op
        self._text = text

    def describe(self) -> str:
        return self._text


def _plan_to(p: Plan) -> dict[str, Any]:
    return {"kind": p.kind, "op": p.variant.op, "variant": p.variant.describe(), "via": p.via,
            "kernels": p.kernels(), "cost": p.cost}


class _CachedPlan:
    def __init__(self, d: dict[str, Any]) -> None:
        self.kind = d["kind"]
        self.variant = _CachedVariant(d["op"], d["variant"])
        self.via = d["via"]
        self._kernels = list(d["kernels"])
        self.cost = float(d["cost"])

    def kernels(self) -> list[str]:
        return self._kernels


def _plan_from(d: dict[str, Any]) -> Any:
    return _CachedPlan(d)


def clear(*, calibration: bool = False) -> dict[str, int]:
    """Delete every cache subdirectory (calibration results only with ``calibration``); the key
    stays. Returns the entries removed per subdirectory (as :func:`describe` counts them)."""
    info = describe()
    removed: dict[str, int] = {}
    for name, c in info["caches"].items():
        if name == "calibration" and not calibration:
            continue
        d = Path(c["dir"])
        try:
            if stat.S_ISDIR(os.lstat(d).st_mode):  # never follow a symlink out of the root
                shutil.rmtree(d)
        except FileNotFoundError:
            pass
        except OSError as e:
            log.debug("could not clear %s: %s", d, e)
        removed[name] = c["entries"]
    return removed
