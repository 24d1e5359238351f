"""Bring your own trainer, end to end (issue 27): training code we did not write runs as a job on the
local cluster (real operator, real trainer processes on the e2e nodes) through the three faults of
the fault matrix, and recovers at the level the docs promise it.

- A plain torchrun script (rtj_trainer.examples.plain_torchrun: DDP, its own DCP saves every 10
  steps, no import of ours). A rank's exception and its SIGKILL restart the workers in-job
  (ft_launcher) and the ranks resume from the script's newest own save; a node's death replaces
  its pod on another node and quarantines the node.
- The Hugging Face Transformers `Trainer` (rtj_trainer.examples.hf_causal_lm, with our
  ResilienceCallback): the same faults; the soft ones resume from the pod's memory tier, the node
  death from the persisted checkpoint.
- torchtitan 0.2.2's own Trainer, loop and config (its Llama 3 debug model, seq 256 x batch 2 on CPU)
  as RtjTrainer (rtj_trainer.integrations.titan), run by bench/titan_rank.py, the GPU smoke's
  torchtitan rank: the same faults and levels as the HF Trainer. On CPU the two ranks replicate
  (DDP) instead of sharding (FSDP2's reduce-scatter takes PREMUL_SUM, which gloo lacks).

Each trainer runs as one job that takes its three faults in turn (exception, SIGKILL, then the death
of a node not running the rendezvous pod, once both restarts are on the status); each row examines
the window between its fault and the next, as test_fault_matrix's soft-fault rows do. The job starts
with the matrix's 12 s heartbeat timeout (soft restarts within a heartbeat timeout of the last one
count as one incident: the two soft faults come more than that apart), and before the node dies it
is raised to the node-death rows' 60 s (a running job's faultTolerance may change), so that the
node's death, not its pod's silence, is what the operator acts on.

The faults come from outside the training code: the HF example's own RTJ_FAULT_INJECT hook, and for
the plain script, which has none, tests/e2e/byo_wrapper.py (global optimizer-step hooks; it also
paces the HF Trainer's steps and sets the test tools' RTJ_* variables in the ranks, which a spec may
not). Steps lost are read from the trainers' own step logs on the checkpoint volume (the plain
script's `--log-file`, the callback's RTJ_TRAIN_LOG_DIR) and printed in the session's summary.

The plain and HF jobs take about 4.5 min on the 2-core machine (2026-12-03), so the rows run in
`make test`. The HF and torchtitan rows need `transformers` / `torchtitan` in the pods: on kubelet
nodes (`make test-e2e-nodes`) the CPU trainer image has only the `trainer` extra, so they run on the
node agent's nodes alone.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import e2e_helpers
import pytest
from e2e_helpers import (
    JOBS_PATH,
    NAMESPACE,
    BlameRow,
    E2EStack,
    JobRun,
    Jobs,
    all_training,
    failed,
    node_record,
    nodes_schedulable,
    succeeded,
)
from rtj.api.status_slots import every_slot
from rtj_local import node_kinds
from rtj_local.node_agent import NodeAgent
from rtj_local.rawapi import MERGE
from rtj_local.train_log import fault_times, job_train_logs, train_log_env
from rtj_local.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

START = 240.0  # scheduling, cold `import torch` x ranks, rendezvous: slow on 2 busy cores
RECOVER = 240.0
FINISH = 300.0
NODE_DEATH = "node death"
#: As test_fault_matrix's node-death rows: longer than the node lifecycle controller takes to see a
#: node's Lease lapse (the agent's 20 s Lease, --node-monitor-grace-period 20 s), so the node's
#: death, not its pod's silence, is what the operator sees first (silence is no evidence against a
#: node: its node would not be quarantined).
NODE_DEATH_HEARTBEAT_TIMEOUT = 60
#: Where the test puts byo_wrapper.py on the checkpoint volume (mounted at /checkpoints).
WRAPPER_DIR = ".byo"
WRAPPER = f"/checkpoints/{WRAPPER_DIR}/byo_wrapper.py"
#: Every launcher restarts its workers on every fault: two soft faults, then the survivor's restart
#: when its peer's node dies, and a margin.
FAULT_TOLERANCE = {"maxInJobRestarts": 5}

#: The plain script: 0.5 s steps, its own DCP save every 10 steps. The SIGKILL comes 28 steps after
#: the exception's resume (14 s, more than the 12 s heartbeat timeout: a separate incident).
PLAIN_STEPS = 100
PLAIN_SAVE_EVERY = 10
PLAIN_FAULTS = {"exception": 15, "sigkill": 38}
#: The HF Trainer: 0.5 s steps (paced by the wrapper), memory snapshots every 5 steps, persisted
#: checkpoints every 10.
HF_STEPS = 100
HF_MEMORY_EVERY = 5
HF_CHECKPOINT_EVERY = 10
HF_FAULTS = {"exception": 12, "sigkill": 40}
#: torchtitan: 0.5 s steps (paced by the wrapper), memory snapshots every 5 steps, persisted every 10;
#: the faults fire from the smoke checkpointer's own hook (bench/titan_rank.py).
TITAN_STEPS = 100
TITAN_MEMORY_EVERY = 5
TITAN_CHECKPOINT_EVERY = 10
TITAN_FAULTS = {"exception": 12, "sigkill": 40}
TITAN_RANK = Path(__file__).resolve().parents[2] / "bench" / "titan_rank.py"
#: The node dies once every pod's step is this far past the SIGKILL (its restart is then on the
#: status, and the job has steps left to run after the replacement).
PAST_SIGKILL = 10

only_on_the_node_agent = pytest.mark.skipif(
    node_kinds.e2e_nodes(os.environ) == node_kinds.KUBELET,
    reason="the CPU trainer image has no `hf` or `titan` extra: these rows run on the node agent",
)


def fault_spec(faults: dict[str, int], rank: int = 1) -> str:
    return ";".join(f"{kind}:{rank}:{step}" for kind, step in faults.items())


def fault_key(faults: dict[str, int], kind: str, rank: int = 1) -> str:
    """The key of an injected fault, as its marker and the step logs name it."""
    return f"{kind}-{rank}-{faults[kind]}"


@dataclass
class ByoRun:
    """A job's run through its three faults, read before its cleanup (which lifts quarantines)."""

    job: JobRun
    #: worker pod name -> uid, once both trained, and right before the node died
    pods: dict[str, str]
    pods_before_node_death: dict[str, str]
    #: the node slot (an every_slot(status) entry) whose node was killed, and when (wall time)
    victim: dict[str, Any]
    killed_at: float
    #: other nodes of the stack whose Node was quarantined at the end (none expected)
    others_quarantined: list[str]
    #: each fault's blame-matrix row (JobRun.blame), by fault key or NODE_DEATH
    blamed: dict[str, BlameRow]

    def fired(self) -> dict[str, float]:
        """Every fault's wall time: the injected ones from the ranks' step logs, and the node death."""
        logs = job_train_logs(self.job.checkpoint_dir, self.job.name)
        return {**fault_times(logs), NODE_DEATH: self.killed_at}

    def window(self, key: str) -> tuple[dict[str, int], set[str]]:
        """JobRun.window, with the node death among the faults that end a window: the restart
        counters' increase and the Event reasons between the last poll read before fault `key` and
        the last poll read before the next fault (or the end)."""
        job, fired = self.job, self.fired()
        at = fired[key]
        later = sorted(t for t in fired.values() if t > at)

        def last_read_before(t: float) -> int:
            return max((i for i, read in enumerate(job.read_by) if read < t), default=0)

        start = last_read_before(at)
        end = last_read_before(later[0]) if later else len(job.history) - 1
        before, after = job.history[start].restarts, job.history[end].restarts
        delta = {k: after[k] - before[k] for k in after}
        events = job.timeline.events[job.events_at[start] : job.events_at[end]]
        return delta, {ev.get("reason", "") for ev in events}


