"""The torch sampler's completion texts: each is the tokenizer's decoding of its tokens, and a generate call asks the
tokenizer (its worker, a round trip each) once for all the completions it has not decoded yet."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures_real import adapter_dirs, refs, run, store, tiny_model_dir

from rl.models.chat import decode_texts
from rl.models.opened_model import open_model
from rl.samplers import torch_sampler
from rl.samplers.torch_sampler import TorchSampler
from rl.storage.artifacts import LocalArtifacts
from rl.types import Prompt, RolloutRequest

__all__ = ["adapter_dirs", "refs", "store", "tiny_model_dir"]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[list[tuple[int, ...]]]:
    """Every batch the sampler sends to the tokenizer, recorded, then decoded by the real function."""
    seen: list[list[tuple[int, ...]]] = []

    def recording(tokenizer: object, token_ids: list[tuple[int, ...]]) -> list[str]:
        seen.append(list(token_ids))
        return decode_texts(tokenizer, token_ids)

    monkeypatch.setattr(torch_sampler, "decode_texts", recording)
    return seen


def test_a_generate_call_decodes_its_new_completions_in_one_batch(
    tiny_model_dir: Path, store: LocalArtifacts, refs: dict, calls: list[list[tuple[int, ...]]]
) -> None:
    """Completions equal the tokenizer's own decoding; one call per generate, none when every text is known."""
    sampler = TorchSampler(open_model(tiny_model_dir), store)
    requests = [
        RolloutRequest(
            group_id=g,
            prompt=Prompt(f"{g}=", "0"),
            n=8,
            adapter=refs["trained"],
            policy_version=0,
            seed=g,
            max_tokens=4,
        )
        for g in range(3)
    ]
    groups = run(sampler.generate_groups(requests))
    rollouts = [r for group in groups for r in group]
    assert len(calls) == 1 and len(calls[0]) > 1  # several new completions, one call
    assert sorted(calls[0]) == sorted({tuple(r.token_ids) for r in rollouts})  # each distinct completion once
    expected = decode_texts(sampler.tokenizer, [r.token_ids for r in rollouts])
    assert [r.completion for r in rollouts] == expected
    again = run(sampler.generate_groups(requests))  # the same seeds: the same completions, all known
    assert len(calls) == 1
    assert [r.completion for g in again for r in g] == expected


def test_the_sampler_keeps_a_bounded_number_of_texts(
    tiny_model_dir: Path, store: LocalArtifacts, monkeypatch: pytest.MonkeyPatch, calls: list
) -> None:
    """Past `DECODED_TEXTS` the oldest text goes, and asking for it again decodes it again (the same text)."""
    monkeypatch.setattr(torch_sampler, "DECODED_TEXTS", 2)
    sampler = TorchSampler(open_model(tiny_model_dir), store)
    first = sampler.decode_many([[5], [6], [7]])
    assert len(calls) == 1
    assert sampler.decode_many([[7]]) == first[2:] and len(calls) == 1  # kept
    assert sampler.decode_many([[5]]) == first[:1] and len(calls) == 2  # the oldest went; decoded again
