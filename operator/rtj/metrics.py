"""Prometheus metrics of the operator (names are part of the chart/dashboard contract).

- rtj_jobs{condition}: jobs whose condition of that type is True.
- rtj_restarts_total{job_namespace,job_name,level,reason}: restarts per ladder level, incremented only from
  the deltas of a status write that succeeded (so exactly once per observed restart, per process).
- rtj_recovery_seconds{level,reason}: fault detected -> the pod back to Training (heartbeat time), once
  per incident (rtj.ladder.incidents: the pods that echo it observe nothing), labelled with its ladder
  level and its class (a fault class reason, InProcessRestart, InJobRestart or a job-level reason). The
  sum by reason is the recovery time lost to each cause (badput by cause).
- rtj_steps_lost_total{job_namespace,job_name,level,reason}: training steps lost per incident class, an
  estimate (the newest step seen at the fault minus the newest step its recovery could load, from the
  heartbeats' step, memory snapshot, peer replica and persisted checkpoint: rtj.ladder.incidents).
- rtj_heartbeat_age_seconds{job_namespace,job_name,slot}: now - last heartbeat of each slot's pod.
- rtj_heartbeat_delivery_seconds: a heartbeat Lease's renewTime to its watch event reaching the operator
  (rtj.heartbeat_delivery).
- rtj_create_refused_total{job_namespace,job_name,code}: creates the API server refused with a
  retryable 4xx (rtj.ladder.create_refusals), each retry counted.
- rtj_reconcile_duration_seconds: one pass of one job.
- rtj_operator_leader: 1 in the active operator, 0 in a standby (rtj.leader_election), which serves
  nothing else.
- rtj_goodput_ratio{job_namespace,job_name}: 1 - lost / elapsed since the job first ran, where lost is the
  wall time during which some slot was recovering (rtj.ladder.goodput).

The training job is named by `job_namespace` and `job_name`, never `namespace` and `job`: those are the
labels Prometheus gives the scrape target (the operator), so a scrape without honorLabels keeps both,
and `up{job=...}` still finds the operator. No `_created` series (they would double the series count).
"""

from __future__ import annotations

from collections import Counter as Tally

from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics, start_http_server

from rtj.ladder import RecoveryObserved, RestartObserved

disable_created_metrics()

