"""torchtitan on the product path, with an exception and a SIGKILL in a rank: the GPU smoke's second
case (issue 27), next to bench/gpu_smoke.py's fsdp_train.

    source bench/gpu_env.sh && python bench/titan_smoke.py --out $OUT/titan.json   # 1 or more GPUs
    python bench/titan_smoke.py --cpu --out titan.json     # anywhere: CPU and gloo (a self-test)

`rtj-trainer rendezvous` and `rtj-trainer launch` (heartbeat agent -> ft_launcher -> ranks) run as
in a pod; each rank is bench/titan_rank.py: torchtitan 0.2.2's own Trainer with its Llama 3 debug
model (its JobConfig's defaults, flavor `debugmodel`: 6 layers, dim 256,
vocabulary 2048, SDPA, FSDP over the ranks, seq 2048 x batch 8) as rtj_trainer's RtjTrainer, whose
RtjCheckpointer takes the memory tier every `--memory-interval` steps and persisted checkpoints
every `--checkpoint-interval`. No weights and nothing downloaded: the debug model's assets
(torchtitan's repository has them in tests/assets, its wheel does not) are made here, in the run's
directory: a byte-level BPE tokenizer of 1024 tokens (the `tokenizers` package, trained on
generated text) and a `c4_test`-shaped JSON Lines dataset of that text.

Faults (RTJ_FAULT_INJECT, in rank 1, or rank 0 on one GPU): an exception before step
`--exception-step` and a SIGKILL before `--sigkill-step`; each restarts the workers in-job
(ft_launcher) and they resume from the memory tier. Prints one JSON document: seconds from the
launch to the first step, per fault the step it resumed from, where from, the steps lost and the
seconds from the fault to the first step after it, the median step time (steps with a memory
snapshot and without), and with `--baseline` the median step time of a fault-free run without the
memory tier. Exits non-zero unless the run reached the last step through both faults, each
resumed from the memory tier.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rtj_local.procs import free_port
from rtj_local.train_log import steps_lost

HERE = Path(__file__).resolve().parent
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
TOKENIZER_VOCAB = 1024  # below the debug model's 2048


# --- the debug model's assets, made here -----------------------------------------------------------------
def corpus(docs: int, seed: int = 0) -> list[str]:
    """Deterministic text of made-up words (Zipf-like frequencies), `docs` documents."""
    rng = random.Random(seed)
    consonants, vowels = "bcdfghklmnprstvz", "aeiou"
    words = sorted(
        {
            "".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(rng.randint(1, 3)))
            for _ in range(800)
        }
    )
    weights = [1.0 / (i + 1) for i in range(len(words))]
    out = []
    for _ in range(docs):
        sentences = []
        for _ in range(rng.randint(4, 12)):
            sentence = rng.choices(words, weights, k=rng.randint(6, 16))
            sentences.append(" ".join(sentence).capitalize() + ".")
        out.append(" ".join(sentences))
    return out


def make_assets(root: Path, docs: int = 2000) -> Path:
    """`root`/tokenizer (tokenizer.json, tokenizer_config.json) and `root`/c4_test (train.jsonl)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = corpus(docs)
    data = root / "c4_test"
    data.mkdir(parents=True, exist_ok=True)
    with open(data / "train.jsonl", "w") as f:
        for text in texts:
            f.write(json.dumps({"text": text}) + "\n")
    tok_dir = root / "tokenizer"
    tok_dir.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.save(str(tok_dir / "tokenizer.json"))
    (tok_dir / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": BOS, "eos_token": EOS, "add_bos_token": True, "add_eos_token": False})
    )
    return root


# --- the pod ---------------------------------------------------------------------------------------------
def memory_dir(work: Path) -> Path:
    """The pod's memory tier: in /dev/shm as in a pod, else in the run's directory."""
    shm = Path("/dev/shm")
    return shm / f"rtj-{work.name}" if shm.is_dir() else work / "shm"


def trainer_config(args: argparse.Namespace, work: Path, port: int, memory_interval: int) -> dict[str, Any]:
    rank_args = ["--assets", str(work / "assets"), "--steps", str(args.steps),
                 "--dump-folder", str(work / "outputs")]  # fmt: skip
    if args.cpu:
        rank_args += ["--cpu", "--seq-len", "256", "--local-batch-size", "2"]
    return {
        "jobName": "titan-smoke",
        "command": [sys.executable, str(HERE / "titan_rank.py")],
        "args": rank_args,
        "nnodes": 1,
        "nprocPerNode": args.nproc,
        "rdzvEndpoint": f"127.0.0.1:{port}",
        "rdzvId": "titan-smoke",
        "maxInJobRestarts": 3,
        "heartbeatIntervalSeconds": 1,
        "rankHangTimeoutSeconds": 120,
        # On CPU everything is slow, the first step most.
        "rankInitialTimeoutSeconds": 400,
        # No in-process restart: torchtitan's Trainer owns its process group (integrations.titan).
        "inProcess": {"enabled": False, "softTimeoutSeconds": 60, "hardTimeoutSeconds": 90, "maxRestarts": 0},
        "checkpointDir": str(work / "ckpt"),
        "checkpointIntervalSteps": args.checkpoint_interval,
        "checkpointsToKeep": 2,
        "memorySnapshotIntervalSteps": memory_interval,
        "maxNoProgressCycles": 3,
        "doNotRestartExitCodes": [93, 78],
        **({"memorySnapshotDir": str(memory_dir(work))} if memory_interval else {}),
    }


