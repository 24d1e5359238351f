"""The container's memory cgroup: how many of its processes the kernel killed for its memory limit.

A rank the kernel's OOM killer ends for the container's own limit dies by SIGKILL like any other;
only the cgroup's counter tells the two apart (cgroup v2 `memory.events`, v1 `memory.oom_control`,
each an `oom_kill N` line; the kubelet's container runtime mounts the container's own cgroup at
/sys/fs/cgroup). A restart, in place or on another node, would hit the same limit: the pod says so
instead (pod_exit: FaultReason.CONTAINER_OOM_KILLED).
"""

from __future__ import annotations

from pathlib import Path

#: Where the counter is: cgroup v2, then v1.
OOM_COUNTER_FILES = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")


def oom_kills(files: tuple[str, ...] = OOM_COUNTER_FILES) -> int | None:
    """The container's OOM kills so far; None where no cgroup says (not in a container, an old kernel)."""
    for name in files:
        try:
            text = Path(name).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
    return None


def kills_since(before: int | None, files: tuple[str, ...] = OOM_COUNTER_FILES) -> int:
    """OOM kills in the container since `before` was read (0 when either reading is unknown)."""
    after = oom_kills(files)
    return max(0, after - before) if before is not None and after is not None else 0
