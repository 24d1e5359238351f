"""One rank of the torchtitan smoke (bench/titan_smoke.py starts it as the job's command, under
`rtj-trainer launch` -> ft_launcher): torchtitan's own Trainer, loop and Llama 3 debug model config
(`llama3_debugmodel`), with rtj_trainer's RtjCheckpointer in its checkpointer slot.

    python bench/titan_rank.py --assets DIR --steps 60 --dump-folder DIR

What the smoke changes in torchtitan's config, and nothing else: the checkpointer (a subclass of
RtjCheckpointer that also fires the smoke's faults), the tokenizer and data paths (titan_smoke.py
generates both: torchtitan's own `tests/assets` are not in its wheel, and nothing is downloaded),
the number of steps, the dump folder, and optionally CUDA graphs off. The run follows torchtitan's
`train.py` main: build, train, close (also on an exception), destroy the process group.

Faults: env RTJ_FAULT_INJECT (rtj_trainer.examples.faults), fired after the save of the step before
the one they name, i.e. between two of torchtitan's steps; each is noted in the rank's step log.
`--cpu` (self-test only): torchtitan on the CPU with gloo, which 0.3.0 does not support by itself
(it picks "cuda" when no accelerator is found): the device type is forced to "cpu" before it is
imported, CUDA graphs are off, causal SDPA stands in for FlexAttention (no backward on CPU), and
the process groups keep their timeouts (torchtitan's barrier for that takes a CUDA device).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Any


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument(
        "--assets", required=True, help="holds tokenizer/ and c4_test/ (titan_smoke.py makes them)"
    )
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--dump-folder", default="./outputs")
    p.add_argument("--seq-len", type=int, default=None, help="default: the debug model's (2048)")
    p.add_argument("--local-batch-size", type=int, default=None, help="default: the debug model's (8)")
    p.add_argument("--no-cuda-graphs", action="store_true", help="training.disable_cuda_graphs")
    p.add_argument("--cpu", action="store_true", help="self-test on the CPU (see the module docstring)")
    return p.parse_args(argv)


def force_cpu() -> None:
    """Before torchtitan is imported: its device type is read once, at import (tools.utils); and
    what its memory monitor asks of the device module, which `torch.cpu` lacks."""
    import types

    import torch
    import torch._utils

    torch._utils._get_available_device_type = lambda: "cpu"  # type: ignore[assignment]
    shims = {
        "get_device_name": lambda *_: "cpu",
        "get_device_properties": lambda *_: types.SimpleNamespace(name="cpu", total_memory=2**34),
        "reset_peak_memory_stats": lambda *_: None,
        "empty_cache": lambda: None,
        "memory_stats": lambda *_: {},
    }
    for name, fn in shims.items():
        if not hasattr(torch.cpu, name):
            setattr(torch.cpu, name, fn)


def cpu_attention() -> None:
    """What torchtitan does only on an accelerator, on `--cpu`: FlexAttention has no backward on
    the CPU, so plain causal SDPA stands in for it (no per-document masking: the self-test checks
    the product path, not the model), and no timeout barrier after the first step."""
    import torch.nn.functional as F
    from torchtitan.models.common.attention import FlexAttention

    def sdpa(q: Any, k: Any, v: Any, *, scale: Any = None, enable_gqa: bool = False, **_: Any) -> Any:
        return F.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=scale, enable_gqa=enable_gqa
        ), None

    FlexAttention.compiled_flex_attn = staticmethod(sdpa)  # type: ignore[method-assign]
    # After the first step torchtitan lowers the process groups' timeouts behind a barrier on
    # `device_ids=[current_device()]`, which is "cpu" here: gloo takes no such barrier.
    import torchtitan.distributed.utils as dist_utils

    dist_utils.set_pg_timeouts = lambda **_: None


def smoke_checkpointer() -> Any:
    """RtjCheckpointer plus the smoke's faults (a class of its own: torchtitan builds a manager from
    the `Config` class it declares)."""
    from rtj_trainer.examples.faults import ENV_FAULT_INJECT, FaultInjector, parse_faults
    from rtj_trainer.integrations.titan import RtjCheckpointer

    class SmokeCheckpointer(RtjCheckpointer):
        @dataclass(kw_only=True, slots=True)
        class Config(RtjCheckpointer.Config):
            """RtjCheckpointer's; the faults come from RTJ_FAULT_INJECT."""

        def __init__(self, config: Any, **kwargs: Any) -> None:
            super().__init__(config, **kwargs)
            self.faults = FaultInjector(
                parse_faults(os.environ.get(ENV_FAULT_INJECT)),
                self.env.rank,
                self.env.checkpoint_dir,
                self.log.write,
            )

        def _load(self, step: int = -1) -> bool:
            loaded = super()._load(step)
            self.faults.start_step = int(self.states["train_state"].step)
            return loaded

        def _save(self, curr_step: int, last_step: bool = False) -> bool:
            saved = super()._save(curr_step, last_step)
            if not last_step:
                self.faults.before_step(curr_step + 1)
            return saved

    return SmokeCheckpointer


def build_config(args: argparse.Namespace) -> Any:
    """torchtitan's `llama3_debugmodel()` with the smoke's changes (module docstring)."""
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    config = llama3_debugmodel()
    config.checkpoint = smoke_checkpointer().Config(enable=True, interval=1)
    config.hf_assets_path = os.path.join(args.assets, "tokenizer")
    config.dataloader.dataset_path = os.path.join(args.assets, "c4_test")
    config.dump_folder = args.dump_folder
    config.training.steps = args.steps
    if args.seq_len:
        config.training.seq_len = args.seq_len
    if args.local_batch_size:
        config.training.local_batch_size = args.local_batch_size
    if args.no_cuda_graphs or args.cpu:
        config.training.disable_cuda_graphs = True
    return config


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.cpu:
        force_cpu()
    import torch.distributed as dist
    from torchtitan.tools.logging import init_logger

    init_logger()
    if args.cpu:
        cpu_attention()
    config = build_config(args)
    trainer = None
    try:
        trainer = config.build()
        trainer.train()
    except Exception:
        if trainer is not None:
            trainer.close()
        raise
    else:
        trainer.close()
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
