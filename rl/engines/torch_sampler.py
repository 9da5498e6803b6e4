"""The rollout engine on plain torch: the CPU reference for what vLLM does on a GPU.

One call samples one group: the prompt is encoded once, repeated `n` times, and all `n` sequences decode together
through a KV cache (`cache`, formerly `past_key_values`), at temperature 1.0 and top_p 1.0, so the recorded
log-probabilities are the policy's own (the same reason the seed samples vLLM at those settings). Randomness comes
only from a `torch.Generator` seeded with `request.seed`: the driver derives that seed per (iteration, group)
(rl.seeding), so a retried request samples the same tokens, and the `n` rows of a group draw independently from one
stream, so they differ.

A sequence stops when it samples `<eos>` (which is kept in `token_ids`, with its log-prob: stopping is an action the
policy gradient must credit) or after `max_tokens` tokens. The completion text is decoded with special tokens skipped.

Everything runs on the calling thread and blocks the event loop while it samples: torch's intra-op thread count is
what makes results bitwise reproducible, and it is only reliably the one set for the thread doing the work. Pass
`threads=` to pin it; library code sets it nowhere else.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import copy
import functools
import inspect
import itertools
import tempfile
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rl.artifacts import materialize
from rl.engines.lora_merge import LoraWeights, MergedBase, UnsupportedLora, parse_lora
from rl.models import load_base_model, load_tokenizer
from rl.protocols import Artifacts
from rl.types import ArtifactRef, Rollout, RolloutRequest

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")


class InvalidRolloutRequest(ValueError):
    """A request the engine cannot serve as asked (bad `n`, `max_tokens`, or a prompt too long for the model)."""


class NotAnAdapter(ValueError):
    """The requested adapter artifact is not a PEFT LoRA adapter directory."""


@dataclass(frozen=True)
class SampledSequence:
    """One sampled continuation: its tokens (ending with eos if it stopped there) and each token's sampling log-prob."""

    token_ids: list[int]
    logprobs: list[float]
    stopped_at_eos: bool


def _as_ids(ids: Sequence[int] | torch.Tensor) -> list[int]:
    return [int(t) for t in (ids.tolist() if isinstance(ids, torch.Tensor) else ids)]


def _cache_kwarg(model: nn.Module) -> str:
    """The forward kwarg that takes a KV cache: `cache` from transformers 5.2x, `past_key_values` before."""
    get_base_model = getattr(model, "get_base_model", None)
    base = get_base_model() if callable(get_base_model) else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def _cache_of(output: Any) -> Any:
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


@torch.inference_mode()
def sample_group(
    model: nn.Module,
    prompt_ids: Sequence[int],
    *,
    n: int,
    max_tokens: int,
    seed: int,
    eos_token_id: int,
) -> list[SampledSequence]:
    """Sample `n` continuations of one prompt in one batch with a KV cache, at temperature 1.0, top_p 1.0.

    The same arguments (and the same torch thread count) give the same tokens and bitwise-identical log-probs.

    Shape: prompt_ids [P] -> n sequences of length T_i <= max_tokens, each with T_i log-probs.
    """
    return sample_groups(model, [prompt_ids], ns=[n], max_tokens=max_tokens, seeds=[seed], eos_token_id=eos_token_id)[0]


