"""Errors no restart can fix, and how a rank reports them.

A checkpoint written for another world size or a bad training config fails the same way on every
attempt: restarting in-process, in-job or with a new pod only burns budgets (issue 13 saw 66
in-process restarts in 4 minutes, then a healthy node quarantined). Such an error is raised as a
`PermanentError` (rtj_trainer raises its own; a training script may raise or subclass it); the rank
reports a fault of severity Permanent (rtj.contract) and stops restarting, and the operator fails
the job on the first report (reason PermanentFault).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rtj.contract import FaultSeverity

if TYPE_CHECKING:  # checkpoint_format imports this module: keep it free of runtime imports
    from .report import RankReporter


class PermanentError(RuntimeError):
    """An error that every restart would raise again (deterministic): never retried."""


def permanent_cause(exc: BaseException | None) -> PermanentError | None:
    """The PermanentError in `exc`'s cause/context chain (a wrapper may re-raise it), else None."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, PermanentError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def report_permanent(reporter: RankReporter, exc: PermanentError) -> None:
    """Tell the operator (through the pod's heartbeat) that this rank hit a permanent error."""
    reporter.fault(FaultSeverity.PERMANENT, type(exc).__name__, str(exc))
