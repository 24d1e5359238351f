"""The ResilientTrainingJob object as the API server holds it: apiVersion, kind, metadata, spec and
status, and the rule on its name (its rendezvous Service is <name>-rdzv).
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field

from rtj.api.schema import ApiModel, cel
from rtj.api.spec_job import JobSpec
from rtj.api.status import JobStatus

#: Longest job name: "<name>-rdzv" must be a DNS label (63).
MAX_JOB_NAME = 58


class ResilientTrainingJob(ApiModel):
    """A PyTorch training job kept alive through faults by NVRx and the operator's escalation ladder."""

    model_config = ConfigDict(
        extra="ignore",
        # Rules on the root object may read metadata.name: the rendezvous Service is <name>-rdzv
        # (a DNS-1035 label of at most 63 characters) and the name is a label value of every child.
        json_schema_extra=cel(
            (
                f"size(self.metadata.name) <= {MAX_JOB_NAME} "
                "&& self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
                f"metadata.name must be at most {MAX_JOB_NAME} characters of lowercase letters, digits and "
                "'-', starting with a letter and ending with a letter or digit (its rendezvous Service is "
                "<name>-rdzv)",
            ),
        ),
    )

    api_version: str = Field(description="API version.")
    kind: str = Field(description="Kind.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Standard object metadata.")
    spec: JobSpec = Field(description="What to run and how to keep it alive.")
    status: JobStatus = Field(default_factory=JobStatus, description="What the operator observed.")
