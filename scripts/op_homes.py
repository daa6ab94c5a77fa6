"""How many core files name each MIR op as a string: the "one home per op" measure (issue 15).

A file counts for an op when it contains the op's name as a quoted string (``"rsqrt"``), whether
in a per-op table, a decomposition that builds the op, or its declaration. Run from the repository
root: ``python scripts/op_homes.py [--all]`` (``--all`` also lists the files per op).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

CORE = Path(__file__).resolve().parent.parent / "src" / "rlx_core"


def mir_ops() -> list[str]:
    from rlx_core.ir.schema import REGISTRY

    return REGISTRY.names("mir")


def homes(op: str, files: list[tuple[Path, str]]) -> list[str]:
    pat = re.compile(r"[\"']" + re.escape(op) + r"[\"']")
    return sorted(str(p.relative_to(CORE)) for p, text in files if pat.search(text))


def main(argv: list[str]) -> int:
    files = [(p, p.read_text(encoding="utf-8")) for p in sorted(CORE.rglob("*.py"))]
    rows = [(op, homes(op, files)) for op in mir_ops()]
    width = max(len(op) for op, _ in rows)
    for op, fs in sorted(rows, key=lambda r: (-len(r[1]), r[0])):
        tail = "  " + " ".join(fs) if "--all" in argv else ""
        print(f"{op:<{width}}  {len(fs):2d}{tail}")
    counts = [len(fs) for _, fs in rows]
    print(f"{len(rows)} MIR ops; files per op: mean {sum(counts) / len(counts):.1f}, "
          f"max {max(counts)}, total {sum(counts)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
