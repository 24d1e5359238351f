"""Conditions per the Kubernetes API conventions: keyed by type, lastTransitionTime kept unless
the status flips, observedGeneration on each."""

from __future__ import annotations

from datetime import datetime

from rtj.api.models import Condition


def get_condition(conditions: list[Condition], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)


def is_true(conditions: list[Condition], type_: str) -> bool:
    cond = get_condition(conditions, type_)
    return cond is not None and cond.status == "True"


def set_condition(
    conditions: list[Condition],
    type_: str,
    status: bool,
    reason: str,
    message: str,
    now: datetime,
    generation: int | None,
) -> list[Condition]:
    """A new list with the condition set; lastTransitionTime moves only when status flips."""
    value = "True" if status else "False"
    old = get_condition(conditions, type_)
    transition = old.last_transition_time if old is not None and old.status == value else now
    new = Condition(
        type=type_,
        status=value,
        reason=reason,
        message=message[:1024],
        last_transition_time=transition,
        observed_generation=generation,
    )
    out = [c for c in conditions if c.type != type_]
    out.append(new)
    order = [
        "Running",
        "Recovering",
        "Degraded",
        "CreateRefused",
        "Stalled",
        "Suspended",
        "Succeeded",
        "Failed",
    ]
    return sorted(out, key=lambda c: order.index(c.type) if c.type in order else len(order))
