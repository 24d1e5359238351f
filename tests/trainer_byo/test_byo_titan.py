"""torchtitan 0.2.2's own Trainer (its Llama 3 debug model, its JobConfig) as rtj_trainer's RtjTrainer,
under the real `rtj-trainer rendezvous` + `rtj-trainer launch` path (-> NVRx ft_launcher -> one
rank on CPU): bench/titan_smoke.py --cpu, the GPU smoke's second case as a self-test. An exception
and a SIGKILL in the rank each restart the workers in-job; both resume from the pod's memory tier
with fewer steps lost than one memory interval, and the launcher exits 0 at the last step.

One rank, the smoke's default on CPU; tests/e2e/test_byo_trainers.py runs two, in two pods."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from trainer_pods import VENV_BIN

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(600)]

SMOKE = Path(__file__).resolve().parents[2] / "bench" / "titan_smoke.py"
MEMORY_INTERVAL = 5


def test_torchtitan_trainer_resumes_from_memory_after_an_exception_and_a_sigkill(tmp_path: Path) -> None:
    out = tmp_path / "titan.json"
    args = ["--cpu", "--steps", "30", "--exception-step", "12", "--sigkill-step", "22"]
    args += ["--memory-interval", str(MEMORY_INTERVAL), "--checkpoint-interval", "10"]
    proc = subprocess.run(
        [str(VENV_BIN / "python"), str(SMOKE), *args, "--work-dir", str(tmp_path), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert out.exists(), proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads(out.read_text())
    print(json.dumps({k: result[k] for k in ("seconds_to_first_step", "faults", "median_step_seconds")}))
    assert result["versions"]["torchtitan"] == "0.2.2"
    assert result["launch_exit_code"] == 0, result.get("launch_log_tail")
    assert result["final_step"] == 30
    faults = result["faults"]
    assert [f["kind"] for f in faults] == ["exception", "sigkill"], faults
    # Each fault lands 2 steps after a snapshot (steps 10 and 20): resumed from memory, not from step 0.
    assert [f["resumed_from_step"] for f in faults] == [10, 20], faults
    assert all(f["resumed_from"] == ["local"] for f in faults), faults
    assert all(0 <= f["steps_lost"] < MEMORY_INTERVAL for f in faults), faults
    heartbeat = json.loads(result["last_heartbeat"])
    assert heartbeat["state"] == "Finished" and heartbeat["step"] == 30
    assert heartbeat["inJobRestarts"] == 2 and heartbeat["memorySnapshotStep"] == 30
    assert proc.returncode == 0
