"""The copier's CPU count: the container's quota, read from its cgroup files (real files here)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from rtj_trainer.cpu_cgroup import quota_cpus, usable_cpus

Pair = tuple[str, str]


def _files(tmp_path: Path, v2: str | None = None, v1: Pair | None = None) -> tuple[str, Pair]:
    cpu_max, quota, period = tmp_path / "cpu.max", tmp_path / "quota", tmp_path / "period"
    if v2 is not None:
        cpu_max.write_text(v2 + "\n")
    if v1 is not None:
        quota.write_text(v1[0] + "\n")
        period.write_text(v1[1] + "\n")
    return str(cpu_max), (str(quota), str(period))


@pytest.mark.parametrize(
    ("v2", "v1", "want"),
    [
        ("800000 100000", None, 8),  # a pod limited to 8 CPUs
        ("250000 100000", None, 3),  # 2.5 CPUs: a third thread still has time to run
        ("50000 100000", None, 1),
        ("max 100000", None, None),  # no limit
        (None, ("400000", "100000"), 4),  # cgroup v1
        (None, ("-1", "100000"), None),
        (None, None, None),  # not in a container
        ("garbage", None, None),
    ],
)
def test_the_quota_in_whole_cpus(tmp_path: Path, v2: str | None, v1: Pair | None, want: int | None) -> None:
    assert quota_cpus(*_files(tmp_path, v2, v1)) == want


def test_usable_cpus_are_the_affinity_within_the_quota(tmp_path: Path) -> None:
    affinity = len(os.sched_getaffinity(0))
    assert usable_cpus(*_files(tmp_path)) == affinity
    assert usable_cpus(*_files(tmp_path, v2="100000 100000")) == 1
    assert usable_cpus(*_files(tmp_path, v2=f"{(affinity + 4) * 100000} 100000")) == affinity
