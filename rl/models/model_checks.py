"""Consistency of a model directory's files with each other, checked before anything is allocated.

`check_model_files` runs on what `rl.models.model_files` read through its checked opener (config, generation config,
tokenizer files, safetensors headers), so a config describing a terabyte beside a 116-byte weights file, heads that do
not divide, a token id past the embedding, a weight the architecture needs that no file holds, or a generation config
of the wrong types each end in one line (`ModelMismatchError`, exit 2) naming the field and what to do, never in
transformers' own error, a random initialisation or a first forward that fails. `check_context` compares the model's
positions with the prompts and completions a run asks for.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rl.errors import ModelMismatchError, PlanDoesNotFitError
from rl.memory_plan import ModelArch
from rl.models.model_dir import CONFIG_FILE, MODEL_DIR_FIX
from rl.untrusted import shown

if TYPE_CHECKING:
    from rl.models.model_files import CheckedModelDir
    from rl.models.opened_model import ModelDir

__all__ = ["check_context", "check_model_files", "host_memory_bytes"]

GENERATION_FILE = "generation_config.json"
FLOAT_DTYPES = frozenset({"F64", "F32", "F16", "BF16"})
_INT: tuple[str, ...] = (
    "max_length",
    "max_new_tokens",
    "min_length",
    "min_new_tokens",
    "top_k",
    "num_beams",
    "num_beam_groups",
)
_INT += ("num_return_sequences", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size")
_FLOAT: tuple[str, ...] = (
    "temperature",
    "top_p",
    "min_p",
    "typical_p",
    "epsilon_cutoff",
    "eta_cutoff",
    "repetition_penalty",
)
_FLOAT += ("length_penalty", "diversity_penalty", "encoder_repetition_penalty")
_BOOL: tuple[str, ...] = (
    "do_sample",
    "use_cache",
    "remove_invalid_values",
    "renormalize_logits",
    "output_scores",
    "output_logits",
)
_BOOL += ("return_dict_in_generate", "output_attentions", "output_hidden_states")
_STR = ("transformers_version", "cache_implementation")
TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")


def _refuse(where: Path, what: str, fix: str = MODEL_DIR_FIX) -> ModelMismatchError:
    return ModelMismatchError(f"model directory {shown(where)}: {what}; {fix}")


def host_memory_bytes() -> int:
    """This machine's physical memory (the budget a CPU load's weights must fit), or a very large number if unknown."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover (not POSIX)
        return 1 << 62


def check_model_files(checked: CheckedModelDir, *, dtype_bytes: int = 4, budget: int | None = None) -> None:
    """Refuse (`ModelMismatchError`, or `PlanDoesNotFitError` for memory) a checked model directory whose files
    disagree: heads, generation config types, token ids against `vocab_size` and, where weights were read, the
    parameters the config implies against the weights present, the memory `budget` (this machine's by default) at
    `dtype_bytes` a parameter, and every tensor the architecture needs against the headers' names and shapes."""
    config = checked.json(CONFIG_FILE)
    _check_generation_config(checked)
    if not isinstance(config, dict):
        return  # a tokenizer-only load of a directory without config.json: nothing to compare against
    _check_heads(checked.where, config)
    _check_token_ids(checked, config)
    if checked.weights:
        _check_weights(checked, config, dtype_bytes, host_memory_bytes() if budget is None else budget)


def _check_heads(where: Path, config: Mapping[str, Any]) -> None:
    heads, hidden = config["num_attention_heads"], config["hidden_size"]  # integers: check_model_config
    kv = config.get("num_key_value_heads") or heads
    if heads % kv:
        raise _refuse(
            where,
            f"{CONFIG_FILE}'s num_attention_heads ({heads}) is not a multiple of its "
            f"num_key_value_heads ({kv}): each key-value head serves a whole group of query heads",
        )
    head_dim = config.get("head_dim")
    if head_dim is None and hidden % heads:
        raise _refuse(
            where,
            f"{CONFIG_FILE}'s hidden_size ({hidden}) is not a multiple of num_attention_heads "
            f"({heads}) and it declares no head_dim",
        )
    head_dim = head_dim or hidden // heads
    if head_dim % 2:
        raise _refuse(where, f"{CONFIG_FILE}'s head_dim ({head_dim}) is odd: rotary position embeddings rotate pairs")


