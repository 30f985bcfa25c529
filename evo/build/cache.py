"""A content-addressed cache of NVRTC's output on disk, shared by every process that compiles ($KF_BUILD_CACHE).

The build key hashes everything that changes the compiled code (genome, arch, dtypes, specialized dims, the
compiler's version, flags and the rendered source), so NVRTC's answer for one key never changes: the cubin and
the log of a compile that succeeded, or the log of one NVRTC refused. Both are kept; what is derived from them
(resources, the launch-limit check) is derived again on every read. A compile that was killed for its time is not
NVRTC's answer and is never kept. Unset or empty, nothing is cached on disk.

One file per key, written whole and then renamed into place, so compile processes and test workers on one
machine share it without locks: a reader sees a whole entry or none. No pickle: a header line of JSON, then the
cubin's bytes, so a cache folder written by someone else cannot run code here.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

ENV = "KF_BUILD_CACHE"
_KEY_CHARS = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class Compiled:
    """What NVRTC answered for one build key."""

    ok: bool
    cubin: bytes
    log: str
    compile_ms: float


def cache_dir() -> Path | None:
    """The folder $KF_BUILD_CACHE names, or None when unset or empty."""
    raw = os.environ.get(ENV, "").strip()
    return Path(raw) if raw else None


def _path(root: Path, key: str) -> Path:
    if len(key) != 64 or not set(key) <= _KEY_CHARS:
        raise ValueError(f"not a build key: {key!r}")
    return root / key[:2] / key


def load(key: str, root: Path | None = None) -> Compiled | None:
    """The cached answer for `key`, or None (no cache, no entry, or an entry that does not parse)."""
    root = root if root is not None else cache_dir()
    if root is None:
        return None
    try:
        data = _path(root, key).read_bytes()
    except OSError:
        return None
    head, sep, cubin = data.partition(b"\n")
    try:
        meta = json.loads(head)
        entry = Compiled(bool(meta["ok"]), cubin, str(meta["log"]), float(meta["compile_ms"]))
    except (ValueError, KeyError, TypeError):
        return None
    if not sep or len(cubin) != meta.get("cubin_bytes", -1):
        return None  # cut short
    return entry


def store(key: str, entry: Compiled, root: Path | None = None) -> None:
    """Keep `entry` under `key` (atomically; an entry already there is replaced by an equal one)."""
    root = root if root is not None else cache_dir()
    if root is None:
        return
    path = _path(root, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    head = json.dumps({"ok": entry.ok, "log": entry.log, "compile_ms": entry.compile_ms,
                       "cubin_bytes": len(entry.cubin)}).encode()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(head + b"\n" + entry.cubin)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
