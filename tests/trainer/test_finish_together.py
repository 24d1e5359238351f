"""inprocess.finish_together with real processes and a real TCPStore: rank 0, which hosts the store
the other ranks use until they return, leaves only once every rank has counted itself finished (a
finished job failed when it left first, make demo 2026-12-02), never waits for a dead rank longer
than its bound, and a rank that finds the host gone returns without an error."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from rtj_local.procs import free_port

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(90)]

#: One rank: rank 0 hosts the store (as under ft_launcher), the others connect to it; each waits for
#: a line on stdin, sleeps `delay`, then finishes; prints when it began, returned and what it said.
RANK = """
import datetime, json, sys, time
import torch.distributed as dist
from rtj_trainer.inprocess import finish_together
from rtj_trainer.report import RankReporter
from rtj_trainer.runtime_env import RankEnv

rank, world, port = (int(a) for a in sys.argv[1:4])
delay, wait = (float(a) for a in sys.argv[4:6])
env = RankEnv.from_env({"RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1"})
timeout = datetime.timedelta(seconds=30)
store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout, wait_for_workers=False)
print(json.dumps({"ready": True}), flush=True)
sys.stdin.readline()
time.sleep(delay)
began = time.time()
ok = finish_together(env, store, RankReporter(None), wait_seconds=wait)
print(json.dumps({"began": began, "returned": time.time(), "ok": ok}), flush=True)
"""


def _start(rank: int, world: int, port: int, delay: float, wait: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", RANK, str(rank), str(world), str(port), str(delay), str(wait)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and json.loads(proc.stdout.readline())["ready"]
    return proc


def _go(*procs: subprocess.Popen[str]) -> None:
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()


def _result(proc: subprocess.Popen[str]) -> dict:
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    return json.loads(out.strip().splitlines()[-1])


def test_rank_0_leaves_only_after_every_rank_finished() -> None:
    port = free_port()
    host = _start(0, 3, port, delay=0.0, wait=30.0)
    late = [_start(r, 3, port, delay=1.0 + r, wait=30.0) for r in (1, 2)]
    _go(host, *late)
    first = _result(host)
    others = [_result(p) for p in late]
    assert first["ok"] and all(o["ok"] for o in others)
    slowest = max(o["began"] for o in others)
    assert first["returned"] >= slowest, (first, others)  # it waited for the last one (3 s after it began)
    assert first["began"] < slowest


def test_rank_0_waits_no_longer_than_its_bound_for_a_rank_that_never_finishes() -> None:
    port = free_port()
    host = _start(0, 2, port, delay=0.0, wait=1.5)  # rank 1 never comes
    _go(host)
    first = _result(host)
    assert first["ok"] is False
    assert 1.5 <= first["returned"] - first["began"] < 15.0


def test_a_rank_finishing_after_the_host_has_gone_returns_without_an_error() -> None:
    port = free_port()
    host = _start(0, 2, port, delay=0.0, wait=0.2)
    late = _start(1, 2, port, delay=0.0, wait=30.0)  # connected; it finishes after the host gave up
    _go(host)
    first = _result(host)
    assert first["ok"] is False
    _go(late)
    last = _result(late)
    assert last["ok"] is False and last["began"] > first["returned"]
