"""What the threads of a running benchmark wait on in the kernel, over time: every --interval seconds,
each thread's state (R running, S sleeping, D uninterruptible) and wait channel (the kernel function
it sleeps in, e.g. `balance_dirty_pages`, `jbd2_log_wait_commit`, `futex_wait_queue`) from /proc,
for the processes whose command line contains --match. A JSON line is written when a thread's
(state, wchan) changes, so a step that took 1 s instead of 0.18 s can be matched, by time, with
what the training thread was waiting on meanwhile.

    python bench/thread_states.py record --match rtj_trainer --seconds 300 --out /tmp/threads.jsonl &
    python bench/thread_states.py report --threads /tmp/threads.jsonl --steps rank-0.jsonl

`report`: the rank processes' main threads (processes forked by the rank forkserver, or running
fsdp_train) over the step log's steps: where the seconds between steps and in the slowest steps
went, by (state, wchan), and the total over the run.

Each line: {"t": time.time(), "pid", "tid", "comm", "state", "wchan"}; a process's first line also
has "ppid" and "cmd". Every --meminfo seconds a line {"t", "mem": {...}} holds /proc/meminfo's
MemFree, Cached, Dirty, Writeback and Shmem in MiB (dirty pages waiting for a disk, page cache
filling memory). Only main threads (tid == pid) are followed in every state; other threads
only while in D (they say which kernel path a writer blocks in) and on their way out of it.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import os
import statistics
import time
from collections import defaultdict
from typing import Any, TextIO


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


MEMINFO_KEYS = ("MemFree", "Cached", "Dirty", "Writeback", "Shmem")


def _meminfo() -> dict[str, int]:
    got = {}
    for line in (_read("/proc/meminfo") or "").splitlines():
        key, _, rest = line.partition(":")
        if key in MEMINFO_KEYS:
            got[key] = int(rest.split()[0]) // 1024
    return got


def _line(out: TextIO, **fields: object) -> None:
    out.write(json.dumps(fields) + "\n")


def _sample(out: TextIO, procs: set[int], last: dict[int, tuple[str, str]]) -> None:
    """One look at every thread of `procs`; a line for each followed thread whose state changed."""
    t = round(time.time(), 4)
    for pid in list(procs):
        try:
            tids = [int(name) for name in os.listdir(f"/proc/{pid}/task")]
        except OSError:  # exited: its main thread's last state ends here
            procs.discard(pid)
            _line(out, t=t, pid=pid, tid=pid, comm="", state="X", wchan="exited")
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


def record(a: argparse.Namespace) -> None:
    last: dict[int, tuple[str, str]] = {}
    procs: set[int] = set()
    end = time.monotonic() + a.seconds
    next_scan = next_mem = 0.0
    with open(a.out, "w", buffering=1 << 16) as out:
        while (now := time.monotonic()) < end:
            if now >= next_mem:
                _line(out, t=round(time.time(), 3), mem=_meminfo())
                next_mem = now + a.meminfo
            if now >= next_scan:
                for pid, cmd in _matching(a.match).items():
                    st = _stat(f"/proc/{pid}/stat") if pid not in procs else None
                    if st:
                        procs.add(pid)
                        _line(out, t=time.time(), pid=pid, ppid=st[2], cmd=cmd[:300])
                next_scan = now + a.rescan
            _sample(out, procs, last)
            time.sleep(max(0.0, a.interval - (time.monotonic() - now)))


def _rank_spans(lines: list[dict[str, Any]]) -> list[tuple[float, str]]:
    """The ranks' main threads as one timeline of (time, "state wchan") changes."""
    cmds = {r["pid"]: (r["cmd"], r["ppid"]) for r in lines if "cmd" in r}
    servers = {pid for pid, (cmd, _) in cmds.items() if "rank_forkserver serve" in cmd}

    def is_rank(pid: int) -> bool:
        cmd, ppid = cmds.get(pid, ("", 0))
        return ppid in servers or "fsdp_train" in cmd

    return [
        (r["t"], f"{r['state']} {r['wchan']}".strip())
        for r in lines
        if "state" in r and r["tid"] == r["pid"] and is_rank(r["pid"])
    ]


