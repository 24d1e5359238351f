"""How often this pod's container has started, and the in-place restarts it has left.

An in-place restart (`ExitCode.RESTART_IN_PLACE`: the kubelet restarts every container of the pod on
the same node, keeping its volumes) keeps the memory volume, so the count lives there:

    <memorySnapshotDir>/.rtj-pod-starts     the pod's container starts, one decimal number

Starts beyond the first are the in-place restarts used; the pod may take
`ENV_MAX_IN_PLACE_RESTARTS` of them. The operator's pods have memorySnapshotDir on their
memory-backed /dev/shm whether or not the memory tier is on (inside it, not beside it: the
directory may be the volume's root, and each pod of a test has one of its own). Without one the
count lives in the status dir: by default in /dev/shm too (`entrypoint.status_dir_base`); where
/dev/shm cannot be written or RTJ_STATUS_DIR names a container's own filesystem, every start is
then the first.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rtj.contract import ENV_MAX_IN_PLACE_RESTARTS, TrainerConfig

from .checkpoint_format import write_file_atomic

log = logging.getLogger("rtj_trainer")

STARTS_FILE = ".rtj-pod-starts"


@dataclass(frozen=True)
class PodStarts:
    """This container's start among the pod's, and the in-place restarts the pod may take."""

    start: int = 1  # 1: the pod's first container start
    max_in_place_restarts: int = 0

    @property
    def left(self) -> int:
        """In-place restarts the pod may still take (the starts before this one used some)."""
        return max(0, self.max_in_place_restarts - (self.start - 1))


def starts_file(cfg: TrainerConfig, status_dir: str) -> str:
    return os.path.join(cfg.memory_snapshot_dir or status_dir, STARTS_FILE)


def max_in_place_restarts(environ: Mapping[str, str]) -> int:
    """ENV_MAX_IN_PLACE_RESTARTS; 0 (no in-place restart) when absent or not a count."""
    raw = environ.get(ENV_MAX_IN_PLACE_RESTARTS, "").strip()
    try:
        return max(0, int(raw)) if raw else 0
    except ValueError:
        log.warning("%s=%r is not a count: no in-place restart", ENV_MAX_IN_PLACE_RESTARTS, raw)
        return 0


def count_start(path: str) -> int | None:
    """Add this container's start to the count in `path` (temp file + rename: whole or absent) and
    return it, 1 for the first; None when it cannot be counted (unreadable or unwritable): then no
    in-place restart may be taken, or a pod might restart in place forever."""
    try:
        before = int(Path(path).read_text().strip())
        if before < 0:
            raise ValueError(f"{before} is not a count")
    except FileNotFoundError:
        before = 0
    except (OSError, ValueError) as e:
        log.warning("the pod's start count %s is unreadable (%r): no in-place restart", path, e)
        return None
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        write_file_atomic(path, f"{before + 1}\n".encode())
    except OSError as e:
        log.warning("cannot count the pod's start in %s (%r): no in-place restart", path, e)
        with contextlib.suppress(OSError):
            Path(f"{path}.tmp").unlink(missing_ok=True)
        return None
    return before + 1


def pod_starts(cfg: TrainerConfig, status_dir: str, environ: Mapping[str, str]) -> PodStarts:
    """This container's start, counted (once per entrypoint process), and the pod's in-place budget."""
    most = max_in_place_restarts(environ)
    start = count_start(starts_file(cfg, status_dir))
    return PodStarts(start or 1, most if start is not None else 0)
