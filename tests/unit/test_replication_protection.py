"""Which memory snapshots the peer replica keeps from pruning (`checkpoint.replication`).

The ranks replicate the same steps, but each rank's stream ends when it ends: until every rank's
stream of step S has ended, a lost pod's replica on a survivor may still be of the step replicated
before S, so a survivor must still hold that one (its loss sent a 2-pod job back to step 0 once)."""

from __future__ import annotations

import threading

import pytest
from rtj_trainer.checkpoint.events import EventLog
from rtj_trainer.checkpoint.replication import ReplicationHook
from rtj_trainer.peer_replica import Offer

pytestmark = pytest.mark.unit


def _hook() -> ReplicationHook:
    return ReplicationHook("127.0.0.1:1", 0, threading.Lock(), EventLog())


def _replicated(hook: ReplicationHook, step: int) -> str:
    path = f"/shm/rank-00000/step-{step:010d}.1"
    hook._done(Offer(step, 1, path), 0.1, None)  # the replicator's report: the peer committed it
    return path


def test_the_step_replicated_before_stays_protected_until_the_ranks_settle() -> None:
    hook = _hook()
    s10 = _replicated(hook, 10)
    assert s10 in hook.protected()
    s20 = _replicated(hook, 20)  # this rank's stream of 20 ended; another rank's may not have
    assert {s10, s20} <= set(hook.protected())
    hook.settle()  # every rank agreed: none writing, none streaming -> every peer holds 20
    assert s20 in hook.protected() and s10 not in hook.protected()


def test_at_most_two_replicated_snapshots_are_held_without_a_settle() -> None:
    hook = _hook()
    paths = [_replicated(hook, s) for s in (10, 20, 30)]
    assert [p for p in hook.protected() if p] == paths[1:]


def test_a_failed_stream_protects_nothing_new() -> None:
    hook = _hook()
    s10 = _replicated(hook, 10)
    hook._done(Offer(20, 1, "/shm/rank-00000/step-0000000020.1"), 0.1, OSError("peer gone"))
    assert [p for p in hook.protected() if p] == [s10]
    assert hook.replicate_failures == 1
