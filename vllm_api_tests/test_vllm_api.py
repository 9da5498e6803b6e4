"""Our vLLM calls and the vLLM stub, checked against the real vllm==0.33.0 package on a CPU (`nox -s vllm-api`).

vLLM's wheel installs without its CUDA dependencies (`pip install --no-deps`); its configuration and request classes
(`EngineArgs`, `LoRAConfig`, `ModelConfig`, `SamplingParams`, `LoRARequest`, `PEFTHelper`, the parallel-sampling
parent request) then import and validate on the CPU. These tests prove that what `rl.samplers.vllm.VLLMEngine` builds is
what real vLLM accepts, and that `fakes.vllm_stub` refuses each thing real vLLM refuses, so the CPU tests that run on
the stub are never kinder than vLLM. Nothing here can load a model into vLLM or sample: that is `nox -s gpu`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import sys
import types
import typing
from pathlib import Path
from typing import Any

import pytest

vllm = pytest.importorskip("vllm")  # the session installs it; outside it, this module is not collected

from vllm.config.lora import LoRAConfig, MaxLoRARanks  # noqa: E402  (after importorskip)
from vllm.config.model import LogprobsMode, ModelConfig  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.lora.peft_helper import PEFTHelper  # noqa: E402
from vllm.lora.request import LoRARequest  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.engine.parallel_sampling import ParentRequest  # noqa: E402

import fakes.vllm_stub as stub  # noqa: E402
from rl import gpu  # noqa: E402
from rl.deploy.flyte.config import EngineSpec, gpu_smoke, stress  # noqa: E402
from rl.models import TinyModelConfig, build_tiny_model, load_tokenizer  # noqa: E402
from rl.models.opened_model import open_model  # noqa: E402
from rl.samplers.vllm import VLLMEngine  # noqa: E402
from rl.samplers.vllm_requests import engine_llm_kwargs, model_max_len, sampling_params_kwargs  # noqa: E402
from rl.storage.artifacts import LocalArtifacts  # noqa: E402
from rl.trainer.config import TrainerConfig  # noqa: E402
from rl.trainer.peft_trainer import PeftTrainer  # noqa: E402
from rl.types import ArtifactRef, Prompt, RolloutRequest, SamplingSettings  # noqa: E402

ENGINE_FIELDS = {f.name for f in dataclasses.fields(EngineArgs)}
REAL_CONFIG_ERRORS = (ValueError, TypeError)  # pydantic's ValidationError is a ValueError


def test_this_is_the_vllm_the_gpu_extra_pins() -> None:
    assert vllm.__version__ == "0.33.0"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("m") / "model", TinyModelConfig(seed=1, hidden_size=32))


@pytest.fixture(scope="module")
def adapter(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[LocalArtifacts, ArtifactRef]:
    store = LocalArtifacts(tmp_path_factory.mktemp("store"))
    init = asyncio.run(PeftTrainer(open_model(model_dir), store, TrainerConfig()).init_adapter(seed=0))
    return store, init.adapter


def _our_llm_kwargs(model_dir: Path) -> list[dict[str, Any]]:
    """Every `LLM(...)` keyword set our code builds: each profile's EngineSpec, the GPU tests' and the CPU build's."""
    positions = model_max_len(open_model(model_dir))
    specs = [EngineSpec(kind="vllm"), gpu_smoke().engine, stress(base_uri="s3://x").engine]
    sets = [engine_llm_kwargs(model_dir, s.vllm_kwargs(max(positions, s.max_model_len or 0))) for s in specs]
    return [
        *sets,
        engine_llm_kwargs(model_dir, gpu.vllm_llm_kwargs()),
        engine_llm_kwargs(model_dir, gpu.vllm_cpu_llm_kwargs()),
    ]


