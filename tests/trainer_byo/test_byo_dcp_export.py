"""Users leave with their checkpoints: fsdp_train's checkpoints (our format, FSDP2, 2 gloo ranks) are
exported by integrations.dcp_export to a torch.distributed.checkpoint checkpoint that plain DCP loads
back onto the ranks and converts offline into one torch.save file with the global tensor shapes."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from byo_job import VENV_BIN
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(400)]

HERE = Path(__file__).parent


def _torchrun(args: list[str], env: dict[str, str]) -> None:
    cmd = [str(VENV_BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", *args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_our_checkpoint_exports_to_a_dcp_checkpoint_plain_torch_reads(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RTJ_INPROCESS_ENABLED": "0", "RTJ_STATUS_DIR": ""}
    env.pop("RTJ_TRAIN_LOG_DIR", None)
    _torchrun(
        ["-m", "rtj_trainer.examples.fsdp_train", "--steps", "12", "--dim", "64", "--layers", "2",
         "--checkpoint-dir", str(ckpt), "--checkpoint-interval", "5"],
        env,
    )  # fmt: skip
    dest, result = tmp_path / "dcp", tmp_path / "result.json"
    _torchrun([str(HERE / "dcp_export_job.py"), str(ckpt), str(dest), str(result)], env)
    assert json.loads(result.read_text()) == {"step": 10, "same": True}
    assert (dest / ".metadata").exists()

    single = tmp_path / "full.pt"
    dcp_to_torch_save(str(dest), str(single))
    full = torch.load(single, weights_only=True)
    assert full["model"]["emb.weight"].shape == (256, 64)  # the global tensor, not one rank's shard
    assert set(full["optim"]) >= {"state", "param_groups"}
