#!/usr/bin/env bash
# bench/gpu_targets.py on a CUDA machine without network (the lent H200). Carried, git-ignored, made on a
# networked machine in build/gpu-carry/: deb/ (apt-get download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1
# libglx0 libgles2), whl/ (pip download --no-deps for the device Python: wgpu rendercanvas pycparser cffi
# moderngl glcontext vulkan), bin/glslangValidator. run(command="bash bench/gpu_targets_device.sh", carry=["build/gpu-carry"])
set -uo pipefail
C=build/gpu-carry
export PYTHONUNBUFFERED=1 RLX_CACHE_DIR=/tmp/rlx-cache XDG_RUNTIME_DIR=/tmp
for f in "$C"/deb/*.deb; do dpkg -x "$f" /; done
ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$C"/whl/*.whl && export PYTHONPATH=/tmp/site
export PATH="$PWD/$C/bin:$PATH"
lib=$(ldconfig -p | awk '/libGLX_nvidia.so.0/{print $NF; exit}')
[ -z "$lib" ] && lib=$(find /usr/local/nvidia /usr/lib -name 'libGLX_nvidia.so.0' 2>/dev/null | head -1)
icd=$(find /usr/local/nvidia /usr/share/vulkan /etc/vulkan /usr/lib -name 'nvidia_icd*.json' 2>/dev/null | head -1)
if [ -z "$icd" ] && [ -n "$lib" ]; then
  icd=/tmp/nvidia_icd.json
  printf '{"file_format_version":"1.0.0","ICD":{"library_path":"%s","api_version":"1.3.0"}}\n' "$lib" > "$icd"
fi
[ -n "$icd" ] && export VK_DRIVER_FILES="$icd" VK_ICD_FILENAMES="$icd"
egl=$(find /usr/local/nvidia /usr/share/glvnd /etc/glvnd -name '10_nvidia.json' 2>/dev/null | head -1)
if [ -z "$egl" ]; then
  elib=$(ldconfig -p | awk '/libEGL_nvidia.so.0/{print $NF; exit}')
  [ -z "$elib" ] && elib=$(find /usr/local/nvidia /usr/lib -name 'libEGL_nvidia.so.0' 2>/dev/null | head -1)
  [ -n "$elib" ] && egl=/tmp/10_nvidia.json && printf '{"file_format_version":"1.0.0","ICD":{"library_path":"%s"}}\n' "$elib" > "$egl"
fi
[ -n "$egl" ] && export __EGL_VENDOR_LIBRARY_FILENAMES="$egl"
echo "Vulkan ICD: ${icd:-none}; EGL vendor: ${egl:-none}"
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e plugins/rlx-cpu -e plugins/rlx-cuda \
  -e plugins/rlx-vulkan -e plugins/rlx-webgpu -e plugins/rlx-opengl -e plugins/rlx-directx || { echo "install failed"; exit 1; }
nvidia-smi -L
python3 -m rlx_core doctor 2>&1 | grep -E "PASS|FAIL|SKIP|:0" | head -20
timeout 380 python3 bench/gpu_targets.py --devices cuda,vulkan,webgpu,opengl,directx --batch 32 --seq 128 --gemm 4096 \
  --runs 5 --json "$OUT/gpu-targets-h200.json" 2>&1 | grep -v XDG_RUNTIME
