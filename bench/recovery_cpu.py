"""Recovery time per level of the ladder, on CPU (gloo), with the real trainer runtime.

    .venv/bin/python bench/recovery_cpu.py [--only in-process,in-job,hang,pod-rank0,pod-other]

Each row runs a fresh toy job (2 pods x 2 ranks + the rendezvous process, tests/trainer/toy_train.py),
injects one fault and measures the wall time from the fault to the first completed step after
recovery. The baseline, measured in the same run, is the job's cold start (launch -> first step):
the ratio says how much of a restart from scratch each level costs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # trainer_harness imports trainer_pods
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "trainer"))

from rtj_local.wait import wait_for
from trainer_harness import ToyJob, first_step_after


def _fault_time(job: ToyJob, rank: int, step: int) -> float:
    ev = [e for e in job.events() if e["rank"] == rank and e["step"] == step - 1]
    return min(e["t"] for e in ev)


def _run_injected(tmp: Path, fault: str, config: dict | None = None) -> tuple[float, float]:
    job = ToyJob(tmp, config=config or {}, env={"TOY_STEPS": "60", "RTJ_FAULT_INJECT": fault})
    tmp.mkdir(parents=True)
    t0 = time.time()
    try:
        job.start()
        first = job.wait_step(1, 240)
        cold = min(e["t"] for e in first) - t0
        for name in job.pods:
            job.wait_exit(name, 300)
        kind, rank, step = fault.split(":")[:3]
        t_fault = _fault_time(job, int(rank), int(step))
        match = {"ipr": 1} if kind == "exception" else {"rank": int(rank)}
        back = first_step_after(job.events(), t_fault, **match)
        return back["t"] - t_fault, cold
    finally:
        job.stop()


def _run_lost_pod(tmp: Path, rank0: bool) -> tuple[float, float]:
    job = ToyJob(tmp, config={"rankHangTimeoutSeconds": 5})
    tmp.mkdir(parents=True)
    t0 = time.time()
    try:
        job.start()
        cold = min(e["t"] for e in job.wait_step(1, 240)) - t0
        events = job.wait_step(40, 240)
        r0 = max((e for e in events if e["rank"] == 0), key=lambda e: e["t"])["ppid"]
        r0_pod = job.pod_of_launcher(r0)
        victim = r0_pod if rank0 else next(n for n in job.pods if n != r0_pod)
        before = job.max_step()
        old_pids = {e["pid"] for e in job.events()}
        t_kill = job.kill_pod(victim)
        job.start_pod("replacement")
        back = wait_for(
            lambda: first_step_after(job.events(), t_kill, step_above=before, exclude_pids=old_pids),
            300,
            message="recovery",
        )
        return back["t"] - t_kill, cold
    finally:
        job.stop()


SCENARIOS = {
    "in-process": ("rank exception -> inprocess.Wrapper", lambda d: _run_injected(d, "exception:1:30")),
    "in-job": ("rank SIGKILL -> ft_launcher restart", lambda d: _run_injected(d, "sigkill:1:30")),
    "hang": (
        "rank wedged (signals masked) -> NVRx heartbeat 5 s",
        lambda d: _run_injected(d, "wedge:1:30", {"rankHangTimeoutSeconds": 5}),
    ),
    "pod-rank0": ("pod with rank 0 SIGKILLed -> replacement", lambda d: _run_lost_pod(d, True)),
    "pod-other": ("other pod SIGKILLed -> replacement", lambda d: _run_lost_pod(d, False)),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default=",".join(SCENARIOS))
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for key in args.only.split(","):
            what, fn = SCENARIOS[key]
            seconds, cold = fn(Path(d) / key)
            rows.append((key, what, seconds, cold))
            print(f"{key}: {seconds:.2f} s (cold start {cold:.2f} s)", flush=True)
    print()
    print(f"{'level':<12}{'fault -> recovery':<44}{'seconds':>9}{'cold start':>12}{'ratio':>8}")
    for key, what, seconds, cold in rows:
        print(f"{key:<12}{what:<44}{seconds:>9.2f}{cold:>12.2f}{seconds / cold:>8.2f}")


if __name__ == "__main__":
    main()
