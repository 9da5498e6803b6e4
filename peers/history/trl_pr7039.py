"""TRL PR #7039 (https://github.com/huggingface/trl/pull/7039), bound for the stop-token engine law.

The bug (trl <= 1.14.1): `GRPOTrainer` took only `tokenizer.eos_token_id` as an end, though a model declares every id
that ends its turn in `generation_config.eos_token_id` (Phi-3.5's `<|end|>`, gemma-3's `<end_of_turn>`): its own
`GenerationConfig` stopped only at that one id, and `_generate_single_turn` cut the completion after it alone, so a
completion ran on past a declared stop. trl 1.14.2 reads every declared id (`self.eos_token_ids`) for both (the
tracker shows the PR closed; the change it describes is in 1.14.2's `grpo_trainer.py`, line for line).

`ENGINE` samples with TRL's own `_generate_single_turn` (the transformers path: `model.generate`, then TRL's cut), on a
`GRPOTrainer` built on our tiny model whose `generation_config.eos_token_id` declares `<eos>` and the ten digits as
ends (a model with several end ids, as those above). It declares the same ids as its `stop_token_ids`. TRL's
transformers path records no log-probs, so the rollouts carry NaN: only the stop-token law applies.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import trl
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from rl.conformance import Implementation
from rl.models.opened_model import open_model
from rl.models.tiny import build_tiny_model, load_base_model, load_tokenizer
from rl.protocols import Artifacts
from rl.types import ArtifactRef, Rollout, RolloutRequest

__all__ = ["IMPL", "TrlGenerationEngine"]

VERSION = trl.__version__


@functools.cache
def _trainer() -> GRPOTrainer:
    """A `GRPOTrainer` on the tiny model, its generation config declaring `<eos>` and every digit as ends."""
    root = tempfile.mkdtemp(prefix="peers-trl-7039-")
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    model_dir = open_model(build_tiny_model(os.path.join(root, "model")))
    tokenizer = load_tokenizer(model_dir)
    model = load_base_model(model_dir)
    digits = [tokenizer.convert_tokens_to_ids(d) for d in "0123456789"]
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, *digits]
    args = GRPOConfig(
        output_dir=os.path.join(root, "out"), per_device_train_batch_size=8, report_to=[], use_cpu=True, beta=0.0
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[lambda completions, **_: [0.0] * len(completions)],
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["a"] * 8}),
        processing_class=tokenizer,
    )
    trainer.model.eval()
    return trainer


class TrlGenerationEngine:
    """A `RolloutEngine` whose completions are TRL's `_generate_single_turn` (the adapter a request names is ignored:
    TRL samples its trainer's model, the tiny base)."""

    def __init__(self, artifacts: Artifacts) -> None:
        self.trainer = _trainer()
        self.eos_token_id = int(self.trainer._tokenizer.eos_token_id)
        self.stop_token_ids = tuple(self.trainer.model.generation_config.eos_token_id)

    async def generate(self, request: RolloutRequest) -> list[Rollout]:
        trainer = self.trainer
        trainer.generation_config.max_new_tokens = request.max_tokens
        trainer.generation_kwargs["max_new_tokens"] = request.max_tokens
        prompt = [int(t) for t in trainer._tokenizer(request.prompt.question)["input_ids"]]
        torch.manual_seed(request.seed)
        completions, _ = trainer._generate_single_turn([prompt] * request.n, None, {}, request.n)
        return [
            Rollout(
                group_id=request.group_id,
                question=request.prompt.question,
                answer=request.prompt.answer,
                completion=trainer._tokenizer.decode(ids, skip_special_tokens=True),
                prompt_token_ids=prompt,
                token_ids=[int(t) for t in ids],
                logprobs=[float("nan")] * len(ids),  # TRL's transformers path records none
                policy_version=request.policy_version,
                seed=request.seed,
            )
            for ids in completions
        ]


def _no_adapter(artifacts: Artifacts) -> ArtifactRef:
    """The engine samples TRL's model whatever the request names: a placeholder reference."""
    return ArtifactRef(uri="trl://tiny-base", digest="sha256:" + "0" * 64)


IMPL = Implementation(name=f"trl-{VERSION}-generation", engine=TrlGenerationEngine, adapter=_no_adapter)
