"""The algorithm's contracts: GRPO's group-relative advantages and its per-completion loss, checked as pure functions.

Subclass one in a `Test*` class and provide its one fixture:

    class TestMyAdvantages(AdvantageContract):
        @pytest.fixture
        def advantages(self):
            return my_group_advantages  # (group_ids, rewards) -> list[float]

    class TestMyLoss(LossContract):
        @pytest.fixture
        def sample_loss(self):
            return my_sample_loss  # (new_logp, old_logp, ref_logp, advantage, clip_eps, kl_beta) -> (loss, stats)

The advantage laws are pure Python. The loss laws import torch inside their bodies, so importing this module (and the
packaged suite) never pulls torch in. Every law says in its failure which law broke and on what values.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl.conformance._base import ContractBase, law_settings, tier
from rl.conformance.contracts import must_provide

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["EPS_MAX", "AdvantageContract", "AdvantageFn", "LossContract", "SampleLossFn"]

AdvantageFn = Callable[[Sequence[int], Sequence[float]], Sequence[float]]
"""`(group_ids, rewards) -> advantages`, one per sample in input order, like
`rl.advantages.group_normalized_advantages`."""

SampleLossFn = Callable[..., tuple[Any, Mapping[str, float]]]
"""`(new_logp, old_logp, ref_logp, advantage, clip_eps=0.2, kl_beta=0.03) -> (loss, stats)` on 1-D torch tensors of one
length, like `rl.loss.grpo_sample_loss`."""

EPS_MAX = 1e-3
"""The largest `eps` in `A = (r - mean) / (pstdev + eps)` the laws accept (ours is 1e-4): any eps in [0, EPS_MAX]
passes."""

_ADV_TOL = 1e-9
"""Absolute tolerance on an advantage (|A| <= sqrt(G - 1) <= 3 here): room for a numpy or torch reduction order."""

# -- advantages --------------------------------------------------------------------------------------------------------

_REWARD = st.integers(min_value=-8, max_value=8).map(lambda k: k / 4)
"""Quarter steps in [-2, 2]: 0 and 1 (the binary rewards most GRPO runs use) and spreads exact in binary. Two unequal
rewards differ by >= 0.25, so a group of <= 8 with any spread has pstdev >= 0.25 * sqrt(7) / 8 > 0.08."""

_MAX_GROUP = 8
_TRICKY_EQUAL = st.sampled_from([0.1, 1 / 3, 0.7, -2.3, 1e6 + 0.1])
"""All-equal values whose float mean need not equal them (`fmean([0.1] * 3) != 0.1`)."""


def _group_rewards(*, signal: bool) -> st.SearchStrategy[list[float]]:
    """One group's rewards, one to eight of them; with `signal`, at least two of them differ."""
    rewards = st.lists(_REWARD, min_size=2 if signal else 1, max_size=_MAX_GROUP)
    return rewards.filter(lambda rs: len(set(rs)) > 1) if signal else rewards


@st.composite
def _batches(
    draw: st.DrawFn, *, min_groups: int = 1, max_groups: int = 4, signal: bool = False, exclude: int | None = None
) -> tuple[list[int], list[float]]:
    """`(group_ids, rewards)` of a few groups with arbitrary distinct ids (negative and large ones included), their
    samples shuffled together so that no group need be contiguous."""
    ids = st.integers(min_value=-(10**6), max_value=10**6).filter(lambda gid: gid != exclude)
    labels = draw(st.lists(ids, min_size=min_groups, max_size=max_groups, unique=True), label="group ids")
    samples = [(gid, r) for gid in labels for r in draw(_group_rewards(signal=signal), label=f"group {gid} rewards")]
    order = draw(st.permutations(range(len(samples))), label="sample order")
    return [samples[i][0] for i in order], [samples[i][1] for i in order]


