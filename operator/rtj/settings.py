"""Operator settings, read once from the environment (documented in the chart's values).

- RTJ_METRICS_PORT (9090): Prometheus /metrics port; 0 disables. Not 8080: the operator image's
  liveness endpoint (`kopf run --liveness`) listens there.
- RTJ_TRAINER_SERVICE_ACCOUNT (rtj-trainer): ServiceAccount of trainer pods (the chart defines it).
- RTJ_ALLOW_PRIVILEGED_JOBS (false): "true" accepts hostPath volumes, host namespaces, privileged.
- RTJ_FSX_ENABLED (true): "false" fails jobs with spec.checkpoint.fsx at once (the chart sets it false
  unless fsx.enabled, and then grants no PersistentVolume permission).
- RTJ_RECONCILE_INTERVAL_SECONDS (1.0): per-job pass interval (kopf timer).
- RTJ_FAULT_GRACE_SECONDS (5): grace when deleting a faulted pod (node lost: 0, forced).
- RTJ_TERMINATION_GRACE_SECONDS (300): pods' terminationGracePeriodSeconds (a last checkpoint).
- RTJ_HEARTBEAT_STATUS_RESOLUTION_SECONDS (60): how stale status lastHeartbeatTime may get.
- RTJ_REQUEST_TIMEOUT_SECONDS (10): timeout of each API request.
- RTJ_WATCH_SERVER_TIMEOUT_SECONDS (300): server-side watch timeout (client side: +30 s).
- RTJ_PEERING (empty): empty = standalone (one replica); else the KopfPeering name (mandatory).
- RTJ_NAMESPACES (empty): comma list of namespaces to watch; empty = cluster-wide.
- RTJ_LOG_LEVEL (INFO): log level of the operator's own loggers.
- RTJ_HEALTH_ENDPOINT (http://0.0.0.0:8081/healthz): kopf liveness endpoint (`python -m rtj`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


def _float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    try:
        return float(raw) if raw else default
    except ValueError as exc:
        raise SystemExit(f"{name} must be a number, got {raw!r}") from exc


@dataclass(frozen=True)
class Settings:
    metrics_port: int = 9090
    trainer_service_account: str = "rtj-trainer"
    allow_privileged: bool = False
    fsx_enabled: bool = True
    reconcile_interval_seconds: float = 1.0
    fault_grace_seconds: int = 5
    termination_grace_seconds: int = 300
    heartbeat_status_resolution_seconds: float = 60.0
    request_timeout_seconds: float = 10.0
    watch_server_timeout_seconds: float = 300.0
    peering: str = ""
    namespaces: tuple[str, ...] = field(default_factory=tuple)
    log_level: str = "INFO"

    @classmethod
    def from_env(cls) -> Settings:
        env = os.environ
        return cls(
            metrics_port=int(_float("RTJ_METRICS_PORT", 9090)),
            trainer_service_account=env.get("RTJ_TRAINER_SERVICE_ACCOUNT", "").strip() or "rtj-trainer",
            allow_privileged=env.get("RTJ_ALLOW_PRIVILEGED_JOBS", "").strip().lower() == "true",
            fsx_enabled=env.get("RTJ_FSX_ENABLED", "").strip().lower() != "false",
            reconcile_interval_seconds=_float("RTJ_RECONCILE_INTERVAL_SECONDS", 1.0),
            fault_grace_seconds=int(_float("RTJ_FAULT_GRACE_SECONDS", 5)),
            termination_grace_seconds=int(_float("RTJ_TERMINATION_GRACE_SECONDS", 300)),
            heartbeat_status_resolution_seconds=_float("RTJ_HEARTBEAT_STATUS_RESOLUTION_SECONDS", 60.0),
            request_timeout_seconds=_float("RTJ_REQUEST_TIMEOUT_SECONDS", 10.0),
            watch_server_timeout_seconds=_float("RTJ_WATCH_SERVER_TIMEOUT_SECONDS", 300.0),
            peering=env.get("RTJ_PEERING", "").strip(),
            namespaces=tuple(n.strip() for n in env.get("RTJ_NAMESPACES", "").split(",") if n.strip()),
            log_level=env.get("RTJ_LOG_LEVEL", "INFO").strip().upper() or "INFO",
        )
