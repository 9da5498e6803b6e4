"""A causal LM forward for Qwen2 and Llama decoders without transformers' per-call Python: the same torch ops in the
same order, through the model's own submodules, so the same bits (docs/benchmarks.md, "tiny shape").

On the tiny model a forward's arithmetic costs less than the decorators, output objects and argument plumbing of
transformers' `forward`. `causal_lm_forward` is the one dispatch point the sampler and trainer call instead of
`model(...)`: a model it supports runs the layer loop written out here, calling the model's leaf modules (embedding,
norms, rotary embedding, projections, MLPs, head: PEFT's LoRA layers, their dropout and `adapters_off` apply as
before), transformers' own mask builder, rotary function, cache update and attention function; anything else (another
architecture, hooks on a skipped module, gradient checkpointing, output capture, an attention kernel other than
eager or sdpa, a non-LoRA adapter) goes through `model(...)` unchanged. `tests/test_fast_forward.py` checks the logits,
caches and gradients are bitwise equal.
"""

from __future__ import annotations

import sys
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as torch_module

TRANSFORMERS_VERIFIED = ("5.25.",)
"""transformers releases whose Qwen2/Llama forward `_forward` is written from and tested against; others fall back."""
_KERNELS = ("eager", "sdpa")  # attention implementations written out here; others take transformers' forward
_ARCHITECTURES = ("Qwen2ForCausalLM", "LlamaForCausalLM")


@dataclass
class FastOutput:
    """What the callers read of transformers' `CausalLMOutputWithPast`: the logits and the KV cache (None without)."""

    logits: torch.Tensor
    cache: Any


@dataclass(frozen=True)
class _Plan:
    """A supported model's parts, found once per model (the checks that can change between calls run per call)."""

    lm: Any  # the *ForCausalLM (Any: its submodules are read by name)
    wrappers: tuple[nn.Module, ...]  # modules whose forward is skipped: PEFT wrappers, model, layers, attentions, ...
    layers: tuple[Any, ...]
    eager: Any  # the architecture module's eager attention function
    rotary: Any  # its apply_rotary_pos_emb


_PLANS: weakref.WeakKeyDictionary[nn.Module, _Plan | None] = weakref.WeakKeyDictionary()


def causal_lm_forward(
    model: nn.Module,
    *,
    input_ids: torch.Tensor,
    use_cache: bool,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    cache: Any = None,
    logits_to_keep: int | torch.Tensor = 0,
) -> Any:
    """`model(input_ids=..., attention_mask=..., position_ids=..., use_cache=..., cache=..., logits_to_keep=...)`, bit
    for bit: written out for a supported model (`fast_plan`), else transformers' forward itself. The result has
    `.logits` and the cache as `.cache` (or `.past_key_values` from an older transformers: read it with
    `rl.samplers.decoding._cache_of`).

    Shape: input_ids [B, L] -> logits [B, L or what logits_to_keep keeps, V]."""
    plan = fast_plan(model, cache)
    if plan is None:
        from rl.samplers.decoding import _cache_kwarg, _logits_kwargs

        kwargs: dict[str, Any] = {"attention_mask": attention_mask, "position_ids": position_ids}
        if cache is not None:
            kwargs[_cache_kwarg(model)] = cache
        if not (isinstance(logits_to_keep, int) and logits_to_keep == 0):
            kwargs.update(_logits_kwargs(model, logits_to_keep))
        return model(input_ids=input_ids, use_cache=use_cache, **{k: v for k, v in kwargs.items() if v is not None})
    return _forward(plan, input_ids, attention_mask, position_ids, cache, use_cache, logits_to_keep)


def fast_plan(model: nn.Module, cache: Any = None) -> _Plan | None:
    """The written-out forward's plan for `model` as it stands now, None where transformers' forward must run."""
    try:
        plan = _PLANS[model]
    except KeyError:
        plan = _PLANS[model] = _find_plan(model)
    except TypeError:  # not weak-referenceable: never seen by the sampler or trainer
        return None
    if plan is None:
        return None
    config = plan.lm.config
    if (
        config._attn_implementation not in _KERNELS
        or config.output_attentions
        or config.output_hidden_states
        or not getattr(config, "is_causal", True)
        or torch_module._global_forward_hooks
        or torch_module._global_forward_pre_hooks
        or torch_module._global_backward_hooks
        or torch_module._global_backward_pre_hooks
        or any(
            m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks
            for m in plan.wrappers
        )
        or any(getattr(layer, "gradient_checkpointing", False) for layer in plan.layers)
        or (cache is not None and not _plain_cache(cache))
    ):
        return None
    return plan