@torch.inference_mode()
def sample_groups(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    *,
    ns: Sequence[int],
    max_tokens: int,
    seeds: Sequence[int],
    eos_token_id: int,
) -> list[list[SampledSequence]]:
    """`sample_group` for several prompts of one token length, decoded together as one batch of `sum(ns)` rows.

    Each group draws from its own generator seeded with its seed, so its tokens are what `sample_group` draws from the
    same log-probs; the log-probs themselves come from a larger batch, whose matmuls may round differently in the last
    bit (measured: bit for bit equal on the demo's model and shapes, up to 1.4e-6 on an adapter with large random
    weights; `tests/test_torch_sampler.py` bounds it), so a token drawn right at a boundary of the cumulative
    distribution could differ from the one-group call. The same arguments give the same bits, which is what resume and
    replay need.

    Shape: G prompts [P] (one P) -> G lists of n_g sequences of length T_i <= max_tokens.
    """
    if len(prompts) != len(ns) or len(prompts) != len(seeds):
        raise InvalidRolloutRequest(f"got {len(prompts)} prompts, {len(ns)} group sizes and {len(seeds)} seeds")
    if any(n < 1 for n in ns):
        raise InvalidRolloutRequest(f"n must be >= 1 (the group size), got {list(ns)}")
    if max_tokens < 1:
        raise InvalidRolloutRequest(f"max_tokens must be >= 1, got {max_tokens}")
    if any(not p for p in prompts):
        raise InvalidRolloutRequest("the prompt encodes to no tokens; the tokenizer should at least prepend <bos>")
    if len({len(p) for p in prompts}) != 1:
        raise InvalidRolloutRequest(
            f"sample_groups takes prompts of one length, got {sorted({len(p) for p in prompts})}"
        )
    generators = [torch.Generator(device="cpu").manual_seed(seed) for seed in seeds]
    bounds = [0, *itertools.accumulate(ns)]
    rows = bounds[-1]
    input_ids = torch.tensor([list(p) for p, n in zip(prompts, ns, strict=True) for _ in range(n)], dtype=torch.long)
    cache_kw = _cache_kwarg(model)
    out = model(input_ids=input_ids, use_cache=True)  # [rows, P]
    logits, past = out.logits[:, -1, :], _cache_of(out)  # [rows, V]
    tokens = torch.empty((rows, 0), dtype=torch.long)  # [rows, t]
    logps = torch.empty((rows, 0), dtype=torch.float32)  # [rows, t]
    finished = torch.zeros(rows, dtype=torch.bool)  # [rows]
    lengths = torch.full((rows,), max_tokens, dtype=torch.long)  # [rows]
    for t in range(max_tokens):
        logp = torch.log_softmax(logits.float(), dim=-1)  # [rows, V]
        probs = logp.exp()
        # Sample from exp(logp), not softmax(logits): the recorded log-prob is then exactly the distribution sampled.
        nxt = torch.cat(
            [
                torch.multinomial(probs[lo:hi], num_samples=1, generator=g)
                for g, (lo, hi) in zip(generators, itertools.pairwise(bounds), strict=True)
            ]
        )  # [rows, 1]
        tokens = torch.cat([tokens, nxt], dim=1)
        logps = torch.cat([logps, logp.gather(1, nxt)], dim=1)
        newly = (nxt.squeeze(1) == eos_token_id) & ~finished
        lengths[newly] = t + 1
        finished |= newly
        if bool(finished.all()) or t == max_tokens - 1:
            break
        # Finished rows keep decoding (their tokens are discarded): one fixed-shape batch keeps the cache simple.
        out = model(input_ids=nxt, use_cache=True, **{cache_kw: past})
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


