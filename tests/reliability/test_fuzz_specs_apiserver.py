"""Fuzzed job specs against the real API server: exactly the invalid ones are rejected.

Ten thousand hypothesis-generated specs around every boundary (bounds, lengths, patterns, enums,
JSON types, unknown fields, the CEL cross-field rules, hostPath) are sent as server-side dry-run
creates with fieldValidation=Strict. The oracle (specgen.oracle: the pydantic API model plus the
cross-field rules) must agree with the server on every one. For every spec the server accepts, the
object it would store must parse as the operator parses it, and the operator's pure code (decide
and the builders) must run without an exception over a set of observed states.

A second test sends, for accepted specs with fuzzed job names, the objects the builders make
(worker and rendezvous pods, the Service, the FSx PV/PVC) as dry-run creates: an accepted job
must never produce children the API server refuses (the job would be stuck forever).

RTJ_FUZZ_SPECS (default 10240) sizes the first test.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from kubernetes.client.rest import ApiException
from reliability.specgen import manifest, oracle, spec_family
from reliability.states import exercise, render, scenario_states
from rtj import builders, contract
from rtj.api.models import ResilientTrainingJob
from rtj_local.rawapi import RawApi

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

SPECS = int(os.environ.get("RTJ_FUZZ_SPECS", "10240"))
FAMILY = 32
WORKERS = 4
IN_FLIGHT = 64
NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def jobs_path(namespace: str) -> str:
    return f"/apis/{contract.API_GROUP}/{contract.API_VERSION}/namespaces/{namespace}/{contract.PLURAL}"


def dry_run_create(
    raw: RawApi, path: str, body: dict[str, Any], strict: bool = True
) -> tuple[bool, str, dict[str, Any]]:
    """(accepted, server message, object as it would be stored)."""
    try:
        obj = raw.request("POST", path, body, dryRun="All", fieldValidation="Strict" if strict else None)
    except ApiException as exc:
        if exc.status not in (400, 422):
            raise
        try:
            message = json.loads(exc.body).get("message", exc.body)
        except (TypeError, ValueError):
            message = str(exc.body)
        return False, message, {}
    return True, "", obj


@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    sent: int = 0
    accepted: int = 0
    expected_valid: int = 0
    disagreements: list[tuple[str, Any, str, str]] = field(default_factory=list)
    operator_errors: list[tuple[Any, str]] = field(default_factory=list)
    kinds: Counter[str] = field(default_factory=Counter)


#: Jobs wider than this are decided as this wide: a pass costs ~0.2 ms per slot (10,000 slots: ~2 s)
#: and every slot takes the same code path; test_decide_handles_the_widest_job covers the bound.
MAX_DECIDED_NODES = 16
STATE_OFFSETS = (0, 7)


def small(job: ResilientTrainingJob) -> ResilientTrainingJob:
    if job.spec.nodes <= MAX_DECIDED_NODES:
        return job
    return job.model_copy(update={"spec": job.spec.model_copy(update={"nodes": MAX_DECIDED_NODES})})


def check_spec(raw: RawApi, namespace: str, index: int, spec: Any, tally: Tally) -> None:
    valid, why = oracle(spec)
    accepted, message, stored = dry_run_create(raw, jobs_path(namespace), manifest(f"fuzz-{index}", spec))
    problem = None
    if accepted and stored:
        try:
            stored["metadata"].setdefault("uid", f"uid-{index}")
            job = ResilientTrainingJob.model_validate(stored)  # as rtj.handlers.parse_job does
            builders.privileged_violations(job)
            job = small(job)
            states = scenario_states(job, NOW)
            for k in STATE_OFFSETS:  # a rotating pair of the scenarios: each one runs for 1/6 of the jobs
                exercise(job, states[(index + k) % len(states)], NOW)
        except Exception as exc:  # the finding is the exception itself, with the spec that caused it
            problem = f"{type(exc).__name__}: {exc}"
    with tally.lock:
        tally.sent += 1
        tally.accepted += accepted
        tally.expected_valid += valid
        tally.kinds["valid" if valid else why.split(":")[0].split(";")[0]] += 1
        if accepted != valid:
            tally.disagreements.append(("server accepts, oracle rejects" if accepted else
                                        "server rejects, oracle accepts", spec, why, message))  # fmt: skip
        if problem:
            tally.operator_errors.append((spec, problem))


def run_batched(feed: Callable[[Callable[[Any], None]], None], worker: Callable[[int, Any], None]) -> float:
    """Runs `worker(i, item)` for every item `feed` produces, WORKERS at a time; returns seconds."""
    gate = threading.Semaphore(IN_FLIGHT)
    futures: list[Future[None]] = []
    counter = iter(range(10**9))
    t0 = time.monotonic()
    with ThreadPoolExecutor(WORKERS) as pool:

        def submit(item: Any) -> None:
            gate.acquire()
            fut = pool.submit(worker, next(counter), item)
            fut.add_done_callback(lambda _f: gate.release())
            futures.append(fut)

        feed(submit)
    for fut in futures:
        fut.result()  # re-raises unexpected errors (e.g. 5xx)
    return time.monotonic() - t0


def summary(tally: Tally, seconds: float) -> str:
    lines = [
        f"specs sent: {tally.sent} in {seconds:.1f}s ({tally.sent / seconds:.0f}/s, {WORKERS} threads)",
        f"accepted by the server: {tally.accepted}; valid per the oracle: {tally.expected_valid}",
        "oracle verdicts (first failing field):",
        *(f"  {n:6d}  {k}" for k, n in tally.kinds.most_common(30)),
    ]
    shown = sorted(tally.disagreements, key=lambda d: len(json.dumps(d[1], default=str)))[:8]
    for kind, spec, why, message in shown:
        lines += [f"DISAGREEMENT ({kind}): oracle: {why or 'valid'}; server: {message or 'accepted'}",
                  f"  spec: {json.dumps(spec, default=str)[:600]}"]  # fmt: skip
    for spec, problem in tally.operator_errors[:5]:
        lines += [f"OPERATOR ERROR: {problem[:400]}", f"  spec: {json.dumps(spec, default=str)[:600]}"]
    return "\n".join(lines)


def test_api_server_rejects_exactly_the_invalid_specs(raw: RawApi, crd: str, rel_namespace: str) -> None:
    tally = Tally()

    def feed(submit: Callable[[Any], None]) -> None:
        @settings(
            max_examples=max(1, SPECS // FAMILY),
            deadline=None,
            database=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(spec_family(FAMILY))
        def generate(specs: list[dict[str, Any]]) -> None:
            for spec in specs:
                submit(spec)

        generate()

    seconds = run_batched(feed, lambda i, spec: check_spec(raw, rel_namespace, i, spec, tally))
    report = summary(tally, seconds)
    print(report)
    assert tally.sent >= SPECS, report
    # Both verdicts must be well represented, or the boundaries were not explored.
    assert 0.25 < tally.expected_valid / tally.sent < 0.75, report
    assert not tally.disagreements, report
    assert not tally.operator_errors, report


# --- integral floats (7.0) in integer fields ------------------------------------------------------------
FLOAT_BASE = {"image": "t:1", "command": ["python"], "nodes": 2, "checkpoint": {"pvc": {"claimName": "c"}}}
FLOAT_CASES = [  # (spec fields, does the API server accept it)
    ({"nodes": 2.0}, True),  # no CEL rule reads it: schema validation takes 2.0 as an integer
    ({"faultTolerance": {"heartbeatIntervalSeconds": 5.0}}, False),
    ({"faultTolerance": {"inProcessRestart": {"softTimeoutSeconds": 30.0}}}, False),
    ({"gpusPerNode": 8.0}, True),  # procsPerNode absent: the rule's first operand is true
    ({"gpusPerNode": 8.0, "procsPerNode": 4}, False),
    ({"gpusPerNode": 0, "procsPerNode": 4.0}, True),  # gpusPerNode == 0 is true despite the error
    ({"gpusPerNode": 8, "procsPerNode": 4.0}, False),
]


@pytest.mark.parametrize(("fields", "server_accepts"), FLOAT_CASES, ids=lambda v: json.dumps(v))
def test_integral_floats_are_judged_as_the_oracle_says(
    raw: RawApi, crd: str, rel_namespace: str, fields: dict[str, Any], server_accepts: bool
) -> None:
    """Pins the API server's handling of 7.0 in `integer` fields (accepted unless a CEL rule must read
    it) and the oracle's model of it; a Kubernetes upgrade that changes it fails here, by name."""
    spec = {**FLOAT_BASE, **fields}
    accepted, message, _ = dry_run_create(raw, jobs_path(rel_namespace), manifest("floats", spec))
    assert accepted == server_accepts, message
    if not accepted:
        assert "is invalid: spec" in message and "expected int, got float64 evaluating rule" in message, (
            message
        )
    assert oracle(spec)[0] == server_accepts, oracle(spec)


