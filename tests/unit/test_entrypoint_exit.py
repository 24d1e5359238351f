"""rtj_trainer.pod_exit: how the launcher's end maps to the pod's exit code and reported fault."""

from __future__ import annotations

import tempfile
from datetime import UTC, datetime

import pytest
from rtj.contract import ExitCode, Fault, FaultReason, FaultSeverity
from rtj_trainer.pod_exit import LauncherEnd, pod_exit
from rtj_trainer.pod_incarnation import PodStarts

pytestmark = pytest.mark.unit

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
PERMANENT = Fault(severity=FaultSeverity.PERMANENT, reason="BadConfig", message="lr must be > 0", time=NOW)
RANK_EXITED = Fault(severity=FaultSeverity.SOFT, reason=FaultReason.RANK_EXITED, message="killed", time=NOW)
XID = Fault(severity=FaultSeverity.SOFT, reason="GpuXid", message="Xid 79", time=NOW)
HARDWARE = Fault(severity=FaultSeverity.HARD, reason=FaultReason.HARDWARE_ERROR, message="ECC", time=NOW)
SCRIPT_HARD = Fault(severity=FaultSeverity.HARD, reason="DataLoaderDied", message="gone", time=NOW)


def end(
    rc: int,
    *,
    terminated: bool = False,
    permanent: Fault | None = None,
    last: Fault | None = None,
    start: int = 1,
    in_place: int = 0,
    oom: int = 0,
) -> LauncherEnd:
    return LauncherEnd(
        rc=rc, terminated=terminated, permanent=permanent, in_job_restarts=3, progress="40",
        last_fault=last, starts=PodStarts(start, in_place), oom_kills=oom,
    )  # fmt: skip


CASES = [
    # (id, launcher end, pod exit code, fault reason, fault severity, words of its message)
    ("finished", end(0), ExitCode.SUCCEEDED, None, None, ""),
    ("terminated", end(1, terminated=True), ExitCode.TERMINATED, None, None, ""),
    ("terminated-after-finish", end(0, terminated=True), ExitCode.TERMINATED, None, None, ""),
    ("terminated-wins-over-permanent", end(1, terminated=True, permanent=PERMANENT), ExitCode.TERMINATED,
     None, None, ""),
    ("budget-spent", end(1), ExitCode.LAUNCHER_BUDGET_EXHAUSTED, FaultReason.LAUNCHER_BUDGET_EXHAUSTED,
     FaultSeverity.HARD, "exited with 1 after 3 in-job restarts"),
    ("launcher-killed", end(-9), ExitCode.LAUNCHER_BUDGET_EXHAUSTED, FaultReason.LAUNCHER_BUDGET_EXHAUSTED,
     FaultSeverity.HARD, "exited with -9"),
    ("nvrx-no-progress", end(ExitCode.DO_NOT_RESTART), ExitCode.DO_NOT_RESTART, FaultReason.NO_PROGRESS,
     FaultSeverity.SOFT, "no progress past checkpoint iteration 40 in 5 restart cycles"),
    ("do-not-restart-code", end(78), ExitCode.DO_NOT_RESTART, FaultReason.NO_PROGRESS,
     FaultSeverity.SOFT, "one of the job's doNotRestartExitCodes"),
    ("permanent-error", end(1, permanent=PERMANENT), ExitCode.DO_NOT_RESTART, "BadConfig",
     FaultSeverity.PERMANENT, "lr must be > 0"),
    ("permanent-error-launcher-0", end(0, permanent=PERMANENT), ExitCode.DO_NOT_RESTART, "BadConfig",
     FaultSeverity.PERMANENT, "lr must be > 0"),
    # In place (ENV_MAX_IN_PLACE_RESTARTS): only where the budget is spent and the node is not suspect.
    ("budget-spent-restarts-in-place", end(1, last=RANK_EXITED, in_place=2), ExitCode.RESTART_IN_PLACE,
     FaultReason.RESTARTING_IN_PLACE, FaultSeverity.SOFT, "after 3 in-job restarts; no evidence against the "
     "node: in-place restart 1 of 2"),
    ("launcher-killed-restarts-in-place", end(-9, in_place=1), ExitCode.RESTART_IN_PLACE,
     FaultReason.RESTARTING_IN_PLACE, FaultSeverity.SOFT, "exited with -9"),
    ("second-in-place-restart", end(1, start=2, in_place=2), ExitCode.RESTART_IN_PLACE,
     FaultReason.RESTARTING_IN_PLACE, FaultSeverity.SOFT, "in-place restart 2 of 2"),
    ("in-place-restarts-spent", end(1, start=2, in_place=1), ExitCode.LAUNCHER_BUDGET_EXHAUSTED,
     FaultReason.LAUNCHER_BUDGET_EXHAUSTED, FaultSeverity.HARD, "in-place restarts spent (1 of 1)"),
    ("hardware-reason-replaces", end(1, last=XID, in_place=1), ExitCode.LAUNCHER_BUDGET_EXHAUSTED,
     FaultReason.LAUNCHER_BUDGET_EXHAUSTED, FaultSeverity.HARD, "the last fault (GpuXid) speaks against"),
    ("hardware-error-replaces", end(1, last=HARDWARE, in_place=1), ExitCode.LAUNCHER_BUDGET_EXHAUSTED,
     FaultReason.LAUNCHER_BUDGET_EXHAUSTED, FaultSeverity.HARD, "(HardwareError) speaks against the node"),
    ("any-hard-fault-replaces", end(1, last=SCRIPT_HARD, in_place=1), ExitCode.LAUNCHER_BUDGET_EXHAUSTED,
     FaultReason.LAUNCHER_BUDGET_EXHAUSTED, FaultSeverity.HARD, "(DataLoaderDied) speaks against"),
    ("terminated-never-in-place", end(1, terminated=True, in_place=1), ExitCode.TERMINATED, None, None, ""),
    ("finished-never-in-place", end(0, in_place=1), ExitCode.SUCCEEDED, None, None, ""),
    ("no-progress-never-in-place", end(ExitCode.DO_NOT_RESTART, in_place=1), ExitCode.DO_NOT_RESTART,
     FaultReason.NO_PROGRESS, FaultSeverity.SOFT, "no progress"),
    ("do-not-restart-code-never-in-place", end(78, in_place=1), ExitCode.DO_NOT_RESTART,
     FaultReason.NO_PROGRESS, FaultSeverity.SOFT, "doNotRestartExitCodes"),
    ("permanent-never-in-place", end(1, permanent=PERMANENT, in_place=1), ExitCode.DO_NOT_RESTART,
     "BadConfig", FaultSeverity.PERMANENT, "lr must be > 0"),
    # Ranks killed by the container's own memory limit: the job's sizing, whatever restarts are left.
    ("oom-of-the-containers-limit", end(-9, last=RANK_EXITED, in_place=2, oom=3),
     ExitCode.LAUNCHER_BUDGET_EXHAUSTED, FaultReason.CONTAINER_OOM_KILLED, FaultSeverity.PERMANENT,
     "killed 3 process(es) of the container for its memory limit"),
    ("oom-but-finished", end(0, oom=1), ExitCode.SUCCEEDED, None, None, ""),
    ("oom-but-terminated", end(1, terminated=True, oom=1), ExitCode.TERMINATED, None, None, ""),
]  # fmt: skip


