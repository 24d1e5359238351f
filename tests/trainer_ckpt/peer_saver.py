"""Two "pods" of RTJ_PEER_RANKS_PER_POD ranks each (default 1), every rank's memory snapshots
replicated to the other pod's replica server (rtj_trainer.peer_replica), to SIGKILL at random
moments (tests/trainer_ckpt/test_peer_replica.py).

`python peer_saver.py zygote <ram_dir> <port0> <port1> <memory_interval> <persist_interval> <step_s>`
imports torch once, then serves commands on stdin:
  "fork <n>" -> forks incarnation n: the ranks of pod 0, then those of pod 1 (pod = rank // ranks
                per pod), gloo over a FileStore of their own; prints their pids. Pod p's memory
                tier is <ram_dir>/pod-<p>/shm (its replica server, run by the test on port<p>,
                holds the other pod's replicas there); the persisted tier is <ram_dir>/persist.
                Each rank resumes with CheckpointManager.load_latest, exits 3 if what it loaded is
                not exactly its state of the loaded step, 5 if the ranks loaded different steps, 6
                when a collective fails because another rank died, 4 on any other error; appends
                {"n", "rank", "step", "source", "t"} to <ram_dir>/work/resumes.jsonl, then trains:
                steps resumed+1, ... forever, each taking at least <step_s> s, writing the step
                reached to <ram_dir>/work/step-<rank>; memory snapshots every <memory_interval>
                steps, persisted every <persist_interval>. The state of (step, rank) is a function
                of both.
  "reap"     -> waits for them, prints their wait statuses.
"""

from __future__ import annotations

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from ckpt_saver import State
from rtj_trainer.checkpoint import CheckpointManager
from snapshot_saver import fill, resume_checked, serve_forks

PER_POD = int(os.environ.get("RTJ_PEER_RANKS_PER_POD", "1"))
WORLD = 2 * PER_POD


def pod_of(rank: int) -> int:
    return rank // PER_POD


def pod_root(ram: str, pod: int) -> str:
    return os.path.join(ram, f"pod-{pod}", "shm")


def _rank(
    rank: int, n: int, ram: str, ports: list[int], mem_every: int, persist_every: int, step_s: float
) -> None:
    torch.set_num_threads(1)
    work = os.path.join(ram, "work")
    store = dist.FileStore(os.path.join(work, f"store-{n}"), WORLD)
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=20)
    )
    state = State()
    mgr = CheckpointManager(
        os.path.join(ram, "persist"),
        rank=rank,
        world_size=WORLD,
        interval_steps=persist_every,
        keep=2,
        local_root=pod_root(ram, pod_of(rank)),
        local_interval_steps=mem_every,
        local_keep=2,
        peer_endpoint=f"127.0.0.1:{ports[1 - pod_of(rank)]}",  # slot s replicates to slot s+1 mod 2
        replica_endpoint=f"127.0.0.1:{ports[pod_of(rank)]}",
    )
    step = resume_checked(mgr, state, rank, n, work)
    step_fd = os.open(os.path.join(work, f"step-{rank}"), os.O_WRONLY | os.O_CREAT)
    while True:
        t0 = time.monotonic()
        step += 1
        fill(state, step, rank)
        mgr.maybe_save(step, state)
        os.pwrite(step_fd, f"{step:010d}".encode(), 0)
        if step_s > 0:
            time.sleep(max(0.0, step_s - (time.monotonic() - t0)))


def zygote(ram: str, port0: str, port1: str, mem_every: str, persist_every: str, step_s: str) -> None:
    args = (ram, [int(port0), int(port1)], int(mem_every), int(persist_every), float(step_s))
    serve_forks(WORLD, lambda rank, n: _rank(rank, n, *args))


if __name__ == "__main__":
    zygote(*sys.argv[2:8])
