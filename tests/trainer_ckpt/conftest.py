"""Fixtures of the trainer checkpoint tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch.distributed as dist
from rtj_local.procs import free_port


@pytest.fixture(scope="module")
def one_gloo_rank() -> Iterator[None]:
    """A process group of one gloo rank in this process (FSDP2 on the CPU), for one test module."""
    with pytest.MonkeyPatch.context() as env:  # not left to the tests that run after these
        pg_env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "1"}
        for name, value in pg_env.items():
            env.setenv(name, value)
        dist.init_process_group("gloo")
        yield
        dist.destroy_process_group()
