"""Seeded decoding and teacher-forced log-probs on a torch causal LM: the CPU reference for what vLLM does on a GPU.

One call samples one group: the prompt is forwarded once, its KV cache (`cache`, formerly `past_key_values`) repeated
`n` times, and all `n` sequences decode together at the request's `SamplingSettings` (temperature 1.0, no top-k or
top-p cut by default: the policy's own distribution, as the tutorial samples vLLM). The recorded log-prob of a token is
its log-prob under the distribution it was drawn from: tempered, truncated and renormalised (`sampling_logprobs`), and
the trainer teacher-forces the same (`teacher_forced_logprobs(..., sampling=...)`). Randomness comes only from a
`torch.Generator` seeded with the request's seed, which the driver derives per (iteration, group) (rl.seeding): a
retried request samples the same tokens, and the `n` rows of a group draw independently from one stream.

A sequence stops when it samples `<eos>` (which is kept in `token_ids`, with its log-prob: stopping is an action the
policy gradient must credit) or after `max_tokens` tokens.
"""

from __future__ import annotations

import inspect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rl.errors import InvalidRolloutRequestError, NonFiniteLogitsError, shown
from rl.samplers.fast_forward import causal_lm_forward
from rl.types import DEFAULT_SAMPLING, SamplingSettings


@dataclass(frozen=True)
class SampledSequence:
    """One sampled continuation: its tokens (ending with eos if it stopped there) and each token's sampling log-prob."""

    token_ids: list[int]
    logprobs: list[float]
    stopped_at_eos: bool


def sampling_logprobs(
    logits: torch.Tensor, sampling: SamplingSettings, *, keep: torch.Tensor | None = None
) -> torch.Tensor:
    """Log-probs of the distribution `sampling` draws from: softmax(logits / temperature) cut to the top-k, then to the
    top-p mass, renormalised over what is left (cut tokens get -inf). Differentiable; at the default settings exactly
    `log_softmax(logits)`.

    A token is cut by top-k when its tempered logit is below the k-th largest (ties kept), and by top-p when the mass
    of the tokens at most as probable as it, itself included, is <= 1 - top_p (ascending order; the most probable is
    always kept): vLLM's and transformers' rules. `keep` (bool, the shape of `logits`) marks tokens counted in
    whatever the cut: the trainer passes the token it scores, so a token the engine drew is never given -inf by a
    cut its rounding moved (on-policy it is inside the cut already).

    Shape: logits [..., V] (float) -> [..., V].
    """
    if sampling.is_default:
        return torch.log_softmax(logits, dim=-1)
    scores = logits / sampling.temperature if sampling.temperature != 1.0 else logits
    cut = torch.zeros_like(scores, dtype=torch.bool)  # [..., V]
    if 0 < sampling.top_k < scores.shape[-1]:
        kth = torch.topk(scores.detach(), sampling.top_k, dim=-1).values[..., -1:]  # [..., 1]
        cut |= scores.detach() < kth
    if sampling.top_p < 1.0:
        probs = torch.softmax(scores.detach().masked_fill(cut, -math.inf), dim=-1)  # [..., V]
        ascending, order = torch.sort(probs, dim=-1, stable=True)
        below = torch.cumsum(ascending, dim=-1) <= 1.0 - sampling.top_p  # [..., V] in ascending order
        below[..., -1] = False  # the most probable token is always kept
        cut |= torch.zeros_like(cut).scatter(-1, order, below)
    if keep is not None:
        cut &= ~keep
    return torch.log_softmax(scores.masked_fill(cut, -math.inf), dim=-1)


def _as_ids(ids: Sequence[int] | torch.Tensor) -> list[int]:
    return [int(t) for t in (ids.tolist() if isinstance(ids, torch.Tensor) else ids)]


def _cache_kwarg(model: nn.Module) -> str:
    """The forward kwarg that takes a KV cache: `cache` from transformers 5.2x, `past_key_values` before."""
    return "cache" if "cache" in _forward_parameters(model) else "past_key_values"


_FORWARD_PARAMETERS: dict[type, frozenset[str]] = {}  # by model class: a signature costs more than a tiny model's step


