"""Bad input at the command line: one `error:` line naming the problem and the fix, a one-line hint,
a non-zero exit status, no traceback (issue 19); SPECDIFF_DEBUG=1 keeps the traceback."""

from pathlib import Path

import lightning.pytorch  # noqa: F401  (see test_commands.py: Lightning's log handler binds at import)
import pytest

from specdiff_lightning.cli import main
from specdiff_lightning.cli.errors import DEBUG_ENV, user_message

ROOT = Path(__file__).parents[2]
PREDICT = [
    "predict",
    "--config",
    str(ROOT / "configs" / "tiny_predict.yaml"),
    "--trainer.enable_progress_bar",
    "false",
]


def _one_error(capsys, hint: str = "SPECDIFF_DEBUG=1") -> str:
    """The one ``error:`` line on stderr (Lightning's log lines may share it), checked to come without a
    traceback and with a short hint after it."""
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    errors = [i for i, line in enumerate(lines) if line.startswith("error: ")]
    assert len(errors) == 1, err
    after = lines[errors[0] + 1]
    assert after.startswith("(") and hint in after and len(after) < 120, after
    return lines[errors[0]]


def _prompts(tmp_path, text: str) -> str:
    path = tmp_path / "prompts.jsonl"
    path.write_text(text)
    return str(path)


@pytest.fixture(autouse=True)
def _in_tmp_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # tiny_predict.yaml writes runs/tiny/predict relative to here
    monkeypatch.delenv(DEBUG_ENV, raising=False)


def test_a_malformed_prompt_line_names_its_file_and_line(tmp_path, capsys):
    path = _prompts(tmp_path, '{"id": "a", "prompt_ids": [1, 2]}\n{"id": "b", oops\n')
    assert main([*PREDICT, "--data.init_args.path", path]) == 1
    assert f"{path}:2: malformed JSON" in _one_error(capsys)


def test_a_record_without_a_prompt_says_what_it_needs(tmp_path, capsys):
    path = _prompts(tmp_path, '{"id": "a", "prompt_ids": [1, 2]}\n{"id": "c", "question": "x"}\n')
    assert main([*PREDICT, "--data.init_args.path", path]) == 1
    error = _one_error(capsys)
    assert f"{path}:2: a prompt record needs 'prompt' (text) or 'prompt_ids'" in error
    assert "['id', 'question']" in error


def test_a_training_config_given_to_predict_is_named(capsys):
    config = ROOT / "configs" / "smollm2" / "drafter_mdm.yaml"
    assert main(["predict", "--config", str(config)]) == 1
    error = _one_error(capsys)
    assert "SliceDrafterTraining is a training module" in error and "configs/smollm2/predict.yaml" in error


def test_the_projects_own_error_is_not_wrapped_by_jsonargparse(capsys):
    assert main([*PREDICT, "--model.init_args.decoding.tree", '{"min_confidence": 0.1, "sibling": [0]}']) == 1
    error = _one_error(capsys)
    assert error.startswith("error: decoding.tree has unknown option(s) ['sibling']")
    assert "Union" not in error


def test_an_unknown_argument_is_one_line_with_the_help_command(capsys):
    assert main([*PREDICT, "--model.init_args.num_draft", "2"]) == 2
    assert "Option 'num_draft' is not accepted" in _one_error(capsys, hint="predict --help")


def test_debug_keeps_the_traceback(tmp_path, monkeypatch):
    monkeypatch.setenv(DEBUG_ENV, "1")
    path = _prompts(tmp_path, "{oops\n")
    with pytest.raises(ValueError, match="malformed JSON"):
        main([*PREDICT, "--data.init_args.path", path])


def test_only_errors_the_project_raises_on_purpose_are_shortened():
    from specdiff_lightning.decoding.config import DecodingConfig

    with pytest.raises(ValueError) as ours:
        DecodingConfig(tree={"nope": 1})
    assert user_message(ours.value) == (str(ours.value), 1)
    with pytest.raises(ValueError) as elsewhere:
        raise ValueError("raised outside the package")
    assert user_message(elsewhere.value) is None  # not ours: a bug keeps its traceback
    with pytest.raises(AttributeError) as bug:
        DecodingConfig().no_such_attribute  # noqa: B018
    assert user_message(bug.value) is None