JOBS = Gauge("rtj_jobs", "ResilientTrainingJobs with this condition True.", ["condition"])
RESTARTS = Counter(
    "rtj_restarts_total",
    "Restarts observed per ladder level.",
    ["job_namespace", "job_name", "level", "reason"],
)
RECOVERY = Histogram(
    "rtj_recovery_seconds",
    "Fault detected to back in Training, once per incident, per ladder level and incident class (reason).",
    ["level", "reason"],
    buckets=(0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300, 600, 1200),
)
STEPS_LOST = Counter(
    "rtj_steps_lost_total",
    "Training steps lost per incident class, an estimate: the newest step the pods reported at the fault "
    "minus the newest step its recovery could load (memory snapshot, peer replica or persisted "
    "checkpoint, as the heartbeats show them; the heartbeats do not carry the step a pod resumed from).",
    ["job_namespace", "job_name", "level", "reason"],
)
HEARTBEAT_AGE = Gauge(
    "rtj_heartbeat_age_seconds",
    "Seconds since the slot's pod last heartbeat.",
    ["job_namespace", "job_name", "slot"],
)
HEARTBEAT_DELIVERY = Histogram(
    "rtj_heartbeat_delivery_seconds",
    "A heartbeat Lease's renewTime to its watch event reaching the operator (API server, watch, clock skew).",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60),
)
CREATE_REFUSED = Counter(
    "rtj_create_refused_total",
    "Creates the API server refused with a retryable 4xx (each retry counted).",
    ["job_namespace", "job_name", "code"],
)
RECONCILE = Histogram(
    "rtj_reconcile_duration_seconds",
    "Duration of one reconcile pass of one job.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
LEADER = Gauge("rtj_operator_leader", "1: this operator is the active one; 0: a standby (leader election).")
GOODPUT = Gauge(
    "rtj_goodput_ratio",
    "Productive fraction of wall time since the job first ran.",
    ["job_namespace", "job_name"],
)

# Our own record of the label sets each job has (prometheus-client has no public way to list a
# metric's children), so that a deleted job's series can be removed.
_conditions: dict[tuple[str, str], frozenset[str]] = {}
_tally: Tally[str] = Tally()
_slots: dict[tuple[str, str], set[str]] = {}
_restart_labels: dict[tuple[str, str], set[tuple[str, str]]] = {}
_lost_labels: dict[tuple[str, str], set[tuple[str, str]]] = {}
_goodput_jobs: set[tuple[str, str]] = set()
_refused_codes: dict[tuple[str, str], set[str]] = {}


_serving: set[int] = set()


def serve(port: int) -> None:
    """Serve /metrics on `port` (0: not at all); once per port (a standby's server keeps serving once it
    leads)."""
    if port > 0 and port not in _serving:
        start_http_server(port)
        _serving.add(port)


def committed(
    namespace: str, job: str, restarts: list[RestartObserved], recoveries: list[RecoveryObserved]
) -> None:
    """Record what a successful status write committed."""
    for r in restarts:
        RESTARTS.labels(namespace, job, r.level, r.reason).inc(r.count)
        _restart_labels.setdefault((namespace, job), set()).add((r.level, r.reason))
    for rec in recoveries:
        RECOVERY.labels(rec.level, rec.reason).observe(max(0.0, rec.seconds))
        if rec.steps_lost is not None:
            STEPS_LOST.labels(namespace, job, rec.level, rec.reason).inc(max(0, rec.steps_lost))
            _lost_labels.setdefault((namespace, job), set()).add((rec.level, rec.reason))


def create_refused(namespace: str, job: str, code: int) -> None:
    """A create the API server refused with a retryable 4xx (rtj.ladder.create_refusals)."""
    CREATE_REFUSED.labels(namespace, job, str(code)).inc()
    _refused_codes.setdefault((namespace, job), set()).add(str(code))


def set_conditions(namespace: str, job: str, true_conditions: frozenset[str]) -> None:
    key = (namespace, job)
    old = _conditions.get(key, frozenset())
    if old == true_conditions:
        return
    for c in old - true_conditions:
        _tally[c] -= 1
        JOBS.labels(c).set(_tally[c])
    for c in true_conditions - old:
        _tally[c] += 1
        JOBS.labels(c).set(_tally[c])
    _conditions[key] = true_conditions


def set_heartbeat_ages(namespace: str, job: str, ages: dict[int, float]) -> None:
    key = (namespace, job)
    seen = {str(s) for s in ages}
    for gone in _slots.get(key, set()) - seen:
        HEARTBEAT_AGE.remove(namespace, job, gone)
    for slot, age in ages.items():
        HEARTBEAT_AGE.labels(namespace, job, str(slot)).set(age)
    _slots[key] = seen


def set_goodput(namespace: str, job: str, ratio: float | None) -> None:
    if ratio is not None:
        GOODPUT.labels(namespace, job).set(ratio)
        _goodput_jobs.add((namespace, job))


def forget(namespace: str, job: str) -> None:
    """Drop a deleted job's series."""
    set_conditions(namespace, job, frozenset())
    _conditions.pop((namespace, job), None)
    set_heartbeat_ages(namespace, job, {})
    _slots.pop((namespace, job), None)
    if (namespace, job) in _goodput_jobs:
        _goodput_jobs.discard((namespace, job))
        GOODPUT.remove(namespace, job)
    for level, reason in _restart_labels.pop((namespace, job), set()):
        RESTARTS.remove(namespace, job, level, reason)
    for level, reason in _lost_labels.pop((namespace, job), set()):
        STEPS_LOST.remove(namespace, job, level, reason)
    for code in _refused_codes.pop((namespace, job), set()):
        CREATE_REFUSED.remove(namespace, job, code)
