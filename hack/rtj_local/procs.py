"""Background processes that outlive the Python process which started them.

Each process runs in its own session (so its own process group), with stdout/stderr appended to a log
file. A pidfile holds "<pid> <start time>" so that any later process (e.g. `cluster down` from another
shell) can stop it without mistaking a recycled pid for it.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks); None if gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # the command name may contain spaces
    if fields[0] in ("Z", "X"):
        return None
    return fields[19]


def read_pidfile(pidfile: Path) -> int | None:
    """The pid recorded in `pidfile` if that very process is still alive, else None."""
    try:
        pid_s, start = pidfile.read_text().split()
    except (FileNotFoundError, ValueError):
        return None
    pid = int(pid_s)
    return pid if _start_time(pid) == start else None


def spawn(
    argv: Sequence[str | os.PathLike[str]],
    log_file: Path,
    pidfile: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    log_file.parent.mkdir(parents=True, exist_ok=True)
    pidfile.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("ab") as log:
        log.write(f"\n==== {time.strftime('%Y-%m-%dT%H:%M:%S')} start: {' '.join(map(str, argv))}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            [os.fspath(a) for a in argv],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=dict(env) if env is not None else None,
            cwd=cwd,
        )
    write_pidfile(pidfile, proc.pid)
    return proc


def write_pidfile(pidfile: Path, pid: int) -> None:
    pidfile.parent.mkdir(parents=True, exist_ok=True)
    pidfile.write_text(f"{pid} {_start_time(pid)}\n")


def stop(
    pidfile: Path, grace: float = 10.0, children: dict[int, subprocess.Popen[bytes]] | None = None
) -> bool:
    """SIGTERM to the process group, then SIGKILL after `grace` seconds. Returns True if it was running.

    `children` maps pid -> Popen for processes this Python process started; they are reaped here so no
    zombie is left behind.
    """
    pid = read_pidfile(pidfile)
    pidfile.unlink(missing_ok=True)
    if pid is None:
        return False
    for sig, wait_s in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)  # the process leads its own group (start_new_session)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if children and pid in children and children[pid].poll() is not None:
                break
            if _start_time(pid) is None:
                break
            time.sleep(0.05)
        else:
            continue
        break
    with contextlib.suppress(ProcessLookupError):  # sweep what is left in the group after its leader
        os.killpg(pid, signal.SIGKILL)
    if children and pid in children:
        children.pop(pid).wait(timeout=5)
    return True


def kill_tree(pid: int) -> float:
    """SIGKILL a process and all its descendants at once (a pod's node is gone); the time of the
    kill, now when the process had already exited."""
    import psutil  # the trainer extra: only the trainer tiers kill process trees

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return time.time()
    t = time.time()
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(procs, timeout=10)
    return t


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_run(n: int) -> int:
    """The first of `n` consecutive TCP ports on 127.0.0.1 that nothing listens on, below the
    kernel's ephemeral range: a port the OS hands out (`free_port`) is in that range, where any
    outbound connection may take the next one before a server binds it (a per-slot port
    `base + slot` does not stay free otherwise)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(10000, low - n)
        socks = []
        try:
            for port in range(base, base + n):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports below {low}")


def log_tail(log_file: Path, lines: int = 30) -> str:
    try:
        return "\n".join(log_file.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return f"(no log at {log_file})"


@dataclass
class ProcInfo:
    """A live process of a pod, as the host sees it (its initial environment, not later changes)."""

    pid: int
    ppid: int
    cmdline: list[str]
    env: dict[str, str]


def read_process(pid: int) -> ProcInfo | None:
    """`pid`'s command line, parent and environment from /proc; None if it is gone."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        raw_env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
    env = dict(e.decode(errors="replace").split("=", 1) for e in raw_env if b"=" in e)
    return ProcInfo(pid, ppid, [c.decode(errors="replace") for c in cmdline if c], env)
