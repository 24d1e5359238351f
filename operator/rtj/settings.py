"""Operator settings: one object, read once from the environment (documented in the chart's values).

Each field is read from `RTJ_<FIELD NAME IN CAPITALS>` (e.g. RTJ_RECONCILE_INTERVAL_SECONDS); an
unset or empty variable keeps the default written here, and nowhere else. A value out of bounds
stops the operator at startup with the variable's name.

What kopf's own command line decides (namespaces: --namespace/--all-namespaces; liveness endpoint:
--liveness; --standalone; --verbose) is not a setting here: `kopf run -m rtj.handlers` and
`python -m rtj` take the same options (rtj.__main__).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

ENV_PREFIX = "RTJ_"


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    metrics_port: int = Field(
        9090,
        ge=0,
        le=65535,
        description="Prometheus /metrics port; 0 disables. Not 8080: the operator image's liveness "
        "endpoint (`kopf run --liveness`) listens there.",
    )
    trainer_service_account: str = Field(
        "rtj-trainer", min_length=1, description="ServiceAccount of trainer pods (the chart defines it)."
    )
    fsx_enabled: bool = Field(
        True,
        description="false: jobs with spec.checkpoint.fsx fail at once (the chart sets it from fsx.enabled "
        "and grants PersistentVolume permissions only when true).",
    )
    kueue_enabled: bool = Field(
        False,
        description="Kueue integration (docs/kueue.md): a job labelled kueue.x-k8s.io/queue-name gets a "
        "Kueue Workload and runs only while Kueue admits it. The chart sets it from kueue.enabled and "
        "grants Workload permissions only when true; false: the label is ignored.",
    )
    reconcile_interval_seconds: float = Field(
        30.0,
        gt=0,
        description="Slow resync of each job's pass, a safety net only: a pass runs on changes of the "
        "job, its pods and its Leases' content, at the job's next heartbeat deadline and when its next "
        "time-based rule fires (startup timeout, create backoff, progress watchdog, TTL; "
        "rtj.ladder.wakeups).",
    )
    api_recovery_hold_seconds: float = Field(
        30.0,
        ge=0,
        description="A node seen NotReady within this many seconds after the operator's own API calls "
        "failed (an API server outage) is not yet a fault: its kubelet could not renew either "
        "(rtj.ladder.pass_state.Pass.node_verdict). A node still NotReady afterwards is one.",
    )
    quarantine_seconds: float = Field(
        3600.0,
        ge=60,
        description="A quarantined node is checked again this long after its latest evidence: lifted "
        "if it then shows none (Ready, no unhealthy condition, all GPUs), else checked again as long "
        "later; one that booted again since it was quarantined is lifted as soon as it shows none "
        "(rtj.ladder.quarantine).",
    )
    fault_grace_seconds: int = Field(
        5, ge=0, description="Grace when deleting a faulted pod (node lost: 0, forced)."
    )
    termination_grace_seconds: int = Field(
        300,
        ge=0,
        description="Pods' terminationGracePeriodSeconds (time for a last checkpoint) while the job's "
        "persist time is neither declared nor measured (rtj.builders.termination_grace_seconds).",
    )
    heartbeat_writes_per_second: float = Field(
        200.0,
        ge=0,
        description="The cluster's budget of heartbeat Lease writes per second for all jobs of this "
        "operator; 0: no budget (every pod renews at its spec's heartbeatIntervalSeconds). Pods the "
        "operator creates renew every max(heartbeatIntervalSeconds, worker pods of all its running "
        "jobs / (this budget - 2 per standby hot spare)) seconds, never longer than a third of the "
        "job's heartbeatTimeoutSeconds; where the budget cannot be met within that, the job shows "
        "condition HeartbeatBudgetExceeded (rtj.ladder.heartbeat_budget). The default: ~0.7 of an "
        "API-server core at the measured 3.4 ms per renewal, and the spec's 10 s default up to 2,000 "
        "worker pods.",
    )
    heartbeat_status_resolution_seconds: float = Field(
        60.0, ge=0, description="How stale status lastHeartbeatTime may get."
    )
    progress_refresh_seconds: float = Field(
        5.0,
        ge=0,
        description="How stale a job's progress in status (lastCheckpoint, memory snapshot and replica "
        "steps) may get: a heartbeat renewal carrying only newer progress runs the job's pass at most once "
        "per this many seconds, whatever the number of pods (a changed state, a fault or a stale slot runs "
        "it at once). 0: at every renewal with new progress.",
    )
    request_timeout_seconds: float = Field(10.0, gt=0, description="Timeout of each API request.")
    watch_server_timeout_seconds: float = Field(
        300.0, gt=0, description="Server-side watch timeout (client side: +30 s)."
    )
    peering: str = Field("", description="Empty: standalone (one replica); else the KopfPeering name.")
    leader_election_lease: str = Field(
        "",
        description="Name of the Lease electing the one active operator among replicas (rtj.leader_election; "
        "`python -m rtj` only). Empty: no election, the process is active at once (one replica).",
    )
    leader_election_namespace: str = Field(
        "", description="Namespace of that Lease (the operator's own; the chart sets it). Required with it."
    )
    leader_election_identity: str = Field(
        "", description="Prefix of this candidate's identity (the pod name); a random suffix is added."
    )
    leader_election_lease_seconds: int = Field(
        5,
        ge=2,
        description="A standby takes the Lease once it has seen the same record this long (its own clock).",
    )
    leader_election_renew_deadline_seconds: float = Field(
        3.0,
        gt=1.2,
        description="The holder exits once this long has passed since its last successful renewal was sent "
        "(less than the lease seconds: the margin is how much sooner than a takeover it is gone).",
    )
    leader_election_retry_seconds: float = Field(
        1.0, ge=1, description="Renewal (holder) and attempt (standby) interval."
    )
    log_level: Annotated[
        Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], BeforeValidator(lambda v: str(v).upper())
    ] = Field("INFO", description="Log level of the operator's own loggers.")

    @model_validator(mode="after")
    def _election_timing(self) -> Settings:
        if self.leader_election_lease and not self.leader_election_namespace:
            raise ValueError("leader_election_namespace is required with leader_election_lease")
        if not (
            1.2 * self.leader_election_retry_seconds
            < self.leader_election_renew_deadline_seconds
            < self.leader_election_lease_seconds
        ):
            raise ValueError(
                "leader election needs 1.2 x retry seconds < renew deadline seconds < lease seconds"
            )
        return self

    @classmethod
    def env_name(cls, field: str) -> str:
        return ENV_PREFIX + field.upper()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Settings:
        values = {
            name: raw for name in cls.model_fields if (raw := environ.get(cls.env_name(name), "").strip())
        }
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            first = exc.errors()[0]
            if not first["loc"]:  # a rule across fields (the leader election's timing)
                raise SystemExit(f"RTJ_LEADER_ELECTION_*: {first['msg']}") from exc
            name = cls.env_name(str(first["loc"][0]))
            raise SystemExit(f"{name}: {first['msg']} (got {first.get('input')!r})") from exc
