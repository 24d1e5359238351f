"""FSDP2 training of a small transformer on synthetic data, with every resilience piece switched on.

Run under the trainer runtime (`rtj-trainer launch`, i.e. ft_launcher) or any torchrun-style
launcher; one code path for CPU (gloo, fp32) and GPU (NCCL, bf16 compute, fp32 master weights):

    python -m rtj_trainer.examples.fsdp_train --steps 200 --dim 256 --layers 4 --log-dir /tmp/logs

- `torch.distributed.fsdp.fully_shard` per block and at the root; AdamW.
- Synthetic data: batch `s` of rank `r` is a pure function of (seed, s, r), a learnable sequence
  rule, so the loss falls and a resumed run sees exactly the batches it would have seen.
- In-process restart via `rtj_trainer.inprocess.run_with_inprocess_restart`: on re-entry the
  model is rebuilt on the new process group and takes the shards still in memory
  (`rtj_trainer.kept_state`): no step is lost. It loads a snapshot only when the kept state is
  bad on some rank (missing, non-finite, ranks at different steps).
- Memory snapshots (`--memory-snapshot-interval`, RankEnv's memory tier): every N steps the state
  is also committed in the pod's memory (/dev/shm); in-job restarts resume from the newest step
  every rank can load, in memory or persisted.
- A graceful stop (SIGTERM from ft_launcher): the ranks agree on a step, save and persist it
  (`CheckpointManager.emergency_save`) and exit at once with ExitCode.TERMINATED (never 0: the
  launcher must not take it for the end of training); the resume loses nothing.
- Step/checkpoint/fault reports and NVRx heartbeats (hang detection) through RankReporter,
  asynchronous checkpoints (`rtj_trainer.checkpoint`), resume from the last committed one.
- Fault injection for tests, env `RTJ_FAULT_INJECT` (the syntax of tests/trainer/toy_train.py;
  `;`-separated), `<kind>:<rank>:<step>[:always][:delay=S]`:
      exception:1:20            raise before step 20 on rank 1 (in-process restart)
      sigkill:1:20              SIGKILL rank 1 (ft_launcher restarts the workers)
      exit:1:20                 os._exit(1)
      finish:1:20               os._exit(0): the rank's command returns early, the others train on
      hang:1:20                 block in a C call (NVRx heartbeat timeout / hard timeout)
      kill-during-save:0:20:delay=0.05   SIGKILL 0.05 s after the save of step 20 started
      corrupt:0:20              write NaN into a weight, then raise (the kept state is bad)
  A step "+N" counts from the step the run resumed at. Each fault fires once per job (a marker
  file `.fault-*` in the checkpoint directory) unless `:always` is given.
- One JSON line per step per rank in `<log-dir>/rank-<r>.jsonl` (env RTJ_TRAIN_LOG_DIR; `{pod}` in
  it is the pod's name): step, loss, step seconds, save outcome, snapshot seconds, in-process
  iteration, in-job restart count; "resume" lines on start.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import torch
import torch.distributed as dist
import torch.nn.functional as F
from rtj.contract import ENV_POD_NAME, ExitCode, PodState
from torch import nn

from rtj_trainer.checkpoint import CheckpointManager
from rtj_trainer.graceful import GracefulStop
from rtj_trainer.inprocess import run_with_inprocess_restart
from rtj_trainer.kept_state import KeptState, agreed_step
from rtj_trainer.report import RankReporter
from rtj_trainer.runtime_env import RankEnv

ENV_FAULT_INJECT = "RTJ_FAULT_INJECT"
FAULT_KINDS = ("exception", "sigkill", "hang", "exit", "finish", "kill-during-save", "corrupt")


# --- model ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelConfig:
    vocab: int = 256
    dim: int = 128
    layers: int = 2
    heads: int = 4
    seq: int = 64

    def params(self) -> int:
        return self.vocab * self.dim * 2 + self.layers * (12 * self.dim * self.dim + 4 * self.dim)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.ln1 = nn.LayerNorm(cfg.dim)
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim, bias=False)
        self.proj = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.ln2 = nn.LayerNorm(cfg.dim)
        self.fc1 = nn.Linear(cfg.dim, 4 * cfg.dim, bias=False)
        self.fc2 = nn.Linear(4 * cfg.dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyTransformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.emb = nn.Embedding(cfg.vocab, cfg.dim)
        self.pos = nn.Parameter(torch.zeros(cfg.seq, cfg.dim))
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens) + self.pos[: tokens.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def synthetic_batch(
    cfg: ModelConfig, *, seed: int, step: int, rank: int, batch: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences x[t+1] = (5*x[t] + 1) mod vocab from random starts, with 10% of tokens replaced by
    noise: a pure function of (seed, step, rank), learnable, so the loss falls (towards the noise
    floor) and a resumed run replays exactly the same data."""
    g = torch.Generator().manual_seed((seed * 1_000_003 + step) * 4099 + rank)
    x = torch.empty(batch, cfg.seq + 1, dtype=torch.int64)
    x[:, 0] = torch.randint(0, cfg.vocab, (batch,), generator=g)
    for t in range(1, cfg.seq + 1):
        x[:, t] = (5 * x[:, t - 1] + 1) % cfg.vocab
    noise = torch.rand(x.shape, generator=g) < 0.1
    x = torch.where(noise, torch.randint(0, cfg.vocab, x.shape, generator=g), x)
    x = x.to(device, non_blocking=True)
    return x[:, :-1], x[:, 1:]


