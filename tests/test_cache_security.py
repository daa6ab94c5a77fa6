"""The on-disk caches are private and authenticated (issue 14, item 2).

Every cache lives under one root (``RLX_CACHE_DIR``, else the per-user cache dir), created 0700 and
refused when other users could write it; every entry is checked with a per-user HMAC key before it
is loaded, unpickled, dlopened or run, and a failing entry is deleted and rebuilt. The tampering
tests below change an entry so that it still parses (the old code used such entries as they were).
"""

from __future__ import annotations

import json
import math
import os
import pickle
import shutil
import stat
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from rlx_core import GraphBuilder, Session
from rlx_core import cache as cache_mod
from rlx_core.cache import CacheWarning, cache_root, cache_subdir, read_entry, write_entry
from rlx_core.ir.reference import evaluate


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    r = tmp_path / "rlx-cache"
    monkeypatch.setenv("RLX_CACHE_DIR", str(r))
    monkeypatch.delenv("RLX_NO_CACHE", raising=False)
    return r


def _cache_warnings(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, CacheWarning)]


def _graph() -> object:
    """An ``add`` node that stays a node, and legalization constants (the gelu/scale scalars)."""
    g = GraphBuilder("tamper")
    x = g.input("x", "f32", (4, 8))
    w = g.param("w", (np.arange(32, dtype=np.float32).reshape(4, 8) / 7))
    y = g.softmax(x + w)
    z = g.layer_norm(y, g.param("s", np.ones(8, np.float32)), g.param("b", np.zeros(8, np.float32)))
    g.output(g.gelu(z) * 3.0, "out")
    return g.build()


X = np.random.default_rng(5).standard_normal((4, 8)).astype(np.float32)


# -- the root ---------------------------------------------------------------------------------------

def test_root_is_created_private_with_a_private_key(root: Path) -> None:
    got = cache_root()
    assert got == root.resolve()
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    key = root / "auth.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and key.stat().st_size == 32
    sub = cache_subdir("compile")
    assert sub is not None and stat.S_IMODE(sub.stat().st_mode) == 0o700


def test_world_writable_root_is_refused_and_compiles_in_memory(root: Path) -> None:
    root.mkdir()
    root.chmod(0o777)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        assert cache_root() is None and cache_subdir("cpu-numba") is None
        graph = _graph()
        out = Session("cpu").compile(graph).run(x=X)["out"]
    msgs = _cache_warnings(rec)
    assert len(msgs) == 1 and "writable by others" in msgs[0], msgs
    np.testing.assert_allclose(out, evaluate(graph, {"x": X})["out"], rtol=1e-5, atol=1e-6)
    assert not (root / "auth.key").exists() and not (root / "compile").exists()


def test_group_writable_root_is_refused(root: Path) -> None:
    root.mkdir()
    root.chmod(0o770)
    with pytest.warns(CacheWarning, match="writable by its group"):
        assert cache_root() is None


