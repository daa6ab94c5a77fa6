"""Kernel source -> binary, once per machine: memoised in the process, cached on disk, authenticated.

A backend subclasses :class:`Compiler` with its tool (``build``) and says what identifies the tool
(``identity``: version, flags, headers). The cache key is dialect + identity + source, so a new
compiler or header never reuses an old binary. Two result kinds, as the device APIs need them:

* a blob (:meth:`Compiler.compile`: SPIR-V, PTX, a Metal library): stored with
  :func:`~rlx_core.cache.write_entry` and read back with :func:`~rlx_core.cache.read_entry`, which
  authenticates it (a tampered or planted entry is deleted and rebuilt);
* a file the OS must load from a path (:meth:`Compiler.load`: a shared library for ``dlopen``):
  published with :func:`~rlx_core.cache.publish_file` and loaded only after
  :func:`~rlx_core.cache.verify_file` matched its sidecar.

With caching off (``RLX_NO_CACHE=1``, or an unsafe cache directory) both still work, in memory or
from a private temporary directory.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..errors import IRError


@lru_cache(maxsize=32)
def tool_version(exe: str, flag: str = "--version") -> str:
    """The first lines of ``exe --version`` (part of a cache key; "" when it cannot be run)."""
    try:
        r = subprocess.run([exe, flag], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""
    return "\n".join((r.stdout or r.stderr).splitlines()[:2])


class Compiler:
    """One backend's kernel compiler. Subclasses set the class fields and implement :meth:`build`
    (and :meth:`identity`; :meth:`link` for a file result)."""

    #: the dialect the sources are in (part of the key)
    dialect: str = ""
    #: the cache subdirectory (``rlx cache info`` lists it with ``about``); None: memory only
    cache_name: str | None = None
    about: str = ""
    #: the file name suffix of a built binary (".spv", ".so")
    suffix: str = ".bin"
    #: what one build failure is reported as (``IRError`` with this prefix)
    label: str = "the kernel compiler"

    def __init__(self) -> None:
        self._memo: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._identity: str | None = None

    # -- what a backend implements ----------------------------------------------------------------
    def identity(self) -> str:
        """What identifies the tool and its settings (version, flags, header text): part of the key."""
        return ""

    def build(self, source: str, out: Path) -> None:
        """Compile ``source`` into the file ``out`` (its directory is private and temporary); raise
        :class:`~rlx_core.errors.IRError` (what the tool said) on failure."""
        raise NotImplementedError

    def link(self, path: Path) -> Any:
        """Load a built file (``ctypes.CDLL`` for a shared library); used by :meth:`load` only."""
        return path.read_bytes()

    # -- provided ---------------------------------------------------------------------------------
    def key(self, source: str) -> str:
        if self._identity is None:
            self._identity = self.identity()
        h = hashlib.sha256(f"{self.dialect}\0{self._identity}\0".encode())
        h.update(source.encode())
        return h.hexdigest()[:32]

    def cache_dir(self) -> Path | None:
        if self.cache_name is None:
            return None
        from ..cache import cache_subdir

        return cache_subdir(self.cache_name, about=self.about or None)

    def forget(self) -> None:
        """Drop the in-process memo (the disk cache stays): the next use re-reads and re-checks it."""
        with self._lock:
            self._memo.clear()

    def _remembered(self, key: str) -> Any:
        with self._lock:
            return self._memo.get(key)

    def _remember(self, key: str, value: Any) -> Any:
        with self._lock:
            return self._memo.setdefault(key, value)

    def compile(self, source: str) -> bytes:
        """The binary of ``source`` as bytes (memo, else the authenticated disk entry, else built)."""
        from ..cache import read_entry, write_entry

        key = self.key(source)
        hit = self._remembered(key)
        if hit is not None:
            return hit
        d = self.cache_dir()
        path = d / f"{key}{self.suffix}" if d is not None else None
        data = read_entry(path) if path is not None else None
        if data is None:
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / f"k{self.suffix}"
                self.build(source, out)
                data = out.read_bytes()
            if path is not None:
                write_entry(path, data)
        return self._remember(key, data)

    def load(self, source: str) -> Any:
        """``link`` of the built file of ``source``: loaded from the cache only after its sidecar
        matched (a planted or edited file is deleted and rebuilt); race-free because only the user
        can write the cache directory."""
        from ..cache import publish_file, verify_file

        key = self.key(source)
        hit = self._remembered(key)
        if hit is not None:
            return hit
        d = self.cache_dir()
        path = d / f"k_{key}{self.suffix}" if d is not None else None
        if path is None or not verify_file(path):
            with tempfile.TemporaryDirectory(dir=d) as tmp:
                out = Path(tmp) / f"k{self.suffix}"
                self.build(source, out)
                if path is None or not publish_file(out, path):
                    # no cache: loaded from the private temporary directory (still mapped after it goes)
                    return self._remember(key, self.link(out))
        return self._remember(key, self.link(path))

    def load_all(self, sources: Sequence[str], *, blob: bool = False) -> dict[str, Any]:
        """:meth:`load` (or :meth:`compile` with ``blob``) of each distinct source; the missing ones
        are built in parallel (compilers are separate processes)."""
        fn = self.compile if blob else self.load
        uniq = list(dict.fromkeys(sources))
        if len(uniq) <= 1:
            return {s: fn(s) for s in uniq}
        with ThreadPoolExecutor(max_workers=min(len(uniq), os.cpu_count() or 2)) as ex:
            return dict(zip(uniq, ex.map(fn, uniq)))

    def run_tool(self, argv: Sequence[str], source: str) -> None:
        """Run one compiler command; its failure is an IRError quoting the tool's output."""
        r = subprocess.run(list(argv), capture_output=True, text=True)
        if r.returncode != 0:
            raise IRError(f"{self.label} rejected a generated kernel:\n{(r.stdout + r.stderr)[-2000:]}",
                          where=f"{self.dialect} kernel {hashlib.sha256(source.encode()).hexdigest()[:12]}",
                          fix="report this bug with the kernel source (RLX_DISPATCH_REPORT=1 names the node)")
