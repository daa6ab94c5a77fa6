#!/usr/bin/env bash
# Build every distribution of the repository (the core, each plugins/rlx-*, the conformance suite)
# into dist/: an sdist, then the wheel built from that sdist (so a file missing from an sdist fails
# here), `twine check --strict` on all of them, and the dist/.built stamp scripts/dist_check.sh reads.
# Used by `scripts/dev.sh wheels` and scripts/dist_check.sh. PY: a Python with build, twine and
# setuptools installed (default .venv/bin/python; `scripts/dev.sh setup` makes it).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
die() { printf '\nERROR: build_dists: %s\n' "$*" >&2; exit 1; }
"$PY" -c 'import build, twine, setuptools' 2>/dev/null \
  || die "$PY lacks build/twine/setuptools: run scripts/dev.sh wheels (it installs them from requirements/lock.txt)"
mkdir -p build
rm -rf dist
# The plugins git tracks (a fresh clone's set; a plugin folder still being written is not built).
if git rev-parse --git-dir >/dev/null 2>&1; then
  mapfile -t plugins < <(git ls-files 'plugins/*/pyproject.toml' | xargs -n1 dirname)
else
  plugins=(plugins/rlx-*/)
fi
for d in . "${plugins[@]}" conformance; do
  printf '==> building %s\n' "$d" >&2
  # --no-isolation: the pinned setuptools of this environment builds, no registry round trip each time.
  "$PY" -m build --no-isolation -q --outdir dist "$d" >build/dist-build.log 2>&1 \
    || { cat build/dist-build.log >&2; die "building the distribution in $d failed"; }
done
"$PY" -m twine check --strict dist/* >build/twine-check.log 2>&1 \
  || { cat build/twine-check.log >&2; die "twine check failed for dist/"; }
touch dist/.built
printf '==> dist/: %s wheels, %s sdists, twine check passed\n' "$(find dist -name '*.whl' | wc -l)" \
  "$(find dist -name '*.tar.gz' | wc -l)" >&2
