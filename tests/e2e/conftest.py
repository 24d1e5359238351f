"""End-to-end fixtures (see e2e_helpers for what they build): `e2e_stack` (module) on the node agent
or on kubelet nodes (RTJ_E2E_NODES; `kubelet_nodes`, session), `run_job` (function) and `module_jobs`
(module)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from e2e_helpers import (
    AGENT_NODES,
    BLAME_ROWS,
    NAMESPACE,
    OPERATOR_NAMESPACE,
    RELEASE,
    STEPS_LOST_ROWS,
    E2EStack,
    JobRun,
    Jobs,
    nodes_schedulable,
    set_unschedulable,
)
from kubernetes.client.rest import ApiException
from rtj_local import node_kinds
from rtj_local.cluster import LocalCluster
from rtj_local.images import OPERATOR_IMAGE, TRAINER_IMAGE
from rtj_local.kubelet_nodes import KUBELET_LABEL, KubeletNodes
from rtj_local.node_agent import AGENT_LABEL, NodeAgent
from rtj_local.rawapi import RawApi
from rtj_local.stack import KUBELET_VALUES, OperatorPod, OperatorProcess, install_chart
from rtj_local.versions import REPO_ROOT, bin_path
from rtj_local.wait import wait_for

#: As many as `make test-e2e-nodes` starts: each of the two node-death rows leaves its node dead (and
#: quarantined, NodeNotReady/NodeLost) for the rest of the module, and the rows after them still need
#: two nodes for a job's pods; every one is repaired before each module (see e2e_stack). The rows that
#: kill the active operator's node or stop a kubelet restart it themselves. No other row
#: quarantines a node (issue 25: only evidence against the node does), and Jobs.cleanup lifts
#: quarantines and clears the nodes' fault records after each test.
KUBELET_NODES = 4


@pytest.fixture(scope="session")
def kubelet_nodes(cluster: LocalCluster) -> Iterator[KubeletNodes]:
    """The session's kubelet nodes with both images loaded (`make test-e2e-nodes` starts them before
    pytest, so that loading the 6 GB trainer image is not counted in a test's timeout; here `up` then
    only finds them running). Stopped at the end unless RTJ_KEEP_CLUSTER is set."""
    nodes = KubeletNodes(cluster)
    try:
        nodes.up(KUBELET_NODES, [TRAINER_IMAGE, OPERATOR_IMAGE])
        yield nodes
    finally:
        if not os.environ.get("RTJ_KEEP_CLUSTER"):
            nodes.down()


@contextlib.contextmanager
def agent_stack(cluster: LocalCluster, raw: RawApi, run_dir: Path) -> Iterator[E2EStack]:
    """The node agent's nodes and the operator as a local process (the chart scaled to 0)."""
    agent = NodeAgent(cluster.kubeconfig, run_dir / "agent", AGENT_NODES, lease_duration_seconds=20)
    operator: OperatorProcess | None = None
    try:
        agent.start()
        wait_for(
            lambda: nodes_schedulable(raw, AGENT_NODES), timeout=90, message="agent nodes Ready, untainted"
        )
        install_chart(cluster, [NAMESPACE], OPERATOR_NAMESPACE, RELEASE)
        operator = OperatorProcess.from_chart(cluster, raw, run_dir / "operator", OPERATOR_NAMESPACE, RELEASE)
        yield E2EStack(
            kind=node_kinds.AGENT, cluster=cluster, raw=raw, agent=agent, operator=operator.start(),
            run_dir=run_dir, nodes=AGENT_NODES, node_selector={AGENT_LABEL: "true"},
            trainer_image="rtj-trainer:local",  # the agent runs .venv's Python: no image
        )  # fmt: skip
    finally:
        if operator is not None:
            operator.stop()
        agent.stop()


@contextlib.contextmanager
def kubelet_stack(
    cluster: LocalCluster, raw: RawApi, run_dir: Path, nodes: KubeletNodes, names: list[str]
) -> Iterator[E2EStack]:
    """Kubelet nodes `names` (repaired, see e2e_stack) and the chart as users install it: the
    operator pod from the local image."""
    wait_for(lambda: nodes_schedulable(raw, names), timeout=90, message="kubelet nodes Ready, untainted")
    install_chart(cluster, [NAMESPACE], OPERATOR_NAMESPACE, RELEASE, timeout=300, values=[KUBELET_VALUES])
    yield E2EStack(
        kind=node_kinds.KUBELET, cluster=cluster, raw=raw, agent=nodes,
        operator=OperatorPod(cluster, OPERATOR_NAMESPACE, RELEASE), run_dir=run_dir, nodes=names,
        node_selector={KUBELET_LABEL: "true"}, trainer_image=TRAINER_IMAGE,
    )  # fmt: skip


