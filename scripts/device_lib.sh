# Shared by the scripts that run on the lent GPU machine (plugins/*/scripts/*.sh): sourced, never run.
# No network there, one call of at most 600 s, so every step is time-bounded and ends in one line of a
# summary; a missing driver piece is said by name.
#
#   BUDGET=530 STAGES="doctor tests" ORDER=(doctor tests bench); source scripts/device_lib.sh
#   stage tests 180 "$PY" -m pytest ...      # PASS / FAIL (exit N) / TIMEOUT / not selected, with seconds
#   nvidia_vulkan_icd || echo "no ICD"        # exports VK_DRIVER_FILES for the NVIDIA driver
#   nvidia_egl_vendor                         # exports __EGL_VENDOR_LIBRARY_FILENAMES
#   "${RLX[@]}" doctor                        # the rlx CLI of $PY, without console scripts
#
# BUDGET: seconds for the whole script (default 570); STAGES: the stage names to run (unset: all);
# ORDER: the stage names the summary lists (printed on exit); PY: the Python (default python3).
# shellcheck shell=bash

declare -A RESULT
BUDGET="${BUDGET:-570}"
PY="${PY:-${PYTHON:-python3}}"
_STAGES=" ${STAGES:-} "
RLX=("$PY" -c 'import sys; from rlx_core.cli import main; sys.argv[0] = "rlx"; main()')

log() { printf '\n==> %s\n' "$*"; }

stage() {  # stage NAME CAP CMD...: run within min(CAP, what is left of BUDGET); record the outcome
  local name="$1" limit="$2"; shift 2
  if [[ "$_STAGES" != "  " && "$_STAGES" != *" $name "* ]]; then
    RESULT[$name]="not selected (STAGES)"; return 0
  fi
  local left=$((BUDGET - SECONDS - 15))
  ((left < limit)) && limit=$left
  if ((limit < 20)); then RESULT[$name]="FAIL: skipped, no time left in BUDGET=${BUDGET}s"; return 1; fi
  log "$name (limit ${limit}s): $*"
  local t0=$SECONDS rc
  timeout --kill-after=10 "$limit" "$@"
  rc=$?
  case $rc in
    0) RESULT[$name]="PASS";;
    124|137) RESULT[$name]="TIMEOUT after ${limit}s";;
    *) RESULT[$name]="FAIL (exit $rc)";;
  esac
  RESULT[$name]+=" in $((SECONDS - t0))s"
  return $rc
}

summary() {  # once: called where the script wants it, else on exit
  [ -n "${ORDER+x}" ] && [ -z "${_SUMMARY_DONE:-}" ] || return 0
  _SUMMARY_DONE=1
  log "summary (${0##*/}, ${SECONDS}s)"
  local k
  for k in "${ORDER[@]}"; do printf '  %-16s %s\n' "$k" "${RESULT[$k]:-FAIL: not run}"; done
  [ -n "${OUT:-}" ] && echo "  files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
  return 0
}
trap summary EXIT

nvidia_vulkan_icd() {  # the driver's Vulkan ICD JSON if mounted, else one describing libGLX_nvidia
  local icd lib
  icd=$(find /usr/local/nvidia /usr/share/vulkan /etc/vulkan /usr/lib -name 'nvidia_icd*.json' 2>/dev/null | head -1)
  if [ -z "$icd" ]; then
    # the driver ships the ICD inside libGLX_nvidia; describe it to the loader ourselves
    lib=$(ldconfig -p | awk '/libGLX_nvidia.so.0/{print $NF; exit}')
    [ -z "$lib" ] && lib=$(find /usr/local/nvidia /usr/lib -name 'libGLX_nvidia.so.0' 2>/dev/null | head -1)
    if [ -n "$lib" ]; then
      icd=/tmp/nvidia_icd.json
      printf '{"file_format_version":"1.0.0","ICD":{"library_path":"%s","api_version":"1.3.0"}}\n' "$lib" > "$icd"
    fi
  fi
  if [ -z "$icd" ]; then echo "FAIL: no NVIDIA Vulkan ICD found"; return 1; fi
  export VK_DRIVER_FILES="$icd" VK_ICD_FILENAMES="$icd"
  echo "Vulkan ICD: $icd"
}

nvidia_egl_vendor() {  # GLVND's vendor JSON for libEGL_nvidia (mounted, or written here)
  local egl lib
  egl=$(find /usr/local/nvidia /usr/share/glvnd /etc/glvnd -name '10_nvidia.json' 2>/dev/null | head -1)
  if [ -z "$egl" ]; then
    lib=$(ldconfig -p | awk '/libEGL_nvidia.so.0/{print $NF; exit}')
    [ -z "$lib" ] && lib=$(find /usr/local/nvidia /usr/lib -name 'libEGL_nvidia.so.0' 2>/dev/null | head -1)
    if [ -n "$lib" ]; then
      egl=/tmp/10_nvidia.json
      printf '{"file_format_version":"1.0.0","ICD":{"library_path":"%s"}}\n' "$lib" > "$egl"
    fi
  fi
  if [ -z "$egl" ]; then echo "FAIL: no NVIDIA EGL vendor library found"; return 1; fi
  export __EGL_VENDOR_LIBRARY_FILENAMES="$egl"
  echo "EGL vendor: $egl"
}

unpack_debs() {  # unpack_debs DIR: the carried .debs into / (no apt, no network); 1 if none or one fails
  local f ok=0
  ls "$1"/*.deb >/dev/null 2>&1 || { echo "FAIL: no $1/*.deb (carry it)"; return 1; }
  for f in "$1"/*.deb; do dpkg -x "$f" / || ok=1; done
  ldconfig || true
  return $ok
}
