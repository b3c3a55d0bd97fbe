"""A Trainer with the project's extra subcommands (LightningCLI maps subcommands to its methods)."""

from __future__ import annotations

import lightning as L
import torch

from .data.corpus import generate_corpus, load_prompts

__all__ = ["SpecDiffTrainer"]


class SpecDiffTrainer(L.Trainer):
    """``lightning.Trainer`` plus ``generate_corpus`` and ``export``."""

    def generate_corpus(
        self,
        model: L.LightningModule,
        prompts: str,
        output_dir: str,
        num_continuations: int = 4,
        max_new_tokens: int = 64,
        batch_size: int = 8,
        prompts_per_shard: int = 256,
        temperature: float = 1.0,
        format: str = "jsonl",
        val_fraction: float = 0.0,
        tokenizer: str | None = None,
        seed: int = 0,
        datamodule: L.LightningDataModule | None = None,
    ) -> None:
        """Sample verifier continuations of ``prompts`` (.jsonl or .txt) into ``output_dir`` shards.

        Args:
            prompts: file of prompts: JSONL with ``prompt`` (text) or ``prompt_ids``, or one per line (.txt).
            output_dir: where ``train-*.jsonl`` / ``val-*.jsonl`` and ``manifest.json`` go; rerun to resume.
            num_continuations: continuations per prompt (temperature sampling, default 1.0).
            val_fraction: share of prompts (by id) written to ``val-*`` shards.
            tokenizer: tokenizer directory, needed for text prompts.
        """
        tok = None
        if tokenizer is not None:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(tokenizer)
        verifier = model.verifier.to(self.strategy.root_device)
        eos = verifier.generation_config.eos_token_id
        with torch.inference_mode():
            out = generate_corpus(
                verifier,
                load_prompts(prompts, tok),
                output_dir,
                num_continuations=num_continuations,
                max_new_tokens=max_new_tokens,
                batch_size=batch_size,
                prompts_per_shard=prompts_per_shard,
                temperature=temperature,
                fmt=format,
                val_fraction=val_fraction,
                seed=seed,
                eos_token_id=eos,
                tokenizer=tok,
                progress=self.progress_bar_callback is not None,
            )
        print(f"corpus written to {out}")

    def export(
        self,
        model: L.LightningModule,
        output_dir: str,
        ckpt_path: str | None = None,
        datamodule: L.LightningDataModule | None = None,
    ) -> None:
        """Write the drafter (LoRA merged) as a plain HF directory, from ``ckpt_path`` if given."""
        if ckpt_path is not None:
            state = torch.load(ckpt_path, map_location="cpu", weights_only=False)["state_dict"]
            model.load_state_dict(state, strict=False)
        model.export(output_dir)
        print(f"drafter exported to {output_dir}")
