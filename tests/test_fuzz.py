"""The CI fuzz campaign (issue 14, item 9): fixed seeds and iteration counts, well under 2 minutes.

Each format's loader gets its seed corpus (tests/fuzz/corpus/<format>/, written by
``python scripts/fuzz.py --make-corpus``) and a fixed number of byte-level and structure-aware
mutants; every hostile name goes through save/load, cpu, the ONNX importer and the exporters. A
failure is an exception that is not an RLXError, a wrong result, or a hang; the failing input is
saved under the test's tmp folder and the message says how to reproduce it. Longer campaigns:
``python scripts/fuzz.py --minutes 30``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

fuzz = pytest.importorskip("rlx_conformance.fuzz")
pytest.importorskip("onnx")
pytest.importorskip("gguf")

CORPUS = Path(__file__).parent / "fuzz" / "corpus"
#: (seed, mutants, every n-th mutant also compiled and run on cpu against the reference). About
#: 20 s in all on one core of a 2-core machine; the budget is 2 minutes.
CAMPAIGN = {"rlx": (14, 2000, 4), "safetensors": (14, 2500, 0), "gguf": (14, 2000, 0),
            "onnx": (14, 1500, 4)}


def _report(stats: Any, fmt: str) -> str:
    lines = [f.describe() for f in stats.failures[:10]]
    return (f"{stats.summary()}\n" + "\n".join(lines)
            + f"\nreproduce: python scripts/fuzz.py --reproduce FILE --format {fmt}")


@pytest.mark.parametrize("fmt", fuzz.FORMATS)
def test_seed_corpus_is_present_small_and_accepted(fmt: str, tmp_path: Path) -> None:
    files = fuzz.corpus_files(CORPUS / fmt)
    assert len(files) >= 3, f"regenerate with: python scripts/fuzz.py --make-corpus --format {fmt}"
    for p in files:
        assert p.stat().st_size < 16 * 1024
        out = fuzz.run_one(fmt, p.read_bytes(), tmp_path, deep=True)
        assert out == ("accepted", ""), (p, out)


@pytest.mark.parametrize("fmt", fuzz.FORMATS)
def test_fuzz_campaign(fmt: str, tmp_path: Path) -> None:
    seed, iterations, deep = CAMPAIGN[fmt]
    stats = fuzz.campaign(fmt, CORPUS / fmt, seed=seed, iterations=iterations, timeout=20.0,
                          deep_every=deep, workdir=tmp_path / "work", save_dir=tmp_path / "crashes")
    assert not stats.failures, _report(stats, fmt)
    assert stats.runs == iterations + len(fuzz.corpus_files(CORPUS / fmt))
    assert stats.accepted > 0  # some mutants must get through, or the loaders are not exercised


def test_hostile_names_through_every_path(tmp_path: Path) -> None:
    from rlx_conformance.hostile import hostile_names

    stats = fuzz.names_campaign(timeout=60.0, workdir=tmp_path)
    assert not stats.failures, _report(stats, "names")
    assert stats.runs == len(fuzz.NAME_PATHS) * len(hostile_names())


# ---------------------------------------------------------------------------------------------
# The harness itself: it must see crashes, wrong results and hangs, and be deterministic


def test_the_harness_catches_crashes_wrong_results_and_hangs(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_core.errors import SerializationError

    def refuse(path: Path, deep: bool) -> None:
        raise SerializationError("refused")

    def crash(path: Path, deep: bool) -> None:
        raise ValueError("raw")

    def wrong(path: Path, deep: bool) -> None:
        raise fuzz.WrongResult("differs")

    def hang(path: Path, deep: bool) -> None:
        time.sleep(5)

    for check, expect in ((refuse, None), (crash, "crash"), (wrong, "wrong result"), (hang, "hang")):
        monkeypatch.setitem(fuzz.CHECKS, "rlx", check)
        t0 = time.monotonic()
        out = fuzz.run_one("rlx", b"x", tmp_path, timeout=0.3)
        assert (out[0] if out else None) == expect, out
        assert time.monotonic() - t0 < 3


def test_mutants_are_deterministic() -> None:
    import random

    corpus = [p.read_bytes() for p in fuzz.corpus_files(CORPUS / "onnx")]
    for fmt in fuzz.FORMATS:
        base = fuzz.corpus_files(CORPUS / fmt)[0].read_bytes()
        a = [fuzz.mutate(fmt, random.Random(f"{fmt}:{i}"), base, corpus) for i in range(30)]
        b = [fuzz.mutate(fmt, random.Random(f"{fmt}:{i}"), base, corpus) for i in range(30)]
        assert a == b and len(set(a)) > 10


def test_the_corpus_script_writes_loadable_seeds(tmp_path: Path) -> None:
    written = fuzz.write_corpus(tmp_path)
    assert {p.parent.name for p in written} == set(fuzz.FORMATS)
    for p in written:
        assert fuzz.run_one(p.parent.name, p.read_bytes(), tmp_path) == ("accepted", ""), p


# ---------------------------------------------------------------------------------------------
# What the campaigns found, pinned

def test_an_op_that_is_not_a_string_is_a_serialization_error(tmp_path: Path) -> None:
    # Found by the structure-aware .rlx mutator: a list as a node's op raised TypeError (unhashable).
    import json

    from rlx_core import load
    from rlx_core.errors import SerializationError
    from rlx_core.formats.safetensors import read_safetensors, write_safetensors

    seed = fuzz.corpus_files(CORPUS / "rlx")[0]
    tensors, meta = read_safetensors(seed, mmap=False)
    graph = json.loads(meta["graph"])
    graph["nodes"][0]["op"] = ["add"]
    meta["graph"] = json.dumps(graph)
    bad = tmp_path / "bad.rlx"
    write_safetensors(bad, tensors, meta)
    with pytest.raises(SerializationError, match="op"):
        load(bad)
