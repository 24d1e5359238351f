"""What the threads of a running benchmark wait on in the kernel, over time: every --interval seconds,
each thread's state (R running, S sleeping, D uninterruptible) and wait channel (the kernel function
it sleeps in, e.g. `balance_dirty_pages`, `jbd2_log_wait_commit`, `futex_wait_queue`) from /proc,
for the processes whose command line contains --match. A JSON line is written when a thread's
(state, wchan) changes, so a step that took 1 s instead of 0.18 s can be matched, by time, with
what the training thread was waiting on meanwhile.

    python bench/thread_states.py --match rank_forkserver --seconds 300 --out /tmp/threads.jsonl &

Each line: {"t": time.time(), "pid", "tid", "comm", "state", "wchan"}; a process's first line also
has "ppid" and "cmd". Only main threads (tid == pid) are followed in every state; other threads
only while in D (they say which kernel path a writer blocks in) and on their way out of it.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import TextIO


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:  # the thread or process is gone
        return None


def _stat(path: str) -> tuple[str, str, int] | None:
    """(comm, state, ppid) from a /proc stat file (comm may hold spaces and parentheses)."""
    raw = _read(path)
    if raw is None:
        return None
    comm = raw[raw.index("(") + 1 : raw.rindex(")")]
    fields = raw[raw.rindex(")") + 2 :].split()
    return comm, fields[0], int(fields[1])


def _matching(match: str) -> dict[int, str]:
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            cmd = _read(f"/proc/{name}/cmdline")
            if cmd and match in cmd and int(name) != os.getpid():
                found[int(name)] = cmd.replace("\0", " ").strip()
    return found


def _line(out: TextIO, **fields: object) -> None:
    out.write(json.dumps(fields) + "\n")


def _sample(out: TextIO, procs: dict[int, str], last: dict[int, tuple[str, str]]) -> None:
    """One look at every thread of `procs`; a line for each followed thread whose state changed."""
    t = round(time.time(), 4)
    for pid in list(procs):
        try:
            tids = [int(name) for name in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            del procs[pid]
            continue
        for tid in tids:
            st = _stat(f"/proc/{pid}/task/{tid}/stat")
            if st is None:
                continue
            comm, state, _ = st
            if tid != pid and state != "D" and last.get(tid, ("", ""))[0] != "D":
                continue
            wchan = (_read(f"/proc/{pid}/task/{tid}/wchan") or "") if state != "R" else ""
            if last.get(tid) != (state, wchan):
                last[tid] = (state, wchan)
                _line(out, t=t, pid=pid, tid=tid, comm=comm, state=state, wchan=wchan)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--match", required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--interval", type=float, default=0.005)
    p.add_argument("--rescan", type=float, default=0.5, help="seconds between looks for new processes")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    last: dict[int, tuple[str, str]] = {}
    procs: dict[int, str] = {}
    end = time.monotonic() + a.seconds
    next_scan = 0.0
    with open(a.out, "w", buffering=1 << 16) as out:
        while (now := time.monotonic()) < end:
            if now >= next_scan:
                for pid, cmd in _matching(a.match).items():
                    st = _stat(f"/proc/{pid}/stat") if pid not in procs else None
                    if st:
                        procs[pid] = cmd
                        _line(out, t=time.time(), pid=pid, ppid=st[2], cmd=cmd[:300])
                next_scan = now + a.rescan
            _sample(out, procs, last)
            time.sleep(max(0.0, a.interval - (time.monotonic() - now)))


if __name__ == "__main__":
    main()
