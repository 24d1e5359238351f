"""The one place for differences between NVRx 0.4.1 (CI, Python 3.11) and 0.7.x (images, Python 3.12).

Handled here:
- Launcher flags: 0.7 has native no-progress detection (`--ft-checkpoint-iteration-file`,
  `--ft-max-no-progress-cycles`, `--ft-no-restart-exit-code`) and only the `any-failed` restart
  policy; 0.4.1 has neither, so the entrypoint emulates no-progress detection itself
  (`native_no_progress()` says which).
- Two launchers on one host (local tests) need `NVRX_ENABLE_MULTI_LAUNCHERS_PER_NODE=1` in 0.7.
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
from functools import cache
from typing import Any

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


def launcher_env(multi_launchers_per_node: bool) -> dict[str, str]:
    """Extra environment for ft_launcher itself."""
    env: dict[str, str] = {}
    if multi_launchers_per_node:
        env["NVRX_ENABLE_MULTI_LAUNCHERS_PER_NODE"] = "1"
    return env


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


def cpu_safe_restart_health_check(wrapper: Any) -> None:
    """0.7's Wrapper probes GPU/NVLink between restarts and kills a CPU rank: use the plain check."""
    if hasattr(wrapper, "restart_health_check"):
        wrapper.restart_health_check = wrapper.health_check
