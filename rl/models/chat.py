"""How a question becomes the policy's prompt: the model's own chat template where its tokenizer has one.

A real instruct model (SmolLM2, Qwen3) is prompted as it was tuned: the question as the user's turn of its chat
template (with the template's default system turn), the assistant's turn opened (`add_generation_prompt=True`). It
answers, then ends its turn with its end-of-turn token (`<|im_end|>`, the tokenizer's eos), where sampling stops. The
tiny character model has no template: its prompt is the question's characters after `<bos>`. Both engines (torch
sampler, vLLM) send these ids, so they sample from the same prompt and the trainer scores the ids they recorded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["encode_prompt"]


def encode_prompt(tokenizer: Any, question: str) -> list[int]:
    """The prompt's token ids for `question`: chat-templated where the tokenizer has a template, else as it is."""
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": question}]
        encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = encoded["input_ids"] if isinstance(encoded, Mapping) else encoded
    else:
        ids = tokenizer(question)["input_ids"]
    return [int(t) for t in ids]
