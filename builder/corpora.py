"""The standard code corpora of this project, defined once (benchmarks and the demo share them).

stdlib: the running Python's standard library '*.py' without its test suites and without the
interpreter's own site-packages (~3.4M SmolLM2 tokens with CPython 3.11).
code: every '*.py' under the interpreter's lib/pythonX.Y (stdlib, its tests and the base
interpreter's site-packages) plus this environment's site-packages (~100M tokens here).
"""
from __future__ import annotations

import sysconfig
from pathlib import Path

from builder.pipeline import BuildSettings

# Test suites are half of CPython's Lib/ and little like the code people write; site-packages is
# its own corpus.
STDLIB_EXCLUDE = ("site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__")


def stdlib_dir() -> str:
    return sysconfig.get_paths()["stdlib"]


def site_packages_dir() -> str:
    return sysconfig.get_paths()["purelib"]


def stdlib_settings(out: str, **overrides) -> BuildSettings:
    return BuildSettings(**{"corpus": (stdlib_dir(),), "out": out, "format": "files", "glob": "*.py",
                            "exclude": STDLIB_EXCLUDE, **overrides})


def code_settings(out: str, **overrides) -> BuildSettings:
    paths = (stdlib_dir(),) + ((site_packages_dir(),) if not _inside(site_packages_dir(), stdlib_dir()) else ())
    return BuildSettings(**{"corpus": paths, "out": out, "format": "files", "glob": "*.py",
                            "exclude": ("__pycache__",), **overrides})


def _inside(path: str, root: str) -> bool:
    return Path(path).resolve().is_relative_to(Path(root).resolve())
