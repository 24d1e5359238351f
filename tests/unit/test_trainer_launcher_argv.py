"""build_launcher_argv, map_exit_code, reported_permanent_fault and load_config: the entrypoint's pure
parts."""

from __future__ import annotations

import json

import pytest
from rtj.contract import ExitCode, FaultSeverity, RankReport, TrainerConfig, parse_rank_report
from rtj_trainer.entrypoint import (
    ConfigError,
    build_launcher_argv,
    is_launcher,
    launcher_command,
    load_config,
    map_exit_code,
    monitor_interval_seconds,
    reported_permanent_fault,
)
from rtj_trainer.heartbeat import read_rank_files
from rtj_trainer.launcher_supervision import permanent_fault_in
from rtj_trainer.report import RankReporter
from rtj_trainer.runtime_env import RankEnv, rank_env_vars

pytestmark = pytest.mark.unit

CFG = {
    "jobName": "llama",
    "command": ["python", "-u", "train.py"],
    "args": ["--lr", "3e-4"],
    "nnodes": 4,
    "nprocPerNode": 8,
    "rdzvEndpoint": "llama-rdzv.ml.svc:29400",
    "rdzvId": "llama-uid",
    "maxInJobRestarts": 5,
    "heartbeatIntervalSeconds": 10,
    "rankHangTimeoutSeconds": 300,
    "rankInitialTimeoutSeconds": 900.5,
    "inProcess": {"enabled": True, "softTimeoutSeconds": 60, "hardTimeoutSeconds": 90, "maxRestarts": 3},
    "checkpointDir": "/ckpt/llama",
    "checkpointIntervalSteps": 500,
    "checkpointsToKeep": 2,
    "maxNoProgressCycles": 3,
    "doNotRestartExitCodes": [93, 78],
}


def _argv(local_addr="10.0.0.7", **over):
    cfg = TrainerConfig.model_validate({**CFG, **over})
    return build_launcher_argv(
        cfg,
        launcher=["ft_launcher"],
        local_addr=local_addr,
        progress_file="/tmp/s/checkpoint-iteration",
        term_timeout_seconds=25,
    )


def test_argv_carries_topology_rendezvous_budget_and_hang_detection() -> None:
    argv = _argv()
    assert argv[0] == "ft_launcher"
    for flag in (
        "--nnodes=4",
        "--nproc-per-node=8",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=llama-rdzv.ml.svc:29400",
        "--rdzv-id=llama-uid",
        "--rdzv-conf=is_host=false",
        "--max-restarts=5",
        "--ft-rank-heartbeat-timeout=300",
        "--ft-initial-rank-heartbeat-timeout=900.5",
        "--term-timeout=25",
        "--local-addr=10.0.0.7",
    ):
        assert flag in argv, flag


def test_user_command_comes_last_verbatim_after_no_python() -> None:
    argv = _argv()
    i = argv.index("--no-python")
    assert argv[i + 1 :] == ["python", "-u", "train.py", "--lr", "3e-4"]
    assert all(a.startswith("--") for a in argv[1:i])


def test_nvrx_progress_tracker_stops_with_our_do_not_restart_code() -> None:
    argv = _argv()
    assert "--ft-max-no-progress-cycles=3" in argv
    assert "--ft-checkpoint-iteration-file=/tmp/s/checkpoint-iteration" in argv
    assert f"--ft-no-restart-exit-code={ExitCode.DO_NOT_RESTART}" in argv
    # 0.7 has only the any-failed restart policy; its flag is deprecated.
    assert not any(a.startswith("--ft-restart-policy") for a in argv)


def test_no_local_addr_flag_without_a_pod_ip() -> None:
    assert not any(a.startswith("--local-addr") for a in _argv(local_addr=None))


