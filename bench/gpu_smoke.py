"""The product path on one machine, as a pod runs it, with an in-process and an in-job fault.

    python bench/gpu_smoke.py --out smoke.json           # 2xH200: FSDP2 at ~1.1 B parameters, NCCL
    python bench/gpu_smoke.py --cpu --out smoke.json     # anywhere: a tiny model on gloo (self-test)
    python bench/gpu_smoke.py --nproc 1 --out smoke.json # 1 GPU: one rank, the faults in rank 0
    python bench/gpu_smoke.py --hang-step 75 ...         # also a stalled step (learned hang budget)

`rtj-trainer rendezvous` (nvrx-control) and `rtj-trainer launch` (heartbeat agent -> ft_launcher ->
`rtj_trainer.examples.fsdp_train`) run exactly as in the pods, with the fault injection of
fsdp_train: an exception in rank 1 (NVRx in-process restart) and a SIGKILL of rank 1 (ft_launcher's
in-job restart), and with `--hang-step` a rank that stops making progress (`stall`: caught by the
learned hang budget, hangDetection, instead of the 60 s soft timeout, and restarted in-process).
With `--in-place-step` a second SIGKILL there spends the in-job budget (maxInJobRestarts 1): the
trainer exits 76 (ExitCode.RESTART_IN_PLACE, one in-place restart allowed) and the bench starts
`rtj-trainer launch` again as the kubelet's RestartAllContainers would, same memory volume and
env; the new container resumes from the memory snapshots (fault `in-place`; the kubelet's own
restart latency is not in it: tests/e2e on kubelet nodes measure the whole path).
Prints one JSON document: per fault, seconds from the fault to the first completed step and the
steps redone (`hang`: the stall's detection + recovery seconds and steps lost); checkpoints
committed; final step and loss; pod-log lines per minute (all, and c10d store-poll timeouts before
and after the log filter). Exits non-zero if the run did not train to the last step through both
faults (and, with `--hang-step`, recover the stall in-process before the soft timeout). Run it
after every change to trainer-image/ and record date, commit and figures in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from rtj.contract import ENV_MAX_IN_PLACE_RESTARTS, ExitCode
from rtj_local.procs import free_port
from rtj_local.train_log import logs_in_memory
from rtj_trainer.log_filter import STORE_POLL_TIMEOUT

#: ~1.1 B parameters: fp32 master weights + AdamW state ~ 6.8 GB per rank on 2 GPUs (FACTS).
GPU_MODEL = "--dim 2048 --layers 20 --heads 16 --vocab 32000 --seq 2048 --batch 4"
CPU_MODEL = "--dim 64 --layers 2 --heads 4 --vocab 128 --seq 32 --batch 4 --min-step-time 0.05"
DROPPED = re.compile(r"rtj-trainer: dropped (\d+) '\[c10d\] waitForInput")


def trainer_config(args: argparse.Namespace, work: Path, port: int) -> dict[str, Any]:
    model = CPU_MODEL if args.cpu else GPU_MODEL
    return {
        "jobName": "gpu-smoke",
        "command": [sys.executable, "-m", "rtj_trainer.examples.fsdp_train"],
        "args": [*model.split(), "--steps", str(args.steps), "--log-dir", str(work / "logs")],
        "nnodes": 1,
        "nprocPerNode": args.nproc,
        "rdzvEndpoint": f"127.0.0.1:{port}",
        "rdzvId": "gpu-smoke",
        "maxInJobRestarts": 1 if args.in_place_step else 3,
        "heartbeatIntervalSeconds": 1,
        "rankHangTimeoutSeconds": 120,
        "rankInitialTimeoutSeconds": 300,
        "inProcess": {"enabled": True, "softTimeoutSeconds": 60, "hardTimeoutSeconds": 90, "maxRestarts": 3},
        "hangDetection": {"enabled": True, "floorSeconds": 5, "medianMultiple": 20},
        "checkpointDir": str(work / "ckpt"),
        "checkpointIntervalSteps": args.checkpoint_interval,
        "checkpointsToKeep": 2,
        # The memory tier (rtj_trainer.checkpoint.snapshot_ring): snapshots into this tmpfs.
        "memorySnapshotIntervalSteps": args.memory_interval,
        "memorySnapshotDir": args.memory_dir,
        "maxNoProgressCycles": 3,
        "doNotRestartExitCodes": [93, 78],
    }


def pod_env(cfg: dict[str, Any], args: argparse.Namespace) -> dict[str, str]:
    rank = min(1, args.nproc - 1)  # rank 1; rank 0 when the run has one rank (a 1-GPU machine)
    env = {
        **os.environ,
        "RTJ_TRAINER_CONFIG": json.dumps(cfg),
        "RTJ_POD_NAME": "gpu-smoke-n0-a0",
        "RTJ_NAMESPACE": "default",
        "RTJ_POD_IP": "127.0.0.1",
        # No RTJ_STATUS_DIR: the ranks' status files where a pod keeps them (rtj_trainer.entrypoint).
        "RTJ_FAULT_INJECT": ";".join(
            [f"exception:{rank}:{args.exception_step}", f"sigkill:{rank}:{args.sigkill_step}"]
            + ([f"{args.hang_kind}:{rank}:{args.hang_step}"] if args.hang_step else [])
            + ([f"sigkill:{rank}:{args.in_place_step}"] if args.in_place_step else [])
        ),
        # What the pod builder gives a pod whose kubelet restarts it in place (rtj.builders).
        ENV_MAX_IN_PLACE_RESTARTS: "1" if args.in_place_step else "0",
        "PYTHONUNBUFFERED": "1",
    }
    if args.cpu:
        env["RTJ_COLLECTIVE_TIMEOUT_SECONDS"] = "10"
    return env


def read_rank_log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def recoveries(records: list[dict[str, Any]], container_starts: Sequence[float] = ()) -> list[dict[str, Any]]:
    """Each resume after the first: the fault's time (the last step logged before it), the first
    step completed after it, and the steps redone. One across a container start (wall times in
    `container_starts`) is an in-place restart."""
    out = []
    last_step: dict[str, Any] | None = None
    pending: dict[str, Any] | None = None
    for rec in records:
        if rec.get("event") == "resume":
            if last_step is not None:
                pending = {"resume": rec, "before": last_step}
            continue
        if "loss" not in rec:
            continue
        if pending is not None:
            before, resume = pending["before"], pending["resume"]
            in_place = any(before["t"] < t < resume["t"] for t in container_starts)
            same = resume["restart"] == before["restart"]
            out.append(
                {
                    "kind": "in-place" if in_place else "in-process" if same else "in-job",
                    "fault_after_step": before["step"],
                    "resumed_from_step": resume["step"],
                    "resumed_from": resume.get("source", "?"),
                    "steps_redone": before["step"] - resume["step"],
                    "seconds_fault_to_first_step": round(rec["t"] - before["t"], 2),
                    # Seconds after the last step before the fault: the container's new start
                    # (in-place), the rank process's start, its main, its training function,
                    # its model built, the state resumed.
                    "phases": {
                        k: round(t - before["t"], 2)
                        for k, t in (
                            *(
                                ("container_start", t)
                                for t in container_starts
                                if before["t"] < t < resume["t"]
                            ),
                            *(resume.get("phases") or {}).items(),
                            ("resumed", resume["t"]),
                        )
                    },
                    # A new rank process's newest memory snapshot, copied to the GPU while its
                    # process group came up: its step, whether the resume used it, its seconds.
                    **({"prefetch": resume["prefetch"]} if "prefetch" in resume else {}),
                    **({"load": resume["load"]} if "load" in resume else {}),
                }
            )
            pending = None
        last_step = rec
    return out


def snapshot_figures(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Rank 0's saves: memory snapshots started and skipped (a due one that had to wait), the GPU
    seconds of the copy training waited for or overlapped (device-to-device when staged on the GPU,
    else device-to-host; median, max), the seconds of each write into the memory tier (median, max)
    and how many of those snapshots were staged on the GPU (and copied into the tier by the pod's
    slot copier); per staged write, in order, the writer's seconds waiting for the GPU's chunks and
    copying them into the slot, and whether a persist ran."""
    steps = [x for x in records if "loss" in x]
    copies = sorted(x["copy"] for x in steps if x.get("copy"))
    writes = [x for x in records if x.get("event") == "snapshot"]
    write_s = sorted(x["seconds"] for x in writes)
    drains = [
        [x["step"], x["seconds"], x["drain_gpu_wait"], x["drain_host_copy"], x.get("persisting")]
        for x in writes
        if "drain_gpu_wait" in x
    ]
    return {
        "drains_step_seconds_gpu_wait_host_copy_persisting": drains,
        "taken": sum(1 for x in steps if x.get("save") in ("snapshot", "saved")),
        "skipped": sum(1 for x in steps if x.get("save") == "skipped"),
        "copy_seconds_median": copies[len(copies) // 2] if copies else None,
        "copy_seconds_max": copies[-1] if copies else None,
        "write_seconds_median": write_s[len(write_s) // 2] if write_s else None,
        "write_seconds_max": write_s[-1] if write_s else None,
        "writes_staged_on_gpu": sum(1 for x in writes if x.get("staged")),
        "writes_by_slot_copier": sum(1 for x in writes if x.get("by_copier")),
        "writes": len(writes),
    }


def log_lines(launch_log: str, minutes: float) -> dict[str, Any]:
    lines = launch_log.splitlines()
    noise_passed = sum(bool(STORE_POLL_TIMEOUT.search(x.encode())) for x in lines)
    dropped = sum(int(m.group(1)) for x in lines if (m := DROPPED.search(x)))
    return {
        "minutes": round(minutes, 2),
        "pod_log_lines_per_min": round(len(lines) / minutes, 1),
        "store_poll_lines_per_min_before_filter": round((noise_passed + dropped) / minutes, 1),
        "store_poll_lines_per_min_after_filter": round(noise_passed / minutes, 1),
    }


#: Free /dev/shm the default memory tier needs there: 3 snapshots of a 1-GPU run's 13.7 GB.
SHM_NEEDED_BYTES = 48 << 30


def memory_dir(work: Path, shm: str = "/dev/shm") -> str:
    """The memory tier's directory when none is given: a new one in /dev/shm (memory, as a pod's
    `emptyDir` of medium Memory) where it has room, else under the run's directory. On the GPU hosts
    the temp dir is on the disk: a memory tier there drained in 5-9 s, not 1.6 s, and loaded in 7.4 s
    (bench/results/2026-12-07-reserve-ahead-h100.md)."""
    try:
        st = os.statvfs(shm)
        if st.f_bavail * st.f_frsize >= SHM_NEEDED_BYTES:
            return tempfile.mkdtemp(prefix="rtj-smoke-shm-", dir=shm)
    except OSError:
        pass
    return str(work / "shm")


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.memory_dir and Path(args.memory_dir).exists() and any(Path(args.memory_dir).iterdir()):
        # A previous run's snapshots there would be resumed from (a run that starts past its end).
        sys.exit(f"--memory-dir {args.memory_dir} is not empty: give each run a fresh one")
    if args.work_dir:
        Path(args.work_dir).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="rtj-smoke-", dir=args.work_dir))
    made_memory_dir = args.memory_dir is None
    if made_memory_dir:
        args.memory_dir = memory_dir(work)
    logs_in_memory(work / "logs")  # off the disk the persists write to
    port = free_port()
    cfg = trainer_config(args, work, port)
    env = pod_env(cfg, args)
    entry = [sys.executable, "-m", "rtj_trainer.entrypoint"]
    rdzv = subprocess.Popen([*entry, "rendezvous"], env=env, stdout=subprocess.DEVNULL,
                            stderr=open(work / "rendezvous.log", "wb"))  # fmt: skip  # noqa: SIM115
    t0 = time.monotonic()
    deadline = t0 + args.timeout
    exits: list[int] = []
    container_starts: list[float] = []
    out = ""
    try:
        while True:
            rc, text = _launch(entry, env, deadline - time.monotonic())
            out += text
            exits.append(rc)
            if rc != ExitCode.RESTART_IN_PLACE or len(exits) > 1:
                break
            container_starts.append(time.time())  # the kubelet's RestartAllContainers, played here
    finally:
        rdzv.terminate()
        rdzv.wait(30)
    minutes = (time.monotonic() - t0) / 60
    (work / "launch.log").write_text(out)
    if made_memory_dir:
        shutil.rmtree(args.memory_dir, ignore_errors=True)  # tens of GB of /dev/shm
    ranks = {r: read_rank_log(work / "logs" / f"rank-{r}.jsonl") for r in range(args.nproc)
             if (work / "logs" / f"rank-{r}.jsonl").exists()}  # fmt: skip
    steps = [x for x in ranks.get(0, []) if "loss" in x]
    faults = recoveries(ranks.get(0, []), container_starts)
    committed = sorted({x["committed"] for x in steps if x.get("committed")})
    result = {
        "launch_exit_code": rc,
        "container_exit_codes": exits,
        "faults": faults,
        "checkpoints_committed": committed,
        "final_step": steps[-1]["step"] if steps else None,
        "final_loss": steps[-1]["loss"] if steps else None,
        "first_loss": steps[0]["loss"] if steps else None,
        "median_step_seconds": sorted(x["dt"] for x in steps)[len(steps) // 2] if steps else None,
        "memory_snapshots": snapshot_figures(ranks.get(0, [])),
        "log": log_lines(out, minutes),
        "nvrx": _version("nvidia-resiliency-ext"),
        "torch": _version("torch"),
        "work_dir": str(work),
    }
    kinds = [f["kind"] for f in faults]
    result["hang"] = (
        hang_figures(faults, cfg, args.hang_step, ranks.get(0, []), out, args.hang_kind)
        if args.hang_step
        else None
    )
    result["passed"] = bool(
        rc == 0
        and result["final_step"] == args.steps
        and "in-process" in kinds
        and "in-job" in kinds
        and (not args.hang_step or (result["hang"] or {}).get("caught_before_soft_timeout"))
        and (not args.in_place_step or (exits[0] == ExitCode.RESTART_IN_PLACE and "in-place" in kinds))
    )
    return result


def _launch(entry: list[str], env: dict[str, str], timeout: float) -> tuple[int, str]:
    """One container start: `rtj-trainer launch` to its exit (124 past the timeout)."""
    try:
        launch = subprocess.run([*entry, "launch"], env=env, capture_output=True, text=True, timeout=timeout)
        return launch.returncode, launch.stdout + launch.stderr
    except subprocess.TimeoutExpired as exc:
        # Always bytes here, whatever text= says.
        return 124, b"".join(x or b"" for x in (exc.stdout, exc.stderr)).decode(errors="replace")


#: NVRx's Wrapper's line when a rank's soft timeout aborted it: its local time.
SOFT_TIMEOUT_ABORT = re.compile(
    r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+)\] rank=\d+ term_ex: "
    r"RankShouldRestart\('Interruption\.SOFT_TIMEOUT"
)