def _forward_parameters(model: nn.Module) -> frozenset[str]:
    """The parameter names of the forward `model` (or the base model a PEFT model wraps) runs."""
    get_base_model = getattr(model, "get_base_model", None)
    base = get_base_model() if callable(get_base_model) else model
    own = getattr(base, "__dict__", {}).get("forward")  # a forward set on the instance (a hook's wrapper) is called
    if own is not None:
        return frozenset(inspect.signature(own).parameters)
    names = _FORWARD_PARAMETERS.get(type(base))
    if names is None:
        names = _FORWARD_PARAMETERS[type(base)] = frozenset(inspect.signature(type(base).forward).parameters)
    return names


def _cache_of(output: Any) -> Any:
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


PREFILL_ONCE_MIN_PARAMETERS = 10_000_000
"""From this many parameters up, `_prefill` forwards each prompt once; below it, one padded row per sample (a forward
of such a model costs less than the Python around it; docs/benchmarks.md has the figures)."""


@torch.inference_mode()
def sample_group(
    model: nn.Module,
    prompt_ids: Sequence[int],
    *,
    n: int,
    max_tokens: int,
    seed: int,
    eos_token_id: int,
    sampling: SamplingSettings = DEFAULT_SAMPLING,
    prefill_once_min_parameters: int = PREFILL_ONCE_MIN_PARAMETERS,
) -> list[SampledSequence]:
    """Sample `n` continuations of one prompt in one batch with a KV cache, drawn as `sampling` says.

    The same arguments (and the same torch thread count) give the same tokens and bitwise-identical log-probs.

    Shape: prompt_ids [P] -> n sequences of length T_i <= max_tokens, each with T_i log-probs.
    """
    return sample_groups(
        model,
        [prompt_ids],
        ns=[n],
        max_tokens=max_tokens,
        seeds=[seed],
        eos_token_id=eos_token_id,
        sampling=sampling,
        prefill_once_min_parameters=prefill_once_min_parameters,
    )[0]