def _check_generation_config(checked: CheckedModelDir) -> None:
    config = checked.json(GENERATION_FILE)
    if config is None:
        return
    if not isinstance(config, dict):
        raise _refuse(checked.where, f"{GENERATION_FILE} is not a JSON object")
    kinds = {**dict.fromkeys(_INT, "an integer"), **dict.fromkeys(_FLOAT, "a number")}
    kinds |= {**dict.fromkeys(_BOOL, "true or false"), **dict.fromkeys(_STR, "a string")}
    for key, value in config.items():
        want = kinds.get(key)
        if want is None or value is None:
            continue
        ok = {
            "an integer": type(value) is int and value >= 0,
            "a number": type(value) in (int, float) and value >= 0,
            "true or false": type(value) is bool,
            "a string": isinstance(value, str) and len(value) <= 100,
        }[want]
        if not ok:
            raise _refuse(
                checked.where,
                f"{GENERATION_FILE}'s {key} is {shown(repr(value), 40)}, not {want}",
                f"fix or delete {GENERATION_FILE}",
            )


def _ids(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _check_token_ids(checked: CheckedModelDir, config: Mapping[str, Any]) -> None:
    """Every id the tokenizer or a config names indexes a row of the embedding (`vocab_size` rows)."""
    vocab = config["vocab_size"]
    named: list[tuple[str, Any]] = []
    for name, doc in ((CONFIG_FILE, config), (GENERATION_FILE, checked.json(GENERATION_FILE))):
        for key in TOKEN_ID_KEYS:
            if isinstance(doc, dict) and doc.get(key) is not None:
                named += [(f"{name}'s {key}", t) for t in _ids(doc[key])]
    tokenizer = checked.json("tokenizer.json")
    model = tokenizer.get("model") if isinstance(tokenizer, dict) else None
    table = model.get("vocab") if isinstance(model, dict) else None
    if isinstance(table, dict) and table:
        top = max(table.items(), key=lambda kv: kv[1] if type(kv[1]) is int else 1 << 62)
        named.append((f"tokenizer.json's token {shown(repr(top[0]), 40)}", top[1]))
    elif isinstance(table, list) and len(table) > vocab:
        named.append(("tokenizer.json's vocabulary", len(table) - 1))
    added = tokenizer.get("added_tokens") if isinstance(tokenizer, dict) else None
    for token in added if isinstance(added, list) else []:
        if isinstance(token, dict):
            named.append((f"tokenizer.json's added token {shown(repr(token.get('content')), 40)}", token.get("id")))
    decoder = (checked.json("tokenizer_config.json") or {}).get("added_tokens_decoder")
    for key in decoder if isinstance(decoder, dict) else []:
        named.append(("tokenizer_config.json's added_tokens_decoder", int(key) if key.isdigit() else key))
    for what, token_id in named:
        if type(token_id) is not int or not 0 <= token_id < vocab:
            raise _refuse(
                checked.where,
                f"{what} has id {shown(repr(token_id), 40)}, outside {CONFIG_FILE}'s "
                f"vocab_size {vocab} (the embedding has no row for it)",
                "the tokenizer and the weights must come from one model: " + MODEL_DIR_FIX,
            )


def _check_weights(checked: CheckedModelDir, config: Mapping[str, Any], dtype_bytes: int, budget: int) -> None:
    where = checked.where
    present: dict[str, tuple[str, tuple[int, ...]]] = {}
    for weights in checked.weights.values():
        present |= weights.tensors
    held = sum(_numel(shape) for _, shape in present.values())
    implied = ModelArch.from_hf_config(config).parameters()
    fields = "hidden_size, intermediate_size, num_hidden_layers and vocab_size"
    # Far more than the files hold: refused by the count alone; near it, the names and shapes below say which.
    if implied > 16 * held + (1 << 20):
        raise _refuse(
            where,
            f"{CONFIG_FILE} describes {implied:,} parameters ({fields}) but its weights files hold "
            f"{held:,}: the config is not these weights' config",
        )
    if implied * dtype_bytes > budget:
        raise PlanDoesNotFitError(
            f"model directory {shown(where)}: its {implied:,} parameters need {implied * dtype_bytes / (1 << 30):.1f} "
            f"GiB at {dtype_bytes} bytes each, more than the {budget / (1 << 30):.1f} GiB this machine has; load it "
            "in a smaller dtype, on a larger machine, or use a smaller model"
        )
    expected = _expected_tensors(where, config)
    missing = sorted(set(expected) - set(present))
    if missing:
        raise _refuse(
            where,
            f"its weights lack {len(missing)} of the {len(expected)} tensors a "
            f"{config['model_type']} of this config needs ({', '.join(missing[:3])}"
            f"{', ...' if len(missing) > 3 else ''}); they would start as random values, so nothing loads",
        )
    for name, shape in expected.items():
        dtype, got = present[name]
        if got != shape:
            raise _refuse(
                where,
                f"tensor {name} has shape {list(got)} in the weights, but {CONFIG_FILE} ({fields}, "
                f"num_attention_heads, num_key_value_heads, head_dim) implies {list(shape)}",
            )
        if dtype not in FLOAT_DTYPES:
            raise _refuse(where, f"tensor {name} is {dtype} in the weights, not a float (F32, F16, BF16, F64)")
    if implied > held:
        raise _refuse(
            where,
            f"{CONFIG_FILE} describes {implied:,} parameters ({fields}) but its weights files hold {held:,}: "
            "the config is not these weights' config",
        )


def _numel(shape: Iterable[int]) -> int:
    n = 1
    for dim in shape:
        n *= dim
    return n


def _expected_tensors(where: Path, config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every parameter of the architecture `config` describes, from a model built on torch's meta
    device (no memory). Only reached once the weights present hold at least the config's parameter count."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        hf_config = CONFIG_MAPPING[config["model_type"]].from_dict(dict(config))
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(hf_config)
    except Exception as exc:  # transformers' own validation of a config (each library error its own class)
        raise _refuse(
            where, f"transformers refuses its {CONFIG_FILE} ({shown(str(exc).splitlines()[0], 200)})"
        ) from None
    expected = {name: tuple(p.shape) for name, p in model.named_parameters()}  # a tied matrix once, by its first name
    persistent = model.state_dict().keys()
    expected |= {name: tuple(b.shape) for name, b in model.named_buffers() if name in persistent}
    return expected


def check_context(where: Path, config: Mapping[str, Any], prompt_tokens: int, completion_tokens: int) -> None:
    """Refuse a run whose longest prompt plus its completions exceed the model's `max_position_embeddings`."""
    positions = config.get("max_position_embeddings")
    if type(positions) is int and prompt_tokens + completion_tokens > positions:
        raise _refuse(
            where,
            f"{CONFIG_FILE}'s max_position_embeddings ({positions}) is shorter than the run's longest prompt "
            f"({prompt_tokens} tokens) plus its completions ({completion_tokens} tokens)",
            "lower the completion length, use shorter prompts, or a model with a longer context",
        )


def check_run_fits_model(model_dir: ModelDir, questions: Iterable[str], completion_tokens: int) -> None:
    """`check_context` of the opened model `model_dir` for prompts `questions` (as the policy sees them: through the
    model's chat template) and `completion_tokens` each."""
    from rl.models.chat import encode_prompt
    from rl.models.opened_model import checked_model
    from rl.models.tiny import load_tokenizer

    model_dir = checked_model(model_dir, tokenizer=True)
    config = model_dir.json(CONFIG_FILE) or {}
    tokenizer = load_tokenizer(model_dir)
    longest = max((len(encode_prompt(tokenizer, q)) for q in questions), default=0)
    check_context(model_dir.where, config, longest, completion_tokens)
