"""Simulation with Icarus Verilog (iverilog + vvp); Debian packages iverilog (and yosys for synth.py)."""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from .rtl import Design, testbench

APT = "apt-get install iverilog yosys"


class SimulationError(RuntimeError):
    pass


def tool(name: str) -> str | None:
    return shutil.which(name)


def missing_reason() -> str | None:
    missing = [t for t in ("iverilog", "vvp") if tool(t) is None]
    if missing:
        return f"{', '.join(missing)} not found (Debian: {APT})"
    return None


_PRIVATE: list[Path] = []


def _private_dir() -> Path:
    """A per-process 0700 directory (removed at exit) when the cache cannot be used: never a
    shared path such as /tmp/rlx-fpga, where another user could plant a simulation."""
    if not _PRIVATE:
        p = Path(tempfile.mkdtemp(prefix="rlx-fpga-"))
        atexit.register(shutil.rmtree, p, True)
        _PRIVATE.append(p)
    return _PRIVATE[0]


def cache_root() -> Path:
    """The authenticated ``fpga-sim`` cache directory, else a private per-process directory."""
    from rlx_core.plugin import cache_subdir

    return cache_subdir("fpga-sim", about="rlx-fpga Icarus Verilog builds (.vvp)") or _private_dir()


def _cached(root: Path) -> bool:
    return not _PRIVATE or root != _PRIVATE[0]


def write_design(design: Design, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "rlx_top.v").write_text(design.verilog)
    (out / "tb.v").write_text(testbench(design))
    for name, text in design.mem_files.items():
        (out / name).write_text(text)


@dataclasses.dataclass
class SimResult:
    words: np.ndarray          # int64, one per output element
    cycles_total: int
    cycles_busy: int
    first_in: int
    last_in: int
    first_out: int
    seconds: float


def build(design: Design) -> Path:
    """Write and compile the design + testbench (cached by content hash); the directory."""
    why = missing_reason()
    if why:
        raise SimulationError(f"rlx-fpga cannot simulate: {why}")
    h = hashlib.sha256(design.verilog.encode())
    for k in sorted(design.mem_files):
        h.update(k.encode())
        h.update(design.mem_files[k].encode())
    h.update(testbench(design).encode())
    from rlx_core.plugin import seal_tree, verify_tree

    root = cache_root()
    cached = _cached(root)
    d = root / h.hexdigest()[:20]
    # vvp runs sim.vvp and reads the .mem files: the whole directory must match its authenticated
    # manifest (a planted or edited build is deleted and rebuilt). Verify-then-run is race-free
    # only because the cache directory is one only the user can write.
    if (verify_tree(d) if cached else (d / "sim.vvp").exists()):
        return d
    tmp = Path(tempfile.mkdtemp(prefix="build-", dir=root))
    write_design(design, tmp)
    r = subprocess.run(["iverilog", "-g2012", "-o", "sim.vvp", "-s", "tb", "tb.v", "rlx_top.v"], cwd=tmp,
                       capture_output=True, text=True)
    if r.returncode:
        shutil.rmtree(tmp, ignore_errors=True)
        raise SimulationError(f"iverilog failed:\n{r.stderr[-3000:]}")
    if cached:
        seal_tree(tmp, d.name)
    try:
        tmp.rename(d)
    except OSError:  # another process built it first: use theirs if it verifies, else ours
        try:
            if cached and not verify_tree(d):
                tmp.rename(d)
        except OSError:
            pass
        shutil.rmtree(tmp, ignore_errors=True)
    return d


def simulate(d: Path, words: np.ndarray, n_out: int) -> SimResult:
    import time

    with tempfile.TemporaryDirectory(prefix="run-", dir=cache_root()) as run:
        inp = Path(run) / "input.mem"
        outp = Path(run) / "output.hex"
        flat = np.asarray(words, np.int64).reshape(-1)
        inp.write_text("\n".join(format(int(v) & 0xFFFFFFFF, "08x") for v in flat) + "\n")
        t0 = time.perf_counter()
        r = subprocess.run(["vvp", "-n", str(d / "sim.vvp"), f"+in={inp}", f"+out={outp}"], cwd=d,
                           capture_output=True, text=True, timeout=600)
        dt = time.perf_counter() - t0
        if r.returncode or not outp.exists():
            raise SimulationError(f"vvp failed ({r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
        lines = outp.read_text().splitlines()
    vals = [ln for ln in lines if ln and not ln.startswith("#")]
    tail = [ln for ln in lines if ln.startswith("#")]
    if len(vals) != n_out or not tail or "timeout" in tail[-1]:
        raise SimulationError(f"simulation produced {len(vals)} of {n_out} output beats ({tail})")
    nums = [int(x) for x in re.findall(r"-?\d+", tail[-1])]
    u = np.array([int(v, 16) for v in vals], np.int64)
    s = np.where(u >= 2**31, u - 2**32, u)
    return SimResult(s, nums[0], nums[1], nums[2], nums[3], nums[4], dt)