def _time_in(spans: list[tuple[float, str]], t0: float, t1: float) -> dict[str, float]:
    """Seconds in each state between t0 and t1 (a state lasts until the next change)."""
    got: dict[str, float] = defaultdict(float)
    i = max(0, bisect.bisect_right(spans, t0, key=lambda s: s[0]) - 1)
    while i < len(spans) and spans[i][0] < t1:
        end = spans[i + 1][0] if i + 1 < len(spans) else t1
        lo, hi = max(spans[i][0], t0), min(end, t1)
        if hi > lo:
            got[spans[i][1]] += hi - lo
        i += 1
    return got


def _fmt(c: dict[str, float], top: int = 4) -> str:
    return ", ".join(f"{k or '?'} {v:.3f}" for k, v in sorted(c.items(), key=lambda kv: -kv[1])[:top])


def report(a: argparse.Namespace) -> None:
    with open(a.threads) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    spans = _rank_spans(lines)
    mem = [r["mem"] for r in lines if "mem" in r]
    with open(a.steps) as f:
        steps = [r for r in map(json.loads, f) if "dt" in r and "event" not in r]
    median = statistics.median(r["dt"] for r in steps)
    gaps, slow = [], []
    total_gap: dict[str, float] = defaultdict(float)
    for prev, r in itertools.pairwise(steps):
        start = r["t"] - r["dt"]
        if start - prev["t"] > a.gap:
            where = _time_in(spans, prev["t"], start)
            for k, v in where.items():
                total_gap[k] += v
            gaps.append((start - prev["t"], r["step"], where))
        if r["dt"] > a.slow * median:
            slow.append((r["dt"], r["step"], _time_in(spans, start, r["t"])))
    print(f"median step {median:.3f} s; {len(steps)} steps; rank main-thread changes {len(spans)}")
    lost = sum(g for g, _, _ in gaps)
    print(f"between steps, gaps > {a.gap} s: {lost:.2f} s in {len(gaps)}: {_fmt(total_gap, 8)}")
    for g, step, where in sorted(gaps, reverse=True)[: a.top]:
        print(f"  gap {g:.3f} s before step {step}: {_fmt(where)}")
    print(f"steps over {a.slow} x the median: {len(slow)}")
    for dt, step, where in sorted(slow, reverse=True)[: a.top]:
        print(f"  step {step} {dt:.3f} s: {_fmt(where)}")
    print(f"whole run: {_fmt(_time_in(spans, steps[0]['t'], steps[-1]['t']), 8)}")
    if mem:
        peaks = {k: max(m.get(k, 0) for m in mem) for k in MEMINFO_KEYS}
        print(f"memory (MiB): max {peaks}; least MemFree {min(m.get('MemFree', 0) for m in mem)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--match", required=True)
    r.add_argument("--seconds", type=float, required=True)
    r.add_argument("--interval", type=float, default=0.005)
    r.add_argument("--rescan", type=float, default=0.5, help="seconds between looks for new processes")
    r.add_argument("--meminfo", type=float, default=1.0, help="seconds between /proc/meminfo lines")
    r.add_argument("--out", required=True)
    q = sub.add_parser("report")
    q.add_argument("--threads", required=True)
    q.add_argument("--steps", required=True, help="a rank's step log (rank-<r>.jsonl)")
    q.add_argument("--gap", type=float, default=0.02, help="seconds between steps worth a line")
    q.add_argument("--slow", type=float, default=1.5, help="steps over this many times the median")
    q.add_argument("--top", type=int, default=12)
    a = p.parse_args()
    record(a) if a.cmd == "record" else report(a)


if __name__ == "__main__":
    main()