def slot_pod(snap: Any, slot: int) -> dict[str, Any]:
    return next(s for s in every_slot(snap.status) if s.get("slot") == slot)


@contextlib.contextmanager
def running(wrapper_args: list[str], memory: str, rank_env: dict[str, str]) -> Iterator[None]:
    """Jobs started inside run byo_wrapper.py with `wrapper_args` (a trainer we did not write)
    instead of fsdp_train, with `memory` per pod; everything else as e2e_helpers.job_manifest makes
    it. The test tools' variables (the ranks' step logs, `rank_env`: RTJ_FAULT_INJECT) reach the
    ranks through the wrapper's `--env`: a job's `spec.env` may not name RTJ_* (the runtime's; the
    API server refuses them)."""
    original = e2e_helpers.job_manifest
    env = {**train_log_env(), **rank_env}

    def manifest(*a: Any, **kw: Any) -> dict[str, Any]:
        out = original(*a, **kw)
        spec = out["spec"]
        spec["env"] = [e for e in spec.get("env") or [] if not e["name"].startswith("RTJ_")]
        spec["command"] = ["python", WRAPPER]
        spec["args"] = [*(f"--env={k}={v}" for k, v in env.items()), *wrapper_args]
        spec["resources"]["memory"] = memory
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(e2e_helpers, "job_manifest", manifest)
        yield


