"""A tiny Qwen2-shaped causal LM and a character tokenizer, built offline and bit-for-bit from a seed.

Nothing here touches a model hub: the tokenizer is a `tokenizers` WordLevel model over single characters, loaded with
`PreTrainedTokenizerFast` (never `AutoTokenizer`, which would silently substitute Qwen2's hub tokenizer for the config's
model type), and the weights come from `AutoModelForCausalLM.from_config` under a fixed seed.

Encoding prepends `<bos>` (so the first prompt character has a context to be predicted from, and vLLM's default
`add_special_tokens=True` sees the same ids); decoding fuses characters back without separators.
"""

from __future__ import annotations

import json
import os
import pickle

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import string
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
from safetensors import SafetensorError
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerFast, Qwen2Config

from rl.errors import InputError, ModelDirError, shown
from rl.models.chat import encode_here, encode_prompts
from rl.models.model_dir import MODEL_DIR_FIX
from rl.models.opened_model import ModelDir, checked_model
from rl.models.sandbox import SandboxLimits, TokenizerSandbox, in_process

# What loading a damaged or foreign weights file raises: safetensors' own error, a pickle's, a short read, a shape or
# dtype transformers cannot place. Each is the directory's fault, never a bug.
LOADER_ERRORS: tuple[type[BaseException], ...] = (
    SafetensorError,
    pickle.UnpicklingError,
    EOFError,
    OSError,
    ValueError,
    KeyError,
    RuntimeError,
)

PAD, EOS, BOS, UNK = "<pad>", "<eos>", "<bos>", "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, EOS, BOS, UNK)
# Digits, the answer marker and separators the reward tier parses, lowercase words, a little punctuation for prompts.
CHARACTERS: str = string.digits + "=#, -\n" + string.ascii_lowercase + "+.?:"

__all__ = [
    "CHARACTERS",
    "TinyModelConfig",
    "build_tiny_model",
    "build_tokenizer",
    "expected_config",
    "load_base_model",
    "load_tokenizer",
]

ATTENTION_KERNELS: tuple[str, ...] = ("eager", "sdpa")


