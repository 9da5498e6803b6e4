"""A model directory's tokenizer and chat template run in a bounded worker (`rl.models.sandbox`): prompts come out as
transformers' own `apply_chat_template` ids, and a template or pre-tokenizer that would fill memory, run forever or
panic the tokenizers library ends `rl demo grpo --model DIR` in one line with exit status 2. The limits are injected
small (1 s of CPU, 256 MiB); the wall-clock figures are generous guards against a hang only."""

from __future__ import annotations

import gc
import json
import os
import resource
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from transformers import PreTrainedTokenizerFast

from rl.cli import main
from rl.errors import ModelDirError, ModelFileError, ModelSandboxError
from rl.models import load_tokenizer
from rl.models import sandbox as sandbox_module
from rl.models.chat import decode_texts, encode_prompts
from rl.models.opened_model import open_model
from rl.models.pretrained import SMOLLM2, model_cache_root
from rl.models.sandbox import SandboxLimits, TokenizerSandbox, in_process, sandbox_of
from rl.models.tiny import TinyModelConfig, build_tiny_model, check_tokenizer

SMALL = SandboxLimits(cpu_s=1, wall_s=60.0, memory_bytes=256 << 20, text_chars=1 << 16)
# SmolLM2-135M-Instruct's chat template (Apache-2.0), as its converted directory holds it.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
QUESTIONS = ["What is 12 + 34?", "What is 7 + 0?\nAnswer:", ""]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("sandbox-model"), TinyModelConfig(seed=3, max_position=256))


def _with(tiny_dir: Path, dest: Path, *, template: str | None = None, pre_tokenizer: Any = None) -> Path:
    """A copy of the tiny model directory with `template` as its chat template and/or another pre-tokenizer."""
    model_dir = shutil.copytree(tiny_dir, dest)
    if template is not None:
        config = json.loads((model_dir / "tokenizer_config.json").read_text())
        (model_dir / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    if pre_tokenizer is not None:
        tokenizer = json.loads((model_dir / "tokenizer.json").read_text())
        (model_dir / "tokenizer.json").write_text(json.dumps({**tokenizer, "pre_tokenizer": pre_tokenizer}))
    return model_dir


def _ids(encoded: Any) -> list[int]:
    """transformers 5 returns an encoding from `apply_chat_template(tokenize=True)`, 4.x the list of ids."""
    return list(encoded["input_ids"] if isinstance(encoded, Mapping) else encoded)


@pytest.mark.parametrize("template", [SMOLLM2_TEMPLATE, None], ids=["smollm2-template", "no-template"])
def test_prompts_from_the_worker_are_transformers_own_ids(tiny_dir: Path, tmp_path: Path, template: str | None) -> None:
    """The worker's ids and texts equal transformers' computed in this process from the same directory."""
    model_dir = _with(tiny_dir, tmp_path / "m", template=template)
    tokenizer = load_tokenizer(open_model(model_dir, weights=False))
    assert sandbox_of(tokenizer) is not None  # the worker computes them, not this process
    reference = PreTrainedTokenizerFast.from_pretrained(str(model_dir))
    expected = [
        _ids(reference.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True))
        if template
        else reference(q)["input_ids"]
        for q in QUESTIONS
    ]
    got = encode_prompts(tokenizer, QUESTIONS)
    assert got == expected
    assert decode_texts(tokenizer, got) == [reference.decode(ids, skip_special_tokens=True) for ids in expected]


@pytest.mark.heavy
def test_smollm2s_own_tokenizer_gives_its_own_ids_through_the_worker() -> None:
    """SmolLM2's converted directory (where a previous `--model smollm2` left it): the same ids as transformers'."""
    model_dir = model_cache_root() / SMOLLM2.cache_name
    if not (model_dir / "tokenizer.json").is_file():
        pytest.skip(f"no converted SmolLM2 at {model_dir}")
    tokenizer = load_tokenizer(open_model(model_dir, weights=False))
    reference = PreTrainedTokenizerFast.from_pretrained(str(model_dir))
    assert reference.chat_template and sandbox_of(tokenizer) is not None
    for question in QUESTIONS:
        messages = [{"role": "user", "content": question}]
        expected = _ids(reference.apply_chat_template(messages, add_generation_prompt=True))
        assert encode_prompts(tokenizer, [question]) == [expected]


HOSTILE = {
    # 10 GB asked for in one expression: the worker's address-space limit refuses it at once.
    "gigabytes": ({"template": "{{ 'x' * 10**10 }}"}, "MemoryError"),
    # Two nested loops that print nothing: only the CPU limit ends them (a deadline between chunks never fires).
    "nested-loops": (
        {"template": "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}x"},
        "more than 1 s of CPU",
    ),
    # Within memory, but more text than any prompt: refused by length.
    "long-prompt": ({"template": "{{ 'x' * 10**6 }}"}, "rendered 1000000 characters"),
    # Catastrophic backtracking: onig gives up and the tokenizers library panics (a BaseException).
    "backtracking-regex": (
        {
            "pre_tokenizer": {
                "type": "Split",
                "pattern": {"Regex": "(\\D+)+\\d{9}"},
                "behavior": "Isolated",
                "invert": False,
            }
        },
        "PanicException",
    ),
}


