"""Summarise docs/certificates/*.json into the per-target table of docs/STATUS.md.

    python scripts/status_table.py            # prints Markdown
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from pathlib import Path


def summarise(path: Path) -> str:
    d = json.loads(path.read_text())
    counts: Counter[str] = Counter()
    per_op: dict[str, dict[str, str]] = defaultdict(dict)
    for name, v in d["variants"].items():
        if v["kind"] != "op":
            continue
        label = v["verdict"] if v["verdict"] != "certified" else "+".join(v["paths"]) or "?"
        counts[label] += 1
        op, dt = name[:-1].split("[")
        per_op[op][dt] = label
    lines = [f"### `{d['backend']}` — {d['verdict']}", "",
             f"Certificate: `{path.as_posix()}` ({d['date']}, {d['plugin']['distribution']} "
             f"{d['plugin']['version']}, device {d['device']['name']}).", "",
             "| path | op-variants (op x dtype) |", "|---|---|"]
    for k, n in sorted(counts.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {k} | {n} |")
    groups: dict[str, list[str]] = defaultdict(list)
    for op, m in sorted(per_op.items()):
        for dt, label in m.items():
            groups[label].append(f"{op}[{dt}]")
    lines.append("")
    for label in sorted(groups):
        if label == "native":
            continue
        lines.append(f"- **{label}**: " + ", ".join(groups[label]))
    return "\n".join(lines) + "\n"


def main() -> None:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs/certificates")
    for p in sorted(root.glob("*.json")):
        print(summarise(p))


if __name__ == "__main__":
    main()
