"""The shipped stubs and py.typed: present in the installed package, matching
the extension module (mypy.stubtest), and usable by mypy --strict."""

from __future__ import annotations

import importlib.resources
import runpy
import subprocess
import sys
from pathlib import Path

from conftest import REPO

HERE = Path(__file__).parent


def test_stubs_and_marker_are_installed() -> None:
    files = importlib.resources.files("throttlegate")
    assert files.joinpath("py.typed").is_file()
    assert files.joinpath("_native.pyi").is_file()


def test_stubs_match_the_extension_module() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "throttlegate._native", "--ignore-missing-stub"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_typed_usage_passes_mypy_strict() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(HERE / "typing_usage.py")],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_package_sources_pass_mypy_strict() -> None:
    # The package's own Python modules (integrations, errors) against the stubs.
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "-p", "throttlegate"],
        capture_output=True,
        text=True,
        cwd=REPO / "bindings" / "python" / "python",
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_typed_usage_runs() -> None:
    runpy.run_path(str(HERE / "typing_usage.py"), run_name="typing_usage")
