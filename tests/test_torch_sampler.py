"""TorchSampler: seeded groups whose recorded log-probs are the policy's own, adapters loaded by digest, errors."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from fixtures_real import LORA_TARGETS, adapter_dirs, one_thread, refs, run, store, tiny_model_dir

from rl.conformance.engine_lifetime_laws import coincidence_tail
from rl.errors import ArtifactNotFoundError, InvalidRolloutRequestError, NotAnAdapterError
from rl.models import load_base_model
from rl.models.opened_model import open_model
from rl.protocols import RolloutEngine
from rl.samplers.decoding import batched_teacher_forced_logprobs, sample_group, teacher_forced_logprobs
from rl.samplers.torch_sampler import TorchSampler
from rl.storage.artifacts import LocalArtifacts
from rl.types import ArtifactRef, Prompt, RolloutRequest

__all__ = ["adapter_dirs", "one_thread", "refs", "store", "tiny_model_dir"]

# peft 0.21 probes a property transformers 5.2x deprecated when wrapping a model; not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")


@pytest.fixture(scope="module")
def sampler(tiny_model_dir: Path, store: LocalArtifacts) -> TorchSampler:
    return TorchSampler(open_model(tiny_model_dir), store)


@pytest.fixture(scope="module")
def exact_sampler(tiny_model_dir: Path, store: LocalArtifacts) -> TorchSampler:
    """Adapters unmerged: its policy runs exactly the PEFT forward the trainer differentiates."""
    return TorchSampler(open_model(tiny_model_dir), store, merge_adapters=False)


def request(adapter: ArtifactRef, **overrides: object) -> RolloutRequest:
    base = RolloutRequest(
        group_id=3, prompt=Prompt("7=", "8"), n=8, adapter=adapter, policy_version=5, seed=11, max_tokens=12
    )
    return dataclasses.replace(base, **overrides)  # type: ignore[arg-type]


def test_torch_sampler_is_a_rollout_engine(sampler: TorchSampler) -> None:
    assert isinstance(sampler, RolloutEngine)


@pytest.mark.parametrize("merged", [True, False], ids=["merged", "exact"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sampling_logprobs_equal_teacher_forced_logprobs(
    sampler: TorchSampler, exact_sampler: TorchSampler, refs: dict[str, ArtifactRef], seed: int, merged: bool
) -> None:
    """A sampled token's recorded log-prob is the trainer's teacher-forced PEFT log-prob of it in context (<= 1e-5)."""
    rollouts = run((sampler if merged else exact_sampler).generate(request(refs["trained"], seed=seed)))
    model = run(exact_sampler.policy(refs["trained"]))
    with torch.no_grad():
        for r in rollouts:
            forced = teacher_forced_logprobs(model, r.prompt_token_ids, r.token_ids)  # [T]
            torch.testing.assert_close(torch.tensor(r.logprobs), forced, rtol=0, atol=1e-5)


def test_batched_teacher_forcing_matches_one_sequence_at_a_time(
    sampler: TorchSampler, refs: dict[str, ArtifactRef]
) -> None:
    rollouts = run(sampler.generate(request(refs["trained"], seed=4)))
    rollouts += run(sampler.generate(request(refs["trained"], seed=5, prompt=Prompt("what is 12+3?", "15"))))
    model = run(sampler.policy(refs["trained"]))
    with torch.no_grad():
        logprobs, mask = batched_teacher_forced_logprobs(
            model, [r.prompt_token_ids for r in rollouts], [r.token_ids for r in rollouts], pad_token_id=0
        )  # [B, T_max]
        for b, r in enumerate(rollouts):
            assert int(mask[b].sum()) == len(r.token_ids)
            single = teacher_forced_logprobs(model, r.prompt_token_ids, r.token_ids)
            torch.testing.assert_close(logprobs[b, : len(r.token_ids)], single, rtol=0, atol=1e-5)
            assert not logprobs[b, len(r.token_ids) :].any()


def test_same_request_gives_identical_rollouts_even_on_a_fresh_engine(
    sampler: TorchSampler, refs: dict[str, ArtifactRef], tiny_model_dir: Path, store: LocalArtifacts
) -> None:
    """A retried rollout is identical: same tokens, bitwise-same log-probs, same text."""
    req = request(refs["trained"])
    first = run(sampler.generate(req))
    assert run(sampler.generate(req)) == first
    assert run(TorchSampler(open_model(tiny_model_dir), store).generate(req)) == first


def test_samples_differ_within_a_group_and_across_seeds(sampler: TorchSampler, refs: dict[str, ArtifactRef]) -> None:
    a = run(sampler.generate(request(refs["trained"], seed=1)))
    b = run(sampler.generate(request(refs["trained"], seed=2)))
    assert len({tuple(r.token_ids) for r in a}) > 1
    assert [r.token_ids for r in a] != [r.token_ids for r in b]


def test_groups_seeded_s_and_s_plus_1_share_no_samples(sampler: TorchSampler, refs: dict[str, ArtifactRef]) -> None:
    """One generator per group seed: neighbouring seeds' groups are independent draws (per-row seeds `seed + i` would
    make them share all rows but one, one position apart)."""
    for s in (1, 40):
        a, b = (run(sampler.generate(request(refs["trained"], n=16, seed=seed))) for seed in (s, s + 1))
        tail, offset, matches = coincidence_tail(a, b)
        assert tail > 1e-9, f"seeds {s} and {s + 1} share {matches} samples at offset {offset} (chance {tail:.3g})"


def test_each_rollout_carries_the_requests_identity(sampler: TorchSampler, refs: dict[str, ArtifactRef]) -> None:
    req = request(refs["trained"], policy_version=9, group_id=4, seed=21, n=5)
    rollouts = run(sampler.generate(req))
    assert len(rollouts) == 5
    for r in rollouts:
        assert (r.policy_version, r.group_id, r.seed) == (9, 4, 21)
        assert (r.question, r.answer) == ("7=", "8")
        assert r.prompt_token_ids == sampler.encode_prompt("7=")
        assert r.prompt_token_ids[0] == sampler.tokenizer.bos_token_id
        assert len(r.token_ids) == len(r.logprobs)
        assert all(lp <= 0.0 for lp in r.logprobs)


def test_sequences_stop_at_eos_or_max_tokens(sampler: TorchSampler, refs: dict[str, ArtifactRef]) -> None:
    eos = sampler.eos_token_id
    seen_eos = False
    for seed in range(6):
        for r in run(sampler.generate(request(refs["trained"], seed=seed, max_tokens=6))):
            assert 1 <= len(r.token_ids) <= 6
            assert eos not in r.token_ids[:-1]
            if r.token_ids[-1] == eos:
                seen_eos = True
            else:
                assert len(r.token_ids) == 6
            assert r.completion == sampler.decode(r.token_ids)
            assert "<eos>" not in r.completion
    assert seen_eos, "no sequence sampled <eos> in 48 tries; the stop path went untested"


def test_adapter_round_trip_through_the_store_gives_bitwise_identical_logits(
    tiny_model_dir: Path, store: LocalArtifacts, exact_sampler: TorchSampler, tmp_path: Path
) -> None:
    """An adapter saved, stored, fetched by digest and loaded computes the same logits, bit for bit."""
    sampler = exact_sampler
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(5)
    trained = get_peft_model(
        load_base_model(open_model(tiny_model_dir)),
        LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS, lora_dropout=0.0, init_lora_weights=False),
    ).eval()
    ids = torch.tensor([sampler.encode_prompt("3=#### 4\n")])  # [1, L]
    with torch.no_grad():
        before = trained(input_ids=ids).logits  # [1, L, V]
        trained.save_pretrained(tmp_path / "adapter")
        ref = run(store.put_dir(tmp_path / "adapter", "round-trip"))
        after = run(sampler.policy(ref))(input_ids=ids).logits
        base = load_base_model(open_model(tiny_model_dir))(input_ids=ids).logits
    assert torch.equal(before, after)
    assert not torch.equal(after, base)


def test_merging_changes_logits_by_rounding_only(
    sampler: TorchSampler, exact_sampler: TorchSampler, refs: dict[str, ArtifactRef]
) -> None:
    ids = torch.tensor([sampler.encode_prompt("5=#### 6")])  # [1, L]
    with torch.no_grad():
        merged = run(sampler.policy(refs["trained"]))(input_ids=ids).logits  # [1, L, V]
        exact = run(exact_sampler.policy(refs["trained"]))(input_ids=ids).logits
    torch.testing.assert_close(merged, exact, rtol=0, atol=1e-5)


def test_version_zero_adapter_samples_exactly_like_the_base_model(
    sampler: TorchSampler, refs: dict[str, ArtifactRef], tiny_model_dir: Path
) -> None:
    """LoRA B = 0 at init, so version 0 is the base model bit for bit."""
    prompt_ids = sampler.encode_prompt("7=")
    with torch.no_grad():
        base = sample_group(
            load_base_model(open_model(tiny_model_dir)),
            prompt_ids,
            n=4,
            max_tokens=8,
            seed=3,
            eos_token_id=sampler.eos_token_id,
        )
    got = run(sampler.generate(request(refs["v0"], n=4, max_tokens=8, seed=3)))
    assert [(r.token_ids, r.logprobs) for r in got] == [(s.token_ids, s.logprobs) for s in base]


def test_adapters_are_cached_by_digest_and_evicted_least_recently_used(
    tiny_model_dir: Path, store: LocalArtifacts, refs: dict[str, ArtifactRef]
) -> None:
    engine = TorchSampler(open_model(tiny_model_dir), store, adapter_cache_size=1)
    run(engine.generate(request(refs["v0"])))
    run(engine.generate(request(refs["v0"], seed=99)))
    assert engine.loads == 1
    other = run(engine.generate(request(refs["trained"])))
    assert engine.loads == 2
    again = run(engine.generate(request(refs["v0"])))
    assert engine.loads == 3
    assert [r.logprobs for r in again] != [r.logprobs for r in other]


def test_an_artifact_that_is_not_an_adapter_is_refused(sampler: TorchSampler, store: LocalArtifacts) -> None:
    junk = run(store.put({"weights.bin": b"\x00"}, name="junk"))
    with pytest.raises(NotAnAdapterError, match=r"adapter_config\.json"):
        run(sampler.generate(request(junk)))


def test_a_missing_adapter_raises_not_found(sampler: TorchSampler) -> None:
    missing = ArtifactRef(uri="file:///nowhere", digest="sha256:" + "0" * 64)
    with pytest.raises(ArtifactNotFoundError):
        run(sampler.generate(request(missing)))


@pytest.mark.parametrize(
    ("overrides", "match"),
    [({"n": 0}, "n must be"), ({"max_tokens": 0}, "max_tokens"), ({"prompt": Prompt("1" * 200, "1")}, "positions")],
)
def test_bad_requests_raise_a_typed_error(
    sampler: TorchSampler, refs: dict[str, ArtifactRef], overrides: dict[str, object], match: str
) -> None:
    with pytest.raises(InvalidRolloutRequestError, match=match):
        run(sampler.generate(request(refs["v0"], **overrides)))


def test_teacher_forced_logprobs_are_differentiable(
    sampler: TorchSampler, refs: dict[str, ArtifactRef], tiny_model_dir: Path
) -> None:
    """The trainer calls the same helper under autograd; gradients reach the LoRA parameters."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        load_base_model(open_model(tiny_model_dir)), LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False)
    )
    logp = teacher_forced_logprobs(model, sampler.encode_prompt("1="), [7, 1])  # [2]
    logp.sum().backward()
    grads = [p.grad for n, p in model.named_parameters() if "lora_" in n]
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads)


