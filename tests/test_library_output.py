"""What transformers and tokenizers print while a command runs goes through the CLI's own escaping
(`rl.library_output`): a tensor named with escape sequences reaches the terminal as text, never as escapes."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from rl.library_output import MAX_LINES, escaped_library_output
from rl.models.tiny import TinyModelConfig, build_tiny_model

ESCAPES = "\x1b]0;pwned\x07\x1b[2J\x1b[31m"


@pytest.fixture(scope="module")
def escape_named_tensor(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with one more tensor, named with terminal escapes: transformers' load report lists it."""
    model_dir = build_tiny_model(tmp_path_factory.mktemp("esc-model"), TinyModelConfig(seed=4, max_position=256))
    weights = load_file(model_dir / "model.safetensors")
    weights[f"{ESCAPES}.weight"] = torch.zeros(2)
    save_file(weights, model_dir / "model.safetensors", metadata={"format": "pt"})
    return model_dir


def test_transformers_load_report_of_an_escape_named_tensor_is_escaped(escape_named_tensor: Path) -> None:
    """Whatever handler prints transformers' records gets them escaped: one on transformers' own logger here (4.x
    does not propagate to the root), transformers' own in a run."""
    logger, handler = logging.getLogger("transformers"), _Records()
    logger.addHandler(handler)
    try:
        # transformers' own loader, past the checked opener (which refuses such a name first: rl.models.model_files)
        with escaped_library_output():
            AutoModelForCausalLM.from_pretrained(str(escape_named_tensor))
    finally:
        logger.removeHandler(handler)
    text = "\n".join(r.getMessage() for r in handler.records)
    assert "\\x1b]0;pwned\\x07" in text  # the report named it, as text
    assert "\x1b]" not in text and "\x07" not in text


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_warnings_and_long_library_logs_are_escaped_and_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    logger, handler = logging.getLogger("tokenizers.test"), _Records()
    monkeypatch.setattr(logger, "disabled", False)
    logger.addHandler(handler)
    before = logging.getLogRecordFactory()
    shown_warnings: list[str] = []
    monkeypatch.setattr(warnings, "showwarning", lambda message, *_args: shown_warnings.append(str(message)))
    with escaped_library_output():
        warnings.showwarning(UserWarning(f"tensor {ESCAPES}"), UserWarning, "lib.py", 1, None, "")
        logger.warning("%s", "\n".join(["line"] * (MAX_LINES + 10)))
    assert shown_warnings == ["tensor \\x1b]0;pwned\\x07\\x1b[2J\\x1b[31m"]
    logger.removeHandler(handler)
    assert handler.records[-1].getMessage().endswith("(10 more lines)")
    assert logging.getLogRecordFactory() is before  # the factory is ours only within the command


@pytest.mark.heavy
def test_the_cli_prints_no_raw_escape_from_a_model_directorys_tensor_names(
    escape_named_tensor: Path, tmp_path: Path
) -> None:
    """A real process, whose stderr in-process capture cannot see: the checked opener refuses the name, escaped."""
    model_dir = shutil.copytree(escape_named_tensor, tmp_path / "model")
    argv = ["demo", "grpo", "--model", str(model_dir), "--out", str(tmp_path / "run"), "--iterations", "1"]
    done = subprocess.run(
        [sys.executable, "-m", "rl.cli", *argv, "--prompts", "1", "--samples", "2"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        check=False,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "\\x1b]0;pwned\\x07" in done.stderr and "Traceback" not in done.stderr  # named, as text, in one line
    assert "\x1b]" not in done.stderr + done.stdout and "\x07" not in done.stderr + done.stdout
