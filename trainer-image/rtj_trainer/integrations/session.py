"""The integration API: a few lines around an existing training loop give it every ladder level.

    from rtj_trainer.integrations import Resilience

    res = Resilience()                           # settings from the pod (RankEnv); once per process

    def train(attempt):                          # called again after each in-process restart
        model, optim = build(init_weights=attempt.fresh)   # on attempt.device, process group up
        start = attempt.resume(model, optim)     # kept in memory, else newest snapshot/checkpoint
        for step in range(start, total):
            loss = model(batch(step)).loss
            loss.backward()
            attempt.optimizer_step(optim, step + 1)          # optim.step(), atomic for the wrapper
            optim.zero_grad()
            attempt.end_step(step + 1, model, optim, loss=loss)  # save, report, SIGTERM

    res.run(train)

or, with a build function and a step function, one call: `fit(build, step_fn, steps)`.

What it wires (each piece a module of the runtime): NVRx in-process restart (`inprocess`): an
exception on any rank re-enters `train` in the same processes; the model and optimizer shards are
kept in memory (`kept_state`), so `resume` adopts them and no step is lost; asynchronous
checkpoints and the node-local memory tier (`checkpoint.CheckpointManager`), which in-job restarts
resume from; step, checkpoint and fault reports plus NVRx's rank heartbeat (`report`); a graceful
stop on the pod's SIGTERM (`graceful`): the ranks agree on a step, `emergency_save` keeps it (in
memory first, then at the peer and on the volume, as far as the pod's deadline allows) and the rank
exits with ExitCode.TERMINATED. With `log_dir` (default env RTJ_TRAIN_LOG_DIR) each rank writes
the step log that the local tools read steps lost from (`rtj_local.train_log`).

Checkpoints are in our format (rtj_trainer.checkpoint_format); `dcp_export.export_dcp` writes one
as a torch.distributed.checkpoint checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

import torch
import torch.distributed as dist
from rtj.contract import ENV_POD_NAME

from rtj_trainer import inprocess
from rtj_trainer.checkpoint import DEFAULT_LOCAL_WRITE_THREADS, CheckpointEvent, CheckpointManager
from rtj_trainer.graceful import GracefulStop
from rtj_trainer.hang_timeouts import Section
from rtj_trainer.kept_state import KeptState, agreed_step
from rtj_trainer.report import RankReporter
from rtj_trainer.runtime_env import RankEnv

T = TypeVar("T")
ENV_TRAIN_LOG_DIR = "RTJ_TRAIN_LOG_DIR"
#: Where the memory tier lives when the pod gives no directory (the pod's memory volume).
DEFAULT_MEMORY_DIR = "/dev/shm/rtj-snapshots"


class StepLog:
    """`<log dir>/rank-<global rank>.jsonl`, one JSON object a line; a `{pod}` in the log dir is the
    pod's name (RTJ_POD_NAME), so that the pods of a job can keep their logs on one shared volume."""

    def __init__(self, log_dir: str | None, rank: int) -> None:
        self._f = None
        if log_dir:
            log_dir = log_dir.replace("{pod}", os.environ.get(ENV_POD_NAME, "pod"))
            os.makedirs(log_dir, exist_ok=True)
            self._f = open(os.path.join(log_dir, f"rank-{rank}.jsonl"), "a", buffering=1)  # noqa: SIM115

    def write(self, **rec: Any) -> None:
        if self._f is not None:
            self._f.write(json.dumps(rec, separators=(",", ":")) + "\n")


@dataclass(frozen=True)
class SaveOutcome:
    #: CheckpointManager.maybe_save's outcome: "" (not due), "saved", "skipped", ...
    outcome: str = ""
    #: Seconds the save stalled this step (the snapshot into host memory).
    seconds: float = 0.0
    #: The previous save's device-to-host copy, once known (GPU; None otherwise).
    copy_seconds: float | None = None