# nested-loops burns the worker's whole 1 s CPU limit (RLIMIT_CPU counts whole seconds) and runs a demo: heavy.
CASES = [pytest.param(c, marks=pytest.mark.heavy) if c == "nested-loops" else c for c in sorted(HOSTILE)]


@pytest.mark.parametrize("case", CASES)
def test_a_hostile_tokenizer_ends_the_demo_in_one_line_with_exit_2(
    tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    edits, said = HOSTILE[case]
    model_dir = _with(tiny_dir, tmp_path / "hostile", **edits)
    monkeypatch.setattr(sandbox_module, "DEFAULT_LIMITS", SMALL)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    argv = ["demo", "grpo", "--model", str(model_dir), "--out", str(tmp_path / "run"), "--iterations", "1"]
    assert main([*argv, "--prompts", "1", "--samples", "2"]) == 2
    assert time.monotonic() - started < 120  # a guard against a hang; the bound itself is SMALL's 1 s of CPU
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert str(model_dir) in lines[0] and said in lines[0], lines[0]
    assert not (tmp_path / "run").exists()  # refused at the door (resolve_model), before the run wrote anything
    # 10 GB was never allocated here (ru_maxrss is in KiB on Linux).
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 512 << 10


def _sleep(_tokenizer: object, seconds: float) -> None:
    time.sleep(seconds)


def _megabyte(_tokenizer: object) -> bytes:
    return b"x" * (1 << 20)


def _boom(_tokenizer: object) -> None:
    raise ModelDirError("model directory /x: its tokenizer said no; fix it")


def test_a_worker_that_waits_without_computing_is_ended_by_the_wall_clock_guard() -> None:
    """No CPU used, so only the guard (injected: 1 s) ends it; the next request forks a new worker."""
    sandbox = TokenizerSandbox(lambda: None, "/models/m", SandboxLimits(cpu_s=1, wall_s=1.0))
    with pytest.raises(ModelSandboxError, match="did not finish within 1 s"):
        sandbox.run(_sleep, 3600.0)
    assert sandbox.run(_sleep, 0.0) is None
    with pytest.raises(ModelDirError, match="said no"):  # our own errors cross as they are
        sandbox.run(_boom)
    sandbox.close()


def test_a_reply_over_its_limit_is_refused_and_the_next_request_gets_a_new_worker() -> None:
    sandbox = TokenizerSandbox(lambda: None, "/models/m", SandboxLimits(cpu_s=5, wall_s=60.0, reply_bytes=1 << 16))
    with pytest.raises(ModelSandboxError, match="larger than 65536 bytes"):
        sandbox.run(_megabyte)
    assert sandbox.run(_sleep, 0.0) is None
    sandbox.close()


class _Panic(BaseException):
    """What pyo3 raises for a Rust panic: a BaseException named PanicException."""


_Panic.__name__ = "PanicException"


def test_a_library_panic_in_this_process_is_a_typed_error_but_ctrl_c_is_not() -> None:
    def panic() -> None:
        raise _Panic("Onig: Regex search error: retry-limit-in-match over")

    def interrupt() -> None:
        raise KeyboardInterrupt

    with pytest.raises(ModelSandboxError, match="retry-limit-in-match"):
        in_process("/models/m", "encoding", panic)
    with pytest.raises(KeyboardInterrupt):
        in_process("/models/m", "encoding", interrupt)


def test_a_tokenizers_worker_ends_with_it(tiny_dir: Path) -> None:
    """No worker outlives the tokenizer it serves (nor, by PR_SET_PDEATHSIG, this process)."""
    tokenizer = load_tokenizer(open_model(tiny_dir, weights=False))
    sandbox = sandbox_of(tokenizer)
    assert sandbox is not None and sandbox._worker is not None
    pid = sandbox._worker.pid
    os.kill(pid, 0)  # alive while the tokenizer is
    del tokenizer, sandbox
    gc.collect()
    with pytest.raises(ProcessLookupError):  # killed and reaped: not even a zombie is left
        os.kill(pid, 0)


def test_a_sparse_gigabyte_chat_template_is_refused_before_a_byte_is_read(tiny_dir: Path, tmp_path: Path) -> None:
    """transformers reads chat_template.jinja whole: the checked opener refuses it by its size, in the worker, before
    reading it (the worker's memory bound stays behind it)."""
    model_dir = _with(tiny_dir, tmp_path / "sparse")
    with (model_dir / "chat_template.jinja").open("wb") as template:
        template.truncate(1 << 30)  # 1 GiB that takes no disk
    with pytest.raises(ModelFileError, match=r"chat_template.jinja is 1073741824 bytes, more than"):
        check_tokenizer(open_model(model_dir, weights=False), limits=SMALL)