def run_through_faults(
    stack: E2EStack,
    name: str,
    *,
    args: list[str],
    faults: dict[str, int],
    memory: str,
    rank_env: dict[str, str] | None = None,
    prepare: Callable[[Path], None] | None = None,
    **job_kwargs: Any,
) -> ByoRun:
    """Starts job `name`, lets its two injected faults (an exception, then a SIGKILL of rank 1) fire
    and recover, kills the node of a worker that is not the rendezvous pod's, waits until the job
    finished, reads what the quarantine tests need, and removes the job (the agent's pods share the
    host network: one job at a time). `prepare` puts what the job's command needs beside the
    wrapper, on the checkpoint volume."""
    ckpt_dir = stack.run_dir / "checkpoints" / name
    (ckpt_dir / WRAPPER_DIR).mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(__file__).with_name("byo_wrapper.py"), ckpt_dir / WRAPPER_DIR / "byo_wrapper.py")
    if prepare is not None:
        prepare(ckpt_dir / WRAPPER_DIR)
    jobs = Jobs(stack)
    killed_node = ""
    try:
        with running(args, memory, rank_env or {}):
            job = jobs.start(name, fault_tolerance=FAULT_TOLERANCE, **job_kwargs)
        first = job.wait(all_training, START, "both pods training")
        pods = job.worker_pods(first)
        sigkill = faults["sigkill"]

        def soft_faults_recovered(s: Any) -> bool:
            steps = [(s.leases.get(p) or {}).get("step") or 0 for p in job.worker_pods(s)]
            return (
                all(job.fault_fired(fault_key(faults, kind)) for kind in faults)
                and all_training(s)
                and s.restarts["inJob"] >= len(faults)
                and bool(steps)
                and min(steps) >= sigkill + PAST_SIGKILL
            )

        job.wait(soft_faults_recovered, RECOVER, "both injected faults fired and recovered")
        # The soft faults' rows, before the node death quarantines a node.
        fired = fault_times(job_train_logs(job.checkpoint_dir, name))
        blamed = {
            key: job.blame(
                f"rank {key.split('-')[0]}", fired[key], "RestartedInJob", until=job.next_fault_time(key)
            )
            for key in (fault_key(faults, kind) for kind in faults)
        }
        patched = stack.raw.request(
            "PATCH",
            f"{JOBS_PATH}/{name}",
            {"spec": {"faultTolerance": {"heartbeatTimeoutSeconds": NODE_DEATH_HEARTBEAT_TIMEOUT}}},
            MERGE,
        )
        generation = patched["metadata"]["generation"]
        snap = job.wait(
            lambda s: (s.status.get("observedGeneration") or 0) >= generation and all_training(s),
            60,
            f"the operator acting on heartbeatTimeoutSeconds {NODE_DEATH_HEARTBEAT_TIMEOUT}",
        )
        pods_before = job.worker_pods(snap)
        rdzv_node = next((p["node"] for n, p in snap.pods.items() if n.endswith("-rdzv")), None)
        victim = next(s for s in every_slot(snap.status) if s["node"] != rdzv_node)
        killed_at = time.time()
        killed_node = victim["node"]
        killed = stack.agent.kill_node(killed_node)
        assert f"{NAMESPACE}/{victim['pod']}" in killed, killed

        def replaced_elsewhere(s: Any) -> bool:
            slot = slot_pod(s, victim["slot"])
            return (
                slot["pod"] != victim["pod"]
                and slot.get("node") not in ("", victim["node"])
                and all_training(s)
            )

        job.wait(replaced_elsewhere, RECOVER, "the dead node's pod replaced on another node and training")
        job.wait(lambda s: succeeded(s) or failed(s), FINISH, "job to finish")
        others = [n for n in stack.nodes if n != victim["node"] and node_record(stack.raw, n).taint]
        blamed[NODE_DEATH] = job.blame("node death", killed_at, "Replaced", quarantined=[victim["node"]])
        return ByoRun(
            job=job,
            pods=pods,
            pods_before_node_death=pods_before,
            victim=victim,
            killed_at=killed_at,
            others_quarantined=others,
            blamed=blamed,
        )
    finally:
        jobs.cleanup()
        if killed_node:
            repair(stack, killed_node)