@pytest.fixture(scope="module")
def e2e_stack(cluster: LocalCluster, request: pytest.FixtureRequest) -> Iterator[E2EStack]:
    run_dir = REPO_ROOT / ".run" / f"e2e-{time.strftime('%H%M%S')}"
    raw = cluster.raw()
    kind = node_kinds.e2e_nodes(os.environ)
    ours = KUBELET_LABEL if kind == node_kinds.KUBELET else AGENT_LABEL
    others = [
        n["metadata"]["name"]
        for n in raw.request("GET", "/api/v1/nodes")["items"]
        if ours not in (n["metadata"].get("labels") or {}) and not n["spec"].get("unschedulable")
    ]
    set_unschedulable(raw, others, True)
    if kind == node_kinds.KUBELET:
        # A node a previous module killed is restarted first: its pods (the operator's, say) stay
        # Terminating, and their namespace with them, until their kubelet confirms them gone.
        kubelet_nodes = request.getfixturevalue("kubelet_nodes")
        names = kubelet_nodes.up(KUBELET_NODES, [TRAINER_IMAGE, OPERATOR_IMAGE])
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
    try:
        if kind == node_kinds.KUBELET:
            stack = kubelet_stack(cluster, raw, run_dir, kubelet_nodes, names)
        else:
            stack = agent_stack(cluster, raw, run_dir)
        with stack as e2e:
            yield e2e
    finally:
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
    """The blame matrix (JobRun.blame) and the steps lost per fault, as the ranks' step logs tell
    (JobRun.steps_lost), for every fault a test classed or measured in this session."""
    write_blame_matrix(terminalreporter)
    write_steps_lost(terminalreporter)


def write_blame_matrix(tr: pytest.TerminalReporter) -> None:
    if not BLAME_ROWS:
        return
    tr.section("blame matrix")
    tr.write_line(
        f"{'job':<12} {'fault':<26} {'expected action':<20} {'right':<5} {'false q.':<10} "
        f"{'missed q.':<10} {'seconds':>7}  incidents (reason/action)"
    )
    for r in BLAME_ROWS:
        seconds = f"{r.seconds:.1f}" if r.seconds is not None else "-"
        tr.write_line(
            f"{r.job:<12} {r.fault:<26} {'|'.join(r.expected_actions) or '(none)':<20} "
            f"{'yes' if r.right_action else 'NO':<5} {','.join(sorted(r.false_quarantines)) or '0':<10} "
            f"{','.join(sorted(r.missed_quarantines)) or '0':<10} {seconds:>7}  "
            + (", ".join(f"{reason}/{action}" for reason, action in r.incidents) or "-")
        )
    tr.write_line(
        f"faults {len(BLAME_ROWS)}, right action {sum(r.right_action for r in BLAME_ROWS)}, "
        f"false quarantines {sum(len(r.false_quarantines) for r in BLAME_ROWS)} (goal 0), "
        f"missed quarantines {sum(len(r.missed_quarantines) for r in BLAME_ROWS)} (goal 0)"
    )


def write_steps_lost(tr: pytest.TerminalReporter) -> None:
    if not STEPS_LOST_ROWS:
        return
    tr.section("steps lost per fault")
    tr.write_line(
        f"{'job':<12} {'fault':<18} {'handled at':<12} {'steps lost':>10} {'s to step':>9}"
        "  last done -> resumed at (from)"
    )
    for job, fault, level, cost in STEPS_LOST_ROWS:
        if cost is None:
            tr.write_line(f"{job:<12} {fault:<18} {level:<12} {'-':>10}  no resume seen after the fault")
            continue
        seconds = f"{cost.seconds:.1f}" if cost.seconds is not None else "-"
        tr.write_line(
            f"{job:<12} {fault:<18} {level:<12} {cost.lost:>10} {seconds:>9}  "
            f"{cost.last_step} -> {cost.resumed_at} ({'/'.join(cost.sources)})"
        )