@torch.inference_mode()
def sample_groups(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    *,
    ns: Sequence[int],
    max_tokens: int,
    seeds: Sequence[int],
    eos_token_id: int,
    pad_token_id: int | None = None,
    sampling: SamplingSettings = DEFAULT_SAMPLING,
    prefill_once_min_parameters: int = PREFILL_ONCE_MIN_PARAMETERS,
) -> list[list[SampledSequence]]:
    """`sample_group` for several prompts, decoded together as one batch of `sum(ns)` rows.

    Prompts of different lengths are padded on the *left* (`pad_token_id`, default `eos_token_id`), so every row's
    next token sits in the last column; an attention mask hides the pads and position ids count from each row's first
    real token, so a row sees exactly what it would alone. Prompts of one length go without mask or padding.

    Each group draws from its own generator seeded with its seed, so its tokens are what `sample_group` draws from the
    same log-probs; those come from a larger batch, whose matmuls may round differently in the last bit
    (`tests/test_torch_sampler.py` bounds it; docs/benchmarks.md has the gap measured), so a token drawn right at a
    boundary of the cumulative distribution could differ. The same arguments give the same bits (resume and replay).

    Shape: G prompts [P_g] -> G lists of n_g sequences of length T_i <= max_tokens.
    """
    if len(prompts) != len(ns) or len(prompts) != len(seeds):
        raise InvalidRolloutRequestError(f"got {len(prompts)} prompts, {len(ns)} group sizes and {len(seeds)} seeds")
    if any(n < 1 for n in ns):
        raise InvalidRolloutRequestError(f"n must be >= 1 (the group size), got {list(ns)}")
    if max_tokens < 1:
        raise InvalidRolloutRequestError(f"max_tokens must be >= 1, got {max_tokens}")
    if any(not p for p in prompts):
        raise InvalidRolloutRequestError("the prompt encodes to no tokens; the tokenizer should at least prepend <bos>")
    generators = [torch.Generator(device="cpu").manual_seed(seed) for seed in seeds]
    bounds = [0, *itertools.accumulate(ns)]
    rows = bounds[-1]
    width = max(len(p) for p in prompts)
    pad = eos_token_id if pad_token_id is None else pad_token_id
    padded = any(len(p) != width for p in prompts)
    # Each prompt is forwarded once, and its KV cache and last logits are repeated for its group's n rows.
    logits, past, mask, positions = _prefill(
        model, [list(p) for p in prompts], ns, width, pad, padded, prefill_once_min_parameters
    )
    next_position = positions[:, -1:] + 1  # [rows, 1]
    extra: dict[str, torch.Tensor] = {}
    tokens = torch.empty((rows, 0), dtype=torch.long)  # [rows, t]
    logps = torch.empty((rows, 0), dtype=torch.float32)  # [rows, t]
    finished = torch.zeros(rows, dtype=torch.bool)  # [rows]
    lengths = torch.full((rows,), max_tokens, dtype=torch.long)  # [rows]
    for t in range(max_tokens):
        logp = sampling_logprobs(logits.float(), sampling)  # [rows, V]; -inf where a top-k/top-p cut removed a token
        probs = logp.exp()
        # Sample from exp(logp), not softmax(logits): the recorded log-prob is then exactly the distribution sampled.
        nxt = draw_tokens(probs, generators, bounds)  # [rows, 1]
        tokens = torch.cat([tokens, nxt], dim=1)
        logps = torch.cat([logps, logp.gather(1, nxt)], dim=1)
        newly = (nxt.squeeze(1) == eos_token_id) & ~finished
        lengths[newly] = t + 1
        finished |= newly
        if bool(finished.all()) or t == max_tokens - 1:
            break
        # Finished rows keep decoding (their tokens are discarded): one fixed-shape batch keeps the cache simple.
        if padded:
            mask = torch.cat([mask, torch.ones((rows, 1), dtype=torch.long)], dim=1)
            extra = {"attention_mask": mask, "position_ids": next_position}
            next_position = next_position + 1
        out = causal_lm_forward(model, input_ids=nxt, use_cache=True, cache=past, **extra)
        logits, past = out.logits[:, -1, :], _cache_of(out)
    token_lists, logp_lists = tokens.tolist(), logps.tolist()
    seqs = [
        SampledSequence(
            token_ids=token_lists[i][: int(lengths[i])],
            logprobs=logp_lists[i][: int(lengths[i])],
            stopped_at_eos=bool(finished[i]),
        )
        for i in range(rows)
    ]
    return [seqs[lo:hi] for lo, hi in itertools.pairwise(bounds)]


def draw_tokens(probs: torch.Tensor, generators: Sequence[torch.Generator], bounds: Sequence[int]) -> torch.Tensor:
    """One token per row from `probs` (unnormalised, >= 0) by inverse CDF: rows `bounds[g]:bounds[g + 1]` take one
    uniform each from `generators[g]`, and the token is the first whose cumulative mass (float64) exceeds that share
    of the row's total. A token of zero mass is never drawn. One uniform a row, where `torch.multinomial` draws an
    Exp(1) per vocabulary entry (docs/benchmarks.md has what that cost).

    Shape: probs [rows, V] -> [rows, 1] (long)."""
    cdf = probs.double().cumsum(dim=-1)  # [rows, V]
    total = cdf[:, -1:]  # [rows, 1]
    if not bool(torch.isfinite(total).all() and (total > 0).all()):
        raise NonFiniteLogitsError(
            "the policy's next-token probabilities are NaN, infinite or all zero "
            f"(row totals {shown(total.squeeze(1).tolist())}); nothing was sampled. The adapter has diverged or the "
            "model's weights are broken: resume from an earlier checkpoint with a lower learning rate"
        )
    shares = torch.cat(
        [
            torch.rand((hi - lo, 1), generator=g, dtype=torch.float64)
            for g, (lo, hi) in zip(generators, itertools.pairwise(bounds), strict=True)
        ]
    )  # [rows, 1], in [0, 1)
    return tokens_at(probs, cdf, shares)