@pytest.mark.parametrize(
    ("rc", "terminated", "expected"),
    [
        (0, False, ExitCode.SUCCEEDED),
        (1, False, ExitCode.LAUNCHER_BUDGET_EXHAUSTED),
        (ExitCode.DO_NOT_RESTART, False, ExitCode.DO_NOT_RESTART),  # NVRx: no progress
        (78, False, ExitCode.DO_NOT_RESTART),  # one of the job's doNotRestartExitCodes
        (1, True, ExitCode.TERMINATED),
        (0, True, ExitCode.TERMINATED),
        (-9, False, ExitCode.LAUNCHER_BUDGET_EXHAUSTED),
    ],
)
def test_exit_code_mapping(rc: int, terminated: bool, expected: int) -> None:
    got = map_exit_code(rc, terminated=terminated, do_not_restart=[78])
    assert got == expected


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (None, "is not set"),
        ("{not json", "not valid JSON"),
        (json.dumps({**CFG, "nnodes": "four"}), "nnodes"),
        (json.dumps({k: v for k, v in CFG.items() if k != "rdzvEndpoint"}), "rdzvEndpoint"),
        (json.dumps({**CFG, "command": []}), "command"),
        (json.dumps({**CFG, "nprocPerNode": 0}), "nprocPerNode"),
        (json.dumps({**CFG, "command": [""]}), "command"),
        (json.dumps({**CFG, "maxInJobRestarts": -1}), "maxInJobRestarts"),
        (json.dumps({**CFG, "heartbeatIntervalSeconds": 0}), "heartbeatIntervalSeconds"),
        (json.dumps({**CFG, "rdzvEndpoint": "llama-rdzv.ml.svc"}), "rdzvEndpoint"),
        (json.dumps({**CFG, "doNotRestartExitCodes": [0]}), "doNotRestartExitCodes"),
        (json.dumps({k: v for k, v in CFG.items() if k != "checkpointsToKeep"}), "checkpointsToKeep"),
        (json.dumps({**CFG, "memorySnapshotIntervalSteps": 10}), "memorySnapshotDir"),
        (
            json.dumps({**CFG, "inProcess": {**CFG["inProcess"], "hardTimeoutSeconds": 60}}),
            "hardTimeoutSeconds",
        ),
    ],
)
def test_invalid_config_is_a_clear_error(raw: str | None, needle: str) -> None:
    env = {} if raw is None else {"RTJ_TRAINER_CONFIG": raw}
    with pytest.raises(ConfigError, match="RTJ_TRAINER_CONFIG") as e:
        load_config(env)
    assert needle in str(e.value)


def test_rank_env_round_trips_through_rank_env() -> None:
    cfg = TrainerConfig.model_validate(CFG)
    env = {
        **rank_env_vars(cfg, status_dir="/tmp/s", progress_file="/tmp/s/p"),
        "RANK": "9",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "32",
        "LOCAL_WORLD_SIZE": "8",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "41000",
        "TORCHELASTIC_RESTART_COUNT": "2",
        "RTJ_DIST_BACKEND": "gloo",
    }
    r = RankEnv.from_env(env)
    assert (r.rank, r.local_rank, r.world_size, r.restart_count) == (9, 1, 32, 2)
    assert r.checkpoint_dir == "/ckpt/llama" and r.checkpoint_interval_steps == 500
    assert r.status_dir == "/tmp/s" and r.progress_file == "/tmp/s/p"
    assert r.in_process.enabled and r.in_process.max_restarts == 3
    assert (r.in_process.soft_timeout_seconds, r.in_process.hard_timeout_seconds) == (60, 90)
    assert r.collective_timeout_seconds < r.in_process.hard_timeout_seconds
    assert r.dist_backend == "gloo"
    # CFG names neither the memory tier nor standby (an operator older than the image): both off;
    # nor GPU staging: on, as before the setting existed.
    assert (r.memory_snapshot_dir, r.memory_snapshot_interval_steps, cfg.standby) == (None, 0, False)
    assert r.memory_snapshot_gpu_staging
    off = TrainerConfig.model_validate({**CFG, "memorySnapshotGpuStaging": False})
    assert not RankEnv.from_env(
        rank_env_vars(off, status_dir="/tmp/s", progress_file="/tmp/s/p")
    ).memory_snapshot_gpu_staging


