#!/usr/bin/env bash
# Prove that the install lines of README "Install" work from the built distributions alone: no
# source tree, no editable installs. Each path gets a fresh virtual environment in a temporary folder
# outside the repository (the commands run from there, so nothing imports the checkout), installs
# only from dist/ (+ the registry for third-party dependencies, pinned by requirements/lock.txt),
# and runs a real job:
#   cpu         pip install "rlx-core[cpu]"; a small MLP compiled and run on cpu (checked against
#               NumPy), saved as .rlx and run again through `rlx run`; `rlx doctor` passes.
#   everything  pip install "rlx-core[all]"; `rlx doctor` passes every backend that has a device
#               here, and the MLP runs (checked) on each of them that accepts float32 graphs.
#   author      in the cpu environment: pip install "rlx-core[conformance]"; `rlx new-backend acme`,
#               pip install ./rlx-acme, `rlx conformance acme` certifies it.
# dist/ is (re)built with `scripts/dev.sh wheels` when it is missing or older than the sources.
# Environment: PYTHON (the interpreter of the fresh venvs, default python3), DIST (default dist/),
# DIST_CHECK_PATHS (default "cpu everything author"), KEEP=1 keeps the temporary folder.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
DIST="$(realpath -m "${DIST:-$REPO/dist}")"
LOCK="$REPO/requirements/lock.txt"
PATHS="${DIST_CHECK_PATHS:-cpu everything author}"

log() { printf '\n==> dist_check [%ss]: %s\n' "$SECONDS" "$*" >&2; }
die() { printf '\nERROR: dist_check: %s\n' "$*" >&2; exit 1; }

# -- dist/ up to date? -------------------------------------------------------------------------------
stale=""
if [ ! -f "$DIST/.built" ]; then
  stale="no $DIST/.built stamp"
else
  newer="$(cd "$REPO" && find pyproject.toml LICENSE docs/PACKAGE.md src plugins/*/pyproject.toml \
    plugins/*/README.md plugins/*/LICENSE plugins/*/src conformance/pyproject.toml conformance/README.md \
    conformance/LICENSE conformance/src -newer "$DIST/.built" -type f -not -name '*.pyc' \
    -not -path '*egg-info*' -print -quit 2>/dev/null || true)"
  [ -z "$newer" ] || stale="$newer changed after the last build"
fi
if [ -n "$stale" ]; then
  [ "$DIST" = "$REPO/dist" ] || die "$DIST is out of date ($stale); rebuild it with scripts/dev.sh wheels"
  log "building dist/ ($stale)"
  # With the dev environment's build tools when it has them; else dev.sh sets them up first.
  if "$REPO/.venv/bin/python" -c 'import build, twine, setuptools' 2>/dev/null; then
    PY="$REPO/.venv/bin/python" bash "$REPO/scripts/build_dists.sh"
  else
    bash "$REPO/scripts/dev.sh" wheels
  fi
