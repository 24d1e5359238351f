"""What the trainer relies on of NVRx's internals (and of torch's and CPython's next to them), in one module.

NVRx is pinned exactly (pyproject.toml). Everything here is what a new pin, or a new torch, must be
checked for, and `tests/unit/test_nvrx_patches.py` is the canary that checks it against the installed
NVRx and torch: each patched or called symbol, its signature, and where it is cheap the behaviour that
makes the patch right. When the canary fails after a bump, re-read that patch against the new source;
do not just change the test. As NVRx keeps its own c10d patch (`fault_tolerance/c10d_monkey_patch.py`),
each patch is one `apply_*()` whose docstring names the upstream symbol and says why. Nothing of NVRx
or torch is imported at module level: each function imports what it patches.

What, and who applies it:
- ft_launcher, in the pod's launcher process (`launcher_main`): `apply_keep_rendezvous_open`
  (`FtRendezvousBarrierHandler.shutdown`), `apply_group_termination` (`utils.terminate_mp_processes`),
  `apply_sync_before_rendezvous_wait` (`_RendezvousBarrierState._wait_for_rendezvous_open`).
- nvrx-control, in the rendezvous pod (`rendezvous_host`): `apply_store_host_poll`
  (`ft_rendezvous_barrier.time`).
- in-process restart, in every rank (`inprocess`, bench/inprocess_recovery.py): `inprocess_wrapper`, the
  only user of `nvidia_resiliency_ext.inprocess` (see below), `set_progress_deadline` (its
  progress watchdog's timestamp; `report.RankReporter` calls it with the learned hang budgets) and
  `apply_interrupting_abort` (`monitor_thread.async_abort_main_thread` and
  `progress_watchdog.ProgressWatchdog.pause_and_synchronize`) and `apply_deadline_wakeup`
  (`monitor_process.MonitorProcess.run`), both of which `inprocess_wrapper` applies.
- log text of torch and NVRx we match: `STORE_POLL_TIMEOUT` (`log_filter`), `LOST_STORE`
  (`rendezvous_loss`), `PEER_FAILURE_MARKERS` (`inprocess.classify_exception`).
- CPython's private exit steps, in a rank forked by `rank_forkserver`: `run_interpreter_exit`.

In-process restart: we keep calling NVRx's `inprocess`, behind `inprocess_wrapper`. NVRx 0.6 deprecated
it ("no longer the focus"; 0.7 still ships and runs it, and measured 0.86-0.98 s from an exception to
the next step on 1xH200). The part we use is not small: the Wrapper's restart loop (a monitor thread that
raises into the main thread when a peer fails, a monitor process that kills a rank past the hard timeout
even when its interpreter hangs, the store's iteration barriers and rank assignment) and its abort of
torch.distributed, which reaches into torch's own internals (`distributed_c10d._world`, the process
groups' backends). Owning that would mean owning those torch internals too. So we call it, and keep what
we use of it to one function here (`inprocess_wrapper`, with the three helpers below it), with a canary
for each piece: when a later NVRx drops or changes `inprocess`, the fallback is to vendor 0.7's
pure-Python `inprocess` package (Apache-2.0) under rtj_trainer and point these at it; nothing else
imports it.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import re
import signal
import threading
import time
from collections.abc import Callable, Collection
from typing import Any

log = logging.getLogger(__name__)

#: NVRx's ft_launcher and its store host, run by us as `__main__` (runpy) once patched.
LAUNCHER_MODULE = "nvidia_resiliency_ext.fault_tolerance.launcher"
CONTROL_PLANE_MODULE = "nvidia_resiliency_ext.fault_tolerance.control_plane"

#: Set on what a patch installed, so that applying it twice patches once.
_PATCHED = "__rtj_patched__"


def _patched(fn: Any) -> Any:
    setattr(fn, _PATCHED, True)
    return fn


# --- ft_launcher (the pod's launcher process) -------------------------------------------------------
def apply_keep_rendezvous_open() -> None:
    """Patch `fault_tolerance.ft_rendezvous_barrier.FtRendezvousBarrierHandler.shutdown`: a leaving
    ft_launcher leaves the job's rendezvous without shutting it down.

    On exit, NVRx's launcher shuts the rendezvous down for good (`shutdown`, also through
    `shutdown_due_to_failure` once its restart budget is spent), and every later joiner fails at once
    with RendezvousClosedError: the pod the operator starts in this one's place could never join, and
    the job would die with the one pod. Here the rendezvous outlives any pod (the job's rendezvous pod
    hosts it) and the operator decides the job's end, so a leaving launcher only removes itself.

    Leaving after a failure, it opens the next round instead (the handler's private `_barrier_state`,
    `_RendezvousBarrierState.open_rendezvous`), as a launcher that restarts would: the survivors restart
    their workers into it, and the replacement pods can join it even when every launcher of the job has
    left (a round nobody opens is never closed, and joiners wait forever). NVRx's own "do not restart"
    broadcast (`signal_no_restart`, no progress) is a different call and still reaches every launcher.
    """
    from nvidia_resiliency_ext.fault_tolerance.ft_rendezvous_barrier import FtRendezvousBarrierHandler
    from nvidia_resiliency_ext.fault_tolerance.utils import RDZV_SHUTDOWN_REASON_FAILURE

    if getattr(FtRendezvousBarrierHandler.shutdown, _PATCHED, False):
        return

    def _leave_open(self: Any, reason: str = "") -> bool:
        if reason == RDZV_SHUTDOWN_REASON_FAILURE:
            try:
                self._barrier_state.open_rendezvous()
            except Exception as exc:  # the store may be gone too; the operator recreates it
                log.warning("could not open the next rendezvous round: %s", exc)
        log.info("launcher leaving (%s): the rendezvous stays open for its replacement", reason or "done")
        return True

    FtRendezvousBarrierHandler.shutdown = _patched(_leave_open)


def apply_group_termination(terminate: Callable[[Collection[int]], None]) -> None:
    """Patch `fault_tolerance.utils.terminate_mp_processes(allowed_pgids)`, the last step of stopping the
    ranks on every in-job restart, with `terminate` (`launcher_main.terminate_groups`): NVRx's sleeps a
    fixed second even when every rank is already gone.

    The launcher imports the name from `utils` when it runs as `__main__` (runpy, after this patch), so
    the patch is on `utils`, not on an already imported launcher module.
    """
    from nvidia_resiliency_ext.fault_tolerance import utils

    utils.terminate_mp_processes = terminate


def apply_sync_before_rendezvous_wait() -> None:
    """Patch `fault_tolerance.ft_rendezvous_barrier._RendezvousBarrierState._wait_for_rendezvous_open`
    (Step 0 of NVRx's barrier rendezvous) to call the private `_sync_from_per_round_state` first.

    A launcher that restarts its workers enters Step 0 still on the round that failed: it sees that
    round closed, syncs to the round its failure opened, then sleeps 1 s before it looks again. Syncing
    first (what that loop's own first check does) finds the new round open at once: a second less in
    every in-job restart.
    """
    from nvidia_resiliency_ext.fault_tolerance.ft_rendezvous_barrier import _RendezvousBarrierState

    wait_open = _RendezvousBarrierState._wait_for_rendezvous_open
    if getattr(wait_open, _PATCHED, False):
        return

    def _sync_then_wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        self._sync_from_per_round_state()
        return wait_open(self, *args, **kwargs)

    _RendezvousBarrierState._wait_for_rendezvous_open = _patched(_sync_then_wait)


# --- nvrx-control (the rendezvous pod) ---------------------------------------------------------------
class _CappedSleeps:
    """`time` for one module, its sleeps capped at `cap_s` (its clocks and the rest are the real ones)."""

    def __init__(self, cap_s: float) -> None:
        self.cap_s = cap_s

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)

    def sleep(self, seconds: float) -> None:
        time.sleep(min(seconds, self.cap_s))


def apply_store_host_poll(poll_s: float) -> None:
    """Patch the `time` global of `fault_tolerance.ft_rendezvous_barrier` in the store host's process
    (nvrx-control) so that none of its sleeps lasts longer than `poll_s`.

    NVRx's store host waits between rounds in 1 s sleeps, so each in-job restart waited up to a second
    more for its round to be closed (0.8-1.0 s of a 2.6 s restart on CPU). Only that process polls
    faster, against its own store; the launchers' polls are unchanged.
    """
    from nvidia_resiliency_ext.fault_tolerance import ft_rendezvous_barrier

    ft_rendezvous_barrier.time = _CappedSleeps(poll_s)


# --- in-process restart (every rank) -----------------------------------------------------------------
class StopRestarting(Exception):
    """Raised by an `inprocess_wrapper` `on_restart` callback: no in-process restart can help (NVRx's
    `inprocess.exception.RestartAbort` ends the wrapper, and the rank exits)."""


#: `on_restart(exception, next_iteration)` of `inprocess_wrapper`.
OnRestart = Callable[[BaseException | None, int], None]


def inprocess_wrapper[T](
    entry: Callable[[Any], T],
    *,
    store_host: str,
    store_port: int,
    max_iterations: int,
    store_timeout: datetime.timedelta | None = None,
    on_restart: OnRestart | None = None,
    cuda_health_check: bool = False,
    gpu_restart_probes: bool = True,
    full_world_only: bool = False,
    **timings: datetime.timedelta,
) -> Callable[[], T]:
    """`entry(call_wrapper)` run under NVRx's `inprocess.Wrapper`; returns the wrapped callable.

    - `entry` gets NVRx's `inprocess.CallWrapper` (its `iteration`, 0 on the first call, and `atomic()`);
      NVRx finds the parameter to pass it to by its evaluated annotation (`param_utils.check_type`),
      so `entry` is called from a function of ours annotated with the class itself.
    - The Wrapper's store is NVRx's `inprocess.store.TCPStore` on `store_host:store_port`.
    - `max_iterations`: `initialize.RetryController`'s bound (1 + the restarts allowed).
    - `on_restart(exception, next_iteration)`: a `finalize.Finalize` run on every rank after an abort
      (the `State`'s `fn_exception` and `iteration + 1`); `StopRestarting` from it ends the wrapper.
    - `cuda_health_check`: `health_check.CudaHealthCheck` between restarts.
    - `gpu_restart_probes` False: NVRx 0.7 chains GPU, NVLink and NIC probes into its
      `restart_health_check` whenever LOCAL_RANK is set, which kills a CPU (gloo) rank; the plain
      `health_check` is kept instead.
    - `full_world_only`: NVRx's default assignment (`ActivateAllRanks`, `ShiftRanks`) shifts the
      survivors of a dead rank into a smaller world. State sharded for the full world (FSDP, per-rank
      checkpoints) must never train in a smaller one: with any rank lost (`RankAssignmentCtx
      .terminated_ranks`), every survivor is discarded (`RankDiscarded`) and ft_launcher restarts the
      worker group. (NVRx's `FilterCountGroupedByKey` would do this with a store barrier, but under
      torch >= 2.15 `store.barrier` resolves to torch's own `Store.barrier` and fails.)
    - `timings`: the Wrapper's intervals and timeouts by its own keyword names (`soft_timeout`,
      `monitor_thread_interval`, ...); those not given keep NVRx's defaults.
    """
    from nvidia_resiliency_ext import inprocess

    store_kwargs: dict[str, Any] = {"host_name": store_host, "port": store_port}
    if store_timeout is not None:
        store_kwargs["timeout"] = store_timeout
    options: dict[str, Any] = {}
    if on_restart is not None:
        options["finalize"] = _finalize_on_restart(on_restart)
    if full_world_only:
        options["rank_assignment"] = _full_world_assignment()
    wrapper = inprocess.Wrapper(
        store_kwargs=store_kwargs,
        initialize=inprocess.initialize.RetryController(max_iterations=max_iterations),
        abort=inprocess.abort.AbortTorchDistributed(),
        health_check=inprocess.health_check.CudaHealthCheck() if cuda_health_check else None,
        **options,
        **timings,
    )
    if not gpu_restart_probes:
        wrapper.restart_health_check = wrapper.health_check
    apply_interrupting_abort()
    apply_deadline_wakeup()
    wrapped: Callable[[], T] = wrapper(_annotated_entry(entry))
    return wrapped


#: The signal that wakes the main thread out of a blocking system call when NVRx aborts it (a
#: real-time one: no default meaning, unused by torch, NVRx and CPython).
ABORT_SIGNAL = signal.SIGRTMIN + 4
#: The least time between two such signals while NVRx keeps raising into the main thread.
ABORT_SIGNAL_EVERY_SECONDS = 0.1


def apply_interrupting_abort() -> None:
    """Make NVRx's abort of the main thread reach it inside a blocking system call.

    NVRx's `monitor_thread.MonitorThread.run` aborts the training function in two steps that both
    need the main thread to run Python bytecode: `ProgressWatchdog.pause_and_synchronize` waits until
    the main thread has run the watchdog's pending calls (`Py_AddPendingCall`), then
    `async_abort_main_thread` sets an exception on it (`PyThreadState_SetAsyncExc`). A rank blocked in
    a system call (a read from a pipe or socket that never delivers, a sleep in C) runs none, so a
    hang past its budget waited for the hard timeout's kill and an in-job restart instead of the
    in-process one. Patched: while the monitor thread waits in `pause_and_synchronize`, and after each
    `async_abort_main_thread`, `ABORT_SIGNAL` goes to the main thread (at most every
    `ABORT_SIGNAL_EVERY_SECONDS`). The call fails with EINTR and CPython runs the signal's handler
    (PEP 475), Python code in the main thread: the interpreter runs the pending calls there, and
    raises the pending exception (NVRx's `RankShouldRestart`), which the call then raises. Code
    blocked where no signal reaches (a CUDA synchronisation, a wait with signals masked) still ends
    by the hard timeout. Run in the main thread (the handler is installed there); patches once.
    """
    from nvidia_resiliency_ext.inprocess import monitor_thread, progress_watchdog

    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(ABORT_SIGNAL, _raise_pending_abort)
    raise_into_main = monitor_thread.async_abort_main_thread
    if getattr(raise_into_main, _PATCHED, False):
        return
    last_signal = [0.0]

    @_patched
    def _abort_and_interrupt(*args: Any, **kwargs: Any) -> Any:
        result = raise_into_main(*args, **kwargs)
        now = time.monotonic()
        if now - last_signal[0] >= ABORT_SIGNAL_EVERY_SECONDS:
            last_signal[0] = now
            _interrupt_main_thread()
        return result

    synchronize = progress_watchdog.ProgressWatchdog.pause_and_synchronize

    @_patched
    def _synchronize_interrupting(self: Any) -> Any:
        if threading.current_thread() is threading.main_thread():
            return synchronize(self)  # the main thread runs its pending calls itself
        done = threading.Event()

        def interrupt_until_paused() -> None:
            while not self.paused.is_set() and not done.is_set():
                _interrupt_main_thread()
                done.wait(ABORT_SIGNAL_EVERY_SECONDS)

        threading.Thread(target=interrupt_until_paused, name="rtj-abort-interrupt", daemon=True).start()
        try:
            return synchronize(self)
        finally:
            done.set()

    monitor_thread.async_abort_main_thread = _abort_and_interrupt
    progress_watchdog.ProgressWatchdog.pause_and_synchronize = _synchronize_interrupting


def _interrupt_main_thread() -> None:
    ident = threading.main_thread().ident
    if ident is not None:
        with contextlib.suppress(ProcessLookupError):  # the main thread has ended
            signal.pthread_kill(ident, ABORT_SIGNAL)


def _raise_pending_abort(signum: int, frame: Any) -> None:
    """`ABORT_SIGNAL`'s handler: nothing of its own. Running it lets the interpreter raise the
    exception NVRx set on the main thread; without one pending, the interrupted call goes on."""


#: How long after a deadline the monitor process wakes to check it (NVRx's check is a strict `>`).
DEADLINE_WAKE_MARGIN_SECONDS = 0.002


class _DeadlineQueue:
    """The monitor process's message queue, whose blocking `get` also comes back empty at the next
    soft or hard deadline of the last timestamp it passed on; everything else is the queue's."""

    def __init__(self, queue: Any, timestamp_message: Any, *timeouts_s: float) -> None:
        self._queue = queue
        self._timestamp_message = timestamp_message
        self._timeouts_s = timeouts_s
        self._deadlines: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._queue, name)

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        if block and timeout is not None:
            now = time.monotonic()
            ahead = [d - now for d in self._deadlines if d > now]
            if ahead:
                timeout = min(timeout, min(ahead) + DEADLINE_WAKE_MARGIN_SECONDS)
        message = self._queue.get(block, timeout)
        kind, content = message
        if kind == self._timestamp_message:
            stamps = [t for t in (content.auto, content.manual) if t is not None]
            self._deadlines = [t + limit for t in stamps for limit in self._timeouts_s]
        return message


def apply_deadline_wakeup() -> None:
    """Make NVRx's monitor process check a rank's soft and hard timeouts when they fall due, not on
    its next poll.

    `monitor_process.MonitorProcess.run` loops on `msg_queue.get(timeout=interval)` and checks the
    timeouts (`Timestamp.is_timed_out`) only after a get came back empty, so a deadline was seen up
    to one poll plus one watchdog interval late (0.05 + 0.1 s here; a 5 s hang budget fired 0.06-
    0.16 s late on CPU and on an H100). Patched: `run` (a static method, which the forked monitor
    process runs with keyword arguments) gets its queue behind `_DeadlineQueue`, whose `get` also
    returns empty just after the soft or hard deadline of the last timestamp the loop received, so
    the loop's own check runs then. The loop, its checks and the interval are NVRx's; patches once.
    """
    from nvidia_resiliency_ext.inprocess import monitor_process

    run = monitor_process.MonitorProcess.run
    if getattr(run, _PATCHED, False):
        return

    @_patched
    def _run_waking_at_deadlines(
        *args: Any,
        msg_queue: Any,
        soft_timeout: datetime.timedelta,
        hard_timeout: datetime.timedelta,
        **kwargs: Any,
    ) -> Any:
        queue = _DeadlineQueue(
            msg_queue,
            monitor_process.Message.TIMESTAMP,
            soft_timeout.total_seconds(),
            hard_timeout.total_seconds(),
        )
        return run(*args, msg_queue=queue, soft_timeout=soft_timeout, hard_timeout=hard_timeout, **kwargs)

    monitor_process.MonitorProcess.run = staticmethod(_run_waking_at_deadlines)


def _finalize_on_restart(on_restart: OnRestart) -> Any:
    """A `finalize.Finalize` that calls `on_restart(state.fn_exception, state.iteration + 1)`; its
    `StopRestarting` becomes NVRx's `RestartAbort`."""
    from nvidia_resiliency_ext import inprocess

    class _OnRestart(inprocess.finalize.Finalize):
        def __call__(self, state: Any) -> Any:
            try:
                on_restart(state.fn_exception, state.iteration + 1)
            except StopRestarting as stop:
                raise inprocess.exception.RestartAbort(str(stop)) from stop
            return state

    return _OnRestart()


def _full_world_assignment() -> Any:
    """NVRx's default rank assignment, after a check that discards every rank once any rank is lost."""
    from nvidia_resiliency_ext import inprocess

    ra = inprocess.rank_assignment

    class _FullWorldOnly(inprocess.rank_assignment.RankAssignment):
        def __call__(self, ctx: Any) -> Any:
            if ctx.terminated_ranks:
                raise ra.RankDiscarded(f"rank(s) {sorted(ctx.terminated_ranks)} lost: full world required")
            return ctx

    # Compose applies right to left: the full-world check runs first.
    return inprocess.Compose(ra.ActivateAllRanks(), ra.ShiftRanks(), _FullWorldOnly())


def _annotated_entry[T](entry: Callable[[Any], T]) -> Callable[..., T]:
    """`entry` behind a function whose parameter is annotated with `inprocess.CallWrapper` itself
    (this module's annotations are strings; NVRx compares objects)."""
    from nvidia_resiliency_ext import inprocess

    def _entry(call_wrapper: Any = None) -> T:
        return entry(call_wrapper)

    _entry.__annotations__ = {"call_wrapper": inprocess.CallWrapper}
    return _entry


def set_progress_deadline(call_wrapper: Any, budget_s: float, soft_timeout_s: float) -> None:
    """Make the Wrapper's soft timeout fire `budget_s` from now instead of its fixed `soft_timeout_s`
    (rtj_trainer.hang_timeouts learns the budget; a budget above the soft timeout is cut to it).

    NVRx's monitor process compares its rank's `progress_watchdog.Timestamp` with the soft timeout it
    was built with: `now - timestamp.manual > soft_timeout` (`Timestamp.is_timed_out`), `manual` being
    what `CallWrapper.ping` sets. A ping stamped `soft_timeout_s - budget_s` earlier than now therefore
    times out `budget_s` from now. The watchdog thread sends the same Timestamp object with every
    automatic update, so the shifted `manual` stays until the next call. The hard timeout, checked on
    the same timestamp, moves by as much: the kill still comes `hard - soft` after the soft abort.
    An in-process restart resets the Timestamp (`ProgressWatchdog.reset`): no deadline until the next
    call.
    """
    watchdog = call_wrapper.progress_watchdog
    budget_s = min(budget_s, soft_timeout_s)
    watchdog.timestamp.manual = time.monotonic() - (soft_timeout_s - budget_s)
    watchdog.send()


# --- log and error text of torch and NVRx that we match ---------------------------------------------
#: A c10d store poll that timed out, in both forms torch's socket code (`socket.cpp`) logs it: NVRx's
#: in-process restart polls its store with 50 ms timeouts, and each timeout logs both lines (a failed
#: poll, "failed with res=...", is not a timeout and does not match).
STORE_POLL_TIMEOUT = re.compile(
    rb"\[c10d\] waitForInput: "
    rb"(socket .* timed out after \d+ms|poll for socket .* returned 0, likely a timeout)"
)

#: How NVRx's ft_launcher ends when its rendezvous store went away (its last words, from
#: `launcher.py`'s "Agent run ended with exception, e=..."), by the torch exception classes it names.
LOST_STORE = re.compile(
    rb"Agent run ended with exception, e=(?:DistNetworkError|RendezvousConnectionError|DistStoreError)"
)

#: Words in the message of a collective that failed because another rank failed (gloo, NCCL, the c10d
#: store), for collectives that do not raise torch's own `DistError`.
PEER_FAILURE_MARKERS = ("gloo", "NCCL", "Connection reset by peer", "Connection closed by peer")


# --- CPython -----------------------------------------------------------------------------------------
def run_interpreter_exit() -> None:
    """What CPython does at a normal exit before it flushes, in its order, for a process that must end
    with `os._exit` (a rank forked by the forkserver: returning would unwind into the server's loop and
    its clean-up): join non-daemon threads (`threading._shutdown`), then run the atexit handlers
    (`atexit._run_exitfuncs`). Both are private to CPython; the canary checks they still exist."""
    import atexit
    import threading

    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
