"""In-process restart for a training function (NVRx `inprocess.Wrapper`, through
`nvrx_patches.inprocess_wrapper`), configured from RankEnv.

API (for training scripts)::

    from rtj_trainer.inprocess import run_with_inprocess_restart

    def train(*, call_wrapper, restart_count: int) -> None:
        # torch.distributed is initialized here (backend and timeout from RankEnv); do not call
        # init_process_group / destroy_process_group yourself.
        # restart_count: 0 on the first call, n on the n-th in-process restart in this process.
        # Load the last committed checkpoint (or keep in-memory state) and train; raise on error.
        # call_wrapper: the NVRx CallWrapper (None when in-process restart is disabled); use
        # `with call_wrapper.atomic(): ...` around a section that must not be interrupted.
        ...

    run_with_inprocess_restart(train)  # env=RankEnv.from_env(), reporter=RankReporter.from_env()

On an exception in any rank, every rank's `train` returns through an abort (the process group is
torn down), and all ranks call `train` again with `restart_count + 1`, in the same processes.
A rank stuck longer than its hang budget (learned from its own step, checkpoint and start-up times
by RankReporter, at most the soft timeout: rtj_trainer.hang_timeouts) is aborted the same way; still
stuck `hard - soft` seconds later it is killed and ft_launcher restarts the workers (in-job restart).
After `maxRestarts` in-process restarts the wrapper gives up, the rank exits non-zero, and
ft_launcher takes over too.

With in-process restart disabled (RankEnv.in_process.enabled false) `train` is called once, with
`call_wrapper=None`, around the same process-group setup.
"""

import datetime
import gc
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from rtj.contract import FaultReason, FaultSeverity, PodState

from . import nvrx_patches
from .hang_timeouts import HangBudgets
from .permanent import permanent_cause, report_permanent
from .report import RankReporter
from .runtime_env import RankEnv

log = logging.getLogger(__name__)

TrainFn = Callable[..., Any]

#: Port offsets from MASTER_PORT (the port torch elastic gives rank 0 for the job's store).
_WRAPPER_STORE_PORT_OFFSET = 2


#: How long rank 0 waits at the end for every rank to be done with the store it hosts.
FINISH_WAIT_SECONDS = 30.0
FINISHED_KEY = "rtj/finished"


#: Poll interval of the wrapper's monitors, heartbeats and last-call wait.
_POLL_SECONDS = 0.05
#: The progress watchdog sends its timestamp every this many polls (see `_wrapper_timing`).
WATCHDOG_INTERVAL_MULTIPLE = 2


def classify_exception(exc: BaseException) -> FaultReason:
    """`PeerFailure` for a collective that failed because of another rank, else `RankException`.

    On an in-process restart every rank reports why it stopped; only the rank where the fault began
    has a `RankException`, the others see their collectives break.
    """
    if isinstance(exc, dist.DistError) or any(m in str(exc) for m in nvrx_patches.PEER_FAILURE_MARKERS):
        return FaultReason.PEER_FAILURE
    return FaultReason.RANK_EXCEPTION


def _agent_hosts_store() -> bool:
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "False").lower() == "true"


def _base_store(env: RankEnv, agent_hosts: bool) -> dist.TCPStore:
    """The store each restart iteration's process group is built on (prefixed per iteration).

    When the launcher's agent hosts it (TORCHELASTIC_USE_AGENT_STORE), every rank is a client;
    otherwise (ft_launcher's barrier rendezvous, a plain launch) rank 0 hosts it on MASTER_PORT.
    """
    return dist.TCPStore(
        host_name=env.master_addr,
        port=env.master_port,
        world_size=env.world_size,
        is_master=(env.rank == 0 and not agent_hosts),
        multi_tenant=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=max(60.0, env.in_process.hard_timeout_seconds * 2)),
        use_libuv=True,
    )


#: Wall time the training function was last entered, before its process group came up: where an
#: in-process restart's own machinery (abort, health check, barriers) ends. Read by the step log's
#: restart phases (`Attempt.entered`).
entered_at: float = 0.0


def _init_process_group(env: RankEnv, store: dist.Store, prefix: str) -> None:
    global entered_at
    entered_at = time.time()
    if env.dist_backend == "nccl":
        torch.cuda.set_device(env.local_rank)
    dist.init_process_group(
        backend=env.dist_backend,
        store=dist.PrefixStore(prefix, store),
        rank=int(os.environ.get("RANK", env.rank)),  # the wrapper may reassign ranks
        world_size=int(os.environ.get("WORLD_SIZE", env.world_size)),
        timeout=datetime.timedelta(seconds=env.collective_timeout_seconds),
    )


