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
    #: What served the check's node(s), from the dispatch report: a native kernel name
    #: (``cpu.add``), ``decomposition core.softmax -> k1+k2`` or ``rewrite materialize_broadcast ->
    #: k1+k2``; several joined by ``"; "``. Empty when nothing compiled (skipped) and in results
    #: written before certificates recorded it.
    kernels: str = ""


#: Per-variant verdicts that count towards "certified for N of M variants".
CERTIFIED_VERDICTS = ("certified",)


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

    def coverage(self) -> dict[str, int]:
        """How much of the suite the verdict covers: variants by verdict, and checks run/passed.

        ``not_claimed`` counts variants whose every check was skipped (the backend cannot compile
        them): a backend certified for 3 of 501 variants must say so up front.
        """
        vs = [v["verdict"] for v in self.variants().values()]
        return {"variants": len(vs), "certified": sum(v in CERTIFIED_VERDICTS for v in vs),
                "partial": vs.count("partial"), "xfailed": vs.count("xfailed"),
                "not_claimed": vs.count("not certified"), "failed": vs.count("failed"),
                "checks": len(self.results), "checks_passed": sum(r.status == "passed" for r in self.results)}

    @property
    def verdict(self) -> str:
        """One line that states the coverage: ``certified for 20 of 511 variants; 491 not claimed
        (skipped: not certified)``, or ``not certified: 2 of 502 variants failed``."""
        c = self.coverage()
        extra = (f", {c['partial']} partially" if c["partial"] else "") + \
            (f", {c['xfailed']} expected failures" if c["xfailed"] else "")
        unclaimed = f"; {c['not_claimed']} not claimed (skipped: not certified)" if c["not_claimed"] else ""
        partial_run = f" (partial run: -k {self.keyword})" if self.keyword else ""
        if self.certified:
            return (f"certified for {c['certified']} of {c['variants']} variants"
                    f"{extra}{unclaimed}{partial_run}")
        why = []
        if c["failed"]:
            why.append(f"{c['failed']} of {c['variants']} variants failed")
        if self.stale_xfails:
            why.append(f"{len(self.stale_xfails)} stale xfail lines")
        if not why and not c["checks_passed"]:
            why.append(f"no check passed ({c['checks']} run)")
        return "not certified" + (": " + ", ".join(why) if why else "") + partial_run

    def variants(self) -> dict[str, dict[str, Any]]:
        """Per op-variant (``add[f32]``, ``mlp[f32]``, contract item): status counts and verdict."""
        out: dict[str, dict[str, Any]] = {}
        for r in self.results:
            v = out.setdefault(r.variant, {"kind": r.kind, **{s: 0 for s in STATUSES}, "paths": set(),
                                           "kernels": set()})
            v[r.status] += 1
            if r.path:
                v["paths"].update(r.path.split(","))
            if r.kernels:
                v["kernels"].update(r.kernels.split("; "))
        for v in out.values():
            v["paths"] = sorted(v["paths"])
            v["kernels"] = sorted(v["kernels"])
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
            "verdict": self.verdict, "certified": self.certified, "coverage": self.coverage(),
            "counts": self.counts(),
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
                "results": [[r.id, r.kind, r.variant, r.status, r.message, r.path, r.op, r.dtype, r.kernels]
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
        # Rows of 8 fields come from files written before results recorded their kernels.
        results = [Result(*row) for row in data.pop("results")]
        return cls(**data, results=results), env

    def to_markdown(self) -> str:
        c = self.counts()
        cov = self.coverage()
        lines = [f"# Conformance certificate: `{self.backend}`", "",
                 f"**Verdict: {self.verdict}**", "",
                 f"Coverage: {cov['certified']} of {cov['variants']} variants certified, "
                 f"{cov['checks_passed']} of {cov['checks']} checks passed"
                 + (f"; {cov['not_claimed']} variants are not claimed by this backend (every check skipped): "
                    "they are **not certified**" if cov["not_claimed"] else "") + ".", "",
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
                  "| variant | kind | verdict | passed | failed | skipped | xfailed | paths | served by |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for name, v in sorted(self.variants().items(), key=lambda kv: (kv[1]["kind"], kv[0])):
            served = _md(", ".join(v["kernels"]))
            lines.append(f"| `{name}` | {v['kind']} | {v['verdict']} | {v['passed']} | "
                         f"{v['failed'] + v['error'] + v['xpassed']} | {v['skipped']} | {v['xfailed']} | "
                         f"{', '.join(v['paths'])} | {served[:300] + ('...' if len(served) > 300 else '')} |")
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


def read_json(path: str | Path) -> dict[str, Any]:
    """A JSON certificate as :meth:`Certificate.to_json` writes it now, from any version of the file.

    Certificates written before per-variant kernels and the coverage summary (such as a committed
    certificate made on hardware that is not at hand to regenerate it) get ``kernels: []`` per
    variant and a ``coverage`` computed from their variants; their verdict text is kept as written.
    """
    data: dict[str, Any] = json.loads(Path(path).read_text())
    variants = data.get("variants")
    if not isinstance(variants, dict) or "verdict" not in data:
        raise ValueError(f"{path}: not an rlx-conformance certificate (no verdict/variants); "
                         "write one with `rlx conformance BACKEND --json FILE`")
    for v in variants.values():
        v.setdefault("kernels", [])
    if "coverage" not in data:
        vs = [v["verdict"] for v in variants.values()]
        counts = data.get("counts", {})
        data["coverage"] = {
            "variants": len(vs), "certified": sum(v in CERTIFIED_VERDICTS for v in vs),
            "partial": vs.count("partial"), "xfailed": vs.count("xfailed"),
            "not_claimed": vs.count("not certified"), "failed": vs.count("failed"),
            "checks": sum(counts.values()), "checks_passed": counts.get("passed", 0)}
    return data


def _md(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")