def build(
    cfg: ModelConfig, device: torch.device, *, lr: float, seed: int, bf16: bool, init_weights: bool = True
) -> tuple[nn.Module, Any]:
    """The FSDP2-sharded model (fp32 master weights; bf16 compute when asked) and its AdamW.

    `init_weights=False` leaves the weights uninitialised (the caller loads or copies them).
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(seed)  # same initial weights on every rank, before sharding
    with torch.device("meta"):
        model = TinyTransformer(cfg)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else None
    kw: dict[str, Any] = {"mp_policy": mp} if mp else {}
    for blk in model.blocks:
        fully_shard(blk, **kw)
    fully_shard(model, **kw)
    model.to_empty(device=device)
    optim = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    if not init_weights:
        return model, optim
    with torch.no_grad():
        # Each local shard is cut from a full tensor generated identically on every rank.
        for name, p in model.named_parameters():
            g = torch.Generator(device=device).manual_seed(seed + sum(map(ord, name)))
            if p.dim() > 1:
                w = torch.randn(p.shape, generator=g, device=device) * 0.02
                if "fc2" in name or "proj" in name:
                    w /= math.sqrt(2 * cfg.layers)
            elif name.endswith("weight"):
                w = torch.ones(p.shape, device=device)
            else:
                w = torch.zeros(p.shape, device=device)
            p.to_local().copy_(_local_chunk(w, p))
    return model, optim


def _local_chunk(full: torch.Tensor, dtensor: Any) -> torch.Tensor:
    """The part of `full` this rank holds under the DTensor's Shard(0) placement."""
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(full, dtensor.device_mesh, dtensor.placements, src_data_rank=None).to_local()


def host_float(t: torch.Tensor) -> float:
    """`float(t)` without blocking inside CUDA: poll an event so the thread returns to Python often.

    NVRx's in-process restart aborts NCCL and raises into the training thread asynchronously; a
    thread blocked in a CUDA synchronize behind a collective that waits for a failed peer never
    sees it (measured on 2xH200: the rank hung until the NCCL watchdog killed it).
    """
    if t.is_cuda:
        done = torch.cuda.Event()
        done.record()
        while not done.query():
            time.sleep(0.0002)
    return float(t)


# --- fault injection ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int
    step: int
    relative: bool = False
    always: bool = False
    delay: float = 0.05

    @property
    def key(self) -> str:
        return f".fault-{self.kind}-{self.rank}-{'+' if self.relative else ''}{self.step}"