def _destroy_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def finish_together(
    env: RankEnv, store: dist.Store, reporter: RankReporter, wait_seconds: float = FINISH_WAIT_SECONDS
) -> bool:
    """Call on every rank once training returned; True when every rank had finished.

    Rank 0 hosts `store` (the process groups' store: NVRx's barrier rendezvous gives the ranks no
    agent store), and the other ranks use it until they return. A rank 0 that returned first took
    the store with it: a rank still in its last round trips got "Failed to recv", went silent until
    ft_launcher's rank monitor killed it, and its launcher restarted into a round nobody joined, so a
    finished job failed (kubelet nodes, 2026-12-02). So every rank counts itself finished there, and
    rank 0 returns once all have, or after `wait_seconds` (a rank that died meanwhile is its
    launcher's). The store is new with every rank 0 process, so a count never carries over.
    """
    try:
        finished = store.add(FINISHED_KEY, 1)
        if env.rank != 0:
            return True
        deadline = time.monotonic() + wait_seconds
        while finished < env.world_size:
            if time.monotonic() > deadline:
                log.warning("only %d of %d ranks finished in %.0f s", finished, env.world_size, wait_seconds)
                return False
            reporter.keep_alive()
            time.sleep(0.05)
            finished = store.add(FINISHED_KEY, 0)
        return True
    except (dist.DistError, RuntimeError) as exc:  # the host left (waited out) or died: nothing to wait for
        log.warning("could not count this rank finished: %s", exc)
        return False


def _report_if_permanent(reporter: RankReporter, exc: BaseException | None) -> bool:
    """Report a PermanentError in `exc` (severity Permanent: the operator fails the job); True if so."""
    permanent = permanent_cause(exc)
    if permanent is None:
        return False
    log.error("permanent error, not restarting: %s: %s", type(permanent).__name__, permanent)
    report_permanent(reporter, permanent)
    return True


def run_with_inprocess_restart(
    train_fn: TrainFn,
    env: RankEnv | None = None,
    reporter: RankReporter | None = None,
) -> Any:
    """Run `train_fn(call_wrapper=..., restart_count=...)` with NVRx in-process restart.

    Returns what `train_fn` returned. See the module docstring for the contract of `train_fn`.
    """
    env = env or RankEnv.from_env()
    reporter = reporter or RankReporter.from_env()
    agent_hosts = _agent_hosts_store()
    store = _base_store(env, agent_hosts)
    if env.in_process.enabled:
        result = _run_restartable(train_fn, env, store, reporter)
    else:
        result = _run_once(train_fn, env, store, reporter)
    if not agent_hosts:
        finish_together(env, store, reporter)
    return result


def _run_once(train_fn: TrainFn, env: RankEnv, store: dist.Store, reporter: RankReporter) -> Any:
    """In-process restart disabled: `train_fn` once, with `call_wrapper=None`, in one process group."""
    _init_process_group(env, store, "pg0")
    reporter.state(PodState.TRAINING)
    try:
        return train_fn(call_wrapper=None, restart_count=0)
    except Exception as exc:
        _report_if_permanent(reporter, exc)
        raise
    finally:
        _destroy_process_group()


def record_restart(reporter: RankReporter, rank: int, exc: BaseException | None, next_iteration: int) -> None:
    """Runs on every rank after an abort: record why it stopped (the fault) and the restart for the
    heartbeat. Without an exception, either the rank's own hang deadline passed, or NVRx's monitor
    stopped it for another rank's fault before any collective of its own broke (`RankShouldRestart`
    with no cause): collateral, as a broken collective is."""
    if exc is not None:
        reporter.fault(FaultSeverity.SOFT, classify_exception(exc), f"{type(exc).__name__}: {exc}")
    elif (hang := reporter.overdue()) is not None:  # aborted by its own deadline
        section, budget = hang
        reporter.fault(
            FaultSeverity.SOFT, FaultReason.RANK_HANG, f"no progress in its {section} for {budget:.1f} s"
        )
        print(f"[rtj] rank {rank}: no progress in its {section} for its hang budget of "
              f"{budget:.3f} s: restarting in-process", file=sys.stderr, flush=True)  # fmt: skip
    else:
        reporter.fault(
            FaultSeverity.SOFT,
            FaultReason.PEER_FAILURE,
            "stopped by the job's in-process restart: another rank's fault",
        )
    reporter.in_process_restart(next_iteration)


