"""The certificate: who was tested, on what, and per op-variant what passed, failed or was skipped."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STATUSES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
#: Version tag of :meth:`Certificate.write_results` files.
RESULTS_FORMAT = "rlx-conformance-results/1"


@dataclass(frozen=True)
class Result:
    id: str
    kind: str
    variant: str
    status: str
    message: str = ""
    path: str = ""
    op: str = ""
    dtype: str = ""


@dataclass
class Certificate:
    backend: str
    plugin_distribution: str
    plugin_version: str
    core_version: str
    api_version: str
    suite_version: str
    device: str
    device_details: dict[str, str]
    date: str
    results: list[Result]
    keyword: str | None = None
    xfails_file: str | None = None
    stale_xfails: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def counts(self) -> dict[str, int]:
        c = Counter(r.status for r in self.results)
        return {s: c.get(s, 0) for s in STATUSES}

    @property
    def certified(self) -> bool:
        """No failure, no error, no stale manifest line, and something actually passed.

        Skipped variants do not block the verdict, but they are *not certified*: the certificate
        lists them as such, never as passed.
        """
        c = self.counts()
        return (c["failed"] == 0 and c["error"] == 0 and c["xpassed"] == 0 and c["passed"] > 0
                and not self.stale_xfails)

    @property
    def verdict(self) -> str:
        vs = self.variants().values()
        ok = sum(v["verdict"] in ("certified", "xfailed") for v in vs)
        partial = sum(v["verdict"] == "partial" for v in vs)
        nc = sum(v["verdict"] == "not certified" for v in vs)
        scope = f" for {ok} variants" + (f", {partial} partially" if partial else "") + \
            (f"; {nc} variants not certified (skipped)" if nc else "")
        if self.certified:
            return "certified" + scope + (" (partial run: -k)" if self.keyword else "")
        return "not certified"

    def variants(self) -> dict[str, dict[str, Any]]:
        """Per op-variant (``add[f32]``, ``mlp[f32]``, contract item): status counts and verdict."""
        out: dict[str, dict[str, Any]] = {}
        for r in self.results:
            v = out.setdefault(r.variant, {"kind": r.kind, **{s: 0 for s in STATUSES}, "paths": set()})
            v[r.status] += 1
            if r.path:
                v["paths"].update(r.path.split(","))
        for v in out.values():
            v["paths"] = sorted(v["paths"])
            if v["failed"] or v["error"] or v["xpassed"]:
                v["verdict"] = "failed"
            elif v["passed"] and not v["skipped"]:
                v["verdict"] = "certified"
            elif v["passed"]:
                v["verdict"] = "partial"
            elif v["xfailed"] and not v["skipped"]:
                v["verdict"] = "xfailed"
            else:
                v["verdict"] = "not certified"
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend, "plugin": {"distribution": self.plugin_distribution,
                                                "version": self.plugin_version, "api": self.api_version},
            "core_version": self.core_version, "suite_version": self.suite_version,
            "device": {"name": self.device, **self.device_details}, "date": self.date,
            "verdict": self.verdict, "certified": self.certified, "counts": self.counts(),
            "keyword": self.keyword, "xfails_file": self.xfails_file, "stale_xfails": self.stale_xfails,
            "seconds": round(self.seconds, 2), "variants": self.variants(),
            # Passed checks are listed by id only; everything else with its message and path.
            "passed": [r.id for r in self.results if r.status == "passed"],
            "results": [asdict(r) for r in self.results if r.status != "passed"],
        }

    def write_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")

    def write_results(self, path: str | Path, env: dict[str, str] | None = None) -> None:
        """Everything needed to rebuild this certificate (every result, passed ones included), and
        ``env``: the settings it ran under, so :func:`rlx_conformance.reuse.certified_or_run` reuses it
        only where the same run would be made."""
        head = {k: v for k, v in asdict(self).items() if k != "results"}
        data = {"format": RESULTS_FORMAT, **head, "env": env or {},
                "results": [[r.id, r.kind, r.variant, r.status, r.message, r.path, r.op, r.dtype]
                            for r in self.results]}
        Path(path).write_text(json.dumps(data, separators=(",", ":")) + "\n")

    @classmethod
    def read_results(cls, path: str | Path) -> tuple[Certificate, dict[str, str]]:
        """The certificate and the settings of a file written by :meth:`write_results`."""
        data = json.loads(Path(path).read_text())
        if data.get("format") != RESULTS_FORMAT:
            raise ValueError(f"{path}: not an rlx-conformance results file ({RESULTS_FORMAT})")
        env = data.pop("env")
        data.pop("format")
        results = [Result(*row) for row in data.pop("results")]
        return cls(**data, results=results), env

    def to_markdown(self) -> str:
        c = self.counts()
        lines = [f"# Conformance certificate: `{self.backend}`", "",
                 f"**Verdict: {self.verdict}**", "",
                 "| | |", "|---|---|",
                 f"| plugin | {self.plugin_distribution} {self.plugin_version} (API {self.api_version}) |",
                 f"| rlx-core | {self.core_version} |", f"| suite | {self.suite_version} |",
                 f"| device | {self.device} " + " ".join(f"{k}={v}" for k, v in self.device_details.items())
                 + " |", f"| date | {self.date} |",
                 "| checks | " + ", ".join(f"{v} {k}" for k, v in c.items() if v) + " |", ""]
        if self.keyword:
            lines += [f"Partial run: only checks matching `-k {self.keyword}`.", ""]
        if self.stale_xfails:
            lines += ["Stale lines in the xfail manifest (no such check): "
                      + ", ".join(f"`{s}`" for s in self.stale_xfails), ""]
        bad = [r for r in self.results if r.status in ("failed", "error", "xpassed")]
        if bad:
            lines += ["## Failures", ""]
            for r in bad[:200]:
                lines.append(f"- `{r.id}` **{r.status}**: {_md(r.message)[:400]}")
            lines.append("")
        lines += ["## Per variant", "",
                  "| variant | kind | verdict | passed | failed | skipped | xfailed | paths |",
                  "|---|---|---|---|---|---|---|---|"]
        for name, v in sorted(self.variants().items(), key=lambda kv: (kv[1]["kind"], kv[0])):
            lines.append(f"| `{name}` | {v['kind']} | {v['verdict']} | {v['passed']} | "
                         f"{v['failed'] + v['error'] + v['xpassed']} | {v['skipped']} | {v['xfailed']} | "
                         f"{', '.join(v['paths'])} |")
        skipped = [r for r in self.results if r.status == "skipped"]
        if skipped:
            lines += ["", "## Not certified (skipped)", "",
                      "A skipped check means the backend could not run that variant: it is not certified, "
                      "never counted as passed.", ""]
            seen: dict[str, str] = {}
            for r in skipped:
                seen.setdefault(r.variant, r.message)
            for var, msg in sorted(seen.items()):
                lines.append(f"- `{var}`: {_md(msg)[:200]}")
        xf = [r for r in self.results if r.status == "xfailed"]
        if xf:
            lines += ["", "## Expected failures (from the plugin's manifest)", ""]
            lines += [f"- `{r.id}`: {_md(r.message)[:300]}" for r in xf]
        return "\n".join(lines) + "\n"

    def write_markdown(self, path: str | Path) -> None:
        Path(path).write_text(self.to_markdown())


def _md(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")
