"""rlx-cpu's private OpenBLAS copy: one copy in the cache, shared by every environment with the same
NumPy build (it used to be one 25 MB copy per virtual environment), and shown by `rlx cache info`."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rlx_core.cache import describe


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    r = tmp_path / "rlx-cache"
    monkeypatch.setenv("RLX_CACHE_DIR", str(r))
    monkeypatch.delenv("RLX_NO_CACHE", raising=False)
    return r


def test_one_shared_copy_and_older_ones_pruned(root: Path, tmp_path: Path) -> None:
    from rlx_cpu import blas

    src = blas._library()
    if src is None:
        pytest.skip("NumPy's bundled OpenBLAS is not there (not a PyPI NumPy wheel)")
    # Two "virtual environments" holding the same NumPy build: same file name, other paths.
    copies = []
    for venv in ("venv-a", "venv-b"):
        d = tmp_path / venv / "numpy.libs"
        d.mkdir(parents=True)
        copies.append(str(shutil.copy2(src, d / Path(src).name)))
    first, temp_a = blas._private_copy(copies[0])
    second, temp_b = blas._private_copy(copies[1])
    assert not temp_a and not temp_b and first == second
    libs = sorted(p.name for p in (root / "cpu-blas").glob("rlx_openblas_*.so"))
    assert libs == [Path(first).name]
    # Another NumPy build (another file name): its copy replaces the old one, never adds a second.
    other = tmp_path / "venv-c" / "numpy.libs" / "libscipy_openblas64_-00000000.so"
    other.parent.mkdir(parents=True)
    shutil.copy2(src, other)
    third, _ = blas._private_copy(str(other))
    assert third != first
    assert sorted(p.name for p in (root / "cpu-blas").glob("rlx_openblas_*")) == \
        sorted([Path(third).name, Path(third).name + ".mac"])
    info = describe()["caches"]["cpu-blas"]
    assert info["entries"] == 1 and "OpenBLAS" in info["what"]
