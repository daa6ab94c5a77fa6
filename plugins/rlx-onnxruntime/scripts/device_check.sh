#!/usr/bin/env bash
# rlx-onnxruntime on the H200: the CUDA execution provider through onnxruntime-gpu (not run by CI).
#
# The device image has onnxruntime 1.30.0 (CPU build only), CUDA 13 and cuDNN 9 for CUDA 13
# (nvidia-cudnn-cu13, nvidia-cublas, nvidia-cuda-runtime, nvidia-cufft, nvidia-curand come with
# PyTorch), which is what onnxruntime-gpu 1.31.x needs (its METADATA: nvidia-cuda-runtime~=13.0,
# nvidia-cudnn-cu13~=9.0, nvidia-cufft~=12.0, nvidia-curand~=10.0). The wheel is 255 MB, more than
# one device call carries (64 MiB with the working tree), so it travels in 20 MiB parts made here:
#
#   pip download onnxruntime-gpu==1.31.1 --python-version 3.12 --only-binary=:all: --no-deps \
#       -d build/gpu-carry/ort
#   (cd build/gpu-carry/ort && sha256sum onnxruntime_gpu-*.whl > SHA256 && mkdir -p parts &&
#    split -b 20m -d -a 2 onnxruntime_gpu-*.whl parts/ort-gpu.whl.part)
#
# then one call per part with carry=["build/gpu-carry/ort/parts/ort-gpu.whl.partNN",
# "build/gpu-carry/ort/SHA256"] and the command `bash plugins/rlx-onnxruntime/scripts/device_check.sh
# stash` (each part is moved to /tmp/ort-parts, which survives while the machine stays warm), and
# finally `bash plugins/rlx-onnxruntime/scripts/device_check.sh run`. `run` also takes the whole
# wheel when build/gpu-carry/ort/*.whl travelled some other way.
set -uo pipefail
export PYTHONUNBUFFERED=1 RLX_CACHE_DIR=/tmp/rlx-cache
HERE=build/gpu-carry/ort
STASH=/tmp/ort-parts
OUT=${OUT:-/tmp/out}
mkdir -p "$STASH" "$OUT"

if [ "${1:-run}" = stash ]; then
  cp -f "$HERE"/parts/ort-gpu.whl.part* "$STASH"/ 2>/dev/null
  [ -f "$HERE/SHA256" ] && cp -f "$HERE/SHA256" "$STASH/"
  ls -la "$STASH"
  exit 0
fi

wheel=$(ls "$HERE"/onnxruntime_gpu-*.whl 2>/dev/null | head -1)
if [ -z "$wheel" ]; then
  [ -f "$STASH/SHA256" ] || { echo "no wheel and no stashed SHA256: carry the parts first"; exit 2; }
  name=$(awk '{print $2}' "$STASH/SHA256")
  wheel=/tmp/$name
  cat "$STASH"/ort-gpu.whl.part* > "$wheel"
  (cd /tmp && sha256sum -c "$STASH/SHA256") || { echo "reassembled wheel is incomplete or corrupt"; exit 2; }
fi
# onnxruntime-gpu installs the same `onnxruntime` module as the image's CPU build: a --target
# first on PYTHONPATH shadows it.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/ortgpu "$wheel" || exit 1
export PYTHONPATH=/tmp/ortgpu${PYTHONPATH:+:$PYTHONPATH}
# cuDNN/cuBLAS/cuFFT/cuRAND come from PyTorch's nvidia-* wheels: preload them the way onnxruntime's
# own helper does, so the CUDA provider's dlopen finds them.
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e plugins/rlx-cpu \
  -e plugins/rlx-onnxruntime -e conformance || { echo "install failed"; exit 1; }
nvidia-smi -L
python3 - <<'EOF'
import onnxruntime as ort
print("onnxruntime", ort.__version__, ort.__file__)
ort.preload_dlls()  # CUDA/cuDNN from the nvidia-* wheels PyTorch installed
print("available providers:", ort.get_available_providers())
EOF
export RLX_ONNXRUNTIME_PROVIDERS=CUDAExecutionProvider,CPUExecutionProvider
python3 -m rlx_core doctor 2>&1 | grep -A3 onnxruntime | head -8
python3 - <<'EOF' 2>&1 | tee "$OUT/minilm.txt"
import time
import numpy as np
import onnxruntime as ort
ort.preload_dlls()
from rlx_core.models.minilm import MiniLM
m = MiniLM(use_cache=False)
sents = [f"sentence number {i} about tensors on a GPU" for i in range(64)]
ref = m.embed(sents, device="cpu")
for dev in ("onnxruntime",):
    m.embed(sents, device=dev)
    t = time.perf_counter(); got = m.embed(sents, device=dev); dt = time.perf_counter() - t
    cos = float(np.min(np.sum(ref * got, axis=1)))
    print(f"{dev}: min cosine vs rlx-cpu {cos:.7f}, {dt*1e3:.1f} ms for 64 sentences")
    rep = m.executable(dev).report
    kinds = sorted({e.kernels[0].split('.')[1] for e in rep.entries if e.kernels})
    print("providers in the dispatch report:", kinds)
EOF
# CUDA-claimed variants first, CPU for the rest (the provider order above); the certificate names
# which provider served each variant.
timeout 420 python3 -m rlx_core conformance onnxruntime -q --markdown "$OUT/ort-cuda-cert.md" \
  2>&1 | tail -25 | tee "$OUT/conformance.txt"
