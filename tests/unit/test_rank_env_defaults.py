"""One default per setting: a rank's settings read without the operator (RankEnv.from_env of an
empty environment, a script run outside a pod) equal what the operator passes for a job that sets
none of them (the spec's defaults, through TrainerConfig and rank_env_vars)."""

from __future__ import annotations

import pytest
from ladder_testkit import make_job
from rtj import builders
from rtj_trainer.runtime_env import RankEnv, rank_env_vars

pytestmark = pytest.mark.unit


def test_a_rank_outside_a_pod_gets_the_spec_defaults() -> None:
    config = builders.trainer_config(make_job().obj())
    passed = RankEnv.from_env(rank_env_vars(config, status_dir="/s", progress_file="/p"))
    alone = RankEnv.from_env({})
    assert alone.checkpoint_interval_steps == passed.checkpoint_interval_steps
    assert alone.checkpoints_to_keep == passed.checkpoints_to_keep
    assert alone.in_process == passed.in_process
    assert alone.hang_detection == passed.hang_detection
    assert alone.memory_snapshot_gpu_staging == passed.memory_snapshot_gpu_staging


def test_a_config_without_hang_detection_turns_it_off() -> None:
    config = builders.trainer_config(make_job().obj()).model_copy(update={"hang_detection": None})
    env = RankEnv.from_env(rank_env_vars(config, status_dir="/s", progress_file="/p"))
    assert not env.hang_detection.enabled
