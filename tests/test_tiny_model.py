"""The tiny offline model and the digit-successor task: deterministic builds, a round-tripping tokenizer, errors."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
from fixtures_real import TEST_MODEL_CONFIG, tiny_model_dir

from rl.errors import ModelDirError
from rl.models import CHARACTERS, TinyModelConfig, build_tiny_model, load_base_model, load_tokenizer
from rl.models.opened_model import open_model
from rl.problems import DigitSuccessor, constant_baseline_accuracy
from rl.protocols import PromptSource
from rl.types import Prompt

__all__ = ["tiny_model_dir"]


def _digests(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


def test_building_twice_from_one_seed_gives_identical_files(tmp_path: Path, tiny_model_dir: Path) -> None:
    """A base model directory is a pure function of its config."""
    again = build_tiny_model(tmp_path / "again", TEST_MODEL_CONFIG)
    assert _digests(again) == _digests(tiny_model_dir)
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(_digests(again))


def test_different_seeds_give_different_weights(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The seed reaches the weights."""
    other = build_tiny_model(tmp_path / "other", TinyModelConfig(**{**TEST_MODEL_CONFIG.__dict__, "seed": 8}))
    assert _digests(other)["model.safetensors"] != _digests(tiny_model_dir)["model.safetensors"]


def test_building_does_not_consume_the_global_rng(tmp_path: Path) -> None:
    """Callers' seeded streams are unaffected by building a model."""
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_model(tmp_path / "m", TEST_MODEL_CONFIG)
    assert torch.equal(torch.rand(3), expected)


def test_tokenizer_round_trips_every_character_and_prepends_bos(tiny_model_dir: Path) -> None:
    """Each character is one token; decode(encode(x)) == x; encoding starts with <bos>."""
    tok = load_tokenizer(open_model(tiny_model_dir))
    for required in "0123456789=#, -\nabcxyz":
        assert required in CHARACTERS
    text = "3=#### 4, -1\nabc xyz"
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert len(ids) == len(text) + 1
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.decode([*ids, tok.eos_token_id], skip_special_tokens=True) == text
    assert len({tok.pad_token_id, tok.eos_token_id, tok.bos_token_id}) == 3


def test_model_vocab_matches_tokenizer_and_loads_in_eval_mode(tiny_model_dir: Path) -> None:
    tok = load_tokenizer(open_model(tiny_model_dir))
    model = load_base_model(open_model(tiny_model_dir))
    assert model.config.vocab_size == len(tok)
    assert not model.training
    logits = model(torch.tensor([tok("3=")["input_ids"]])).logits  # [1, 3, V]
    assert logits.shape == (1, 3, len(tok))
    assert logits.dtype == torch.float32


def test_missing_model_dir_raises_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(ModelDirError, match="build_tiny_model"):
        load_base_model(open_model(tmp_path / "nope", tokenizer=False))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelDirError, match=r"tokenizer\.json"):
        load_tokenizer(open_model(tmp_path / "empty", weights=False))


def test_bad_config_raises_a_clear_error() -> None:
    with pytest.raises(ValueError, match="divisible"):
        TinyModelConfig(hidden_size=30, heads=4)


def test_digit_successor_is_a_prompt_source_whose_answer_depends_on_the_prompt() -> None:
    src = DigitSuccessor()
    assert isinstance(src, PromptSource)
    prompts = list(src.train_prompts())
    assert [p.question for p in prompts] == [f"{d}=" for d in range(10)]
    assert [p.answer for p in prompts] == ["1", "2", "3", "4", "5", "6", "7", "8", "9", "0"]
    assert list(src.eval_prompts()) == prompts
    assert constant_baseline_accuracy(prompts) == pytest.approx(0.1)


def test_constant_baseline_is_the_most_common_answers_share() -> None:
    prompts = [Prompt("a", "1"), Prompt("b", "1"), Prompt("c", "2"), Prompt("d", "3")]
    assert constant_baseline_accuracy(prompts) == 0.5
    with pytest.raises(ValueError, match="empty"):
        constant_baseline_accuracy([])


@pytest.mark.parametrize(
    ("completion", "reward"), [("4", 1.0), ("#### 4", 1.2), ("x4\n", 1.0), ("45", 0.0), ("#### 5", 0.2), ("", 0.0)]
)
def test_digit_successor_completions_are_scored_alone(completion: str, reward: float) -> None:
    """The scoring contract in rl.problems: rl.rewards.score(completion, answer), the prompt left out."""
    from rl.rewards import score

    prompt = DigitSuccessor().train_prompts()[3]
    assert (prompt.question, prompt.answer) == ("3=", "4")
    assert score(completion, prompt.answer) == pytest.approx(reward)


def test_a_damaged_weights_file_is_a_one_line_model_dir_error(tmp_path: Path) -> None:
    """An emptied or truncated model.safetensors is the directory's fault: a one-line ModelDirError (an InputError,
    exit 2), not safetensors' own error and a traceback (the hostile-directory fuzzer found exit 70)."""
    from rl.errors import InputError, ModelDirError
    from rl.models.tiny import load_base_model

    model_dir = build_tiny_model(tmp_path / "m")
    (model_dir / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelDirError, match="weights cannot be read") as caught:
        load_base_model(open_model(model_dir, tokenizer=False))
    assert isinstance(caught.value, InputError) and "\n" not in str(caught.value)


def test_a_damaged_tokenizer_file_is_a_one_line_model_dir_error(tmp_path: Path) -> None:
    """An emptied tokenizer.json is a one-line ModelDirError too (the fuzzer found exit 70 from json)."""
    model_dir = build_tiny_model(tmp_path / "m")
    (model_dir / "tokenizer.json").write_bytes(b"")
    with pytest.raises(ModelDirError, match="tokenizer cannot be read"):
        load_tokenizer(open_model(model_dir, weights=False))