def test_root_owned_by_another_user_is_refused(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Pretend to be someone else (works as root too: uid 0 + 1 owns none of these directories).
    root.mkdir(mode=0o700)
    monkeypatch.setattr(cache_mod, "_uid", lambda: os.geteuid() + 1)
    with pytest.warns(CacheWarning, match="owned by uid"):
        assert cache_root() is None


def test_parent_writable_by_others_without_sticky_bit_is_refused(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # anyone could rename our root away and put theirs in its place
    monkeypatch.setenv("RLX_CACHE_DIR", str(shared / "rlx"))
    with pytest.warns(CacheWarning, match="parent"):
        assert cache_root() is None
    shared.chmod(0o1777)  # /tmp-style sticky directory: others cannot rename our entries
    assert cache_root() == (shared / "rlx").resolve()


def test_key_readable_by_others_is_refused(root: Path) -> None:
    root.mkdir(mode=0o700)
    key = root / "auth.key"
    key.write_bytes(os.urandom(32))
    key.chmod(0o644)
    with pytest.warns(CacheWarning, match="key"):
        assert cache_root() is None


def test_key_symlink_is_refused(root: Path, tmp_path: Path) -> None:
    root.mkdir(mode=0o700)
    elsewhere = tmp_path / "k"
    elsewhere.write_bytes(os.urandom(32))
    elsewhere.chmod(0o600)
    (root / "auth.key").symlink_to(elsewhere)
    with pytest.warns(CacheWarning, match="key"):
        assert cache_root() is None


def test_symlinked_subdir_is_not_followed(root: Path, tmp_path: Path) -> None:
    assert cache_root() is not None
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    (root / "vulkan-spirv").symlink_to(target)
    with pytest.warns(CacheWarning, match="symlink"):
        assert cache_subdir("vulkan-spirv") is None


def test_no_cache_env_disables_without_warning(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLX_NO_CACHE", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache_root() is None and cache_subdir("compile") is None


def test_entries_are_authenticated_and_bound_to_their_name(root: Path) -> None:
    d = cache_subdir("compile")
    assert d is not None
    a, b = d / "aa.rlxc", d / "bb.rlxc"
    assert write_entry(a, b"hello") and write_entry(b, b"world")
    assert read_entry(a) == b"hello"
    raw = bytearray(a.read_bytes())
    raw[-1] ^= 1
    a.write_bytes(bytes(raw))
    assert read_entry(a) is None and not a.exists()  # discarded
    shutil.copy(b, a)  # a valid entry under another name
    assert read_entry(a) is None
    assert read_entry(tmp := Path("/nonexistent/x")) is None and not tmp.exists()


# -- the compile cache --------------------------------------------------------------------------

def _entry(root: Path) -> Path:
    files = [f for f in (root / "compile").rglob("*") if f.is_file() and f.suffix in (".rlxc", ".pkl")]
    assert len(files) == 1, files
    return files[0]


def test_tampered_compile_entry_op_is_rejected_and_rebuilt(root: Path) -> None:
    graph = _graph()
    want = evaluate(graph, {"x": X})["out"]
    r1 = Session("cpu").compile(graph).run(x=X)["out"]
    entry = _entry(root)
    raw = entry.read_bytes()
    # add -> sub in the node's op and claim (JSON header, or the old pickle's memoized short strings)
    bad = raw
    for a, b in ((b'"op":"add"', b'"op":"sub"'), (b'"cpu.add"', b'"cpu.sub"'),
                 (b"\x8c\x03add\x94", b"\x8c\x03sub\x94"), (b"\x8c\x07cpu.add\x94", b"\x8c\x07cpu.sub\x94")):
        bad = bad.replace(a, b)
    assert bad != raw
    if entry.suffix == ".rlxc":  # the tampered entry still parses: signed with the key it would be used
        assert write_entry(entry, bad[len(cache_mod.MAGIC) + cache_mod.TAG_BYTES:])
        forged = Session("cpu").compile(graph)
        assert forged.report.from_cache and not np.allclose(forged.run(x=X)["out"], want, atol=1e-3)
    entry.write_bytes(bad)
    s2 = Session("cpu")
    exe = s2.compile(graph)
    r2 = exe.run(x=X)["out"]
    np.testing.assert_allclose(r2, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(r1, r2)
    assert s2.cache is not None and s2.cache.hits == 0 and not exe.report.from_cache
    s3 = Session("cpu")  # the rebuilt entry is valid again
    assert s3.compile(graph).report.from_cache


def test_bit_flips_in_cached_constants_are_rejected(root: Path) -> None:
    graph = _graph()
    want = evaluate(graph, {"x": X})["out"]
    s1 = Session("cpu")
    legal, _ = s1.legalize(graph)
    consts = {k: np.asarray(v) for k, v in legal.graph.weights.items() if k not in graph.weights}
    assert consts
    entry = _entry(root)
    raw = bytearray(entry.read_bytes())
    flipped = 0
    for v in consts.values():
        b = v.tobytes()
        at = bytes(raw).find(b)
        if b and at >= 0 and bytes(raw).count(b) == 1:
            raw[at + len(b) - 1] ^= 0x40  # an exponent bit of a float32: still a number, a wrong one
            flipped += 1
    assert flipped, "no constant found in the entry"
    entry.write_bytes(bytes(raw))
    out = Session("cpu").compile(graph).run(x=X)["out"]
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


# -- plugin caches --------------------------------------------------------------------------------

def _replace(path: Path, data: bytes) -> None:
    """Tamper with a file by replacing it (a library this process has mapped must not change in place)."""
    tmp = path.with_name(path.name + ".planted")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _numba_graph() -> object:
    g = GraphBuilder("nb")
    x = g.input("x", "f32", (64, 1024))
    g.output(g.erf(x) * 2.5 + g.exp(-x) * 0.25, "y")  # erf: a generated (Numba) kernel at any size
    return g.build()


XN = np.random.default_rng(7).standard_normal((64, 1024)).astype(np.float32)
_ERF = np.vectorize(math.erf, otypes=[np.float64])


class _Planted:
    """A pickle that runs code when loaded: what a planted Numba index could do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (str(self.marker), "w"))


def test_planted_numba_index_is_pruned_before_numba_loads_it(root: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import numba
    from rlx_cpu import fused

    graph = _numba_graph()
    want = _ERF(XN) * 2.5 + np.exp(-XN) * 0.25
    monkeypatch.setattr(fused, "_MODULES", {})
    out = Session("cpu", use_cache=False).compile(graph).run(x=XN)["y"]
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    pyc = root / "cpu-numba" / "__pycache__"
    index = sorted(pyc.glob("rlx_fused_*.nbi"))
    assert index and all(Path(str(f) + ".mac").is_file() for f in index)
    for f in pyc.glob("rlx_fused_*.nbc"):
        assert Path(str(f) + ".mac").is_file()

    # Second process (simulated): untouched files are loaded from Numba's cache.
    monkeypatch.setattr(fused, "_MODULES", {})
    Session("cpu", use_cache=False).compile(graph).run(x=XN)
    mod = next(iter(fused._MODULES.values()))
    assert sum(mod.k_rows.stats.cache_hits.values()) >= 1

    marker = tmp_path / "pwned"
    for f in index:
        f.write_bytes(pickle.dumps(numba.__version__) + pickle.dumps((_Planted(marker), {})))
    monkeypatch.setattr(fused, "_MODULES", {})
    out = Session("cpu", use_cache=False).compile(graph).run(x=XN)["y"]
    assert not marker.exists(), "Numba unpickled a planted index"
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    mod = next(iter(fused._MODULES.values()))
    assert sum(mod.k_rows.stats.cache_hits.values()) == 0


def test_tampered_blas_copy_is_recopied_before_dlopen(root: Path) -> None:
    from rlx_cpu import blas

    src = blas._library()
    if src is None:
        pytest.skip("NumPy's bundled OpenBLAS is not there (not a PyPI NumPy wheel)")
    path, temporary = blas._private_copy(src)
    assert not temporary and Path(path + ".mac").is_file()
    good = Path(src).read_bytes()
    _replace(Path(path), good[:4096] + b"\xcc" * 64 + good[4160:])  # a planted library: same size
    again, _ = blas._private_copy(src)
    assert again == path and Path(path).read_bytes() == good
    os.unlink(path + ".mac")  # a copy without a sidecar is not trusted either
    _replace(Path(path), b"\x7fELF planted")
    blas._private_copy(src)
    assert Path(path).read_bytes() == good


def test_tampered_spirv_is_rejected(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("vulkan")
    from rlx_vulkan import vk

    if vk.glslang() is None:
        pytest.skip("glslangValidator is not installed")
    src = ("#version 450\nlayout(local_size_x = 1) in;\n"
           "layout(std430, binding = 0) buffer B { float b[]; };\n"
           "void main() { b[gl_GlobalInvocationID.x] += 1.0; }\n")
    vk.SPIRV.forget()
    spv = vk.compile_glsl(src)
    files = list((root / "vulkan-spirv").glob("*.spv"))
    assert len(files) == 1 and read_entry(files[0]) == spv
    raw = bytearray(files[0].read_bytes())
    raw[-5] ^= 0xFF
    files[0].write_bytes(bytes(raw))
    vk.SPIRV.forget()
    assert vk.compile_glsl(src) == spv
    files[0].write_bytes(spv)  # a raw SPIR-V file planted by someone else (or by the old code)
    vk.SPIRV.forget()
    assert vk.compile_glsl(src) == spv and read_entry(files[0]) == spv


def test_tampered_fpga_simulation_is_rebuilt(root: Path) -> None:
    if shutil.which("iverilog") is None or shutil.which("vvp") is None:
        pytest.skip("iverilog/vvp not installed")
    g = GraphBuilder("fadd")
    a = g.input("x", "f32", (8,))
    g.output(g.op("add", a, g.param("c", np.float32([0.5]))), "z")
    graph = g.build()
    x = np.arange(8, dtype=np.float32)
    assert (Session("fpga", use_cache=False).compile(graph).run(x=x)["z"] == x + 0.5).all()
    builds = [d for d in (root / "fpga-sim").iterdir() if d.is_dir() and not d.name.startswith("build-")]
    assert len(builds) == 1 and (builds[0] / ".rlx-manifest").is_file()
    vvp = builds[0] / "sim.vvp"
    vvp.write_text(vvp.read_text() + "\n# planted\n")
    (builds[0] / "extra.mem").write_text("00\n")
    assert (Session("fpga", use_cache=False).compile(graph).run(x=x)["z"] == x + 0.5).all()
    assert "# planted" not in vvp.read_text() and not (builds[0] / "extra.mem").exists()


def test_tampered_metal_host_library_is_rebuilt(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_metal import host, msl
    from rlx_metal.program import _single

    from rlx_core.dtypes import DType

    cxx = host.compiler()
    if cxx is None:
        pytest.skip("no C++ compiler")
    _, src = msl.elementwise_source(_single("abs", 1, {}), (DType.F32,), DType.F32)
    host.forget()
    host.build_all([src])
    libs = list((root / "metal-host").glob("k_*.so"))
    assert len(libs) == 1 and Path(str(libs[0]) + ".mac").is_file()
    good = libs[0].read_bytes()
    _replace(libs[0], good[:-16] + b"\0" * 16)  # never in place: this process has it mapped
    host.forget()
    host.build_all([src])
    assert Path(str(libs[0]) + ".mac").is_file() and libs[0].read_bytes() != good[:-16] + b"\0" * 16


def test_planted_calibration_is_ignored(root: Path) -> None:
    from rlx_core.calibrate import apply_calibration, calibration_path

    dev = Session("cpu", use_cache=False).device
    p = calibration_path(dev.backend, dev.name)
    p.write_text(json.dumps({"peak_flops": {"f32": 1.0}, "mem_bandwidth": 1.0, "launch_overhead": 9.0}))
    assert apply_calibration(dev).caps.launch_overhead == dev.caps.launch_overhead
    assert not p.exists()


# -- read-only cache ------------------------------------------------------------------------------

def test_read_only_cache_compiles_cpu_kernels_in_memory_with_one_warning(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_cpu import fused

    assert cache_root() is not None
    if os.geteuid() == 0:  # root writes through mode bits: make the check itself see a read-only dir
        monkeypatch.setattr(cache_mod, "_writable", lambda p: False)
    before = sorted(p for p in root.rglob("*"))
    root.chmod(0o500)
    try:
        monkeypatch.setattr(fused, "_MODULES", {})
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            graph = _numba_graph()
            out = Session("cpu").compile(graph).run(x=XN)["y"]
            Session("cpu").compile(graph).run(x=XN)  # a second compile: still one warning
    finally:
        root.chmod(0o700)
    msgs = _cache_warnings(rec)
    assert len(msgs) == 1 and "read-only" in msgs[0], msgs
    np.testing.assert_allclose(out, _ERF(XN) * 2.5 + np.exp(-XN) * 0.25, rtol=1e-5, atol=1e-6)
    assert sorted(p for p in root.rglob("*")) == before
    assert next(iter(fused._MODULES.values())).__file__.startswith("<")


# -- rlx cache info / clear -------------------------------------------------------------------------

def test_cache_info_and_clear_cover_every_cache(root: Path) -> None:
    from rlx_core.cli import cli

    Session("cpu").compile(_numba_graph()).run(x=XN)
    from rlx_cpu import blas

    src = blas._library()
    if src is not None:
        blas._private_copy(src)
    runner = CliRunner()
    r = runner.invoke(cli, ["cache", "info", "--json"])
    assert r.exit_code == 0, r.output
    info = json.loads(r.stdout)
    assert info["dir"] == str(root) and info["safe"] and info["authenticated"]
    caches = info["caches"]
    assert set(cache_mod.SUBDIRS) <= set(caches)
    assert caches["compile"]["entries"] >= 1 and caches["cpu-numba"]["entries"] >= 2
    assert caches["cpu-numba"]["bytes"] > 0
    if src is not None:
        assert caches["cpu-blas"]["entries"] == 1 and caches["cpu-blas"]["bytes"] > 1_000_000
    assert caches["cpu-numba"]["what"].startswith("rlx-cpu")  # the plugin's own words, not the core's
    text = runner.invoke(cli, ["cache", "info"]).stdout
    assert str(root) in text and "authenticated" in text and "cpu-numba" in text and "cpu-blas" in text
    r = runner.invoke(cli, ["cache", "clear"])
    assert r.exit_code == 0 and "compiled-graph" in r.stdout and "cpu-numba" in r.stdout
    info = json.loads(runner.invoke(cli, ["cache", "info", "--json"]).stdout)
    assert all(c["entries"] == 0 for n, c in info["caches"].items() if n != "calibration")
    assert (root / "auth.key").is_file()


def test_cache_info_reports_an_unsafe_root(root: Path) -> None:
    from rlx_core.cli import cli

    root.mkdir()
    root.chmod(0o777)
    info = json.loads(CliRunner().invoke(cli, ["cache", "info", "--json"]).stdout)
    assert not info["safe"] and "writable by others" in info["why"]
    assert "NOT USED" in CliRunner().invoke(cli, ["cache", "info"]).stdout


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def test_a_plugin_cache_describes_itself_in_printable_ascii(root: Path) -> None:
    assert cache_subdir("acme-kernels", about="acme \x1b[31mkernels\n(compiled)") is not None
    caches = cache_mod.describe()["caches"]
    assert caches["acme-kernels"]["what"] == "acme ?[31mkernels?(compiled)"
    assert caches["acme-kernels"]["entries"] == 0  # the description is not an entry
