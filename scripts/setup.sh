#!/usr/bin/env bash
# Set up BindingBench in ./.venv on a fresh machine: the OpenGL library pyrender renders
# with, a CPU build of torch (unless one is already there), the package with its dev
# extra, and a PyOpenGL that works under OSMesa (pyrender pins 3.1.0, which does not).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! ldconfig -p 2>/dev/null | grep -q libOSMesa; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libosmesa6 >/dev/null
  else
    echo "setup: libOSMesa is missing; 3D generators need it: sudo apt-get install libosmesa6" >&2
  fi
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
PIP=".venv/bin/pip"
$PIP install -q --disable-pip-version-check --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  # On this project's machines a CPU wheel of torch 2.13.0 lies on disk; elsewhere pip
  # fetches the platform's default build.
  $PIP install -q --disable-pip-version-check "torch==2.13.0" 2>&1 | grep -v '^WARNING: Location' || true
fi
$PIP install -q --disable-pip-version-check -e ".[dev]" 2>&1 | grep -v '^WARNING: Location' || true
$PIP install -q --disable-pip-version-check "PyOpenGL==3.1.10" 2>&1 | grep -vE '^WARNING: Location|dependency resolver|pyrender .* requires PyOpenGL' || true
.venv/bin/python -c "import torch, transformers, pyrender, bench" >/dev/null
echo "setup: ready (.venv)"
