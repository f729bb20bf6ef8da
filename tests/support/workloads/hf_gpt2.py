"""A Hugging Face `Trainer` script as its users write one, importing nothing of kubetrain: a tiny
GPT-2 built from its config, synthetic token data, and a resume from the newest `checkpoint-N`
of its output dir. The adapter tests run it under `kubetrain run --local` (torchrun, 2 nodes, CPU)."""

import argparse
import os

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint


class RandomTokens(Dataset):
    def __init__(self, samples: int, length: int, vocab_size: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(0, vocab_size, (samples, length), generator=generator)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", default=os.environ.get("KUBETRAIN_CHECKPOINT_DIR", "gpt2-out"))
    parser.add_argument("--max_steps", type=int, default=60)
    parser.add_argument("--save_steps", type=int, default=20)
    args = parser.parse_args()

    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=32)
    training_args = TrainingArguments(
        output_dir=args.output_dir,
        use_cpu=True,
        report_to=[],
        per_device_train_batch_size=8,
        learning_rate=1e-3,
        max_steps=args.max_steps,
        save_steps=args.save_steps,
        logging_steps=1,
        seed=42,
        disable_tqdm=True,
    )
    trainer = Trainer(model=GPT2LMHeadModel(config), args=training_args, train_dataset=RandomTokens(512, 32, 128))
    # As the examples of transformers do (run_clm.py): resume from the newest checkpoint-N, if any.
    last = get_last_checkpoint(args.output_dir) if os.path.isdir(args.output_dir) else None
    trainer.train(resume_from_checkpoint=last)


if __name__ == "__main__":
    main()