def teacher_forced_logprobs(
    model: nn.Module, prompt_ids: Sequence[int] | torch.Tensor, completion_ids: Sequence[int] | torch.Tensor
) -> torch.Tensor:
    """log π(completion_t | prompt, completion_<t) for each completion token, from one full forward pass.

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
    logits = model(input_ids=ids, use_cache=False).logits[0, len(prompt) - 1 : -1, :]  # [T, V]
    logp = torch.log_softmax(logits.float(), dim=-1)  # [T, V]
    return logp.gather(1, torch.tensor(completion, device=device).unsqueeze(1)).squeeze(1)  # [T]


def batched_teacher_forced_logprobs(
    model: nn.Module, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]], pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """`teacher_forced_logprobs` for a batch of (prompt, completion) pairs of any lengths, in one forward pass.

    Rows are right-padded: under causal attention a real token never attends to a pad after it, and position ids
    start at 0 in every row, so no attention mask is needed and real positions equal the unbatched result up to float
    rounding of a different batch shape (not bitwise). Returns (logprobs, mask); padded positions hold 0.

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
    rows = [_as_ids(p) + _as_ids(c) for p, c in zip(prompt_ids, completion_ids, strict=True)]
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [pad_token_id] * (width - len(r)) for r in rows], dtype=torch.long)  # [B, L]
    targets = torch.tensor([_as_ids(c) + [0] * (t_max - len(c)) for c in completion_ids], dtype=torch.long)  # [B, T]
    mask = torch.tensor([[t < len(c) for t in range(t_max)] for c in completion_ids], dtype=torch.bool)  # [B, T]
    # Completion token t of row b sits at position P_b + t and is predicted from position P_b + t - 1.
    starts = torch.tensor([len(p) - 1 for p in prompt_ids])  # [B]
    positions = (starts.unsqueeze(1) + torch.arange(t_max)).clamp(max=width - 2)  # [B, T_max]
    device = next(model.parameters()).device  # the model's (CPU, or CUDA for the GPU trainer); the result lives there
    ids, targets, mask, positions = (t.to(device) for t in (ids, targets, mask, positions))
    logits = model(input_ids=ids, use_cache=False).logits  # [B, L, V]; no KV cache to build: nothing decodes after
    # Only the predicting positions go through log_softmax: the prompt's other positions are never read.
    picked = logits.gather(1, positions.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))  # [B, T_max, V]
    logp = torch.log_softmax(picked.float(), dim=-1)  # [B, T_max, V]
    logprobs = logp.gather(2, targets.unsqueeze(-1)).squeeze(-1)  # [B, T_max]
    return logprobs.masked_fill(~mask, 0.0), mask


class AdapterCache:
    """Base model + LoRA adapters loaded from directories, cached by key (an artifact digest), least recently used out.

    Each cached adapter wraps its own copy of the base model. That costs `capacity` x the base model's memory, which is
    nothing for the tiny CPU model, and keeps every policy a plain, independent `PeftModel` (PEFT's multi-adapter
    switching would share the base but make an adapter's forward depend on which others were loaded or deleted).
    Large models belong on vLLM (rl.engines.vllm), which shares one base across LoRA adapters on the GPU.

    `merge=True` folds each adapter into its base copy once (W + s·BA, PEFT's `merge_and_unload`): decoding then runs
    the plain model, about twice as fast on the tiny model, because an unmerged LoRA adds two small matmuls and Python
    overhead to every linear layer at every step. Log-probs then differ from the unmerged PEFT forward the trainer
    uses by float rounding only (measured ~1e-6; the tests bound it by 1e-5), as vLLM's LoRA kernels also differ;
    results stay bitwise reproducible. `merge=False` keeps the exact PEFT forward.
    """

    def __init__(
        self, base_model_dir: Path, *, capacity: int = 2, dtype: torch.dtype = torch.float32, merge: bool = False
    ) -> None:
        if capacity < 1:
            raise ValueError(f"adapter cache capacity must be >= 1, got {capacity}")
        self.base_model_dir = Path(base_model_dir)
        self.capacity = capacity
        self.merge = merge
        self.base = load_base_model(self.base_model_dir, dtype=dtype)
        self._models: OrderedDict[str, nn.Module] = OrderedDict()
        self.loads = 0  # adapters loaded from disk, for tests and the benchmark

    def get(self, key: str) -> nn.Module | None:
        model = self._models.get(key)
        if model is not None:
            self._models.move_to_end(key)
        return model

    def load_dir(self, key: str, adapter_dir: Path) -> nn.Module:
        """Load the PEFT LoRA adapter in `adapter_dir` over a fresh copy of the base model (frozen, eval mode)."""
        from peft import PeftModel

        adapter_dir = Path(adapter_dir)
        present = {p.name for p in adapter_dir.iterdir()} if adapter_dir.is_dir() else set()
        if ADAPTER_CONFIG not in present or not present & set(ADAPTER_WEIGHTS):
            raise NotAnAdapter(
                f"{adapter_dir} is not a PEFT LoRA adapter directory (it holds {sorted(present) or 'nothing'}; "
                f"expected {ADAPTER_CONFIG} and one of {', '.join(ADAPTER_WEIGHTS)}); pass the adapter a trainer's "
                "init_adapter/train_step returned"
            )
        with warnings.catch_warnings():
            # peft 0.21 probes a property transformers 5.2x deprecated; the warning is theirs and says nothing to users.
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            model = PeftModel.from_pretrained(copy.deepcopy(self.base), str(adapter_dir), is_trainable=False)
        if self.merge:
            model = model.merge_and_unload()
        model.eval()
        self.loads += 1
        self._models[key] = model
        self._models.move_to_end(key)
        while len(self._models) > self.capacity:
            self._models.popitem(last=False)
        return model


