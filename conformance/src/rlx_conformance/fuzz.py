"""Fuzzing the file formats and the names in them: one harness for CI and for long campaigns.

Targets: the four file loaders (``.rlx``, ``.safetensors``, ``.gguf``, ``.onnx``) and the hostile
names of :mod:`rlx_conformance.hostile` sent through save/load, compile+run on cpu, the ONNX importer
and the exporters (wasm, cortexm, fpga). A *failure* is any of:

* an exception that is not one of the project's own (:class:`rlx_core.errors.RLXError`): a loader
  must turn every malformed input into a message, never a raw ``ValueError``, ``MemoryError`` ...;
* a wrong result: two ways of reading the same bytes disagree (memory-mapped vs read, RLX vs
  gguf-py), a save/load round trip changes the graph, rlx-cpu disagrees with the reference
  interpreter on a graph that loaded, or a hostile name changes a result or creates the marker file;
* a hang: one input takes longer than ``timeout`` seconds.

Everything is deterministic: iteration ``i`` of a campaign with seed ``s`` always builds the same
input, so a failure is reproduced by its (format, seed, iteration) or by the saved input file
(``scripts/fuzz.py --reproduce FILE --format F``). The seed corpus lives in ``tests/fuzz/corpus/<format>/``
and is written by :func:`write_corpus` (``scripts/fuzz.py --make-corpus``).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import random
import signal
import struct
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

FORMATS = ("rlx", "safetensors", "gguf", "onnx")
SUFFIX = {"rlx": ".rlx", "safetensors": ".safetensors", "gguf": ".gguf", "onnx": ".onnx"}

_INTERESTING_INTS = (0, 1, 2, 3, 7, 8, 16, 63, 64, 65, 127, 128, 255, 256, 1023, 4096, 65535, 65536,
                     2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1,
                     -1, -2, -128, -(2**31), -(2**63))
_INTERESTING_BYTES = (0x00, 0x01, 0x7F, 0x80, 0xFF, 0x20, 0x22, 0x5C, 0x7B, 0x7D, 0x2C, 0x3A)


class Hang(BaseException):
    """Raised by the watchdog in the fuzzed code; a BaseException so no ``except Exception`` eats it."""


@dataclass
class Failure:
    target: str
    seed: int
    iteration: int
    kind: str  # "crash", "wrong result", "hang"
    message: str
    data: bytes = field(repr=False, default=b"")
    saved: str | None = None

    def describe(self) -> str:
        where = f" (input saved to {self.saved})" if self.saved else ""
        return (f"[{self.target} seed {self.seed} iteration {self.iteration}] {self.kind}: "
                f"{self.message}{where}")


@dataclass
class Stats:
    target: str
    runs: int = 0
    accepted: int = 0  # inputs the loader accepted (the rest were refused with an RLXError)
    seconds: float = 0.0
    failures: list[Failure] = field(default_factory=list)

    def summary(self) -> str:
        return (f"{self.target}: {self.runs} inputs in {self.seconds:.1f} s, {self.accepted} accepted, "
                f"{len(self.failures)} failures")


class WrongResult(AssertionError):
    pass


# ---------------------------------------------------------------------------------------------
# The watchdog


@contextlib.contextmanager
def watchdog(seconds: float | None) -> Iterator[None]:
    """Raise :class:`Hang` in this (main) thread after ``seconds``; a no-op elsewhere or for None."""
    if not seconds or threading.current_thread() is not threading.main_thread() or \
            not hasattr(signal, "setitimer"):
        yield
        return

    def fire(signum: int, frame: Any) -> None:
        raise Hang(f"did not finish in {seconds:g} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# ---------------------------------------------------------------------------------------------
# Oracles: what "correct" means for an input the loader accepted


def _same_array(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _random_inputs(graph: Any, rng: np.random.Generator) -> dict[str, np.ndarray] | None:
    binds = {s: 2 for s in graph.symbols}
    out: dict[str, np.ndarray] = {}
    total = 0
    for v in graph.inputs:
        shape = tuple(d if isinstance(d, int) else binds.get(d, 2) for d in v.type.shape)
        total += int(np.prod(shape)) if shape else 1
        if total > 4096:
            return None
        dt = v.type.dtype
        kind = np.dtype(dt.np).kind if dt.np is not None else "V"
        if kind == "f":
            a = rng.standard_normal(shape).astype(dt.np)
        elif kind in "iu":
            a = rng.integers(0, 3, shape).astype(dt.np)  # small: valid as indices and as values
        elif kind == "b":
            a = rng.integers(0, 2, shape).astype(bool)
        else:
            return None
        out[v.name] = a
    return out


def run_check(graph: Any, seed: int = 0) -> bool:
    """rlx-cpu agrees with the reference interpreter on random inputs (False: not checked)."""
    from rlx_core.plugin import RLXError, Session, evaluate

    if len(graph.nodes) > 64 or sum(int(np.asarray(w).size) for w in graph.weights.values()) > 1 << 16:
        return False
    graph = graph.specialize({s: 2 for s in graph.symbols}) if graph.symbols else graph
    inputs = _random_inputs(graph, np.random.default_rng(seed))
    if inputs is None:
        return False
    try:
        expect = evaluate(graph, inputs)
    except RLXError:
        expect = None
    try:
        got = Session("cpu", use_cache=False).compile(graph).run(inputs)
    except RLXError:  # refused (an op or variant it lacks): not a wrong result
        return False
    if expect is None:
        return False
    for name, e in expect.items():
        if name not in got:
            raise WrongResult(f"output {name!r} missing from rlx-cpu's results")
        g, e = np.asarray(got[name]), np.asarray(e)
        if g.shape != e.shape:
            raise WrongResult(f"output {name!r}: rlx-cpu shape {g.shape}, reference {e.shape}")
        if e.dtype.kind == "f" or g.dtype.kind == "f":
            g64, e64 = g.astype(np.float64), e.astype(np.float64)
            scale = max(1.0, float(np.nanmax(np.abs(e64[np.isfinite(e64)]), initial=0.0)))
            ok = np.isclose(g64, e64, rtol=1e-3, atol=1e-4 * scale, equal_nan=True)
            if not ok.all():
                i = int(np.argmin(ok.reshape(-1)))
                raise WrongResult(f"output {name!r}: rlx-cpu {g64.reshape(-1)[i]!r}, reference "
                                  f"{e64.reshape(-1)[i]!r} at flat index {i}")
        elif not np.array_equal(g, e):
            raise WrongResult(f"output {name!r}: rlx-cpu and the reference differ")
    return True


def check_safetensors(path: Path, deep: bool = False) -> None:
    from rlx_core.formats.loaders import load_weights
    from rlx_core.formats.safetensors import read_safetensors, read_safetensors_header

    mapped, meta = read_safetensors(path, mmap=True)
    read, meta2 = read_safetensors(path, mmap=False)
    header, meta3 = read_safetensors_header(path)
    if not (meta == meta2 == meta3) or mapped.keys() != read.keys() or set(header) != set(mapped):
        raise WrongResult("the memory-mapped read, the plain read and the header disagree on names or "
                          "metadata")
    for k in mapped:
        if not _same_array(mapped[k], read[k]):
            raise WrongResult(f"tensor {k!r}: the memory-mapped and the plain read differ")
    weights = load_weights(path, format="safetensors")
    if weights.keys() != mapped.keys():
        raise WrongResult("load_weights and read_safetensors disagree on the tensor names")


def check_rlx(path: Path, deep: bool = False) -> None:
    from rlx_core import load, save

    g = load(path)
    again = path.with_name(path.name + ".again.rlx")
    save(g, again)
    g2 = load(again)
    if g2.structure() != g.structure():
        raise WrongResult("save(load(file)) does not load back as the same graph")
    for p in g.params:
        if not _same_array(np.asarray(g.weights[p.name]), np.asarray(g2.weights[p.name])):
            raise WrongResult(f"weight {p.name!r} changed in a save/load round trip")
    if deep:
        run_check(g)


def check_gguf(path: Path, deep: bool = False) -> None:
    from rlx_core.formats.gguf import read_gguf

    f = read_gguf(path)
    arrays = f.arrays(dequantize=True)
    raws = {n: f.tensor(n, dequantize=False) for n in f.tensors}
    if arrays.keys() != raws.keys():
        raise WrongResult("arrays() and tensor() disagree on the tensor names")
    try:  # differential: gguf-py's reader, where it accepts the file too
        import gguf
    except ImportError:
        return
    try:
        with warnings_off():
            ref = {t.name: t for t in gguf.GGUFReader(path).tensors}
    except Exception:
        return  # gguf-py refuses (or crashes on) what RLX accepted; RLX's checks are stricter
    if set(ref) != set(raws):
        raise WrongResult(f"RLX reads tensors {sorted(raws)[:5]}, gguf-py {sorted(ref)[:5]}")
    for name, t in ref.items():
        if np.asarray(t.data).tobytes() != np.ascontiguousarray(raws[name]).tobytes():
            raise WrongResult(f"tensor {name!r}: RLX and gguf-py read different bytes")


@contextlib.contextmanager
def warnings_off() -> Iterator[None]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def check_onnx(path: Path, deep: bool = False) -> None:
    from rlx_core import load_onnx

    g = load_onnx(path)
    if deep:
        run_check(g)


CHECKS: dict[str, Callable[[Path, bool], None]] = {
    "rlx": check_rlx, "safetensors": check_safetensors, "gguf": check_gguf, "onnx": check_onnx}


def run_one(target: str, data: bytes, workdir: Path, *, timeout: float | None = 10.0,
            deep: bool = False) -> tuple[str, str] | None:
    """Run one input. None: accepted or refused with an RLXError; else ``(kind, message)``."""
    from rlx_core.plugin import RLXError

    path = workdir / f"input{SUFFIX[target]}"
    path.write_bytes(data)
    try:
        with watchdog(timeout), warnings_off():
            CHECKS[target](path, deep)
    except RLXError:
        return None
    except WrongResult as e:
        return "wrong result", str(e)
    except Hang as e:
        return "hang", str(e)
    except (Exception, SystemExit) as e:
        tb = traceback.extract_tb(e.__traceback__)
        at = f" at {tb[-1].filename}:{tb[-1].lineno}" if tb else ""
        return "crash", f"{type(e).__name__}: {str(e)[:300]}{at}"
    finally:
        for p in workdir.glob("input*"):
            with contextlib.suppress(OSError):
                p.unlink()
    return "accepted", ""


# ---------------------------------------------------------------------------------------------
# Mutators


def _flip_bit(rng: random.Random, b: bytearray) -> None:
    if b:
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)


def _set_byte(rng: random.Random, b: bytearray) -> None:
    if b:
        v = rng.choice(_INTERESTING_BYTES) if rng.random() < 0.7 else rng.randrange(256)
        b[rng.randrange(len(b))] = v


def _set_int(rng: random.Random, b: bytearray) -> None:
    size = rng.choice((4, 8))
    if len(b) < size:
        return
    # Aligned offsets hit length and count fields of binary headers far more often.
    i = rng.randrange(0, len(b) - size + 1)
    i -= i % size if rng.random() < 0.7 else 0
    v = rng.choice(_INTERESTING_INTS) % (1 << (8 * size))
    b[i:i + size] = v.to_bytes(size, "little")


def _insert(rng: random.Random, b: bytearray) -> None:
    i = rng.randrange(len(b) + 1)
    b[i:i] = bytes(rng.randrange(256) for _ in range(rng.choice((1, 2, 4, 8, 17))))


def _delete(rng: random.Random, b: bytearray) -> None:
    if b:
        i = rng.randrange(len(b))
        del b[i:i + rng.choice((1, 2, 4, 8, 64))]


def _truncate(rng: random.Random, b: bytearray) -> None:
    if b:
        del b[rng.randrange(len(b)):]


def _duplicate(rng: random.Random, b: bytearray) -> None:
    if b:
        i = rng.randrange(len(b))
        j = min(len(b), i + rng.choice((4, 16, 64, 256)))
        k = rng.randrange(len(b) + 1)
        b[k:k] = b[i:j]


BYTE_MUTATORS = (_flip_bit, _set_byte, _set_int, _insert, _delete, _truncate, _duplicate)


def _hostile(rng: random.Random) -> str:
    from rlx_conformance.hostile import hostile_names

    return rng.choice(hostile_names())


def _random_value(rng: random.Random, old: Any) -> Any:
    r = rng.random()
    if r < 0.35:
        return rng.choice(_INTERESTING_INTS)
    if r < 0.45:
        return rng.choice((0.5, -0.0, 1e308, -1e308, 3.4e38, 1e-45))
    if r < 0.55:
        return _hostile(rng)
    if r < 0.62:
        return rng.choice(("", "f32", "i64", "bf16", "F8_E4M3", "add", "matmul", "gather", "nan", "inf",
                           "int4", "bool", "BOOL", "F16"))
    if r < 0.7:
        return rng.choice((None, True, False))
    if r < 0.8:
        n = rng.randrange(0, 70) if rng.random() < 0.5 else 0
        return [rng.choice(_INTERESTING_INTS) for _ in range(n)]
    if r < 0.85:
        return {}
    if isinstance(old, list) and old:
        return old + old if rng.random() < 0.5 else old[1:]
    if isinstance(old, int) and not isinstance(old, bool):
        return old + rng.choice((-1, 1, 2**32))
    return {"float": rng.choice(("nan", "inf", "-inf", "x"))}


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, (*prefix, i))


def mutate_json(rng: random.Random, obj: Any) -> Any:
    """Replace, delete or duplicate one value anywhere in a JSON document (a copy is returned)."""
    obj = json.loads(json.dumps(obj))
    paths = [p for p in _paths(obj) if p]
    if not paths:
        return _random_value(rng, obj)
    path = rng.choice(paths)
    parent = obj
    for k in path[:-1]:
        parent = parent[k]
    key = path[-1]
    r = rng.random()
    if r < 0.15 and isinstance(parent, dict):
        del parent[key]
    elif r < 0.25 and isinstance(parent, dict):
        parent[_hostile(rng) if rng.random() < 0.5 else "extra"] = parent[key]
    elif r < 0.3 and isinstance(parent, list):
        parent.insert(key, parent[key])
    else:
        parent[key] = _random_value(rng, parent[key])
    return obj


def _split_safetensors(data: bytes) -> tuple[dict[str, Any], bytes] | None:
    if len(data) < 8:
        return None
    (n,) = struct.unpack_from("<Q", data)
    try:
        header = json.loads(data[8:8 + n])
    except (ValueError, UnicodeDecodeError):
        return None
    return (header, data[8 + n:]) if isinstance(header, dict) else None


def _join_safetensors(header: Any, body: bytes) -> bytes:
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    return struct.pack("<Q", len(raw)) + raw + body


def mutate_safetensors_header(rng: random.Random, data: bytes, *, rlx: bool) -> bytes:
    """Structure-aware: mutate the JSON header (and, for .rlx, the graph JSON inside its metadata)."""
    split = _split_safetensors(data)
    if split is None:
        return data
    header, body = split
    meta = header.get("__metadata__")
    if rlx and isinstance(meta, dict) and isinstance(meta.get("graph"), str) and rng.random() < 0.75:
        try:
            graph = json.loads(meta["graph"])
        except ValueError:
            graph = None
        if graph is not None:
            meta["graph"] = json.dumps(mutate_json(rng, graph), separators=(",", ":"), sort_keys=True,
                                       ensure_ascii=False)
            return _join_safetensors(header, body)
    return _join_safetensors(mutate_json(rng, header), body)


def mutate_onnx(rng: random.Random, data: bytes) -> bytes:
    """Structure-aware: change one field anywhere in the ModelProto through protobuf reflection."""
    import onnx
    from google.protobuf.descriptor import FieldDescriptor as F

    m = onnx.ModelProto()
    try:
        m.ParseFromString(data)
    except Exception:
        return data
    sites: list[tuple[Any, Any]] = []

    def repeated(fd: Any) -> bool:  # protobuf >= 5 has is_repeated; older ones only label
        rep = getattr(fd, "is_repeated", None)
        return bool(rep) if rep is not None else fd.label == F.LABEL_REPEATED

    def walk(msg: Any, depth: int) -> None:
        if depth > 8:
            return
        for fd in msg.DESCRIPTOR.fields:
            sites.append((msg, fd))
            if fd.type == F.TYPE_MESSAGE:
                if repeated(fd):
                    for sub in getattr(msg, fd.name):
                        walk(sub, depth + 1)
                elif msg.HasField(fd.name):
                    walk(getattr(msg, fd.name), depth + 1)

    walk(m, 0)
    msg, fd = rng.choice(sites)
    value = getattr(msg, fd.name)
    if repeated(fd):
        n = len(value)
        r = rng.random()
        if n and r < 0.3:
            del value[rng.randrange(n)]
        elif n and r < 0.5 and fd.type != F.TYPE_MESSAGE:
            value.append(value[rng.randrange(n)])
        elif n and fd.type == F.TYPE_MESSAGE:
            value.add().CopyFrom(value[rng.randrange(n)])
        elif fd.type != F.TYPE_MESSAGE:
            with contextlib.suppress(Exception):
                value.append(_scalar_for(rng, fd))
        if n and fd.type != F.TYPE_MESSAGE and rng.random() < 0.5:
            with contextlib.suppress(Exception):
                value[rng.randrange(len(value))] = _scalar_for(rng, fd)
    elif fd.type == F.TYPE_MESSAGE:
        if rng.random() < 0.5:
            msg.ClearField(fd.name)
    else:
        with contextlib.suppress(Exception):
            setattr(msg, fd.name, _scalar_for(rng, fd))
    try:
        return m.SerializeToString()
    except Exception:
        return data


def _scalar_for(rng: random.Random, fd: Any) -> Any:
    from google.protobuf.descriptor import FieldDescriptor as F

    t = fd.type
    if t == F.TYPE_STRING:
        return rng.choice(("", "Add", "MatMul", "Gather", "Reshape", "Constant", "x", "y", "onnx.ai",
                           "com.microsoft", _hostile(rng)))
    if t == F.TYPE_BYTES:
        return bytes(rng.randrange(256) for _ in range(rng.choice((0, 1, 3, 4, 8, 16, 64))))
    if t in (F.TYPE_FLOAT, F.TYPE_DOUBLE):
        return rng.choice((0.0, -1.0, 1e30, float("nan"), float("inf"), 0.5))
    if t == F.TYPE_BOOL:
        return rng.random() < 0.5
    if t == F.TYPE_ENUM:
        return rng.choice(list(fd.enum_type.values_by_number))
    bits = 64 if t in (F.TYPE_INT64, F.TYPE_UINT64, F.TYPE_SINT64, F.TYPE_FIXED64, F.TYPE_SFIXED64) else 32
    signed = t not in (F.TYPE_UINT32, F.TYPE_UINT64, F.TYPE_FIXED32, F.TYPE_FIXED64)
    v = rng.choice(_INTERESTING_INTS + (4, 5, 6, 10, 13, 21, 22))
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    return min(max(v, lo), hi)


def mutate(target: str, rng: random.Random, data: bytes, corpus: Sequence[bytes]) -> bytes:
    """One to four stacked mutations, structure-aware about half of the time."""
    for _ in range(rng.choice((1, 1, 2, 3, 4))):
        r = rng.random()
        if r < 0.5 and target in ("rlx", "safetensors"):
            data = mutate_safetensors_header(rng, data, rlx=target == "rlx")
        elif r < 0.5 and target == "onnx":
            data = mutate_onnx(rng, data)
        elif r < 0.55 and len(corpus) > 1:  # splice: the head of this file, the tail of another
            other = rng.choice(corpus)
            data = data[:rng.randrange(len(data) + 1)] + other[rng.randrange(len(other) + 1):]
        else:
            b = bytearray(data)
            rng.choice(BYTE_MUTATORS)(rng, b)
            data = bytes(b)
        if len(data) > 1 << 20:
            data = data[:1 << 20]
    return data


# ---------------------------------------------------------------------------------------------
# Campaigns


def corpus_files(corpus_dir: Path) -> list[Path]:
    return sorted(p for p in corpus_dir.iterdir() if p.is_file() and not p.name.startswith("."))


def campaign(target: str, corpus_dir: Path, *, seed: int = 0, iterations: int | None = None,
             seconds: float | None = None, timeout: float | None = 10.0, deep_every: int = 0,
             workdir: Path | None = None, save_dir: Path | None = None,
             progress: Callable[[Stats], None] | None = None) -> Stats:
    """Run the corpus as is, then mutants until ``iterations`` or ``seconds`` run out.

    ``deep_every``: every n-th accepted graph is also compiled and run on cpu against the reference
    interpreter (0: never). ``save_dir``: failing inputs are written there.
    """
    if iterations is None and seconds is None:
        raise ValueError("give iterations or seconds")
    files = corpus_files(corpus_dir)
    if not files:
        raise FileNotFoundError(f"no seed corpus in {corpus_dir}; run scripts/fuzz.py --make-corpus")
    corpus = [p.read_bytes() for p in files]
    stats = Stats(target)
    t0 = time.monotonic()
    with contextlib.ExitStack() as stack:
        wd = workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rlx-fuzz-")))
        wd.mkdir(parents=True, exist_ok=True)

        def record(i: int, data: bytes, deep: bool) -> None:
            out = run_one(target, data, wd, timeout=timeout, deep=deep)
            stats.runs += 1
            if out is None:
                return
            kind, msg = out
            if kind == "accepted":
                stats.accepted += 1
                return
            f = Failure(target, seed, i, kind, msg, data)
            if save_dir is not None:
                save_dir.mkdir(parents=True, exist_ok=True)
                p = save_dir / f"{target}-seed{seed}-it{i}{SUFFIX[target]}"
                p.write_bytes(data)
                f.saved = str(p)
            stats.failures.append(f)

        for i, data in enumerate(corpus):  # iterations -1 - i: the seeds themselves, deep-checked
            record(-1 - i, data, deep_every > 0)
        i = 0
        while (iterations is None or i < iterations) and (seconds is None or time.monotonic() - t0 < seconds):
            rng = random.Random(f"{target}:{seed}:{i}")
            base = rng.randrange(len(corpus))
            data = mutate(target, rng, corpus[base], corpus)
            record(i, data, bool(deep_every) and i % deep_every == 0)
            i += 1
            if progress is not None and i % 100 == 0:
                stats.seconds = time.monotonic() - t0
                progress(stats)
    stats.seconds = time.monotonic() - t0
    return stats


def reproduce(target: str, path: Path, *, deep: bool = True, timeout: float | None = 60.0) -> tuple[str, str]:
    """Run one saved input; ``("accepted" | "refused" | kind, message)``."""
    with tempfile.TemporaryDirectory(prefix="rlx-fuzz-") as wd:
        out = run_one(target, path.read_bytes(), Path(wd), timeout=timeout, deep=deep)
    return out if out is not None else ("refused", "an RLXError, as it should be")


# ---------------------------------------------------------------------------------------------
# Hostile names through every path


def _names(base: str, i: int) -> dict[str, str]:
    # Distinct per role (a graph's names must differ), each still carrying the whole payload.
    return {"graph": base, "input": base, "param": f"{base}#w{i}", "node": f"{base}#n{i}",
            "output": f"{base}#y{i}"}


def names_graph(base: str, i: int) -> Any:
    from rlx_core.plugin import GraphBuilder

    n = _names(base, i)
    g = GraphBuilder(n["graph"])
    x = g.input(n["input"], "f32", (4,))
    w = g.param(n["param"], np.arange(4, dtype=np.float32))
    g.output(g.op("add", x, w, name=n["node"]), n["output"])
    return g.build()


def names_int8_graph(base: str, i: int) -> Any:
    from rlx_core.plugin import GraphBuilder, register_quant_ops

    register_quant_ops()  # the graph uses the INT8 ops

    n = _names(base, i)
    rng = np.random.default_rng(i)
    g = GraphBuilder(n["graph"])
    x = g.input(n["input"], "i8", (1, 8))
    w = g.param(n["param"], rng.integers(-127, 128, (4, 8)).astype(np.int8))
    b = g.param(f"{n['param']}b", rng.integers(-50, 50, (4,)).astype(np.int32))
    acc = g.op("matmul_i8", x, w, b, x_zero_point=0, name=n["node"])
    m = g.param(f"{n['param']}m", np.full((4,), 1 << 30, np.int32))
    s = g.param(f"{n['param']}s", np.full((4,), -7, np.int32))
    g.output(g.op("requantize", acc, m, s, zero_point=0, name=f"{n['node']}q"), n["output"])
    return g.build()


def names_onnx(base: str, i: int) -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    n = _names(base, i)
    node = helper.make_node("Add", [n["input"], n["param"]], [n["output"]], name=n["node"])
    graph = helper.make_graph(
        [node], n["graph"], [helper.make_tensor_value_info(n["input"], TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info(n["output"], TensorProto.FLOAT, [4])],
        [numpy_helper.from_array(np.arange(4, dtype=np.float32), n["param"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name=base)
    model.ir_version = 8
    return model.SerializeToString()


NAME_PATHS = ("rlx", "cpu", "onnx", "wasm", "cortexm", "fpga")


def _name_path(path: str, base: str, i: int, wd: Path) -> None:
    from rlx_core import load, save
    from rlx_core.plugin import Session

    x = np.array([1.0, -2.0, 0.5, 3.0], np.float32)
    expect = x + np.arange(4, dtype=np.float32)
    if path == "rlx":
        g = names_graph(base, i)
        save(g, wd / "m.rlx")
        g2 = load(wd / "m.rlx")
        if g2.structure() != g.structure():
            raise WrongResult("the names did not survive a save/load round trip")
    elif path in ("cpu", "onnx"):
        if path == "cpu":
            g = names_graph(base, i)
        else:
            from rlx_core import load_onnx

            g = load_onnx(names_onnx(base, i))
        out = Session("cpu").compile(g).run({g.inputs[0].name: x})
        got = list(out.values())
        if len(got) != 1 or not np.array_equal(np.asarray(got[0]), expect):
            raise WrongResult(f"x + w gave {got}")
    elif path == "wasm":
        from rlx_wasm.export import export_wasm

        export_wasm(names_graph(base, i), wd / "wasm")
    elif path == "cortexm":
        from rlx_cortexm.export import export_graph

        export_graph(names_graph(base, i), wd / "cortexm")
    elif path == "fpga":
        from rlx_fpga.export import export_graph as fpga_export

        fpga_export(names_int8_graph(base, i), wd / "fpga", parallel=2)
    else:
        raise ValueError(path)


def names_campaign(names: Sequence[str] | None = None, paths: Sequence[str] = NAME_PATHS, *,
                   timeout: float | None = 30.0, workdir: Path | None = None) -> Stats:
    """Every hostile name as every kind of name, through each path; the marker file must never appear."""
    from rlx_conformance.hostile import MARKER, hostile_names
    from rlx_core.plugin import RLXError

    names = list(hostile_names() if names is None else names)
    stats = Stats("names")
    t0 = time.monotonic()
    with contextlib.ExitStack() as stack:
        root = workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rlx-fuzz-names-")))
        for i, base in enumerate(names):
            for path in paths:
                wd = root / f"{path}-{i}"
                wd.mkdir(parents=True, exist_ok=True)
                stats.runs += 1
                problem: tuple[str, str] | None = None
                try:
                    with watchdog(timeout), warnings_off():
                        _name_path(path, base, i, wd)
                    stats.accepted += 1
                except RLXError:
                    pass
                except WrongResult as e:
                    problem = ("wrong result", str(e))
                except Hang as e:
                    problem = ("hang", str(e))
                except (Exception, SystemExit) as e:
                    tb = traceback.extract_tb(e.__traceback__)
                    at = f" at {tb[-1].filename}:{tb[-1].lineno}" if tb else ""
                    problem = ("crash", f"{type(e).__name__}: {str(e)[:300]}{at}")
                planted = [str(p) for p in (*root.rglob(MARKER), Path.cwd() / MARKER) if p.exists()]
                if planted:
                    problem = ("wrong result", f"a name created {planted[0]}: code injection")
                if problem is not None:
                    stats.failures.append(Failure(f"names/{path}", 0, i, problem[0],
                                                  f"{problem[1]} (name {base[:60]!r})", base.encode()))
    stats.seconds = time.monotonic() - t0
    return stats


# ---------------------------------------------------------------------------------------------
# The seed corpus


def _corpus_rlx() -> dict[str, bytes]:
    from rlx_core.plugin import GraphBuilder, register_quant_ops

    register_quant_ops()  # the graph uses the INT8 ops
    from rlx_core import save

    out: dict[str, Any] = {}
    g = GraphBuilder("add")
    x = g.input("x", "f32", (4,))
    g.output(g.op("add", x, g.param("w", np.arange(4, dtype=np.float32)), name="y"))
    out["add"] = g.build()

    g = GraphBuilder("mlp")
    x = g.input("x", "f32", ("batch", 8))
    h = g.op("matmul", x, g.param("w1", np.linspace(-1, 1, 32, dtype=np.float32).reshape(8, 4)))
    h = g.op("relu", g.op("add", h, g.param("b1", np.full(4, 0.1, np.float32))))
    g.output(g.op("softmax", h, axis=-1), "probs")
    out["mlp"] = g.build()

    g = GraphBuilder("gather")
    ids = g.input("ids", "i64", (3,))
    emb = g.param("emb", np.arange(12, dtype=np.float32).reshape(4, 3))
    g.output(g.op("gather", emb, ids, axis=0), "rows")
    out["gather"] = g.build()

    g = GraphBuilder("mixed")
    x = g.input("x", "f16", (2, 3))
    y = g.op("cast", x, to="f32")
    z = g.op("reduce_sum", y, axes=(1,), keepdims=True)
    g.output(g.op("mul", z, g.const(2.0, "f32")), "z")
    out["mixed"] = g.build()

    g = GraphBuilder("int8")
    xi = g.input("x", "i8", (1, 8))
    acc = g.op("matmul_i8", xi, g.param("w", (np.arange(32) % 7 - 3).astype(np.int8).reshape(4, 8)),
               g.param("b", np.arange(4, dtype=np.int32)), x_zero_point=0)
    g.output(g.op("requantize", acc, g.param("m", np.full(4, 1 << 30, np.int32)),
                  g.param("s", np.full(4, -7, np.int32)), zero_point=0), "y")
    out["int8"] = g.build()

    files: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as d:
        for name, graph in out.items():
            p = Path(d) / f"{name}.rlx"
            save(graph, p)
            files[f"{name}.rlx"] = p.read_bytes()
    return files


def _corpus_safetensors() -> dict[str, bytes]:
    import ml_dtypes

    from rlx_core.formats.safetensors import write_safetensors

    sets: dict[str, dict[str, np.ndarray]] = {
        "floats": {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "h": np.ones(3, np.float16),
                   "b": np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16), "d": np.array(3.0)},
        "ints": {"i8": np.arange(-3, 3, dtype=np.int8), "u8": np.arange(4, dtype=np.uint8),
                 "i64": np.array([[1, -1]], np.int64), "flags": np.array([True, False, True])},
        "empty": {"none": np.zeros((0, 3), np.float32), "scalar": np.array(7, np.int32)},
    }
    files: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as d:
        for name, tensors in sets.items():
            p = Path(d) / f"{name}.safetensors"
            write_safetensors(p, tensors, {"note": name} if name != "empty" else None)
            files[f"{name}.safetensors"] = p.read_bytes()
    return files


def _corpus_gguf() -> dict[str, bytes]:
    import gguf

    files: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as d:
        for name in ("plain", "quant", "meta"):
            p = Path(d) / f"{name}.gguf"
            w = gguf.GGUFWriter(p, "llama")
            if name == "plain":
                w.add_tensor("w", np.arange(8, dtype=np.float32).reshape(2, 4))
                w.add_tensor("h", np.ones(4, np.float16))
                w.add_tensor("i", np.arange(3, dtype=np.int32))
            elif name == "quant":
                x = np.linspace(-2, 2, 64, dtype=np.float32).reshape(2, 32)
                w.add_tensor("q8", gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0),
                             raw_dtype=gguf.GGMLQuantizationType.Q8_0)
                w.add_tensor("q4", gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q4_0),
                             raw_dtype=gguf.GGMLQuantizationType.Q4_0)
            else:
                w.add_custom_alignment(64)
                w.add_string("general.name", "fuzz seed")
                w.add_array("tokenizer.ggml.tokens", ["a", "b", "<s>"])
                w.add_uint32("llama.block_count", 1)
                w.add_float32("llama.rope.freq_base", 10000.0)
                w.add_bool("flag", True)
                w.add_tensor("bf", np.arange(4, dtype=np.float32))
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_tensors_to_file()
            w.close()
            files[f"{name}.gguf"] = p.read_bytes()
    return files


def _corpus_onnx() -> dict[str, bytes]:
    from onnx import TensorProto, helper, numpy_helper

    def model(name: str, nodes: list[Any], inputs: list[Any], outputs: list[Any],
              inits: Sequence[tuple[str, np.ndarray]] = ()) -> bytes:
        g = helper.make_graph(nodes, name, inputs, outputs, [numpy_helper.from_array(a, n) for n, a in inits])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="rlx-fuzz")
        m.ir_version = 8
        return m.SerializeToString()

    f = TensorProto.FLOAT
    vi = helper.make_tensor_value_info
    files = {
        "add.onnx": model("add", [helper.make_node("Add", ["x", "w"], ["y"])], [vi("x", f, [2, 3])],
                          [vi("y", f, [2, 3])], [("w", np.ones((2, 3), np.float32))]),
        "linear.onnx": model("linear", [helper.make_node("MatMul", ["x", "w"], ["h"]),
                                        helper.make_node("Add", ["h", "b"], ["z"]),
                                        helper.make_node("Relu", ["z"], ["y"])],
                             [vi("x", f, ["batch", 4])], [vi("y", f, ["batch", 2])],
                             [("w", np.linspace(-1, 1, 8, dtype=np.float32).reshape(4, 2)),
                              ("b", np.array([0.1, -0.1], np.float32))]),
        "reshape.onnx": model("reshape", [
            helper.make_node("Constant", [], ["shape"],
                             value=numpy_helper.from_array(np.array([3, 2], np.int64))),
            helper.make_node("Reshape", ["x", "shape"], ["r"]),
            helper.make_node("ReduceSum", ["r", "axes"], ["y"], keepdims=1)],
            [vi("x", f, [2, 3])], [vi("y", f, [3, 1])], [("axes", np.array([1], np.int64))]),
        "gather.onnx": model("gather", [helper.make_node("Gather", ["emb", "ids"], ["y"], axis=0),
                                        ],
                             [vi("ids", TensorProto.INT64, [3])], [vi("y", f, [3, 2])],
                             [("emb", np.arange(8, dtype=np.float32).reshape(4, 2))]),
        "conv.onnx": model("conv", [helper.make_node("Conv", ["x", "k"], ["c"], pads=[1, 1, 1, 1]),
                                    helper.make_node("Softmax", ["c"], ["y"], axis=-1)],
                           [vi("x", f, [1, 1, 4, 4])], [vi("y", f, [1, 2, 4, 4])],
                           [("k", np.linspace(-1, 1, 18, dtype=np.float32).reshape(2, 1, 3, 3))]),
    }
    return files


CORPUS_MAKERS: dict[str, Callable[[], dict[str, bytes]]] = {
    "rlx": _corpus_rlx, "safetensors": _corpus_safetensors, "gguf": _corpus_gguf, "onnx": _corpus_onnx}


def write_corpus(root: Path, formats: Sequence[str] = FORMATS) -> list[Path]:
    """Write the seed corpus under ``root/<format>/`` (deterministic: same bytes for the same versions)."""
    written = []
    for fmt in formats:
        d = root / fmt
        d.mkdir(parents=True, exist_ok=True)
        for name, data in sorted(CORPUS_MAKERS[fmt]().items()):
            (d / name).write_bytes(data)
            written.append(d / name)
    return written


def atheris_main(target: str, corpus_dir: Path, argv: Sequence[str]) -> None:  # pragma: no cover
    """Coverage-guided fuzzing with atheris (``pip install atheris``), seeded with the corpus."""
    import sys

    import atheris

    with atheris.instrument_imports():
        for module in ("rlx_core.formats.gguf", "rlx_core.formats.safetensors", "rlx_core.ir.serialize",
                       "rlx_core.frontends.onnx"):
            importlib.import_module(module)
    wd = Path(tempfile.mkdtemp(prefix="rlx-atheris-"))

    def one(data: bytes) -> None:
        out = run_one(target, data, wd, timeout=None, deep=False)
        if out is not None and out[0] != "accepted":
            raise RuntimeError(f"{out[0]}: {out[1]}")

    atheris.Setup([sys.argv[0], *argv, str(corpus_dir)], one)
    atheris.Fuzz()


__all__ = ["CHECKS", "FORMATS", "Failure", "Stats", "campaign", "names_campaign", "reproduce", "run_check",
           "run_one", "write_corpus"]
