"""Creates the API server refuses for reasons outside the spec, shown on the job and retried.

A 403 (the namespace lacks the trainer ServiceAccount, Pod Security `restricted` refuses the pod, an
admission webhook says no), a 404 (the namespace is going away; Kueue's CRDs not installed for a
queued job's Workload) or another 4xx other than 409 and
429 can end once an administrator acts, so it is retried, with exponential backoff; before this
policy it was visible only in the operator's log, about three lines a second, and the job sat
`Pending PodsPending` with no Event (issue 13, case 5). A 422 (Invalid) is different: the same
object always fails, so the job fails InvalidSpec (decide()).

The handler remembers the newest refusal per job (in memory: a restarted operator learns it again
from its first create) and passes it in as `Observed.create_refusal`. Here, purely:
- the job gets condition CreateRefused=True (reason: the server's, e.g. Forbidden; message: the
  server's), and one Warning Event CreateRefused whenever that condition turns True or its message
  changes (an unchanged refusal retried 100 times is one Event);
- creates wait out the backoff; the first create that is accepted clears the refusal (condition
  CreateRefused=False, reason CreatesAccepted).
"""

from __future__ import annotations

from datetime import datetime

from rtj.ladder import predicates as p
from rtj.ladder.actions import (
    Action,
    CreateRendezvousPod,
    CreateRendezvousService,
    CreateSparePod,
    CreateWorkerPod,
    CreateWorkload,
)
from rtj.ladder.observe import CreateRefusal

#: Actions that create an object from the spec (what a refusal holds back).
CREATES = (CreateWorkerPod, CreateSparePod, CreateRendezvousPod, CreateRendezvousService, CreateWorkload)
BACKOFF_BASE_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 60.0


def is_retryable_refusal(status: int) -> bool:
    """A 4xx that may end once someone acts: not 409 (AlreadyExists is success, other conflicts are
    a race the next pass resolves), 422 (the same object always fails) or 429 (throttling)."""
    return 400 <= status < 500 and status not in (409, 422, 429)


def backoff_seconds(failures: int) -> float:
    """1, 2, 4, ... 60 s after the 1st, 2nd, 3rd, ... consecutive refusal."""
    return min(BACKOFF_BASE_SECONDS * 2 ** max(0, failures - 1), BACKOFF_MAX_SECONDS)


def retry_at(refusal: CreateRefusal) -> datetime:
    """When the backoff after this refusal ends."""
    return p.after(refusal.last, backoff_seconds(refusal.failures))


def creates_allowed(refusal: CreateRefusal | None, now: datetime) -> bool:
    return refusal is None or now >= retry_at(refusal)


def held_back(actions: list[Action], refusal: CreateRefusal | None, now: datetime) -> list[Action]:
    """The actions to run this pass: creates are held back while the backoff lasts."""
    if creates_allowed(refusal, now):
        return actions
    return [a for a in actions if not isinstance(a, CREATES)]


def next_refusal(
    previous: CreateRefusal | None, status: int, reason: str, message: str, now: datetime
) -> CreateRefusal:
    """The refusal to remember after a create was refused (consecutive failures counted)."""
    failures = previous.failures + 1 if previous is not None else 1
    return CreateRefusal(status=status, reason=reason, message=message, failures=failures, last=now)