def test_every_keyword_our_engine_passes_to_llm_is_an_engine_args_field_with_a_valid_value(model_dir: Path) -> None:
    """`LLM(**kwargs)` hands its keywords to `EngineArgs`; each must be a field, and the values must pass the
    configs that validate them (`LoRAConfig`, and the `ModelConfig` of the tiny model)."""
    for kwargs in _our_llm_kwargs(model_dir):
        assert set(kwargs) <= ENGINE_FIELDS, sorted(set(kwargs) - ENGINE_FIELDS)
        EngineArgs(**kwargs)  # a TypeError for an unknown keyword
        LoRAConfig(max_lora_rank=kwargs["max_lora_rank"], max_loras=kwargs["max_loras"])
        assert kwargs["logprobs_mode"] in typing.get_args(LogprobsMode)
    for kwargs in _our_llm_kwargs(model_dir)[:1]:  # the one sized to this model's length
        ModelConfig(
            model=str(model_dir),
            max_model_len=kwargs["max_model_len"],
            logprobs_mode=kwargs["logprobs_mode"],
        )


def test_the_stubs_keywords_and_value_sets_are_vllms(model_dir: Path) -> None:
    assert set(stub.ENGINE_ARGS) <= ENGINE_FIELDS
    assert typing.get_args(MaxLoRARanks) == stub.MAX_LORA_RANKS
    assert typing.get_args(LogprobsMode) == stub.LOGPROBS_MODES
    real = ModelConfig(model=str(model_dir))
    llm = stub.LLM(model=str(model_dir))
    assert (llm.max_model_len, llm.vocab_size) == (real.max_model_len, real.get_vocab_size())


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_lora_rank": 4},
        {"max_loras": 0},
        {"max_loras": 2, "max_cpu_loras": 1},
    ],
)
def test_the_stub_refuses_the_lora_settings_vllm_refuses(model_dir: Path, kwargs: dict[str, int]) -> None:
    with pytest.raises(REAL_CONFIG_ERRORS):
        LoRAConfig(**kwargs)
    with pytest.raises(REAL_CONFIG_ERRORS):
        stub.LLM(model=str(model_dir), enable_lora=True, **kwargs)


def test_the_stub_refuses_unknown_keywords_and_a_length_beyond_the_model_as_vllm_does(model_dir: Path) -> None:
    with pytest.raises(TypeError):
        EngineArgs(model=str(model_dir), swap_space_gb=4)
    with pytest.raises(TypeError):
        stub.LLM(model=str(model_dir), swap_space_gb=4)
    too_long = model_max_len(open_model(model_dir)) + 1
    with pytest.raises(ValueError, match="greater than the derived max_model_len"):
        ModelConfig(model=str(model_dir), max_model_len=too_long)
    with pytest.raises(ValueError, match="greater than the derived max_model_len"):
        stub.LLM(model=str(model_dir), max_model_len=too_long)
    with pytest.raises(REAL_CONFIG_ERRORS):
        ModelConfig(model=str(model_dir), logprobs_mode="processed")
    with pytest.raises(ValueError):
        stub.LLM(model=str(model_dir), logprobs_mode="processed")


def test_the_stub_refuses_the_adapters_vllm_refuses(
    model_dir: Path, adapter: tuple[LocalArtifacts, ArtifactRef], tmp_path: Path
) -> None:
    """vLLM's PEFTHelper reads adapter_config.json unconditionally and checks the rank against max_lora_rank."""
    store, ref = adapter
    good = tmp_path / "good"
    asyncio.run(_materialize(store, ref, good))
    no_config = tmp_path / "no-config"
    no_config.mkdir()
    (no_config / "adapter_model.safetensors").write_bytes((good / "adapter_model.safetensors").read_bytes())
    with pytest.raises(FileNotFoundError):
        PEFTHelper.from_local_dir(str(no_config), max_position_embeddings=None)
    helper = PEFTHelper.from_local_dir(str(good), max_position_embeddings=None)
    helper.validate_legal(LoRAConfig(max_lora_rank=8))
    with pytest.raises(ValueError, match="greater than max_lora_rank"):
        helper.validate_legal(LoRAConfig(max_lora_rank=1))
    # The stub refuses both where vLLM's worker does: loading kills its engine core (nox -s vllm-cpu measured it).
    sp = stub.SamplingParams(seed=1, max_tokens=2)
    for lora, cause in ((stub.LoRARequest("a", 1, str(no_config)), FileNotFoundError),
                        (stub.LoRARequest("b", 2, str(good)), ValueError)):  # fmt: skip
        llm = stub.LLM(model=str(model_dir), enable_lora=True, max_lora_rank=1)
        with pytest.raises(stub.EngineDeadError) as dead:
            llm.generate(["1="], sp, lora_request=lora)
        assert isinstance(dead.value.__cause__, cause)
    assert "greater than max_lora_rank" in str(dead.value.__cause__)


