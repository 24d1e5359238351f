"""The memory-snapshot tier from the job spec to the rank: spec -> TrainerConfig -> env -> RankEnv
(-> CheckpointConfig -> the parts a manager is built of)."""

from __future__ import annotations

import pytest
from ladder_testkit import make_job
from rtj.api.models import SHM_MOUNT_PATH
from rtj.builders import trainer_config
from rtj_trainer.checkpoint import CheckpointConfig
from rtj_trainer.checkpoint.parts import wants_device_stage
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


SNAPSHOTS = {"pvc": {"claimName": "ckpt"}, "memorySnapshotIntervalSteps": 10}


@pytest.mark.parametrize(
    ("checkpoint", "staged"),
    [
        (SNAPSHOTS, True),
        ({**SNAPSHOTS, "memorySnapshotGpuStaging": True}, True),
        ({**SNAPSHOTS, "memorySnapshotGpuStaging": False}, False),
    ],
    ids=["default-on", "on", "off"],
)
def test_gpu_staging_travels_from_the_spec_to_the_device_stage_decision(
    checkpoint: dict, staged: bool
) -> None:
    env = _rank_env(make_job().spec(checkpoint=checkpoint))
    assert env.memory_snapshot_gpu_staging is staged
    cfg = CheckpointConfig.from_rank_env(env)
    assert cfg.memory_snapshot_gpu_staging is staged
    assert wants_device_stage(cfg, cuda_available=True) is staged


@pytest.mark.parametrize(
    ("memory_tier", "gpu_staging", "cuda_available", "wanted"),
    [
        (True, True, True, True),
        (True, False, True, False),
        (True, True, False, False),
        (False, True, True, False),
    ],
    ids=["staging-on-with-cuda", "staging-off", "no-cuda", "no-memory-tier"],
)
def test_a_device_stage_only_with_the_memory_tier_cuda_and_gpu_staging_on(
    memory_tier: bool, gpu_staging: bool, cuda_available: bool, wanted: bool
) -> None:
    cfg = CheckpointConfig(
        "/ckpt", rank=0, world_size=1, checkpoint_interval_steps=100,
        memory_tier_root="/dev/shm/rtj-snapshots/j" if memory_tier else None,
        memory_snapshot_interval_steps=10 if memory_tier else 0,
        memory_snapshot_gpu_staging=gpu_staging,
    )  # fmt: skip
    assert wants_device_stage(cfg, cuda_available) is wanted
