"""rtj_trainer.checkpoint.schedule and .config: the save decision every rank takes from the agreed
figures (skip/coalesce, memory snapshots, the adaptive interval), and the settings read once."""

from __future__ import annotations

import pytest
from rtj_trainer.checkpoint import CheckpointConfig
from rtj_trainer.checkpoint.agreement import SaveAgreement
from rtj_trainer.checkpoint.schedule import SaveDecision, SaveSchedule
from rtj_trainer.runtime_env import RankEnv

pytestmark = pytest.mark.unit

IDLE = SaveAgreement(False, False, False, nonce=7, write_s=0.0, step_s=0.0)
PERSISTING = SaveAgreement(False, True, False, nonce=7, write_s=0.0, step_s=0.0)
BUSY = SaveAgreement(True, True, False, nonce=7, write_s=0.0, step_s=0.0)


def _decide(schedule: SaveSchedule, step: int, agreed: SaveAgreement, force: bool = False) -> SaveDecision:
    persist_due, memory_due = schedule.persist_due(step, force), schedule.memory_due(step)
    return schedule.decide(step, persist_due, memory_due, agreed, force=force)


CASES = [
    # (id, memory tier on, (step, agreed) pairs, the decisions)
    ("persist-when-idle", False, [(4, IDLE)], [SaveDecision(True, True, False)]),
    ("persist-skipped-then-coalesced", False, [(4, PERSISTING), (5, PERSISTING), (6, IDLE)],
     [SaveDecision(False, False, True), SaveDecision(False, False, False), SaveDecision(True, True, False)]),
    ("a-skipped-due-step-is-reported-again", False, [(4, PERSISTING), (8, PERSISTING)],
     [SaveDecision(False, False, True), SaveDecision(False, False, True)]),
    ("memory-snapshot-while-persisting", True, [(4, PERSISTING), (5, PERSISTING)],
     [SaveDecision(True, False, True), SaveDecision(True, False, False)]),
    ("memory-snapshot-late-while-busy", True, [(5, BUSY), (6, IDLE)],
     [SaveDecision(False, False, False), SaveDecision(True, False, False)]),
    ("coalesced-persist-with-memory", True, [(4, PERSISTING), (5, IDLE)],
     [SaveDecision(True, False, True), SaveDecision(True, True, False)]),
]  # fmt: skip


@pytest.mark.parametrize(("memory", "steps", "decisions"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_save_decisions(
    memory: bool, steps: list[tuple[int, SaveAgreement]], decisions: list[SaveDecision]
) -> None:
    schedule = SaveSchedule(4, 1 if memory else 0, memory=memory, adapt=False)
    assert [_decide(schedule, step, agreed) for step, agreed in steps] == decisions


def test_the_memory_interval_widens_to_what_the_agreed_write_fits_in() -> None:
    schedule = SaveSchedule(100, 10, memory=True, adapt=True)
    slow = SaveAgreement(False, False, False, nonce=7, write_s=5.0, step_s=0.2)  # 1.1 * 5 / 0.2 = 27.5 steps
    assert _decide(schedule, 10, slow) == SaveDecision(True, False, False)
    assert schedule.memory_every == 30
    assert not schedule.is_due(40) and schedule.is_due(60)


def test_a_coalesced_persist_waits_for_the_next_memory_snapshot_and_takes_none_off_its_schedule() -> None:
    schedule = SaveSchedule(40, 10, memory=True, adapt=False)
    assert _decide(schedule, 40, PERSISTING) == SaveDecision(True, False, True)  # persist skipped
    assert _decide(schedule, 43, IDLE) == SaveDecision(False, False, False)  # idle: none off schedule
    assert schedule.is_due(47)
    assert _decide(schedule, 50, IDLE) == SaveDecision(True, True, False)  # the memory snapshot, persisted
    assert not schedule.is_due(51)


def test_a_coalesced_persist_waits_at_most_a_configured_memory_interval() -> None:
    schedule = SaveSchedule(40, 10, memory=True, adapt=False)
    schedule.memory_every = 30  # widened: the next memory snapshot (step 60) is 19 steps away
    assert _decide(schedule, 40, PERSISTING) == SaveDecision(False, False, True)
    assert _decide(schedule, 41, IDLE) == SaveDecision(True, True, False)  # persists now
    assert _decide(schedule, 80, PERSISTING) == SaveDecision(False, False, True)
    assert _decide(schedule, 82, IDLE) == SaveDecision(False, False, False)  # step 90 is 8 steps away
    assert _decide(schedule, 90, IDLE) == SaveDecision(True, True, False)
    assert _decide(schedule, 120, PERSISTING) == SaveDecision(True, False, True)
    assert _decide(schedule, 122, IDLE, force=True) == SaveDecision(True, True, False)  # an emergency save


def test_an_emergency_save_persists_even_off_interval() -> None:
    schedule = SaveSchedule(100, 10, memory=True, adapt=False)
    assert _decide(schedule, 7, IDLE, force=True) == SaveDecision(True, True, False)


def test_config_reads_the_rank_environment_with_the_end_to_end_names(tmp_path) -> None:
    env = RankEnv.from_env({
        "RTJ_JOB_NAME": "j", "RANK": "1", "WORLD_SIZE": "2", "RTJ_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
        "RTJ_CHECKPOINT_INTERVAL_STEPS": "50", "RTJ_CHECKPOINTS_TO_KEEP": "3",
        "RTJ_MEMORY_SNAPSHOT_DIR": str(tmp_path / "shm"), "RTJ_MEMORY_SNAPSHOT_INTERVAL_STEPS": "10",
    })  # fmt: skip
    cfg = CheckpointConfig.from_rank_env(env, commit_timeout_s=30.0)
    assert (cfg.rank, cfg.world_size, cfg.checkpoint_interval_steps, cfg.checkpoints_to_keep) == (1, 2, 50, 3)
    assert cfg.memory_tier_root == str(tmp_path / "shm" / "j") and cfg.memory_snapshot_interval_steps == 10
    assert cfg.adapt_memory_snapshot_interval and cfg.commit_timeout_s == 30.0
    assert cfg.peer_endpoint is None  # no PEER_REPLICA_FILE in a status dir
    assert cfg.memory_snapshot_gpu_staging  # RTJ_MEMORY_SNAPSHOT_GPU_STAGING unset: on


def test_config_reads_gpu_staging_off_from_the_rank_environment(tmp_path) -> None:
    env = RankEnv.from_env({
        "RTJ_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "RTJ_MEMORY_SNAPSHOT_DIR": str(tmp_path / "shm"),
        "RTJ_MEMORY_SNAPSHOT_INTERVAL_STEPS": "10", "RTJ_MEMORY_SNAPSHOT_GPU_STAGING": "0",
    })  # fmt: skip
    assert not env.memory_snapshot_gpu_staging
    assert not CheckpointConfig.from_rank_env(env).memory_snapshot_gpu_staging


@pytest.mark.parametrize(
    "bad",
    [{"checkpoint_interval_steps": 0}, {"checkpoints_to_keep": 0}, {"memory_tier_root": "/dev/shm/x"}],
    ids=["interval-0", "keep-0", "memory-tier-without-interval"],
)
def test_config_refuses_settings_that_cannot_work(bad: dict) -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        CheckpointConfig(
            **{"checkpoint_dir": "/c", "rank": 0, "world_size": 1, "checkpoint_interval_steps": 5, **bad}
        )
