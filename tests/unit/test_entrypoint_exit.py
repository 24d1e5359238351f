"""rtj_trainer.pod_exit: how the launcher's end maps to the pod's exit code and reported fault."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from rtj.contract import ExitCode, Fault, FaultReason, FaultSeverity
from rtj_trainer.pod_exit import LauncherEnd, pod_exit

pytestmark = pytest.mark.unit

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
PERMANENT = Fault(severity=FaultSeverity.PERMANENT, reason="BadConfig", message="lr must be > 0", time=NOW)


def end(rc: int, *, terminated: bool = False, permanent: Fault | None = None) -> LauncherEnd:
    return LauncherEnd(rc=rc, terminated=terminated, permanent=permanent, in_job_restarts=3, progress="40")


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