@pytest.mark.parametrize(("launcher", "code", "reason", "severity", "words"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_pod_exit(
    launcher: LauncherEnd, code: int, reason: str | None, severity: FaultSeverity | None, words: str
) -> None:
    got_code, fault = pod_exit(launcher, do_not_restart=[78], max_no_progress_cycles=5, now=NOW)
    assert got_code == code
    if reason is None:
        assert fault is None
        return
    assert fault is not None
    assert (fault.reason, fault.severity) == (reason, severity)
    assert words in fault.message
    assert fault.time == NOW


def test_the_containers_oom_kills_are_read_from_its_memory_cgroup(tmp_path) -> None:
    from rtj_trainer.memory_cgroup import kills_since, oom_kills

    v2, v1 = tmp_path / "memory.events", tmp_path / "memory.oom_control"
    files = (str(v2), str(v1))
    assert oom_kills(files) is None and kills_since(None, files) == 0  # no cgroup says
    v1.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert oom_kills(files) == 2
    v2.write_text("low 0\nhigh 0\nmax 7\noom 5\noom_kill 4\noom_group_kill 0\n")
    assert oom_kills(files) == 4  # v2 first
    assert kills_since(1, files) == 3 and kills_since(4, files) == 0


def test_the_status_files_go_to_memory_where_the_pod_has_it(tmp_path) -> None:
    from rtj_trainer.entrypoint import status_dir_base

    shm, missing, a_file = tmp_path / "shm", tmp_path / "none", tmp_path / "file"
    shm.mkdir()
    a_file.write_text("")
    assert status_dir_base((str(shm),)) == str(shm)
    assert status_dir_base((str(missing), str(a_file), str(shm))) == str(shm)
    assert status_dir_base((str(missing),)) == tempfile.gettempdir()