def _members(group_ids: Sequence[int]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for i, gid in enumerate(group_ids):
        out.setdefault(gid, []).append(i)
    return out


def _same(a: float, b: float) -> bool:
    """Equal within `_ADV_TOL`, NaN matching NaN: these laws compare where values go; the all-equal law reports NaN."""
    return (math.isnan(a) and math.isnan(b)) or a == b or abs(a - b) <= _ADV_TOL


def _call_advantages(advantages: AdvantageFn, group_ids: list[int], rewards: list[float]) -> list[float]:
    """The advantages as floats, after checking the one-output-per-input law every other law relies on."""
    out = [float(a) for a in advantages(list(group_ids), list(rewards))]
    assert len(out) == len(rewards), (
        f"one output per input: {len(rewards)} rewards gave {len(out)} advantages "
        f"(group_ids={group_ids}, rewards={rewards})"
    )
    return out


@tier("advantages")
class AdvantageContract(ContractBase):
    """Laws of GRPO's group-relative advantage `A_i = (r_i - mean(r_g)) / (pstdev(r_g) + eps)` (DeepSeekMath §4.1.2),
    with `eps` in [0, EPS_MAX], exact zeros for an all-equal group, and no dependence on sample order or group
    labels."""

    @pytest.fixture
    def advantages(self) -> AdvantageFn:
        """Return the function under test: `(group_ids, rewards) -> list[float]`, one advantage per sample in input
        order, like `rl.advantages.group_normalized_advantages`."""
        raise must_provide(
            "AdvantageContract",
            "advantages",
            "a callable (group_ids, rewards) -> list[float] like rl.advantages.group_normalized_advantages",
        )

    @law_settings(max_examples=20)
    @given(data=st.data())
    def test_advantages_scale_by_the_population_std(self, advantages: AdvantageFn, data: Any) -> None:
        """Within a group with signal, `A_i - mean(A) = (r_i - mean(r)) / (pstdev(r) + eps)` for one eps in
        [0, EPS_MAX]: the population std (divide by n), not the sample std (n - 1), which shrinks every advantage by
        sqrt((n - 1) / n). The two-member group [0, 1] thus has advantages `1 / (0.5 + eps)` apart
        (±0.5 / (0.5 + eps))."""
        # Hand-worked: mean 0.5, pstdev 0.5 -> A = ±0.5 / (0.5 + eps), 1/(0.5 + eps) apart: in [1/0.501, 2] = [1.996, 2]
        # for eps in [0, 1e-3]. The sample std, 0.7071, would put them 1.414 apart.
        low, high = _call_advantages(advantages, [0, 0], [0.0, 1.0])
        spread = high - low
        assert 1 / (0.5 + EPS_MAX) - _ADV_TOL <= spread <= 2 + _ADV_TOL, (
            f"population std: the group [0.0, 1.0] gave advantages [{low!r}, {high!r}], {spread!r} apart; with the "
            f"population std 0.5 they are 1 / (0.5 + eps) apart, in [{1 / (0.5 + EPS_MAX):.6f}, 2] for eps in "
            f"[0, {EPS_MAX}] ({1 / (math.sqrt(0.5) + 1e-4):.6f} apart means the sample std)"
        )
        rewards = data.draw(_group_rewards(signal=True), label="rewards")
        adv = _call_advantages(advantages, [7] * len(rewards), rewards)
        mean_r, std_r = statistics.fmean(rewards), statistics.pstdev(rewards)
        std_a = statistics.pstdev(adv)
        assert std_a > 0 and math.isfinite(std_a), (
            f"population std: the group {rewards} with signal gave advantages {adv}, whose spread is {std_a!r}"
        )
        denominator = std_r / std_a  # the divisor the implementation used: pstdev(A) = pstdev(r) / denominator
        eps = denominator - std_r
        assert -1e-9 <= eps <= EPS_MAX + 1e-9, (
            f"population std: the group {rewards} (pstdev {std_r!r}, sample std {statistics.stdev(rewards)!r}) gave "
            f"advantages {adv}, i.e. (r - mean) / {denominator!r}; that is pstdev + {eps!r}, outside eps in "
            f"[0, {EPS_MAX}]"
        )
        mean_a = statistics.fmean(adv)
        for r, a in zip(rewards, adv, strict=True):
            assert abs((a - mean_a) - (r - mean_r) / denominator) <= 1e-7, (
                f"population std: the group {rewards} gave advantages {adv}, not (r - mean) / (pstdev + eps) for one "
                f"eps: reward {r!r} has A - mean(A) = {a - mean_a!r}, expected {(r - mean_r) / denominator!r}"
            )

    @law_settings(max_examples=20)
    @given(data=st.data())
    def test_advantages_of_an_all_equal_group_are_exactly_zero(self, advantages: AdvantageFn, data: Any) -> None:
        """A group whose rewards are all equal (a one-sample group included) gives exactly 0.0 for each member, never
        NaN or inf and never a rounding residue like 1e-13, whatever the other groups in the batch hold."""
        value = data.draw(st.one_of(_REWARD, _TRICKY_EQUAL), label="the equal reward")
        size = data.draw(st.integers(min_value=1, max_value=_MAX_GROUP), label="group size")
        silent = 5
        ids, rewards = data.draw(_batches(min_groups=0, max_groups=3, signal=True, exclude=silent), label="others")
        for _ in range(size):
            at = data.draw(st.integers(min_value=0, max_value=len(ids)), label="position")
            ids.insert(at, silent)
            rewards.insert(at, value)
        adv = _call_advantages(advantages, ids, rewards)
        got = [adv[i] for i in _members(ids)[silent]]
        where = f"group {silent} = [{value!r}] * {size} in group_ids={ids}, rewards={rewards}"
        assert all(math.isfinite(a) for a in got), (
            f"all-equal group: {where} gave {got}: NaN/inf is 0/0 (or x/0) from dividing by its zero std without eps "
            "(or with eps=0); an all-equal group must give exactly 0.0"
        )
        assert all(a == 0.0 for a in got), (
            f"all-equal group: {where} gave {got}, not exactly 0.0 (the float mean of equal rewards can differ from "
            "them by rounding; such a group carries no signal and must give exact zeros)"
        )

    @law_settings(max_examples=20)
    @given(data=st.data())
    def test_advantages_sum_to_zero_within_each_group(self, advantages: AdvantageFn, data: Any) -> None:
        """Within every group the advantages sum to zero (up to 1e-9 per sample): each is centred on its group's mean,
        not on zero or on the batch mean."""
        ids, rewards = data.draw(_batches(signal=True), label="batch")
        adv = _call_advantages(advantages, ids, rewards)
        for gid, members in _members(ids).items():
            group_adv = [adv[i] for i in members]
            total = math.fsum(group_adv)
            assert abs(total) <= _ADV_TOL * len(members), (
                f"zero mean: group {gid} with rewards {[rewards[i] for i in members]} got advantages {group_adv}, "
                f"which sum to {total!r} (group_ids={ids}, rewards={rewards})"
            )

    @law_settings(max_examples=20)
    @given(data=st.data())
    def test_advantages_permuting_samples_permutes_advantages(self, advantages: AdvantageFn, data: Any) -> None:
        """Reordering the samples (ids and rewards together) reorders the advantages the same way: an advantage
        depends on its group's rewards, not on where the group's samples sit (they need not be contiguous)."""
        ids, rewards = data.draw(_batches(), label="batch")
        order = data.draw(st.permutations(range(len(ids))), label="permutation")
        adv = _call_advantages(advantages, ids, rewards)
        permuted = _call_advantages(advantages, [ids[i] for i in order], [rewards[i] for i in order])
        for k, i in enumerate(order):
            assert _same(permuted[k], adv[i]), (
                f"permutation equivariance: sample {i} (group {ids[i]}, reward {rewards[i]!r}) has advantage "
                f"{adv[i]!r} in group_ids={ids}, rewards={rewards}, but {permuted[k]!r} once moved to position {k} "
                f"by the permutation {list(order)}"
            )

    @law_settings(max_examples=20)
    @given(data=st.data())
    def test_advantages_relabelling_group_ids_changes_nothing(self, advantages: AdvantageFn, data: Any) -> None:
        """Renaming the groups (any bijection of ids onto other ids) leaves every advantage unchanged: only which
        samples share an id matters, not its value or its order among the ids."""
        ids, rewards = data.draw(_batches(min_groups=2), label="batch")
        labels = list(_members(ids))
        new_labels = data.draw(
            st.lists(st.integers(min_value=-(10**6), max_value=10**6), min_size=len(labels), max_size=len(labels))
            .filter(lambda ls: len(set(ls)) == len(ls))
            .filter(lambda ls: ls != labels),
            label="new ids",
        )
        rename = dict(zip(labels, new_labels, strict=True))
        adv = _call_advantages(advantages, ids, rewards)
        renamed_ids = [rename[gid] for gid in ids]
        relabelled = _call_advantages(advantages, renamed_ids, rewards)
        for i, (a, b) in enumerate(zip(adv, relabelled, strict=True)):
            assert _same(a, b), (
                f"relabelling: sample {i} (reward {rewards[i]!r}) has advantage {a!r} with group_ids={ids} and "
                f"{b!r} with group_ids={renamed_ids} (the renaming {rename}); rewards={rewards}"
            )

    @law_settings(max_examples=20)
    @given(data=st.data())
    def test_advantages_of_a_group_do_not_depend_on_other_groups(self, advantages: AdvantageFn, data: Any) -> None:
        """One output per input, in input order, and a group's advantages are a function of its own rewards: changing
        every other group's rewards (r -> 3r + 1) leaves them unchanged (no batch mean, no batch std)."""
        ids, rewards = data.draw(_batches(min_groups=2), label="batch")
        target = data.draw(st.sampled_from(sorted(set(ids))), label="the group kept")
        changed = [r if gid == target else 3 * r + 1 for gid, r in zip(ids, rewards, strict=True)]
        before = _call_advantages(advantages, ids, rewards)
        after = _call_advantages(advantages, ids, changed)
        for i in _members(ids)[target]:
            assert _same(before[i], after[i]), (
                f"independent groups: sample {i} of group {target} (reward {rewards[i]!r}) has advantage "
                f"{before[i]!r} with group_ids={ids}, rewards={rewards}, but {after[i]!r} once only the other groups' "
                f"rewards changed to {changed}"
            )


# -- the loss ----------------------------------------------------------------------------------------------------------

_LOGP = st.floats(min_value=-10.0, max_value=-0.01)
_TOKENS = st.integers(min_value=1, max_value=8)


def _logps(data: Any, length: int, label: str) -> list[float]:
    return data.draw(st.lists(_LOGP, min_size=length, max_size=length), label=label)


def _tensor(values: Sequence[float], *, leaf: bool = False) -> Tensor:
    import torch

    return torch.tensor(list(values), dtype=torch.float64, requires_grad=leaf)


def _loss_tensor(out: Any, law: str, inputs: str) -> Tensor:
    """The loss of `sample_loss`'s `(loss, stats)`: a one-element tensor that carries a gradient. Only the
    finite-scalar law insists on 0-d, so a shape slip fails that law rather than every numeric one."""
    import torch

    assert isinstance(out, tuple) and len(out) == 2, (
        f"{law}: sample_loss({inputs}) returned a {type(out).__name__}, expected a (loss, stats) tuple"
    )
    loss = out[0]
    assert isinstance(loss, torch.Tensor) and loss.numel() == 1, (
        f"{law}: sample_loss({inputs}) returned a loss of shape {tuple(getattr(loss, 'shape', ()))} "
        f"({type(loss).__name__}), expected a tensor of one value: the completion's loss, reduced over its tokens"
    )
    assert loss.requires_grad, f"{law}: sample_loss({inputs}) returned a loss that carries no gradient to new_logp"
    return loss


def _loss_and_grad(
    sample_loss: SampleLossFn,
    new: Sequence[float],
    old: Sequence[float],
    ref: Sequence[float],
    advantage: float,
    *,
    clip_eps: float,
    kl_beta: float,
    law: str,
) -> tuple[float, list[float], str]:
    """`(loss, d loss / d new_logp, a description of the inputs)` on float64 tensors."""
    inputs = (
        f"new_logp={list(new)}, old_logp={list(old)}, ref_logp={list(ref)}, advantage={advantage!r}, "
        f"clip_eps={clip_eps!r}, kl_beta={kl_beta!r}"
    )
    new_t = _tensor(new, leaf=True)
    loss = _loss_tensor(
        sample_loss(new_t, _tensor(old), _tensor(ref), advantage, clip_eps=clip_eps, kl_beta=kl_beta), law, inputs
    )
    loss.backward()
    assert new_t.grad is not None, f"{law}: sample_loss({inputs}) gave no gradient to new_logp"
    return float(loss.detach()), new_t.grad.tolist(), inputs


def _shift(values: Sequence[float], by: float) -> list[float]:
    return [v + by for v in values]


@tier("loss")
class LossContract(ContractBase):
    """Laws of GRPO's per-completion loss (DeepSeekMath eq. 3, token-level form):

        loss = -( mean_t min(r_t A, clip(r_t, 1 - eps, 1 + eps) A) - kl_beta * mean_t k3_t ),  r_t = exp(new_t - old_t)

    with a KL penalty towards the reference that is >= 0 and minimal at `new == ref` (k3, Schulman's "Approximating KL
    divergence"). The laws call `sample_loss(new_logp, old_logp, ref_logp, advantage, clip_eps=..., kl_beta=...)` on
    float64 CPU tensors, `new_logp` a leaf requiring grad.
    """

    @pytest.fixture
    def sample_loss(self) -> SampleLossFn:
        """Return the function under test, with the signature of `rl.loss.grpo_sample_loss`:
        `(new_logp, old_logp, ref_logp, advantage, clip_eps=0.2, kl_beta=0.03) -> (loss, stats)`, the tensors 1-D of
        one length, `loss` a 0-d tensor differentiable w.r.t. `new_logp`, `stats` a mapping of floats."""
        raise must_provide(
            "LossContract",
            "sample_loss",
            "a callable (new_logp, old_logp, ref_logp, advantage, clip_eps=0.2, kl_beta=0.03) -> (loss, stats) "
            "like rl.loss.grpo_sample_loss",
        )

    @law_settings(max_examples=15)
    @given(data=st.data())
    def test_loss_kl_penalty_is_nonnegative_and_pulls_towards_the_reference(
        self, sample_loss: SampleLossFn, data: Any
    ) -> None:
        """With advantage 0 and ratio 1, the loss is the KL penalty alone: exactly 0 with zero gradient where
        new == ref (k3's minimum), > 0 where new != ref, and its gradient moves every token's new_logp towards ref."""
        length = data.draw(_TOKENS, label="tokens")
        beta = data.draw(st.floats(min_value=0.01, max_value=0.5), label="kl_beta")
        logp = _logps(data, length, "logp")
        law = "KL penalty"
        loss, grad, inputs = _loss_and_grad(sample_loss, logp, logp, logp, 0.0, clip_eps=0.2, kl_beta=beta, law=law)
        assert abs(loss) <= 1e-12, (
            f"{law}: with new == old == ref and advantage 0 the loss must be 0, got {loss!r} ({inputs})"
        )
        assert all(abs(g) <= 1e-12 for g in grad), (
            f"{law}: at new == ref the KL penalty is at its minimum, so d loss / d new_logp must be 0, got {grad} "
            f"({inputs}); a k1 penalty (mean(new - ref)) has gradient kl_beta / T there"
        )
        gaps = data.draw(
            st.lists(
                st.floats(min_value=0.05, max_value=2.0).flatmap(lambda g: st.sampled_from([g, -g])),
                min_size=length,
                max_size=length,
            ),
            label="ref - new",
        )
        ref = [x + g for x, g in zip(logp, gaps, strict=True)]
        loss, grad, inputs = _loss_and_grad(sample_loss, logp, logp, ref, 0.0, clip_eps=0.2, kl_beta=beta, law=law)
        assert loss > 0, (
            f"{law}: with advantage 0 and new != ref the loss is kl_beta * KL > 0, got {loss!r} ({inputs}); "
            "a negative loss rewards moving away from the reference (KL sign flipped, or an estimator that can go "
            "negative such as k1)"
        )
        for t, (g, gap) in enumerate(zip(grad, gaps, strict=True)):
            # Gradient descent moves new_t by -g: towards ref_t = new_t + gap needs -g to have gap's sign.
            assert g != 0 and math.copysign(1.0, -g) == math.copysign(1.0, gap), (
                f"{law}: token {t} has ref - new = {gap!r} but d loss / d new_logp = {g!r}: a descent step moves it "
                f"away from the reference, or not at all ({inputs})"
            )

    @law_settings(max_examples=15)
    @given(data=st.data())
    def test_loss_clip_zeroes_the_gradient_beyond_the_trust_region(self, sample_loss: SampleLossFn, data: Any) -> None:
        """With kl_beta 0 and clip_eps 0.2: for A > 0 and every ratio 1.5 (> 1 + eps), and for A < 0 and every ratio
        0.5 (< 1 - eps), d loss / d new_logp is exactly 0; inside the trust region (ratio 1.1 or 0.9) it is not."""
        length = data.draw(_TOKENS, label="tokens")
        old = _logps(data, length, "old_logp")
        magnitude = data.draw(st.floats(min_value=0.1, max_value=3.0), label="|advantage|")
        law = "clipped ratio"
        for advantage, outside, inside in ((magnitude, 1.5, 1.1), (-magnitude, 0.5, 0.9)):
            new = _shift(old, math.log(outside))
            _, grad, inputs = _loss_and_grad(sample_loss, new, old, old, advantage, clip_eps=0.2, kl_beta=0.0, law=law)
            bound = "1 + 0.2" if advantage > 0 else "1 - 0.2"
            assert all(g == 0.0 for g in grad), (
                f"{law}: A = {advantage!r} and every ratio {outside} is beyond the clip {bound}, so the surrogate is "
                f"flat and d loss / d new_logp must be exactly 0, got {grad} ({inputs}); an unclipped ratio gives "
                "-A * r / T"
            )
            new = _shift(old, math.log(inside))
            _, grad, inputs = _loss_and_grad(sample_loss, new, old, old, advantage, clip_eps=0.2, kl_beta=0.0, law=law)
            assert all(g != 0.0 and math.isfinite(g) for g in grad), (
                f"{law}: A = {advantage!r} and every ratio {inside} is inside the trust region [0.8, 1.2], so every "
                f"token must have a nonzero gradient, got {grad} ({inputs})"
            )

    @law_settings(max_examples=15)
    @given(data=st.data())
    def test_loss_clip_is_pessimistic_outside_the_trust_region(self, sample_loss: SampleLossFn, data: Any) -> None:
        """With kl_beta 0 and clip_eps 0.2: for A > 0 and ratio 0.5, and for A < 0 and ratio 1.5 (beyond the clip on
        the side that lowers the objective), the unclipped term is the minimum and keeps its gradient, -A * r / T."""
        length = data.draw(_TOKENS, label="tokens")
        old = _logps(data, length, "old_logp")
        magnitude = data.draw(st.floats(min_value=0.1, max_value=3.0), label="|advantage|")
        law = "pessimistic clip"
        for advantage, ratio in ((magnitude, 0.5), (-magnitude, 1.5)):
            new = _shift(old, math.log(ratio))
            _, grad, inputs = _loss_and_grad(sample_loss, new, old, old, advantage, clip_eps=0.2, kl_beta=0.0, law=law)
            expected = -advantage * ratio / length
            assert all(math.isclose(g, expected, rel_tol=1e-6) for g in grad), (
                f"{law}: A = {advantage!r} and every ratio {ratio}: min(r A, clip(r) A) is the unclipped r A, so "
                f"d loss / d new_logp must be -A * r / T = {expected!r} on every token, got {grad} ({inputs}); "
                "clipping the ratio without the min zeroes it"
            )

    @law_settings(max_examples=15)
    @given(data=st.data())
    def test_loss_at_ratio_one_is_reinforce(self, sample_loss: SampleLossFn, data: Any) -> None:
        """With new == old (every ratio 1) and kl_beta 0, the loss is -A and d loss / d new_logp is -A / T on every
        token: REINFORCE's gradient, the token mean's 1/T included."""
        length = data.draw(_TOKENS, label="tokens")
        logp = _logps(data, length, "new_logp = old_logp")
        ref = _logps(data, length, "ref_logp")
        advantage = data.draw(st.floats(min_value=-3.0, max_value=3.0), label="advantage")
        law = "REINFORCE at ratio 1"
        loss, grad, inputs = _loss_and_grad(sample_loss, logp, logp, ref, advantage, clip_eps=0.2, kl_beta=0.0, law=law)
        assert math.isclose(loss, -advantage, rel_tol=1e-9, abs_tol=1e-12), (
            f"{law}: the loss must be -A = {-advantage!r}, got {loss!r} ({inputs})"
        )
        expected = -advantage / length
        assert all(math.isclose(g, expected, rel_tol=1e-9, abs_tol=1e-15) for g in grad), (
            f"{law}: d loss / d new_logp must be -A / T = {expected!r} on every token, got {grad} ({inputs})"
        )

    @law_settings(max_examples=15)
    @given(data=st.data())
    def test_loss_is_the_token_mean(self, sample_loss: SampleLossFn, data: Any) -> None:
        """A completion of T identical tokens has the loss of its one token, whatever T (the KL penalty included):
        each term is a mean over tokens, so a long completion does not outweigh a short one."""
        new, old = data.draw(_LOGP, label="new_logp"), data.draw(_LOGP, label="old_logp")
        gap = data.draw(
            st.floats(min_value=0.05, max_value=2.0).flatmap(lambda g: st.sampled_from([g, -g])), label="ref - new"
        )
        ref = new + gap
        advantage = data.draw(st.floats(min_value=-3.0, max_value=3.0), label="advantage")
        beta = data.draw(st.floats(min_value=0.01, max_value=0.5), label="kl_beta")
        law = "token mean"
        one, one_grad, _ = _loss_and_grad(
            sample_loss, [new], [old], [ref], advantage, clip_eps=0.2, kl_beta=beta, law=law
        )
        for length in (2, 7):
            loss, grad, inputs = _loss_and_grad(
                sample_loss,
                [new] * length,
                [old] * length,
                [ref] * length,
                advantage,
                clip_eps=0.2,
                kl_beta=beta,
                law=law,
            )
            assert math.isclose(loss, one, rel_tol=1e-9, abs_tol=1e-12), (
                f"{law}: {length} copies of one token must have that token's loss {one!r}, got {loss!r} ({inputs}); "
                "a loss summed over tokens (the surrogate or the KL) grows with the length"
            )
            assert all(math.isclose(g * length, one_grad[0], rel_tol=1e-9, abs_tol=1e-12) for g in grad), (
                f"{law}: each of {length} identical tokens must get 1/{length} of the one-token gradient "
                f"{one_grad[0]!r}, got {grad} ({inputs})"
            )

    @law_settings(max_examples=15)
    @given(data=st.data())
    def test_loss_is_a_finite_differentiable_scalar(self, sample_loss: SampleLossFn, data: Any) -> None:
        """For any log-probs in [-20, 0], advantage, clip_eps and kl_beta, in float32 or float64, the loss is a finite
        0-d floating tensor, `stats` a mapping, and backward gives new_logp a finite gradient of its shape."""
        import torch

        dtype = data.draw(st.sampled_from([torch.float32, torch.float64]), label="dtype")
        length = data.draw(st.integers(min_value=1, max_value=16), label="tokens")
        logps = st.lists(st.floats(min_value=-20.0, max_value=0.0), min_size=length, max_size=length)
        new_v, old_v, ref_v = (data.draw(logps, label=name) for name in ("new_logp", "old_logp", "ref_logp"))
        advantage = data.draw(st.floats(min_value=-5.0, max_value=5.0), label="advantage")
        clip_eps = data.draw(st.floats(min_value=0.05, max_value=0.4), label="clip_eps")
        beta = data.draw(st.floats(min_value=0.0, max_value=0.5), label="kl_beta")
        law = "finite differentiable scalar"
        inputs = (
            f"{dtype}: new_logp={new_v}, old_logp={old_v}, ref_logp={ref_v}, advantage={advantage!r}, "
            f"clip_eps={clip_eps!r}, kl_beta={beta!r}"
        )
        new = torch.tensor(new_v, dtype=dtype, requires_grad=True)
        old, ref = torch.tensor(old_v, dtype=dtype), torch.tensor(ref_v, dtype=dtype)
        out = sample_loss(new, old, ref, advantage, clip_eps=clip_eps, kl_beta=beta)
        loss = _loss_tensor(out, law, inputs)
        assert loss.dim() == 0, (
            f"{law}: the loss has shape {tuple(loss.shape)}, expected a 0-d tensor (shape ()), as a mean over tokens "
            f"without keepdim gives ({inputs})"
        )
        assert loss.is_floating_point() and bool(torch.isfinite(loss)), f"{law}: the loss is {loss!r} ({inputs})"
        assert isinstance(out[1], Mapping), f"{law}: stats is a {type(out[1]).__name__}, expected a mapping ({inputs})"
        loss.backward()
        grad = new.grad
        assert grad is not None and grad.shape == new.shape, (
            f"{law}: backward gave new_logp the gradient {grad!r}, expected one of shape {tuple(new.shape)} ({inputs})"
        )
        assert bool(torch.isfinite(grad).all()), (
            f"{law}: d loss / d new_logp = {grad.tolist()} is not finite ({inputs})"
        )
