"""The canary of rtj_trainer.nvrx_patches: the installed NVRx (the pinned 0.7.0) and torch still have each
symbol, signature and behaviour a patch there relies on. A failure here after a version bump means a
patch must be re-read against the new source, not that this test needs changing.

Each check is in-process and cheap: signatures and source snippets of the patched functions, and the
behaviour on a real in-process TCPStore where it takes well under a second.
"""

from __future__ import annotations

import atexit
import dataclasses
import datetime
import inspect
import os
import queue
import re
import signal
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
from nvidia_resiliency_ext import inprocess
from nvidia_resiliency_ext.fault_tolerance import ft_rendezvous_barrier, launcher, utils
from nvidia_resiliency_ext.fault_tolerance.ft_rendezvous_barrier import (
    FtRendezvousBarrierHandler,
    _RendezvousBarrierState,
)
from rtj_trainer import nvrx_patches
from rtj_trainer.launcher_main import terminate_groups

pytestmark = pytest.mark.unit


def _params(fn: Any) -> list[str]:
    return list(inspect.signature(fn).parameters)


def _source(obj: Any) -> str:
    return inspect.getsource(obj)


@pytest.fixture
def store() -> Iterator[dist.TCPStore]:
    server = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False, use_libuv=True)
    yield server


@pytest.fixture
def restore(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """Everything a patch under test replaces is put back afterwards (the patches are process-wide)."""
    monkeypatch.setattr(FtRendezvousBarrierHandler, "shutdown", FtRendezvousBarrierHandler.shutdown)
    monkeypatch.setattr(
        _RendezvousBarrierState,
        "_wait_for_rendezvous_open",
        _RendezvousBarrierState._wait_for_rendezvous_open,
    )
    monkeypatch.setattr(utils, "terminate_mp_processes", utils.terminate_mp_processes)
    monkeypatch.setattr(ft_rendezvous_barrier, "time", ft_rendezvous_barrier.time)
    pw = inprocess.progress_watchdog.ProgressWatchdog
    monkeypatch.setattr(pw, "pause_and_synchronize", pw.pause_and_synchronize)
    mt = inprocess.monitor_thread
    monkeypatch.setattr(mt, "async_abort_main_thread", mt.async_abort_main_thread)
    mp = inprocess.monitor_process.MonitorProcess
    monkeypatch.setattr(mp, "run", mp.__dict__["run"])  # the staticmethod itself
    handler = signal.getsignal(nvrx_patches.ABORT_SIGNAL)
    yield monkeypatch
    signal.signal(nvrx_patches.ABORT_SIGNAL, handler)


def _closed_round_then_next_open(store: dist.TCPStore, run_id: str) -> _RendezvousBarrierState:
    """A launcher's barrier state still on round 0, which is closed (training), with round 1 not
    yet opened: where a launcher stands when its workers fail."""
    state = _RendezvousBarrierState(store, run_id)
    assert state._round == 0 and state.round_done_key.endswith(":round_done_0")
    store.set(state.round_done_key, b"1")
    return state


# --- apply_keep_rendezvous_open: FtRendezvousBarrierHandler.shutdown ------------------------------------
def test_ft_launcher_leaves_through_shutdown_and_a_failure_through_shutdown_due_to_failure() -> None:
    assert _params(FtRendezvousBarrierHandler.shutdown) == ["self", "reason"]
    assert "self.shutdown(reason=RDZV_SHUTDOWN_REASON_FAILURE)" in _source(
        FtRendezvousBarrierHandler.shutdown_due_to_failure
    )
    leaving = _source(launcher)
    assert "_rdzv_handler.shutdown_due_to_failure()" in leaving
    assert "_rdzv_handler.shutdown()" in leaving
    assert "self._barrier_state = _RendezvousBarrierState(" in _source(FtRendezvousBarrierHandler.__init__)
    assert utils.RDZV_SHUTDOWN_REASON_FAILURE == "failure"


def test_a_launcher_leaving_after_a_failure_opens_the_next_round_and_shuts_nothing_down(
    store: dist.TCPStore, restore: pytest.MonkeyPatch
) -> None:
    state = _closed_round_then_next_open(store, "canary-leave")
    handler = types.SimpleNamespace(_barrier_state=state)
    nvrx_patches.apply_keep_rendezvous_open()
    nvrx_patches.apply_keep_rendezvous_open()  # applied twice, patched once
    assert FtRendezvousBarrierHandler.shutdown(handler, utils.RDZV_SHUTDOWN_REASON_FAILURE) is True
    assert store.get(f"{state.prefix}:round_done_1") == b"0"  # open_rendezvous: the next round is open
    assert not state.is_shutdown()
    assert FtRendezvousBarrierHandler.shutdown(handler) is True  # a graceful leave: nothing more
    assert not state.is_shutdown()


# --- apply_group_termination: utils.terminate_mp_processes --------------------------------------------
def test_the_launcher_imports_terminate_mp_processes_by_name_from_utils_and_calls_it_with_the_pgids() -> None:
    assert _params(utils.terminate_mp_processes) == ["allowed_pgids"]
    source = _source(launcher)
    imports = re.search(r"from nvidia_resiliency_ext\.fault_tolerance\.utils import \(([^)]*)\)", source)
    assert imports and "terminate_mp_processes" in {name.strip(" ,") for name in imports.group(1).split()}
    assert "terminate_mp_processes(allowed_pgids=self._children_pgids)" in source


def test_group_termination_is_what_a_launcher_run_as_main_calls(restore: pytest.MonkeyPatch) -> None:
    nvrx_patches.apply_group_termination(terminate_groups)
    assert utils.terminate_mp_processes is terminate_groups


# --- apply_sync_before_rendezvous_wait: _RendezvousBarrierState._wait_for_rendezvous_open ---------------
def test_step_0_and_the_per_round_sync_have_the_signatures_the_patch_wraps() -> None:
    assert _params(_RendezvousBarrierState._wait_for_rendezvous_open) == ["self", "node_desc", "stop_event"]
    assert _params(_RendezvousBarrierState._sync_from_per_round_state) == ["self"]
    assert _params(_RendezvousBarrierState.open_rendezvous) == ["self"]
    assert "self._wait_for_rendezvous_open(" in _source(_RendezvousBarrierState)


def test_a_restarting_launcher_finds_the_round_its_failure_opened_without_a_fixed_wait(
    store: dist.TCPStore, restore: pytest.MonkeyPatch
) -> None:
    state = _closed_round_then_next_open(store, "canary-step0")
    state.open_rendezvous()  # a launcher's failure opened round 1
    nvrx_patches.apply_sync_before_rendezvous_wait()
    nvrx_patches.apply_sync_before_rendezvous_wait()  # applied twice, patched once
    t0 = time.monotonic()
    state._wait_for_rendezvous_open("canary-node")
    assert time.monotonic() - t0 < 0.5  # NVRx's loop sleeps a whole second before it looks again
    assert state._round == 1


# --- apply_store_host_poll: ft_rendezvous_barrier.time ----------------------------------------------------
def test_the_barrier_module_sleeps_through_its_module_global_time() -> None:
    assert ft_rendezvous_barrier.time is time
    assert "time.sleep(1.0)" in _source(ft_rendezvous_barrier)


def test_the_store_host_poll_caps_sleeps_and_keeps_the_real_clocks(restore: pytest.MonkeyPatch) -> None:
    nvrx_patches.apply_store_host_poll(0.05)
    patched = ft_rendezvous_barrier.time
    t0 = time.monotonic()
    patched.sleep(5.0)
    assert time.monotonic() - t0 < 1.0
    assert patched.monotonic is time.monotonic and patched.time is time.time


# --- inprocess_wrapper: nvidia_resiliency_ext.inprocess -----------------------------------------------
def test_the_wrapper_takes_every_keyword_we_pass() -> None:
    params = set(_params(inprocess.Wrapper.__init__))
    passed = {"store_kwargs", "initialize", "abort", "finalize", "health_check", "rank_assignment"}
    timings = {
        "monitor_thread_interval",
        "monitor_process_interval",
        "progress_watchdog_interval",
        "heartbeat_interval",
        "soft_timeout",
        "hard_timeout",
        "heartbeat_timeout",
        "barrier_timeout",
        "completion_timeout",
        "last_call_wait",
    }
    assert passed | timings <= params
    assert {"host_name", "port", "timeout"} <= set(_params(inprocess.store.TCPStore.__init__))
    assert "max_iterations" in _params(inprocess.initialize.RetryController.__init__)
    inprocess.abort.AbortTorchDistributed()
    inprocess.health_check.CudaHealthCheck()


def test_the_progress_watchdog_sends_slower_than_the_monitor_process_polls() -> None:
    """NVRx's monitor process checks the soft and hard timeouts only after its queue stayed empty for
    one monitor_process_interval (a timestamp message `continue`s the loop). With the watchdog
    sending every such interval, a stalled rank's check kept being postponed: a 5 s hang budget
    fired 0.7-1.1 s late (bench/gpu_smoke.py --cpu --hang-step 75); sending every second poll, 0.1 s."""
    loop = _source(inprocess.monitor_process.MonitorProcess.run)
    assert "msg_queue.get(timeout=interval.total_seconds())" in loop
    assert re.search(r"case Message\.TIMESTAMP:\s+timestamp = content\s+continue", loop)
    assert "except queue.Empty:" in loop and "is_timed_out(soft_timeout)" in loop
    from rtj_trainer.inprocess import _wrapper_timing

    for soft in (0.1, 60.0):
        env = types.SimpleNamespace(
            in_process=types.SimpleNamespace(soft_timeout_seconds=soft, hard_timeout_seconds=2 * soft)
        )
        timing = _wrapper_timing(env)  # type: ignore[arg-type]
        assert timing["progress_watchdog_interval"] >= 2 * timing["monitor_process_interval"], timing


def test_the_monitor_thread_waits_for_the_main_thread_twice_in_an_abort() -> None:
    """What `apply_interrupting_abort` interrupts: the abort first waits until the main thread ran the
    watchdog's pending calls, then raises into it, by the module-global name the patch replaces."""
    run = _source(inprocess.monitor_thread.MonitorThread.run)
    synchronize = run.index("self.progress_watchdog.pause_and_synchronize()")
    assert synchronize < run.index("async_abort_main_thread(msg)") < run.index("async_abort_main_thread()")
    assert "add_pending_call(self.get_automatic_timestamp" in _source(inprocess.progress_watchdog)
    pause = _source(inprocess.progress_watchdog.ProgressWatchdog.pause_and_synchronize)
    assert "self.paused.wait()" in pause
    assert "PyThreadState_SetAsyncExc" in _source(inprocess.monitor_thread.async_raise)


def test_the_monitor_process_runs_run_with_its_queue_and_timeouts_by_keyword() -> None:
    """What `apply_deadline_wakeup` wraps: the forked monitor process calls the static `run` it was
    built with (`self.run`, looked up when the MonitorProcess is made) with keyword arguments, the
    queue and both timeouts among them; its loop reads `(message, content)` pairs from the queue."""
    mp = inprocess.monitor_process
    init = _source(mp.MonitorProcess.__init__)
    assert "'fn': self.run" in init
    assert all(f"'{k}': {k}" in init for k in ("soft_timeout", "hard_timeout")), init
    assert "'msg_queue': self.msg_queue" in init
    assert "fn(*fn_args, **fn_kwargs)" in _source(mp.daemonize_fn)
    assert isinstance(mp.MonitorProcess.__dict__["run"], staticmethod)
    assert "msg, content = msg_queue.get(timeout=interval.total_seconds())" in _source(mp.MonitorProcess.run)
    assert "def send_timestamp(self, timestamp):" in _source(mp.MonitorProcess)
    assert "(Message.TIMESTAMP, timestamp)" in _source(mp.MonitorProcess.send_timestamp)


def test_the_patched_run_gets_its_queue_behind_the_deadline_queue(restore: pytest.MonkeyPatch) -> None:
    mp = inprocess.monitor_process
    got: dict[str, Any] = {}
    restore.setattr(mp.MonitorProcess, "run", staticmethod(lambda **kw: got.update(kw)))
    nvrx_patches.apply_deadline_wakeup()
    nvrx_patches.apply_deadline_wakeup()  # once
    q: queue.Queue[Any] = queue.Queue()
    soft, hard = datetime.timedelta(seconds=5), datetime.timedelta(seconds=9)
    mp.MonitorProcess.run(msg_queue=q, soft_timeout=soft, hard_timeout=hard, rank=3)
    assert got["rank"] == 3 and got["soft_timeout"] is soft and got["hard_timeout"] is hard
    assert isinstance(got["msg_queue"], nvrx_patches._DeadlineQueue) and got["msg_queue"]._queue is q
    assert got["msg_queue"].qsize() == 0  # the rest is the queue's


def test_the_deadline_queue_comes_back_empty_at_the_soft_then_the_hard_deadline() -> None:
    """The loop checks the timeouts after an empty get: it is woken when they fall due, not a poll
    later; once both have passed, a get waits its whole timeout again (no busy loop)."""
    mp = inprocess.monitor_process
    q: queue.Queue[Any] = queue.Queue()
    dq = nvrx_patches._DeadlineQueue(q, mp.Message.TIMESTAMP, 10.0, 10.4)
    now = time.monotonic()
    stamp = inprocess.progress_watchdog.Timestamp(auto=now, manual=now - 9.8)  # soft due in 0.2 s
    q.put((mp.Message.TIMESTAMP, stamp))
    assert dq.get(timeout=1.0) == (mp.Message.TIMESTAMP, stamp)
    for due in (10.0, 10.4):  # soft, then hard, of the manual timestamp
        t0 = time.monotonic()
        with pytest.raises(queue.Empty):
            dq.get(timeout=3.0)
        assert time.monotonic() - t0 < 1.0 and stamp.is_timed_out(datetime.timedelta(seconds=due))
    t0 = time.monotonic()
    with pytest.raises(queue.Empty):
        dq.get(timeout=0.3)  # the auto timestamp's deadlines are 10 s away: the full timeout
    assert time.monotonic() - t0 >= 0.3
    q.put((mp.Message.ITERATION_START, (0, 1, 0)))
    assert dq.get(timeout=1.0)[0] is mp.Message.ITERATION_START


class _NoMonitorProcess:
    def send_timestamp(self, timestamp: object) -> None:
        pass


def test_an_abort_reaches_a_main_thread_blocked_in_a_read(restore: pytest.MonkeyPatch) -> None:
    """NVRx's two steps of an abort, from another thread, against this (the main) thread blocked in
    a read from a pipe that never delivers: with the patch the read raises NVRx's exception at once;
    without it, the watchdog's synchronisation waits forever (a writer ends the read after 20 s)."""
    nvrx_patches.apply_interrupting_abort()
    mt = inprocess.monitor_thread
    watchdog = inprocess.progress_watchdog.ProgressWatchdog(
        0, _NoMonitorProcess(), datetime.timedelta(seconds=0.01)
    )
    watchdog.start()
    r, w = os.pipe()
    aborted = threading.Event()

    main_stat = f"/proc/self/task/{threading.main_thread().native_id}/stat"

    def abort() -> None:
        # Until the main thread sleeps in its read (the state after the command's closing paren).
        deadline = time.monotonic() + 5
        while Path(main_stat).read_text().rsplit(")", 1)[1].split()[0] != "S":
            assert time.monotonic() < deadline, "the main thread never blocked in its read"
            time.sleep(0.001)
        watchdog.pause_and_synchronize()
        mt.async_abort_main_thread("hung")
        aborted.set()

    threading.Thread(target=abort, daemon=True).start()
    unblock = threading.Timer(20, os.write, (w, b"x"))
    unblock.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(mt.RankShouldRestart):
            os.read(r, 1)
        took = time.monotonic() - t0
    finally:
        unblock.cancel()
        watchdog.pause_requested.clear()
        watchdog.should_stop.set()
        watchdog.interval_event.set()
        watchdog.join(5)
        os.close(r)
        os.close(w)
    assert aborted.wait(5)
    assert took < 5, f"{took:.1f} s: the abort waited for the main thread instead of interrupting it"


def test_the_call_wrapper_has_what_training_functions_use() -> None:
    assert isinstance(inspect.getattr_static(inprocess.CallWrapper, "iteration"), property)
    assert _params(inprocess.CallWrapper.atomic) == ["self"]


def test_nvrx_passes_the_call_wrapper_to_the_parameter_annotated_with_its_class() -> None:
    from nvidia_resiliency_ext.inprocess import param_utils

    def entry(call_wrapper=None):  # type: ignore[no-untyped-def]
        return call_wrapper

    entry.__annotations__ = {"call_wrapper": inprocess.CallWrapper}
    marker = object()
    args, kwargs = param_utils.substitute_param_value(entry, (), {}, {inprocess.CallWrapper: marker})
    assert entry(*args, **kwargs) is marker
    assert "param_utils.substitute_param_value(" in _source(inprocess.wrap)


def test_on_cpu_the_restart_health_check_would_probe_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """Why `gpu_restart_probes=False` exists: with LOCAL_RANK set, 0.7 chains GPU, NVLink and NIC probes
    into the check it runs before every restart (which kill a CPU rank); the Wrapper runs that check."""
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.delenv("NVRX_NODE_LOCAL_TMPDIR", raising=False)
    wrapper = inprocess.Wrapper(health_check=None)
    probes = [type(c).__name__ for c in wrapper.restart_health_check.instances]
    assert "ChainedGPUHealthCheck" in probes
    assert "wrapper.restart_health_check(" in _source(inprocess.wrap)
    assert "wrapper.health_check" in _source(inprocess.wrap)


def test_the_wrapper_built_for_a_cpu_rank_keeps_the_plain_health_check(restore: pytest.MonkeyPatch) -> None:
    monkeypatch = restore
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.delenv("NVRX_NODE_LOCAL_TMPDIR", raising=False)
    built: list[Any] = []
    real = inprocess.Wrapper

    class Recording(real):  # type: ignore[misc, valid-type]
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            built.append(self)

    monkeypatch.setattr(inprocess, "Wrapper", Recording)
    nvrx_patches.inprocess_wrapper(
        lambda call_wrapper: None,
        store_host="127.0.0.1",
        store_port=1,
        max_iterations=2,
        on_restart=lambda exc, iteration: None,
        gpu_restart_probes=False,
        full_world_only=True,
        soft_timeout=datetime.timedelta(seconds=5),
        hard_timeout=datetime.timedelta(seconds=10),
    )
    (wrapper,) = built
    assert wrapper.restart_health_check is wrapper.health_check is None
    assert wrapper.store_kwargs == {"host_name": "127.0.0.1", "port": 1}
    assert isinstance(wrapper.finalize, inprocess.finalize.Finalize)
    assert isinstance(wrapper.rank_assignment, inprocess.rank_assignment.RankAssignment)


def test_finalize_gets_the_state_with_the_exception_and_iteration() -> None:
    fields = {f.name for f in dataclasses.fields(inprocess.state.State)}
    assert {"fn_exception", "iteration"} <= fields
    assert _params(inprocess.finalize.Finalize.__call__) == ["self", "state"]
    assert issubclass(inprocess.exception.RestartAbort, BaseException)


def test_rank_assignment_composes_right_to_left_and_a_lost_rank_discards_every_survivor() -> None:
    ra = inprocess.rank_assignment
    assert {f.name for f in dataclasses.fields(ra.RankAssignmentCtx)} >= {"terminated_ranks"}
    assert issubclass(ra.RankDiscarded, inprocess.exception.RestartError)
    order: list[str] = []

    class Named(ra.RankAssignment):  # type: ignore[misc]
        def __init__(self, name: str) -> None:
            self.name = name

        def __call__(self, ctx: Any) -> Any:
            order.append(self.name)
            return ctx

    ctx = types.SimpleNamespace(terminated_ranks=set())
    assert inprocess.Compose(Named("a"), Named("b"), Named("c"))(ctx) is ctx
    assert order == ["c", "b", "a"]  # so our full-world check, given last, runs first
    ra.ActivateAllRanks()
    ra.ShiftRanks()


def test_the_monitor_times_out_on_the_manual_timestamp_against_the_soft_timeout() -> None:
    """What `set_progress_deadline` relies on: the monitor process compares the Timestamp the watchdog
    sends (`manual` included) with its fixed soft timeout, and `CallWrapper.ping` sets `manual`."""
    from nvidia_resiliency_ext.inprocess import monitor_process, progress_watchdog

    stamp = progress_watchdog.Timestamp(auto=time.monotonic(), manual=time.monotonic() - 8.0)
    assert stamp.is_timed_out(datetime.timedelta(seconds=5))
    assert not stamp.is_timed_out(datetime.timedelta(seconds=10))
    assert "timestamp.is_timed_out(soft_timeout)" in _source(monitor_process.MonitorProcess.run)
    assert "timestamp.is_timed_out(hard_timeout)" in _source(monitor_process.MonitorProcess.run)
    assert "self.progress_watchdog.ping()" in _source(inprocess.CallWrapper.ping)
    ping, send = (
        _source(progress_watchdog.ProgressWatchdog.ping),
        _source(progress_watchdog.ProgressWatchdog.send),
    )
    assert "self.timestamp.manual = time.monotonic()" in ping
    assert "send_timestamp(self.timestamp)" in send  # the object itself: a shifted manual stays


def test_set_progress_deadline_times_out_after_the_budget_not_the_soft_timeout() -> None:
    from nvidia_resiliency_ext.inprocess import progress_watchdog

    sent: list[Any] = []
    watchdog = progress_watchdog.ProgressWatchdog(
        rank=0,
        monitor_process=types.SimpleNamespace(send_timestamp=sent.append),
        interval=datetime.timedelta(seconds=1),
    )
    call_wrapper = types.SimpleNamespace(progress_watchdog=watchdog)
    nvrx_patches.set_progress_deadline(call_wrapper, 0.2, soft_timeout_s=60.0)
    assert sent == [watchdog.timestamp]
    soft = datetime.timedelta(seconds=60)
    assert not watchdog.timestamp.is_timed_out(soft)
    time.sleep(0.3)
    assert watchdog.timestamp.is_timed_out(soft)
    nvrx_patches.set_progress_deadline(call_wrapper, 600.0, soft_timeout_s=60.0)  # capped at soft
    assert watchdog.timestamp.manual == pytest.approx(time.monotonic(), abs=0.05)


# --- log and error text --------------------------------------------------------------------------------
def test_a_store_poll_that_times_out_logs_lines_the_filter_drops(capfd: pytest.CaptureFixture[str]) -> None:
    """torch's c10d socket code logs each store poll timeout twice (as NVRx's 50 ms polls cause)."""
    server = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False, use_libuv=True)
    client = dist.TCPStore(
        "127.0.0.1",
        server.port,
        1,
        is_master=False,
        timeout=datetime.timedelta(milliseconds=50),
        use_libuv=True,
    )
    with pytest.raises(dist.DistError):  # DistStoreError: classify_exception's peer failure
        client.get("never-set")
    logged = [line for line in capfd.readouterr().err.splitlines() if "[c10d] waitForInput" in line]
    assert logged, "torch no longer logs store poll timeouts: log_filter drops nothing"
    assert all(nvrx_patches.STORE_POLL_TIMEOUT.search(line.encode()) for line in logged), logged


def test_the_lost_store_words_are_the_launchers_and_name_torchs_exception_classes() -> None:
    assert "Agent run ended with exception, e=" in _source(launcher)
    from torch.distributed.elastic.rendezvous import RendezvousConnectionError

    for cls in (dist.DistNetworkError, dist.DistStoreError, RendezvousConnectionError):
        line = f"Agent run ended with exception, e={cls.__name__}('store gone')".encode()
        assert nvrx_patches.LOST_STORE.search(line)
    assert issubclass(dist.DistNetworkError, dist.DistError) and issubclass(
        dist.DistStoreError, dist.DistError
    )


# --- CPython -------------------------------------------------------------------------------------------
def test_the_private_exit_steps_exist() -> None:
    assert callable(threading._shutdown)  # type: ignore[attr-defined]
    assert callable(atexit._run_exitfuncs)