def tokens_at(probs: torch.Tensor, cdf: torch.Tensor, shares: torch.Tensor) -> torch.Tensor:
    """Each row's first token whose cumulative mass `cdf` exceeds `shares` (in [0, 1]) of the row's total; a share
    that rounds up to the total takes the row's last token of nonzero mass.

    Shape: probs, cdf [rows, V], shares [rows, 1] -> [rows, 1] (long)."""
    picked = torch.searchsorted(cdf, shares * cdf[:, -1:], right=True)  # [rows, 1]
    over = picked >= probs.shape[-1]  # [rows, 1]
    if bool(over.any()):
        last = probs.shape[-1] - 1 - (probs.flip(-1) > 0).int().argmax(dim=-1, keepdim=True)  # [rows, 1]
        picked = torch.where(over, last, picked)
    return picked


def _prefill(
    model: nn.Module,
    prompts: list[list[int]],
    ns: Sequence[int],
    width: int,
    pad: int,
    padded: bool,
    min_parameters: int,
) -> tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor]:
    """The prompts' forward, given per row (prompt g's `ns[g]` rows in order): last logits [rows, V], the KV cache,
    the attention mask [rows, P] and positions [rows, P] (left padding: the mask hides the pads, positions count real
    tokens only).

    Each prompt is forwarded alone, unpadded, so a group's prefill is bit for bit the one a one-group call computes
    (a batch of other shapes may round differently in the last bit); its keys and values are then repeated for the
    group's rows and left-padded with zeros (masked) to `width`. A model under `min_parameters`, or a
    cache other than transformers' `DynamicCache` of `DynamicLayer`s, is prefilled one padded row per sample instead."""
    rows = [p for p, n in zip(prompts, ns, strict=True) for _ in range(n)]
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in rows], dtype=torch.long)  # [rows, P]
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)  # [rows, P]
    outs: list[Any] = []
    if _parameters(model) >= min_parameters:
        for prompt in prompts:
            outs.append(causal_lm_forward(model, input_ids=torch.tensor([prompt], dtype=torch.long), use_cache=True))
            if not _repeatable(_cache_of(outs[-1])):
                outs = []
                break
    if not outs:
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in rows], dtype=torch.long)  # [rows, P]
        out = causal_lm_forward(
            model,
            input_ids=input_ids,
            use_cache=True,
            **({"attention_mask": mask, "position_ids": positions} if padded else {}),
        )
        return out.logits[:, -1, :], _cache_of(out), mask, positions
    caches = [_cache_of(out) for out in outs]
    for i, layer in enumerate(caches[0].layers):
        for name in ("keys", "values"):
            parts = []
            for cache, prompt, n in zip(caches, prompts, ns, strict=True):
                kv = getattr(cache.layers[i], name)  # [1, H, P_g, D]
                gap = kv.new_zeros(1, kv.shape[1], width - len(prompt), kv.shape[3])  # [1, H, pads, D]
                parts.append(torch.cat([gap, kv], dim=2).expand(n, -1, -1, -1))  # [n, H, P, D]
            setattr(layer, name, torch.cat(parts))  # [rows, H, P, D]
    logits = torch.cat([out.logits[:, -1, :].expand(n, -1) for out, n in zip(outs, ns, strict=True)])  # [rows, V]
    return logits, caches[0], mask, positions


def _parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _repeatable(cache: Any) -> bool:
    """Whether `_prefill` can repeat and pad `cache` row by row: a `DynamicCache` of plain `DynamicLayer`s."""
    from transformers.cache_utils import DynamicLayer

    layers: Any = getattr(cache, "layers", None) or ()
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def teacher_forced_logprobs(
    model: nn.Module,
    prompt_ids: Sequence[int] | torch.Tensor,
    completion_ids: Sequence[int] | torch.Tensor,
    sampling: SamplingSettings = DEFAULT_SAMPLING,
) -> torch.Tensor:
    """log π(completion_t | prompt, completion_<t) for each completion token, from one full forward pass, under the
    distribution `sampling` draws from (`sampling_logprobs`, the scored token always counted in the cut).

    Differentiable (no `no_grad` here: the trainer calls it under autograd). Float32 whatever the model's dtype.

    Shape: prompt_ids [P], completion_ids [T] -> [T].
    """
    prompt, completion = _as_ids(prompt_ids), _as_ids(completion_ids)
    if not prompt:
        raise ValueError("prompt_ids is empty; teacher forcing needs at least one context token (e.g. <bos>)")
    if not completion:
        return torch.empty(0, dtype=torch.float32)
    device = next(model.parameters()).device  # the model's (CPU, or CUDA for the GPU trainer); the result lives there
    ids = torch.tensor([prompt + completion], dtype=torch.long, device=device)  # [1, P+T]
    logits = causal_lm_forward(model, input_ids=ids, use_cache=False).logits[0, len(prompt) - 1 : -1, :]  # [T, V]
    targets = torch.tensor(completion, device=device).unsqueeze(1)  # [T, 1]
    keep = None if sampling.is_default else torch.zeros_like(logits, dtype=torch.bool).scatter(1, targets, True)
    logp = sampling_logprobs(logits.float(), sampling, keep=keep)  # [T, V]
    return logp.gather(1, targets).squeeze(1)  # [T]


