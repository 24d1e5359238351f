"""The bring-your-own-trainer example manifests are valid jobs (the API models, as the CRD checks them)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from rtj.api.models import JobSpec

pytestmark = pytest.mark.unit

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BYO = ["plain-torchrun.yaml", "hf-trainer.yaml", "torchtitan.yaml"]


@pytest.mark.parametrize("name", BYO)
def test_example_job_spec_is_valid(name: str) -> None:
    docs = [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]
    jobs = [d for d in docs if d["kind"] == "ResilientTrainingJob"]
    assert len(jobs) == 1
    spec = JobSpec.model_validate(jobs[0]["spec"])
    assert spec.command
    claims = {d["metadata"]["name"] for d in docs if d["kind"] == "PersistentVolumeClaim"}
    # A local example brings its claim; an EKS one mounts FSx (the operator makes its PV and claim).
    assert spec.checkpoint.fsx is not None or (
        spec.checkpoint.pvc is not None and spec.checkpoint.pvc.claim_name in claims
    )
