"""Simulation with Icarus Verilog (iverilog + vvp); Debian packages iverilog (and yosys for synth.py)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
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


def cache_root() -> Path:
    base = os.environ.get("RLX_CACHE_DIR") or os.path.join(tempfile.gettempdir(), "rlx-fpga")
    p = Path(base) / "fpga-sim"
    p.mkdir(parents=True, exist_ok=True)
    return p


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
    d = cache_root() / h.hexdigest()[:20]
    if (d / "sim.vvp").exists():
        return d
    tmp = Path(tempfile.mkdtemp(prefix="build-", dir=cache_root()))
    write_design(design, tmp)
    r = subprocess.run(["iverilog", "-g2012", "-o", "sim.vvp", "-s", "tb", "tb.v", "rlx_top.v"], cwd=tmp,
                       capture_output=True, text=True)
    if r.returncode:
        raise SimulationError(f"iverilog failed:\n{r.stderr[-3000:]}")
    try:
        tmp.rename(d)
    except OSError:  # another process built it first
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
