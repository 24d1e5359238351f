"""How a worker pod ends: the launcher's exit (and what the ranks reported) -> the pod's exit code and
the fault its last heartbeat carries (pure; table-tested in tests/unit/test_entrypoint_exit.py).

The operator's ladder reads both (`rtj.contract.ExitCode`, `FaultReason`): 0 training finished;
143 stopped by SIGTERM; 93 no restart can help (NVRx saw no progress, one of the job's
doNotRestartExitCodes, or a rank's permanent error); 70 the launcher's in-job restart budget is
spent (a Hard fault: replace the pod); 76 the same on a pod that may restart in place and whose
last fault is no evidence against its node (a Soft fault: the kubelet restarts its containers);
70 with a Permanent ContainerOOMKilled fault when the container's own memory limit killed ranks
(no restart helps: the operator fails the job naming the limit).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from rtj.contract import ExitCode, Fault, FaultReason, FaultSeverity, is_hardware_fault

from .pod_incarnation import PodStarts


@dataclass(frozen=True)
class LauncherEnd:
    """What the entrypoint saw when its last launcher ended."""

    rc: int  # the launcher's exit status (0 also when every rank finished and it lingered)
    terminated: bool  # the pod was asked to stop (SIGTERM/SIGINT)
    permanent: Fault | None  # a permanent error some rank reported
    in_job_restarts: int  # the in-job restarts the heartbeat counted
    progress: str  # the checkpoint iteration NVRx last saw ("none" if none)
    last_fault: Fault | None = None  # the pod's fault when the launcher ended (its heartbeat's)
    #: This container's start among the pod's, and the in-place restarts the pod may take.
    starts: PodStarts = field(default_factory=PodStarts)
    #: Processes of the container the kernel killed for its memory limit while the launcher ran.
    oom_kills: int = 0


def map_exit_code(launcher_rc: int, *, terminated: bool, do_not_restart: Sequence[int]) -> int:
    """The pod's exit code from how the launcher ended."""
    if launcher_rc == 0 and not terminated:
        return ExitCode.SUCCEEDED
    if terminated:
        return ExitCode.TERMINATED
    if launcher_rc == ExitCode.DO_NOT_RESTART or launcher_rc in do_not_restart:
        return ExitCode.DO_NOT_RESTART
    return ExitCode.LAUNCHER_BUDGET_EXHAUSTED


def evidence_against_node(fault: Fault | None) -> bool:
    """The pod's fault speaks against its node: a hardware fault, or any Hard one (the operator
    replaces a pod that reports one, so the node must not get the pod back in place)."""
    return fault is not None and (fault.severity is FaultSeverity.HARD or is_hardware_fault(fault.reason))


def pod_exit(
    end: LauncherEnd, *, do_not_restart: Sequence[int], max_no_progress_cycles: int, now: datetime
) -> tuple[int, Fault | None]:
    """(the pod's exit code, the fault to report with it or None)."""
    rc = end.rc
    code = map_exit_code(rc, terminated=end.terminated, do_not_restart=do_not_restart)
    if end.permanent is not None and not end.terminated:
        return ExitCode.DO_NOT_RESTART, end.permanent
    if code == ExitCode.LAUNCHER_BUDGET_EXHAUSTED and end.oom_kills:
        # Ranks killed by the container's own memory limit: a restart anywhere would hit it again.
        return code, Fault(
            severity=FaultSeverity.PERMANENT,
            reason=FaultReason.CONTAINER_OOM_KILLED,
            message=f"ft_launcher exited with {rc}: the kernel killed {end.oom_kills} process(es) of the "
            "container for its memory limit",
            time=now,
        )
    if code == ExitCode.LAUNCHER_BUDGET_EXHAUSTED:
        return _budget_spent(end, now)
    if code == ExitCode.DO_NOT_RESTART:
        # Not a pod fault: a new pod would not make progress either. The exit code (93) is what
        # fails the job; a Hard fault here would make the operator replace the pod first.
        message = (
            f"ft_launcher exited with {rc}: NVRx saw no progress past checkpoint iteration "
            f"{end.progress} in {max_no_progress_cycles} restart cycles"
            if rc == ExitCode.DO_NOT_RESTART
            else f"ft_launcher exited with {rc}, one of the job's doNotRestartExitCodes"
        )
        return code, Fault(
            severity=FaultSeverity.SOFT, reason=FaultReason.NO_PROGRESS, message=message, time=now
        )
    return code, None


def _budget_spent(end: LauncherEnd, now: datetime) -> tuple[int, Fault]:
    """The launcher gave up: restart the pod in place (Soft, never Hard: the operator replaces a pod
    that reports a Hard fault) while it may and its node is not suspect, else replace it (Hard).
    In place, the ranks resume from the memory snapshots they committed before they died; nothing is
    saved on the way out (the restart skips grace periods)."""
    spent = f"ft_launcher exited with {end.rc} after {end.in_job_restarts} in-job restarts"
    starts, fault = end.starts, end.last_fault
    against = evidence_against_node(fault)
    if starts.left > 0 and not against:
        message = (
            f"{spent}; no evidence against the node: in-place restart {starts.start} of "
            f"{starts.max_in_place_restarts}, resuming from the pod's memory snapshots"
        )
        return ExitCode.RESTART_IN_PLACE, Fault(
            severity=FaultSeverity.SOFT, reason=FaultReason.RESTARTING_IN_PLACE, message=message, time=now
        )
    if starts.max_in_place_restarts:
        spent += (
            f"; no in-place restart: the last fault ({fault.reason}) speaks against the node"
            if against and fault is not None
            else f"; in-place restarts spent ({starts.start - 1} of {starts.max_in_place_restarts})"
        )
    return ExitCode.LAUNCHER_BUDGET_EXHAUSTED, Fault(
        severity=FaultSeverity.HARD, reason=FaultReason.LAUNCHER_BUDGET_EXHAUSTED, message=spent, time=now
    )
