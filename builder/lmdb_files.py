"""LMDB directory chores of a build: open, read meta safely, trim, publish atomically, clean up.

`writemap=True` makes LMDB grow data.mdb to the whole map size (1 TiB of sparse file with
`MAP_SIZE`); after the final sync the file is cut back to the pages in use, which is what any reader
maps (readers never touch a page past `last_pgno`).
"""
from __future__ import annotations

import ctypes
import json
import os
import shutil
from pathlib import Path

import lmdb

from datastore.format import FORMAT_VERSION, MAP_SIZE, META_KEY, DatastoreError

TMP_MARK = ".building-"
_RENAME_EXCHANGE = 2  # linux/fs.h


def open_for_write(path: Path) -> lmdb.Environment:
    return lmdb.open(str(path), map_size=MAP_SIZE, writemap=True, sync=False, metasync=False,
                     subdir=True, readahead=False)


def open_read_only(path: Path) -> lmdb.Environment:
    """Open a finished store read-only, refusing a data.mdb shorter than its pages (else SIGBUS)."""
    data = path / "data.mdb"
    if not data.is_file():
        raise DatastoreError(f"{path}: not a datastore (no data.mdb)")
    try:
        env = lmdb.open(str(path), readonly=True, lock=False, subdir=True, readahead=False)
    except lmdb.Error as exc:
        raise DatastoreError(f"{path}: cannot open the LMDB environment: {exc}") from exc
    need = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    have = data.stat().st_size
    if have < need:
        env.close()
        raise DatastoreError(f"{data}: truncated ({have} bytes, its pages need {need})")
    return env


def read_meta(env: lmdb.Environment, path: Path) -> dict:
    with env.begin() as txn:
        raw = txn.get(META_KEY)
    if raw is None:
        raise DatastoreError(f"{path}: not a draftstore datastore (no 'meta' key)")
    try:
        meta = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DatastoreError(f"{path}: unreadable meta: {exc}") from exc
    if not isinstance(meta, dict) or meta.get("format_version") != FORMAT_VERSION:
        found = meta.get("format_version") if isinstance(meta, dict) else None
        raise DatastoreError(f"{path}: format_version {found!r}, this builder writes {FORMAT_VERSION}")
    return meta


def trim_data_file(path: Path, used_bytes: int) -> None:
    """Cut data.mdb back to its pages and make the new length durable."""
    data = path / "data.mdb"
    with open(data, "r+b") as f:
        if os.fstat(f.fileno()).st_size > used_bytes:
            f.truncate(used_bytes)
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def used_bytes(env: lmdb.Environment) -> int:
    return (env.info()["last_pgno"] + 1) * env.stat()["psize"]


def temp_dir_for(out: Path) -> Path:
    """A fresh sibling of out (same filesystem, so the final rename is atomic)."""
    tmp = out.with_name(f".{out.name}{TMP_MARK}{os.getpid()}-{os.urandom(4).hex()}")
    tmp.mkdir()
    return tmp


def remove_stale_temps(out: Path) -> None:
    """Delete temp dirs that builds killed by a signal left next to out (their pid is gone)."""
    for tmp in out.parent.glob(f".{out.name}{TMP_MARK}*"):
        pid = tmp.name.rsplit(TMP_MARK, 1)[1].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def publish(tmp: Path, out: Path) -> None:
    """Move tmp to out; an existing out is swapped atomically where Linux allows, then removed."""
    if not out.exists():
        os.rename(tmp, out)
    elif _exchange(tmp, out):
        shutil.rmtree(tmp, ignore_errors=True)  # tmp now holds the previous store
    else:
        old = out.with_name(f".{out.name}{TMP_MARK}{os.getpid()}-old")
        os.rename(out, old)
        os.rename(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    _fsync_dir(out.parent)  # the rename itself survives a crash


def _exchange(a: Path, b: Path) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    ok = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0
    return ok
