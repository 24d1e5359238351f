"""One rank of the torchtitan smoke (bench/titan_smoke.py starts it as the job's command, under
`rtj-trainer launch` -> ft_launcher): torchtitan 0.2.2's own Trainer, loop and Llama 3 debug model
(its JobConfig's defaults: model llama3, flavor debugmodel, dataset c4_test), as rtj_trainer's
RtjTrainer: torchtitan's Trainer with RtjCheckpointer in its `checkpointer` attribute.

    python bench/titan_rank.py --assets DIR --steps 60 --dump-folder DIR

What the smoke changes in torchtitan's config, and nothing else, as torchtitan's own command-line
flags over those defaults (`torchtitan_args`): a short warm-up and a log line per step, as
torchtitan's own debug run has them; the tokenizer and data paths (titan_smoke.py
generates both: torchtitan's own `tests/assets` are not in its wheel, and nothing is downloaded),
the number of steps, the dump folder, and on `--cpu` the sequence length, the batch size and float32
in place of bf16 (emulated, so about 18 times slower, on a CPU without bf16 instructions). The
checkpointer is a subclass of RtjCheckpointer that also fires the smoke's faults. The run is
torchtitan's own `main(trainer_class)` (its train.py, as docs/bring-your-own-trainer.md shows it):
build, train, close (also on an exception), destroy the process group.

Faults: env RTJ_FAULT_INJECT (rtj_trainer.examples.faults), fired after the save of the step before
the one they name, i.e. between two of torchtitan's steps; each is noted in the rank's step log.
`--cpu` (self-test only): torchtitan on the CPU with gloo, which 0.2.2 does not support by itself
(it picks "cuda" when no accelerator is found): the device type is forced to "cpu" before it is
imported, its memory monitor gets what it asks of `torch.cpu`, and the process groups keep their
timeouts (torchtitan's barrier for that takes a CUDA device). The debug model's attention is SDPA,
which runs on the CPU as it is. More than one rank on `--cpu` replicate the model (DDP, torchtitan's
`data_parallel_replicate_degree`) instead of sharding it: FSDP2's reduce-scatter takes PREMUL_SUM,
which gloo lacks.
"""

from __future__ import annotations

import argparse
import os
import sys
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
    p.add_argument("--cpu", action="store_true", help="self-test on the CPU (see the module docstring)")
    return p.parse_args(argv)


def torchtitan_args(args: argparse.Namespace) -> list[str]:
    """torchtitan's command line: the smoke's changes to its defaults (module docstring)."""
    tt = [
        "--lr_scheduler.warmup_steps", "2", "--lr_scheduler.decay_ratio", "0.8", "--metrics.log_freq", "1",
        "--model.hf_assets_path", os.path.join(args.assets, "tokenizer"),
        "--training.dataset_path", os.path.join(args.assets, "c4_test"),
        "--job.dump_folder", args.dump_folder,
        "--training.steps", str(args.steps),
    ]  # fmt: skip
    if args.seq_len:
        tt += ["--training.seq_len", str(args.seq_len)]
    if args.local_batch_size:
        tt += ["--training.local_batch_size", str(args.local_batch_size)]
    if args.cpu:
        # Off the GPU, torchtitan's bf16 (torch.autocast for one rank or DDP) is emulated wherever the
        # CPU lacks bf16 instructions: on an AVX2-only core a debug-model step took 6.0 s against
        # 0.34 s in float32. The self-test checks recovery, not numerics: float32.
        tt += ["--training.mixed_precision_param", "float32"]
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world > 1:
            # FSDP2's reduce-scatter takes PREMUL_SUM, which gloo lacks: on CPU the ranks replicate (DDP).
            tt += ["--parallelism.data_parallel_replicate_degree", str(world),
                   "--parallelism.data_parallel_shard_degree", "1"]  # fmt: skip
    return tt


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


def cpu_timeouts() -> None:
    """After the first step torchtitan lowers the process groups' timeouts behind a barrier on
    `device_ids=[current_device()]`, which gloo does not take: on `--cpu` they keep theirs."""
    import torchtitan.distributed.utils as dist_utils

    dist_utils.set_pg_timeouts = lambda **_: None


def smoke_trainer() -> Any:
    """RtjTrainer whose checkpointer also fires the smoke's faults."""
    from rtj_trainer.examples.faults import ENV_FAULT_INJECT, FaultInjector, parse_faults
    from rtj_trainer.integrations.titan import RtjCheckpointer, RtjTrainer

    class SmokeCheckpointer(RtjCheckpointer):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.faults = FaultInjector(
                parse_faults(os.environ.get(ENV_FAULT_INJECT)),
                self.env.rank,
                self.env.checkpoint_dir,
                self.log.write,
            )

        def load(self, step: int = -1) -> bool:
            loaded = super().load(step)
            self.faults.start_step = int(self.states["train_state"].step)
            return loaded

        def save(self, curr_step: int, last_step: bool = False) -> None:
            super().save(curr_step, last_step)
            if not last_step:
                self.faults.before_step(curr_step + 1)

    class SmokeTrainer(RtjTrainer):
        checkpointer_cls = SmokeCheckpointer

    return SmokeTrainer


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.cpu:
        force_cpu()
    # torchtitan's `main` parses sys.argv[1:], the default of `ConfigManager.parse_args`, which is
    # bound when torchtitan.config is imported: its flags go there before torchtitan is imported.
    sys.argv = [sys.argv[0], *torchtitan_args(args)]
    from torchtitan.train import main as torchtitan_main

    if args.cpu:
        cpu_timeouts()
    torchtitan_main(smoke_trainer())


if __name__ == "__main__":
    main(sys.argv[1:])
