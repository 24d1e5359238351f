"""The CPUs the container may use: its affinity, capped by its cgroup's CPU quota.

`os.cpu_count()` is the host's count; a pod limited to 8 CPUs on a 192-CPU node gets a quota
(cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us` over `cpu.cfs_period_us`, the container's own cgroup
mounted at /sys/fs/cgroup) and threads beyond it only queue behind each other and behind training.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

#: The quota's files: cgroup v2, then v1 (quota, period), under the container's cgroup mount.
CPU_MAX = "/sys/fs/cgroup/cpu.max"
CFS_FILES = ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu/cpu.cfs_period_us")


def quota_cpus(cpu_max: str = CPU_MAX, cfs_files: tuple[str, str] = CFS_FILES) -> int | None:
    """The cgroup's CPU quota in whole CPUs (rounded up); None where there is none or none says."""
    try:
        quota, _, period = Path(cpu_max).read_text().strip().partition(" ")
    except OSError:
        try:
            quota, period = (Path(name).read_text().strip() for name in cfs_files)
        except OSError:
            return None
    if not (quota.isdigit() and period.isdigit()) or int(period) == 0:
        return None  # "max" (v2) or "-1" (v1): no quota
    return max(1, math.ceil(int(quota) / int(period)))


def usable_cpus(cpu_max: str = CPU_MAX, cfs_files: tuple[str, str] = CFS_FILES) -> int:
    """The CPUs this process may run on, within its container's quota."""
    cpus = len(os.sched_getaffinity(0))
    quota = quota_cpus(cpu_max, cfs_files)
    return min(cpus, quota) if quota is not None else cpus
