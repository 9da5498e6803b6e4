"""NovaSky-AI/SkyRL#1340: SkyRL's own policy loss and KL term, installed (`skyrl`), as the loss under test.

Before skyrl 0.2.0 (fixed by NovaSky-AI/SkyRL#1353) `compute_approx_kl` was decorated with `torch.no_grad()`, and the
policy worker added its result to the loss as the KL penalty (`use_kl_loss=True`, SkyRL's default): the penalty had
its value but no gradient, so it never pulled the policy towards the reference. The binding is the worker's loss with
one data-parallel rank and one micro-batch, on both releases: the installed `ppo_policy_loss`, `compute_approx_kl`
and `masked_mean`, fed as the worker feeds them (its KL statements as `peers.skyrl_grpo` copies them). Between the
releases the token mean moved from `ppo_policy_loss`'s `reduce_loss` into advantages scaled beforehand
(`apply_loss_reduction_to_advantages_minibatch`); the binding takes whichever the installed release has.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from importlib.metadata import version
from types import ModuleType, SimpleNamespace


def _without_backends_init() -> None:
    """From skyrl 0.2.0 `skyrl/backends/__init__.py` imports the Tinker API types, whose `typing.TypedDict`s pydantic
    refuses below Python 3.12 (the wheel says >=3.11): `skyrl.backends` stands as the bare package, so the training
    utilities under it import as they are, without that `__init__`."""
    try:
        import skyrl.backends  # noqa: F401
    except Exception:  # pydantic's PydanticUserError, raised while building a schema
        sys.modules.pop("skyrl.backends", None)
        root = importlib.util.find_spec("skyrl")
        package = ModuleType("skyrl.backends")
        package.__path__ = [os.path.join(os.path.dirname(str(root and root.origin)), "backends")]
        sys.modules["skyrl.backends"] = package


_without_backends_init()

from skyrl.backends.skyrl_train.utils import ppo_utils  # noqa: E402
from skyrl.backends.skyrl_train.utils.ppo_utils import compute_approx_kl, ppo_policy_loss  # noqa: E402
from skyrl.backends.skyrl_train.utils.torch_utils import masked_mean  # noqa: E402
from torch import Tensor  # noqa: E402

from peers.skyrl_grpo import ALGORITHM, advantages  # noqa: E402
from rl.conformance import Implementation  # noqa: E402

VERSION = version("skyrl")


def batch_loss(
    new_logp: Tensor,
    old_logp: Tensor,
    ref_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps: float = 0.2,
    kl_beta: float = 0.001,
) -> Tensor:
    """The installed SkyRL's policy loss plus its KL term (`worker.py`'s `use_kl_loss` branch), token-mean reduced.

    Shape: `new_logp`, `old_logp`, `ref_logp`, `mask`: `[B, T]`; `advantages`: `[B]` -> loss `[]`.
    """
    config = SimpleNamespace(
        policy_loss_type="regular",
        eps_clip_low=clip_eps,
        eps_clip_high=clip_eps,
        off_policy_correction=SimpleNamespace(),
        loss_reduction="token_mean",  # read by releases that reduce inside ppo_policy_loss
        max_seq_len=mask.shape[1],
    )
    per_token = advantages.unsqueeze(-1).expand(mask.shape) * mask  # [B, T], as the trainer broadcasts them
    scale = getattr(ppo_utils, "apply_loss_reduction_to_advantages_minibatch", None)
    if scale is not None:  # 0.2.0 on: the token mean is in the advantages, the loss a sum
        per_token = scale(per_token, mask, "token_mean", new_logp.shape[0], mask.shape[1])
    policy_loss, _ = ppo_policy_loss(new_logp, old_logp, per_token, config, loss_mask=mask)
    if kl_beta == 0.0:
        return policy_loss
    kl = compute_approx_kl(new_logp, ref_logp, loss_mask=mask, kl_estimator_type="k3")
    return policy_loss + masked_mean(kl, mask, dim=-1).mean() * kl_beta


IMPL = Implementation(name=f"skyrl-{VERSION}", advantages=advantages, batch_loss=batch_loss, algorithm=ALGORITHM)
