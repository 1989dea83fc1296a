#!/usr/bin/env bash
# Set up BindingBench in ./.venv on a fresh machine: the OpenGL library pyrender renders
# with, Chromium and its driver for the report's and the site's tests, torch with a matching torchvision, the package with its test extra (timm, OpenCLIP,
# Ray, datasets, and mkdocs for the manual), and a PyOpenGL that works under OSMesa (pyrender pins 3.1.0, which does not).
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages: libosmesa6 (offscreen 3D rendering), chromium and chromium-driver (the report's
# and the site's tests open the pages in it, the site's through Selenium, and fail without them);
# installed when run as root with apt-get, else named.
missing=()
ldconfig -p 2>/dev/null | grep -q libOSMesa || missing+=(libosmesa6)
command -v chromium >/dev/null || command -v chromium-browser >/dev/null || command -v google-chrome >/dev/null \
  || missing+=(chromium)
command -v chromedriver >/dev/null || missing+=(chromium-driver)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "setup: missing ${missing[*]} (3D generators need libosmesa6, the report's and site's tests chromium and chromium-driver):" \
      "sudo apt-get install ${missing[*]}" >&2
  fi
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
PIP=".venv/bin/pip"
# Quiet: pip's notes on this machine's local index, pyrender's PyOpenGL pin (overridden on
# purpose below) and setuptools' editable-install banner are noise here.
pipq() {
  $PIP install -q --disable-pip-version-check "$@" 2>&1 \
    | grep -vE '^WARNING: Location|dependency resolver|pyrender .* requires PyOpenGL|BuildBackendWarning|^ *!!$|\*{20}|Please be careful|name as your package|precedence during imports|WheelFile\(wheel_path|^ *$' || true
}
# Re-running on a ready environment costs a second, not a reinstall.
if .venv/bin/python -c "import torch, torchvision, transformers, pyrender, timm, open_clip, ray, datasets, mkdocs, bench" 2>/dev/null \
   && [ .venv/.setup-stamp -nt pyproject.toml ]; then
  echo "setup: ready (.venv, already installed)"; exit 0
fi
pipq --upgrade pip
# timm and OpenCLIP need torchvision, and PyPI's torchvision only imports beside the torch
# build it was made for (the CUDA one; it runs on the CPU too). On this project's machines
# both files lie on disk, so this pair installs offline; the CPU-only torch 2.13.0 file there
# has no matching torchvision.
if ! .venv/bin/python -c "import torch, torchvision" 2>/dev/null; then
  pipq "torch==2.14.1" "torchvision==0.29.1"
fi
pipq -e ".[test]"
pipq "PyOpenGL==3.1.10"
.venv/bin/python -c "import torch, torchvision, transformers, pyrender, timm, open_clip, mkdocs, bench" >/dev/null
touch .venv/.setup-stamp
echo "setup: ready (.venv)"
