"""`rl bench --sections vllm --model`: the option reaches the real-model comparison, is refused without vLLM before
any model is resolved, and the requests are the demo's (group size, tokens, held-out seeds). No timing asserted."""

from __future__ import annotations

import importlib.util

import pytest

from rl.bench import vllm_real
from rl.cli import main
from rl.deploy.demo import grpo_demo_config
from rl.problems import Addition
from rl.seeding import eval_problem_seed
from rl.types import ArtifactRef


def test_vllm_section_with_model_runs_the_real_model_comparison(capsys, monkeypatch):
    calls = []

    def fake(model, *, repeats):
        calls.append((model, repeats))
        return {"vllm_real_group_vllm_over_torch": 0.5}

    monkeypatch.setattr(vllm_real, "vllm_real_model_bench", fake)
    assert main(["bench", "--sections", "vllm", "--model", "some-model", "--repeats", "2"]) == 0
    assert calls == [("some-model", 2)]
    assert "vllm_real_group_vllm_over_torch" in capsys.readouterr().out


def test_vllm_real_model_bench_without_vllm_is_refused_before_the_model_is_resolved(capsys, monkeypatch):
    import rl.models.pretrained as pretrained

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real_find_spec(name))
    monkeypatch.setattr(pretrained, "resolve_model", lambda spec: pytest.fail("resolved a model without vLLM"))
    assert main(["bench", "--sections", "vllm", "--model", "smollm2"]) == 2
    assert "the vllm section needs vLLM" in capsys.readouterr().err


def test_real_model_requests_are_the_demos():
    adapter = ArtifactRef(uri="file:///a", digest="d" * 64)
    config = grpo_demo_config(iterations=1, real_model=True)
    cases = vllm_real.real_model_requests(adapter)
    assert set(cases) == set(vllm_real.CASES)
    shapes = {case: (len(r), {q.n for q in r}) for case, r in cases.items()}
    held_out = Addition().eval_prompts()
    assert shapes == {
        "group": (1, {config.group_size}),
        "iteration": (4, {config.group_size}),
        "heldout": (len(held_out), {config.eval_k}),
    }
    for requests in cases.values():
        assert {r.max_tokens for r in requests} == {config.max_tokens}
        assert {r.adapter for r in requests} == {adapter}
    assert [r.prompt for r in cases["heldout"]] == list(held_out)
    assert [r.seed for r in cases["heldout"]] == [eval_problem_seed(config.seed, i) for i in range(len(held_out))]
    assert len({r.seed for r in cases["iteration"]}) == 4  # each group its own stream