# --- children of accepted jobs are valid objects -------------------------------------------------------
JOB_NAMES = st.one_of(
    st.sampled_from(["train", "a", "llama-70b", "x" * 40]),
    st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?){0,2}\Z"),
    st.integers(1, 253).map(lambda n: "a" * n),
)
CHILD_SPECS = int(os.environ.get("RTJ_FUZZ_CHILD_SPECS", "600"))


_CAUSE = re.compile(
    r"\b([a-z][\w.\[\]]*): (Invalid value|Required value|Duplicate value|Unsupported value"
    r"|Too long|Forbidden|Not found)"
)


_INDEX = re.compile(r"\[\d+\]")


def causes(message: str) -> set[str]:
    """'spec.tolerations[*].operator: Invalid value'-style causes of a refusal (indices folded)."""
    found = {_INDEX.sub("[*]", field) + ": " + what for field, what in _CAUSE.findall(message)}
    return found or {message[:120]}


def check_children(
    raw: RawApi, namespace: str, index: int, item: tuple[str, Any], bad: dict[str, tuple[str, Any, str]]
) -> None:
    name, spec = item
    accepted, _message, stored = dry_run_create(raw, jobs_path(namespace), manifest(name, spec))
    if not accepted:
        return
    stored["metadata"]["uid"] = "00000000-0000-0000-0000-000000000000"
    # References to other objects are the cluster admin's business, not the spec's shape: the
    # ServiceAccount and PriorityClass admission plugins would refuse names that do not exist here.
    stored["spec"].get("podTemplate", {}).pop("serviceAccountName", None)
    stored["spec"].get("podTemplate", {}).pop("priorityClassName", None)
    job = small(ResilientTrainingJob.model_validate(stored))
    decision = exercise(job, scenario_states(job, NOW)[0], NOW)
    # One object of each kind and role (worker pods differ only in slot and attempt numbers).
    objects = {
        (o["kind"], o["metadata"].get("labels", {}).get(contract.LABEL_ROLE)): o
        for o in render(job, decision)
    }
    objects["Pod", "spare"] = builders.spare_pod(job, 0, 0)
    for obj in objects.values():
        if obj["kind"] == "PersistentVolume":
            path = "/api/v1/persistentvolumes"
        else:
            kind = {"Pod": "pods", "Service": "services", "PersistentVolumeClaim": "persistentvolumeclaims"}
            path = f"/api/v1/namespaces/{namespace}/{kind[obj['kind']]}"
        # As rtj.kube.create sends them: no fieldValidation parameter (the server's default).
        ok, message, _ = dry_run_create(raw, path, obj, strict=False)
        if not ok:
            for cause in causes(message):
                key = f"{obj['kind']} {cause}"
                if key not in bad or len(json.dumps(spec)) < len(json.dumps(bad[key][1])):
                    bad[key] = (name, spec, message)


