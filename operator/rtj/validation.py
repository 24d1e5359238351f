"""The job object read and checked: `parse_job` (the spec the CRD accepted, checked again with the
operator's settings), and an invalid job marked Failed with reason InvalidSpec."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import kopf
from pydantic import ValidationError

from rtj import builders, kube, reasons
from rtj.api.models import ConditionType, JobState, JobStatus, ResilientTrainingJob
from rtj.ladder.conditions import set_condition

FSX_DISABLED = (
    "spec.checkpoint.fsx: this operator was installed without FSx support (it may not create the "
    "job's PersistentVolume); install the chart with fsx.enabled=true, or use checkpoint.pvc"
)


def plain_job(body: kopf.Body) -> dict[str, Any]:
    """kopf's copy of the job as plain dicts (what the models and rtj.kube read)."""
    return {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": dict(body.metadata),
        "spec": dict(body.spec),
        "status": dict(body.status),
    }


def parse_job(body: kopf.Body, fsx_enabled: bool) -> tuple[ResilientTrainingJob | None, str]:
    """The job, or None and a message naming the field that makes it invalid. `fsx_enabled`: the
    operator may create FSx PersistentVolumes (rtj.settings.Settings.fsx_enabled)."""
    try:
        job = ResilientTrainingJob.model_validate(plain_job(body))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        return None, f"{where}: {first.get('msg')}"
    # The CRD already refuses all of these; this is the net for a job stored before it did.
    violations = builders.privileged_violations(job)
    if violations:
        return None, "; ".join(violations) + " (privileged jobs are refused)"
    if job.spec.checkpoint.fsx is not None and not fsx_enabled:
        return None, FSX_DISABLED
    return job, ""


async def mark_invalid(k: kube.Kube, body: kopf.Body, message: str, now: datetime) -> None:
    """Status Failed/InvalidSpec saying why (no precondition: the spec is what it is), then its Event."""
    status = JobStatus.model_validate(dict(body.status)) if body.status else JobStatus()
    generation = body.metadata.get("generation")
    status.conditions = set_condition(
        status.conditions, ConditionType.FAILED, True, reasons.INVALID_SPEC, message, now, generation
    )
    status.state, status.reason, status.observed_generation = (
        JobState.FAILED,
        reasons.INVALID_SPEC,
        generation,
    )
    status.completion_time = status.completion_time or now
    await k.patch_job_status(
        body.metadata["namespace"], body.metadata["name"], status.model_dump(by_alias=True, mode="json"), None
    )
    await k.emit_event(plain_job(body), "Warning", reasons.INVALID_SPEC, message)
