"""``rlx run -o DIR`` writes one distinct file per output, always inside DIR (issue 14, item 7).

Output names come from the model file. ``a/b`` and ``a_b`` both cleaned to ``a_b.npy`` and the second
silently overwrote the first; a 300-character name crashed with an internal error. Every output now
gets its own plain file name (a deterministic hash suffix where names would clash), nothing is ever
written outside DIR, and a symbolic link planted at a file name is not followed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from rlx_core._hub import Hub, reset_hub
from rlx_core.cli import cli, output_filenames
from rlx_core.dtypes import DType
from rlx_core.ir.builder import GraphBuilder
from rlx_core.ir.serialize import save

HOSTILE = ["a/b", "a_b", "a:b", "../x", "/abs", "..", ".", ".hidden", "Y", "y", "n" * 300, "x\\y",
           "\u00e9t\u00e9", "a_b-" + "0" * 10]


@pytest.fixture(autouse=True)
def _cpu_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("RLX_BACKENDS", "cpu")
    monkeypatch.setenv("RLX_NO_CACHE", "1")
    reset_hub(Hub())
    yield
    reset_hub(Hub())


def model(tmp_path: Path, names: list[str]) -> Path:
    """Output k is x * (k + 1), so every saved file says which output it holds."""
    g = GraphBuilder("names")
    x = g.input("x", DType.F32, (2,))
    for k, n in enumerate(names):
        g.output(g.op("mul", x, g.const(float(k + 1), DType.F32)), n)
    path = tmp_path / "names.rlx"
    save(g.build(), path)
    return path


def test_every_output_gets_its_own_file_inside_the_folder(tmp_path: Path) -> None:
    x = np.array([1.0, 2.0], np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "deep" / "out"
    res = CliRunner().invoke(cli, ["run", str(model(tmp_path, HOSTILE)), "-i", f"x={tmp_path / 'x.npy'}",
                                   "-o", str(out), "--json", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    saved = {n: Path(v["saved"]) for n, v in json.loads(res.stdout)["outputs"].items()}
    assert set(saved) == set(HOSTILE)
    files = sorted(p.name for p in out.iterdir())
    assert len(files) == len(HOSTILE), files  # nothing overwritten
    assert len({f.casefold() for f in files}) == len(files)  # nor on a case-insensitive file system
    for k, n in enumerate(HOSTILE):
        assert saved[n].parent == out and not saved[n].name.startswith(".")
        np.testing.assert_array_equal(np.load(saved[n]), x * (k + 1))
    # Nothing was written next to or above the folder.
    assert sorted(p.name for p in (tmp_path / "deep").iterdir()) == ["out"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deep", "names.rlx", "x.npy"]
    # Plain names keep plain file names; the clashing one of a pair gets the suffix.
    assert saved["a_b"].name == "a_b.npy" and saved["Y"].name == "Y.npy"
    assert saved["a/b"].name.startswith("a_b-") and saved["y"].name.startswith("y-")


def test_file_names_are_deterministic_and_unique() -> None:
    first = output_filenames(HOSTILE)
    assert output_filenames(HOSTILE) == first
    assert output_filenames(list(reversed(HOSTILE))) == first
    assert len({f.casefold() for f in first.values()}) == len(HOSTILE)
    for f in first.values():
        assert "/" not in f and "\\" not in f and f.endswith(".npy") and len(f) <= 104
    # Names that need no cleaning keep their file names whatever else is in the model.
    assert output_filenames(["logits", "probs"]) == {"logits": "logits.npy", "probs": "probs.npy"}
    assert output_filenames(["logits:0"]) == {"logits:0": "logits_0.npy"}


def test_a_symlink_at_an_output_file_name_is_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    (out / "y.npy").symlink_to(victim)
    res = CliRunner().invoke(cli, ["run", str(model(tmp_path, ["y"])), "--random", "-o", str(out),
                                   "--device", "cpu"])
    assert res.exit_code == 1 and "symbolic link" in res.output, res.output
    assert victim.read_text() == "keep me"
