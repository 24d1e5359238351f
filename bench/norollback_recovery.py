"""Recovery without rollback on the product path: seconds from each fault to the first step after
it, steps lost, and the throughput cost of memory snapshots (issue 14).

Every run is a one-pod job as the operator starts it: `rtj-trainer rendezvous` + `rtj-trainer
launch` (NVRx ft_launcher, in-process restart on) -> `rtj_trainer.examples.fsdp_train`, with
`nprocPerNode` ranks (all GPUs of the host; gloo ranks on CPU).

    python bench/norollback_recovery.py --cpu                        # tiny model, gloo, 2 ranks
    bash bench/gpu_norollback.sh                                     # 2xH200, the 1.14 B model

Runs (each its own job; `--only` picks some):
- faults:   an exception (in-process restart) and a rank SIGKILL (in-job restart), with memory
            snapshots every `--memory-interval` steps and persistence every `--persist-interval`;
- faults-persist-only: the same faults with the memory tier off (what a restart loses without it);
- faults-plain-ranks: the same faults with every rank started as a new interpreter (RTJ_RANK_FORKSERVER=0,
            the path before rtj_trainer.rank_forkserver): the baseline of the in-job restart phases;
- sigterm:  SIGTERM to `rtj-trainer launch` at a step (the kubelet's graceful stop), then a new
            "pod" (memory tier wiped) resumes: steps lost and seconds stop -> exit, start -> step;
- throughput: no fault, memory snapshots every `--memory-interval` (+ persistence) vs no
            checkpoints at all; also the persisted recency (average age of the newest persisted
            checkpoint in steps, against the configured interval).
- goodput:  `--goodput-seconds` (480) of training with a fault every `--fault-every-s` (60) of
            steps, rotating exception / SIGKILL / hang, twice: the product (in-process restart with
            kept state, memory tier, persistence) and the seed's approach next to it (persisted
            checkpoints only, every fault restarts the workers from the newest one). Goodput = steps
            of the final timeline x the run's median step time / the window from the first step
            to the end. Faults are placed by step (`fault-every-s` / the step time, see
            `--goodput-step-s`), so both runs get the same faults at the same points of progress.

Per in-job restart (SIGKILL), its phases: detect, stop workers, rendezvous (NVRx's profiling records
in the launcher log), process start, imports, in-process wrapper + process group, model build, state
load (the new ranks' resume records, the slowest rank), first step.

Per fault: `seconds_to_first_step` = from the fault (the injector's log record, or the SIGTERM)
to the first step completed by every rank afterwards; `steps_lost` = last step completed before
the fault - the step training resumed from. Prints a table and one JSON line `RESULT {...}`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rtj.api.spec_recovery import HangDetection
from rtj.builders import graceful_stop_seconds
from rtj_local.procs import free_port
from rtj_local.train_log import late_snapshots, logs_in_memory, steps_lost
from rtj_local.wait import wait_for
from rtj_trainer.checkpoint_format import committed_steps

ROOT = Path(__file__).resolve().parent.parent
PYTHONPATH = os.pathsep.join(
    [str(ROOT / "trainer-image"), str(ROOT / "operator"), os.environ.get("PYTHONPATH", "")]
)
CPU_MODEL = ["--dim", "64", "--layers", "2", "--heads", "4", "--vocab", "128", "--seq", "32", "--batch", "4"]
GPU_MODEL = [
    "--dim",
    "2048",
    "--layers",
    "20",
    "--heads",
    "16",
    "--vocab",
    "32000",
    "--seq",
    "2048",
    "--batch",
    "4",
]
# goodput-product: the product's goodput run alone (the seed's approach beside it is `goodput`)
RUNS = (
    "faults",
    "faults-persist-only",
    "sigterm",
    "throughput",
    "goodput",
    "goodput-product",
    "faults-plain-ranks",
)
GOODPUT_FAULTS = ("exception", "sigkill", "hang")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--cpu", action="store_true", help="tiny model, gloo, 2 ranks (a smoke run)")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument(
        "--work", default="/tmp/rtj-norollback-bench", help="checkpoints (the persistent tier) and logs"
    )
    p.add_argument("--memory-dir", default="/dev/shm/rtj-norollback-bench", help="the memory tier (a tmpfs)")
    p.add_argument("--out", default=None, help="write the JSON result here")
    p.add_argument("--only", default=",".join(RUNS[:4]), help=f"comma-separated subset of {','.join(RUNS)}")
    p.add_argument("--steps", type=int, default=150, help="steps of the faults runs")
    p.add_argument("--exception-step", type=int, default=50)
    p.add_argument("--sigkill-step", type=int, default=100)
    p.add_argument("--sigterm-step", type=int, default=60)
    p.add_argument(
        "--grace-seconds",
        type=int,
        default=30,
        help="the pod's terminationGracePeriodSeconds (entrypoint settings derived as the operator does)",
    )
    p.add_argument("--throughput-steps", type=int, default=100)
    p.add_argument("--memory-interval", type=int, default=10)
    p.add_argument("--persist-interval", type=int, default=40)
    p.add_argument(
        "--snapshot-write-threads",
        type=int,
        default=0,
        help="throughput: also a run with memory snapshots written by this many threads (0: no such run)",
    )
    p.add_argument(
        "--pinned-row",
        action="store_true",
        help="throughput: also a run with memory snapshots through pinned buffers (GPU staging off)",
    )
    p.add_argument(
        "--memory-only-row",
        action="store_true",
        help="throughput: also a run with memory snapshots and no persist during the steps (the memory "
        "tier's own cost, apart from the persist's)",
    )
    p.add_argument("--min-step-time", type=float, default=0.0, help="pad steps (CPU: slow the loop down)")
    p.add_argument("--goodput-seconds", type=float, default=480, help="goodput: each run's length")
    p.add_argument(
        "--fault-every-s", type=float, default=60, help="goodput: one fault per this much progress"
    )
    p.add_argument(
        "--goodput-step-s",
        type=float,
        default=0.0,
        help="goodput: the step time that places the faults (0: --min-step-time, else 0.19 s, 2xH200)",
    )
    p.add_argument("--timeout", type=float, default=420, help="seconds per job")
    # Anything else is passed to fsdp_train (model arguments; default: by --cpu).
    a, model = p.parse_known_args()
    a.model = model or (CPU_MODEL if a.cpu else GPU_MODEL)
    a.only = [r for r in a.only.split(",") if r]
    bad = set(a.only) - set(RUNS)
    if bad:
        p.error(f"--only: unknown run(s) {sorted(bad)}")
    return a


class Job:
    """One job directory: checkpoints, the memory tier, step logs, launcher logs."""

    def __init__(self, a: argparse.Namespace, name: str) -> None:
        self.a, self.name = a, name
        self.dir = Path(a.work) / name
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        self.logs = logs_in_memory(self.dir / "logs")  # off the disk the persists write to
        self.ckpt, self.mem = self.dir / "ckpt", Path(a.memory_dir) / name
        shutil.rmtree(self.mem, ignore_errors=True)

    def env(
        self,
        steps: int,
        *,
        faults: str = "",
        memory: int = 0,
        persist: int = 40,
        extra: list[str] | None = None,
        in_process: bool = True,
        hang_timeout_s: int = 0,
        max_restarts: int = 3,
        forkserver: bool = True,
        gpu_staging: bool = True,
    ) -> dict[str, str]:
        """hang_timeout_s: detect a hang after this many seconds (in-process soft timeout, and the
        rank heartbeat timeout at twice it); 0 = the defaults below (60 s and 120 s). max_restarts:
        the in-process and the in-job restart budgets."""
        port = free_port()
        args = ["--steps", str(steps), "--log-dir", str(self.logs), *self.a.model, *(extra or [])]
        if self.a.min_step_time:
            args += ["--min-step-time", str(self.a.min_step_time)]
        cfg = {
            "jobName": self.name,
            "command": [sys.executable, "-m", "rtj_trainer.examples.fsdp_train"],
            "args": args,
            "nnodes": 1,
            "nprocPerNode": self.a.nproc,
            "rdzvEndpoint": f"127.0.0.1:{port}",
            "rdzvId": f"{self.name}-{port}",
            "maxInJobRestarts": max_restarts,
            "heartbeatIntervalSeconds": 1,
            "rankHangTimeoutSeconds": 2 * hang_timeout_s if hang_timeout_s else 120,
            "rankInitialTimeoutSeconds": 300,
            "inProcess": {
                "enabled": in_process,
                "softTimeoutSeconds": hang_timeout_s or 60,
                "hardTimeoutSeconds": int(1.5 * hang_timeout_s) if hang_timeout_s else 90,
                "maxRestarts": max_restarts,
            },
            "checkpointDir": str(self.ckpt),
            "checkpointIntervalSteps": persist,
            "checkpointsToKeep": 2,
            "memorySnapshotIntervalSteps": memory,
            "memorySnapshotDir": str(self.mem.parent),
            "memorySnapshotGpuStaging": gpu_staging,
            "maxNoProgressCycles": 3,
            "doNotRestartExitCodes": [93, 78],
            # The spec's defaults (on: budgets learned from the rank's own step times), as the
            # operator sends them.
            "hangDetection": HangDetection().model_dump(by_alias=True),
        }
        env = {
            **os.environ,
            "PYTHONPATH": PYTHONPATH,
            "RTJ_TRAINER_CONFIG": json.dumps(cfg),
            "RTJ_POD_NAME": f"{self.name}-n0-a0",
            "RTJ_NAMESPACE": "default",
            "RTJ_POD_IP": "127.0.0.1",
            # No RTJ_STATUS_DIR: the ranks' status files where a pod keeps them (rtj_trainer.entrypoint).
            "RTJ_COLLECTIVE_TIMEOUT_SECONDS": "2" if self.a.cpu else "20",  # gloo: the abort waits for it
            # As the operator's pod builder sets them for a pod of this grace period.
            "RTJ_GRACEFUL_STOP_SECONDS": str(graceful_stop_seconds(self.a.grace_seconds)),
            "RTJ_TERMINATION_GRACE_SECONDS": str(self.a.grace_seconds),
            "RTJ_FAULT_INJECT": faults,
            "RTJ_RANK_FORKSERVER": "1" if forkserver else "0",
            "PYTHONUNBUFFERED": "1",
        }
        if self.a.cpu:
            env.update(OMP_NUM_THREADS="1", RTJ_DIST_BACKEND="gloo")
        env.pop("KUBECONFIG", None)
        return env

    def start(self, env: dict[str, str], tag: str) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]:
        procs = []
        for cmd in ("rendezvous", "launch"):
            with open(self.dir / f"{cmd}{tag}.log", "ab") as out:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "rtj_trainer.entrypoint", cmd],
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        return procs[0], procs[1]

    def run(self, env: dict[str, str], tag: str = "") -> int:
        rdzv, launch = self.start(env, tag)
        try:
            return launch.wait(self.a.timeout)
        except subprocess.TimeoutExpired:
            return -1
        finally:
            _kill(launch)
            _kill(rdzv)

    def records(self) -> list[list[dict[str, Any]]]:
        out = []
        for r in range(self.a.nproc):
            path = self.logs / f"rank-{r}.jsonl"
            lines = path.read_text().splitlines() if path.exists() else []
            out.append([json.loads(x) for x in lines if x.strip()])
        return out

    def max_step(self) -> int:
        return max((x["step"] for rr in self.records() for x in rr if "loss" in x), default=0)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


# --- measurements from the step logs ---------------------------------------------------------------
def recovery(per_rank: list[list[dict[str, Any]]], fault_t: float) -> dict[str, Any]:
    """Seconds from `fault_t` to the first step every rank completed afterwards, and steps lost
    (rtj_local.train_log, as the demo and the e2e fault matrix count them)."""
    firsts = []
    for recs in per_rank:
        after = [x for x in recs if x["t"] > fault_t]
        step = next((x for x in after if "loss" in x), None)
        if step is None or not any(x.get("event") == "resume" for x in after):
            return {"recovered": False}
        firsts.append(step["t"])
    cost = steps_lost({f"rank-{r}.jsonl": recs for r, recs in enumerate(per_rank)}, fault_t)
    assert cost is not None  # every rank resumed after the fault
    return {
        "recovered": True,
        "seconds_to_first_step": round(max(firsts) - fault_t, 2),
        "resumed_from_step": cost.resumed_at,
        "resumed_from": list(cost.sources),
        "steps_lost": cost.lost,
    }


LAUNCHER_EVENT = re.compile(r"Event: (\w+) Node: .* Time: (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+) UTC")


def launcher_events(log: Path) -> list[tuple[str, float]]:
    """NVRx's profiling records in a launcher log: (event, wall time), in order."""
    out = []
    for m in LAUNCHER_EVENT.finditer(log.read_text(errors="replace") if log.exists() else ""):
        when = datetime.strptime(m[2], "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=UTC)
        out.append((m[1], when.timestamp()))
    return out


def in_job_phases(
    per_rank: list[list[dict[str, Any]]], events: list[tuple[str, float]], fault_t: float
) -> dict[str, float] | None:
    """Seconds of each phase of the in-job restart after `fault_t`: the launcher's (NVRx profiling
    events) then the new ranks' (their resume record's `phases`, the slowest rank), then the first
    step every rank completed. None when the fault was not followed by an in-job restart."""
    after = {}
    for name, t in events:
        if t >= fault_t - 0.01 and name not in after:  # log times are in milliseconds
            after[name] = t
    found = [
        next((x for x in recs if x.get("event") == "resume" and x["t"] > fault_t), None) for recs in per_rank
    ]
    resumes = [r for r in found if r is not None and "phases" in r]
    need = ("failure_detected", "worker_terminated", "rendezvous_completed")
    if any(n not in after for n in need) or len(resumes) < len(per_rank):
        return None
    found_firsts = [
        next((x["t"] for x in recs if "loss" in x and x["t"] > r["t"]), None)
        for recs, r in zip(per_rank, resumes, strict=True)
    ]
    firsts = [t for t in found_firsts if t is not None]
    if len(firsts) < len(found_firsts):
        return None

    def latest(key: str) -> float:
        return max(r["phases"][key] or 0.0 for r in resumes)

    marks = [
        ("detect", after["failure_detected"]),
        ("stop_workers", after["worker_terminated"]),
        ("rendezvous", after["rendezvous_completed"]),
        ("process_start", latest("proc")),
        ("imports", latest("main")),
        ("wrapper_and_process_group", latest("train")),
        ("model_build", latest("built")),
        ("state_load", max(r["t"] for r in resumes)),
        ("first_step", max(firsts)),
    ]
    out, prev = {}, fault_t
    for name, t in marks:
        out[name] = round(t - prev, 2)
        prev = t
    out["total"] = round(prev - fault_t, 2)
    return out


def step_time(recs: list[dict[str, Any]], skip: int = 5) -> float:
    """Median seconds per step of one rank's uninterrupted steps (after `skip` warm-up steps)."""
    steps = [x for x in recs if "loss" in x][skip:]
    return statistics.median(x["dt"] for x in steps) if steps else float("nan")


def throughput(recs: list[dict[str, Any]], skip: int = 5) -> float:
    """Steps per second over the run's steady part (wall time between step records)."""
    steps = [x for x in recs if "loss" in x][skip:]
    if len(steps) < 2:
        return float("nan")
    return (len(steps) - 1) / (steps[-1]["t"] - steps[0]["t"])


def first_snapshot_step(recs: list[dict[str, Any]]) -> int | None:
    """The first step a memory snapshot was taken at (the ones due before it were deferred while the
    slots were prepared)."""
    return next((x["step"] for x in recs if x.get("save") in ("snapshot", "saved")), None)


def throughput_between(recs: list[dict[str, Any]], first: int, last: int) -> float:
    """Steps per second over steps first..last (wall time between their records)."""
    t = {x["step"]: x["t"] for x in recs if "loss" in x}
    if first not in t or last not in t or last <= first:
        return float("nan")
    return (last - first) / (t[last] - t[first])


def persisted_recency(recs: list[dict[str, Any]]) -> float | None:
    """Average, over steps, of (step - newest persisted step) once one was persisted."""
    ages = [x["step"] - x["committed"] for x in recs if "loss" in x and x.get("committed")]
    return round(statistics.mean(ages), 1) if ages else None


# --- the runs ---------------------------------------------------------------------------------------
def run_faults(a: argparse.Namespace, name: str, memory: int, forkserver: bool = True) -> dict[str, Any]:
    job = Job(a, name)
    victim = a.nproc - 1  # rank 1 on two GPUs; rank 0 when one rank runs alone
    faults = f"exception:{victim}:{a.exception_step};sigkill:{victim}:{a.sigkill_step}"
    env = job.env(a.steps, faults=faults, memory=memory, persist=a.persist_interval, forkserver=forkserver)
    rc = job.run(env)
    per_rank = job.records()
    out: dict[str, Any] = {"rc": rc, "memory_interval": memory, "persist_interval": a.persist_interval}
    for kind in ("exception", "sigkill"):
        fault = next((x for x in per_rank[victim] if x.get("event") == "fault" and x["kind"] == kind), None)
        out[kind] = recovery(per_rank, fault["t"]) if fault else {"recovered": False}
        if fault and kind == "sigkill":
            out[kind]["phases"] = in_job_phases(per_rank, launcher_events(job.dir / "launch.log"), fault["t"])
    out["step_time_s"] = round(step_time(per_rank[0]), 4)
    return out


def run_sigterm(a: argparse.Namespace) -> dict[str, Any]:
    job = Job(a, "sigterm")
    far = a.sigterm_step * 10  # never reached: the stop comes first
    env = job.env(far, memory=a.memory_interval, persist=10 * a.persist_interval)
    rdzv, launch = job.start(env, "")
    try:
        deadline = time.monotonic() + a.timeout
        while job.max_step() < a.sigterm_step and launch.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        t_term = time.time()
        launch.send_signal(signal.SIGTERM)
        rc = launch.wait(a.timeout)
        t_exit = time.time()
    finally:
        _kill(launch)
        _kill(rdzv)
    per_rank = job.records()
    last_done = max(x["step"] for rr in per_rank for x in rr if "loss" in x)
    stopped = [x for rr in per_rank for x in rr if x.get("event") == "stopped"]
    persisted = last_done in committed_steps(str(job.ckpt))  # by the time the pod had exited
    # A replacement pod: the old pod's memory is gone; only what was persisted is left.
    shutil.rmtree(job.mem, ignore_errors=True)
    t_start = time.time()
    rc2 = job.run(job.env(last_done + 10, memory=a.memory_interval, persist=10 * a.persist_interval), "-2")
    rec = recovery(job.records(), t_start)
    return {
        "rc_stop": rc,
        "rc_resume": rc2,
        "stop_seconds": round(t_exit - t_term, 2),
        "emergency_save_seconds": max((x["seconds"] for x in stopped), default=None),
        "grace_seconds": a.grace_seconds,
        # committed on the volume by the time the pod had exited: by the ranks, or by the pod's
        # entrypoint after they handed it off (`handed_off`; the entrypoint's seconds: `handoff_s`)
        "persisted": persisted,
        "handed_off": all(x.get("handed_off") for x in stopped) and bool(stopped),
        "handoff_s": handoff_seconds(job.dir / "launch.log"),
        "in_memory": all(x.get("memory") for x in stopped) and bool(stopped),
        "stopped_at_step": last_done,
        "resume": rec,
    }


def handoff_seconds(launch_log: Path) -> float | None:
    """Seconds the entrypoint took to persist the snapshots its ranks handed off (the longest rank),
    from its log lines; None when nothing was handed off."""
    try:
        text = launch_log.read_text(errors="replace")
    except OSError:
        return None
    found = [float(m) for m in re.findall(r"persisted by the pod in ([0-9.]+) s: committed", text)]
    return max(found) if found else None


def run_throughput(a: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    # (name, memory interval, fsdp_train args, GPU staging of memory snapshots, persist interval)
    mem, every = a.memory_interval, a.persist_interval
    runs = [
        ("no-checkpoints", 0, ["--no-checkpoint"], True, every),
        ("memory-snapshots", mem, [], True, every),
    ]
    if a.memory_only_row:  # a persist interval past the run's last step
        runs.append(("memory-snapshots-no-persist", mem, [], True, 10 * a.throughput_steps))
    if a.pinned_row:
        runs.append(("memory-snapshots-pinned", mem, [], False, every))
    if n := a.snapshot_write_threads:
        runs.append((f"memory-snapshots-{n}-threads", mem, ["--snapshot-write-threads", str(n)], True, every))
    records: dict[str, list[dict[str, Any]]] = {}
    for name, memory, extra, staging, persist in runs:
        job = Job(a, f"throughput-{name}")
        env = job.env(a.throughput_steps, memory=memory, persist=persist, extra=extra, gpu_staging=staging)
        rc = job.run(env)
        recs = job.records()[0]
        writes = sorted(x["seconds"] for x in recs if x.get("event") == "snapshot")
        out[name] = {
            "rc": rc,
            "persist_interval": persist,
            "steps_per_s": round(throughput(recs), 3),
            "median_step_s": round(step_time(recs), 4),
            "persisted_recency_steps": persisted_recency(recs),
            "snapshots": sum(1 for x in recs if x.get("save") in ("snapshot", "saved")),
            "skipped": sum(1 for x in recs if x.get("save") == "skipped"),
            # each write into the memory tier (the step log's snapshot records): median, and how many
            # were staged on the GPU, and copied into the tier by the pod's slot copier
            "write_s_median": writes[len(writes) // 2] if writes else None,
            "staged": sum(1 for x in recs if x.get("event") == "snapshot" and x.get("staged")),
            "by_copier": sum(1 for x in recs if x.get("event") == "snapshot" and x.get("by_copier")),
            "first_snapshot_step": first_snapshot_step(recs),
            # due every --memory-interval steps: taken at that step, or late (deferred, or never)
            **(
                {f"snapshots_{k}": v for k, v in asdict(late_snapshots(recs, a.memory_interval)).items()}
                if memory
                else {}
            ),
            # writes logged while a persist was in flight
            "writes_beside_persist": sum(
                1 for x in recs if x.get("event") == "snapshot" and x.get("persisting")
            ),
        }
        records[name] = recs
        # The next run's memory tier must not share the host with this one's slots (3 x 13.7 GB
        # on one H100 host: the pinned run beside them was killed for memory).
        shutil.rmtree(job.mem, ignore_errors=True)
        shutil.rmtree(job.ckpt, ignore_errors=True)  # nor its disk with its persisted 13.7 GB copies
    base = out["no-checkpoints"]["steps_per_s"]
    for name in [n for n in out if n.startswith("memory-snapshots")]:
        out[name]["relative_throughput"] = round(out[name]["steps_per_s"] / base, 4) if base else None
        # Once the first snapshot was taken: the cost in a long run, apart from the preparation.
        first, last = out[name]["first_snapshot_step"], a.throughput_steps
        if first is not None and first < last:
            mine = throughput_between(records[name], first, last)
            theirs = throughput_between(records["no-checkpoints"], first, last)
            out[name]["relative_throughput_after_first_snapshot"] = round(mine / theirs, 4)
    out["relative_throughput"] = out["memory-snapshots"]["relative_throughput"]
    out["persist_interval"] = a.persist_interval
    return out


def run_goodput(a: argparse.Namespace, name: str, product: bool) -> dict[str, Any]:
    """One goodput run: the product path, or the seed's approach (no memory tier, no in-process
    restart: every fault restarts the workers from the newest persisted checkpoint)."""
    job = Job(a, name)
    step_s = a.goodput_step_s or a.min_step_time or 0.19
    every = max(1, round(a.fault_every_s / step_s))
    n_faults = max(1, int(a.goodput_seconds // a.fault_every_s))
    victim = a.nproc - 1
    faults = ";".join(
        f"{GOODPUT_FAULTS[i % len(GOODPUT_FAULTS)]}:{victim}:{(i + 1) * every}" for i in range(n_faults)
    )
    env = job.env(
        10**7,  # never reached: the window ends the run
        faults=faults,
        memory=a.memory_interval if product else 0,
        persist=a.persist_interval,
        in_process=product,
        hang_timeout_s=max(10, round(10 * step_s)),
        max_restarts=100,  # a fault a minute: the budgets must outlast the window
    )
    rdzv, launch = job.start(env, "")
    try:
        # The window starts at the first step (process start and imports excluded).
        wait_for(lambda: job.max_step() >= 1 or launch.poll() is not None, 600, message=f"{name}: first step")
        t_first = time.time()
        with contextlib.suppress(subprocess.TimeoutExpired):
            launch.wait(a.goodput_seconds)
        t_end = time.time()
    finally:
        _kill(launch)
        _kill(rdzv)
    per_rank = job.records()
    recs = [x for x in per_rank[0] if x["t"] <= t_end]
    steps = [x for x in recs if "loss" in x]
    final = steps[-1]["step"] if steps else 0
    first = steps[0]["step"] if steps else 0
    median = step_time(per_rank[0])
    injected = [x for x in per_rank[victim] if x.get("event") == "fault" and x["t"] <= t_end]
    lost, recovered = 0, 0
    for f in injected:  # a fault whose recovery the window's end cut is not counted here
        cost = steps_lost({f"rank-{r}.jsonl": rr for r, rr in enumerate(per_rank)}, f["t"])
        if cost is not None:
            lost, recovered = lost + cost.lost, recovered + 1
    window = t_end - t_first
    return {
        "product": product,
        "launcher_rc": launch.returncode,
        "window_s": round(window, 1),
        "faults_planned": faults,
        "faults_injected": [x["kind"] for x in injected],
        "final_step": final,
        "median_step_s": round(median, 4),
        "faults_recovered": recovered,
        "steps_lost": lost,
        "goodput": round((final - first + 1) * median / window, 4) if window > 0 and steps else None,
        "persisted_recency_steps": persisted_recency(per_rank[0]),
    }


def table(res: dict[str, Any]) -> str:
    rows = [
        "| fault | recovered | seconds to first step | steps lost | resumed from |",
        "|---|---|---|---|---|",
    ]
    for run in ("faults", "faults-plain-ranks", "faults-persist-only"):
        for kind in ("exception", "sigkill"):
            r = res.get(run, {}).get(kind)
            if r:
                rows.append(
                    f"| {kind} ({run}) | {r['recovered']} | {r.get('seconds_to_first_step')} | "
                    f"{r.get('steps_lost')} | {r.get('resumed_from')} {r.get('resumed_from_step')} |"
                )
    for run in ("faults", "faults-plain-ranks", "faults-persist-only"):
        ph = res.get(run, {}).get("sigkill", {}).get("phases")
        if ph:
            rows.append(
                f"in-job restart phases ({run}), seconds: " + ", ".join(f"{k} {v}" for k, v in ph.items())
            )
    if s := res.get("sigterm"):
        r = s["resume"]
        rows.append(
            f"| SIGTERM (grace {s['grace_seconds']} s, stop {s['stop_seconds']} s, save "
            f"{s['emergency_save_seconds']} s, handed off {s['handed_off']}, pod's persist "
            f"{s['handoff_s']} s, persisted {s['persisted']}) "
            f"| {r['recovered']} | "
            f"{r.get('seconds_to_first_step')} (from the new pod's start) | {r.get('steps_lost')} | "
            f"{r.get('resumed_from')} {r.get('resumed_from_step')} |"
        )
    if t := res.get("throughput"):
        rows.append("")
        rows.append(
            "| run | steps/s | relative | median step s | persisted recency (steps) | snapshots | skipped "
            "| write s (median) | staged on the GPU | first snapshot at step | relative after it "
            "| writes beside a persist | snapshots late of due (most steps late) |"
        )
        rows.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for name in [n for n in t if n.startswith(("no-checkpoints", "memory-snapshots"))]:
            r = t[name]
            cells = [
                name, r["steps_per_s"], r.get("relative_throughput", 1.0), r["median_step_s"],
                r["persisted_recency_steps"], r["snapshots"], r["skipped"], r["write_s_median"], r["staged"],
                r["first_snapshot_step"], r.get("relative_throughput_after_first_snapshot"),
                r["writes_beside_persist"],
                f"{r['snapshots_late']} of {r['snapshots_due']} ({r['snapshots_max_steps_late']})"
                if "snapshots_due" in r else "",
            ]  # fmt: skip
            rows.append("| " + " | ".join(str(c) for c in cells) + " |")
        rows.append(f"relative throughput with memory snapshots: {t['relative_throughput']}")
    if g := res.get("goodput"):
        rows.append("")
        rows.append(
            "| run | window s | faults injected | recovered | final step | steps lost "
            "| median step s | goodput |"
        )
        rows.append("|---|---|---|---|---|---|---|---|")
        for name in [n for n in ("product", "seed-approach") if n in g]:
            r = g[name]
            kinds = ", ".join(r["faults_injected"])
            rows.append(
                f"| {name} | {r['window_s']} | {len(r['faults_injected'])} ({kinds}) "
                f"| {r['faults_recovered']} | "
                f"{r['final_step']} | {r['steps_lost']} | {r['median_step_s']} | {r['goodput']} |"
            )
        if "ratio" in g:
            rows.append(f"goodput of the product / the seed's approach: {g['ratio']}")
    return "\n".join(rows)


def main() -> None:
    a = parse_args()
    res: dict[str, Any] = {
        "model": a.model,
        "nproc": a.nproc,
        "cpu": a.cpu,
        "memory_interval": a.memory_interval,
    }
    t0 = time.time()
    if "faults" in a.only:
        res["faults"] = run_faults(a, "faults", a.memory_interval)
    if "faults-plain-ranks" in a.only:
        res["faults-plain-ranks"] = run_faults(a, "faults-plain-ranks", a.memory_interval, forkserver=False)
    if "faults-persist-only" in a.only:
        res["faults-persist-only"] = run_faults(a, "faults-persist-only", 0)
    if "sigterm" in a.only:
        res["sigterm"] = run_sigterm(a)
    if "throughput" in a.only:
        res["throughput"] = run_throughput(a)
    if "goodput-product" in a.only and "goodput" not in a.only:
        res["goodput"] = {"product": run_goodput(a, "goodput-product", True)}
    if "goodput" in a.only:
        g: dict[str, Any] = {
            "product": run_goodput(a, "goodput-product", True),
            "seed-approach": run_goodput(a, "goodput-seed", False),
        }
        p, s = g["product"]["goodput"], g["seed-approach"]["goodput"]
        g["ratio"] = round(p / s, 3) if p and s else None
        res["goodput"] = g
    res["bench_s"] = round(time.time() - t0, 1)
    print(table(res), flush=True)
    print("RESULT " + json.dumps(res), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