def test_exit_watch_fires_once_after_all_ranks_finished_for_the_timeout() -> None:
    from rtj.contract import Heartbeat, PodState
    from rtj_trainer.entrypoint import ExitWatch

    w = ExitWatch(60)
    done, training = Heartbeat(state=PodState.FINISHED), Heartbeat(state=PodState.TRAINING)
    assert not w.launcher_stuck(None, now=0)
    assert not w.launcher_stuck(done, now=10)
    assert not w.launcher_stuck(training, now=65)  # not all finished: the clock restarts
    assert not w.launcher_stuck(done, now=70)
    assert not w.launcher_stuck(done, now=129)
    assert w.launcher_stuck(done, now=130)
    assert w.fired
    assert not w.launcher_stuck(done, now=200)


def test_the_launcher_is_told_apart_from_the_entrypoint_and_the_ranks() -> None:
    for standby in (False, True):
        assert is_launcher([*launcher_command(standby), "--nnodes=2", "--", "python", "train.py"])
    assert not is_launcher(["/venv/bin/python", "/venv/bin/rtj-trainer", "launch"])
    assert not is_launcher(["/venv/bin/python", "-u", "train.py", "--steps", "10"])


def test_the_rendezvous_port_comes_from_the_validated_endpoint() -> None:
    assert TrainerConfig.model_validate(CFG).rdzv_port == 29400


def _fault(severity: str, reason: str = "WorldSizeMismatch") -> dict:
    return {"severity": severity, "reason": reason, "message": "m", "time": "2026-01-01T00:00:00Z"}


def _reports(docs: list[dict]) -> list[RankReport]:
    """Rank files with these JSON objects, read as the entrypoint reads them."""
    return [r for d in docs if (r := parse_rank_report(json.dumps(d))) is not None]


def test_a_rank_file_with_a_permanent_fault_stops_the_pod() -> None:
    docs = [{"state": "Training", "fault": _fault("Soft", "PeerFailure")}, {"fault": _fault("Permanent")}]
    fault = reported_permanent_fault(_reports(docs))
    assert fault is not None and fault.reason == "WorldSizeMismatch"


@pytest.mark.parametrize(
    "docs",
    [
        [],
        [{"state": "Training"}],
        [{"fault": _fault("Hard")}, {"fault": _fault("Soft")}],
        [{"fault": {"severity": "Permanent"}}],  # malformed: no reason/time, not acted on
        [{"fault": "Permanent"}],
    ],
)
def test_no_permanent_fault_in_rank_files(docs: list) -> None:
    assert reported_permanent_fault(_reports(docs)) is None


def test_a_permanent_fault_is_seen_after_the_launchers_next_worker_rewrote_the_rank_file(tmp_path) -> None:
    """CI (test_permanent_error_stops_every_pod_with_93_and_no_restart): ft_launcher's next worker
    of the raising rank rewrote its rank file, with no fault, before the entrypoint's next poll
    read it; the launcher was stopped only at the second occurrence, after a restart."""
    RankReporter(str(tmp_path), rank=1, local_rank=0).fault(
        FaultSeverity.PERMANENT, "WorldSizeMismatch", "checkpoint of 4 ranks"
    )
    RankReporter(str(tmp_path), rank=1, local_rank=0, in_job_restarts=1)  # the next worker
    assert reported_permanent_fault(read_rank_files(str(tmp_path))) is None
    fault = permanent_fault_in(str(tmp_path))
    assert fault is not None and fault.reason == "WorldSizeMismatch", fault
    assert permanent_fault_in(str(tmp_path / "none")) is None


def test_the_launchers_monitor_interval_is_short_until_their_store_reads_would_load_the_host() -> None:
    assert "--monitor-interval=0.1" in _argv()  # 4 pods
    assert [monitor_interval_seconds(n) for n in (1, 100, 250, 500, 2048)] == [0.1, 0.1, 0.25, 0.5, 0.5]
    assert "--monitor-interval=0.5" in _argv(nnodes=512)
