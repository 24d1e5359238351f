"""rtj_trainer.pod_incarnation: the pod's container starts, counted in its memory volume."""

from __future__ import annotations

from pathlib import Path

import pytest
from rtj.contract import ENV_MAX_IN_PLACE_RESTARTS, TrainerConfig
from rtj_trainer.pod_incarnation import (
    STARTS_FILE,
    PodStarts,
    count_start,
    max_in_place_restarts,
    pod_starts,
    starts_file,
)
from trainer_pods import trainer_config

pytestmark = pytest.mark.unit


def config(memory_dir: str | None) -> TrainerConfig:
    return TrainerConfig.model_validate(
        trainer_config("j", ["python"], [], 29400, Path("/ckpt"), memorySnapshotDir=memory_dir)
    )


def test_each_start_counts_once_in_the_memory_snapshot_dir(tmp_path: Path) -> None:
    cfg = config(str(tmp_path / "shm" / "rtj-snapshots"))
    env = {ENV_MAX_IN_PLACE_RESTARTS: "2"}
    got = [pod_starts(cfg, str(tmp_path / "status"), env) for _ in range(4)]
    assert got == [PodStarts(1, 2), PodStarts(2, 2), PodStarts(3, 2), PodStarts(4, 2)]
    assert [s.left for s in got] == [2, 1, 0, 0]
    assert (tmp_path / "shm" / "rtj-snapshots" / STARTS_FILE).read_text() == "4\n"


def test_without_a_memory_dir_the_count_lives_in_the_status_dir(tmp_path: Path) -> None:
    assert starts_file(config(None), str(tmp_path)) == str(tmp_path / STARTS_FILE)


@pytest.mark.parametrize(("raw", "expected"), [(None, 0), ("", 0), ("0", 0), ("3", 3), ("-1", 0), ("x", 0)])
def test_max_in_place_restarts_is_0_unless_a_count(raw: str | None, expected: int) -> None:
    assert max_in_place_restarts({} if raw is None else {ENV_MAX_IN_PLACE_RESTARTS: raw}) == expected


@pytest.mark.parametrize("content", ["garbage", "-2"])
def test_an_unreadable_count_allows_no_in_place_restart(tmp_path: Path, content: str) -> None:
    (tmp_path / STARTS_FILE).write_text(content)
    assert count_start(str(tmp_path / STARTS_FILE)) is None
    cfg = config(str(tmp_path))
    assert pod_starts(cfg, str(tmp_path), {ENV_MAX_IN_PLACE_RESTARTS: "1"}).left == 0


def test_an_unwritable_count_allows_no_in_place_restart(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    assert count_start(str(tmp_path / "file" / STARTS_FILE)) is None
