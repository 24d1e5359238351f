"""A pod's processes, found by its mount namespace: every process of a pod shares it (torch elastic
starts its workers in new sessions, so the process group would miss them)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path


def mount_namespace(pid: int) -> str | None:
    """The mount namespace of `pid` (`mnt:[inode]`), or None once the process is gone."""
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def pids_in_namespace(ns: str) -> list[int]:
    """Every live process in the mount namespace `ns`."""
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and mount_namespace(int(entry.name)) == ns:
            pids.append(int(entry.name))
    return pids


def await_pod_namespace(proc: subprocess.Popen[bytes]) -> str | None:
    """The pod's mount namespace, once the launcher has set it up and exec'd the command (or None if
    it exited first)."""
    own = mount_namespace(os.getpid())
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline and proc.poll() is None:
        ns = mount_namespace(proc.pid)
        try:
            cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            cmdline = []
        launching = cmdline[:1] == [b"unshare"] or cmdline[3:4] == [b"rtj-pod"]
        if ns is not None and ns != own and not launching:
            return ns
        time.sleep(0.005)
    return mount_namespace(proc.pid) if proc.poll() is None else None