class Resilience:
    """One per rank process, created before the first `run`; settings default to the pod's.

    `checkpoint=False` trains without checkpoints (benchmarks). The other keyword arguments
    override RankEnv's: `checkpoint_dir`, `checkpoint_interval` (steps), `memory_interval` (steps;
    0 turns the memory tier off), `memory_dir`, and the writer's `write_bytes_per_s` throttle and
    `snapshot_write_threads`.
    """

    def __init__(
        self,
        *,
        env: RankEnv | None = None,
        reporter: RankReporter | None = None,
        checkpoint: bool = True,
        checkpoint_dir: str | None = None,
        checkpoint_interval: int | None = None,
        memory_interval: int | None = None,
        memory_dir: str | None = None,
        write_bytes_per_s: float | None = None,
        snapshot_write_threads: int | None = None,
        log_dir: str | None = None,
    ) -> None:
        self.env = env = env or RankEnv.from_env()
        self.reporter = reporter or RankReporter.from_env()
        self.checkpoint_dir = checkpoint_dir or env.checkpoint_dir
        mem_interval = env.memory_snapshot_interval_steps if memory_interval is None else memory_interval
        mem_dir = memory_dir or env.memory_snapshot_dir or DEFAULT_MEMORY_DIR
        local_root = env.memory_tier_root(mem_dir) if mem_interval > 0 else None
        replica = env.peer_replica() if local_root else None  # (this pod's replica server, the peer's)
        self.log = StepLog(log_dir if log_dir is not None else os.environ.get(ENV_TRAIN_LOG_DIR), env.rank)
        self.ckpt: CheckpointManager | None = (
            CheckpointManager(
                self.checkpoint_dir,
                rank=env.rank,
                world_size=env.world_size,
                interval_steps=checkpoint_interval or env.checkpoint_interval_steps,
                keep=env.checkpoints_to_keep,
                reporter=self.reporter,
                write_bytes_per_s=write_bytes_per_s,
                local_root=local_root,
                local_interval_steps=mem_interval or None,
                adapt_local_interval=True,  # a snapshot write longer than the interval widens it
                replica_endpoint=replica[0] if replica else None,
                peer_endpoint=replica[1] if replica else None,
                local_write_threads=snapshot_write_threads or DEFAULT_LOCAL_WRITE_THREADS,
                memory_snapshot_gpu_staging=env.memory_snapshot_gpu_staging,
                on_event=self._log_write,
            )
            if checkpoint
            else None
        )
        self.kept = KeptState()  # survives in-process restarts (this process), never in-job restarts
        self.stop = GracefulStop.install(status_dir=env.status_dir)
        self.use_cuda = env.dist_backend == "nccl"
        if self.use_cuda and self.ckpt is not None:
            # An in-job restart's state crosses to the GPU while the process group comes up.
            self.ckpt.prefetch_memory_snapshot(env.local_rank)

    def _log_write(self, ev: CheckpointEvent) -> None:
        """A memory snapshot's write into the tier or a persist, in the step log with its seconds
        (and whether the snapshot was staged on the GPU, then the drain's seconds waiting for the GPU
        and copying into the tier and whether the pod's slot copier did that copy, and whether a
        persist was in flight when its record was logged):
        what the adaptive interval is made of."""
        if ev.kind not in ("snapshot", "persisted") or ev.seconds is None:
            return
        rec: dict[str, Any] = {"event": ev.kind, "step": ev.step, "seconds": round(ev.seconds, 4)}
        if ev.kind == "snapshot" and self.ckpt is not None:
            rec["staged"] = self.ckpt.staged_on_device
            rec["persisting"] = self.ckpt.persisting
            if rec["staged"] and (drain := self.ckpt.last_drain) is not None:
                rec["drain_gpu_wait"], rec["drain_host_copy"] = round(drain[0], 4), round(drain[1], 4)
                rec["by_copier"] = self.ckpt.drained_by_copier
        self.log.write(**rec, t=time.time())

    def run(self, train: Callable[[Attempt], T]) -> T:
        """`train(attempt)` under NVRx in-process restart; the rank reports Finished when it returns."""

        def once(*, call_wrapper: Any, restart_count: int) -> T:
            attempt = Attempt(self, call_wrapper, restart_count)
            try:
                result = train(attempt)
                attempt.finish()
                return result
            except torch.OutOfMemoryError:
                # The memory tier's GPU staging buffer is memory training needs: given back before
                # the in-process restart (snapshots take the pinned path from then on).
                if self.ckpt is not None:
                    self.ckpt.stop_gpu_staging()
                self.stop.died_with_peer()
                raise
            except BaseException:
                self.stop.died_with_peer()  # after SIGTERM: the launcher is restarting the workers, go now
                raise

        result = inprocess.run_with_inprocess_restart(once, env=self.env, reporter=self.reporter)
        self.reporter.finished()
        return result