def repair(stack: E2EStack, node: str) -> None:
    """The dead node repaired before the next trainer's job, as an admin would: the module's three
    node deaths would otherwise leave the agent's 4 nodes one short of a 2-pod job's replacement.
    (On kubelet nodes only the plain job runs here: one death, repaired before the next module.)"""
    if isinstance(stack.agent, NodeAgent):
        stack.agent.revive_node(node)
        wait_for(lambda: nodes_schedulable(stack.raw, [node]), timeout=90, message=f"{node} Ready, untainted")


@pytest.fixture(scope="module")
def plain_run(e2e_stack: E2EStack) -> ByoRun:
    script = [
        "-m", "rtj_trainer.examples.plain_torchrun", "--steps", str(PLAIN_STEPS),
        "--save-dir", "/checkpoints/plain", "--save-every", str(PLAIN_SAVE_EVERY),
        "--step-seconds", "0.5", "--log-file", "/checkpoints/.train-logs/{pod}/rank-{rank}.jsonl",
    ]  # fmt: skip
    return run_through_faults(
        e2e_stack,
        "plain",
        args=["--faults", fault_spec(PLAIN_FAULTS), "--", *script],
        faults=PLAIN_FAULTS,
        memory="2Gi",
        steps=PLAIN_STEPS,
        interval=PLAIN_SAVE_EVERY,
    )


@pytest.fixture(scope="module")
def hf_run(e2e_stack: E2EStack) -> ByoRun:
    return run_through_faults(
        e2e_stack,
        "hf",
        args=["--min-step-seconds", "0.5", "--", "-m", "rtj_trainer.examples.hf_causal_lm",
              "--steps", str(HF_STEPS)],
        faults=HF_FAULTS,
        memory="4Gi",
        rank_env={"RTJ_FAULT_INJECT": fault_spec(HF_FAULTS)},  # the example's own hook
        steps=HF_STEPS,
        interval=HF_CHECKPOINT_EVERY,
        checkpoint={"memorySnapshotIntervalSteps": HF_MEMORY_EVERY},
    )  # fmt: skip


def titan_files(byo_dir: Path) -> None:
    """The torchtitan rank and its debug model's assets (made as the smoke makes them), beside the wrapper."""
    shutil.copy(TITAN_RANK, byo_dir / TITAN_RANK.name)
    spec = importlib.util.spec_from_file_location("titan_smoke", TITAN_RANK.with_name("titan_smoke.py"))
    assert spec is not None and spec.loader is not None
    smoke = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(smoke)
    smoke.make_assets(byo_dir / "titan-assets")


@pytest.fixture(scope="module")
def titan_run(e2e_stack: E2EStack) -> ByoRun:
    byo = f"/checkpoints/{WRAPPER_DIR}"
    return run_through_faults(
        e2e_stack,
        "titan",
        args=["--min-step-seconds", "0.5", "--", f"{byo}/{TITAN_RANK.name}", "--cpu",
              "--assets", f"{byo}/titan-assets", "--steps", str(TITAN_STEPS),
              "--dump-folder", f"{byo}/outputs-{{pod}}", "--seq-len", "256", "--local-batch-size", "2"],
        faults=TITAN_FAULTS,
        memory="4Gi",
        rank_env={"RTJ_FAULT_INJECT": fault_spec(TITAN_FAULTS)},  # the smoke checkpointer's hook
        prepare=titan_files,
        steps=TITAN_STEPS,
        interval=TITAN_CHECKPOINT_EVERY,
        checkpoint={"memorySnapshotIntervalSteps": TITAN_MEMORY_EVERY},
    )  # fmt: skip


# --- what every row checks ---------------------------------------------------------------------------
def assert_finished_through_all_faults(run: ByoRun) -> None:
    last = run.job.history[-1]
    assert succeeded(last), f"job ended {last.condition('Failed')}"
    assert run.pods_before_node_death == run.pods, "the soft faults must leave the pods untouched"
    assert last.restarts["podReschedules"] == 1, last.restarts


