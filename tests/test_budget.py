"""eval-budget: answer extraction and the time-budgeted decoding loop."""

from helpers import tiny_distillation


def test_answer_extraction_and_scoring():
    from specdiff_lightning.budget import extract_answer, is_correct

    assert extract_answer("so \\boxed{\\frac{1}{2}} done") == "\\frac{1}{2}"
    assert extract_answer("x = 3, then 41.5") == "41.5"
    assert extract_answer("no answer") is None
    assert (
        is_correct("\\dfrac{1}{2}", "\\frac{1}{2}") and not is_correct("3", "4") and not is_correct(None, "1")
    )


def test_eval_budget_mechanics(tmp_path):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    from specdiff_lightning.budget import run_budget_eval, write_budget_report

    words = [
        "<unk>",
        "time",
        "is",
        "up",
        ",",
        "summarise",
        "your",
        "answer",
        ".",
        "final",
        ":",
        "1",
        "2",
        "+",
        "?",
    ]
    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok)
    model = tiny_distillation()
    rows = [{"id": "a", "prompt_ids": [11, 13, 11, 14], "answer": "2"}]
    report = run_budget_eval(
        model.verifier,
        model.drafter,
        tokenizer,
        rows,
        [0.01, 0.05],
        model.decoding,
        answer_tokens=4,
        progress=False,
    )
    assert [(r["budget_s"], r["method"]) for r in report["rows"]] == [
        (0.01, "verifier"),
        (0.01, "specdiff2"),
        (0.05, "verifier"),
        (0.05, "specdiff2"),
    ]
    assert all(r["mean_thinking_tokens"] >= 1 for r in report["rows"])
    out = write_budget_report(report, tmp_path)
    assert (out / "accuracy_vs_budget.png").stat().st_size > 0 and (out / "eval_budget.md").exists()
