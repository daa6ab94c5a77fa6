#!/usr/bin/env bash
# Run on a machine with the network, before device_check.sh on one without: packs what the device
# needs into plugins/rlx-cuda/.carry (git-ignored; name it in the device tool's `carry`).
#   bash plugins/rlx-cuda/scripts/prepare_carry.sh            # MiniLM weights as f16 (44 MiB)
#   bash plugins/rlx-cuda/scripts/prepare_carry.sh --wheels   # + wheels of rlx-core's pure deps (py3.12)
set -euo pipefail
cd "$(dirname "$0")/../../.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
CARRY=plugins/rlx-cuda/.carry
"$PY" plugins/rlx-cuda/scripts/minilm_pack.py pack "$CARRY/minilm-f16"
if [ "${1:-}" = "--wheels" ]; then
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$CARRY/wheels" pluggy click rich markdown-it-py mdurl pygments ml_dtypes
fi
du -sh "$CARRY"
