"""Build SuffixDecoding's C++ suffix tree (Snowflake ArcticInference) into this Python's site-packages.

    make peers            # = python -m benchmarks.peers.build_suffix
    python -m benchmarks.peers.build_suffix [--force] [--version 0.3.0] [--keep DIR]

Steps (each prints a line):
  1. nanobind (the version the sdist pins) is installed into this interpreter's environment with pip;
  2. the `arctic-inference` sdist is downloaded from PyPI with this interpreter's pip
     (`--no-deps --no-build-isolation --no-binary :all:`: its setup.py imports torch);
  3. only `csrc/suffix_decoding` is extracted and built with cmake (Release, nanobind);
  4. the extension goes to site-packages as the package `arctic_suffix_tree` (`arctic_suffix_tree._C`,
     the module name the C++ source declares), with a two-line __init__ written here;
  5. a smoke test imports it in a fresh interpreter and drafts from a toy tree.

Idempotent: an existing build of the same version that imports is left alone (--force rebuilds).
Nothing of the sdist is copied into this repository; the download and build live in a temporary
directory (--keep DIR keeps them). Only the benchmarks (benchmarks/peers/suffix_decoding.py) use it.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import textwrap
from pathlib import Path

PACKAGE = "arctic_suffix_tree"
DEFAULT_VERSION = "0.3.0"  # the release the wrapper in benchmarks/peers/suffix_decoding.py was read against
NANOBIND = "nanobind==2.9.2"  # what arctic-inference 0.3.0's pyproject pins for its build
SUBDIR = "csrc/suffix_decoding"


class BuildError(RuntimeError):
    pass


def log(msg: str) -> None:
    print(f"[peers] {msg}", flush=True)


def run(cmd: list[str], cwd: Path | None = None, what: str = "") -> str:
    proc = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode:
        tail = "\n".join(proc.stdout.splitlines()[-30:])
        raise BuildError(f"{what or cmd[0]} failed (exit {proc.returncode}): {' '.join(cmd)}\n{tail}")
    return proc.stdout


def site_packages() -> Path:
    return Path(sysconfig.get_paths()["platlib"])


def installed_version(python: str = sys.executable) -> str | None:
    """The built version if `arctic_suffix_tree` imports in a fresh interpreter, else None."""
    proc = subprocess.run([python, "-c", f"import {PACKAGE} as m; m.SuffixTree(4); print(m.__version__)"],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else None


def ensure_tools() -> None:
    missing = [t for t in ("cmake", "c++") if shutil.which(t) is None]
    if missing:
        raise BuildError(f"missing build tools: {', '.join(missing)} (install cmake >= 3.18 and a C++20 compiler)")


def ensure_nanobind() -> None:
    proc = subprocess.run([sys.executable, "-m", "nanobind", "--cmake_dir"], stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True)
    if proc.returncode == 0:
        log(f"nanobind present ({proc.stdout.strip()})")
        return
    log(f"installing {NANOBIND} into {sys.prefix}")
    run([sys.executable, "-m", "pip", "install", "-q", NANOBIND], what="pip install nanobind")


def download(version: str, into: Path) -> Path:
    log(f"downloading the arctic-inference {version} sdist from PyPI")
    run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-build-isolation", "--no-binary", ":all:",
         f"arctic-inference=={version}", "-d", str(into)], what="pip download arctic-inference")
    found = sorted(into.glob("arctic_inference-*.tar.gz"))
    if not found:
        raise BuildError(f"pip download left no arctic_inference-*.tar.gz in {into}")
    return found[-1]


def extract_suffix_sources(sdist: Path, into: Path) -> Path:
    """Extract only <top>/csrc/suffix_decoding/* (regular files, no paths escaping `into`)."""
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers()
                   if m.isfile() and f"/{SUBDIR}/" in m.name and ".." not in Path(m.name).parts]
        if not members:
            raise BuildError(f"{sdist.name} has no {SUBDIR}/ (did the sdist layout change?)")
        tar.extractall(into, members=members, filter="data")
    src = next(into.glob(f"*/{SUBDIR}"))
    log(f"extracted {len(members)} files of {SUBDIR}: {', '.join(sorted(m.name.rsplit('/', 1)[-1] for m in members))}")
    return src


def cmake_build(src: Path, build: Path, jobs: int) -> Path:
    log("configuring with cmake (Release)")
    run(["cmake", "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
         f"-DPython_EXECUTABLE={sys.executable}"], what="cmake configure")
    log(f"compiling with {jobs} jobs (a minute or two)")
    run(["cmake", "--build", str(build), "-j", str(jobs)], what="cmake build")
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    built = list(build.rglob(f"_C{suffix}"))
    if not built:
        raise BuildError(f"the build produced no _C{suffix} under {build}")
    return built[0]


def install(ext: Path, version: str) -> Path:
    dest = site_packages() / PACKAGE
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    shutil.copy2(ext, dest / ext.name)
    (dest / "__init__.py").write_text(textwrap.dedent(f'''\
        """SuffixDecoding's C++ suffix tree, built by `make peers` from the arctic-inference {version} sdist
        (csrc/suffix_decoding, Apache-2.0, Snowflake Inc.). Used by benchmarks/peers/suffix_decoding.py."""
        from ._C import Draft, SuffixTree

        __version__ = "{version}"
        __all__ = ["Draft", "SuffixTree"]
        '''), encoding="utf-8")
    return dest


SMOKE = f"""
import numpy as np, {PACKAGE} as m
t = m.SuffixTree(8)
t.extend_ndarray(0, np.array([5, 6, 7, 8, 5, 6, 7, 9], dtype=np.int32))
d = t.speculate_ndarray(np.array([1, 5, 6], dtype=np.int32), 8, 1.0, 0.0, 0.1, True)
assert list(d.token_ids[:1]) == [7] and d.match_len == 2, (list(d.token_ids), list(d.parents), d.match_len)
print(list(d.token_ids), list(d.parents), [round(p, 2) for p in d.probs], d.match_len)
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.peers.build_suffix", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--version", default=DEFAULT_VERSION, help=f"arctic-inference release (default {DEFAULT_VERSION})")
    p.add_argument("--force", action="store_true", help="rebuild even if an import works")
    p.add_argument("--keep", default=None, help="download and build in DIR and keep it (default: a temp dir)")
    p.add_argument("--jobs", type=int, default=2)
    args = p.parse_args(argv)
    have = installed_version()
    if have == args.version and not args.force:
        log(f"{PACKAGE} {have} is already built in {site_packages()} (--force rebuilds)")
        return 0
    try:
        ensure_tools()
        ensure_nanobind()
        with tempfile.TemporaryDirectory(prefix="peers-suffix-") as tmp:
            work = Path(args.keep) if args.keep else Path(tmp)
            work.mkdir(parents=True, exist_ok=True)
            sdist = download(args.version, work / "sdist")
            src = extract_suffix_sources(sdist, work / "src")
            ext = cmake_build(src, work / "build", args.jobs)
            dest = install(ext, args.version)
            log(f"installed {dest}")
        log("smoke test: " + run([sys.executable, "-c", SMOKE], what="smoke test").strip())
    except BuildError as exc:
        print(f"[peers] error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
