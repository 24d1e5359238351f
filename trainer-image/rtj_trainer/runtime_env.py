"""The environment the entrypoint gives each rank, and how a training script reads it.

The entrypoint (`rtj-trainer launch`) turns the operator's `TrainerConfig` into the variables
below (`rank_env_vars`); ft_launcher passes them through to every rank, adding the torch elastic
ones (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT, ...).
A training script reads everything with one call::

    from rtj_trainer.runtime_env import RankEnv
    env = RankEnv.from_env()
    env.checkpoint_dir, env.checkpoint_interval_steps, env.rank, env.in_process.soft_timeout_seconds

Only the standard library and the contract are imported, so this is cheap to import in a rank.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from rtj.contract import (
    DEFAULT_CHECKPOINT_INTERVAL_STEPS,
    DEFAULT_CHECKPOINTS_TO_KEEP,
    DEFAULT_HANG_DETECTION_FLOOR_SECONDS,
    DEFAULT_HANG_DETECTION_MEDIAN_MULTIPLE,
    DEFAULT_INPROCESS_HARD_TIMEOUT_SECONDS,
    DEFAULT_INPROCESS_MAX_RESTARTS,
    DEFAULT_INPROCESS_SOFT_TIMEOUT_SECONDS,
    ENV_STATUS_DIR,
    PEER_REPLICA_FILE,
    TrainerConfig,
)

ENV_JOB_NAME = "RTJ_JOB_NAME"
ENV_CHECKPOINT_DIR = "RTJ_CHECKPOINT_DIR"
ENV_CHECKPOINT_INTERVAL_STEPS = "RTJ_CHECKPOINT_INTERVAL_STEPS"
ENV_CHECKPOINTS_TO_KEEP = "RTJ_CHECKPOINTS_TO_KEEP"
#: The node-local memory tier (rtj_trainer.checkpoint): a memory-backed directory (the pod's
#: /dev/shm) and the steps between two snapshots into it; 0 or unset turns the tier off.
ENV_MEMORY_SNAPSHOT_DIR = "RTJ_MEMORY_SNAPSHOT_DIR"
ENV_MEMORY_SNAPSHOT_INTERVAL_STEPS = "RTJ_MEMORY_SNAPSHOT_INTERVAL_STEPS"
#: "1" (default): a snapshot is staged on the GPU where it has room (checkpoint.device_stage);
#: "0": always copied into pinned host memory.
ENV_MEMORY_SNAPSHOT_GPU_STAGING = "RTJ_MEMORY_SNAPSHOT_GPU_STAGING"
#: The file holding the step of the last committed checkpoint; ft_launcher's progress tracker reads it
#: to stop restarting when no progress is made (exit 93).
ENV_PROGRESS_FILE = "RTJ_PROGRESS_FILE"
ENV_INPROCESS_ENABLED = "RTJ_INPROCESS_ENABLED"
ENV_INPROCESS_SOFT_TIMEOUT = "RTJ_INPROCESS_SOFT_TIMEOUT_SECONDS"
ENV_INPROCESS_HARD_TIMEOUT = "RTJ_INPROCESS_HARD_TIMEOUT_SECONDS"
ENV_INPROCESS_MAX_RESTARTS = "RTJ_INPROCESS_MAX_RESTARTS"
#: Learned hang budgets (TrainerConfig.hangDetection; rtj_trainer.hang_timeouts).
ENV_HANG_DETECTION_ENABLED = "RTJ_HANG_DETECTION_ENABLED"
ENV_HANG_DETECTION_FLOOR_SECONDS = "RTJ_HANG_DETECTION_FLOOR_SECONDS"
ENV_HANG_DETECTION_MEDIAN_MULTIPLE = "RTJ_HANG_DETECTION_MEDIAN_MULTIPLE"
#: Written by the entrypoint into the pod's status dir when the pod is asked to stop (SIGTERM),
#: before it forwards the signal to ft_launcher: a rank that gets SIGTERM while it exists saves
#: and persists its state (rtj_trainer.graceful); one that gets SIGTERM without it is being stopped
#: by ft_launcher for an in-job restart and goes at once. Its content (`write_graceful_stop`,
#: `stop_deadline`) is the wall-clock time by which the ranks must have exited; an empty or
#: unreadable content is a graceful stop without a deadline.
GRACEFUL_STOP_FILE = "graceful-stop"
#: A rank's record in the pod's status dir, `<prefix><rank>.json`: its emergency save's memory
#: snapshot, for the entrypoint to persist after the rank exited (rtj_trainer.checkpoint.handoff).
HANDOFF_FILE_PREFIX = "handoff-rank-"
#: A rank's Permanent fault, `<prefix><rank>.json` in the pod's status dir (a rank file's format):
#: kept when ft_launcher's next worker of that rank rewrites the rank file, so the entrypoint stops
#: the launcher even if its poll came after that rewrite (`launcher_supervision.permanent_fault_in`).
PERMANENT_FILE_PREFIX = "permanent-rank-"
#: Seconds between the ranks' graceful-stop deadline and ft_launcher's SIGKILL of the ranks (its
#: --term-timeout after the signal): the kernel's teardown of a rank that called os._exit by its
#: deadline (its address space, pinned host memory, a CUDA context) before the launcher sees it
#: gone. The launcher gets the signal after the entrypoint wrote the deadline, so its SIGKILL never
#: comes earlier than this after the deadline.
GRACEFUL_STOP_EXIT_MARGIN_S = 1.0
#: "gloo" or "nccl"; "auto" (default) picks nccl when CUDA is available.
ENV_DIST_BACKEND = "RTJ_DIST_BACKEND"
#: Seconds for collective timeouts (process group); must stay well under the in-process hard timeout.
ENV_COLLECTIVE_TIMEOUT = "RTJ_COLLECTIVE_TIMEOUT_SECONDS"


@dataclass(frozen=True)
class InProcessSettings:
    enabled: bool
    soft_timeout_seconds: float
    hard_timeout_seconds: float
    max_restarts: int


@dataclass(frozen=True)
class HangDetectionSettings:
    enabled: bool
    floor_seconds: float
    median_multiple: float


@dataclass(frozen=True)
class RankEnv:
    """Everything a rank needs to know about itself and the job, read from the environment."""

    job_name: str
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    master_addr: str
    master_port: int
    #: In-job (launcher) restart count: torch elastic's TORCHELASTIC_RESTART_COUNT.
    restart_count: int
    status_dir: str | None
    checkpoint_dir: str
    checkpoint_interval_steps: int
    checkpoints_to_keep: int
    #: None when the memory tier is off (no directory or interval 0).
    memory_snapshot_dir: str | None
    memory_snapshot_interval_steps: int
    memory_snapshot_gpu_staging: bool
    progress_file: str | None
    in_process: InProcessSettings
    hang_detection: HangDetectionSettings
    dist_backend: str
    collective_timeout_seconds: float

    def memory_tier_root(self, memory_dir: str | None = None) -> str | None:
        """This job's directory in the pod's memory tier (None: the tier is off)."""
        mem_dir = memory_dir or self.memory_snapshot_dir
        return memory_tier_root(mem_dir, self.job_name) if mem_dir else None

    def peer_replica(self) -> tuple[str, str] | None:
        """(this pod's replica server, the peer's) when the peer replica is on (the entrypoint
        wrote them into the status dir before starting the ranks), else None."""
        if not self.status_dir:
            return None
        try:
            with open(os.path.join(self.status_dir, PEER_REPLICA_FILE)) as f:
                doc = json.load(f)
            return str(doc["replicaEndpoint"]), str(doc["peerEndpoint"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RankEnv:
        """The rank's settings; a variable that is not set takes the job spec's default (rtj.contract
        DEFAULT_*), as for a script run outside a pod."""
        env = os.environ if environ is None else environ

        def _int(name: str, default: int) -> int:
            raw = env.get(name, "")
            return int(raw) if raw.strip() else default

        def _float(name: str, default: float) -> float:
            raw = env.get(name, "")
            return float(raw) if raw.strip() else default

        def _flag(name: str) -> bool:
            return env.get(name, "1").lower() in ("1", "true", "yes")

        soft_timeout = _float(ENV_INPROCESS_SOFT_TIMEOUT, DEFAULT_INPROCESS_SOFT_TIMEOUT_SECONDS)
        hard_timeout = _float(ENV_INPROCESS_HARD_TIMEOUT, DEFAULT_INPROCESS_HARD_TIMEOUT_SECONDS)
        mem_interval = _int(ENV_MEMORY_SNAPSHOT_INTERVAL_STEPS, 0)
        mem_dir = env.get(ENV_MEMORY_SNAPSHOT_DIR) or None
        return cls(
            job_name=env.get(ENV_JOB_NAME, "local"),
            rank=_int("RANK", 0),
            local_rank=_int("LOCAL_RANK", 0),
            world_size=_int("WORLD_SIZE", 1),
            local_world_size=_int("LOCAL_WORLD_SIZE", 1),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=_int("MASTER_PORT", 29500),
            restart_count=_int("TORCHELASTIC_RESTART_COUNT", 0),
            status_dir=env.get(ENV_STATUS_DIR) or None,
            checkpoint_dir=env.get(ENV_CHECKPOINT_DIR, "./checkpoints"),
            checkpoint_interval_steps=_int(ENV_CHECKPOINT_INTERVAL_STEPS, DEFAULT_CHECKPOINT_INTERVAL_STEPS),
            checkpoints_to_keep=_int(ENV_CHECKPOINTS_TO_KEEP, DEFAULT_CHECKPOINTS_TO_KEEP),
            memory_snapshot_dir=mem_dir if mem_interval > 0 else None,
            memory_snapshot_interval_steps=mem_interval if mem_dir else 0,
            memory_snapshot_gpu_staging=_flag(ENV_MEMORY_SNAPSHOT_GPU_STAGING),
            progress_file=env.get(ENV_PROGRESS_FILE) or None,
            in_process=InProcessSettings(
                enabled=_flag(ENV_INPROCESS_ENABLED),
                soft_timeout_seconds=soft_timeout,
                hard_timeout_seconds=hard_timeout,
                max_restarts=_int(ENV_INPROCESS_MAX_RESTARTS, DEFAULT_INPROCESS_MAX_RESTARTS),
            ),
            hang_detection=HangDetectionSettings(
                enabled=_flag(ENV_HANG_DETECTION_ENABLED),
                floor_seconds=_float(ENV_HANG_DETECTION_FLOOR_SECONDS, DEFAULT_HANG_DETECTION_FLOOR_SECONDS),
                median_multiple=_float(
                    ENV_HANG_DETECTION_MEDIAN_MULTIPLE, DEFAULT_HANG_DETECTION_MEDIAN_MULTIPLE
                ),
            ),
            dist_backend=_resolve_backend(env.get(ENV_DIST_BACKEND, "auto")),
            # Default: a third of the hard timeout, so a broken collective fails (and the wrapper
            # restarts in-process) long before the hard timeout kills the rank.
            collective_timeout_seconds=_float(ENV_COLLECTIVE_TIMEOUT, max(1.0, hard_timeout / 3)),
        )


def write_graceful_stop(status_dir: str, deadline: float) -> None:
    """Mark this pod's stop for its ranks (`GRACEFUL_STOP_FILE`) with the wall-clock `deadline`
    (`time.time()`) by which they must have exited: whole or absent (tmp + rename), and no fsync
    (the entrypoint writes it in its signal handler; nothing reads it after a crash)."""
    path = os.path.join(status_dir, GRACEFUL_STOP_FILE)
    with open(f"{path}.tmp", "w") as f:
        json.dump({"deadline": deadline}, f)
    os.replace(f"{path}.tmp", path)


def stop_deadline(text: str) -> float | None:
    """The deadline in a `GRACEFUL_STOP_FILE`'s content; None when it holds none (empty, as an older
    entrypoint left it, or not what `write_graceful_stop` writes): never raises."""
    try:
        deadline = json.loads(text)["deadline"]
    except (ValueError, KeyError, TypeError, IndexError):
        return None
    if isinstance(deadline, bool) or not isinstance(deadline, int | float) or not math.isfinite(deadline):
        return None
    return float(deadline)


def memory_tier_root(memory_dir: str, job_name: str) -> str:
    """One directory per job in a pod's memory volume: its ranks' snapshots and the peer replicas
    its replica server holds (a pod's memory never mixes two jobs' snapshots)."""
    return os.path.join(memory_dir, job_name)


def _resolve_backend(value: str) -> str:
    value = value.strip().lower() or "auto"
    if value != "auto":
        return value
    try:
        import torch

        return "nccl" if torch.cuda.is_available() else "gloo"
    except ImportError:
        return "gloo"


#: Its `sitecustomize` installs rtj_trainer.integrations.autoreport in every rank: a script that
#: reports nothing itself still reports its steps and checkpoints (not imported here: that package
#: imports this module).
AUTOREPORT_BOOTSTRAP_DIR = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "integrations", "autoreport-site"
)


def ranks_pythonpath(existing: str | None) -> str:
    """PYTHONPATH for the ranks: the autoreport bootstrap first, then what was there."""
    parts = [p for p in (existing or "").split(os.pathsep) if p and p != AUTOREPORT_BOOTSTRAP_DIR]
    return os.pathsep.join([AUTOREPORT_BOOTSTRAP_DIR, *parts])


def rank_env_vars(cfg: TrainerConfig, *, status_dir: str, progress_file: str) -> dict[str, str]:
    """The variables the entrypoint sets for its ranks (ft_launcher passes them through)."""
    ip = cfg.in_process
    return {
        "PYTHONPATH": ranks_pythonpath(os.environ.get("PYTHONPATH")),
        ENV_JOB_NAME: cfg.job_name,
        ENV_STATUS_DIR: status_dir,
        ENV_CHECKPOINT_DIR: cfg.checkpoint_dir,
        ENV_CHECKPOINT_INTERVAL_STEPS: str(cfg.checkpoint_interval_steps),
        ENV_CHECKPOINTS_TO_KEEP: str(cfg.checkpoints_to_keep),
        ENV_MEMORY_SNAPSHOT_DIR: cfg.memory_snapshot_dir or "",
        ENV_MEMORY_SNAPSHOT_INTERVAL_STEPS: str(cfg.memory_snapshot_interval_steps),
        ENV_MEMORY_SNAPSHOT_GPU_STAGING: "1" if cfg.memory_snapshot_gpu_staging else "0",
        ENV_PROGRESS_FILE: progress_file,
        ENV_INPROCESS_ENABLED: "1" if ip.enabled else "0",
        ENV_INPROCESS_SOFT_TIMEOUT: repr(float(ip.soft_timeout_seconds)),
        ENV_INPROCESS_HARD_TIMEOUT: repr(float(ip.hard_timeout_seconds)),
        ENV_INPROCESS_MAX_RESTARTS: str(ip.max_restarts),
        **_hang_detection_vars(cfg),
    }


def _hang_detection_vars(cfg: TrainerConfig) -> dict[str, str]:
    hd = cfg.hang_detection
    if hd is None:  # an operator that does not send it: off, as before it existed
        return {ENV_HANG_DETECTION_ENABLED: "0"}
    return {
        ENV_HANG_DETECTION_ENABLED: "1" if hd.enabled else "0",
        ENV_HANG_DETECTION_FLOOR_SECONDS: repr(float(hd.floor_seconds)),
        ENV_HANG_DETECTION_MEDIAN_MULTIPLE: repr(float(hd.median_multiple)),
    }
