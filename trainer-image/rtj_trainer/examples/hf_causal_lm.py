"""A small causal LM trained by the Hugging Face Transformers `Trainer`, with one callback of ours.

    python -m rtj_trainer.examples.hf_causal_lm --steps 60

The model is built from a config (Llama, tiny: no downloaded weights, no tokenizer); the dataset is
synthetic token sequences (x[t+1] = (5 x[t] + 1) mod vocab from a start that is a pure function of
the sample's index), so the loss falls. The Trainer runs as it would anywhere; the only line of
ours is `callbacks=[ResilienceCallback()]` (rtj_trainer.integrations.hf). Faults for tests: env
RTJ_FAULT_INJECT (rtj_trainer.examples.faults), fired before the optimizer step they name.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

from rtj_trainer.examples.faults import ENV_FAULT_INJECT, FaultInjector, parse_faults
from rtj_trainer.integrations.hf import ResilienceCallback
from rtj_trainer.runtime_env import RankEnv


class SequenceRule(torch.utils.data.Dataset):
    def __init__(self, vocab: int, seq: int, size: int = 4096) -> None:
        self.vocab, self.seq, self.size = vocab, seq, size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x = torch.empty(self.seq, dtype=torch.int64)
        x[0] = (i * 7919) % self.vocab
        for t in range(1, self.seq):
            x[t] = (5 * x[t - 1] + 1) % self.vocab
        return {"input_ids": x, "labels": x.clone()}


class InjectFaults(TrainerCallback):
    def __init__(self, injector: FaultInjector) -> None:
        self.injector = injector
        self.started = False

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if not self.started:  # the step the run resumed at ("+N" faults count from it)
            self.injector.start_step, self.started = state.global_step, True
        self.injector.before_step(state.global_step + 1)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--output-dir", default=None, help="the Trainer's; default: <checkpoint dir>/hf")
    args = p.parse_args(argv)
    env = RankEnv.from_env()

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=args.seq,
    )
    model = LlamaForCausalLM(config)
    training = TrainingArguments(
        output_dir=args.output_dir or os.path.join(env.checkpoint_dir, "hf"),
        max_steps=args.steps,
        per_device_train_batch_size=args.batch,
        learning_rate=3e-3,
        lr_scheduler_type="cosine",
        warmup_steps=5,
        logging_steps=1,
        save_strategy="no",  # our checkpoints (memory tier + persisted) are the callback's
        report_to=[],
        use_cpu=not torch.cuda.is_available(),
        ddp_backend="gloo" if not torch.cuda.is_available() else None,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    resilience = ResilienceCallback(env)
    faults = FaultInjector(
        parse_faults(os.environ.get(ENV_FAULT_INJECT)), env.rank, env.checkpoint_dir, resilience.log.write
    )
    trainer = Trainer(
        model=model,
        args=training,
        train_dataset=SequenceRule(args.vocab, args.seq),
        callbacks=[resilience, InjectFaults(faults)],
    )
    trainer.train()


if __name__ == "__main__":
    main()