def batched_teacher_forced_logprobs(
    model: nn.Module,
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    pad_token_id: int,
    sampling: SamplingSettings = DEFAULT_SAMPLING,
    *,
    share_prompts: bool | None = None,
    prefill_once_min_parameters: int = PREFILL_ONCE_MIN_PARAMETERS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`teacher_forced_logprobs` for a batch of (prompt, completion) pairs of any lengths, in one forward pass.

    Rows are right-padded: under causal attention a real token never attends to a pad after it, and position ids
    start at 0 in every row, so no attention mask is needed and real positions equal the unbatched result up to float
    rounding of a different batch shape (not bitwise). Returns (logprobs, mask); padded positions hold 0. The head
    runs only from the first predicting position on (`logits_to_keep`), not over the prompts.

    `share_prompts` (default: from `prefill_once_min_parameters` up, with no dropout active) forwards each distinct
    prompt once and its completions on its KV cache, as the sampler decodes (a GRPO group's rows share one prompt);
    gradients flow through the shared prompt. Same values up to float rounding; each path is bitwise reproducible.

    Shape: B prompts [P_b], B completions [T_b] -> logprobs [B, T_max], mask [B, T_max] (bool).
    """
    if len(prompt_ids) != len(completion_ids):
        raise ValueError(
            f"got {len(prompt_ids)} prompts but {len(completion_ids)} completions; pass one of each per row"
        )
    if any(len(p) == 0 for p in prompt_ids):
        raise ValueError("a prompt is empty; teacher forcing needs at least one context token (e.g. <bos>)")
    batch = len(prompt_ids)
    t_max = max((len(c) for c in completion_ids), default=0)
    if batch == 0 or t_max == 0:
        return torch.zeros(batch, t_max), torch.zeros(batch, t_max, dtype=torch.bool)
    prompts, completions = [_as_ids(p) for p in prompt_ids], [_as_ids(c) for c in completion_ids]
    device = next(model.parameters()).device  # the model's (CPU, or CUDA for the GPU trainer); the result lives there
    targets = torch.tensor([c + [0] * (t_max - len(c)) for c in completions], dtype=torch.long)  # [B, T]
    mask = torch.tensor([[t < len(c) for t in range(t_max)] for c in completions], dtype=torch.bool)  # [B, T]
    targets, mask = targets.to(device), mask.to(device)
    if share_prompts is None:
        share_prompts = _parameters(model) >= prefill_once_min_parameters and not _dropout_active(model)
    picked = _shared_prompt_logits(model, prompts, completions, pad_token_id) if share_prompts else None
    if picked is None:
        picked = _full_row_logits(model, prompts, completions, pad_token_id, t_max)  # [B, T_max, V]
    index = targets.unsqueeze(-1)  # [B, T_max, 1]
    keep = None if sampling.is_default else torch.zeros_like(picked, dtype=torch.bool).scatter(2, index, True)
    logp = sampling_logprobs(picked.float(), sampling, keep=keep)  # [B, T_max, V]
    logprobs = logp.gather(2, index).squeeze(-1)  # [B, T_max]
    return logprobs.masked_fill(~mask, 0.0), mask


def _dropout_active(model: nn.Module) -> bool:
    """Whether a forward would draw dropout masks (a shared prompt would give a group's rows one mask, not one each)."""
    return model.training and any(isinstance(m, nn.Dropout) and m.p > 0 for m in model.modules())


def _logits_kwargs(model: nn.Module, keep: int | torch.Tensor) -> dict[str, Any]:
    """`logits_to_keep=keep` where the model's forward takes it (transformers >= 4.50), else nothing."""
    return {"logits_to_keep": keep} if "logits_to_keep" in _forward_parameters(model) else {}


def _full_row_logits(
    model: nn.Module, prompts: list[list[int]], completions: list[list[int]], pad: int, t_max: int
) -> torch.Tensor:
    """The logits predicting each completion token, from one right-padded forward of every prompt + completion row.

    Shape: -> [B, T_max, V] (positions past a row's completion hold a copy of an earlier position: masked)."""
    rows = [p + c for p, c in zip(prompts, completions, strict=True)]
    width = max(len(r) for r in rows)
    device = next(model.parameters()).device
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows], dtype=torch.long, device=device)  # [B, L]
    # Completion token t of row b sits at position P_b + t and is predicted from position P_b + t - 1.
    first = min(len(p) for p in prompts) - 1  # the head runs from here on: earlier positions predict nothing read
    kwargs = _logits_kwargs(model, width - first)
    offset = first if kwargs else 0
    starts = torch.tensor([len(p) - 1 - offset for p in prompts], device=device)  # [B]
    positions = (starts.unsqueeze(1) + torch.arange(t_max, device=device)).clamp(max=width - 2 - offset)  # [B, T]
    logits = causal_lm_forward(model, input_ids=ids, use_cache=False, **kwargs).logits  # [B, L - offset, V]
    return logits.gather(1, positions.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))  # [B, T_max, V]