def test_groups_sampled_together_equal_groups_sampled_one_at_a_time(
    sampler: TorchSampler, refs: dict[str, ArtifactRef]
) -> None:
    """`generate_groups` gives each request what `generate` gives it alone: the same tokens, log-probs equal up to the
    larger batch's float rounding, whatever else shares the batch; requests with
    another adapter, prompt length or max_tokens land in their own batch."""
    requests = [
        request(refs["trained"], group_id=g, prompt=Prompt(q, "?"), seed=40 + g, n=3 + g % 2, max_tokens=m)
        for g, (q, m) in enumerate([("1=", 6), ("2=", 6), ("12=", 6), ("3=", 4), ("4=", 6)])
    ] + [request(refs["v0"], group_id=5, prompt=Prompt("5=", "?"), seed=45, max_tokens=6)]  # shares all but adapter
    together = run(sampler.generate_groups(requests))
    for req, got in zip(requests, together, strict=True):
        alone = run(sampler.generate(req))
        assert [r.token_ids for r in got] == [r.token_ids for r in alone], req.group_id
        for g, a in zip(got, alone, strict=True):
            assert g.logprobs == pytest.approx(a.logprobs, rel=1e-5, abs=1e-6), req.group_id
            assert dataclasses.replace(g, logprobs=a.logprobs) == a
    reordered = run(sampler.generate_groups(requests[::-1]))[::-1]
    assert [[r.token_ids for r in g] for g in reordered] == [[r.token_ids for r in g] for g in together]