def assert_in_job_restart(run: ByoRun, key: str) -> None:
    assert run.job.fault_fired(key), f"fault {key} never fired"
    delta, reasons = run.window(key)
    # No in-process restart: neither the plain script nor the Trainer runs under it.
    assert delta["inJob"] >= 1 and delta["inProcess"] == 0 and delta["podReschedules"] == 0, delta
    assert "InJobRestart" in reasons, sorted(reasons)
    row = run.blamed[key]
    assert row.right_action and not row.quarantined, row


def assert_node_death_replaced_the_pod(run: ByoRun) -> None:
    delta, reasons = run.window(NODE_DEATH)
    assert delta["podReschedules"] >= 1, delta
    evidence = reasons & {"NodeNotReady", "NodeLost"}
    assert evidence, sorted(reasons)
    # The job's status names the dead node quarantined, and so does the Node's taint.
    assert run.victim["node"] in (run.job.history[-1].status.get("quarantinedNodes") or [])
    assert not run.others_quarantined, f"only the dead node is quarantined: {run.others_quarantined}"
    row = run.blamed[NODE_DEATH]  # the Node's own taint, read before the cleanup lifted it
    assert row.right_action and not row.false_quarantines and not row.missed_quarantines, row


def assert_monotonic(steps: list[int], what: str) -> None:
    assert steps, f"no {what} was ever reported"
    assert all(a <= b for a, b in itertools.pairwise(steps)), f"{what} went backwards: {steps}"


# --- a plain torchrun script ---------------------------------------------------------------------------
def plain_dcp_saves(run: ByoRun) -> list[int]:
    root = run.job.checkpoint_dir / "plain"
    return sorted(
        int(p.name.removeprefix("step-")) for p in root.glob("step-*") if (p / ".metadata").exists()
    )


def assert_plain_resumed_from_its_own_save(run: ByoRun, fault: str, level: str, at: float | None = None):
    cost = run.job.steps_lost(fault, level, at=at)
    assert cost is not None, f"no resume seen after {fault}"
    # The script's newest complete DCP save: one of its own save steps, less than an interval back
    # (a save in flight when the fault struck may cost that one interval).
    assert cost.resumed_at % PLAIN_SAVE_EVERY == 0 and cost.resumed_at in plain_dcp_saves(run), cost
    assert cost.lost <= PLAIN_SAVE_EVERY, cost
    return cost


def test_plain_script_exception_in_a_rank_is_an_in_job_restart(plain_run: ByoRun) -> None:
    key = fault_key(PLAIN_FAULTS, "exception")
    assert_in_job_restart(plain_run, key)
    assert_finished_through_all_faults(plain_run)
    # Raised before step 15 in rank 1 (rank 0 may finish step 15): from the script's save of step 10.
    cost = assert_plain_resumed_from_its_own_save(plain_run, key, "InJob")
    assert cost.resumed_at == 10, cost


def test_plain_script_sigkill_of_a_rank_is_an_in_job_restart(plain_run: ByoRun) -> None:
    key = fault_key(PLAIN_FAULTS, "sigkill")
    assert_in_job_restart(plain_run, key)
    restarts = plain_run.job.events_about("InJobRestart")
    assert any("killed by SIGKILL" in t for t in restarts), restarts
    assert_finished_through_all_faults(plain_run)
    cost = assert_plain_resumed_from_its_own_save(plain_run, key, "InJob")
    assert cost.resumed_at == 30, cost


def test_plain_script_node_death_replaces_its_pod_and_reports_steps_and_saves(plain_run: ByoRun) -> None:
    assert_node_death_replaced_the_pod(plain_run)
    assert_finished_through_all_faults(plain_run)
    assert_plain_resumed_from_its_own_save(plain_run, NODE_DEATH, "Pod", at=plain_run.killed_at)
    # Seen from torch, not from the script (rtj_trainer.integrations.autoreport): its DCP saves are
    # the status's checkpoints, its optimizer steps the pods' steps.
    reported = plain_run.job.status_checkpoint_steps()
    assert_monotonic(reported, "checkpoint")
    assert max(reported) in plain_dcp_saves(plain_run), (reported, plain_dcp_saves(plain_run))
    assert max(reported) == PLAIN_STEPS, reported
    seen = {hb.get("step") for s in plain_run.job.history for hb in s.leases.values()}
    assert PLAIN_STEPS in seen, f"the last optimizer step is reported: {sorted(x for x in seen if x)}"


