"""The memory-snapshot tier from the job spec to the rank: spec -> TrainerConfig -> env -> RankEnv."""

from __future__ import annotations

import pytest
from ladder_testkit import make_job
from rtj.api.models import SHM_MOUNT_PATH
from rtj.builders import trainer_config
from rtj_trainer.runtime_env import RankEnv, rank_env_vars

pytestmark = pytest.mark.unit


def _rank_env(job_builder) -> RankEnv:  # type: ignore[no-untyped-def]
    cfg = trainer_config(job_builder.obj())
    return RankEnv.from_env(rank_env_vars(cfg, status_dir="/tmp/s", progress_file="/tmp/s/p"))


def test_memory_snapshots_are_off_unless_the_spec_asks() -> None:
    env = _rank_env(make_job())
    assert env.memory_snapshot_dir is None and env.memory_snapshot_interval_steps == 0


def test_memory_snapshots_go_to_the_pods_shared_memory_volume_at_their_own_interval() -> None:
    job = make_job().spec(
        checkpoint={"pvc": {"claimName": "ckpt"}, "intervalSteps": 200, "memorySnapshotIntervalSteps": 10}
    )
    env = _rank_env(job)
    assert env.memory_snapshot_interval_steps == 10 and env.checkpoint_interval_steps == 200
    assert env.memory_snapshot_dir is not None and env.memory_snapshot_dir.startswith(SHM_MOUNT_PATH + "/")
