"""The rendezvous pod dies: relaunch ft_launcher inside the same pods, or replace the pods?

    .venv/bin/python bench/rendezvous_loss_cpu.py [--runs 2] [--out bench/results/rendezvous_loss_cpu.json]

Each run: a toy job (2 pods x 2 ranks + the rendezvous process, tests/trainer/toy_train.py, real
ft_launcher and gloo on CPU) trains to step 20; the rendezvous process is SIGKILLed and started again
2 s later (the operator recreating the rendezvous pod). Then either
- relaunch: the pods' entrypoints start ft_launcher again (rtj_trainer.rendezvous_loss), or
- replace (the baseline, `RTJ_RENDEZVOUS_RELAUNCHES=0`): every pod exits 70 and new pods are started
  the moment the old ones exit (an operator with zero reaction time and instant pod creation: on a
  real cluster, pod deletion, scheduling and container start come on top).
Printed: seconds from the kill to the first step of the new workers, steps redone (from the newest
step before the kill), per run and the median ratio relaunch / replace.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # trainer_harness imports trainer_pods
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "trainer"))

from rtj_local.wait import wait_for
from trainer_harness import ToyJob, first_step_after

RESTART_DELAY = 2.0


def run(tmp: Path, mode: str) -> dict[str, float]:
    env = {"TOY_STEPS": "2000"}
    if mode == "replace":
        env["RTJ_RENDEZVOUS_RELAUNCHES"] = "0"
    job = ToyJob(tmp, env=env)
    tmp.mkdir(parents=True)
    try:
        job.start()
        job.wait_step(20, 240)
        old_pids = {e["pid"] for e in job.events()}
        t_kill = job.kill_rendezvous()
        newest = job.max_step()
        time.sleep(RESTART_DELAY)
        job.start_rendezvous()
        if mode == "replace":
            for name in list(job.pods):
                job.wait_exit(name, 120)
                job.start_pod(f"{name}-a1")
        back = wait_for(
            lambda: first_step_after(job.events(), t_kill, exclude_pids=old_pids),
            300,
            interval=0.2,
            message="the first step after the kill",
        )
        return {"seconds": back["t"] - t_kill, "steps_redone": max(0, newest - back["step"] + 1)}
    finally:
        job.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as d:
        for i in range(args.runs):
            for mode in ("relaunch", "replace"):  # alternating: load drifts hit both alike
                r = run(Path(d) / f"{mode}-{i}", mode)
                rows.append({"run": i, "mode": mode, **r})
                print(
                    f"run {i} {mode:8s} {r['seconds']:6.2f} s  steps redone {r['steps_redone']:.0f}",
                    flush=True,
                )
    med = {
        m: statistics.median(float(r["seconds"]) for r in rows if r["mode"] == m)
        for m in ("relaunch", "replace")
    }
    print("\n| mode | median s from kill to first step | runs |\n|---|---|---|")
    for m in ("relaunch", "replace"):
        print(f"| {m} | {med[m]:.2f} | {sum(1 for r in rows if r['mode'] == m)} |")
    print(f"\nratio relaunch / replace: {med['relaunch'] / med['replace']:.2f}")
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "median_seconds": med}, indent=2) + "\n")


if __name__ == "__main__":
    main()
