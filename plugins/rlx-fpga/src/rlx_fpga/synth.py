"""Resource estimates with yosys: ``synth_ice40`` and ``synth_xilinx``, parsed from ``stat``.

:func:`synthesize` runs yosys on a written design directory and returns a :class:`Resources` per
family (LUTs, flip-flops, DSPs, block RAMs and the raw cell counts). The latest report is kept in
:data:`LATEST` and :func:`effective_parallel` (used by the plugin's ``rlx_kernel_cost``) caps the
modelled MAC parallelism by the DSP blocks of the smallest part of that family (iCE40 UP5K: 8).
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

#: DSP blocks of the reference parts (iCE40 UP5K, Artix-7 XC7A35T)
DSP_CAPACITY = {"ice40": 8, "xilinx": 90}
LATEST: dict[str, Resources] = {}


@dataclasses.dataclass
class Resources:
    family: str
    luts: int
    ffs: int
    dsps: int
    brams: int
    cells: dict[str, int]
    lutram: int = 0
    seconds: float = 0.0

    def summary(self) -> str:
        ram = f", {self.lutram} LUTRAM" if self.lutram else ""
        return f"{self.family}: {self.luts} LUT, {self.ffs} FF, {self.dsps} DSP, {self.brams} BRAM{ram}"


def _stat_cells(log: str) -> dict[str, int]:
    # the last "Number of cells" block (the top module after flattening)
    blocks = log.split("Printing statistics.")
    text = blocks[-1] if len(blocks) > 1 else log
    cells: dict[str, int] = {}
    for m in re.finditer(r"^\s+(\$?[A-Za-z0-9_$]+)\s+(\d+)\s*$", text, re.M):
        cells[m.group(1)] = cells.get(m.group(1), 0) + int(m.group(2))
    return cells


def classify(family: str, cells: dict[str, int]) -> Resources:
    def total(pred: Callable[[str], bool]) -> int:
        return sum(n for c, n in cells.items() if pred(c))

    if family == "ice40":
        luts = total(lambda c: c == "SB_LUT4")
        ffs = total(lambda c: c.startswith("SB_DFF"))
        dsps = total(lambda c: c == "SB_MAC16")
        brams = total(lambda c: c.startswith("SB_RAM40"))
    else:
        luts = total(lambda c: re.fullmatch(r"LUT[1-6]", c) is not None)
        ffs = total(lambda c: c in ("FDRE", "FDSE", "FDCE", "FDPE"))
        dsps = total(lambda c: c.startswith("DSP48"))
        brams = total(lambda c: c.startswith("RAMB"))
        lutram = total(lambda c: re.fullmatch(r"RAM(32|64|128|256)(M|X1[SD]).*", c) is not None)
        return Resources(family, luts, ffs, dsps, brams, cells, lutram)
    return Resources(family, luts, ffs, dsps, brams, cells)


def synthesize(design_dir: str | Path, family: str, top: str = "rlx_top", timeout: float = 300) -> Resources:
    import time

    if shutil.which("yosys") is None:
        raise RuntimeError("yosys not found (Debian: apt-get install yosys)")
    cmd = {"ice40": f"synth_ice40 -top {top} -dsp", "xilinx": f"synth_xilinx -top {top} -family xc7"}[family]
    t0 = time.perf_counter()
    r = subprocess.run(["yosys", "-q", "-p", f"read_verilog rlx_top.v; {cmd}; tee -o stat_{family}.txt stat"],
                       cwd=design_dir, capture_output=True, text=True, timeout=timeout)
    if r.returncode:
        raise RuntimeError(f"yosys {family} failed:\n{r.stderr[-3000:]}{r.stdout[-2000:]}")
    log = (Path(design_dir) / f"stat_{family}.txt").read_text()
    res = classify(family, _stat_cells(log))
    res.seconds = time.perf_counter() - t0
    LATEST[family] = res
    return res


def effective_parallel(macs: int, family: str | None = None) -> int:
    """``macs`` capped by the DSP capacity of ``family`` when a yosys report says the design needs
    more DSPs per MAC than the part has."""
    fams = [family] if family else list(LATEST)
    p = macs
    for f in fams:
        r = LATEST.get(f)
        if r is None or r.dsps == 0:
            continue
        per_mac = max(1.0, r.dsps / max(1, macs))
        p = min(p, max(1, int(DSP_CAPACITY.get(f, r.dsps) // per_mac)))
    return p
