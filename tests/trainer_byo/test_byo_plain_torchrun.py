"""A plain torchrun script (no import of ours, its own DCP saves) as a job's command, under the real
`rtj-trainer launch` path (ft_launcher, gloo, 2 ranks): a rank SIGKILLed mid-training is restarted
in-job, resumes from the script's own checkpoint and the job finishes; the pod's heartbeat carries
the steps and checkpoints seen from torch (rtj_trainer.integrations.autoreport)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from byo_job import VENV_BIN, ByoJob, read_jsonl
from rtj.contract import ExitCode, PodState
from rtj_local.wait import wait_for
from rtj_trainer.examples import plain_torchrun

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(400)]

STEPS = 60


def _job(tmp_path: Path) -> ByoJob:
    log = tmp_path / "rank-{rank}.jsonl"
    return ByoJob(
        tmp_path,
        [str(VENV_BIN / "python"), plain_torchrun.__file__, "--steps", str(STEPS), "--save-dir",
         str(tmp_path / "dcp"), "--save-every", "10", "--step-seconds", "0.1", "--log-file", str(log)],
    )  # fmt: skip


def test_plain_script_survives_a_rank_sigkill_and_reports_its_steps(tmp_path: Path) -> None:
    job = _job(tmp_path)
    job.start()
    try:
        rank1 = tmp_path / "rank-1.jsonl"
        recs = wait_for(
            lambda: [r for r in read_jsonl(rank1) if r.get("step", 0) >= 25 and "loss" in r],
            240,
            message="rank 1 past step 25",
        )
        victim = recs[-1]["pid"]
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)
        assert job.wait(300) == ExitCode.SUCCEEDED, job.log_tail()
    finally:
        job.stop()

    log = job.log_tail(200_000)
    assert "restart" in log.lower(), log[-4000:]
    for rank in (0, 1):
        recs = read_jsonl(tmp_path / f"rank-{rank}.jsonl")
        resumes = [r for r in recs if r.get("event") == "resume"]
        # Started once, restarted once by ft_launcher, from the script's own newest DCP save.
        assert len(resumes) == 2, resumes
        after = resumes[1]
        assert after["t"] > killed_at and after["step"] >= 20 and after["step"] % 10 == 0, after
        assert max(r["step"] for r in recs if "loss" in r) == STEPS
    hb = job.last_heartbeat()
    assert hb.state is PodState.FINISHED
    assert hb.in_job_restarts == 1
    # Seen without the script's help: the optimizer's steps and its DCP saves.
    assert hb.step == STEPS
    assert hb.checkpoint is not None and hb.checkpoint.step == STEPS
    assert (job.status_dir / "checkpoint-iteration").read_text().strip() == str(STEPS)
