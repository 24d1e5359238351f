"""rank_forkserver's pure parts: which commands a pre-warmed server can run, what it imports ahead,
and the ranks' command line in ft_launcher's argv."""

from __future__ import annotations

import sys

import pytest
from rtj.contract import TrainerConfig
from rtj_trainer.entrypoint import build_launcher_argv
from rtj_trainer.rank_forkserver import MODULE, rank_command, runnable, top_level_imports
from test_trainer_launcher_argv import CFG

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (["python", "-m", "pkg.train", "--lr", "1"], ("module", "pkg.train")),
        (["/usr/bin/python3.12", "-m", "pkg.train"], ("module", "pkg.train")),
        (["python3", "train.py", "--x"], ("path", "train.py")),
        (["python", "-u", "train.py"], None),  # interpreter options: run as given
        (["torchrun", "train.py"], None),
        (["python", "-m"], None),
        (["python"], None),
    ],
)
def test_runnable_takes_python_module_and_script_commands_only(command, expected) -> None:
    assert runnable(command) == expected


def test_rank_command_wraps_a_python_command_and_leaves_others_alone() -> None:
    cmd = ["python", "-m", "pkg.train", "--lr", "1"]
    assert rank_command("/tmp/s.sock", cmd) == [
        sys.executable,
        "-m",
        MODULE,
        "run",
        "/tmp/s.sock",
        "--",
        *cmd,
    ]
    assert rank_command("/tmp/s.sock", ["./train.sh"]) == ["./train.sh"]


def test_top_level_imports_are_the_files_imports_only_not_its_code() -> None:
    source = (
        "from __future__ import annotations\n"
        "import os, torch.distributed as dist\n"
        "from torch import nn\n"
        "from .kept_state import KeptState\n"
        "from ..checkpoint import CheckpointManager\n"
        "def main():\n    import numpy\n"
        "if __name__ == '__main__':\n    import json\n"
    )
    assert top_level_imports(source, "rtj_trainer.examples") == [
        "os",
        "torch.distributed",
        "torch",
        "rtj_trainer.examples.kept_state",
        "rtj_trainer.checkpoint",
    ]
    assert top_level_imports(source, None) == ["os", "torch.distributed", "torch"]


def test_the_launcher_runs_ranks_through_the_forkserver_when_there_is_one() -> None:
    cfg = TrainerConfig.model_validate(
        {**CFG, "command": ["python", "-m", "pkg.train"], "args": ["--steps", "5"]}
    )
    kw = {"launcher": ["ft_launcher"], "local_addr": None, "progress_file": "/p", "term_timeout_seconds": 25}
    plain = build_launcher_argv(cfg, **kw)
    forked = build_launcher_argv(cfg, **kw, rank_forkserver="/tmp/r.sock")
    user = ["python", "-m", "pkg.train", "--steps", "5"]
    assert plain[plain.index("--no-python") + 1 :] == user
    assert forked[forked.index("--no-python") + 1 :] == rank_command("/tmp/r.sock", user)
    assert "--ft-gpu-memory-poll-interval=0.1" in plain