def test_accepted_jobs_only_produce_objects_the_api_server_accepts(
    raw: RawApi, crd: str, rel_namespace: str
) -> None:
    bad: dict[str, tuple[str, Any, str]] = {}
    lock = threading.Lock()
    specs = st.tuples(JOB_NAMES, spec_family(8))

    def feed(submit: Callable[[Any], None]) -> None:
        @settings(max_examples=max(1, CHILD_SPECS // 8), deadline=None, database=None,
                  phases=[Phase.generate], suppress_health_check=list(HealthCheck))  # fmt: skip
        @given(specs)
        def generate(item: tuple[str, list[dict[str, Any]]]) -> None:
            name, family = item
            for spec in family:
                submit((name, spec))

        generate()

    def worker(i: int, item: tuple[str, Any]) -> None:
        found: dict[str, tuple[str, Any, str]] = {}
        check_children(raw, rel_namespace, i, item, found)
        with lock:
            for key, value in found.items():
                if key not in bad or len(json.dumps(value[1])) < len(json.dumps(bad[key][1])):
                    bad[key] = value

    seconds = run_batched(feed, worker)
    print(f"{CHILD_SPECS} specs with fuzzed names in {seconds:.1f}s; distinct refusals: {len(bad)}")
    report = [
        f"- {key}\n    job {name!r}: {json.dumps(spec)[:400]}\n    server: {message[:300]}"
        for key, (name, spec, message) in sorted(bad.items())
    ]
    assert not bad, f"accepted jobs whose children the API server refuses ({len(bad)} causes):\n" + "\n".join(
        report
    )
