"""Run the official ONNX backend node tests on an RLX backend and report the pass rate.

The test cases are generated in memory from the installed ``onnx`` package's own test-case code
(``onnx.backend.test.case.node``), run through ``rlx_core.frontends.onnx_backend.RLXBackend`` and
compared as ``onnx.backend.test.runner`` compares them (each case's rtol/atol, default 1e-3/1e-7).
Each case is passed, failed (wrong numbers, shape or dtype), unsupported (the importer or the
backend says clearly that it cannot, or the case is out of scope: optional, string,
training) or error (anything else: a bug).

    python scripts/onnx_node_tests.py                          # cpu, prints the summary
    python scripts/onnx_node_tests.py -k reduce -v             # a subset, one line per case
    python scripts/onnx_node_tests.py --markdown docs/onnx-node-tests/cpu.md --json /tmp/cpu.json
    python scripts/onnx_node_tests.py --write-excludes         # plugins/rlx-cpu/onnx-node-excludes.txt
    python scripts/onnx_node_tests.py --check-excludes         # exit 1 on a regression or stale entry

``--write-excludes`` keeps the reason already written for a case that is still excluded, so
reasons edited by hand survive (``--reset-reasons`` derives them all again); new entries get a
reason derived from the classification. Every case rejected only for its opset is also run read as
the nearest opset the importer accepts (a what-if, reported separately and in its reason).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import re
import sys
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT / "src"))

from rlx_core.frontends import onnx_backend as ob  # noqa: E402

# ---------------------------------------------------------------------------------------------
# Human reasons, grouped by cause

_OP_KINDS: dict[str, tuple[str, ...]] = {
    "control flow (loops over subgraphs)": ("Loop", "Scan"),
    "recurrent layer (a loop over time)": ("LSTM", "GRU", "RNN"),
    "quantized operator": ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv",
                           "QLinearMatMul", "ConvInteger", "MatMulInteger"),
    "random-number operator": ("Bernoulli", "RandomNormal", "RandomNormalLike", "RandomUniform",
                               "RandomUniformLike", "Multinomial"),
    "data-dependent output shape (run on the host between stages)": ("Unique",),
    "image resampling / region operator": ("Resize", "Upsample", "GridSample", "AffineGrid", "RoiAlign",
                                           "MaxRoiPool", "CenterCropPad", "Col2Im", "DeformConv"),
    "image decoding (needs an image codec: decode the image before the model)": ("ImageDecoder",),
    "signal processing": ("DFT", "STFT", "BlackmanWindow", "HammingWindow", "HannWindow",
                          "MelWeightMatrix"),
    "attention / transformer block": ("Attention", "RotaryEmbedding", "LinearAttention", "FlexAttention",
                                      "CausalConvWithState", "SwiGLU"),
    "loss function": ("SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss"),
    "bitwise integer operator": ("BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot", "BitShift",
                                 "BitCast"),
}
_KIND_OF = {op: kind for kind, ops in _OP_KINDS.items() for op in ops}


def opset_rejected(r: ob.CaseResult) -> bool:
    return r.reason.startswith("ONNX default-domain opset ")


def human_reason(r: ob.CaseResult, clamped: ob.CaseResult | None = None) -> str:
    """A short reason, the same for every case with the same cause (the exclusion-file groups).
    ``clamped``: the same case run with its opset clamped into the importer's range, which says
    what raising the range would give."""
    msg = r.reason
    m = re.match(r"ONNX default-domain opset (\d+) is not supported", msg)
    if m:
        v = int(m.group(1))
        side = "newer" if v > ob.MAX_OPSET else "older"
        head = f"opset {v} is {side} than the importer reads ({ob.MIN_OPSET}-{ob.MAX_OPSET})"
        if clamped is None:
            return head
        as_v = min(max(v, ob.MIN_OPSET), ob.MAX_OPSET)
        if clamped.status == ob.PASSED:
            return f"{head}; read as opset {as_v} it passes"
        return f"{head}; read as opset {as_v}: {human_reason(clamped)}"
    m = re.match(r"ONNX operator '([^']+)' is not supported by the RLX ONNX importer", msg)
    if m:
        op = m.group(1)
        kind = _KIND_OF.get(op)
        return f"op {op}: not translated by the importer" + (f" ({kind})" if kind else "")
    m = re.match(r"ONNX operator '([^']+)' from domain '([^']+)' is not supported", msg)
    if m:
        return f"op {m.group(2)}.{m.group(1)}: non-default domain, not translated by the importer"
    m = re.match(r"graph input '[^']*' has ONNX type (\w+), which RLX does not have", msg)
    if m:
        return f"dtype {m.group(1)}: not an RLX dtype"
    m = re.match(r"Cast to ONNX type (\w+) is not supported", msg)
    if m:
        return f"dtype {m.group(1)}: not an RLX dtype (Cast target)"
    m = re.match(r"tensor '[^']*' has ONNX type (\w+), which RLX does not have", msg)
    if m:
        return f"dtype {m.group(1)}: not an RLX dtype (constant)"
    m = re.match(r"output (\d+) \('[^']*'\) of (\w+) is not supported", msg)
    if m:
        return f"{m.group(2)}: optional output {m.group(1)} is not translated by the importer"
    if msg.startswith("staged execution computes every output on the host"):
        return ("staged execution computes every output on the host (a host op, or a result folded from "
                "value-keyed inputs): nothing would run on RLX")
    m = re.match(r"(\w+) with (\d) spatial dims", msg)
    if m:
        kind = "convolution" if "Conv" in m.group(1) else "pooling"
        return f"{m.group(1)}: {m.group(2)}-D {kind} is not translated by the importer (1-D/2-D only)"
    m = re.match(r"(\w+) with dilations", msg)
    if m:
        return f"{m.group(1)}: dilated pooling is not translated by the importer"
    m = re.search(r"(.*) is computed at run time from tensor data", msg)
    if m:
        return (f"{m.group(1).strip()} is a run-time input staged execution cannot cut at "
                "(data-dependent shape)")
    if msg.startswith("out of scope:"):
        return msg
    m = re.search(r"DTypeError: (?:op )?'?(\w+)'?:? (?:does not accept|x is) (\w+)", msg)
    if m and r.status == ob.ERROR:
        return (f"importer bug: ONNX {r.op} on {m.group(2)} data becomes RLX {m.group(1)}, which does not "
                f"take {m.group(2)} (DTypeError; it must cast, or raise UnsupportedOnnxError)")
    m = re.search(r"ShapeError: (\w+) over an empty axis has no identity", msg)
    if m:
        return (f"importer bug: ONNX {r.op} over an empty set becomes RLX {m.group(1)}, which rejects it "
                "(ShapeError; ONNX defines the result as -inf/+inf: emit it, or raise UnsupportedOnnxError)")
    if r.status == ob.FAILED:
        return f"wrong result: {msg}"
    return msg


# ---------------------------------------------------------------------------------------------
# Reports


def _pct(n: int, d: int) -> str:
    return f"{100.0 * n / d:.1f}%" if d else "n/a"


def _versions(device: str) -> dict[str, str]:
    import numpy as np
    import onnx

    import rlx_core
    from rlx_core._hub import hub, parse_device

    out = {"onnx": onnx.__version__, "rlx-core": rlx_core.__version__, "numpy": np.__version__,
           "python": platform.python_version()}
    try:
        b = hub().load(parse_device(device)[0])
        out[b.entry.distribution] = str(b.entry.dist_version or b.info.version)
    except Exception as e:  # the report still says which backend failed to load
        out["backend"] = f"unavailable ({e})"
    return out


@dataclass
class Run:
    """One suite run, plus the opset-rejected cases run again with the opset clamped (what-if)."""

    suite: ob.SuiteResult
    clamped: dict[str, ob.CaseResult]

    def reason(self, r: ob.CaseResult) -> str:
        return human_reason(r, self.clamped.get(r.name))

    def what_if_passed(self) -> list[str]:
        return sorted(n for n, r in self.clamped.items() if r.status == ob.PASSED)


def per_op(run: Run) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    reasons: dict[str, Counter[str]] = defaultdict(Counter)
    for r in run.suite.results:
        row = rows.setdefault(r.op, {"cases": 0, **dict.fromkeys(ob.STATUSES, 0)})
        row["cases"] += 1
        row[r.status] += 1
        if r.status != ob.PASSED:
            reasons[r.op][run.reason(r)] += 1
    for op, row in rows.items():
        row["reason"] = reasons[op].most_common(1)[0][0] if reasons[op] else ""
    return dict(sorted(rows.items(), key=lambda kv: kv[0].lower()))


def categories(run: Run) -> list[tuple[str, int]]:
    c: Counter[str] = Counter(run.reason(r) for r in run.suite.results if r.status != ob.PASSED)
    return c.most_common()


def _broad(reason: str) -> str:
    if reason.startswith("opset "):
        if reason.endswith("it passes"):
            return "opset outside the importer's range (read inside it, the case passes)"
        return "opset outside the importer's range (and read inside it, it still does not pass)"
    if reason.startswith("op "):
        return "operator not translated by the importer"
    if reason.startswith("dtype "):
        return "dtype RLX does not have"
    if reason.startswith("out of scope"):
        return "out of scope (optional/string/training)"
    if reason.startswith("importer bug"):
        return "importer bug"
    return "attribute, mode, optional output or run-time value the importer does not translate"


def summary_lines(run: Run) -> list[str]:
    suite = run.suite
    c = suite.counts()
    n = len(suite.results)
    scoped = [r for r in suite.results if not r.reason.startswith("out of scope")]
    in_range = [r for r in scoped if r.opset is not None and ob.MIN_OPSET <= r.opset <= ob.MAX_OPSET]

    def rate(rs: list[ob.CaseResult]) -> str:
        k = sum(r.status == ob.PASSED for r in rs)
        return f"{k}/{len(rs)} ({_pct(k, len(rs))})"

    gained = len(run.what_if_passed())
    return [f"device {suite.device}: {c[ob.PASSED]}/{n} passed ({_pct(c[ob.PASSED], n)}); "
            f"failed {c[ob.FAILED]}, unsupported {c[ob.UNSUPPORTED]}, error {c[ob.ERROR]}; "
            f"{suite.seconds:.1f} s",
            f"  in scope (no optional/string/training): {rate(scoped)}",
            f"  in scope and opset {ob.MIN_OPSET}-{ob.MAX_OPSET}: {rate(in_range)}",
            f"  what-if, opsets clamped into {ob.MIN_OPSET}-{ob.MAX_OPSET}: {c[ob.PASSED] + gained}/{n} "
            f"({_pct(c[ob.PASSED] + gained, n)}), {gained} more",
            f"  of the passes: {sum(bool(r.staged) for r in suite.results if r.status == ob.PASSED)} ran "
            f"with the core's staged execution (run-time shape values, host ops, shape-specialised)"]


def markdown(run: Run, command: str) -> str:
    suite = run.suite
    c = suite.counts()
    n = len(suite.results)
    vers = _versions(suite.device)
    date = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    staged = [r for r in suite.results if r.staged and r.status == ob.PASSED]
    folded = [r for r in suite.results if r.folded and r.status == ob.PASSED]
    expanded = [r for r in suite.results if r.expanded]
    out = [f"# ONNX backend node tests on `{suite.device}`", "",
           "Generated by `scripts/onnx_node_tests.py`; do not edit by hand.", "",
           f"- **Date:** {date}",
           "- **Versions:** " + ", ".join(f"{k} {v}" for k, v in vers.items()),
           f"- **Machine:** {platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
           f"- **Command:** `{command}`",
           f"- **Runtime:** {suite.seconds:.1f} s for {n} cases (plus a few seconds generating them "
           f"from the onnx package)",
           f"- **Cases:** every node test case of onnx {vers['onnx']} (`onnx.backend.test.case.node`, "
           f"generated in memory; the package no longer ships them as files), {len(expanded)} of them "
           f"function-expanded (`*_expanded`); compared as `onnx.backend.test.runner` does (rtol 1e-3, "
           f"atol 1e-7 unless the case says otherwise); compile cache off",
           f"- **Exclusions:** `plugins/rlx-{suite.device.split(':')[0]}/onnx-node-excludes.txt` "
           f"(one line per case that does not pass, with its reason); `tests/test_onnx_node_suite.py` "
           f"fails on a regression and on a stale exclusion", "",
           "## Result", "",
           "| status | cases | share |", "|---|---|---|"]
    for s in ob.STATUSES:
        out.append(f"| {s} | {c[s]} | {_pct(c[s], n)} |")
    out.append(f"| **total** | **{n}** | |")
    out += ["", "```", *[ln.strip() for ln in summary_lines(run)], "```", ""]
    out += ["Notes:", "",
            "- *unsupported*: the importer raised `UnsupportedOnnxError` (operator, attribute, opset or "
            "dtype), the backend had no dispatch path (`DispatchError`), or the case is out of scope "
            "(optional, string, training); *failed*: it ran and the outputs differ; *error*: "
            "anything else (a bug, listed below).",
            f"- {len(staged)} of the passes ran with the core's staged execution "
            "(`rlx_core.frontends.onnx_staged`, what `load_onnx_model` and `rlx run` do): the node tests "
            "feed axes, pads, repeats, split sizes, K … as run-time inputs, and RLX shapes are static per "
            "signature, so the stage computing them runs first and the next one is compiled per distinct "
            "value; NonZero, NonMaxSuppression and Compress run on the backend as bounded ops (a padded "
            "result and a count, trimmed at the cut) where the backend claims them, Unique (and those "
            "three elsewhere) on the host between compiled stages. A case whose every output is "
            "computed on the host (nothing on the backend) is counted unsupported, not passed. The "
            "adapter itself compiles no input in as a constant (its former `freeze_inputs` is gone), "
            "so every pass is what a user of `load_onnx_model` gets.",
            f"- {len(folded)} passed case(s) have an output that no run-time input reaches: "
            + (", ".join(f"`{r.name}`" for r in folded) or "none")
            + (" (Dropout's mask in inference mode is a constant)." if folded else "."),
            f"- What-if, not the official number: the {len(run.clamped)} cases rejected only for their opset "
            f"were run again read as the nearest opset in {ob.MIN_OPSET}-{ob.MAX_OPSET}; "
            f"{len(run.what_if_passed())} of them pass then. Within the range each operator is also "
            f"checked per version (`rlx_core.frontends.onnx.op_version_problem`): a version older or "
            f"newer than its handler translates exactly is refused by name, not read as another.",
            ""]
    broad: Counter[str] = Counter()
    for reason, k in categories(run):
        broad[_broad(reason)] += k
    out += ["## Why cases do not pass", "", "| cause | cases |", "|---|---|"]
    for reason, k in broad.most_common():
        out.append(f"| {reason} | {k} |")
    out += ["", "In detail (the reasons in the exclusion file):", "", "| reason | cases |", "|---|---|"]
    for reason, k in categories(run):
        out.append(f"| {reason.replace('|', '/')} | {k} |")
    errors = [r for r in suite.results if r.status == ob.ERROR]
    if errors:
        out += ["", "## Errors (bugs)", ""]
        for r in errors:
            out.append(f"- `{r.name}` ({r.stage}): {r.reason.replace('|', '/')}")
    failed = [r for r in suite.results if r.status == ob.FAILED]
    out += ["", "## Wrong results", ""]
    out += [f"- `{r.name}` ({r.stage}): {r.reason}" for r in failed] or ["None: every case that ran matched."]
    out += ["", "## Per operator", "",
            "Cases are grouped by the operator they test (function-expanded variants included).", "",
            "| operator | cases | passed | failed | unsupported | error | pass rate "
            "| main reason otherwise |",
            "|---|---|---|---|---|---|---|---|"]
    for op, row in per_op(run).items():
        out.append(f"| {op} | {row['cases']} | {row[ob.PASSED]} | {row[ob.FAILED]} | {row[ob.UNSUPPORTED]} "
                   f"| {row[ob.ERROR]} | {_pct(row[ob.PASSED], row['cases'])} | "
                   f"{row['reason'].replace('|', '/')} |")
    return "\n".join(out) + "\n"


def to_json(run: Run) -> dict[str, Any]:
    suite = run.suite
    return {"device": suite.device, "versions": _versions(suite.device),
            "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "seconds": round(suite.seconds, 2), "counts": suite.counts(),
            "per_op": per_op(run), "categories": categories(run),
            "what_if_clamp_opset_passed": run.what_if_passed(),
            "results": [dict(r.to_json(), human_reason=run.reason(r)) if r.status != ob.PASSED
                        else r.to_json() for r in suite.results]}


# ---------------------------------------------------------------------------------------------
# The exclusion file


def write_excludes(run: Run, path: Path, *, partial: bool, reset: bool = False) -> tuple[int, int]:
    """Rewrite ``path``: every non-passing case with a reason, grouped by reason. Reasons already
    in the file are kept (unless ``reset``). With ``partial`` (a -k subset) entries of cases not run
    are kept too."""
    suite = run.suite
    old = ob.read_excludes(path) if path.exists() else {}
    kept = {} if reset else old
    ran = {r.name for r in suite.results}
    entries: dict[str, str] = {}
    if partial:
        entries.update({n: why for n, why in old.items() if n not in ran})
    for r in suite.results:
        if r.status != ob.PASSED:
            entries[r.name] = kept.get(r.name) or run.reason(r)
    groups: dict[str, list[str]] = defaultdict(list)
    for name, why in entries.items():
        groups[why].append(name)
    backend = suite.device.split(":")[0]
    import onnx

    lines = [f"# ONNX backend node tests that do not pass on {backend}: `test_name # reason`, one per line.",
             f"# onnx-version: {onnx.__version__} (the node cases come from this onnx package)",
             "# Written by `python scripts/onnx_node_tests.py --device "
             f"{suite.device} --write-excludes` (reasons already here are kept; edit them freely).",
             "# tests/test_onnx_node_suite.py fails when a case not listed here does not pass, and when a",
             "# listed case passes (a stale entry): remove it then. Grouped by reason, largest group first.",
             ""]
    for why, names in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        lines.append(f"# --- {why} ({len(names)})")
        lines += [f"{n} # {why}" for n in sorted(names)]
        lines.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    added = len(set(entries) - set(old))
    removed = len(set(old) - set(entries))
    return added, removed


# ---------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=os.environ.get("RLX_ONNX_DEVICE") or "cpu",
                    help="RLX device (default: RLX_ONNX_DEVICE or cpu)")
    ap.add_argument("-k", dest="pattern", default=None, help="only cases whose name contains this")
    ap.add_argument("--json", type=Path, help="write every case's result as JSON here")
    ap.add_argument("--markdown", type=Path, help="write the Markdown report here")
    ap.add_argument("--excludes", type=Path, default=None,
                    help="the exclusion file (default: plugins/rlx-<backend>/onnx-node-excludes.txt)")
    ap.add_argument("--write-excludes", action="store_true", help="rewrite the exclusion file")
    ap.add_argument("--reset-reasons", action="store_true",
                    help="with --write-excludes: derive every reason again instead of keeping the file's")
    ap.add_argument("--check-excludes", action="store_true",
                    help="exit 1 if a non-excluded case does not pass or an excluded case passes")
    ap.add_argument("--no-freeze", action="store_true",
                    help="strict counting (now the only mode: the adapter freezes no input; the core's "
                         "staged execution runs, and its passes are counted apart); kept for old command "
                         "lines")
    ap.add_argument("--fusion", choices=("on", "off"), default=None,
                    help="elementwise fusion (default: RLX_FUSION)")
    ap.add_argument("-v", "--verbose", action="store_true", help="one line per case")
    ap.add_argument("--top", type=int, default=15, help="how many failure reasons to print")
    args = ap.parse_args(argv)

    fusion = None if args.fusion is None else args.fusion == "on"
    cases = ob.node_test_cases(args.pattern)
    if not cases:
        print(f"no node test case matches {args.pattern!r}", file=sys.stderr)
        return 2

    def progress(i: int, n: int, r: ob.CaseResult) -> None:
        if args.verbose:
            extra = f"  [{r.stage}] {r.reason}" if r.status != ob.PASSED else ""
            print(f"{i + 1:5d}/{n} {r.status:11s} {r.name}{extra}", flush=True)

    suite = ob.run_suite(args.device, cases=cases, fusion=fusion,
                         progress=progress)
    # What-if: the cases rejected only for their opset, read as the nearest opset the importer reads.
    by_name = suite.by_name()
    clamped = {c.name: ob.run_case(c, args.device, fusion=fusion,
                                   clamp_opset=True)
               for c in cases if opset_rejected(by_name[c.name])}
    run = Run(suite, clamped)

    print("\n".join(summary_lines(run)))
    print(f"\nlargest causes (of {len(suite.results) - suite.counts()[ob.PASSED]} not passed):")
    for reason, k in categories(run)[: args.top]:
        print(f"  {k:5d}  {reason}")
    errors = [r for r in suite.results if r.status == ob.ERROR]
    if errors:
        print(f"\nerrors ({len(errors)}):")
        for r in errors:
            print(f"  {r.name}: {r.reason}")

    command = "python scripts/onnx_node_tests.py " + " ".join(
        a for a in (argv if argv is not None else sys.argv[1:]))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(to_json(run), indent=1) + "\n")
        print(f"\nwrote {args.json}")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(markdown(run, command.strip()))
        print(f"wrote {args.markdown}")
    path = args.excludes or ob.excludes_path(args.device)
    rc = 0
    if args.write_excludes:
        added, removed = write_excludes(run, path, partial=args.pattern is not None,
                                        reset=args.reset_reasons)
        print(f"wrote {path} ({added} added, {removed} removed)")
    if args.check_excludes:
        if not path.exists():
            print(f"no exclusion file {path}", file=sys.stderr)
            return 1
        chk = ob.check_excludes(suite, ob.read_excludes(path),
                                names=None if args.pattern else {c.name for c in cases})
        if args.pattern:  # a subset: names outside it are not unknown
            chk.unknown = []
        print("\nexclusion file: " + ("OK" if chk.ok else "\n" + chk.to_text()))
        rc = 0 if chk.ok else 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