def _shared_prompt_logits(
    model: nn.Module, prompts: list[list[int]], completions: list[list[int]], pad: int
) -> torch.Tensor | None:
    """`_full_row_logits` with the distinct prompts forwarded once, together, left-padded to the longest (their last
    column's logits predict token 0), and every row's completion forwarded on its prompt's rows of that KV cache; None
    where the cache is not a `DynamicCache` of `DynamicLayer`s (`_repeatable`), or no prompt repeats.

    Shape: -> [B, T_max, V]."""
    distinct: dict[tuple[int, ...], int] = {}
    row_prompt = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]  # [B] index into distinct
    if len(distinct) == len(prompts):
        return None
    device = next(model.parameters()).device
    width = max(len(p) for p in distinct)
    # The distinct prompts in one forward, left-padded (masked; positions count real tokens): the last column predicts.
    prefix = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in distinct], dtype=torch.long, device=device)
    ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in distinct], dtype=torch.long, device=device)
    masked = {"attention_mask": prefix, "position_ids": (prefix.cumsum(1) - 1).clamp(min=0)} if not prefix.all() else {}
    out = causal_lm_forward(model, input_ids=ids, use_cache=True, **masked, **_logits_kwargs(model, 1))  # [U, P]
    cache = _cache_of(out)
    if not _repeatable(cache):
        return None
    index = torch.tensor(row_prompt, device=device)  # [B]
    first = out.logits[:, -1:, :].index_select(0, index)  # [B, 1, V]
    t_max = max(len(c) for c in completions)
    if t_max == 1:
        return first
    for layer in cache.layers:  # each row's prompt: [U, H, P, D] -> [B, H, P, D]; backward sums a group's rows
        for name in ("keys", "values"):
            setattr(layer, name, getattr(layer, name).index_select(0, index))
    rows = prefix.index_select(0, index)  # [B, P]
    attention = torch.cat([rows, rows.new_ones(len(prompts), t_max)], dim=1)  # [B, P + T]
    positions = rows.sum(dim=1, keepdim=True) + torch.arange(t_max, device=device)  # [B, T]: after the prompt's tokens
    ids = torch.tensor([c + [pad] * (t_max - len(c)) for c in completions], dtype=torch.long, device=device)  # [B, T]
    out = causal_lm_forward(
        model,
        input_ids=ids,
        attention_mask=attention,
        position_ids=positions,
        use_cache=True,
        cache=cache,
        **_logits_kwargs(model, torch.arange(t_max - 1, device=device)),
    )
    return torch.cat([first, out.logits[:, : t_max - 1, :]], dim=1)  # [B, T_max, V]
