"""Two ranks saving memory snapshots (and persisting) as fast as they can, to SIGKILL at random
moments (tests/trainer_ckpt/test_snapshot_kills.py).

`python snapshot_saver.py zygote <local_root> <persist_root> <work_dir>` imports torch once, then
serves commands on stdin:
  "fork <n>" -> forks incarnation n: two rank processes (gloo over a FileStore of their own),
                prints "<pid0> <pid1>". Each rank resumes with CheckpointManager.load_latest
                (memory tier + persistent root), exits 3 if what it loaded is not exactly its
                state of the loaded step, exits 5 if the two ranks loaded different steps,
                exits 6 when a collective fails because the other rank died, 4 on any other error; appends
                {"n", "rank", "step", "source"} to <work_dir>/resumes.jsonl and, once ready to
                save (its staging prepared), {"n", "rank"} to <work_dir>/ready.jsonl, then saves steps
                resumed+1, +2, ... forever (memory every step, persist every 3rd, keep 2);
                the state of (step, rank) is a deterministic function of both.
                With RTJ_SNAPSHOT_DEVICE_STAGE=1 the ranks snapshot and load through the GPU
                staging path on its CPU stand-in (host_device.HostOps); with RTJ_SNAPSHOT_COPIER=1
                as well, the pod's slot copier (serving <local_root>) copies their drains and
                loads, and a rank exits 7 the moment it copies without it.
  "reap"     -> waits for both, prints their two wait statuses.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from ckpt_saver import State, content_hash
from host_device import HostOps, stage_on_host
from rtj_trainer.checkpoint import CheckpointManager

WORLD = 2
#: Exit code of a rank whose collective failed because the other rank was killed.
PEER_LOST = 6
#: Exit code of a rank that was to drain through the pod's slot copier and copies itself instead.
NO_COPIER = 7
#: The stage's chunks: 64 per 4 MiB snapshot, each a round trip to the slot copier. With 4 KiB
#: chunks (1,024 per snapshot) a snapshot took 0.4-0.6 s to commit on the 2-core machine, so most
#: incarnations were killed before their second commit and the run's progress was luck (30 kills
#: reached step 11 in 5 of 9 runs, 47-136 in the others).
STAGE_CHUNK_BYTES = 64 << 10


def _peer_lost(exc: BaseException) -> bool:
    text = str(exc)
    return isinstance(exc, dist.DistError) or any(
        m in text for m in ("Connection reset", "Connection closed", "gloo", "Timed out")
    )


def fill(state: State, step: int, rank: int) -> None:
    state.fill(step * 10 + rank)


def expected_hash(step: int, rank: int) -> str:
    m = State()
    fill(m, step, rank)
    return content_hash(m)


def _rank(rank: int, n: int, local_root: str, persist_root: str, work: str) -> None:
    torch.set_num_threads(1)
    store = dist.FileStore(os.path.join(work, f"store-{n}"), WORLD)
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=20)
    )
    state = State()
    mgr = CheckpointManager(
        persist_root,
        rank=rank,
        world_size=WORLD,
        interval_steps=3,
        keep=2,
        local_root=local_root,
        local_interval_steps=1,
        local_keep=2,
        # The threaded memory-tier writer (pwrite at offsets: a kill leaves holes, not a shorter file).
        local_write_threads=int(os.environ.get("RTJ_SNAPSHOT_WRITE_THREADS", "1")),
    )
    # The GPU staging path (stage, drain into the slot, load through the stage) on its stand-in.
    staged = os.environ.get("RTJ_SNAPSHOT_DEVICE_STAGE") == "1"
    stage = stage_on_host(mgr, HostOps(), chunk_bytes=STAGE_CHUNK_BYTES) if staged else None
    step = resume_checked(mgr, state, rank, n, work)
    if stage is not None:
        mgr.prepare(state)
        deadline = time.monotonic() + 60
        while mgr.preparing and time.monotonic() < deadline:
            time.sleep(0.001)
        if stage.flat is None:  # not prepared in time, or no buffer kept: the case would test nothing
            os._exit(4)
    append_record(work, "ready.jsonl", {"n": n, "rank": rank})
    by_copier = os.environ.get("RTJ_SNAPSHOT_COPIER") == "1"
    while True:
        step += 1
        fill(state, step, rank)
        mgr.maybe_save(step, state)
        if by_copier and not mgr.drained_by_copier:  # the case would test the rank's own copies
            os._exit(NO_COPIER)


def resume_checked(mgr: CheckpointManager, state: State, rank: int, n: int, work: str) -> int:
    """load_latest, then the checks the kill tests count on: the loaded state is exactly the step's
    (exit 3 if not) and every rank resumed at the same step (exit 5 if not); the resume is appended
    to <work>/resumes.jsonl with the time it ended. Returns the step."""
    resumed = mgr.load_latest(state)
    step = resumed.step if resumed else 0
    if resumed and content_hash(state) != expected_hash(step, rank):
        os._exit(3)
    t = torch.tensor([step, -step], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    if int(t[0]) != -int(t[1]):
        os._exit(5)
    source = resumed.source if resumed else None
    rec = {"n": n, "rank": rank, "step": step, "source": source, "t": time.time()}
    append_record(work, "resumes.jsonl", rec)
    return step


def append_record(work: str, name: str, rec: dict) -> None:
    """One JSON line appended to <work>/<name> in one write (both ranks append to the same file)."""
    fd = os.open(os.path.join(work, name), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, (json.dumps(rec) + "\n").encode())
    os.close(fd)


def serve_forks(world: int, run_rank: Callable[[int, int], None]) -> None:
    """The zygote's loop: torch imported and a state built once, then per stdin line `fork N` forks
    `world` ranks of incarnation N (`run_rank(rank, N)`; the exit code carries the outcome) and
    prints their pids, and `reap` waits for them and prints their wait statuses."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    warm = State()
    set_model_state_dict(warm, get_model_state_dict(warm))
    pids: list[int] = []
    for line in sys.stdin:
        cmd, *rest = line.split()
        if cmd == "fork":
            n = int(rest[0])
            pids = []
            for rank in range(world):
                pid = os.fork()
                if pid == 0:
                    code = 4
                    try:
                        run_rank(rank, n)
                    except BaseException as e:  # the exit code carries the outcome
                        code = PEER_LOST if _peer_lost(e) else 4
                        print(f"rank {rank} of incarnation {n}: {e!r}", file=sys.stderr, flush=True)
                    finally:
                        os._exit(code)
                pids.append(pid)
            print(*pids, flush=True)
        elif cmd == "reap":
            print(*(os.waitpid(pid, 0)[1] for pid in pids), flush=True)


def zygote(local_root: str, persist_root: str, work: str) -> None:
    serve_forks(WORLD, lambda rank, n: _rank(rank, n, local_root, persist_root, work))


if __name__ == "__main__":
    zygote(*sys.argv[2:5])
