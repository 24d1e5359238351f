"""A rank that a pod's SIGTERM stops (tests/trainer_ckpt/test_emergency_deadline.py).

`python stop_saver.py <status_dir> <persist_root> <memory_root> <write_bytes_per_s> <peer endpoint|->
[<peer stop file>]` trains one rank (no process group): steps 1, 2, ... each a deterministic state
(`ckpt_saver.State`), a memory snapshot every 2 steps, nothing persisted before the stop; persistence
throttled to `write_bytes_per_s` (0: not throttled); each memory snapshot replicated to the peer when
one is given. It prints "ready" once a snapshot is committed. Then it stops through
`GracefulStop.save_and_exit`, as the integrations do (its "stopped" record printed as one JSON
line, exit TERMINATED), either
- after SIGTERM (the test marks the pod's stop in `status_dir`, as the entrypoint does): its own
  pod is stopping, so it hands the persist to the entrypoint; or
- once `<peer stop file>` (what `write_graceful_stop` writes, elsewhere) appears: the stop another
  pod's rank got, with that pod's deadline, as `GracefulStop.agreed` tells the ranks of a pod that
  got no signal; it persists in the rank.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
from ckpt_saver import State
from rtj_trainer.checkpoint import CheckpointManager
from rtj_trainer.graceful import GracefulStop
from rtj_trainer.runtime_env import stop_deadline

MEMORY_INTERVAL = 2


def main(
    status_dir: str,
    persist: str,
    memory: str,
    write_bytes_per_s: str,
    peer: str = "-",
    peer_stop: str | None = None,
) -> None:
    torch.set_num_threads(1)
    stop = GracefulStop.install(status_dir=status_dir)
    mgr = CheckpointManager(
        persist,
        rank=0,
        world_size=1,
        interval_steps=1_000_000,
        write_bytes_per_s=float(write_bytes_per_s) or None,
        local_root=memory,
        local_interval_steps=MEMORY_INTERVAL,
        peer_endpoint=None if peer == "-" else peer,
    )
    state = State()
    step, ready = 0, False
    while True:
        step += 1
        state.fill(step)
        mgr.maybe_save(step, state)
        if not ready and mgr.last_local is not None:
            print("ready", flush=True)
            ready = True
        stopping = stop.agreed()
        if not stopping and peer_stop is not None and os.path.exists(peer_stop):
            with open(peer_stop) as f:
                stop.deadline = stop_deadline(f.read())  # what `agreed` sets from the peer pod's
            stopping = True
        if stopping:
            stop.save_and_exit(mgr, step, state, None, log=lambda **rec: print(json.dumps(rec), flush=True))
        time.sleep(0.01)


if __name__ == "__main__":
    main(*sys.argv[1:])
