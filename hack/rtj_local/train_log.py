"""Steps lost per fault, read from the ranks' own step logs (the demo, the e2e fault matrix, benches).

`rtj_trainer.examples.fsdp_train --log-dir` writes one JSON line per step per rank (`step`, `loss`,
`t`), a `resume` line each time the training function (re)starts (`step` it resumed at, `source`:
init, memory, local, persistent...) and a `fault` line before an injected fault fires (`kind`,
`step`, `t`). Each pod writes them on the job's checkpoint volume (RTJ_TRAIN_LOG_DIR =
`<mount path>/.train-logs/{pod}`, `train_log_env`), so they outlive the pod and read the same on
the node agent and on kubelet nodes (where a container's /tmp goes with its node):
`<checkpoint dir on the host>/.train-logs/<pod>/rank-<global rank>.jsonl`.

Steps lost to a fault = the newest step any rank completed before the recovery's first resume,
minus the step that resume started from (the oldest, when ranks disagree). A fault handled on the
state kept in memory loses 0.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The ranks' logs, under the checkpoint volume's root (a dot dir: never taken for a checkpoint).
TRAIN_LOG_SUBDIR = ".train-logs"

#: Where a GPU bench keeps its ranks' step logs (`logs_in_memory`).
MEMORY_LOG_BASE = "/dev/shm"


def logs_in_memory(link: Path, base: str = MEMORY_LOG_BASE) -> Path:
    """Make `link`, a bench job's step-log directory, a symbolic link to a new directory in the
    memory-backed `base`, and return `link`. A step-log line appended by the training thread to the
    disk a persist writes to waits behind that persist's fsync (bench/status_write_stalls.py); a
    pod's own output goes through a pipe and its checkpoints to FSx, so a bench timing the product's
    steps keeps its logs off that disk. A `base` that cannot be written leaves `link` a directory."""
    try:
        target = tempfile.mkdtemp(prefix=f"rtj-bench-logs-{link.parent.name}-", dir=base)
    except OSError:
        link.mkdir(parents=True, exist_ok=True)
        return link
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, link)
    return link


#: File key ("<pod>/rank-<r>.jsonl") -> that file's records, in order.
TrainLogs = Mapping[str, list[dict[str, Any]]]


@dataclass(frozen=True)
class StepsLost:
    last_step: int  # newest step completed before the recovery resumed
    resumed_at: int  # the step the recovery resumed from
    sources: tuple[str, ...]  # where the resumed state came from, as the ranks said
    #: seconds from the fault to the first step any rank completed after the resume (None: none yet)
    seconds: float | None = None

    @property
    def lost(self) -> int:
        return max(0, self.last_step - self.resumed_at)


def _worker_pod_pattern(job: str) -> re.Pattern[str]:
    # Worker and promoted-spare pods of `job` (rtj.builders' names), not another job's "<job>-x".
    return re.compile(rf"^{re.escape(job)}-(n\d+|spare-\d+)-a\d+$")


def train_log_env(mount_path: str = "/checkpoints") -> dict[str, str]:
    """The env entry that makes fsdp_train log to the checkpoint volume mounted at `mount_path`
    (inside a rank; a job's spec may not set RTJ_* env: `train_log_args` there)."""
    return {"RTJ_TRAIN_LOG_DIR": f"{mount_path.rstrip('/')}/{TRAIN_LOG_SUBDIR}/{{pod}}"}


def train_log_args(mount_path: str = "/checkpoints") -> list[str]:
    """fsdp_train's options that make it log to the checkpoint volume mounted at `mount_path`."""
    return ["--log-dir", next(iter(train_log_env(mount_path).values()))]


def job_train_logs(checkpoint_dir: Path, job: str) -> dict[str, list[dict[str, Any]]]:
    """Every step log of `job`'s worker pods on its checkpoint volume (the host's directory behind
    it). A torn last line (a rank killed while writing it) is skipped."""
    pattern = _worker_pod_pattern(job)
    out: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(Path(checkpoint_dir).glob(f"{TRAIN_LOG_SUBDIR}/*/rank-*.jsonl")):
        pod = path.parent.name
        if not pattern.match(pod):
            continue
        recs = []
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                recs.append(json.loads(line))
        out[f"{pod}/{path.name}"] = recs
    return out


def fault_times(logs: TrainLogs) -> dict[str, float]:
    """When each injected fault fired, keyed like its marker: `<kind>-<rank>-<step>`."""
    out: dict[str, float] = {}
    for key, recs in logs.items():
        rank = key.rsplit("rank-", 1)[-1].removesuffix(".jsonl")
        for rec in recs:
            if rec.get("event") == "fault":
                out.setdefault(f"{rec['kind']}-{rank}-{rec['step']}", rec["t"])
    return out


def steps_lost(logs: TrainLogs, fault_t: float) -> StepsLost | None:
    """What the fault at wall time `fault_t` cost, or None while no rank has resumed after it."""
    resumes = []
    for recs in logs.values():
        first = next((r for r in recs if r.get("event") == "resume" and r.get("t", 0) > fault_t), None)
        if first is not None:
            resumes.append(first)
    if not resumes:
        return None
    recovered_t = min(r["t"] for r in resumes)
    done = [r["step"] for recs in logs.values() for r in recs if "loss" in r and r["t"] < recovered_t]
    after = [r["t"] for recs in logs.values() for r in recs if "loss" in r and r["t"] > recovered_t]
    return StepsLost(
        last_step=max(done, default=0),
        resumed_at=min(r["step"] for r in resumes),
        sources=tuple(sorted({str(r.get("source", "?")) for r in resumes})),
        seconds=min(after) - fault_t if after else None,
    )


@dataclass(frozen=True)
class LateSnapshots:
    """Memory snapshots against their schedule in one rank's step log (`late_snapshots`)."""

    due: int  # steps a snapshot fell due at (every `interval` steps)
    on_time: int  # of them, a snapshot was taken at that very step
    late: int  # taken at a later step (deferred), or never before the next one fell due
    max_steps_late: int  # the longest a due snapshot waited, in steps


def late_snapshots(recs: list[dict[str, Any]], interval: int) -> LateSnapshots:
    """How the memory snapshots of a run without faults kept to a snapshot every `interval` steps:
    every multiple of `interval` up to the last step is due; it is on time when the step log's record
    of that step took a snapshot (`save` "snapshot", or "saved": a persist with it). Persists that
    wait for the one before them are not counted: the step log marks those steps "skipped" too."""
    taken = sorted(r["step"] for r in recs if "loss" in r and r.get("save") in ("snapshot", "saved"))
    last = max((r["step"] for r in recs if "loss" in r), default=0)
    due = list(range(interval, last + 1, interval))
    at = set(taken)
    late = [d for d in due if d not in at]
    waits = [next((t for t in taken if t > d), last) - d for d in late]
    return LateSnapshots(len(due), len(due) - len(late), len(late), max(waits, default=0))
