"""The rollout engine on plain torch: adapters fetched by digest, groups sampled by `rl.samplers.decoding`.

The completion text is decoded with special tokens skipped. Everything runs on the calling thread and blocks the event
loop while it samples: torch's intra-op thread count is what makes results bitwise reproducible, and it is only
reliably the one set for the thread doing the work. Pass `threads=` to pin it; library code sets it nowhere else.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import functools
import tempfile
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from rl.errors import InvalidRolloutRequestError, ModelDirError, UnsupportedLora
from rl.models import load_tokenizer
from rl.models.chat import decode_texts, encode_prompt
from rl.models.opened_model import ModelDir
from rl.protocols import Artifacts
from rl.samplers.adapter_cache import ADAPTER_CONFIG, ADAPTER_WEIGHTS, AdapterCache
from rl.samplers.decoding import sample_groups
from rl.samplers.lora_merge import LoraWeights, MergedBase, parse_lora
from rl.storage.artifacts import materialize
from rl.types import ArtifactRef, Rollout, RolloutRequest, SamplingSettings

DECODED_TEXTS = 65536
"""Completion texts a sampler keeps by token ids (a group repeats short completions, and decoding is a call to the
tokenizer's worker)."""


class TorchSampler:
    """`RolloutEngine` on torch: one seeded group per call from the requested LoRA adapter, with sampling log-probs.

    The adapter is fetched from `artifacts` by its digest and cached by digest, so a new policy version costs one load
    and retries of the same version cost none. An adapter is always required: the policy is base + LoRA, and version 0
    is the trainer's `init_adapter` output (LoRA B = 0, so it samples exactly like the base model).

    Adapters are merged for speed by default (`merge_adapters`; see `AdapterCache`): a plain LoRA adapter is merged into
    one shared working copy of the base (`rl.samplers.lora_merge.MergedBase`: the same bits as PEFT's merge, without
    copying the base per adapter); any other adapter goes through PEFT. `generate_groups` samples several requests in
    one batch.
    """

    def __init__(
        self,
        base_model_dir: ModelDir,
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
        # Decoded texts by token ids, oldest first; a generate call decodes its misses in one call to the worker.
        self._texts: dict[tuple[int, ...], str] = {}
        self.max_position = int(self.adapters.base.config.max_position_embeddings)
        eos = self.tokenizer.eos_token_id
        if eos is None:
            raise ModelDirError(f"the tokenizer in {base_model_dir} has no eos token; rebuild it with build_tiny_model")
        self.eos_token_id = int(eos)
        # The BOS the prompt template begins with (the conformance suite counts it: once), None if it begins with none.
        bos = self.tokenizer.bos_token_id
        self.bos_token_id = int(bos) if bos is not None and self._encode("")[:1] == (bos,) else None

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

    def close(self) -> None:
        """Free the cached adapters; the sampler stays usable (the next request loads its adapter again)."""
        self._loras.clear()
        self.adapters.clear()

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
        """Token ids of a prompt as the policy sees it (`rl.models.chat.encode_prompt`: the chat template, if any)."""
        return list(self._encode(question))

    def decode(self, token_ids: Sequence[int]) -> str:
        """A completion's text: special tokens (`<eos>`) skipped, characters joined as sampled."""
        return self.decode_many([token_ids])[0]

    def decode_many(self, seqs: Sequence[Sequence[int]]) -> list[str]:
        """`decode` of each sequence; those not seen lately go to the tokenizer in one call (one round trip to its
        worker, not one each: a miss cost more than the tiny model's sampling step)."""
        keys = [tuple(ids) for ids in seqs]
        known = {k: text for k in keys if (text := self._texts.get(k)) is not None}
        missing = list(dict.fromkeys(k for k in keys if k not in known))
        if missing:
            for key, text in zip(missing, decode_texts(self.tokenizer, missing), strict=True):
                known[key] = self._texts[key] = text
            while len(self._texts) > DECODED_TEXTS:
                self._texts.pop(next(iter(self._texts)), None)
        return [known[k] for k in keys]

    def _encode_uncached(self, question: str) -> tuple[int, ...]:
        return tuple(encode_prompt(self.tokenizer, question))

    async def generate(self, request: RolloutRequest) -> list[Rollout]:
        return (await self.generate_groups([request]))[0]

    async def generate_groups(self, requests: Sequence[RolloutRequest]) -> list[list[Rollout]]:
        """`generate` of each request, the requests sharing an adapter, `max_tokens` and sampling settings sampled as
        one batch (`sample_groups`, prompts of other lengths left-padded): one forward per decoding step for an
        iteration's groups instead of one per group.

        Each group's tokens come from its own seeded stream, so result `i` is what `generate(requests[i])` returns (the
        log-probs up to float rounding of the larger batch; see `sample_groups`); the same list gives the same bits.
        """
        encoded = [self.encode_prompt(r.prompt.question) for r in requests]
        for request, prompt_ids in zip(requests, encoded, strict=True):
            if len(prompt_ids) + request.max_tokens > self.max_position:
                raise InvalidRolloutRequestError(
                    f"prompt ({len(prompt_ids)} tokens) + max_tokens ({request.max_tokens}) exceeds the model's "
                    f"{self.max_position} positions; shorten the prompt, lower max_tokens, or build a model with a "
                    "larger max_position"
                )
        buckets: dict[tuple[str, int, SamplingSettings], list[int]] = {}
        for i, request in enumerate(requests):
            buckets.setdefault((request.adapter.digest, request.max_tokens, request.sampling), []).append(i)
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
                sampling=first.sampling,
            )
            texts = iter(self.decode_many([s.token_ids for seqs in groups for s in seqs]))
            for i, seqs in zip(members, groups, strict=True):
                request = requests[i]
                results[i] = [
                    Rollout(
                        group_id=request.group_id,
                        question=request.prompt.question,
                        answer=request.prompt.answer,
                        completion=next(texts),
                        prompt_token_ids=list(encoded[i]),
                        token_ids=s.token_ids,
                        logprobs=s.logprobs,
                        policy_version=request.policy_version,
                        seed=request.seed,
                    )
                    for s in seqs
                ]
        return results
