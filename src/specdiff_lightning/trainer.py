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
            tokenizer: the verifier's tokenizer (a named verifier, directory or hub id), needed for
                text prompts.

        Under a multi-process strategy (``--trainer.strategy ddp --trainer.devices N``) each rank
        writes the prompts that hash to it, into its own shards and manifest.
        """
        kwargs = dict(
            prompts=prompts,
            output_dir=output_dir,
            num_continuations=num_continuations,
            max_new_tokens=max_new_tokens,
            batch_size=batch_size,
            prompts_per_shard=prompts_per_shard,
            temperature=temperature,
            format=format,
            val_fraction=val_fraction,
            tokenizer=tokenizer,
            seed=seed,
        )
        launcher = self.strategy.launcher
        if launcher is not None:  # DDP: the strategy starts the ranks, as fit does
            self.strategy.connect(model)
            launcher.launch(self._generate_corpus_rank, model, trainer=self, **kwargs)
        else:
            self._generate_corpus_rank(model, **kwargs)

    def _generate_corpus_rank(self, model, *, prompts, output_dir, tokenizer, format, **options) -> None:
        self.strategy.setup_environment()  # the process group and this process's rank
        from .models.loading import load_tokenizer

        tok = load_tokenizer(tokenizer) if tokenizer is not None else _verifier_tokenizer(model)
        verifier = getattr(model, "verifier", None)
        if verifier is None:
            raise ValueError(
                f"generate-corpus samples from the model's verifier, and {type(model).__name__} has none; "
                f"use a config whose model trains a drafter against a verifier (e.g. configs/tiny_fit.yaml)"
            )
        verifier = verifier.to(self.strategy.root_device)
        eos = verifier.generation_config.eos_token_id
        with torch.inference_mode():
            out = generate_corpus(
                verifier,
                load_prompts(prompts, tok),
                output_dir,
                **options,
                fmt=format,
                eos_token_id=eos,
                tokenizer=tok,
                progress=self.progress_bar_callback is not None and self.is_global_zero,
                rank=self.global_rank,
                world_size=self.world_size,
            )
        self.strategy.barrier("generate_corpus")
        if self.is_global_zero:
            print(f"corpus written to {out}")

    def bench(
        self,
        model: L.LightningModule,
        datamodule: L.LightningDataModule,
        output_dir: str = "runs/bench",
        kinds: list[str] | None = None,
        sweep_num_drafts: list[int] | None = None,
        sweep_draft_temperature: list[float] | None = None,
        sweep_gamma: list[int] | None = None,
        sweep_steps: list[int] | None = None,
        settings: list[dict] | None = None,
        warmup: int = 1,
        repeats: int = 3,
        budget_s: float | None = None,
        profile: bool = False,
        ar_drafter: str | None = None,
        ar_drafter_kwargs: dict | None = None,
        extra_drafters: dict[str, str] | None = None,
        ckpt_path: str | None = None,
        calibrate: bool = False,
    ) -> dict:
        """Decode the data module's prompts with every method, side by side in this process.

        Args:
            output_dir: where ``bench.json``, ``bench.md`` and the plots go.
            kinds: restrict to these method kinds (verifier, hf, hf_prompt_lookup, hf_assisted, sps, diffusion).
            sweep_num_drafts, sweep_draft_temperature, sweep_gamma, sweep_steps: ablation sweeps of
                SpecDiff-2 (greedy acceptance) over K, T, gamma and denoising steps.
            warmup: prompts decoded once, untimed, before each method.
            repeats: timed decodes of every (method, prompt), interleaved across methods; rows
                report the median repeat and the spread.
            budget_s: seconds the decoding may take: the first repeat always runs, each later one
                only if every row's first-repeat time fits in what is left (bench.md says where
                repeats stopped). None: every repeat runs.
            settings: explicit SpecDiff-2 rows, each a dict of decoding overrides
                (e.g. ``[{num_drafts: 2, gamma: 3}]``, or with a draft-tree shape
                ``[{tree: {min_confidence: 0.1, siblings: [0]}, lookup: true}]``). Rows shape their
                trees only as their own settings say, never from the config's ``decoding``.
            profile: split each round's time into draft, tree, verify, accept, cache; report the
                loop overhead ``1 - (draft + verify) / round``.
            ar_drafter: an AR drafter for SpS and HF assisted decoding: a directory, hub id, named
                verifier or tiny preset, or an AR slice of the verifier (``assets/smollm2/ar_drafter``).
            ar_drafter_kwargs: its :func:`~specdiff_lightning.models.loading.load_drafter` kwargs.
            extra_drafters: more drafters to compare (name -> any drafter spec ``load_drafter`` takes,
                slices of the verifier included), e.g. the undistilled one; each gets a K=1 and a
                K=8 SpecDiff-2 row.
            ckpt_path: a ``fit`` checkpoint whose drafter weights to benchmark.
            calibrate: measure (again) this machine's cost model of the verifier in float32 and
                bfloat16, print it, write ``calibration.{json,md,png}`` to ``output_dir`` and stop:
                what ``tree: auto`` and ``dtype: auto`` read. With ``decoding.compile`` the compiled
                forward's (compiling it in each dtype: minutes on a CPU).
        """
        if calibrate:
            from .bench.calibrate import calibrate_verifier, write_calibration

            # the forward the config decodes through: compiled (decoding.compile) or eager
            report = calibrate_verifier(
                model.verifier.to(self.strategy.root_device), refresh=True, compiled=model.decoding.compile
            )
            out = write_calibration(report, output_dir)
            print((out / "calibration.md").read_text())
            print(f"calibration written to {out}/ (calibration.json, calibration.md, calibration.png)")
            return report
        from .bench import (
            default_methods,
            extra_drafter_methods,
            run_bench,
            setting_methods,
            sweep_methods,
            write_report,
        )
        from .models.loading import load_drafter

        _load_drafter_weights(model, ckpt_path)
        device = self.strategy.root_device
        model.to(device).eval()
        datamodule.setup("predict")
        cfg = model.decoding
        ar = None
        if ar_drafter is not None:
            # a slice is built around the (moved) verifier; any other AR drafter is moved here
            ar = load_drafter(
                ar_drafter, verifier=model.verifier, kind="autoregressive", **(ar_drafter_kwargs or {})
            )
            ar.model.to(device)
        methods = default_methods(cfg, ar is not None) + sweep_methods(
            cfg, sweep_num_drafts or [], sweep_draft_temperature or [], sweep_gamma or [], sweep_steps or []
        )
        methods += setting_methods(settings or [])
        extras = {}
        for name, path in (extra_drafters or {}).items():
            # the main drafter's prefix budget, where it has one (diffusion drafters)
            budget = getattr(model.drafter, "max_prefix_tokens", None)
            extra = load_drafter(path, verifier=model.verifier, max_prefix_tokens=budget)
            extra.model.to(device).eval()
            extras[name] = extra
            methods += extra_drafter_methods(name, cfg)
        if kinds:
            methods = [m for m in methods if m.kind in kinds or m.kind == "verifier"]
        report = run_bench(
            model.verifier,
            model.drafter,
            datamodule.rows,
            cfg,
            methods,
            ar_drafter=ar,
            extra_drafters=extras,
            warmup=warmup,
            repeats=repeats,
            budget_s=budget_s,
            profile=profile,
            progress=self.progress_bar_callback is not None,
        )
        out = write_report(report, output_dir)
        print((out / "bench.md").read_text())
        different = [r["method"] for r in report["rows"] if r["identical_to_verifier"] is False]
        if different:
            raise RuntimeError(
                f"at temperature 0 these methods did not reproduce the verifier's output: {different}"
            )
        return report

    def eval_budget(
        self,
        model: L.LightningModule,
        datamodule: L.LightningDataModule,
        budgets: list[float] | None = None,
        output_dir: str = "runs/eval_budget",
        answer_tokens: int = 32,
        ckpt_path: str | None = None,
    ) -> dict:
        """Time-budgeted reasoning: accuracy vs thinking budget (seconds) for the verifier alone
        and SpecDiff-2, on prompts with reference answers (e.g. MATH-500). Needs ``model.tokenizer``.

        Args:
            budgets: thinking budgets in seconds (default 1, 2, 4, 8).
            answer_tokens: tokens decoded for the answer after "time is up".
        """
        from .budget import run_budget_eval, write_budget_report

        if model.tokenizer is None:
            raise ValueError("eval-budget appends text to the chain of thought: set model.tokenizer")
        _load_drafter_weights(model, ckpt_path)
        model.to(self.strategy.root_device).eval()
        datamodule.setup("predict")
        report = run_budget_eval(
            model.verifier,
            model.drafter,
            model.tokenizer,
            datamodule.rows,
            budgets or [1.0, 2.0, 4.0, 8.0],
            model.decoding,
            answer_tokens=answer_tokens,
            progress=self.progress_bar_callback is not None,
        )
        out = write_budget_report(report, output_dir)
        print((out / "eval_budget.md").read_text())
        return report

    def export(
        self,
        model: L.LightningModule,
        output_dir: str,
        ckpt_path: str | None = None,
        dtype: str | None = None,
        overwrite: bool = False,
        layout: str | None = None,
        datamodule: L.LightningDataModule | None = None,
    ) -> None:
        """Write the trained model (its drafter, or a pretrained LM) to a directory.

        The drafter has its LoRA merged; the weights come from ``ckpt_path`` if given.

        Args:
            output_dir: the directory to write; one that already holds files is refused unless ``overwrite``.
            ckpt_path: a ``fit`` checkpoint whose weights to export (default: the model as configured).
            dtype: cast to this dtype first (``bfloat16``, ``float16``, ``float32``); default: unchanged.
            overwrite: replace what ``output_dir`` holds.
            layout: DFlash drafters only: ``hf`` (transformers' names, the default) or ``zlab``
                (z-lab's, which vLLM and SGLang serve with ``method: dflash``).
        """
        import inspect

        from .models.loading import resolve_dtype
        from .training.exports import check_export_dir

        accepts = inspect.signature(model.export).parameters
        if layout is not None and "layout" not in accepts:
            raise ValueError(
                f"--layout is for DFlash drafters (DFlashDrafterTraining); {type(model).__name__} exports one "
                f"layout only: drop --layout"
            )
        check_export_dir(output_dir, overwrite, "--output_dir", "--overwrite")
        _load_drafter_weights(model, ckpt_path)
        if dtype is not None:
            model.to(resolve_dtype(dtype))
        options = {"layout": layout} if layout is not None else {}
        if (
            "dtype" in accepts
        ):  # written as cast above (unchanged without --dtype), not in the fit-time default
            options["dtype"] = None
        model.export(output_dir, **options)
        print(f"exported to {output_dir}" + (f" ({layout} layout)" if layout else ""))


def _load_drafter_weights(model: L.LightningModule, ckpt_path: str | None) -> None:
    """Load a ``fit`` checkpoint's drafter weights into ``model``, unpickling tensors and plain
    data only (``weights_only=True``): a checkpoint from elsewhere cannot run code."""
    if ckpt_path is None:
        return
    from .decoding.config import DecodingConfig

    # A module built in Python may keep its DecodingConfig (a plain dataclass) in the hyper-parameters.
    with torch.serialization.safe_globals([DecodingConfig]):
        state = torch.load(ckpt_path, map_location="cpu", weights_only=True)["state_dict"]
    missing = [k for k in state if k not in model.state_dict()]
    if missing:
        raise ValueError(
            f"{ckpt_path} does not match this model (unexpected keys {missing[:3]}); same drafter config?"
        )
    model.load_state_dict(state, strict=False)


def _verifier_tokenizer(model: L.LightningModule):
    """The tokenizer of the model's verifier spec (``model.hparams.verifier``), for text prompts when
    ``--tokenizer`` is not given: a named verifier or a checkpoint directory has one. None where the
    spec has none (a tiny preset, a module built from a model object)."""
    from .models.loading import load_tokenizer

    spec = getattr(model, "hparams", {}).get("verifier")
    if not isinstance(spec, str):
        return None
    try:
        return load_tokenizer(spec)
    except (OSError, ValueError):  # no tokenizer there: prompts must then come as prompt_ids
        return None