#: The rank's line when its learned hang budget aborted it (rtj_trainer.inprocess).
HANG_BUDGET = re.compile(r"no progress in its step for its hang budget of ([0-9.]+) s")


def hang_figures(
    faults: list[dict[str, Any]],
    cfg: dict[str, Any],
    hang_step: int,
    victim: list[dict[str, Any]],
    launch_log: str,
    kind: str,
) -> dict[str, Any] | None:
    """The stall's recovery (the one after step `hang_step - 1`, the last the stalled rank completed):
    seconds from that step to the first step after it (the learned budget's detection, the abort,
    re-entry and the step), the steps lost, and whether it came in-process before the soft timeout
    (which alone would have taken at least that long). `seconds_past_budget`: when NVRx aborted the
    stalled rank (its log line), less the stall's start and the hang budget the rank says it had."""
    stall = next((f for f in faults if f["fault_after_step"] == hang_step - 1), None)
    if stall is None:
        return None
    soft = cfg["inProcess"]["softTimeoutSeconds"]
    stalled = next((x for x in victim if x.get("event") == "fault" and x.get("kind") == kind), None)
    budgets = [float(b) for b in HANG_BUDGET.findall(launch_log)]
    aborts = [
        datetime.strptime(m, "%Y-%m-%d %H:%M:%S.%f").timestamp()
        for m in SOFT_TIMEOUT_ABORT.findall(launch_log)
    ]
    budget = budgets[0] if budgets else None
    after = [t for t in aborts if stalled is not None and t >= stalled["t"]]
    past = None
    if stalled is not None and budget is not None and after:
        past = round(after[0] - stalled["t"] - budget, 3)
    return {
        "recovery": stall["kind"],
        "seconds_detect_and_recover": stall["seconds_fault_to_first_step"],
        "learned_budget_seconds": budget,
        "seconds_past_budget": past,
        "steps_lost": stall["steps_redone"],
        "soft_timeout_seconds": soft,
        "caught_before_soft_timeout": stall["kind"] == "in-process"
        and stall["seconds_fault_to_first_step"] < soft,
    }