def pod_env(cfg: dict[str, Any], work: Path, args: argparse.Namespace, faults: str) -> dict[str, str]:
    env = {
        **os.environ,
        "RTJ_TRAINER_CONFIG": json.dumps(cfg),
        "RTJ_POD_NAME": "titan-smoke-n0-a0",
        "RTJ_NAMESPACE": "default",
        "RTJ_POD_IP": "127.0.0.1",
        # No RTJ_STATUS_DIR: the ranks' status files where a pod keeps them (rtj_trainer.entrypoint).
        "RTJ_TRAIN_LOG_DIR": str(work / "logs"),
        "RTJ_FAULT_INJECT": faults,
        "PYTHONUNBUFFERED": "1",
        # The debug model's dataset is a local directory: nothing may reach for a hub.
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(work / "hf"),
    }
    env.pop("KUBECONFIG", None)  # no Lease writes: the heartbeat is read from the log
    if args.cpu:
        env["RTJ_COLLECTIVE_TIMEOUT_SECONDS"] = "30"
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run_pod(
    args: argparse.Namespace, work: Path, memory_interval: int, faults: str
) -> tuple[int, float, str]:
    """(launch exit code, wall time of the launch, its output) of one pod's run in `work`."""
    port = free_port()
    env = pod_env(trainer_config(args, work, port, memory_interval), work, args, faults)
    entry = [sys.executable, "-m", "rtj_trainer.entrypoint"]
    rdzv_log = open(work / "rendezvous.log", "wb")  # noqa: SIM115
    rdzv = subprocess.Popen([*entry, "rendezvous"], env=env, stdout=subprocess.DEVNULL, stderr=rdzv_log)
    t0 = time.time()
    try:
        launch = subprocess.run(
            [*entry, "launch"], env=env, capture_output=True, text=True, timeout=args.timeout
        )
        rc, out = launch.returncode, launch.stdout + launch.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out = 124, b"".join(x or b"" for x in (exc.stdout, exc.stderr)).decode(errors="replace")  # type: ignore[misc]
    finally:
        rdzv.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            rdzv.wait(30)
        rdzv_log.close()
    (work / "launch.log").write_text(out)
    return rc, t0, out


# --- reading the ranks' step logs ------------------------------------------------------------------------
def read_log(path: Path) -> list[dict[str, Any]]:
    recs = []
    for line in path.read_text().splitlines() if path.exists() else []:
        with contextlib.suppress(ValueError):
            recs.append(json.loads(line))
    return recs


def step_times(recs: list[dict[str, Any]]) -> dict[str, float | None]:
    """Median seconds between consecutive steps of one process (a resume starts anew), split by
    whether the step's save took a memory snapshot or persisted ("snapshot"/"saved") or not."""
    plain, saving = [], []
    prev = None
    for rec in recs:
        if rec.get("event") == "resume":
            prev = None
            continue
        if "step" not in rec or "loss" not in rec:
            continue
        if prev is not None and rec["step"] == prev["step"] + 1:
            (saving if rec.get("save") in ("snapshot", "saved") else plain).append(rec["t"] - prev["t"])
        prev = rec
    every = plain + saving

    def median(xs: list[float]) -> float | None:
        return round(statistics.median(xs), 4) if xs else None

    return {"all": median(every), "without_save": median(plain), "with_save": median(saving)}


