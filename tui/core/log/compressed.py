"""A log kept gzipped (the GPU runs' logs in benchmarks/gpu/results/*.jsonl.gz) read as it is: `hitproof
report` and `hitproof replay` take it without a `zcat` first. The readers seek in a plain file (replay's
index reads lines by offset), so a gzipped log is decompressed once into a temporary file, removed at exit."""

from __future__ import annotations

import atexit
import gzip
import os
import shutil
import tempfile
import zlib
from pathlib import Path

from ..config.errors import BadInput

GZIP_MAGIC = b"\x1f\x8b"


def plain(path: str | Path) -> Path:
    """`path` itself, or for a gzip file a decompressed copy; what is wrong with a plain file its reader says."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            magic = handle.read(2)
    except OSError:
        return path
    if magic != GZIP_MAGIC:
        return path
    fd, name = tempfile.mkstemp(prefix="hitproof-log-", suffix=".jsonl")
    atexit.register(_remove, name)
    try:
        with gzip.open(path, "rb") as source, os.fdopen(fd, "wb") as copy:
            shutil.copyfileobj(source, copy, 1 << 20)
    except (OSError, EOFError, zlib.error) as exc:
        raise BadInput(f"{path}: a gzip file that does not decompress ({exc})") from None
    return Path(name)


def _remove(name: str) -> None:
    try:
        os.unlink(name)
    except OSError:
        pass
