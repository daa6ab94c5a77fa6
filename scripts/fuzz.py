#!/usr/bin/env python3
"""Fuzz RLX's file loaders and the names in them (issue 14, item 9).

CI runs a short, fixed campaign (tests/test_fuzz.py). This runs a long one:

    python scripts/fuzz.py --minutes 30                  # every format, then the hostile names
    python scripts/fuzz.py --minutes 10 --format onnx --seed 7 --deep 20
    python scripts/fuzz.py --atheris --format gguf       # coverage-guided (pip install atheris)
    python scripts/fuzz.py --reproduce crash.onnx --format onnx
    python scripts/fuzz.py --make-corpus                 # rewrite tests/fuzz/corpus/

Failing inputs are saved under --crashes (default build/fuzz-crashes/); exit code 1 if any.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "fuzz" / "corpus"


def main(argv: list[str] | None = None) -> int:
    from rlx_conformance import fuzz

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--format", "-f", action="append", choices=fuzz.FORMATS,
                    help="Fuzz only this format (repeatable; default: all four and the names).")
    ap.add_argument("--minutes", type=float, default=5.0, help="Total time, shared by the formats.")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--deep", type=int, default=25, metavar="N",
                    help="Compile and run every N-th mutant on cpu against the reference (0: never).")
    ap.add_argument("--timeout", type=float, default=20.0, help="Seconds one input may take (a hang).")
    ap.add_argument("--crashes", type=Path, default=ROOT / "build" / "fuzz-crashes")
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--no-names", action="store_true", help="Skip the hostile-names campaign.")
    ap.add_argument("--atheris", action="store_true", help="Coverage-guided, with atheris (one format).")
    ap.add_argument("--reproduce", type=Path, metavar="FILE",
                    help="Run one saved input and say what happens.")
    ap.add_argument("--make-corpus", action="store_true", help="Write the seed corpus and exit.")
    args, rest = ap.parse_known_args(argv)

    if args.make_corpus:
        for p in fuzz.write_corpus(args.corpus, args.format or fuzz.FORMATS):
            print(f"wrote {p.relative_to(ROOT) if p.is_relative_to(ROOT) else p} ({p.stat().st_size} bytes)")
        return 0
    if args.reproduce is not None:
        if not args.format or len(args.format) != 1:
            ap.error("--reproduce needs exactly one --format")
        kind, msg = fuzz.reproduce(args.format[0], args.reproduce, timeout=args.timeout)
        print(f"{kind}: {msg}")
        return 0 if kind in ("accepted", "refused") else 1
    if args.atheris:
        if not args.format or len(args.format) != 1:
            ap.error("--atheris needs exactly one --format")
        fuzz.atheris_main(args.format[0], args.corpus / args.format[0], rest)
        return 0
    if rest:
        ap.error(f"unknown arguments: {' '.join(rest)}")

    formats = args.format or list(fuzz.FORMATS)
    names = not args.no_names and not args.format
    share = args.minutes * 60 / (len(formats) + (0.25 if names else 0))
    failures = []
    for fmt in formats:
        def show(s: fuzz.Stats) -> None:
            print(f"  ... {s.summary()}", flush=True)

        stats = fuzz.campaign(fmt, args.corpus / fmt, seed=args.seed, seconds=share, timeout=args.timeout,
                              deep_every=args.deep, save_dir=args.crashes, progress=show)
        print(stats.summary(), flush=True)
        failures += stats.failures
    if names:
        stats = fuzz.names_campaign(timeout=args.timeout)
        print(stats.summary(), flush=True)
        failures += stats.failures
    for f in failures:
        print("FAIL", f.describe())
    print(f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
