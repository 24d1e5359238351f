"""Observed states for exercising the operator's pure code (decide + builders) on any accepted job.

- `scenario_states(job, now)`: a fixed set of situations (nothing yet, all running, each kind of
  hard fault, soft restarts, spares, finished pods), cheap enough to run for every accepted spec.
- `observed_states(job, now)`: a hypothesis strategy of arbitrary observations (pods in any phase,
  slot, attempt, deletion state; Leases fresh, stale, future, malformed; nodes in any condition).
- `exercise(job, observed, now)`: one decide() pass, every action rendered by its builder, a second
  pass from the new status (as the job's next pass would), and the ladder's safety invariant: it
  never creates or promotes a pod into a slot that still has a live or terminating pod.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import strategies as st
from rtj import builders, contract, creations
from rtj.api.models import JobStatus, ResilientTrainingJob
from rtj.ladder import (
    CreateWorkerPod,
    Decision,
    DeletePod,
    LeaseObs,
    NodeObs,
    Observed,
    PodObs,
    PromoteSpare,
    TaintNode,
    decide,
    lease_from_dict,
    pod_from_dict,
    quarantine,
)
from rtj.ladder.create_refusals import CREATES

#: At most this many slots get pods in generated states (a 10,000-node spec is decided in full,
#: with the rest of its slots empty).
MAX_POPULATED = 6


def _hb(state: str = "Training", ip: int = 0, ij: int = 0, fault: dict[str, Any] | None = None) -> str:
    data: dict[str, Any] = {"state": state, "inProcessRestarts": ip, "inJobRestarts": ij, "step": 5}
    if fault:
        data["fault"] = fault
    return contract.Heartbeat.model_validate(data).to_annotation()


def lease_dict(pod: str, renew: Any, annotation: Any = None, assigned: Any = None) -> dict[str, Any]:
    annotations: dict[str, Any] = {}
    if annotation is not None:
        annotations[contract.HEARTBEAT_ANNOTATION] = annotation
    if assigned is not None:
        annotations[contract.ASSIGNED_SLOT_ANNOTATION] = assigned
    return {"metadata": {"name": pod, "annotations": annotations}, "spec": {"renewTime": renew}}


def _worker(job: str, slot: int, attempt: int = 0, phase: str = "Running", **kw: Any) -> PodObs:
    name = contract.worker_pod_name(job, slot, attempt)
    return PodObs(
        name=name, uid=f"uid-{name}", role=contract.ROLE_WORKER, slot=slot, attempt=attempt, phase=phase,
        node=kw.pop("node", f"node-{slot}"), cause=kw.pop("cause", "Initial"), **kw,
    )  # fmt: skip


def scenario_states(job: ResilientTrainingJob, now: datetime) -> list[Observed]:
    name = str(job.metadata["name"])
    n = min(job.spec.nodes, MAX_POPULATED)
    old = now - timedelta(hours=1)
    nodes = {f"node-{i}": NodeObs(f"node-{i}", "True") for i in range(n + 2)}
    rdzv_name = f"{name}-rdzv"
    rdzv = {rdzv_name: PodObs(rdzv_name, uid="rdzv", role=contract.ROLE_RENDEZVOUS, phase="Running")}

    def running(**overrides: Any) -> tuple[dict[str, PodObs], dict[str, LeaseObs]]:
        pods = {**rdzv}
        leases = {}
        for slot in range(n):
            pod = _worker(name, slot, created=old, started=old)
            pods[pod.name] = pod
            leases[pod.name] = lease_from_dict(lease_dict(pod.name, now.isoformat(), _hb()), now)
        for key, value in overrides.items():
            (pods if isinstance(value, PodObs) else leases)[key] = value
        return pods, leases

    states = [Observed(nodes=nodes, service_exists=False), Observed(pods=rdzv, nodes=nodes)]
    pods, leases = running()
    states.append(Observed(pods=pods, leases=leases, nodes=nodes))
    first = contract.worker_pod_name(name, 0, 0)
    variants: list[dict[str, Any]] = [
        {first: _worker(name, 0, phase="Failed", exit_code=70, created=old, started=old)},
        {first: _worker(name, 0, phase="Failed", exit_code=93, created=old, started=old)},
        {first: _worker(name, 0, phase="Succeeded", exit_code=0, created=old, started=old)},
        {first: _worker(name, 0, deleting=True, created=old, started=old)},
        {first: lease_from_dict(lease_dict(first, old.isoformat(), _hb()), now)},
        {first: lease_from_dict(lease_dict(first, now.isoformat(), _hb(ip=3, ij=1)), now)},
        {first: lease_from_dict(lease_dict(first, now.isoformat(), "{not json"), now)},
        {
            first: lease_from_dict(
                lease_dict(
                    first,
                    now.isoformat(),
                    _hb(fault={"severity": "Hard", "reason": "GpuXid", "time": now.isoformat()}),
                ),
                now,
            )
        },
    ]
    for overrides in variants:
        pods, leases = running(**overrides)
        states.append(Observed(pods=pods, leases=leases, nodes=nodes))
    pods, leases = running()
    states.append(Observed(pods=pods, leases=leases, nodes={**nodes, "node-0": NodeObs("node-0", "False")}))
    if job.spec.hot_spares:
        pods, leases = running()
        spare = contract.spare_pod_name(name, 0, 0)
        pods[spare] = PodObs(
            spare, uid="s", role=contract.ROLE_SPARE, spare_index=0, phase="Running", node=f"node-{n}",
            created=old, started=old,
        )  # fmt: skip
        leases[spare] = lease_from_dict(lease_dict(spare, now.isoformat(), _hb("Standby")), now)
        pods[first] = _worker(name, 0, phase="Failed", exit_code=1, created=old, started=old)
        states.append(Observed(pods=pods, leases=leases, nodes=nodes))
    if n:
        pods = {**rdzv, **{p.name: p for s in range(n) for p in [_worker(name, s, phase="Succeeded")]}}
        states.append(Observed(pods=pods, nodes=nodes))
    return states


# --- arbitrary observations (unit tests) ------------------------------------------------------------
TIMES = st.one_of(
    st.none(),
    st.integers(-(10**6), 10**6).map(lambda s: ("rel", s)),
    st.sampled_from(["", "garbage", "2026-13-45T99:99:99Z", "9999-12-31T23:59:59Z", "0001-01-01T00:00:00Z"]),
    st.integers(),
    st.floats(allow_nan=True),
)
PHASES = st.sampled_from(["Pending", "Running", "Succeeded", "Failed", "Unknown", "", "Weird"])


def _time(value: Any, now: datetime) -> Any:
    if isinstance(value, tuple):
        return (now + timedelta(seconds=value[1])).isoformat()
    return value


@st.composite
def pod_dicts(draw: st.DrawFn, job: str, nodes: int, now: datetime) -> dict[str, Any]:
    """A raw pod as the API could hold it (labels possibly edited by a user)."""
    role = draw(st.sampled_from([contract.ROLE_WORKER, contract.ROLE_WORKER, contract.ROLE_SPARE, "x"]))
    slot = draw(st.integers(-1, min(nodes, MAX_POPULATED)))
    attempt = draw(st.integers(0, 3))
    name = (
        contract.worker_pod_name(job, slot, attempt)
        if role != contract.ROLE_SPARE
        else contract.spare_pod_name(job, slot, attempt)
    )
    labels: dict[str, Any] = {contract.LABEL_JOB: job, contract.LABEL_ROLE: role}
    labels[contract.LABEL_SLOT] = draw(
        st.one_of(st.just(str(slot)), st.sampled_from(["", "x", "-1", "99999"]))
    )
    labels[contract.LABEL_ATTEMPT] = draw(st.one_of(st.just(str(attempt)), st.sampled_from(["", "a", "-3"])))
    labels["training.resilient.dev/spare-index"] = str(slot)
    terminated = draw(st.one_of(st.none(), st.integers(-1, 300)))
    status: dict[str, Any] = {"phase": draw(PHASES), "startTime": _time(draw(TIMES), now)}
    if terminated is not None:
        status["containerStatuses"] = [{"name": "trainer", "state": {"terminated": {"exitCode": terminated}}}]
    status["reason"] = draw(st.sampled_from(["", "Evicted", "OOMKilled"]))
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}-{draw(st.integers(0, 2))}",
            "labels": labels,
            "annotations": {
                contract.CAUSE_ANNOTATION: draw(
                    st.sampled_from(["Initial", "Resume", "HeartbeatTimeout", ""])
                )
            },
            "creationTimestamp": _time(draw(TIMES), now),
            "deletionTimestamp": draw(st.sampled_from([None, now.isoformat()])),
        },
        "spec": {"nodeName": draw(st.sampled_from(["", "node-0", "node-1", "gone"]))},
        "status": status,
    }


MALFORMED_ANNOTATIONS = st.one_of(
    st.none(),
    st.text(max_size=30),
    st.sampled_from(
        [
            "{",
            "null",
            "[]",
            "{}",
            '{"state": 5}',
            '{"state": "Training", "step": -1}',
            '{"state": "Training", "inProcessRestarts": 1e400}',
            "x" * 20000,
        ]
    ),
    st.integers(),
    st.builds(lambda n: f'{{"state": "Training", "inJobRestarts": {n}}}', st.integers(-(2**70), 2**70)),
)


@st.composite
def observed_states(draw: st.DrawFn, job: ResilientTrainingJob, now: datetime) -> Observed:
    name = str(job.metadata["name"])
    raw_pods = draw(st.lists(pod_dicts(name, job.spec.nodes, now), max_size=MAX_POPULATED + 3))
    pods = {p.name: p for p in map(pod_from_dict, raw_pods)}
    leases = {}
    for pod in pods:
        if draw(st.booleans()):
            state = draw(st.sampled_from([s.value for s in contract.PodState]))
            annotation = draw(
                st.one_of(
                    st.builds(_hb, st.just(state), st.integers(0, 10), st.integers(0, 10)),
                    MALFORMED_ANNOTATIONS,
                )
            )
            assigned = draw(st.sampled_from([None, "0", "1", "x", 5]))
            leases[pod] = lease_from_dict(lease_dict(pod, _time(draw(TIMES), now), annotation, assigned), now)
    nodes = {
        n: NodeObs(n, draw(st.sampled_from(["True", "False", "Unknown"])))
        for n in ("node-0", "node-1")
        if draw(st.booleans())
    }
    return Observed(
        pods=pods,
        leases=leases,
        nodes=nodes,
        service_exists=draw(st.booleans()),
        nodes_known=draw(st.booleans()),
    )


# --- one exercised pass ---------------------------------------------------------------------------------
def render(
    job: ResilientTrainingJob, decision: Decision, now: datetime | None = None
) -> list[dict[str, Any]]:
    """Every object the actions would create (rtj.creations, the executor's own map), and the
    patches they would send, built (a builder that raises fails the test)."""
    now = now or datetime.now(UTC)
    out: list[dict[str, Any]] = []
    for action in decision.actions:
        if isinstance(action, CREATES):
            out.extend(creations.objects_to_create(job, action))
        elif isinstance(action, PromoteSpare):
            builders.promotion_patch(action.slot, action.attempt, action.cause)
        elif isinstance(action, TaintNode):
            node = {"metadata": {"name": action.node, "resourceVersion": "1"}, "spec": {}}
            quarantine.taint_patch(node, action.reason, action.job, action.evidence, action.until or now, now)
    for obj in (builders.fsx_persistent_volume(job), builders.fsx_persistent_volume_claim(job)):
        if obj is not None:
            out.append(obj)
    return out


def check_slot_safety(observed: Observed, decision: Decision) -> None:
    """Never a second live pod in a slot: no pod is created or promoted into a slot while a pod of
    that slot is live or terminating (whatever this pass deletes is gone only on a later pass)."""
    occupied = {
        p.slot
        for p in observed.pods.values()
        if p.role == contract.ROLE_WORKER and p.slot is not None and (p.live or p.deleting)
    }
    deleted = {a.name for a in decision.actions if isinstance(a, DeletePod)}
    for action in decision.actions:
        if isinstance(action, CreateWorkerPod | PromoteSpare):
            assert action.slot not in occupied, (
                f"{action} while slot {action.slot} has a live pod "
                f"({[p.name for p in observed.pods.values() if p.slot == action.slot]}; deleting {deleted})"
            )


def exercise(job: ResilientTrainingJob, observed: Observed, now: datetime) -> Decision:
    decision = decide(job, observed, now)
    render(job, decision)
    check_slot_safety(observed, decision)
    # The next tick starts from the status this pass wrote (through its JSON form, as stored).
    stored = JobStatus.model_validate(decision.status.model_dump(by_alias=True, mode="json"))
    decide(job.model_copy(update={"status": stored}), observed, now + timedelta(seconds=1))
    return decision
