"""Shape glue shared by the peer adapters: no library imports, no formula.

The conformance suite calls `advantages(group_ids, rewards)` with groups of any size whose samples are interleaved, and
`sample_loss(new_logp, old_logp, ref_logp, advantage, clip_eps, kl_beta)` on one completion's 1-D log-probs. Libraries
want a batch laid out their way; these helpers gather the suite's inputs into that layout and scatter results back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

BatchLoss = Callable[..., tuple[Tensor, Mapping[str, Any]]]
"""`(new_logp[B, T], old_logp[B, T], ref_logp[B, T], advantages[B], mask[B, T], *, clip_eps, kl_beta)
-> (loss, stats)`, the loss a 0-d tensor."""


def groups_by_size(group_ids: Sequence[int]) -> dict[int, list[list[int]]]:
    """The sample indices of each group (in input order), the groups bucketed by their size, groups in order of first
    appearance: `[0, 5, 0, 7] -> {2: [[0, 2]], 1: [[1], [3]]}`.

    A library that reshapes rewards to `[num_groups, G]` takes one bucket per call, its groups laid out contiguously."""
    members: dict[int, list[int]] = {}
    for i, gid in enumerate(group_ids):
        members.setdefault(gid, []).append(i)
    buckets: dict[int, list[list[int]]] = {}
    for idx in members.values():
        buckets.setdefault(len(idx), []).append(idx)
    return buckets


def check_pair(group_ids: Sequence[int], rewards: Sequence[float]) -> None:
    if len(group_ids) != len(rewards):
        raise ValueError(f"len(group_ids)={len(group_ids)} != len(rewards)={len(rewards)}")


def sample_loss_from(batch_loss: BatchLoss) -> Callable[..., tuple[Tensor, dict[str, float]]]:
    """The suite's per-completion `sample_loss` as a batch of one: `[T] -> [1, T]`, every token in the mask, the
    advantage a `[1]` tensor of the log-probs' dtype. The loss is the library's batch loss of that batch."""

    def sample_loss(
        new_logp: Tensor,
        old_logp: Tensor,
        ref_logp: Tensor,
        advantage: float,
        clip_eps: float = 0.2,
        kl_beta: float = 0.03,
    ) -> tuple[Tensor, dict[str, float]]:
        if not (new_logp.dim() == old_logp.dim() == ref_logp.dim() == 1):
            raise ValueError(f"sample_loss takes 1-D log-probs, got shapes {new_logp.shape}, {old_logp.shape}")
        adv = torch.tensor([float(advantage)], dtype=new_logp.dtype)
        mask = torch.ones(1, new_logp.shape[0], dtype=torch.long)
        loss, stats = batch_loss(
            new_logp[None], old_logp[None], ref_logp[None], adv, mask, clip_eps=clip_eps, kl_beta=kl_beta
        )
        return loss, {k: float(v) for k, v in stats.items() if isinstance(v, (int, float))}

    return sample_loss