def _run_restartable(train_fn: TrainFn, env: RankEnv, store: dist.Store, reporter: RankReporter) -> Any:
    """`train_fn` under the NVRx Wrapper: one process group per restart iteration."""

    def _on_restart(exc: BaseException | None, next_iteration: int) -> None:
        if _report_if_permanent(reporter, exc):
            # Deterministic: every in-process restart would fail alike; end the wrapper.
            raise nvrx_patches.StopRestarting(f"permanent error: {exc}")
        record_restart(reporter, env.rank, exc, next_iteration)

    budgets = _hang_budgets(env)

    def _wrapped(call_wrapper: Any) -> Any:
        iteration = call_wrapper.iteration
        if budgets is not None:
            soft = env.in_process.soft_timeout_seconds
            reporter.attach_deadline(
                lambda budget: nvrx_patches.set_progress_deadline(call_wrapper, budget, soft), budgets
            )
        try:
            _init_process_group(env, store, f"pg{iteration}")
            reporter.state(PodState.TRAINING)
            return train_fn(call_wrapper=call_wrapper, restart_count=iteration)
        finally:
            reporter.detach_deadline()

    wrapped = nvrx_patches.inprocess_wrapper(
        _wrapped,
        store_host=env.master_addr,
        store_port=env.master_port + _WRAPPER_STORE_PORT_OFFSET,
        max_iterations=env.in_process.max_restarts + 1,
        on_restart=_on_restart,
        cuda_health_check=env.dist_backend == "nccl" and torch.cuda.is_available(),
        # NVRx's Wrapper probes GPU/NVLink between restarts, which kills a CPU rank: keep the plain check.
        gpu_restart_probes=env.dist_backend == "nccl",
        full_world_only=True,
        **_wrapper_timing(env),
    )
    # After every abort NVRx collects garbage until none is left (`while gc.collect()` in its
    # Wrapper): full collections that walk every object the imports made, 0.15 s each and two per
    # restart on the 2-core CI machine, most of an in-process restart there. Frozen objects are
    # left out of collections (still freed when their last reference goes; only a cycle among them
    # would stay): what is alive now is modules and the script's setup, and what each attempt makes
    # (model, optimizer, process groups) is not frozen.
    gc.freeze()
    try:
        return wrapped()
    finally:
        _destroy_process_group()


def _hang_budgets(env: RankEnv) -> HangBudgets | None:
    """The learned hang budgets, capped by the soft timeout (None: hang detection off, the fixed soft
    timeout alone). They live as long as the process: the medians carry over in-process restarts."""
    hd = env.hang_detection
    if not hd.enabled:
        return None
    return HangBudgets(
        env.in_process.soft_timeout_seconds,
        floor_seconds=hd.floor_seconds,
        median_multiple=hd.median_multiple,
    )


def _wrapper_timing(env: RankEnv) -> dict[str, datetime.timedelta]:
    """The Wrapper's poll intervals and timeouts, from RankEnv's soft and hard timeouts."""
    soft = env.in_process.soft_timeout_seconds
    hard = env.in_process.hard_timeout_seconds
    # The wrapper's own waits dominate recovery time: with NVRx's 1 s defaults an exception took
    # 2.1-2.7 s to the first step on 2xH200 (and did not recover at all in our FSDP2 runs); 50 ms
    # polls measured 0.98 s (docs/benchmarks.md). Each poll is a store round trip per rank.
    poll = datetime.timedelta(seconds=min(_POLL_SECONDS, soft / 4))
    return {
        "store_timeout": datetime.timedelta(seconds=max(60.0, 2 * hard)),
        "monitor_thread_interval": poll,
        "monitor_process_interval": poll,
        # NVRx's monitor process checks the soft timeout only when its queue stayed empty for one
        # monitor_process_interval; a progress timestamp arriving every such interval postpones it.
        "progress_watchdog_interval": WATCHDOG_INTERVAL_MULTIPLE * poll,
        "heartbeat_interval": poll,
        "soft_timeout": datetime.timedelta(seconds=soft),
        "hard_timeout": datetime.timedelta(seconds=hard),
        "heartbeat_timeout": datetime.timedelta(seconds=max(hard, 30.0)),
        "barrier_timeout": datetime.timedelta(seconds=max(hard, 30.0) * 2),
        "completion_timeout": datetime.timedelta(seconds=max(hard, 30.0) * 2),
        "last_call_wait": poll,
    }
