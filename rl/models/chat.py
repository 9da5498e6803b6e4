"""How a question becomes the policy's prompt: the model's own chat template where its tokenizer has one.

A real instruct model (SmolLM2, Qwen3) is prompted as it was tuned: the question as the user's turn of its chat
template (with the template's default system turn), the assistant's turn opened (`add_generation_prompt=True`). It
answers, then ends its turn with its end-of-turn token (`<|im_end|>`, the tokenizer's eos), where sampling stops. The
tiny character model has no template: its prompt is the question's characters after `<bos>`. Both engines (torch
sampler, vLLM) send these ids, so they sample from the same prompt and the trainer scores the ids they recorded.

A tokenizer read from a model directory (`rl.models.load_tokenizer`) renders and encodes in its worker process
(`rl.models.sandbox`): a template or pre-tokenizer that would run forever, fill memory or panic ends in a one-line
`ModelSandboxError`. The ids are transformers' own (`apply_chat_template`), computed there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rl.errors import PromptTooLongError
from rl.models.sandbox import DEFAULT_LIMITS, in_process, sandbox_of

__all__ = ["decode_texts", "encode_prompt", "encode_prompts"]


def encode_prompt(tokenizer: Any, question: str) -> list[int]:
    """The prompt's token ids for `question`: chat-templated where the tokenizer has a template, else as it is."""
    return encode_prompts(tokenizer, [question])[0]


def encode_prompts(tokenizer: Any, questions: Sequence[str]) -> list[list[int]]:
    """`encode_prompt` of each question, all in one request to the tokenizer's worker where it has one."""
    sandbox = sandbox_of(tokenizer)
    if sandbox is None:  # a tokenizer built in this process, not read from a directory: only panics are caught
        limit = DEFAULT_LIMITS.text_chars
        return in_process("(in memory)", "encoding a prompt", lambda: encode_here(tokenizer, list(questions), limit))
    return sandbox.run(
        encode_here,
        list(questions),
        sandbox.limits.text_chars,
        what="encoding a prompt (its chat template, then its tokenizer)",
    )


def decode_texts(tokenizer: Any, token_ids: Sequence[Sequence[int]], *, skip_special_tokens: bool = True) -> list[str]:
    """Each sequence of `token_ids` as text (`tokenizer.decode`), in the tokenizer's worker where it has one."""
    lists = [[int(t) for t in ids] for ids in token_ids]
    sandbox = sandbox_of(tokenizer)
    if sandbox is None:
        return in_process("(in memory)", "decoding", lambda: _decode_all(tokenizer, lists, skip_special_tokens))
    return sandbox.run(_decode_all, lists, skip_special_tokens, what="decoding with its tokenizer")


def encode_here(tokenizer: Any, questions: list[str], text_chars: int) -> list[list[int]]:
    """`encode_prompt` of each question in this process, unguarded: what the worker runs."""
    return [_encode_one(tokenizer, question, text_chars) for question in questions]


def _encode_one(tokenizer: Any, question: str, text_chars: int) -> list[int]:
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": question}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        if len(text) > text_chars:  # memory is the worker's limit; this bounds what comes back
            raise PromptTooLongError(f"its chat template rendered {len(text)} characters, more than {text_chars}")
        encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = encoded["input_ids"] if isinstance(encoded, Mapping) else encoded
    else:
        ids = tokenizer(question)["input_ids"]
    return [int(t) for t in ids]


def _decode_all(tokenizer: Any, lists: list[list[int]], skip_special_tokens: bool) -> list[str]:
    texts = [tokenizer.decode(ids, skip_special_tokens=skip_special_tokens) for ids in lists]
    assert all(isinstance(text, str) for text in texts)  # one sequence each; the union type covers batches
    return texts
