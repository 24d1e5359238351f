"""What the node agent keeps per pod (its run, its ServiceAccount tokens), and the two small helpers
every part of the agent uses on API objects."""

from __future__ import annotations

import subprocess
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rtj.contract import kube_time


def now() -> str:
    """The current time as a Kubernetes Time."""
    return kube_time(datetime.now(UTC))


def dig(obj: Any, *keys: str) -> Any:
    """`obj[k1][k2]...`, or None where a level is missing or not a dict."""
    for key in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


@dataclass
class ServiceAccountToken:
    """A projected ServiceAccount token file of a pod, refreshed before it expires."""

    path: Path
    service_account: str
    audience: str | None
    expiration_seconds: int
    refresh_at: float  # time.time()


@dataclass
class PodRun:
    """One pod bound to a node of the agent: its directory, its main process and where its stop is."""

    uid: str
    namespace: str
    name: str
    node: str
    pod_dir: Path
    proc: subprocess.Popen[bytes] | None = None
    mnt_ns: str | None = None
    restart_count: int = 0
    stop_requested: threading.Event = field(default_factory=threading.Event)
    grace_seconds: float = 30.0
    #: The node died (or the agent stopped): report nothing more, as a dead kubelet would.
    abandoned: bool = False
    #: The runner thread has reported the final status (a later deletion just deletes).
    done: bool = False
    tokens: list[ServiceAccountToken] = field(default_factory=list)

    @property
    def log_path(self) -> Path:
        return self.pod_dir / "container.log"
