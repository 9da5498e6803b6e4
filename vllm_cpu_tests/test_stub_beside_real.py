"""The same calls through `fakes.vllm_stub` and real vLLM (the session's warm `LLM`): the stub is never kinder.

Each case runs on both and compares what can be compared across two samplers (shapes, refusals, seeding, which
adapter a LoRA id serves), never the sampled bits. LoRA ids here start at 500, clear of the engine's own (1, 2, ...).
What this found is in the stub's docstring: front-end refusals are `VLLMValidationError`s (not ValueErrors), an
empty or too long prompt is refused, and an adapter that fails to load kills the engine core (seen on the CPU build;
not rerun here, since it would cost the session a second engine start).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

import fakes.vllm_stub as stub
from rl.gpu import vllm_cpu_llm_kwargs
from rl.models.opened_model import open_model
from rl.samplers.vllm_requests import engine_llm_kwargs


@pytest.fixture(scope="module")
def both(engine: Any, model_dir: Path) -> dict[str, tuple[Any, Any]]:
    """name -> (the vllm-like module, its LLM): real vLLM's warm one, and a stub with the same keywords."""
    import vllm
    import vllm.lora.request  # the LoRARequest the cases build

    stub_llm = stub.LLM(**engine_llm_kwargs(model_dir, vllm_cpu_llm_kwargs()))
    return {"real": (vllm, engine.llm), "stub": (stub, stub_llm)}


@pytest.fixture(scope="module")
def adapter_dirs(engine: Any, adapters: Any) -> dict[str, str]:
    import asyncio

    return {name: str(asyncio.run(engine._adapter_dir(ref))) for name, (ref, _) in adapters.items()}


def _lora(module: Any, name: str, lora_id: int, path: str) -> Any:
    return module.lora.request.LoRARequest(name, lora_id, path)


def _ids(model_dir: Path, text: str = "3=") -> dict[str, list[int]]:
    from rl.models import load_tokenizer

    return {"prompt_token_ids": [int(t) for t in load_tokenizer(open_model(model_dir))(text)["input_ids"]]}


def _shape(output: Any, eos: int, decode: Any) -> dict[str, Any]:
    """What a `RequestOutput` must look like, as far as it does not depend on the sampled bits."""
    completions = sorted(output.outputs, key=lambda c: c.index)
    return {
        "prompt": output.prompt,
        "prompt_token_ids": list(output.prompt_token_ids),
        "prompt_logprobs": output.prompt_logprobs,
        "finished": output.finished,
        "indices": [c.index for c in completions],
        "completions": [
            {
                "token_ids_type": type(c.token_ids).__name__,
                "one_logprob_entry_per_token": len(c.logprobs) == len(c.token_ids),
                "entries_hold_the_sampled_token": all(
                    list(d) == [t] for d, t in zip(c.logprobs, c.token_ids, strict=True)
                ),
                "decoded_tokens": [d[t].decoded_token for d, t in zip(c.logprobs, c.token_ids, strict=True)]
                == [decode([t], skip_special_tokens=False) for t in c.token_ids],
                "cumulative_is_the_sum": math.isclose(
                    c.cumulative_logprob,
                    math.fsum(d[t].logprob for d, t in zip(c.logprobs, c.token_ids, strict=True)),
                    abs_tol=1e-4,
                ),
                "finish_reason": "stop" if c.token_ids[-1] == eos else "length",
                "finish_reason_agrees": c.finish_reason == ("stop" if c.token_ids[-1] == eos else "length"),
                "stop_reason": c.stop_reason,
                "text_is_the_decoded_tokens": c.text == decode(c.token_ids, skip_special_tokens=True),
            }
            for c in completions
        ],
    }


def test_outputs_have_the_same_shape(both: Any, model_dir: Path, adapter_dirs: dict[str, str]) -> None:
    """A token-id prompt, n=4, `logprobs=0`, a LoRA: the same fields, types and invariants on both (the Logprob's
    `rank`, which the engine never reads, is left out: the stub does not compute it)."""
    from rl.models import load_tokenizer

    tokenizer = load_tokenizer(open_model(model_dir))
    shapes = {}
    for name, (module, llm) in both.items():
        sp = module.SamplingParams(n=4, temperature=1.0, top_p=1.0, seed=5, logprobs=0, max_tokens=12)
        (out,) = llm.generate([_ids(model_dir)], sp, lora_request=_lora(module, "shape", 500, adapter_dirs["a"]),
                              use_tqdm=False)  # fmt: skip
        shape = _shape(out, tokenizer.eos_token_id, tokenizer.decode)
        for c in shape["completions"]:  # which completions stopped at <eos> depends on the bits sampled
            c.pop("finish_reason")
        shapes[name] = shape
    assert shapes["stub"] == shapes["real"]


