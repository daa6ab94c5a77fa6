#!/usr/bin/env bash
# A/B two checkouts of this repository in one run: MiniLM CPU p50 and MLP training img/s, with ONNX
# Runtime / NumPy in the same run as the yardstick. Runs alternate A, B, A, B so drift hits both.
#
#   git worktree add /tmp/before <commit>
#   bash bench/ab.sh /tmp/before .            # A = before, B = this checkout
#   WORKLOADS="resnet18 mlp" BATCHES="1 8" bash bench/ab.sh /tmp/before . 3
#
# WORKLOADS: any of minilm, resnet18, mlp (inference, `rlx bench infer`, ONNX Runtime alongside) and
# train (`rlx bench train-mlp` 784-128-10, NumPy alongside); default "minilm train". BATCHES: the
# inference batch sizes, default "1 8".
#
# Each side runs from its own sources (PYTHONPATH ahead of the editable installs of .venv) and its own
# cache directory; results go to build/ab/<side>-<round>-<workload>.json and a table on stdout.
set -euo pipefail
A="$(cd "${1:?usage: bench/ab.sh DIR_A DIR_B [ROUNDS]}" && pwd)"
B="$(cd "${2:?usage: bench/ab.sh DIR_A DIR_B [ROUNDS]}" && pwd)"
ROUNDS="${3:-2}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="$ROOT/.venv/bin/python"
OUT="$ROOT/build/ab"
mkdir -p "$OUT"

paths() {  # the source folders of one checkout, in the order the editable installs use
  local d="$1" p="$1/src:$1/conformance/src"
  for plug in "$d"/plugins/*/src; do p="$p:$plug"; done
  printf '%s' "$p"
}

WORKLOADS="${WORKLOADS:-minilm train}"
BATCHES="${BATCHES:-1 8}"

run_side() {  # side round
  local side="$1" round="$2" dir w b
  [ "$side" = A ] && dir="$A" || dir="$B"
  local cache="$OUT/cache-$side" bargs=()
  mkdir -p "$cache" && chmod 700 "$cache"
  for b in $BATCHES; do bargs+=(--batch "$b"); done
  echo "== $side (round $round): $dir" >&2
  for w in $WORKLOADS; do
    if [ "$w" = train ]; then
      PYTHONPATH="$(paths "$dir")" RLX_CACHE_DIR="$cache" "$PY" -m rlx_core.cli bench train-mlp \
        --arch 784-128-10 --batch 128 --peers numpy --json "$OUT/$side-$round-train.json" >/dev/null
    else
      PYTHONPATH="$(paths "$dir")" RLX_CACHE_DIR="$cache" "$PY" -m rlx_core.cli bench infer "$w" \
        "${bargs[@]}" --peers ort --json "$OUT/$side-$round-$w.json" >/dev/null
    fi
  done
}

for r in $(seq 1 "$ROUNDS"); do
  run_side A "$r"
  run_side B "$r"
done

"$PY" - "$OUT" "$ROUNDS" "$WORKLOADS" <<'EOF'
import json
import statistics
import sys
from pathlib import Path

out, rounds = Path(sys.argv[1]), int(sys.argv[2])


def load(side: str, r: int, what: str) -> dict:
    return json.loads((out / f"{side}-{r}-{what}.json").read_text())


def med(xs: list[float]) -> float:
    return statistics.median(xs)


workloads = sys.argv[3].split()
print(f"{'workload':<32}{'A':>12}{'B':>12}{'B/A':>8}   yardstick (ONNX Runtime / NumPy) A, B")
for w in (w for w in workloads if w != "train"):
    batches = sorted({row["batch"] for row in load("A", 1, w)["results"]})
    for batch in batches:
        a, b, pa, pb = [], [], [], []
        for r in range(1, rounds + 1):
            for side, rl, peer in (("A", a, pa), ("B", b, pb)):
                for row in load(side, r, w)["results"]:
                    if row["batch"] == batch:
                        (rl if row["runtime"] == "rlx" else peer).append(1e3 * row["p50_s"])
        label = f"{w} b{batch} p50 (ms)"
        print(f"{label:<32}{med(a):>12.2f}{med(b):>12.2f}{med(b) / med(a):>8.3f}"
              f"   {med(pa):.2f}, {med(pb):.2f}")
if "train" in workloads:
    runs = range(1, rounds + 1)
    a = [load("A", r, "train")["results"]["rlx"]["images_per_s"] for r in runs]
    b = [load("B", r, "train")["results"]["rlx"]["images_per_s"] for r in runs]
    ra = [x / load("A", r, "train")["results"]["numpy"]["images_per_s"] for x, r in zip(a, runs)]
    rb = [x / load("B", r, "train")["results"]["numpy"]["images_per_s"] for x, r in zip(b, runs)]
    print(f"{'MLP 784-128-10 train img/s':<32}{med(a):>12,.0f}{med(b):>12,.0f}{med(b) / med(a):>8.3f}"
          f"   RLX/NumPy {med(ra):.2f}, {med(rb):.2f}")
print(f"(median of {rounds} alternating rounds; JSON in {out})")
EOF