@dataclass
class Attempt:
    """One entry into the training function: the process group is up (a new one after an
    in-process restart); build the model and optimizer on it, then `resume`."""

    res: Resilience
    call_wrapper: Any
    #: 0 on the first call, n on the n-th in-process restart in this process.
    iteration: int
    device: torch.device = field(init=False)
    #: A CPU (gloo) group for the runtime's tiny agreements (None: the default group is one).
    group: Any = field(init=False)
    #: The step of the state kept in memory that every rank can adopt; None: build fresh weights.
    kept_step: int | None = field(init=False)
    #: Wall times: the wrapper entered the training function (before its process group), the
    #: process group was up, and the ranks agreed on the kept step (the runtime's gloo group made).
    entered: float = field(init=False)
    started: float = field(init=False)
    agreed: float = field(init=False)
    _copy_pending: bool = field(default=False, init=False)
    _prepared: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.entered = inprocess.entered_at
        self.started = time.time()
        env = self.res.env
        self.device = torch.device("cuda", env.local_rank) if self.res.use_cuda else torch.device("cpu")
        # Saves are agreed on with one tiny CPU all-reduce; NCCL cannot reduce a CPU tensor.
        self.group = dist.new_group(backend="gloo") if self.res.use_cuda else None
        if self.res.ckpt is not None:
            self.res.ckpt.set_group(self.group)
        self.kept_step = agreed_step(self.res.kept, self.group)
        self.agreed = time.time()

    @property
    def fresh(self) -> bool:
        """Nothing kept in memory: initialise the weights (a checkpoint, if any, overwrites them)."""
        return self.kept_step is None

    @property
    def rank(self) -> int:
        return dist.get_rank()

    @property
    def in_job_restarts(self) -> int:
        return self.res.env.restart_count

    def resume(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, **log: Any) -> int:
        """Load the state to train on into `model`/`optimizer`; returns the step to start from.
        The kept state (no step lost), else the newest step every rank can load (memory tier or
        persisted), else 0. `log`: more fields for the step log's resume record."""
        res = self.res
        source = "memory"
        if self.kept_step is not None:
            try:
                res.kept.adopt(model, optimizer)  # needs room for a second copy of the shards, briefly
            except torch.OutOfMemoryError:
                res.kept.drop()  # the next iteration reloads from a snapshot on every rank
                raise
            start = self.kept_step
        elif res.ckpt is not None and (resumed := res.ckpt.load_latest(model, optimizer)) is not None:
            start, source = resumed.step, resumed.source
            log = {"load": resumed.seconds, **log}
        else:
            start, source = 0, "init"
        res.kept.hold(model, optimizer, start)
        if res.ckpt is not None and (prefetch := res.ckpt.prefetch_report()) is not None:
            log = {"prefetch": prefetch, **log}
        self.log(
            event="resume",
            step=start,
            source=source,
            iteration=self.iteration,
            restart=self.in_job_restarts,
            torch_threads=torch.get_num_threads(),
            t=time.time(),
            **log,
        )
        return start

    def optimizer_step(self, optimizer: torch.optim.Optimizer, step: int) -> None:
        """`optimizer.step()` and the kept step `step` together (the in-process abort waits for it)."""
        self.res.kept.advance(optimizer, step, self.call_wrapper)

    def save(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        extra: dict[str, Any] | None = None,
    ) -> SaveOutcome:
        """A checkpoint and/or memory snapshot of `step` when one is due (never waits on storage)."""
        ckpt = self.res.ckpt
        if ckpt is None:
            return SaveOutcome()
        copy_s = None
        if self._copy_pending:
            copy_s = ckpt.copy_seconds()  # the last snapshot's GPU copy (done: a step synced since)
            self._copy_pending = False
        if not self._prepared:
            ckpt.prepare(model, optimizer)  # pinned buffers now, not inside the first save
            self.res.reporter.ceiling_while(lambda: ckpt.preparing)
            self._prepared = True
        t0 = time.perf_counter()
        with self.res.reporter.section(Section.CHECKPOINT) as section:  # the saves' hang budget
            outcome = ckpt.maybe_save(step, model, optimizer, extra=extra or {})
            if outcome not in ("saved", "snapshot"):
                section.discard()  # nothing due, or skipped (busy): no sample of a save's duration
        seconds = time.perf_counter() - t0 if outcome else 0.0
        self._copy_pending = outcome == "saved" and self.res.use_cuda
        return SaveOutcome(outcome, seconds, copy_s)

    def step_done(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        loss: float | torch.Tensor | None = None,
        extra: dict[str, Any] | None = None,
        **log: Any,
    ) -> None:
        """Report `step` (also NVRx's rank heartbeat), log it, and stop gracefully if the pod was
        asked to (every rank calls this at every step: the stop is agreed on collectively)."""
        res = self.res
        res.reporter.step(step)
        if res.log._f is not None:
            rec: dict[str, Any] = {"step": step}
            if loss is not None:
                rec["loss"] = round(float(loss), 5)
            res.log.write(
                **rec,
                **log,
                committed=res.ckpt.last_committed if res.ckpt else None,
                iteration=self.iteration,
                restart=self.in_job_restarts,
                t=time.time(),
            )
        if res.stop.agreed(self.group):
            self._stop_gracefully(step, model, optimizer, extra)

    def end_step(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        loss: float | torch.Tensor | None = None,
        extra: dict[str, Any] | None = None,
    ) -> SaveOutcome:
        """`save` then `step_done`: everything after the optimizer step of `step`, in one call."""
        saved = self.save(step, model, optimizer, extra)
        self.step_done(
            step,
            model,
            optimizer,
            loss=loss,
            extra=extra,
            save=saved.outcome,
            snap=round(saved.seconds, 5),
            copy=saved.copy_seconds,
        )
        return saved

    def log(self, **rec: Any) -> None:
        """A record in this rank's step log (no-op without a log dir)."""
        self.res.log.write(**rec)

    def finish(self) -> None:
        """Training returned: the last save drains, then every rank meets (called by `run`)."""
        ckpt = self.res.ckpt
        if ckpt is not None:
            with self.res.reporter.section(Section.OTHER):  # draining the last save: the ceiling
                ckpt.close(timeout=ckpt.commit_timeout_s)
        if self.res.use_cuda:
            torch.cuda.synchronize()
        with contextlib.suppress(Exception):
            dist.barrier(group=self.group)

    def _stop_gracefully(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        extra: dict[str, Any] | None,
    ) -> NoReturn:
        res = self.res
        res.stop.save_and_exit(
            res.ckpt, step, model, optimizer, extra=extra, group=self.group, reporter=res.reporter,
            log=self.log,
        )  # fmt: skip


Build = Callable[[Attempt], tuple[torch.nn.Module, torch.optim.Optimizer]]
StepFn = Callable[[torch.nn.Module, torch.optim.Optimizer, int, Attempt], torch.Tensor]


def fit(build: Build, step_fn: StepFn, steps: int, **settings: Any) -> int:
    """The whole integration in one call: `build(attempt)` returns the model and optimizer (fresh
    weights when `attempt.fresh`), `step_fn(model, optimizer, step, attempt)` runs forward and
    backward of step `step` (0-based) and returns the loss; `fit` steps the optimizer, zeroes the
    gradients, saves, reports and handles restarts and SIGTERM. `settings`: Resilience's."""
    res = Resilience(**settings)

    def train(attempt: Attempt) -> int:
        model, optim = build(attempt)
        for step in range(attempt.resume(model, optim), steps):
            loss = step_fn(model, optim, step, attempt)
            attempt.optimizer_step(optim, step + 1)
            optim.zero_grad(set_to_none=True)
            attempt.end_step(step + 1, model, optim, loss=loss.detach())
        return steps

    return res.run(train)
