"""FSDP2 training of a small transformer on synthetic data, with every resilience piece switched on.

Run under the trainer runtime (`rtj-trainer launch`, i.e. ft_launcher) or any torchrun-style
launcher; one code path for CPU (gloo, fp32) and GPU (NCCL, bf16 compute, fp32 master weights):

    python -m rtj_trainer.examples.fsdp_train --steps 200 --dim 256 --layers 4 --log-dir /tmp/logs

Every resilience piece comes through the integration API any script can use
(`rtj_trainer.integrations.Resilience`: `attempt.resume`, `optimizer_step`, `save`, `step_done`).

- `torch.distributed.fsdp.fully_shard` per block and at the root; AdamW.
- Synthetic data: batch `s` of rank `r` is a pure function of (seed, s, r), a learnable sequence
  rule, so the loss falls and a resumed run sees exactly the batches it would have seen.
- In-process restart (`Resilience.run`, NVRx's inprocess.Wrapper): on re-entry the
  model is rebuilt on the new process group and takes the shards still in memory
  (`rtj_trainer.kept_state`): no step is lost. It loads a snapshot only when the kept state is
  bad on some rank (missing, non-finite, ranks at different steps).
- Memory snapshots (`--memory-snapshot-interval`, RankEnv's memory tier): every N steps the state
  is also committed in the pod's memory (/dev/shm); in-job restarts resume from the newest step
  every rank can load, in memory or persisted.
- A graceful stop (SIGTERM from ft_launcher): the ranks agree on a step, snapshot it into memory
  and persist it by the pod's deadline (`CheckpointManager.emergency_save`), and exit at once with
  ExitCode.TERMINATED (never 0: the launcher must not take it for the end of training); a resume
  from a tier that holds the step loses nothing.
- Step/checkpoint/fault reports and NVRx heartbeats (hang detection) through RankReporter,
  asynchronous checkpoints (`rtj_trainer.checkpoint`), resume from the last committed one.
- Fault injection for tests (rtj_trainer.examples.faults), `--fault-inject` or env
  `RTJ_FAULT_INJECT` (the syntax of tests/trainer/toy_train.py; `;`-separated; under the operator
  only the option: a job's spec may not set RTJ_* env), `<kind>:<rank>:<step>[:always][:delay=S]`:
      exception:1:20            raise before step 20 on rank 1 (in-process restart)
      sigkill:1:20              SIGKILL rank 1 (ft_launcher restarts the workers)
      exit:1:20                 os._exit(1)
      finish:1:20               os._exit(0): the rank's command returns early, the others train on
      hang:1:20                 block in a system call (learned hang budget: in-process, or the
                                NVRx heartbeat timeout / hard timeout)
      stall:1:20                stop making progress, interruptibly (learned hang budget: in-process)
      kill-during-save:0:20:delay=0.05   SIGKILL 0.05 s after the save of step 20 started
      corrupt:0:20              write NaN into a weight, then raise (the kept state is bad)
  A step "+N" counts from the step the run resumed at. Each fault fires once per job (a marker
  file `.fault-*` in the checkpoint directory) unless `:always` is given.
- One JSON line per step per rank in `<log-dir>/rank-<r>.jsonl` (or env RTJ_TRAIN_LOG_DIR; `{pod}` in
  it is the pod's name): step, loss, step seconds, save outcome, snapshot seconds, in-process
  iteration, in-job restart count; "resume" lines on start.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from rtj_trainer.examples.faults import ENV_FAULT_INJECT, FaultInjector, parse_faults
from rtj_trainer.integrations.session import Attempt, Resilience

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

__all__ = ["ENV_FAULT_INJECT", "ModelConfig", "build", "host_float", "main", "synthetic_batch"]


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
        for name, param in model.named_parameters():
            p = cast("DTensor", param)  # fully_shard made every parameter a DTensor
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


def _local_chunk(full: torch.Tensor, dtensor: DTensor) -> torch.Tensor:
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
    p.add_argument(
        "--fault-inject",
        default=os.environ.get(ENV_FAULT_INJECT),
        help=f"faults to inject (tests; the syntax above); default: env {ENV_FAULT_INJECT}",
    )
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


def main(argv: list[str] | None = None) -> None:
    t_main = time.time()  # the imports above are done
    t_proc = process_start_time()
    args = parse_args(argv)
    cfg = ModelConfig(vocab=args.vocab, dim=args.dim, layers=args.layers, heads=args.heads, seq=args.seq)
    res = Resilience(
        checkpoint=not args.no_checkpoint,
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_interval=args.checkpoint_interval,
        memory_interval=args.memory_snapshot_interval,
        memory_dir=args.memory_snapshot_dir,
        write_bytes_per_s=args.write_bytes_per_s,
        snapshot_write_threads=args.snapshot_write_threads,
        log_dir=args.log_dir or "",
    )

    def note_fault(**record: Any) -> None:
        # What this rank's memory tier held when the fault fired: what a resume may come from.
        if res.ckpt is not None:
            record["memory_snapshots"] = res.ckpt.local_snapshot_steps()
        res.log.write(**record)

    faults = FaultInjector(parse_faults(args.fault_inject), res.env.rank, res.checkpoint_dir, note_fault)
    extra = {"seed": args.seed}

    def train(attempt: Attempt) -> int:
        t_train = attempt.started  # the process group is up
        model, optim = build(
            cfg, attempt.device, lr=args.lr, seed=args.seed, bf16=res.use_cuda, init_weights=attempt.fresh
        )
        t_built = time.time()
        # Where a (re)start's seconds went: process start, imports done, the training function
        # entered (an in-process restart's own machinery ends here), process group up, the kept
        # step agreed, model built; the resume record's `t` is the state loaded.
        phases = {
            "proc": t_proc,
            "main": t_main,
            "entered": attempt.entered,
            "train": t_train,
            "agreed": attempt.agreed,
            "built": t_built,
        }
        start = attempt.resume(model, optim, phases=phases)
        faults.start_step = start
        for step in range(start, args.steps):
            t0 = time.perf_counter()
            faults.before_step(step + 1, model)
            inputs, targets = synthetic_batch(
                cfg, seed=args.seed, step=step, rank=attempt.rank, batch=args.batch, device=attempt.device
            )
            logits = model(inputs)
            loss = F.cross_entropy(logits.float().reshape(-1, cfg.vocab), targets.reshape(-1))
            loss.backward()
            attempt.optimizer_step(optim, step + 1)
            optim.zero_grad(set_to_none=True)
            # The save before the loss is read: its work on the CPU (agreeing on the step, the
            # state's tensors, claiming a slot: 0.04-0.06 s for the 1.14 B example) overlaps the
            # step's last kernels instead of leaving the GPU idle after the sync.
            saved = attempt.save(step + 1, model, optim, extra)
            loss_value = host_float(loss.detach())  # one host sync per step: the loss is logged
            if saved.outcome == "saved":
                faults.after_save(step + 1)
            if args.min_step_time:
                time.sleep(max(0.0, args.min_step_time - (time.perf_counter() - t0)))
            attempt.step_done(
                step + 1,
                model,
                optim,
                loss=loss_value,
                extra=extra,
                dt=round(time.perf_counter() - t0, 5),
                save=saved.outcome,
                snap=round(saved.seconds, 5),
                copy=saved.copy_seconds,
            )
        return args.steps

    res.run(train)


if __name__ == "__main__":
    main()
