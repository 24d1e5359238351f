"""Events that survive a crash: they are part of the status write that decided them.

Before, Events were posted after the status write from the pass's memory, so an operator killed
between the two lost them (issue 13, case 7: the count stayed exact, the PodFailed Warning was never
emitted). Now each Event a pass decides gets the next sequence number (status.lastEventSeq) and is
written into status.unpostedEvents by that pass's one status write. After a write, the handler posts
every unposted Event under a name derived from the job's UID and the sequence number, so posting one
twice (a crash after the post, before the next write) is AlreadyExists, i.e. success; the next pass
drops what the handler reports as posted (`Observed.events_posted`). A restarted operator knows
nothing posted (None) and posts what status still holds: each Event exactly once.
"""

from __future__ import annotations

from datetime import datetime

from rtj.api.models import EventRecord, JobStatus
from rtj.ladder.actions import JobEvent

#: Unposted Events kept in status at most (the oldest dropped): bounds status size if the Events
#: API refuses for a long time.
MAX_UNPOSTED = 32


def record(status: JobStatus, events: list[JobEvent], posted: int | None, now: datetime) -> None:
    """Drop the Events posted through `posted` (None: unknown, keep all) and append `events`."""
    pending = [e for e in status.unposted_events if posted is None or e.seq > posted]
    for ev in events:
        status.last_event_seq += 1
        pending.append(
            EventRecord(
                seq=status.last_event_seq, type=ev.type, reason=ev.reason, message=ev.message[:1024], time=now
            )
        )
    status.unposted_events = pending[-MAX_UNPOSTED:]


def event_name(job: str, uid: str, seq: int) -> str:
    """A deterministic Event name: the same Event posted twice is AlreadyExists; a namesake job (a new
    UID) never collides with the Events of a deleted one."""
    return f"{job}.{uid.replace('-', '')[:12]}.{seq}"
