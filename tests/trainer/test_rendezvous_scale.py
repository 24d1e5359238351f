"""bench/rendezvous_scale.py at 8 launchers: the product's store host (`rendezvous_host.run_control_plane`)
and NVRx's own rendezvous handler, one launcher lost and replaced in each order. The bench itself
fails unless every round gives ranks 0..N-1 to the live launchers, all in one round."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(120)]

BENCH = Path(__file__).resolve().parents[2] / "bench" / "rendezvous_scale.py"


def test_eight_launchers_get_distinct_ranks_before_and_after_a_replacement(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    args = [
        "--sizes",
        "8",
        "--procs",
        "2",
        "--cycles",
        "2",
        "--quiet",
        "0.5",
        "--settle",
        "0",
        "--timeout",
        "60",
    ]
    proc = subprocess.run(
        [sys.executable, str(BENCH), *args, "--out", str(out)], capture_output=True, text=True, timeout=110
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["n"] == 8
    assert [c["order"] for c in row["replacements"]] == ["last", "first"]
    assert [c["round"] for c in row["replacements"]] == [1, 2]  # one new round per replacement
    for c in row["replacements"]:
        assert c["host_ops"].get("multi_set") == 1  # the host closed the round once, all ranks in one write
