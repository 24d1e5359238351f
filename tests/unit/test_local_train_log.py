"""rtj_local.train_log: steps lost per fault, read from the ranks' step logs (pure; no processes)."""

from __future__ import annotations

import json

import pytest
from rtj_local.train_log import (
    TRAIN_LOG_SUBDIR,
    LateSnapshots,
    StepsLost,
    fault_times,
    job_train_logs,
    late_snapshots,
    logs_in_memory,
    steps_lost,
    train_log_env,
)

pytestmark = pytest.mark.unit


def step(n: int, t: float) -> dict:
    return {"step": n, "loss": 1.0, "t": t}


def resume(n: int, t: float, source: str = "memory") -> dict:
    return {"event": "resume", "step": n, "source": source, "t": t}


def test_in_process_restart_on_kept_state_loses_nothing() -> None:
    # Rank 1 raised before step 8; both ranks re-entered at step 7 (the kept state).
    logs = {
        "p0/rank-0.jsonl": [
            resume(0, 0.0, "init"),
            step(6, 6.0),
            step(7, 7.0),
            resume(7, 9.0),
            step(8, 10.0),
        ],
        "p1/rank-1.jsonl": [
            resume(0, 0.0, "init"),
            step(7, 7.0),
            {"event": "fault", "kind": "exception", "step": 8, "t": 7.5},
            resume(7, 9.1),
        ],
    }
    assert steps_lost(logs, 7.5) == StepsLost(last_step=7, resumed_at=7, sources=("memory",), seconds=2.5)
    assert steps_lost(logs, 7.5).lost == 0


def test_restart_from_an_older_checkpoint_counts_the_steps_redone() -> None:
    logs = {
        "a/rank-0.jsonl": [step(19, 19.0), resume(15, 30.0, "persistent"), step(16, 31.0)],
        "b/rank-1.jsonl": [step(19, 19.0), resume(15, 30.2, "persistent")],
    }
    got = steps_lost(logs, 19.5)
    assert (got.last_step, got.resumed_at, got.lost, got.sources) == (19, 15, 4, ("persistent",))
    assert got.seconds == pytest.approx(31.0 - 19.5)  # fault -> the first step after the resume


def test_steps_completed_after_the_fault_but_before_the_resume_are_lost_too() -> None:
    # An outside SIGKILL lands while a step is in flight: the step finishes, then the group restarts.
    logs = {"a/rank-0.jsonl": [step(10, 10.0), step(11, 11.2), resume(10, 20.0)]}
    assert steps_lost(logs, 11.0).lost == 1


def test_the_oldest_resume_step_counts_when_ranks_disagree() -> None:
    logs = {
        "a/rank-0.jsonl": [step(12, 12.0), resume(10, 20.0)],
        "b/rank-1.jsonl": [step(12, 12.0), resume(8, 20.1, "persistent")],
    }
    got = steps_lost(logs, 12.5)
    assert (got.resumed_at, got.lost, got.sources) == (8, 4, ("memory", "persistent"))


def test_no_resume_after_the_fault_is_unknown() -> None:
    logs = {"a/rank-0.jsonl": [resume(0, 0.0, "init"), step(5, 5.0)]}
    assert steps_lost(logs, 6.0) is None


def test_resumes_before_the_fault_are_not_taken_for_its_recovery() -> None:
    logs = {"a/rank-0.jsonl": [resume(0, 0.0, "init"), step(5, 5.0), step(6, 6.0), resume(4, 9.0)]}
    got = steps_lost(logs, 6.5)
    assert (got.last_step, got.resumed_at) == (6, 4)
    assert steps_lost({"a/rank-0.jsonl": logs["a/rank-0.jsonl"][:3]}, 6.5) is None


def test_fault_times_key_like_the_fault_markers() -> None:
    logs = {
        "p/rank-1.jsonl": [{"event": "fault", "kind": "sigkill", "step": 20, "t": 42.0}, step(20, 43.0)],
        "q/rank-1.jsonl": [{"event": "fault", "kind": "hang", "step": 32, "t": 80.0}],
    }
    assert fault_times(logs) == {"sigkill-1-20": 42.0, "hang-1-32": 80.0}


def test_job_train_logs_reads_one_jobs_pods_on_the_checkpoint_volume(tmp_path) -> None:
    def write(pod: str, rank: int, recs: list[dict]) -> None:
        d = tmp_path / TRAIN_LOG_SUBDIR / pod
        d.mkdir(parents=True, exist_ok=True)
        lines = [json.dumps(r) for r in recs] + ['{"torn']  # a rank killed mid-line
        (d / f"rank-{rank}.jsonl").write_text("\n".join(lines))

    write("soft-n0-a0", 0, [step(1, 1.0)])
    write("soft-n1-a0", 1, [step(1, 1.1)])
    write("soft-x-n0-a0", 0, [step(9, 9.0)])  # another job's pod ("<job>-x")
    logs = job_train_logs(tmp_path, "soft")
    assert logs == {"soft-n0-a0/rank-0.jsonl": [step(1, 1.0)], "soft-n1-a0/rank-1.jsonl": [step(1, 1.1)]}


def test_train_log_env_points_at_the_volume_with_the_pods_name_left_to_the_trainer() -> None:
    assert train_log_env("/ckpt/") == {"RTJ_TRAIN_LOG_DIR": "/ckpt/.train-logs/{pod}"}


def test_logs_in_memory_links_the_job_dir_to_a_new_dir_in_the_base(tmp_path) -> None:
    base, job = tmp_path / "shm", tmp_path / "disk" / "job"
    base.mkdir()
    logs = logs_in_memory(job / "logs", base=str(base))
    (logs / "rank-0.jsonl").write_text("{}\n")
    assert logs.is_symlink()
    [target] = base.iterdir()
    assert (target / "rank-0.jsonl").read_text() == "{}\n"
    assert target.name.startswith("rtj-bench-logs-job-")


def test_logs_in_memory_without_a_writable_base_is_a_plain_dir(tmp_path) -> None:
    logs = logs_in_memory(tmp_path / "job" / "logs", base=str(tmp_path / "missing"))
    assert logs.is_dir() and not logs.is_symlink()


def _run(saves: dict[int, str], last: int) -> list[dict]:
    return [{**step(n, float(n)), "save": saves.get(n, "")} for n in range(1, last + 1)]


def test_snapshots_at_every_interval_are_on_time_and_a_deferred_one_is_late_by_its_wait() -> None:
    every = _run({10: "snapshot", 20: "snapshot", 30: "saved", 40: "snapshot"}, 45)
    assert late_snapshots(every, 10) == LateSnapshots(due=4, on_time=4, late=0, max_steps_late=0)
    # The first waits for its slot until step 17; step 30's comes at 34; a persist waiting for the
    # one before it marks steps "skipped" without a snapshot being due (step 25); the run ends at
    # step 40, due, without one.
    deferred = _run(
        {10: "skipped", 17: "snapshot", 20: "snapshot", 25: "skipped", 30: "skipped", 34: "snapshot"}, 40
    )
    assert late_snapshots(deferred, 10) == LateSnapshots(due=4, on_time=1, late=3, max_steps_late=7)


def test_a_widened_interval_leaves_the_snapshots_it_skips_late() -> None:
    widened = _run({20: "snapshot", 40: "snapshot"}, 40)
    assert late_snapshots(widened, 10) == LateSnapshots(due=4, on_time=2, late=2, max_steps_late=10)