def parse_faults(spec: str | None) -> list[Fault]:
    """`<kind>:<rank>:<step>[:always][:delay=S]` items separated by `;` (module docstring)."""
    faults: list[Fault] = []
    for item in (spec or "").split(";"):
        parts = [p.strip() for p in item.strip().split(":")] if item.strip() else []
        if not parts:
            continue
        if len(parts) < 3 or parts[0] not in FAULT_KINDS:
            raise ValueError(
                f"{ENV_FAULT_INJECT}: {item!r} is not <kind>:<rank>:<step>[:always][:delay=S] "
                f"with kind one of {', '.join(FAULT_KINDS)}"
            )
        opts = parts[3:]
        delay = next((float(o.split("=", 1)[1]) for o in opts if o.startswith("delay=")), 0.05)
        faults.append(
            Fault(
                parts[0],
                int(parts[1]),
                int(parts[2].lstrip("+")),
                parts[2].startswith("+"),
                "always" in opts,
                delay,
            )
        )
    return faults


class FaultInjector:
    """Fires the faults meant for this rank; each once per job unless `always` (marker files)."""

    def __init__(
        self, faults: list[Fault], rank: int, state_dir: str, note: Callable[..., None] | None = None
    ) -> None:
        self.faults = [f for f in faults if f.rank == rank]
        self.state_dir = state_dir
        self.start_step = 0
        #: Records each fault (kind, step, wall time) before it fires: benchmarks time from it.
        self.note = note or (lambda **_: None)

    def _due(self, fault: Fault, step: int) -> bool:
        if step != (self.start_step + fault.step if fault.relative else fault.step):
            return False
        if fault.always:
            return True
        os.makedirs(self.state_dir, exist_ok=True)
        try:
            os.close(os.open(os.path.join(self.state_dir, fault.key), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True

    def before_step(self, step: int, model: nn.Module | None = None) -> None:
        for f in self.faults:
            if f.kind == "kill-during-save" or not self._due(f, step):
                continue
            print(f"[fsdp_train] injecting {f.kind} before step {step} (pid {os.getpid()})", flush=True)
            self.note(event="fault", kind=f.kind, step=step, t=time.time())
            if f.kind == "corrupt" and model is not None:
                with torch.no_grad():
                    next(model.parameters()).to_local().fill_(float("nan"))
                raise RuntimeError(f"injected corruption at step {step}")
            if f.kind == "exception":
                raise RuntimeError(f"injected exception at step {step}")
            if f.kind == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            if f.kind == "exit":
                os._exit(1)
            if f.kind == "finish":
                os._exit(0)
            if f.kind == "hang":
                # Block inside a C call (like a stuck collective): only NVRx's heartbeat timeout
                # or the in-process hard timeout gets the job out of it.
                r, _w = os.pipe()
                os.read(r, 1)

    def after_save(self, step: int) -> None:
        for f in self.faults:
            if f.kind == "kill-during-save" and self._due(f, step):
                print(f"[fsdp_train] SIGKILL {f.delay} s into the save of step {step}", flush=True)
                self.note(event="fault", kind=f.kind, step=step, t=time.time())
                time.sleep(f.delay)
                os.kill(os.getpid(), signal.SIGKILL)


# --- training -------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--min-step-time", type=float, default=0.0, help="pad each step to this many seconds")
    p.add_argument("--log-dir", default=os.environ.get("RTJ_TRAIN_LOG_DIR"))
    p.add_argument("--checkpoint-dir", default=None, help="default: RankEnv (RTJ_CHECKPOINT_DIR)")
    p.add_argument("--checkpoint-interval", type=int, default=None, help="steps; default: RankEnv")
    p.add_argument("--no-checkpoint", action="store_true", help="benchmarks: train without checkpoints")
    p.add_argument(
        "--memory-snapshot-interval", type=int, default=None, help="steps; 0 = off; default: RankEnv"
    )
    p.add_argument("--memory-snapshot-dir", default=None, help="default: RankEnv (RTJ_MEMORY_SNAPSHOT_DIR)")
    p.add_argument(
        "--snapshot-write-threads", type=int, default=None, help="threads writing a memory snapshot"
    )
    p.add_argument("--write-bytes-per-s", type=float, default=None, help="throttle the writer (slow storage)")
    return p.parse_args(argv)


def process_start_time() -> float | None:
    """This process's start as a wall-clock time (Linux /proc, 10 ms resolution; None elsewhere):
    the resume record carries it, so that a benchmark can split an in-job restart into start,
    imports and loading. (Both /proc clocks count from boot; /proc/stat's btime is whole seconds.)"""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


class StepLog:
    """`<log dir>/rank-<global rank>.jsonl`; a `{pod}` in the log dir is the pod's name
    (RTJ_POD_NAME), so that the pods of a job can keep their logs on one shared volume."""

    def __init__(self, log_dir: str | None, rank: int) -> None:
        self._f = None
        if log_dir:
            log_dir = log_dir.replace("{pod}", os.environ.get(ENV_POD_NAME, "pod"))
            os.makedirs(log_dir, exist_ok=True)
            self._f = open(os.path.join(log_dir, f"rank-{rank}.jsonl"), "a", buffering=1)  # noqa: SIM115

    def write(self, **rec: Any) -> None:
        if self._f is not None:
            self._f.write(json.dumps(rec, separators=(",", ":")) + "\n")


def main(argv: list[str] | None = None) -> None:
    t_main = time.time()  # the imports above are done
    t_proc = process_start_time()
    args = parse_args(argv)
    env = RankEnv.from_env()
    reporter = RankReporter.from_env()
    cfg = ModelConfig(vocab=args.vocab, dim=args.dim, layers=args.layers, heads=args.heads, seq=args.seq)
    ckpt_dir = args.checkpoint_dir or env.checkpoint_dir
    interval = args.checkpoint_interval or env.checkpoint_interval_steps
    mem_interval = (
        env.memory_snapshot_interval_steps
        if args.memory_snapshot_interval is None
        else args.memory_snapshot_interval
    )
    mem_dir = args.memory_snapshot_dir or env.memory_snapshot_dir or "/dev/shm/rtj-snapshots"
    local_root = env.memory_tier_root(mem_dir) if mem_interval > 0 else None
    replica = env.peer_replica() if local_root else None  # (this pod's replica server, the peer's)
    ckpt = (
        None
        if args.no_checkpoint
        else CheckpointManager(
            ckpt_dir,
            rank=env.rank,
            world_size=env.world_size,
            interval_steps=interval,
            keep=env.checkpoints_to_keep,
            reporter=reporter,
            write_bytes_per_s=args.write_bytes_per_s,
            local_root=local_root,
            local_interval_steps=mem_interval or None,
            adapt_local_interval=True,  # a snapshot write longer than the interval widens it
            replica_endpoint=replica[0] if replica else None,
            peer_endpoint=replica[1] if replica else None,
            **({"local_write_threads": args.snapshot_write_threads} if args.snapshot_write_threads else {}),
        )
    )
    log = StepLog(args.log_dir, env.rank)
    faults = FaultInjector(parse_faults(os.environ.get(ENV_FAULT_INJECT)), env.rank, ckpt_dir, log.write)
    use_cuda = env.dist_backend == "nccl"
    kept = KeptState()  # survives in-process restarts (this process), never in-job restarts
    stop = GracefulStop.install(status_dir=env.status_dir)

    def train(*, call_wrapper: Any, restart_count: int) -> int:
        t_train = time.time()  # the process group is up
        device = torch.device("cuda", env.local_rank) if use_cuda else torch.device("cpu")
        rank = dist.get_rank()
        # Saves are agreed on with one tiny CPU all-reduce; NCCL cannot reduce a CPU tensor.
        group = dist.new_group(backend="gloo") if use_cuda else None
        if ckpt is not None:
            ckpt.set_group(group)
        reuse = agreed_step(kept, group)
        # Fresh weights only when nothing is kept (a snapshot, if any, overwrites them).
        model, optim = build(
            cfg, device, lr=args.lr, seed=args.seed, bf16=use_cuda, init_weights=reuse is None
        )
        t_built = time.time()
        source = "memory"
        if reuse is not None:
            try:
                kept.adopt(model, optim)  # needs room for a second copy of the shards, briefly
            except torch.OutOfMemoryError:
                kept.drop()  # the next iteration reloads from a snapshot on every rank
                raise
            start = reuse
        elif ckpt is not None and (resumed := ckpt.load_latest(model, optim)) is not None:
            start, source = resumed.step, resumed.source
        else:
            start, source = 0, "init"
        kept.hold(model, optim, start)
        faults.start_step = start
        log.write(
            event="resume",
            step=start,
            source=source,
            iteration=restart_count,
            restart=env.restart_count,
            t=time.time(),
            # Where a (re)start's seconds went: process start, imports done, process group up,
            # model built; `t` is the state loaded.
            phases={"proc": t_proc, "main": t_main, "train": t_train, "built": t_built},
        )
        prepared, copy_pending = False, False
        for step in range(start, args.steps):
            t0 = time.perf_counter()
            faults.before_step(step + 1, model)
            inputs, targets = synthetic_batch(
                cfg, seed=args.seed, step=step, rank=rank, batch=args.batch, device=device
            )
            logits = model(inputs)
            loss = F.cross_entropy(logits.float().reshape(-1, cfg.vocab), targets.reshape(-1))
            loss.backward()
            kept.advance(optim, step + 1, call_wrapper)  # optim.step() and the kept step, atomically
            optim.zero_grad(set_to_none=True)
            loss_value = host_float(loss.detach())  # one host sync per step: the loss is logged
            outcome, snap, copy_s = "", 0.0, None
            if ckpt is not None and copy_pending:
                copy_s = ckpt.copy_seconds()  # the last snapshot's GPU copy (done: the step synced)
                copy_pending = False
            if ckpt is not None:
                if not prepared:
                    ckpt.prepare(model, optim)  # pinned buffers now, not inside the first save
                    prepared = True
                ts = time.perf_counter()
                outcome = ckpt.maybe_save(step + 1, model, optim, extra={"seed": args.seed})
                snap = time.perf_counter() - ts if outcome else 0.0
                if outcome == "saved":
                    copy_pending = use_cuda
                    faults.after_save(step + 1)
            reporter.step(step + 1)  # also the NVRx rank heartbeat under ft_launcher
            if args.min_step_time:
                time.sleep(max(0.0, args.min_step_time - (time.perf_counter() - t0)))
            log.write(
                step=step + 1,
                loss=round(loss_value, 5),
                dt=round(time.perf_counter() - t0, 5),
                save=outcome,
                snap=round(snap, 5),
                copy=copy_s,
                committed=ckpt.last_committed if ckpt else None,
                iteration=restart_count,
                restart=env.restart_count,
                t=time.time(),
            )
            if stop.agreed(group):
                _stop_gracefully(step + 1, model, optim, group)
        if ckpt is not None:
            ckpt.close(timeout=ckpt.commit_timeout_s)
        if use_cuda:
            torch.cuda.synchronize()
        with contextlib.suppress(Exception):
            dist.barrier(group=group)
        return args.steps

    def _stop_gracefully(step: int, model: nn.Module, optim: Any, group: Any) -> NoReturn:
        stop.saving()
        reporter.state(PodState.CHECKPOINTING)
        t0 = time.time()
        saved = ckpt.emergency_save(step, model, optim, extra={"seed": args.seed}) if ckpt else False
        with contextlib.suppress(Exception):
            dist.barrier(group=group)  # every rank's part is written (rank 0 returns once committed)
        seconds = round(time.time() - t0, 3)
        log.write(event="stopped", step=step, persisted=saved, seconds=seconds, t=time.time())
        print(f"[fsdp_train] graceful stop at step {step}: persisted={saved} in {seconds} s", flush=True)
        # Nothing is left to do, and the in-process wrapper's teardown plus the interpreter's took
        # 10 s of the grace period on CPU: leave at once (TERMINATED, never 0: not finished).
        os._exit(ExitCode.TERMINATED)

    def train_unless_stopped(**kw: Any) -> int:
        try:
            return train(**kw)
        except BaseException:
            stop.died_with_peer()  # after SIGTERM: the launcher is restarting the workers, go now
            raise

    run_with_inprocess_restart(train_unless_stopped, env=env, reporter=reporter)
    reporter.finished()


if __name__ == "__main__":
    main()
