"""Hugging Face Transformers `Trainer` (a tiny Llama built from a config, synthetic data, gloo, 2 ranks)
under the real `rtj-trainer launch` path, with rtj_trainer.integrations.hf.ResilienceCallback: a rank
SIGKILL and an exception each restart the workers in-job, they resume from the pod's memory tier, the
job finishes, and the steps lost per fault are read from the ranks' step logs."""

from __future__ import annotations

from pathlib import Path

import pytest
from byo_job import VENV_BIN, ByoJob, read_jsonl
from rtj.contract import ExitCode, PodState
from rtj_local.train_log import steps_lost

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(600)]

STEPS = 40


def test_hf_trainer_survives_a_sigkill_and_an_exception_with_few_steps_lost(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    job = ByoJob(
        tmp_path,
        [str(VENV_BIN / "python"), "-m", "rtj_trainer.examples.hf_causal_lm", "--steps", str(STEPS)],
        config={"checkpointIntervalSteps": 20, "memorySnapshotIntervalSteps": 5},
        env={"RTJ_FAULT_INJECT": "sigkill:1:12;exception:0:27", "RTJ_TRAIN_LOG_DIR": str(logs)},
        name="hf",
    )
    job.start()
    try:
        assert job.wait(540) == ExitCode.SUCCEEDED, job.log_tail()
    finally:
        job.stop()

    recs = {r: read_jsonl(logs / f"rank-{r}.jsonl") for r in (0, 1)}
    for r in (0, 1):
        resumes = [x for x in recs[r] if x.get("event") == "resume"]
        assert [x["step"] for x in resumes] == [0, 10, 25], resumes
        assert [x["source"] for x in resumes[1:]] == ["local", "local"], resumes
        assert max(x["step"] for x in recs[r] if "loss" in x) == STEPS
    # Steps lost per fault, as the local tools compute them (rtj_local.train_log).
    faults = sorted(
        (x for rs in recs.values() for x in rs if x.get("event") == "fault"), key=lambda x: x["t"]
    )
    assert [f["kind"] for f in faults] == ["sigkill", "exception"]
    costs = [steps_lost({f"rank-{r}": rs for r, rs in recs.items()}, f["t"]) for f in faults]
    lost = [c.lost for c in costs if c is not None]
    assert len(lost) == 2, costs
    print(f"steps lost per fault (sigkill, exception): {lost}")
    assert all(0 <= n < 5 for n in lost), lost  # within one memory snapshot interval
    hb = job.last_heartbeat()
    assert hb.state is PodState.FINISHED and hb.step == STEPS
    assert hb.in_job_restarts == 2
    assert hb.memory_snapshot_step is not None and hb.memory_snapshot_step >= 35
