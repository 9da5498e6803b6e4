"""`rl demo grpo --model NAME|DIR`: a real model directory through the whole loop, learning `Addition`, prompted
through its chat template and stopped at its end-of-turn token. The tiny model's directory stands in here (with a
chat template added); `nox -s real-model` runs SmolLM2 itself."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rl.cli import main
from rl.models import load_tokenizer
from rl.models.chat import encode_prompt
from rl.models.opened_model import open_model
from rl.models.tiny import TinyModelConfig, build_tiny_model
from rl.problems import Addition, problem_set
from rl.rewards import is_correct

TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with a chat template in its tokenizer config, as a real instruct model's directory has."""
    model_dir = build_tiny_model(tmp_path_factory.mktemp("chat-model"), TinyModelConfig(seed=5, max_position=256))
    config_path = model_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    return model_dir


def test_a_prompt_is_the_models_chat_template_around_the_question_where_it_has_one(
    chat_model: Path, tmp_path: Path
) -> None:
    tokenizer = load_tokenizer(open_model(chat_model, weights=False))
    ids = encode_prompt(tokenizer, "what is 2 + 3?")
    assert tokenizer.decode(ids, skip_special_tokens=True) == "user: what is 2 + 3?\nassistant:"
    plain = build_tiny_model(tmp_path / "plain", TinyModelConfig(seed=5))
    plain_tokenizer = load_tokenizer(open_model(plain, weights=False))
    assert encode_prompt(plain_tokenizer, "3=") == plain_tokenizer("3=")["input_ids"]  # no template: as it was


def test_addition_holds_out_problems_never_trained_on_and_its_answers_score_as_text() -> None:
    task = problem_set("addition")
    assert isinstance(task, Addition)
    train, held_out = task.train_prompts(), task.eval_prompts()
    assert len(train) + len(held_out) == 100 and len(held_out) == 36
    assert not {p.question for p in train} & {p.question for p in held_out}
    first = held_out[0]
    a, b = (int(x) for x in first.question.removeprefix("What is ").split("?")[0].split(" + "))
    assert first.answer == str(a + b)
    assert is_correct(f"The answer is {a + b}.", first.answer) and not is_correct(
        f"{a} + {b} = {a + b + 1}", first.answer
    )


@pytest.mark.heavy
def test_demo_with_a_model_directory_trains_it_on_addition(chat_model: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    argv = ["demo", "grpo", "--model", str(chat_model), "--iterations", "2", "--prompts", "2", "--samples", "2"]
    assert main([*argv, "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["model"] == str(chat_model) and summary["policy_version"] == 2
    assert summary["constant_baseline_accuracy"] == pytest.approx(4 / 36)  # 36 held-out sums, 9 the commonest
    assert not list(out.glob("base-*"))  # the given directory is used as it is, not a tiny model built in the run
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["sample_question"].startswith("What is ")


def test_demo_refuses_a_model_that_is_neither_pinned_nor_a_directory(tmp_path: Path, capsys) -> None:
    assert main(["demo", "grpo", "--model", "smollm3", "--out", str(tmp_path / "run")]) == 2
    assert "neither a pinned model (smollm2) nor an existing directory" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_demo_refuses_a_model_directory_without_a_tokenizer(chat_model: Path, tmp_path: Path, capsys) -> None:
    broken = shutil.copytree(chat_model, tmp_path / "broken")
    (broken / "tokenizer.json").unlink()
    assert main(["demo", "grpo", "--model", str(broken), "--out", str(tmp_path / "run")]) == 2
    assert "lacks tokenizer.json" in capsys.readouterr().err