def faults_report(logs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    fired = sorted(
        (r for recs in logs.values() for r in recs if r.get("event") == "fault"), key=lambda r: r["t"]
    )
    out = []
    for fault in fired:
        cost = steps_lost(logs, fault["t"])
        after = [r for recs in logs.values() for r in recs if "loss" in r and r.get("t", 0) > fault["t"]]
        first = min((r["t"] for r in after), default=None)
        resumes = [
            r for recs in logs.values() for r in recs if r.get("event") == "resume" and r["t"] > fault["t"]
        ]
        out.append(
            {
                "kind": fault["kind"],
                "before_step": fault["step"],
                "resumed_from_step": cost.resumed_at if cost else None,
                "resumed_from": list(cost.sources) if cost else None,
                "steps_lost": cost.lost if cost else None,
                "seconds_fault_to_resume": round(min(r["t"] for r in resumes) - fault["t"], 2)
                if resumes
                else None,
                "seconds_fault_to_first_step": round(first - fault["t"], 2) if first is not None else None,
            }
        )
    return out


def rank_logs(work: Path) -> dict[str, list[dict[str, Any]]]:
    return {p.name: read_log(p) for p in sorted((work / "logs").glob("rank-*.jsonl"))}


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def device_name() -> str:
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    except Exception as exc:  # the report still says something
        return f"unknown ({exc!r})"


def summarize(args: argparse.Namespace, work: Path, rc: int, t0: float, out: str) -> dict[str, Any]:
    logs = rank_logs(work)
    rank0 = logs.get("rank-0.jsonl", [])
    steps = [r for r in rank0 if "loss" in r]
    faults = faults_report(logs)
    first = steps[0]["t"] if steps else None
    persisted = sorted({r["step"] for r in steps if r.get("save") == "saved"})
    return {
        "launch_exit_code": rc,
        "seconds_to_first_step": round(first - t0, 2) if first is not None else None,
        "faults": faults,
        "final_step": max((r["step"] for r in steps), default=None),
        "median_step_seconds": step_times(rank0),
        "checkpoints_persisting_from_steps": persisted,
        "last_heartbeat": next(
            (
                line.split("last heartbeat ", 1)[1]
                for line in reversed(out.splitlines())
                if "last heartbeat " in line
            ),
            None,
        ),
        "work_dir": str(work),
    }


def passed(result: dict[str, Any], args: argparse.Namespace) -> bool:
    faults = result["faults"]
    return bool(
        result["launch_exit_code"] == 0
        and result["final_step"] == args.steps
        and [f["kind"] for f in faults] == ["exception", "sigkill"]
        and all(f["resumed_from"] == ["local"] for f in faults)
        and all(f["steps_lost"] is not None and f["steps_lost"] < 2 * args.memory_interval for f in faults)
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--cpu", action="store_true", help="CPU and gloo, a small batch (a self-test without GPUs)"
    )
    p.add_argument("--nproc", type=int, default=None, help="ranks (default: the GPUs visible, 1 on --cpu)")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--exception-step", type=int, default=20)
    p.add_argument("--sigkill-step", type=int, default=40)
    p.add_argument("--memory-interval", type=int, default=5, help="memory snapshot every N steps")
    p.add_argument("--checkpoint-interval", type=int, default=20, help="persisted checkpoint every N steps")
    p.add_argument("--baseline", action="store_true", help="also a fault-free run without the memory tier")
    p.add_argument("--timeout", type=float, default=420, help="seconds for each run's launch")
    p.add_argument("--work-dir", default=None, help="parent of the run's directory (default: the temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the run's directory (kept anyway on failure)")
    p.add_argument("--out", default=None, help="also write the JSON here")
    p.add_argument(
        "--copy-logs",
        default=None,
        metavar="DIR",
        help="copy the launch log (its last 4 MB) and rank 0's step log here, as titan-*",
    )
    args = p.parse_args(argv)
    if args.nproc is None:
        args.nproc = 1 if args.cpu else max(1, _gpus())
    if not 0 < args.exception_step < args.sigkill_step < args.steps:
        p.error("need 0 < --exception-step < --sigkill-step < --steps")
    if args.memory_interval < 1:
        p.error("--memory-interval must be at least 1 (the faults resume from the memory tier)")
    return args


def _gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except ImportError:
        return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.work_dir:
        Path(args.work_dir).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="rtj-titan-", dir=args.work_dir))
    t_assets = time.monotonic()
    make_assets(work / "assets")
    assets_s = round(time.monotonic() - t_assets, 2)
    rank = min(1, args.nproc - 1)
    faults = f"exception:{rank}:{args.exception_step};sigkill:{rank}:{args.sigkill_step}"
    rc, t0, out = run_pod(args, work, args.memory_interval, faults)
    result: dict[str, Any] = {
        "case": "torchtitan Llama 3 debug model (JobConfig defaults) + RtjTrainer",
        "nproc": args.nproc,
        "device": device_name(),
        "steps": args.steps,
        "memory_interval": args.memory_interval,
        "checkpoint_interval": args.checkpoint_interval,
        "seconds_making_assets": assets_s,
        **summarize(args, work, rc, t0, out),
        "versions": {d: version(d) for d in ("torch", "torchtitan", "nvidia-resiliency-ext", "tokenizers")},
    }
    result["passed"] = passed(result, args)
    if args.baseline:
        base = work / "baseline"
        base.mkdir()
        shutil.copytree(work / "assets", base / "assets")
        b_rc, b_t0, b_out = run_pod(args, base, 0, "")
        b = summarize(args, base, b_rc, b_t0, b_out)
        result["baseline_without_memory_tier"] = {
            k: b[k]
            for k in ("launch_exit_code", "seconds_to_first_step", "final_step", "median_step_seconds")
        }
    if not result["passed"]:
        result["launch_log_tail"] = out.splitlines()[-80:]
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if args.copy_logs:
        copy_logs(work, Path(args.copy_logs))
    shutil.rmtree(memory_dir(work), ignore_errors=True)
    if not result["passed"]:
        print(f"titan-smoke FAILED; logs in {work}", file=sys.stderr)
    elif not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if result["passed"] else 1


def copy_logs(work: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    launch = work / "launch.log"
    if launch.exists():
        data = launch.read_bytes()
        (dest / "titan-launch.log").write_bytes(data[-4 * 2**20 :])
    rank0 = work / "logs" / "rank-0.jsonl"
    if rank0.exists():
        shutil.copy(rank0, dest / "titan-rank-0.jsonl")


if __name__ == "__main__":
    sys.exit(main())