def test_completion_i_is_seeded_seed_plus_i_on_both(both: Any, model_dir: Path) -> None:
    for name, (module, llm) in both.items():

        def tokens(seed: int, n: int, module: Any = module, llm: Any = llm) -> list[list[int]]:
            sp = module.SamplingParams(n=n, seed=seed, logprobs=0, max_tokens=8)
            (out,) = llm.generate([_ids(model_dir)], sp, use_tqdm=False)
            return [list(c.token_ids) for c in sorted(out.outputs, key=lambda c: c.index)]

        assert tokens(100, 4) == [tokens(100 + i, 1)[0] for i in range(4)], name


def _sp(module: Any) -> Any:
    return module.SamplingParams(max_tokens=2)


REFUSED = {
    "an out-of-vocabulary token id": lambda m, ids: ([{"prompt_token_ids": [9999]}], _sp(m), {}),
    "a negative token id": lambda m, ids: ([{"prompt_token_ids": [-1]}], _sp(m), {}),
    "an empty prompt": lambda m, ids: ([{"prompt_token_ids": []}], _sp(m), {}),
    "a prompt longer than max_model_len": lambda m, ids: (
        [{"prompt_token_ids": ids["prompt_token_ids"] * 40}],
        _sp(m),
        {},
    ),
    "fewer lora requests than prompts": lambda m, ids: ([ids, ids], _sp(m), {"lora_request": [None]}),
    "more sampling params than prompts": lambda m, ids: ([ids], [_sp(m)] * 2, {}),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_the_stub_refuses_what_vllm_refuses_and_both_live_on(case: str, both: Any, model_dir: Path) -> None:
    """Front-end refusals: the same exception class on both, and each engine still serves the next request."""
    raised = {}
    for name, (module, llm) in both.items():
        prompts, params, kwargs = REFUSED[case](module, _ids(model_dir))
        with pytest.raises(Exception) as info:  # which class: the assertion below
            llm.generate(prompts, params, use_tqdm=False, **kwargs)
        raised[name] = (type(info.value).__name__, isinstance(info.value, ValueError))
        assert len(llm.generate([_ids(model_dir)], module.SamplingParams(max_tokens=2), use_tqdm=False)) == 1
    assert raised["stub"] == raised["real"], raised


def test_lora_ids_are_cached_as_vllm_caches_them(both: Any, model_dir: Path, adapter_dirs: dict[str, str]) -> None:
    """A known id is served from the cache even when its path changed (stale); an id evicted from the
    `max_cpu_loras` LRU (here 2) is loaded again from its new path. Which adapter served is read from the tokens."""
    outcomes = {}
    for name, (module, llm) in both.items():

        def tokens(lora: Any, module: Any = module, llm: Any = llm) -> list[list[int]]:
            sp = module.SamplingParams(n=4, seed=7, logprobs=0, max_tokens=8)
            (out,) = llm.generate([_ids(model_dir)], sp, lora_request=lora, use_tqdm=False)
            return [list(c.token_ids) for c in sorted(out.outputs, key=lambda c: c.index)]

        a = tokens(_lora(module, "a", 501, adapter_dirs["a"]))
        b = tokens(_lora(module, "b", 502, adapter_dirs["b"]))
        assert a != b
        stale = tokens(_lora(module, "b-as-501", 501, adapter_dirs["b"]))
        for lora_id in (503, 504, 505):  # three more ids through a cache of two: 501 is evicted
            tokens(_lora(module, f"c-{lora_id}", lora_id, adapter_dirs["c"]))
        reloaded = tokens(_lora(module, "b-as-501", 501, adapter_dirs["b"]))
        outcomes[name] = tuple(_which(got, a, b) for got in (stale, reloaded))
    assert outcomes["stub"] == outcomes["real"], outcomes


def _which(got: list[list[int]], a: list[list[int]], b: list[list[int]]) -> str:
    return "a" if got == a else "b" if got == b else "neither"