class TorchSampler:
    """`RolloutEngine` on torch: one seeded group per call from the requested LoRA adapter, with sampling log-probs.

    The adapter is fetched from `artifacts` by its digest and cached by digest, so a new policy version costs one load
    and retries of the same version cost none. An adapter is always required: the policy is base + LoRA, and version 0
    is the trainer's `init_adapter` output (LoRA B = 0, so it samples exactly like the base model).

    Adapters are merged for speed by default (`merge_adapters`; see `AdapterCache`): a plain LoRA adapter is merged into
    one shared working copy of the base (`rl.engines.lora_merge.MergedBase`: the same bits as PEFT's merge, without
    copying the base per adapter); any other adapter goes through PEFT. `generate_groups` samples several requests in
    one batch.
    """

    def __init__(
        self,
        base_model_dir: Path,
        artifacts: Artifacts,
        *,
        adapter_cache_size: int = 2,
        threads: int | None = None,
        dtype: torch.dtype = torch.float32,
        merge_adapters: bool = True,
    ) -> None:
        if threads is not None:
            if threads < 1:
                raise ValueError(f"threads must be >= 1, got {threads}")
            torch.set_num_threads(threads)
        self.artifacts = artifacts
        self.tokenizer = load_tokenizer(base_model_dir)
        self.adapters = AdapterCache(base_model_dir, capacity=adapter_cache_size, dtype=dtype, merge=merge_adapters)
        self.merged = MergedBase(self.adapters.base) if merge_adapters else None
        self._loras: OrderedDict[str, LoraWeights] = OrderedDict()
        self.lora_loads = 0  # plain LoRA adapters read from the store, for tests and the benchmark
        # Pure in their argument: a group repeats its prompt, short completions repeat across samples, and the
        # tokenizer's Python wrapper costs more per call than the tiny model's sampling step. Per instance, so a cache
        # keeps no sampler alive.
        self._encode = functools.lru_cache(maxsize=4096)(self._encode_uncached)
        self._decode = functools.lru_cache(maxsize=65536)(self._decode_uncached)
        self.max_position = int(self.adapters.base.config.max_position_embeddings)
        eos = self.tokenizer.eos_token_id
        if eos is None:
            raise ValueError(f"the tokenizer in {base_model_dir} has no eos token; rebuild it with build_tiny_model")
        self.eos_token_id = int(eos)

    @property
    def loads(self) -> int:
        """Adapters loaded from the store so far, either way."""
        return self.lora_loads + self.adapters.loads

    async def policy(self, adapter: ArtifactRef) -> nn.Module:
        """The base model with `adapter` applied (loaded on first use, then cached by digest; merged if configured).

        With merging on, the model returned is shared and holds `adapter` until the next call: use it before awaiting.
        """
        if self.merged is not None and self.adapters.get(adapter.digest) is None:
            lora = self._loras.get(adapter.digest)
            if lora is None:
                lora = self._parse(adapter.digest, await self.artifacts.get(adapter))
            if lora is not None:
                self._loras.move_to_end(adapter.digest)
                try:
                    return self.merged.activate(adapter.digest, lora)
                except UnsupportedLora:
                    self._loras.pop(adapter.digest)
        model = self.adapters.get(adapter.digest)
        if model is None:
            with tempfile.TemporaryDirectory(prefix="rl-adapter-") as tmp:
                await materialize(self.artifacts, adapter, Path(tmp))
                model = self.adapters.load_dir(adapter.digest, Path(tmp))
        return model

    def _parse(self, key: str, files: dict[str, bytes]) -> LoraWeights | None:
        """The plain LoRA adapter in `files`, cached; None when PEFT must load it (not plain LoRA, or not an adapter:
        PEFT's path then says what is missing)."""
        weights = files.get(ADAPTER_WEIGHTS[0])  # safetensors; a .bin adapter goes through PEFT
        if ADAPTER_CONFIG not in files or weights is None:
            return None
        try:
            lora = parse_lora(files[ADAPTER_CONFIG], weights)
        except Exception:  # not plain LoRA, or unreadable: PEFT's loader handles it or says what is wrong
            return None
        self.lora_loads += 1
        self._loras[key] = lora
        while len(self._loras) > self.adapters.capacity:
            self._loras.popitem(last=False)
        return lora

    def encode_prompt(self, question: str) -> list[int]:
        """Token ids of a prompt as the policy sees it (`<bos>` first)."""
        return list(self._encode(question))

    def decode(self, token_ids: Sequence[int]) -> str:
        """A completion's text: special tokens (`<eos>`) skipped, characters joined as sampled."""
        return self._decode(tuple(token_ids))

    def _encode_uncached(self, question: str) -> tuple[int, ...]:
        return tuple(int(t) for t in self.tokenizer(question)["input_ids"])

    def _decode_uncached(self, token_ids: tuple[int, ...]) -> str:
        text = self.tokenizer.decode(list(token_ids), skip_special_tokens=True)
        assert isinstance(text, str)  # decode of one sequence; the union type covers batch decoding
        return text

    async def generate(self, request: RolloutRequest) -> list[Rollout]:
        return (await self.generate_groups([request]))[0]

    async def generate_groups(self, requests: Sequence[RolloutRequest]) -> list[list[Rollout]]:
        """`generate` of each request, the requests sharing an adapter, prompt length and `max_tokens` sampled as one
        batch (`sample_groups`): one forward per decoding step for an iteration's groups instead of one per group.

        Each group's tokens come from its own seeded stream, so result `i` is what `generate(requests[i])` returns (the
        log-probs up to float rounding of the larger batch; see `sample_groups`); the same list gives the same bits.
        """
        encoded = [self.encode_prompt(r.prompt.question) for r in requests]
        for request, prompt_ids in zip(requests, encoded, strict=True):
            if len(prompt_ids) + request.max_tokens > self.max_position:
                raise InvalidRolloutRequest(
                    f"prompt ({len(prompt_ids)} tokens) + max_tokens ({request.max_tokens}) exceeds the model's "
                    f"{self.max_position} positions; shorten the prompt, lower max_tokens, or build a model with a "
                    "larger max_position"
                )
        buckets: dict[tuple[str, int, int], list[int]] = {}
        for i, (request, prompt_ids) in enumerate(zip(requests, encoded, strict=True)):
            buckets.setdefault((request.adapter.digest, len(prompt_ids), request.max_tokens), []).append(i)
        results: list[list[Rollout]] = [[] for _ in requests]
        for members in buckets.values():
            first = requests[members[0]]
            # Sampled before the next await, so a shared merged model still holds this adapter.
            model = await self.policy(first.adapter)
            groups = sample_groups(
                model,
                [encoded[i] for i in members],
                ns=[requests[i].n for i in members],
                max_tokens=first.max_tokens,
                seeds=[requests[i].seed for i in members],
                eos_token_id=self.eos_token_id,
            )
            for i, seqs in zip(members, groups, strict=True):
                request = requests[i]
                results[i] = [
                    Rollout(
                        group_id=request.group_id,
                        question=request.prompt.question,
                        answer=request.prompt.answer,
                        completion=self.decode(s.token_ids),
                        prompt_token_ids=list(encoded[i]),
                        token_ids=s.token_ids,
                        logprobs=s.logprobs,
                        policy_version=request.policy_version,
                        seed=request.seed,
                    )
                    for s in seqs
                ]
        return results