fi
shopt -s nullglob
wheels=("$DIST"/*.whl)
((${#wheels[@]})) || die "no wheels in $DIST (run scripts/dev.sh wheels)"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/rlx-dist-check.XXXXXX")"
case "$WORK" in "$REPO"/*) die "temporary folder $WORK is inside the repository; set TMPDIR elsewhere" ;; esac
if [ "${KEEP:-0}" = 1 ]; then log "keeping $WORK"; else trap 'rm -rf "$WORK"' EXIT; fi
cd "$WORK"

# Our distributions must come from dist/, never from a registry that happens to hold the same name:
# pin each to the version built and check pip's install report afterwards.
for w in "${wheels[@]}"; do
  b="$(basename "$w")"; n="${b%%-*}"; rest="${b#*-}"
  printf '%s==%s\n' "${n//_/-}" "${rest%%-*}"
done > "$WORK/ours.txt"

# Third-party wheels (NumPy, Numba, ...) are kept in a wheelhouse outside the repository, so that
# only the first run asks the registry (here ~1 minute per fresh venv, whose index pages pip does not
# cache); installs then run with --no-index: dist/ and the wheelhouse only.
WHEELHOUSE="${WHEELHOUSE:-${XDG_CACHE_HOME:-$HOME/.cache}/rlx-dist-check/wheelhouse}"
mkdir -p "$WHEELHOUSE"
PIPQ=(-q --disable-pip-version-check -c "$LOCK" -c "$WORK/ours.txt")

# new_venv DIR: a fresh environment; pip_install DIR ARGS...: install from dist/ + the wheelhouse.
new_venv() { "$PYTHON" -m venv "$1" || die "could not create a venv with $PYTHON (python3-venv missing?)"; }
pip_install() {
  local env="$1"; shift
  # --no-compile: byte-compiling NumPy/Numba/llvmlite at install took most of the install time;
  # Python compiles what the jobs import anyway.
  local local_only=("$env/bin/python" -m pip install "${PIPQ[@]}" --no-compile --no-index --find-links "$DIST"
                    --find-links "$WHEELHOUSE" --report "$WORK/report.json")
  if ! "${local_only[@]}" "$@" 2>"$WORK/pip.err"; then
    log "fetching the third-party wheels of $* (and of rlx-core[all]) into $WHEELHOUSE"
    # One resolution for every path (rlx-core[all] covers cpu and conformance); setuptools and wheel
    # are the build backend of `pip install ./rlx-acme`, also installed --no-index.
    "$env/bin/python" -m pip download "${PIPQ[@]}" --find-links "$DIST" -d "$WHEELHOUSE" "$@" "rlx-core[all]" \
      setuptools wheel \
      || die "pip download $* failed (the registry unreachable, or requirements/lock.txt out of date?)"
    rm -f "$WHEELHOUSE"/rlx_* "$WHEELHOUSE"/rlx-*  # ours come from dist/ only, never an old copy
    "${local_only[@]}" "$@" || die "pip install $* failed in $env"
  fi
  "$env/bin/python" - "$WORK/report.json" "$DIST" <<'EOF' || die "an rlx distribution did not come from $DIST"
import json, sys
from pathlib import Path
report, dist = json.load(open(sys.argv[1])), Path(sys.argv[2]).resolve()
for item in report.get("install", []):
    name, url = item["metadata"]["name"], item.get("download_info", {}).get("url", "")
    if name.startswith("rlx-") and not (url.startswith("file://") and Path(url[7:]).resolve().parent == dist):
        sys.exit(f"{name} was installed from {url or 'an unknown place'}, not from {dist}")
EOF
}

# The job every path runs: an MLP on each named backend, checked against NumPy.
cat > "$WORK/mlp_job.py" <<'EOF'
import sys

import numpy as np

import rlx_core
from rlx_core import GraphBuilder, Session

assert "site-packages" in rlx_core.__file__, f"rlx_core imported from {rlx_core.__file__}, not the install"
rng = np.random.default_rng(0)
w1 = rng.standard_normal((64, 32)).astype(np.float32) * 0.1
w2 = rng.standard_normal((32, 10)).astype(np.float32) * 0.1
g = GraphBuilder("mlp")
x = g.input("x", "f32", ("batch", 64))
g.output(g.softmax(g.relu(x @ g.param("w1", w1)) @ g.param("w2", w2)), "probs")
graph = g.build()
xv = rng.standard_normal((4, 64)).astype(np.float32)
h = np.maximum(xv @ w1, 0) @ w2
want = np.exp(h - h.max(-1, keepdims=True))
want /= want.sum(-1, keepdims=True)
for name in sys.argv[1:]:
    got = Session(name).compile(graph).run(x=xv)["probs"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"MLP on {name}")
    print(f"MLP on {name}: ok, max |error| {np.abs(got - want).max():.1e}")
rlx_core.save(graph, "mlp.rlx")
np.save("x.npy", xv)
EOF

# -- cpu ------------------------------------------------------------------------------------------------
if [[ " $PATHS " == *" cpu "* || " $PATHS " == *" author "* ]]; then
  log "cpu: pip install \"rlx-core[cpu]\" (fresh venv in $WORK/cpu)"
  new_venv "$WORK/cpu"
  pip_install "$WORK/cpu" "rlx-core[cpu]"
  log "cpu: installed"
  "$WORK/cpu/bin/python" "$WORK/mlp_job.py" cpu || die "cpu: the MLP job failed"
  "$WORK/cpu/bin/rlx" run mlp.rlx --device cpu --input x=x.npy >/dev/null || die "cpu: rlx run mlp.rlx failed"
  "$WORK/cpu/bin/rlx" doctor >/dev/null || die "cpu: rlx doctor failed"
  if "$WORK/cpu/bin/python" -c 'import scipy' 2>/dev/null; then die "cpu: SciPy got installed (not needed)"; fi
  log "cpu: ok (venv $(du -sh "$WORK/cpu" | cut -f1))"
fi

# -- third-party author ----------------------------------------------------------------------------
if [[ " $PATHS " == *" author "* ]]; then
  log "author: pip install \"rlx-core[conformance]\"; rlx new-backend acme; pip install ./rlx-acme"
  pip_install "$WORK/cpu" "rlx-core[cpu,conformance]"
  log "author: installed"
  mkdir -p "$WORK/author" && cd "$WORK/author"
  "$WORK/cpu/bin/rlx" new-backend acme >/dev/null || die "author: rlx new-backend acme failed"
  [ -f rlx-acme/pyproject.toml ] || die "author: rlx new-backend acme did not write ./rlx-acme"
  "$WORK/cpu/bin/python" -m pip install "${PIPQ[@]}" --no-compile --no-index --find-links "$DIST" --find-links "$WHEELHOUSE" \
    ./rlx-acme || die "author: pip install ./rlx-acme failed"
  "$WORK/cpu/bin/rlx" conformance acme -q --json acme.json >conformance.log 2>&1 \
    || { cat conformance.log >&2; die "author: rlx conformance acme did not certify"; }
  "$WORK/cpu/bin/python" -c 'import json, sys; c = json.load(open("acme.json")); sys.exit(c.get("certified") is not True)' \
    || die "author: acme.json does not say certified"
  cd "$WORK"
  log "author: ok (acme certified)"
fi

# -- everything that runs here ---------------------------------------------------------------------
if [[ " $PATHS " == *" everything "* ]]; then
  log "everything: pip install \"rlx-core[all]\" (fresh venv in $WORK/all)"
  new_venv "$WORK/all"
  pip_install "$WORK/all" "rlx-core[all]"
  log "everything: installed"
  "$WORK/all/bin/rlx" doctor --json > doctor.json || die "everything: rlx doctor failed (see rlx doctor)"
  # Every backend with a device here must pass doctor's job; those without one (cuda on a machine
  # without an NVIDIA GPU) are reported, not failed.
  mapfile -t usable < <("$WORK/all/bin/python" - <<'EOF'
import json, sys
d = json.load(open("doctor.json"))
for b in d["backends"]:
    if b["status"] == "FAIL":
        sys.exit(f"rlx doctor: {b['name']} FAILED: {b.get('reason')}")
    print(b["name"] if b["status"] == "PASS" else f"#{b['name']} {b['status']}: {(b.get('reason') or '')[:100]}")
EOF
  ) || die "everything: a backend failed rlx doctor"
  run_on=()
  for b in "${usable[@]}"; do
    case "$b" in
      "#"*) log "everything: ${b#\#} (no device here)" ;;
      # INT8 code generators: doctor's own job ran on them; the float MLP is not what they are for.
      cortexm|fpga) ;;
      *) run_on+=("$b") ;;
    esac
  done
  [[ " ${run_on[*]} " == *" cpu "* && " ${run_on[*]} " == *" wasm "* ]] \
    || die "everything: cpu and wasm must be usable after pip install \"rlx-core[all]\" (got: ${run_on[*]})"
  "$WORK/all/bin/python" "$WORK/mlp_job.py" "${run_on[@]}" || die "everything: the MLP job failed"
  log "everything: ok on ${run_on[*]} (venv $(du -sh "$WORK/all" | cut -f1))"
fi
log "all paths passed ($PATHS)"