async def _materialize(store: LocalArtifacts, ref: ArtifactRef, out: Path) -> None:
    from rl.storage.artifacts import materialize

    await materialize(store, ref, out)


def test_lora_requests_check_and_compare_alike() -> None:
    for cls in (LoRARequest, stub.LoRARequest):
        with pytest.raises(ValueError, match="id must be > 0"):
            cls("a", 0, "/x")
        with pytest.raises(AssertionError):
            cls("a", 1)
        assert cls("a", 1, "/x") == cls("a", 2, "/y") and cls("a", 1, "/x") != cls("b", 1, "/x")
        assert cls("a", 1, "/x").load_inplace is False


def test_vllm_seeds_completion_i_with_seed_plus_i_as_the_stub_does() -> None:
    """The parallel-sampling parent gives child i of a seeded n-completion request the seed `seed + i`."""
    request = RolloutRequest(
        group_id=0, prompt=Prompt("1=", "2"), n=4, adapter=ArtifactRef("", "sha256:0"), policy_version=0, seed=9
    )
    params = SamplingParams(**sampling_params_kwargs(request))
    parent = object.__new__(ParentRequest)  # its constructor wants a whole EngineCoreRequest; the seeding needs this
    parent.sampling_params, parent.cached_child_sampling_params = params, None
    children = [parent._get_child_sampling_params(i).seed for i in range(request.n)]
    assert children == [params.seed + i for i in range(request.n)]
    assert children == stub._child_seeds(stub.SamplingParams(**sampling_params_kwargs(request)))


BAD_SAMPLING = [
    {"temperature": 2.5},
    {"temperature": -0.1},
    {"temperature": float("nan")},
    {"top_p": 0.0},
    {"top_p": 1.5},
    {"top_k": -2},
    {"top_k": 2.0},
]


@pytest.mark.parametrize("bad", BAD_SAMPLING, ids=[repr(b) for b in BAD_SAMPLING])
def test_the_stub_refuses_the_sampling_settings_vllm_refuses(bad: dict[str, float]) -> None:
    from vllm.exceptions import VLLMValidationError

    with pytest.raises(VLLMValidationError, match=next(iter(bad))):
        SamplingParams(**bad)
    with pytest.raises(stub.VLLMValidationError, match=next(iter(bad))):
        stub.SamplingParams(**bad)
    assert not issubclass(VLLMValidationError, ValueError) and not issubclass(stub.VLLMValidationError, ValueError)


