"""NVRx's rendezvous with 8 -> 64 -> 512 launchers: the first round, and the round after one pod is replaced.

    .venv/bin/python bench/rendezvous_scale.py --sizes 8,64,512 [--runs 1] [--procs 4] [--cycles 4] \\
        [--out bench/results/2026-12-03-rendezvous-scale.json]

The store host is the product's: `rendezvous_host.run_control_plane` with the command line
`control_plane_command` gives the rendezvous pod (NVRx's `nvrx-control`, its sleeps capped at 0.1 s),
in its own process. Each launcher is one thread running NVRx's own handler, made the way ft_launcher
makes it (`launcher._register_ft_rdzv_handler`, then torch's `rendezvous_handler_registry` with
`is_host=false`: its own TCPStore client, `FtRendezvousBarrierHandler`, `set_agent`, the product's
`nvrx_patches` of launcher_main): `next_rendezvous()` for a round, then the HEALTHY branch of
ft_launcher's monitor loop (`is_next_round_open()` every `--monitor-interval`, 0.5 s as the product
passes). `--procs` processes host the threads (N / procs each). Left out compared to a real launcher:
worker processes and their stop/start, rank monitors, the rank -> launcher IPC socket, the progress
tracker, the log funnel, the agent's own store use after the rendezvous (none with
TORCH_ELASTIC_WORKER_IDENTICAL=1, NVRx's default).

Per size: (a) the first round, every launcher joining at once; (b) `--cycles` losses: one launcher
stops dead (no leave; its connection stays open, like a node that died) and a new one (new handler,
new store client, round synced from the store as a new pod's ft_launcher does) takes its place. The
round is opened by one survivor, as the launcher whose workers failed does (`open_rendezvous`, then a
new rendezvous); the others notice in their monitor loop. Two orders alternate:
- `last`: the survivors re-join first and the replacement joins once N-1 have joined (the usual order:
  a new pod takes seconds to be created and start); the round's cost is replacement join -> all ranks.
- `first`: the replacement is up and waiting before the round opens (e.g. a promoted hot spare); the
  open comes `--detect-delay` s after the loss.
Store ops are counted in Python around each client (the host's and every launcher's protocol calls;
the 2 rank-0 sets and 2 gets per launcher of torch's RendezvousStoreInfo are not counted). Printed:
one JSON line per size and a summary with power-law exponents (round time ~ N^k).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import json
import logging
import math
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # trainer_pods.trainer_config: a valid TrainerConfig

HOST_CHILD = "--host-child"
WORKER_CHILD = "--worker-child"
RUN_ID = "bench-rdzv"
BARRIER_PREFIX = f"ft_rendezvous_barrier:{RUN_ID}"


# --- store op counting (both children) --------------------------------------------------------------
class CountingStore:
    """A c10d store seen through NVRx's barrier state, each call counted by method name."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.counts: collections.Counter[str] = collections.Counter()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr
        counts = self.counts

        def counted(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return attr(*args, **kwargs)

        return counted


#: Every CountingStore made by `count_barrier_store_ops`, in order.
COUNTED: list[CountingStore] = []


def count_barrier_store_ops() -> None:
    """`_RendezvousBarrierState` gets its store wrapped in a CountingStore (the handler's PrefixStore
    for torch's agent keeps the plain store)."""
    from nvidia_resiliency_ext.fault_tolerance.ft_rendezvous_barrier import _RendezvousBarrierState

    init = _RendezvousBarrierState.__init__

    def counting_init(self: Any, store: Any, *args: Any, **kwargs: Any) -> None:
        COUNTED.append(CountingStore(store))
        init(self, COUNTED[-1], *args, **kwargs)

    _RendezvousBarrierState.__init__ = counting_init  # type: ignore[method-assign]


# --- the store host (child process) -----------------------------------------------------------------
def host_child(count_file: str, argv: list[str]) -> None:
    """The rendezvous pod's `run_control_plane(argv)`, its store ops written to `count_file` on SIGUSR1."""
    from rtj_trainer import rendezvous_host

    count_barrier_store_ops()  # the control loop's one barrier state (runpy runs a fresh module copy)
    seq = [0]

    def dump(_sig: int, _frame: object) -> None:
        seq[0] += 1
        ops: collections.Counter[str] = collections.Counter()
        for store in COUNTED:
            ops.update(store.counts)
        tmp = count_file + ".tmp"
        Path(tmp).write_text(json.dumps({"seq": seq[0], "ops": dict(ops)}))
        os.replace(tmp, count_file)

    signal.signal(signal.SIGUSR1, dump)
    rendezvous_host.run_control_plane(argv)


# --- simulated launchers (child process) ------------------------------------------------------------
class Launcher:
    """One simulated ft_launcher: NVRx's handler for its pod, and the thread that runs its rounds."""

    def __init__(self, lid: int, handler: Any, store: CountingStore, out: Emitter, interval: float) -> None:
        self.lid, self.handler, self.store, self.out, self.interval = lid, handler, store, out, interval
        self.wake = threading.Event()
        self.killed = False
        self.fail = False

    def run(self) -> None:
        try:
            self._rounds()
        except BaseException as exc:
            self.out.emit(ev="error", id=self.lid, error=repr(exc))
            raise

    def _rounds(self) -> None:
        while True:
            ops0 = sum(self.store.counts.values())
            t_join = time.monotonic()
            info = self.handler.next_rendezvous()
            t_done = time.monotonic()
            rank = info.rank if hasattr(info, "rank") else info[1]
            self.out.emit(
                ev="rank", id=self.lid, round=self.handler.round(), rank=rank, t_join=t_join,
                t_done=t_done, ops=sum(self.store.counts.values()) - ops0,
            )  # fmt: skip
            # ft_launcher's monitor loop, HEALTHY branch: sleep, then has a peer opened the next round?
            while True:
                self.wake.wait(self.interval)
                if self.killed:
                    return  # a dead pod: no leave, no shutdown, nothing more on the store
                if self.fail:  # this launcher's workers failed: it opens the next round (NVRx)
                    self.fail = False
                    self.wake.clear()
                    self.handler._barrier_state.open_rendezvous()
                    self.out.emit(ev="open", id=self.lid, t=time.monotonic())
                    break
                if self.handler.is_next_round_open():
                    self.out.emit(ev="notice", id=self.lid, t=time.monotonic())
                    break


class Emitter:
    """JSON lines on stdout, one writer at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def emit(self, **fields: Any) -> None:
        line = json.dumps(fields)
        with self._lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()


def worker_child() -> None:
    """Hosts simulated launchers; commands (JSON lines) on stdin, events on stdout."""
    logging.disable(logging.WARNING)  # NVRx's per-join info and "GPU checks disabled" lines
    from nvidia_resiliency_ext.fault_tolerance import ft_rendezvous_barrier, ipc_connector, launcher
    from rtj_trainer import nvrx_patches
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous import registry as rdzv_registry

    # As launcher_main runs ft_launcher (apply_group_termination concerns worker processes: none here).
    nvrx_patches.apply_keep_rendezvous_open()
    nvrx_patches.apply_sync_before_rendezvous_wait()
    launcher._register_ft_rdzv_handler()
    count_barrier_store_ops()
    # The ranks' IPC channel to their launcher: there are no ranks (and one socket path per process).
    ipc_connector.IpcConnector.start_receiving = lambda self: None  # type: ignore[method-assign]
    # next_rendezvous turns SIGTERM into an exception for the process's one launcher (main thread only).
    ft_rendezvous_barrier._install_rdzv_signal_handlers = dict
    ft_rendezvous_barrier._restore_rdzv_signal_handlers = lambda prev: None
    out = Emitter()
    launchers: dict[int, Launcher] = {}
    agent = SimpleNamespace(_progress_tracker=SimpleNamespace(sync_cycle_number=lambda n: None))
    cfg: dict[str, Any] = {}

    def make(lid: int) -> Launcher:
        params = RendezvousParameters(
            backend="c10d", endpoint=f"127.0.0.1:{cfg['port']}", run_id=RUN_ID, min_nodes=cfg["n"],
            max_nodes=cfg["n"], local_addr=f"10.{lid >> 16 & 255}.{lid >> 8 & 255}.{lid & 255}",
            is_host="false",
        )  # fmt: skip
        params.config["is_store_host"] = False  # as launch_agent adds them
        params.config["nproc_per_node"] = 1
        handler = rdzv_registry.get_rendezvous_handler(params)
        handler.set_worker_group(SimpleNamespace(spec=SimpleNamespace(local_world_size=1)))
        handler.set_agent(agent)  # LocalElasticAgent does: syncs the round from the store
        lau = Launcher(lid, handler, handler._barrier_state.store, out, cfg["interval"])
        launchers[lid] = lau
        return lau

    def start(lau: Launcher) -> None:
        threading.Thread(target=lau.run, daemon=True, name=f"launcher-{lau.lid}").start()

    for line in sys.stdin:
        msg = json.loads(line)
        cmd = msg["cmd"]
        if cmd == "init":
            cfg.update(msg)
            for lid in msg["ids"]:
                make(lid)
            out.emit(ev="ready")
        elif cmd == "go":
            for lau in list(launchers.values()):
                start(lau)
        elif cmd == "kill":
            lau = launchers.pop(msg["id"])
            lau.killed = True
            lau.wake.set()
        elif cmd == "fail":
            lau = launchers[msg["id"]]
            lau.fail = True
            lau.wake.set()
        elif cmd == "spawn":
            t0 = time.monotonic()
            lau = make(msg["id"])
            out.emit(ev="spawned", id=msg["id"], t_create=t0, t=time.monotonic())
            start(lau)
        elif cmd == "ops":
            total: collections.Counter[str] = collections.Counter()
            for store in COUNTED:
                total.update(store.counts)
            out.emit(ev="ops", ops=dict(total))
        elif cmd == "stop":
            break
    sys.stdout.flush()
    os._exit(0)  # threads blocked in store calls are not joined


# --- the orchestrator -------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env() -> dict[str, str]:
    path = os.pathsep.join(
        [str(ROOT / "trainer-image"), str(ROOT / "operator"), os.environ.get("PYTHONPATH", "")]
    )
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


class Worker:
    """One child process of simulated launchers; its events read by a thread into a shared queue."""

    def __init__(self, idx: int, events: list[tuple[int, dict[str, Any]]], cond: threading.Condition) -> None:
        self.idx = idx
        self.proc = subprocess.Popen(
            [sys.executable, __file__, WORKER_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, env=child_env(), bufsize=1,
        )  # fmt: skip
        self._events, self._cond = events, cond
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self._events.append((self.idx, json.loads(line)))
                self._cond.notify_all()

    def send(self, **msg: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()


class Host:
    """The store host process: its CPU time and its counted store ops."""

    def __init__(self, n: int, port: int, tmp: Path) -> None:
        from rtj.contract import TrainerConfig
        from rtj_trainer.rendezvous_host import control_plane_command
        from trainer_pods import trainer_config

        cfg = TrainerConfig.model_validate(
            trainer_config("bench", ["true"], [], port, tmp, nnodes=n, rdzvId=RUN_ID)
        )
        argv = control_plane_command(cfg, host="127.0.0.1", port=port)[3:]  # after `python -m module`
        self.count_file = str(tmp / f"host-ops-{n}.json")
        self.log = open(tmp / f"host-{n}.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, __file__, HOST_CHILD, self.count_file, *argv],
            stdout=self.log, stderr=subprocess.STDOUT, env=child_env(),
        )  # fmt: skip
        self.seq = 0
        import psutil

        self.ps = psutil.Process(self.proc.pid)

    def cpu(self) -> float:
        t = self.ps.cpu_times()
        return float(t.user + t.system)

    def ops(self) -> dict[str, int]:
        self.seq += 1
        self.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                data = json.loads(Path(self.count_file).read_text())
                if data["seq"] >= self.seq:
                    return {k: int(v) for k, v in data["ops"].items()}
            time.sleep(0.02)
        raise TimeoutError("the store host did not report its ops")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def wait_port(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.1)
    raise TimeoutError(f"no store host on port {port}")


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def diff(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: b.get(k, 0) - a.get(k, 0) for k in sorted(set(a) | set(b)) if b.get(k, 0) - a.get(k, 0)}


def run_size(n: int, a: argparse.Namespace, tmp: Path, rng: random.Random) -> dict[str, Any]:
    import psutil
    from torch.distributed import TCPStore

    port = free_port()
    host = Host(n, port, tmp)
    events: list[tuple[int, dict[str, Any]]] = []
    cond = threading.Condition()
    procs = max(1, min(a.procs, n))
    workers: list[Worker] = []
    seen = [0]

    def take(pred: Any, count: int, timeout: float) -> list[dict[str, Any]]:
        """Wait for `count` new events matching pred (events are consumed in order)."""
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        with cond:
            while True:
                while seen[0] < len(events):
                    _, ev = events[seen[0]]
                    seen[0] += 1
                    if ev["ev"] == "error":
                        raise RuntimeError(f"N={n}: launcher {ev['id']} failed: {ev['error']}")
                    if pred(ev):
                        got.append(ev)
                    else:
                        pending.append(ev)
                if len(got) >= count:
                    return got
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"N={n}: {len(got)}/{count} events after {timeout} s")
                cond.wait(left)

    from rtj_trainer.entrypoint import monitor_interval_seconds

    interval = a.monitor_interval if a.monitor_interval is not None else monitor_interval_seconds(n)
    pending: list[dict[str, Any]] = []
    try:
        wait_port(port)
        owner: dict[int, int] = {}
        for i in range(procs):
            workers.append(Worker(i, events, cond))
        for i, w in enumerate(workers):
            ids = list(range(i, n, procs))
            owner.update({lid: i for lid in ids})
            w.send(cmd="init", port=port, n=n, ids=ids, interval=interval)
        take(lambda e: e["ev"] == "ready", procs, 300)
        client_ps = [psutil.Process(w.proc.pid) for w in workers]

        def client_cpu() -> float:
            return sum(float(t.user + t.system) for t in (p.cpu_times() for p in client_ps))

        # (a) the first round: every launcher joins at once.
        ops0, cpu0, ccpu0 = host.ops(), host.cpu(), client_cpu()
        for w in workers:
            w.send(cmd="go")
        ranks = take(lambda e: e["ev"] == "rank", n, a.timeout)
        ops1, cpu1, ccpu1 = host.ops(), host.cpu(), client_cpu()
        assert sorted(r["rank"] for r in ranks) == list(range(n)), "ranks are not 0..N-1"
        assert len({r["round"] for r in ranks}) == 1
        rank_of = {r["id"]: r["rank"] for r in ranks}
        first_join = min(r["t_join"] for r in ranks)
        last_join = max(r["t_join"] for r in ranks)
        done = max(r["t_done"] for r in ranks)
        lat = [r["t_done"] - r["t_join"] for r in ranks]
        first = {
            "first_join_to_all_ranks_s": round(done - first_join, 3),
            "last_join_to_all_ranks_s": round(done - last_join, 3),
            "join_latency_p50_s": round(pct(lat, 0.5), 3),
            "join_latency_p99_s": round(pct(lat, 0.99), 3),
            "joins_spread_s": round(last_join - first_join, 3),
            "host_cpu_s": round(cpu1 - cpu0, 3),
            "launchers_cpu_s": round(ccpu1 - ccpu0, 3),
            "host_ops": diff(ops0, ops1),
            "launcher_ops": sum(r["ops"] for r in ranks),
        }

        def launcher_ops() -> dict[str, int]:
            for w in workers:
                w.send(cmd="ops")
            total: collections.Counter[str] = collections.Counter()
            for e in take(lambda e: e["ev"] == "ops", procs, 60):
                total.update(e["ops"])
            return dict(total)

        # Steady state between rounds ("training"): the host's polls and the monitor loops'.
        cpu_q0, ops_q0, lops_q0 = host.cpu(), host.ops(), launcher_ops()
        t_q0 = time.monotonic()
        time.sleep(a.quiet)
        lops_q1 = launcher_ops()
        dt = time.monotonic() - t_q0
        steady = {
            "host_cores": round((host.cpu() - cpu_q0) / dt, 4),
            "host_ops_per_s": round(sum(diff(ops_q0, host.ops()).values()) / dt, 1),
            "launcher_ops_per_s": round(sum(diff(lops_q0, lops_q1).values()) / dt, 1),
            "seconds": round(dt, 2),
        }

        poll = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60))
        live = set(rank_of)
        next_id = n
        cycles: list[dict[str, Any]] = []
        rnd = ranks[0]["round"]
        for c in range(a.cycles):
            order = "last" if c % 2 == 0 else "first"
            victim, detector = rng.sample(sorted(live), 2)
            new_id, next_id = next_id, next_id + 1
            wv = workers[owner[victim]]
            ops_c0, cpu_c0, ccpu_c0 = host.ops(), host.cpu(), client_cpu()
            t_loss = time.monotonic()
            wv.send(cmd="kill", id=victim)
            live.discard(victim)
            if order == "last":
                workers[owner[detector]].send(cmd="fail", id=detector)
                key = f"{BARRIER_PREFIX}:join_count_{rnd + 1}"
                deadline = time.monotonic() + a.timeout
                while not (poll.check([key]) and int(poll.get(key)) >= n - 1):
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"N={n}: survivors did not re-join")
                    time.sleep(0.02)
                wv.send(cmd="spawn", id=new_id)
            else:
                wv.send(cmd="spawn", id=new_id)
                time.sleep(a.detect_delay)
                workers[owner[detector]].send(cmd="fail", id=detector)
            owner[new_id] = owner[victim]
            live.add(new_id)
            got = take(lambda e: e["ev"] == "rank", n, a.timeout)
            ops_c1, cpu_c1, ccpu_c1 = host.ops(), host.cpu(), client_cpu()
            others = pending[:]
            pending.clear()
            opened = next(e["t"] for e in others if e["ev"] == "open")
            notices = [e["t"] - opened for e in others if e["ev"] == "notice"]
            spawned = next(e for e in others if e["ev"] == "spawned")
            assert sorted(r["rank"] for r in got) == list(range(n)), "ranks are not 0..N-1"
            assert {r["id"] for r in got} == live and len({r["round"] for r in got}) == 1
            rnd = got[0]["round"]
            rep = next(r for r in got if r["id"] == new_id)
            done = max(r["t_done"] for r in got)
            lat = [r["t_done"] - r["t_join"] for r in got]
            cycles.append(
                {
                    "order": order,
                    "round": rnd,
                    "loss_to_all_ranks_s": round(done - t_loss, 3),
                    "open_to_all_ranks_s": round(done - opened, 3),
                    "replacement_join_to_all_ranks_s": round(done - rep["t_join"], 3),
                    "last_join_to_all_ranks_s": round(done - max(r["t_join"] for r in got), 3),
                    "survivors_notice_p50_s": round(pct(notices, 0.5), 3) if notices else None,
                    "survivors_notice_max_s": round(max(notices), 3) if notices else None,
                    "replacement_create_s": round(spawned["t"] - spawned["t_create"], 3),
                    "join_latency_p50_s": round(pct(lat, 0.5), 3),
                    "join_latency_p99_s": round(pct(lat, 0.99), 3),
                    "host_cpu_s": round(cpu_c1 - cpu_c0, 3),
                    "launchers_cpu_s": round(ccpu_c1 - ccpu_c0, 3),
                    "host_ops": diff(ops_c0, ops_c1),
                    "launcher_ops_in_rendezvous": sum(r["ops"] for r in got),
                }
            )
            print(f"  N={n} cycle {c} ({order}): {json.dumps(cycles[-1])}", flush=True)
            time.sleep(a.settle)
        return {"n": n, "procs": procs, "first_round": first, "steady": steady, "replacements": cycles}
    finally:
        for w in workers:
            with contextlib.suppress(Exception):
                w.send(cmd="stop")
        for w in workers:
            try:
                w.proc.wait(10)
            except subprocess.TimeoutExpired:
                w.proc.kill()
        host.stop()


def exponent(sizes: list[int], ys: list[float]) -> float | None:
    """Least-squares slope of log y on log N (y ~ N^k)."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(sizes, ys, strict=True) if y > 0]
    if len(pts) < 2:
        return None
    mx = statistics.fmean(p[0] for p in pts)
    my = statistics.fmean(p[1] for p in pts)
    den = sum((p[0] - mx) ** 2 for p in pts)
    return round(sum((p[0] - mx) * (p[1] - my) for p in pts) / den, 2) if den else None


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per size, the median over its runs (first rounds) and over its cycles of each order; the
    exponent k of a power-law fit y ~ N^k over the sizes (k ~ 0: fixed waits, 1: linear, 2: quadratic)."""
    sizes = sorted({r["n"] for r in rows})

    def first(n: int, key: str) -> float:
        return round(statistics.median(r["first_round"][key] for r in rows if r["n"] == n), 3)

    def cyc(n: int, order: str, key: str) -> float:
        xs = [c[key] for r in rows if r["n"] == n for c in r["replacements"] if c["order"] == order]
        xs = [x for x in xs if x is not None]
        return round(statistics.median(xs), 3) if xs else float("nan")

    def steady(n: int, key: str) -> float:
        return round(statistics.median(r["steady"][key] for r in rows if r["n"] == n), 4)

    table: dict[str, list[float]] = {
        "first_round_first_join_to_all_s": [first(n, "first_join_to_all_ranks_s") for n in sizes],
        "first_round_last_join_to_all_s": [first(n, "last_join_to_all_ranks_s") for n in sizes],
        "first_round_join_p50_s": [first(n, "join_latency_p50_s") for n in sizes],
        "first_round_join_p99_s": [first(n, "join_latency_p99_s") for n in sizes],
        "first_round_host_cpu_s": [first(n, "host_cpu_s") for n in sizes],
        "last_replacement_join_to_all_s": [cyc(n, "last", "replacement_join_to_all_ranks_s") for n in sizes],
        "last_loss_to_all_s": [cyc(n, "last", "loss_to_all_ranks_s") for n in sizes],
        "last_host_cpu_s": [cyc(n, "last", "host_cpu_s") for n in sizes],
        "last_launcher_ops": [cyc(n, "last", "launcher_ops_in_rendezvous") for n in sizes],
        "first_open_to_all_s": [cyc(n, "first", "open_to_all_ranks_s") for n in sizes],
        "survivors_notice_max_s": [cyc(n, "last", "survivors_notice_max_s") for n in sizes],
        "steady_host_cores": [steady(n, "host_cores") for n in sizes],
        "steady_launcher_ops_per_s": [steady(n, "launcher_ops_per_s") for n in sizes],
    }
    return {
        "sizes": sizes,
        "runs": {n: sum(r["n"] == n for r in rows) for n in sizes},
        "medians": table,
        "exponent_k_of_N": {k: exponent(sizes, v) for k, v in table.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="8,64,512", help="numbers of launchers, comma-separated")
    parser.add_argument("--procs", type=int, default=4, help="processes hosting the launcher threads")
    parser.add_argument("--runs", type=int, default=1, help="runs per size (each: a new host, a first round)")
    parser.add_argument("--cycles", type=int, default=4, help="loss + replacement cycles per size")
    parser.add_argument(
        "--monitor-interval",
        type=float,
        default=None,
        help="ft_launcher --monitor-interval (default: the product's for each size)",
    )
    parser.add_argument("--detect-delay", type=float, default=1.5, help="order `first`: loss -> round opened")
    parser.add_argument("--quiet", type=float, default=3.0, help="seconds of steady state measured")
    parser.add_argument("--settle", type=float, default=1.0, help="seconds between cycles")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    a = parser.parse_args()
    rng = random.Random(a.seed)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for n in (int(s) for s in a.sizes.split(",")):
            for run in range(a.runs):
                t0 = time.monotonic()
                row = {"run": run, **run_size(n, a, Path(d), rng)}
                row["wall_s"] = round(time.monotonic() - t0, 1)
                rows.append(row)
                print(json.dumps(row), flush=True)
    result = {"rows": rows, "summary": summarize(rows), "args": {k: str(v) for k, v in vars(a).items()}}
    print(json.dumps(result["summary"]), flush=True)
    if a.out:
        a.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == HOST_CHILD:
        host_child(sys.argv[2], sys.argv[3:])
    elif len(sys.argv) > 1 and sys.argv[1] == WORKER_CHILD:
        worker_child()
    else:
        main()