@dataclass(frozen=True)
class TinyModelConfig:
    """The architecture and seed of a tiny base model.

    `initializer_range` is large on purpose (Qwen2's default is 0.02): with 0.1-0.2 the initial output distribution is
    peaked enough that a LoRA adapter moves it measurably within tens of RL iterations.
    """

    # Validated from JSON (a Flyte `--config`) through pydantic: a key that is not a field is refused, not dropped.
    __pydantic_config__: ClassVar[dict[str, str]] = {"extra": "forbid"}

    seed: int = 0
    hidden_size: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 128
    initializer_range: float = 0.2
    max_position: int = 128

    def __post_init__(self) -> None:
        for name in ("hidden_size", "layers", "heads", "kv_heads", "intermediate", "max_position"):
            if getattr(self, name) <= 0:
                raise InputError(f"TinyModelConfig.{name} must be positive, got {getattr(self, name)}")
        if self.hidden_size % self.heads:
            raise InputError(
                f"TinyModelConfig.hidden_size ({self.hidden_size}) must be divisible by heads ({self.heads})"
            )
        if self.heads % self.kv_heads:
            raise InputError(f"TinyModelConfig.heads ({self.heads}) must be divisible by kv_heads ({self.kv_heads})")
        if (self.hidden_size // self.heads) % 2:
            raise InputError(
                f"head dim hidden_size/heads = {self.hidden_size // self.heads} must be even for rotary embeddings"
            )
        if not self.initializer_range > 0:
            raise InputError(f"TinyModelConfig.initializer_range must be > 0, got {self.initializer_range}")


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The character tokenizer: special tokens first (pad=0, eos=1, bos=2, unk=3), then `CHARACTERS` in order."""
    vocab = {tok: i for i, tok in enumerate((*SPECIAL_TOKENS, *CHARACTERS))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # `[\s\S]` rather than `.` so that newline is a token too.
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        eos_token=EOS,
        bos_token=BOS,
        unk_token=UNK,
        clean_up_tokenization_spaces=False,
    )


def qwen2_config(config: TinyModelConfig, tokenizer: PreTrainedTokenizerFast) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        num_hidden_layers=config.layers,
        num_attention_heads=config.heads,
        num_key_value_heads=config.kv_heads,
        intermediate_size=config.intermediate,
        max_position_embeddings=config.max_position,
        initializer_range=config.initializer_range,
        tie_word_embeddings=False,
        use_sliding_window=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )


def expected_config(config: TinyModelConfig) -> dict[str, object]:
    """The keys of the config.json `build_tiny_model(_, config)` writes that size the model: a `base-*` directory
    whose config.json differs in one is not the model this tool built there (`check_model_config`'s `expect`)."""
    return {
        "model_type": "qwen2",
        "vocab_size": len(SPECIAL_TOKENS) + len(CHARACTERS),
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.layers,
        "num_attention_heads": config.heads,
        "num_key_value_heads": config.kv_heads,
        "intermediate_size": config.intermediate,
        "max_position_embeddings": config.max_position,
    }


def build_tiny_model(out_dir: Path, config: TinyModelConfig = TinyModelConfig()) -> Path:
    """Write a base model directory (config, safetensors weights, tokenizer files) determined entirely by `config`.

    Building twice with one config gives byte-identical files. The global torch RNG is forked, not consumed, so callers'
    seeded streams are unaffected. Returns `out_dir`.
    """
    out_dir = Path(out_dir)
    tokenizer = build_tokenizer()
    hf_config = qwen2_config(config, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    declare_tokenizer_class(out_dir / "tokenizer_config.json")
    return out_dir


def declare_tokenizer_class(path: Path) -> None:
    """Name the tokenizer class by its transformers 4.x name, which 5.x keeps as an alias.

    transformers 5 writes `TokenizersBackend`, a class 4.x lacks, so 4.x's `AutoTokenizer` (what vLLM builds on) would
    refuse the directory; 4.x honours `PreTrainedTokenizerFast`. transformers 5's `AutoTokenizer` ignores the field for
    model_type qwen2 and builds a `Qwen2Tokenizer`, which drops spaces and newlines: load with `load_tokenizer`, and
    give vLLM token ids (`rl.samplers.vllm.VLLMEngine(tokenizer=...)`).
    """
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(config, indent=2, sort_keys=True, allow_nan=False) + "\n")


PROBE_QUESTION = "What is 12 + 34? Answer with a number.\n"


def load_tokenizer(model_dir: ModelDir, *, limits: SandboxLimits | None = None) -> PreTrainedTokenizerFast:
    """The tokenizer of the opened `model_dir` (`rl.models.opened_model.open_model`), loaded offline from the files
    its door checked (not via AutoTokenizer: see module docstring).

    Built first in a worker process within `limits` (`rl.models.sandbox`: time, memory, a panic as an error), which
    then renders, encodes and decodes for it (`rl.models.chat`); this process builds its own copy only after."""
    model_dir = checked_model(model_dir, tokenizer=True)
    sandbox = TokenizerSandbox(lambda: _read_tokenizer(model_dir), str(model_dir.where), limits)
    tokenizer = in_process(str(model_dir.where), "building its tokenizer", lambda: _read_tokenizer(model_dir))
    if tokenizer.eos_token_id is None:  # a tokenizer_config.json emptied or foreign: sampling could never stop
        sandbox.close()
        raise ModelDirError(
            f"model directory {shown(model_dir.where)}: its tokenizer has no end-of-sequence token; {MODEL_DIR_FIX}"
        )
    sandbox.attach(tokenizer)
    encode_prompts(tokenizer, [PROBE_QUESTION])  # its template and pre-tokenizer tried once, bounded, before any use
    return tokenizer


def check_tokenizer(model_dir: ModelDir, *, limits: SandboxLimits | None = None) -> None:
    """Build the opened `model_dir`'s tokenizer and encode a prompt with it in a worker within `limits`, then end the
    worker: what `load_tokenizer` would refuse (`ModelSandboxError`, `ModelDirError`) is refused before anything is
    written."""
    model_dir = checked_model(model_dir, tokenizer=True)
    sandbox = TokenizerSandbox(lambda: _read_tokenizer(model_dir), str(model_dir.where), limits)
    try:
        sandbox.run(
            _probe,
            str(model_dir.where),
            sandbox.limits.text_chars,
            what="encoding a prompt (its chat template, then its tokenizer)",
        )
    finally:
        sandbox.close()


def _probe(tokenizer: PreTrainedTokenizerFast, where: str, text_chars: int) -> None:
    if tokenizer.eos_token_id is None:
        raise ModelDirError(
            f"model directory {shown(where)}: its tokenizer has no end-of-sequence token; {MODEL_DIR_FIX}"
        )
    encode_here(tokenizer, [PROBE_QUESTION], text_chars)  # in the worker: its failure is the worker's to report


def _read_tokenizer(model_dir: ModelDir) -> PreTrainedTokenizerFast:
    try:
        with model_dir.staged(weights=False) as staged:  # only the bytes the door checked
            tokenizer = PreTrainedTokenizerFast.from_pretrained(str(staged), trust_remote_code=False)
        tokenizer.name_or_path = tokenizer.init_kwargs["name_or_path"] = str(model_dir.where)  # not the staging
        return tokenizer
    except (MemoryError, InputError):  # the worker's memory bound; the checked opener's and checks' own refusals
        raise
    except Exception as exc:  # json raises ValueError, the tokenizers library a bare Exception, on a damaged file
        # A damaged tokenizer file is the directory's fault: one line, as for a missing one (found by the fuzzer).
        raise ModelDirError(
            f"model directory {shown(model_dir.where)}: its tokenizer cannot be read ({shown(exc, 300)}); "
            f"{MODEL_DIR_FIX}"
        ) from None


def load_base_model(
    model_dir: ModelDir,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    *,
    attention: str = "eager",
) -> PreTrainedModel:
    """The base model of the opened `model_dir` (`rl.models.opened_model.open_model`: one safetensors file or shards
    plus their index, loaded from the files its door checked), in eval mode (no dropout),
    in `dtype` on `device`, with the `attention` kernel: "eager" (the default: the same kernel on every machine, what
    the CPU demo's numbers come from) or "sdpa" (torch's fused attention, which never materialises the [T, T]
    probabilities of every head: what a real-size model trains with).

    The weights are read straight into `dtype` on `device` (transformers' `device_map`), never first as a CPU copy:
    for an 8 B model that copy is ~33 GB of host memory per rank in float32, four ranks to a pod.
    """
    if attention not in ATTENTION_KERNELS:
        raise InputError(f"attention must be one of {ATTENTION_KERNELS}, got {attention!r}")
    model_dir = checked_model(model_dir, weights=True)
    placement = {} if torch.device(device).type == "cpu" else {"device_map": str(torch.device(device))}
    try:
        # The door refused a config naming code (auto_map) or an unknown model_type; trust_remote_code=False makes
        # transformers refuse, never prompt, should one get past it.
        with model_dir.staged(dtype_bytes=dtype.itemsize) as staged:  # checked, consistent files only
            model = AutoModelForCausalLM.from_pretrained(
                str(staged), dtype=dtype, attn_implementation=attention, trust_remote_code=False, **placement
            )
        model.config.name_or_path = model.name_or_path = str(model_dir.where)  # what PEFT records: not the staging
    except InputError:  # the checked opener's and consistency checks' own one-line refusals
        raise
    except LOADER_ERRORS as exc:
        # A weights file that is present but damaged (truncated, emptied, a header claiming 2**40 bytes) is the
        # directory's fault, not a bug: one line naming it, as for a missing file (the fuzzer found these as exit 70).
        raise ModelDirError(
            f"model directory {shown(model_dir.where)}: its weights cannot be read ({shown(exc, 300)}); {MODEL_DIR_FIX}"
        ) from exc
    model.eval()
    return model
