"""kopf's memos, typed: the operator's (`OperatorMemo`) and each job's (`JobMemo`).

kopf hands every handler a `kopf.Memo`: a dict with attribute access, whose keys are absent until
first written. The operator's memo is filled by the startup handler; each object gets a shallow copy
of it for the object's life (so a job's memo holds the operator's client too), where the job's passes
keep what they need from one pass to the next. Only these two views read and write them: each item
named once, with its type and the value it reads as while absent. In memory only: a restarted
operator starts from the defaults, which are all safe (the job's status is the state that matters).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, cast, overload

import kopf

from rtj.api.models import JobStatus, ResilientTrainingJob
from rtj.kube import Kube
from rtj.ladder.observe import CreateRefusal, FlavorObs, ProgressSeen
from rtj.watch_guard import WatchGuard


class _Kept[T]:
    """One item of a kopf memo: reads as `default` while absent, written as is."""

    def __init__(self, default: T) -> None:
        self.default = default
        self.key = ""

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self.key = name

    @overload
    def __get__(self, view: None, owner: type[Any]) -> _Kept[T]: ...
    @overload
    def __get__(self, view: _MemoView, owner: type[Any]) -> T: ...
    def __get__(self, view: _MemoView | None, owner: type[Any]) -> _Kept[T] | T:
        if view is None:
            return self
        return cast(T, view.raw.get(self.key, self.default))

    def __set__(self, view: _MemoView, value: T) -> None:
        view.raw[self.key] = value


@dataclass
class _MemoView:
    #: kopf's memo itself: what kopf passes to the handlers, and where every item is stored.
    raw: kopf.Memo


class OperatorMemo(_MemoView):
    """What the startup handler keeps for the operator's life (None until it ran)."""

    kube = _Kept[Kube | None](None)
    watch_guard = _Kept[WatchGuard | None](None)
    #: The background task of rtj.handlers.review_quarantines.
    quarantine_review = _Kept[asyncio.Task[None] | None](None)


@dataclass(frozen=True)
class OwnWrites:
    """The status this operator last wrote, the resourceVersion it got, and every resourceVersion
    its writes replaced since kopf's copy of the job was last current. Not only the one before: a
    pass whose copy is two writes behind would otherwise write from that copy, conflict, and retry
    until the watch catches up, every status change and Event held back meanwhile."""

    replaced: frozenset[str]
    resource_version: str
    status: JobStatus


def own_writes(last: OwnWrites | None, resource_version: str) -> OwnWrites | None:
    """Our writes, when kopf's copy (at `resource_version`) is one they replaced; else None: the copy
    is current, or someone else changed the job since (the write's precondition then conflicts)."""
    return last if last is not None and resource_version in last.replaced else None


_NO_REFUSAL: Mapping[str, str] = MappingProxyType({})
_NO_FLAVORS: Mapping[str, FlavorObs] = MappingProxyType({})


class JobMemo(_MemoView):
    """One job's state kept across its passes (rtj.job_pass) and its Lease index (rtj.handlers)."""

    #: Our last status writes: a pass reads its own writes from here while kopf's copy is behind.
    last_write = _Kept[OwnWrites | None](None)
    #: Job UID -> why the API server refused (422) an object built from its spec: the next pass
    #: fails that job (keyed by UID: a namesake created later is not failed for it).
    refused = _Kept[Mapping[str, str]](_NO_REFUSAL)
    #: The newest create refused for a reason that may end (rtj.ladder.create_refusals).
    create_refusal = _Kept[CreateRefusal | None](None)
    #: The highest Event sequence number posted (rtj.ladder.event_outbox); None: none known.
    events_posted = _Kept[int | None](None)
    #: When the Lease watch last saw the training step rise (rtj.ladder.progress_watchdog).
    progress_seen = _Kept[ProgressSeen | None](None)
    #: Leases whose next renewal wakes the pass (rtj.ladder.wakeups.watched_leases).
    watched_leases = _Kept[frozenset[str]](frozenset())
    #: The ResourceFlavors read for the Workload's admission: (the admission's key, flavor by name).
    flavors = _Kept[tuple[str, Mapping[str, FlavorObs]]](("", _NO_FLAVORS))
    #: The job parsed from its last resourceVersion seen: (resourceVersion, job or None if invalid).
    parsed = _Kept[tuple[Any, ResilientTrainingJob | None] | None](None)

    @property
    def kube(self) -> Kube:
        """The operator's client (kopf copied the operator's memo into the job's)."""
        client: Kube = self.raw.kube
        return client
