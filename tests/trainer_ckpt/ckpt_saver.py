"""A checkpoint writer to SIGKILL at random moments (tests/trainer_ckpt/test_checkpoint_crashes.py).

`python ckpt_saver.py zygote <root>` imports torch once, then serves commands on stdin:
  "fork"  -> forks a saver, prints its pid; the saver resumes from the last committed checkpoint
             (exit 3 if what it loaded is not exactly the state of that step), then saves steps
             resumed+1, +2, ... forever (interval 1, keep 2), each a deterministic function of the step;
  "reap"  -> waits for that saver and prints its wait status.
Forking from an imported interpreter keeps a kill/restart cycle well under a second.
"""

from __future__ import annotations

import hashlib
import os
import sys

import torch
from rtj_trainer.checkpoint import CheckpointManager

N = 1 << 20  # 4 MiB of fp32 + a bf16 tensor: a save spans several write calls


class State(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(N))
        self.b = torch.nn.Parameter(torch.zeros(3, 5, dtype=torch.bfloat16))

    def fill(self, step: int) -> None:
        with torch.no_grad():
            self.w.copy_(torch.arange(N, dtype=torch.float32) * 0.5 + step)
            self.b.fill_(float(step % 97))


def content_hash(module: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def expected_hash(step: int) -> str:
    m = State()
    m.fill(step)
    return content_hash(m)


def _saver(root: str) -> None:
    torch.set_num_threads(1)
    state = State()
    mgr = CheckpointManager(root, rank=0, world_size=1, interval_steps=1, keep=2)
    resumed = mgr.load_latest(state)
    step = resumed.step if resumed else 0
    if resumed and content_hash(state) != expected_hash(step):
        os._exit(3)
    while True:
        step += 1
        state.fill(step)
        mgr.save(step, state)
        mgr.wait()


def zygote(root: str) -> None:
    # Import and warm up what a save uses, so a forked saver starts saving at once.
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    warm = State()
    set_model_state_dict(warm, get_model_state_dict(warm))
    pid = 0
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "fork":
            pid = os.fork()
            if pid == 0:
                try:
                    _saver(root)
                finally:
                    os._exit(4)
            print(pid, flush=True)
        elif cmd == "reap":
            _, status = os.waitpid(pid, 0)
            print(status, flush=True)


if __name__ == "__main__":
    zygote(sys.argv[2])
