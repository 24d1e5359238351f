"""A tmpfs of a given size mounted for a test (root, as the trainer tests run): the pod's /dev/shm,
a volume that fills up, a store where fsync is free."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def mounted_tmpfs(mnt: Path, size: str) -> Iterator[Path]:
    """`mnt` (made here) with a tmpfs of `size` (mount's notation: "64m") on it until the block
    ends; unmounted lazily, so a file still open there does not keep it."""
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
