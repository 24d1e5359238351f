"""How a rank process ended, as the rank forkserver that reaped it recorded it for the pod's
heartbeat agent: `rank-<LOCAL_RANK>.exit` in the pod's status dir (the newest end of that local
rank), written before the rank is reaped, so whoever sees its pid gone finds the record. A SIGKILLed
rank reports nothing itself; this says how it ended (`heartbeat.exit_fault`).

Not imported by the forkserver's client, which stays stdlib-only; the server imports it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from dataclasses import dataclass

from rtj.contract import ENV_STATUS_DIR, RANK_FILE_PREFIX

from .report import write_atomic

EXIT_FILE_SUFFIX = ".exit"


@dataclass(frozen=True)
class RankExit:
    pid: int
    #: The signal that killed it, else None and `code` is its exit code.
    signal: int | None
    code: int | None
    #: time.time() when it was reaped.
    time: float

    def describe(self) -> str:
        if self.signal is not None:
            with contextlib.suppress(ValueError):
                return f"killed by {signal.Signals(self.signal).name}"
            return f"killed by signal {self.signal}"
        return f"exited with code {self.code}"


def exit_file(status_dir: str, local_rank: int) -> str:
    return os.path.join(status_dir, f"{RANK_FILE_PREFIX}{local_rank}{EXIT_FILE_SUFFIX}")


def exit_path(env: dict[str, str]) -> str | None:
    """Where the end of the rank started with `env` is recorded; None outside the trainer runtime."""
    status_dir, local_rank = env.get(ENV_STATUS_DIR), env.get("LOCAL_RANK", "")
    return exit_file(status_dir, int(local_rank)) if status_dir and local_rank.isdigit() else None


def record_exit(path: str | None, info: os.waitid_result) -> None:
    """`info`: the rank's os.waitid() result, taken with WNOWAIT (the rank is not reaped yet)."""
    if path is None:
        return
    killed = info.si_code in (os.CLD_KILLED, os.CLD_DUMPED)
    record = {
        "pid": info.si_pid,
        "signal": info.si_status if killed else None,
        "code": None if killed else info.si_status,
        "time": time.time(),
    }
    with contextlib.suppress(OSError):  # the status dir is gone (the pod is ending): nobody reads it
        write_atomic(path, json.dumps(record))


def read_exit(status_dir: str, local_rank: int, pid: int) -> RankExit | None:
    """How the rank process `pid` of `local_rank` ended; None if its server did not record it (no
    server, or the rank was not its child)."""
    try:
        with open(exit_file(status_dir, local_rank), encoding="utf-8") as f:
            data = json.load(f)
        got = RankExit(int(data["pid"]), data.get("signal"), data.get("code"), float(data["time"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return got if got.pid == pid else None