# --- the Hugging Face Trainer ---------------------------------------------------------------------------
def assert_resumed_from_memory(run: ByoRun, key: str, memory_every: int) -> None:
    cost = run.job.steps_lost(key, "InJob")
    assert cost is not None, f"no resume seen after {key}"
    # The newest memory snapshot, or the one before it (in flight when the fault struck).
    assert cost.resumed_at % memory_every == 0 and cost.lost < 2 * memory_every, cost
    # Every pod of the time resumed there from its own memory ("local"). A pod's logs are one file
    # per global rank it held, and a later re-rendezvous (the node death's) may hand it another rank,
    # so a pod's first resume after the fault is the earliest over all its files; the replacement
    # pod of the node death resumes from the persisted tier and is not one of these pods.
    at = run.fired()[key]
    logs = job_train_logs(run.job.checkpoint_dir, run.job.name)
    firsts: dict[str, dict] = {}
    for file, recs in logs.items():
        pod = file.split("/", 1)[0]
        first = next((r for r in recs if r.get("event") == "resume" and r["t"] > at), None)
        if pod in run.pods and first is not None and (pod not in firsts or first["t"] < firsts[pod]["t"]):
            firsts[pod] = first
    assert sorted(firsts) == sorted(run.pods), (firsts, sorted(logs))
    assert all((r["source"], r["step"]) == ("local", cost.resumed_at) for r in firsts.values()), firsts


def assert_soft_fault_resumed_from_memory(
    run: ByoRun, faults: dict[str, int], kind: str, memory_every: int
) -> None:
    """A rank's exception or SIGKILL: an in-job restart, the pods untouched, resumed from memory."""
    key = fault_key(faults, kind)
    assert_in_job_restart(run, key)
    if kind == "sigkill":
        restarts = run.job.events_about("InJobRestart")
        assert any("killed by SIGKILL" in t for t in restarts), restarts
    assert_finished_through_all_faults(run)
    assert_resumed_from_memory(run, key, memory_every)


@only_on_the_node_agent
def test_hf_trainer_exception_in_a_rank_is_an_in_job_restart_from_memory(hf_run: ByoRun) -> None:
    assert_soft_fault_resumed_from_memory(hf_run, HF_FAULTS, "exception", HF_MEMORY_EVERY)


@only_on_the_node_agent
def test_hf_trainer_sigkill_of_a_rank_is_an_in_job_restart_from_memory(hf_run: ByoRun) -> None:
    assert_soft_fault_resumed_from_memory(hf_run, HF_FAULTS, "sigkill", HF_MEMORY_EVERY)


def assert_node_death_resumed_from_the_persisted_tier(run: ByoRun, checkpoint_every: int) -> None:
    assert_node_death_replaced_the_pod(run)
    assert_finished_through_all_faults(run)
    cost = run.job.steps_lost(NODE_DEATH, "Pod", at=run.killed_at)
    assert cost is not None, "no resume seen after the node death"
    # The replacement has no memory of its own: every rank resumes at the newest step all can load,
    # a persisted checkpoint (one may be skipped while the writer drains: under two intervals lost).
    assert cost.resumed_at % checkpoint_every == 0 and cost.lost < 2 * checkpoint_every, cost
    run.job.assert_checkpoints_never_lost_or_backwards()


@only_on_the_node_agent
def test_hf_trainer_node_death_replaces_its_pod_resumed_from_the_persisted_tier(hf_run: ByoRun) -> None:
    assert_node_death_resumed_from_the_persisted_tier(hf_run, HF_CHECKPOINT_EVERY)


# --- torchtitan ----------------------------------------------------------------------------------------
@only_on_the_node_agent
def test_torchtitan_exception_in_a_rank_is_an_in_job_restart_from_memory(titan_run: ByoRun) -> None:
    assert_soft_fault_resumed_from_memory(titan_run, TITAN_FAULTS, "exception", TITAN_MEMORY_EVERY)


@only_on_the_node_agent
def test_torchtitan_sigkill_of_a_rank_is_an_in_job_restart_from_memory(titan_run: ByoRun) -> None:
    assert_soft_fault_resumed_from_memory(titan_run, TITAN_FAULTS, "sigkill", TITAN_MEMORY_EVERY)


@only_on_the_node_agent
def test_torchtitan_node_death_replaces_its_pod_resumed_from_the_persisted_tier(titan_run: ByoRun) -> None:
    assert_node_death_resumed_from_the_persisted_tier(titan_run, TITAN_CHECKPOINT_EVERY)
