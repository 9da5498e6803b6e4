"""The errors of the models and what runs them: a model or adapter directory, a model's source and cache, the samplers,
the trainer's artifacts, the GPU and the memory plan.

Every class is re-exported by `rl.errors`: import it from there."""

from __future__ import annotations

from rl.errors import ArtifactError, InputError, RlError, TrainerError

# raised in rl.models.model_dir


class ModelDirError(InputError):
    """A model directory is missing, or lacks (or has damaged) the files a model is loaded from."""


class AdapterDirError(ArtifactError):
    """A LoRA adapter's files are not what this tool writes (a pickle, a regex, a damaged header): never loaded."""


# raised in rl.gpu


class CudaUnavailableError(RlError):
    """A task that was given a GPU cannot use it (a driver too old for torch's CUDA, a CPU-only torch, no visible
    device); the message is one line naming the reason. Nothing falls back to the CPU."""


# raised in rl.memory_plan


class PlanDoesNotFitError(InputError):
    """A profile's tasks need more memory than the GPU it declares; nothing was booked."""


class UnknownGpuError(InputError):
    """`RL_FLYTE_GPU` / `--gpu` names a GPU the plan does not know; the message names the ones it does."""


# raised in rl.models.chat


class PromptTooLongError(ValueError):
    """A chat template rendered more text than any prompt needs."""


# raised in rl.models.converted_cache


class ModelCacheError(InputError):
    """A converted model in the cache differs from the manifest written at its conversion; nothing was loaded."""


# raised in rl.models.model_checks


class ModelMismatchError(ModelDirError):
    """A model directory's files disagree with each other or with the run: refused before anything is allocated."""


# raised in rl.models.model_files


class ModelFileError(ModelDirError):
    """A file a model load would read is a link, special file, hard link or larger than its kind allows."""


# raised in rl.models.pretrained


class ModelSourceError(InputError):
    """A pinned model cannot be fetched, or what was fetched is not what the pin names (its sha256 differs)."""


# raised in rl.models.sandbox


class ModelSandboxError(ModelDirError):
    """A model directory's tokenizer or chat template broke a bound (time, memory, output size) or failed inside its
    library (a panic, an exception) while building or encoding; nothing of it was used."""


# raised in rl.samplers.adapter_cache


class NotAnAdapterError(AdapterDirError, ValueError):
    """The requested adapter artifact is not a PEFT LoRA adapter directory."""


# raised in rl.samplers.decoding


class InvalidRolloutRequestError(ValueError):
    """A request the engine cannot serve as asked (bad `n`, `max_tokens`, or a prompt too long for the model)."""


# raised in rl.samplers.lora_merge


class UnsupportedLora(ValueError):
    """An adapter `MergedBase` cannot apply exactly; the caller loads it through PEFT instead."""


# raised in rl.samplers.vllm


class VLLMUnavailableError(ImportError):
    """vLLM is not installed in this environment."""


class AdapterRefused(ValueError):
    """An adapter this engine's vLLM cannot load: refused before vLLM sees it, because vLLM loads adapters in its
    worker process and a failed load there kills the engine core (every request after it fails too)."""


class EngineOutputError(RuntimeError):
    """vLLM's output lacks or contradicts what the engine asked for (log-probs, one output per prompt, ...)."""


# raised in rl.trainer.adapter


class AdapterArtifactError(TrainerError):
    """An adapter artifact lacks the files PEFT needs."""


# raised in rl.trainer.optimizer_state


class OptimizerStateError(TrainerError):
    """An optimizer-state artifact is missing, unreadable or belongs to a different adapter layout."""
