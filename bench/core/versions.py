"""Versions of the packages whose behaviour can change the numbers we write."""

from __future__ import annotations

import platform
from functools import lru_cache
from importlib import metadata

TRACKED = ("numpy", "pyarrow", "pillow", "scipy", "torch", "transformers", "trimesh", "pyrender", "PyOpenGL")


@lru_cache(maxsize=1)
def package_versions() -> dict[str, str]:
    """Installed versions of the tracked packages (absent ones are left out)."""
    out = {"python": platform.python_version()}
    for name in TRACKED:
        try:
            out[name.lower()] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out