def test_vllms_sampling_ranges_are_the_ones_the_engine_and_the_stub_assume() -> None:
    """A temperature in (0, 0.01) raised to 0.01, 0 greedy (the cut reset), 2.0 the largest temperature, top_k 0 no
    cut (-1 accepted too), in vLLM and in the stub alike: what `check_vllm_sampling` refuses is exactly what vLLM
    cannot sample as declared."""
    import vllm.sampling_params as real

    from rl.samplers.vllm_requests import VLLM_MAX_TEMPERATURE, VLLM_MIN_TEMPERATURE

    assert real._MAX_TEMP == VLLM_MIN_TEMPERATURE == stub.MAX_TEMP and real._SAMPLING_EPS == stub.SAMPLING_EPS
    for cls in (SamplingParams, stub.SamplingParams):
        assert cls(temperature=VLLM_MIN_TEMPERATURE / 2).temperature == VLLM_MIN_TEMPERATURE
        greedy = cls(temperature=0.0, top_p=0.5, top_k=3)
        assert (greedy.top_p, greedy.top_k) == (1.0, 0)
        sampled = cls(temperature=VLLM_MIN_TEMPERATURE, top_p=0.5, top_k=3)
        assert (sampled.temperature, sampled.top_p, sampled.top_k) == (VLLM_MIN_TEMPERATURE, 0.5, 3)
        assert cls(temperature=VLLM_MAX_TEMPERATURE).temperature == VLLM_MAX_TEMPERATURE
        assert cls(top_k=-1).top_k in (-1, 0) and cls().top_k == 0
    assert SamplingParams().top_k == stub.SamplingParams().top_k == 0


@pytest.mark.parametrize(
    "sampling",
    [SamplingSettings(), SamplingSettings(temperature=0.6, top_p=0.9, top_k=5), SamplingSettings(temperature=2.0)],
    ids=["default", "cut", "hottest"],
)
def test_the_real_sampling_params_take_every_setting_the_engine_passes(sampling: SamplingSettings) -> None:
    request = RolloutRequest(
        group_id=0, prompt=Prompt("1=", "2"), n=4, adapter=ArtifactRef("", "sha256:0"), policy_version=0, seed=9,
        sampling=sampling,
    )  # fmt: skip
    params = SamplingParams(**sampling_params_kwargs(request))
    assert (params.temperature, params.top_p, params.top_k) == (sampling.temperature, sampling.top_p, sampling.top_k)
    assert "processed_logprobs" in typing.get_args(LogprobsMode)


def test_our_engine_builds_its_requests_with_the_real_classes(
    model_dir: Path, adapter: tuple[LocalArtifacts, ArtifactRef], tmp_path: Path
) -> None:
    """VLLMEngine over a module whose `SamplingParams` and `lora.request.LoRARequest` are vLLM's own (the `LLM` is
    the stub, which cannot be real on a CPU): the real classes accept every argument, and the stub samples from them."""
    store, ref = adapter
    hybrid = types.ModuleType("vllm_hybrid")
    hybrid.SamplingParams = SamplingParams  # type: ignore[attr-defined]
    hybrid.LLM = stub.LLM  # type: ignore[attr-defined]
    lora_pkg = types.ModuleType("vllm_hybrid.lora")
    request_mod = types.ModuleType("vllm_hybrid.lora.request")
    request_mod.LoRARequest = LoRARequest  # type: ignore[attr-defined]
    modules = {"vllm_hybrid": hybrid, "vllm_hybrid.lora": lora_pkg, "vllm_hybrid.lora.request": request_mod}
    saved = {name: sys.modules.get(name) for name in modules}
    sys.modules.update(modules)
    try:
        importlib.invalidate_caches()
        engine = VLLMEngine(
            open_model(model_dir),
            store,
            vllm_module=hybrid,
            adapter_root=tmp_path / "a",
            tokenizer=load_tokenizer(open_model(model_dir)),
        )
        request = RolloutRequest(
            group_id=1, prompt=Prompt("3=", "4"), n=3, adapter=ref, policy_version=0, seed=5, max_tokens=3,
            sampling=SamplingSettings(temperature=0.7, top_p=0.95, top_k=4),
        )  # fmt: skip
        rollouts = asyncio.run(engine.generate(request))
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    [call] = engine.llm.generate_calls
    [lora] = call.lora_request
    assert type(lora) is LoRARequest and type(call.sampling_params[0]) is SamplingParams
    assert (call.sampling_params[0].temperature, call.sampling_params[0].top_k) == (0.7, 4)
    assert lora.lora_int_id == 1 and ref.digest.partition(":")[2][:12] in lora.lora_name
    assert len(rollouts) == 3 and all(r.seed == 5 for r in rollouts)
