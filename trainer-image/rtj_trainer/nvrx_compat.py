"""The one place for differences between NVRx 0.4.1 (CI, Python 3.11) and 0.7.x (images, Python 3.12).

Handled here:
- Launcher flags: 0.7 has native no-progress detection (`--ft-checkpoint-iteration-file`,
  `--ft-max-no-progress-cycles`, `--ft-no-restart-exit-code`) and only the `any-failed` restart
  policy; 0.4.1 has neither, so the entrypoint emulates no-progress detection itself
  (`native_no_progress()` says which).
- Two launchers on one host (local tests) need `NVRX_ENABLE_MULTI_LAUNCHERS_PER_NODE=1` in 0.7
  (set by whoever runs several pods on one host; the entrypoint passes its environment on).
- 0.4.1 and 0.7.0 both exit 1 when they give up; the entrypoint's own `NoProgressTracker`
  (the same rule as 0.7's progress tracker) decides the 93, and is what stops 0.4.1.
- The rendezvous host (`rtj-trainer rendezvous`): 0.4.1's rendezvous keeps its whole state in the
  c10d store, so a bare TCPStore server is enough; 0.7's barrier rendezvous needs NVRx's own
  store host process (`nvrx-control` style), see `serve_rendezvous_store`.
- inprocess.Wrapper: 0.7 runs a GPU/NVLink `restart_health_check` that kills ranks on CPU.

Only `importlib.metadata` is needed to tell the versions apart; NVRx itself is imported lazily.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rtj.contract import TrainerConfig

log = logging.getLogger(__name__)


@cache
def nvrx_version() -> tuple[int, int, int]:
    try:
        raw = importlib.metadata.version("nvidia-resiliency-ext")
    except importlib.metadata.PackageNotFoundError:
        return (0, 0, 0)
    parts = [int("".join(c for c in p if c.isdigit()) or 0) for p in raw.split(".")[:3]]
    return tuple([*parts, 0, 0, 0][:3])  # type: ignore[return-value]


def native_no_progress(version: tuple[int, int, int] | None = None) -> bool:
    """True when ft_launcher itself stops restarting after N cycles without progress (>= 0.6)."""
    return (version or nvrx_version()) >= (0, 6, 0)


def restart_policy_flags(version: tuple[int, int, int] | None = None) -> list[str]:
    """`any-failed` (torchrun's behaviour) is the only policy in 0.7 and the default in 0.4.1.

    With one pod per node and an operator that replaces lost pods, any failed worker group
    restarts the whole set of workers (they share one process group anyway).
    """
    if (version or nvrx_version()) >= (0, 6, 0):
        return []  # the flag is deprecated there; the behaviour is any-failed
    return ["--ft-restart-policy=any-failed"]


def rendezvous_conf() -> str:
    """`--rdzv-conf` for every training launcher: none of them hosts the store."""
    return "is_host=false"


def make_rank_monitor_client() -> Any | None:
    """An initialized NVRx RankMonitorClient when running under ft_launcher, else None."""
    if "FT_RANK_MONITOR_IPC_SOCKET" not in os.environ:
        return None
    try:
        from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

        client = RankMonitorClient()
        client.init_workload_monitoring()
        return client
    except Exception as exc:  # the rank must still train without hang detection
        log.warning("NVRx rank monitor client unavailable: %s", exc)
        return None


def keep_rendezvous_open() -> None:
    """Make this process's ft_launcher leave the job's rendezvous without closing it.

    ft_launcher closes the rendezvous when it exits after a failure (budget exhausted), which makes
    every later joiner fail at once with RendezvousClosedError: the pod the operator starts in its
    place could never join, and the job would die with the one pod. Here the rendezvous outlives
    any pod (it is hosted by the job's rendezvous pod) and the operator decides the job's end, so a
    leaving launcher only removes itself. Our hot spares wait outside the rendezvous, so nothing
    needs the close to leave it.
    """
    from nvidia_resiliency_ext.fault_tolerance import _ft_rendezvous

    def _leave_open(self: Any) -> None:
        log.info("ft_launcher leaving; the job's rendezvous stays open for the pod that replaces this one")

    for cls in vars(_ft_rendezvous).values():
        if isinstance(cls, type) and "set_closed" in vars(cls) and cls.__name__.endswith("RendezvousHandler"):
            cls.set_closed = _leave_open  # type: ignore[method-assign]


def cpu_safe_restart_health_check(wrapper: Any) -> None:
    """0.7's Wrapper probes GPU/NVLink between restarts and kills a CPU rank: use the plain check."""
    if hasattr(wrapper, "restart_health_check"):
        wrapper.restart_health_check = wrapper.health_check


class NoProgressTracker:
    """Stop after N consecutive restart cycles without a newer committed checkpoint.

    The rule of NVRx 0.7's TrainingProgressTracker: the baseline is the checkpoint iteration at
    start; when a new cycle begins (the in-job restart count goes up) the previous cycle made
    progress if the iteration in the progress file went up; an unreadable/missing file skips the
    check (before the first checkpoint nothing is known). `observe` returns True once the count
    of consecutive cycles without progress reaches `max_cycles` (<= 0 disables).
    """

    def __init__(self, max_cycles: int, progress_file: str) -> None:
        self.max_cycles = max_cycles
        self.progress_file = progress_file
        self.cycles_seen = 0
        self.no_progress_count = 0
        self.last_iteration = self._read()

    def _read(self) -> int | None:
        try:
            with open(self.progress_file) as f:
                raw = f.read().strip()
            return int(raw) if raw else None
        except (OSError, ValueError):
            return None

    def observe(self, in_job_restarts: int) -> bool:
        if self.max_cycles <= 0:
            return False
        while self.cycles_seen < in_job_restarts:
            self.cycles_seen += 1
            iteration = self._read()
            if iteration is None:
                continue
            if self.last_iteration is None or iteration > self.last_iteration:
                self.no_progress_count = 0
            else:
                self.no_progress_count += 1
            self.last_iteration = iteration
        return self.no_progress_count >= self.max_cycles


#: How long the rendezvous host retries binding a port that is still taken.
BIND_RETRY_SECONDS = 90.0


def serve_rendezvous(cfg: TrainerConfig, *, host: str, port: int, stop: threading.Event) -> int:
    """Host the job's rendezvous until `stop` is set; returns the process exit code.

    0.4.1: its c10d rendezvous (a port of torch's dynamic rendezvous) keeps all state in the
    store and lets any participant close a round, so a bare TCPStore server is the whole host,
    and every launcher runs with `is_host=false`.
    >= 0.6: the barrier rendezvous needs a store host that closes rounds: NVRx's `nvrx-control`.
    """
    if nvrx_version() >= (0, 6, 0):
        return _serve_nvrx_control(cfg, host=host, port=port, stop=stop)
    from datetime import timedelta

    from torch.distributed import TCPStore

    # A predecessor (the pod this one replaces, or a previous job's on a shared host network) may
    # still hold the port for its grace period: retry the bind instead of crash-looping the pod.
    deadline = time.monotonic() + BIND_RETRY_SECONDS
    while True:
        try:
            store = TCPStore(
                host_name=host,
                port=port,
                is_master=True,
                wait_for_workers=False,
                timeout=timedelta(seconds=60),
            )
            break
        except (RuntimeError, OSError) as exc:
            if time.monotonic() > deadline or stop.is_set():
                raise
            log.warning("rendezvous port %d not free yet (%s); retrying", port, exc)
            stop.wait(1.0)
    log.info("rendezvous store for %s listening on %s:%d", cfg.rdzv_id, host, port)
    stop.wait()
    del store
    log.info("rendezvous store stopped")
    return 0


def _serve_nvrx_control(cfg: TrainerConfig, *, host: str, port: int, stop: threading.Event) -> int:
    exe = shutil.which("nvrx-control")
    cmd = [exe] if exe else [sys.executable, "-m", "nvidia_resiliency_ext.fault_tolerance.control_plane"]
    cmd += [
        f"--nnodes={cfg.nnodes}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={host}:{port}",
        f"--rdzv-id={cfg.rdzv_id}",
        # No log funnel: pod logs go to the container runtime.
        "--ft-enable-log-server=false",
    ]
    log.info("starting %s", " ".join(cmd))
    proc = subprocess.Popen(cmd)
    while proc.poll() is None:
        if stop.wait(0.5):
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            return 0
    log.error("nvrx-control exited with %s", proc.returncode)
    return proc.returncode or 1
