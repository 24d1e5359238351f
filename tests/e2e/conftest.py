"""End-to-end fixtures (see e2e_helpers for what they build): `e2e_stack` (module), `run_job`
(function) and `module_jobs` (module)."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable, Iterator

import pytest
from e2e_helpers import (
    AGENT_NODES,
    NAMESPACE,
    OPERATOR_NAMESPACE,
    RELEASE,
    STEPS_LOST_ROWS,
    E2EStack,
    JobRun,
    Jobs,
    agent_nodes_schedulable,
    set_unschedulable,
)
from kubernetes import config
from kubernetes.client.rest import ApiException
from rtj_local.cluster import LocalCluster
from rtj_local.node_agent import AGENT_LABEL, NodeAgent
from rtj_local.rawapi import RawApi
from rtj_local.stack import OperatorProcess, install_chart
from rtj_local.versions import REPO_ROOT, bin_path
from rtj_local.wait import wait_for


@pytest.fixture(scope="module")
def e2e_stack(cluster: LocalCluster) -> Iterator[E2EStack]:
    run_dir = REPO_ROOT / ".run" / f"e2e-{time.strftime('%H%M%S')}"
    raw = RawApi(config.new_client_from_config(config_file=str(cluster.kubeconfig)))
    others = [
        n["metadata"]["name"]
        for n in raw.request("GET", "/api/v1/nodes")["items"]
        if AGENT_LABEL not in (n["metadata"].get("labels") or {}) and not n["spec"].get("unschedulable")
    ]
    set_unschedulable(raw, others, True)
    # A previous module's teardown deletes both namespaces without waiting: let that finish first
    # (nothing can be created in a terminating namespace).
    for ns in (NAMESPACE, OPERATOR_NAMESPACE):
        wait_for(
            lambda ns=ns: (
                (raw.get(f"/api/v1/namespaces/{ns}") or {}).get("status", {}).get("phase") != "Terminating"
            ),
            timeout=180,
            interval=1.0,
            message=f"namespace {ns} from a previous module deleted",
        )
    if raw.get(f"/api/v1/namespaces/{NAMESPACE}") is None:
        raw.request("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    agent = NodeAgent(cluster.kubeconfig, run_dir / "agent", AGENT_NODES, lease_duration_seconds=20)
    operator: OperatorProcess | None = None
    try:
        agent.start()
        wait_for(lambda: agent_nodes_schedulable(raw), timeout=90, message="agent nodes Ready, untainted")
        install_chart(cluster, [NAMESPACE], OPERATOR_NAMESPACE, RELEASE)
        operator = OperatorProcess.from_chart(cluster, raw, run_dir / "operator", OPERATOR_NAMESPACE, RELEASE)
        yield E2EStack(cluster, raw, agent, operator.start(), run_dir)
    finally:
        if operator is not None:
            operator.stop()
        agent.stop()
        set_unschedulable(raw, others, False)
        subprocess.run(
            [str(bin_path("helm")), "uninstall", RELEASE, f"--namespace={OPERATOR_NAMESPACE}",
             f"--kubeconfig={cluster.kubeconfig}", "--wait"], capture_output=True, check=False,
        )  # fmt: skip
        for ns in (NAMESPACE, OPERATOR_NAMESPACE):
            with contextlib.suppress(ApiException):
                raw.request("DELETE", f"/api/v1/namespaces/{ns}")


@pytest.fixture
def run_job(e2e_stack: E2EStack) -> Iterator[Callable[..., JobRun]]:
    jobs = Jobs(e2e_stack)
    yield jobs.start
    jobs.cleanup()


@pytest.fixture(scope="module")
def module_jobs(e2e_stack: E2EStack) -> Iterator[Jobs]:
    """For a job whose run several tests examine (e.g. one job with several soft faults in turn)."""
    jobs = Jobs(e2e_stack)
    yield jobs
    jobs.cleanup()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Steps lost per fault, as the ranks' step logs tell (JobRun.steps_lost), for every fault a
    test measured in this session."""
    if not STEPS_LOST_ROWS:
        return
    tr = terminalreporter
    tr.section("steps lost per fault")
    tr.write_line(
        f"{'job':<12} {'fault':<18} {'handled at':<12} {'steps lost':>10}  last done -> resumed at (from)"
    )
    for job, fault, level, cost in STEPS_LOST_ROWS:
        if cost is None:
            tr.write_line(f"{job:<12} {fault:<18} {level:<12} {'-':>10}  no resume seen after the fault")
            continue
        tr.write_line(
            f"{job:<12} {fault:<18} {level:<12} {cost.lost:>10}  "
            f"{cost.last_step} -> {cost.resumed_at} ({'/'.join(cost.sources)})"
        )