def transformers_verified() -> bool:
    """Whether the installed transformers is one `_forward` is written from (`TRANSFORMERS_VERIFIED`)."""
    import transformers

    return transformers.__version__.startswith(TRANSFORMERS_VERIFIED)


def _find_plan(model: nn.Module) -> _Plan | None:
    if not transformers_verified():
        return None
    wrappers: list[nn.Module] = []
    lm: Any = model
    peft_config = getattr(model, "active_peft_config", None)
    if peft_config is not None:  # PEFT: plain LoRA only (no prompt learning, no aLoRA offsets)
        from peft import PeftType

        if (
            peft_config.peft_type != PeftType.LORA
            or peft_config.is_prompt_learning
            or getattr(peft_config, "alora_invocation_tokens", None) is not None
            or type(model).__name__ != "PeftModelForCausalLM"
        ):
            return None
        tuner: Any = model.base_model
        wrappers += [model, tuner]
        lm = tuner.model
    if type(lm).__name__ not in _ARCHITECTURES or type(lm).__module__.split(".")[-1] not in (
        "modeling_qwen2",
        "modeling_llama",
    ):
        return None
    inner = lm.model
    config = lm.config
    if getattr(inner, "has_sliding_layers", False) or any(
        t != "full_attention" for t in getattr(config, "layer_types", None) or ()
    ):
        return None
    layers = tuple(inner.layers[: config.num_hidden_layers])
    arch = sys.modules[type(lm).__module__]
    wrappers += [lm, inner, *layers]
    for layer in layers:
        wrappers += [layer.self_attn]
        if getattr(layer.self_attn, "sliding_window", None) is not None:
            return None
    return _Plan(
        lm=lm,
        wrappers=tuple(wrappers),
        layers=layers,
        eager=arch.eager_attention_forward,
        rotary=arch.apply_rotary_pos_emb,
    )


def _plain_cache(cache: Any) -> bool:
    from transformers.cache_utils import DynamicCache, DynamicLayer

    return type(cache) is DynamicCache and all(type(layer) is DynamicLayer for layer in cache.layers)


def _forward(
    plan: _Plan,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    cache: Any,
    use_cache: bool,
    logits_to_keep: int | torch.Tensor,
) -> FastOutput:
    """Qwen2ForCausalLM.forward / LlamaForCausalLM.forward (transformers 5.2x) with their decorators' defaults, for a
    model `fast_plan` accepted: the model, decoder layer and attention bodies, op for op."""
    from transformers.cache_utils import DynamicCache
    from transformers.masking_utils import create_causal_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, slice_logits_to_keep

    lm = plan.lm
    config = lm.config
    inner = lm.model
    embeds = inner.embed_tokens(input_ids)
    if use_cache and cache is None:
        cache = DynamicCache(config=config)
    if position_ids is None:
        past_seen = cache.get_seq_length() if cache is not None else 0
        position_ids = (torch.arange(embeds.shape[1], device=embeds.device) + past_seen).unsqueeze(0)
    mask = create_causal_mask(
        config=config, inputs_embeds=embeds, attention_mask=attention_mask, cache=cache, position_ids=position_ids
    )
    hidden = embeds
    cos, sin = inner.rotary_emb(hidden, position_ids)
    attention = ALL_ATTENTION_FUNCTIONS.get_interface(config._attn_implementation, plan.eager)
    for layer in plan.layers:
        attn = layer.self_attn
        residual = hidden
        hidden = layer.input_layernorm(hidden)
        input_shape = hidden.shape[:-1]
        hidden_shape = (*input_shape, -1, attn.head_dim)
        query = attn.q_proj(hidden).view(hidden_shape).transpose(1, 2)
        key = attn.k_proj(hidden).view(hidden_shape).transpose(1, 2)
        value = attn.v_proj(hidden).view(hidden_shape).transpose(1, 2)
        query, key = plan.rotary(query, key, cos, sin)
        if cache is not None:
            key, value = cache.update(key, value, attn.layer_idx, kwargs={})
        out, _ = attention(
            attn,
            query,
            key,
            value,
            mask,
            dropout=0.0 if not attn.training else attn.attention_dropout,
            scaling=attn.scaling,
        )
        out = attn.o_proj(out.reshape(*input_shape, -1).contiguous())
        hidden = residual + out
        residual = hidden
        hidden = layer.mlp(layer.post_attention_layernorm(hidden))
        hidden = residual + hidden
    hidden = inner.norm(hidden)
    logits = lm.lm_head(slice_logits_to_keep(hidden, logits_to_keep))
    return FastOutput(logits=logits, cache=cache if use_cache else None)