def _version(dist: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu", action="store_true", help="gloo and a tiny model (a self-test without GPUs)")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--exception-step", type=int, default=50)
    p.add_argument("--sigkill-step", type=int, default=100)
    p.add_argument(
        "--hang-step",
        type=int,
        default=0,
        help="a rank stops making progress at this step, as --hang-kind says (0: none)",
    )
    p.add_argument(
        "--hang-kind",
        choices=("stall", "hang"),
        default="stall",
        help="what stops at --hang-step: `stall` (a Python loop) or `hang` (blocked in a system call)",
    )
    p.add_argument(
        "--in-place-step",
        type=int,
        default=0,
        help="a second SIGKILL at this step spends the in-job budget: an in-place restart (0: none)",
    )
    p.add_argument("--checkpoint-interval", type=int, default=40)
    p.add_argument("--memory-interval", type=int, default=10, help="memory snapshots every N steps (0: off)")
    p.add_argument(
        "--memory-dir",
        default=None,
        help="the memory tier's tmpfs (default: a new dir in /dev/shm if 48 GiB free, else <run dir>/shm)",
    )
    p.add_argument("--timeout", type=float, default=420)
    p.add_argument("--work-dir", default=None, help="parent of the run's directory (default: the temp dir)")
    p.add_argument("--out", default=None, help="also write the JSON here")
    args = p.parse_args()
    result = run(args)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if not result["passed"]:
        print(f"gpu-smoke FAILED; logs in {result['work_dir']}", file=sys.stderr)
        tail = (Path(result["work_dir"]) / "launch.log").read_text().splitlines()[-40:]
        print("\n".join(tail), file=sys.stderr)
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
