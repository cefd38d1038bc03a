"""The verispec cache on disk: where converted models, built kernels and timed curves are kept,
and small JSON memos keyed by a file's identity."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("VERISPEC_CACHE", Path.home() / ".cache" / "verispec"))


def log(msg: str) -> None:
    print(f"[verispec] {msg}", file=sys.stderr, flush=True)


def file_key(path: Path) -> str:
    """A file's identity for on-disk memos: its resolved path, size and modification time."""
    st = path.stat()
    return f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"


MEMO_ENTRIES = 256  # newest keys a memo file keeps (keys name model files, and test runs make many)


def memoised(name: str, key: str, compute):
    """`compute()` once per key, remembered in cache_root()/name (a JSON object, replaced atomically).
    The file keeps the MEMO_ENTRIES most recently added keys; older ones are computed again if asked.

    A cache that cannot be written is reported and skipped: the value is computed again next time."""
    memo = cache_root() / name
    try:
        known = json.loads(memo.read_text())
    except (OSError, ValueError):
        known = {}
    if key in known:
        return known[key]
    known[key] = value = compute()
    for stale in list(known)[: max(0, len(known) - MEMO_ENTRIES)]:  # insertion order: the oldest first
        del known[stale]
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known, indent=1))
        tmp.replace(memo)
    except OSError as e:
        log(f"could not write {memo}: {e}")
    return value


def file_sha256(path: Path) -> str:
    """SHA-256 of a file, memoised on (path, size, mtime) so repeated loads skip the hashing."""

    def digest() -> str:
        h = hashlib.sha256()
        with path.open("rb") as f:
            while block := f.read(1 << 22):
                h.update(block)
        return h.hexdigest()

    return memoised("hashes.json", file_key(path), digest)
