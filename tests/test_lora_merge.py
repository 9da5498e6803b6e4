"""Switching the sampler between LoRA adapters in one base copy: PEFT's merged bits, whatever was active before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from fixtures_real import adapter_dirs, make_adapter_dir, one_thread, refs, run, store, tiny_model_dir

from rl.errors import UnsupportedLora
from rl.models.opened_model import open_model
from rl.samplers.adapter_cache import AdapterCache
from rl.samplers.lora_merge import MergedBase, parse_lora
from rl.samplers.torch_sampler import TorchSampler
from rl.storage.artifacts import LocalArtifacts, read_dir
from rl.types import ArtifactRef

__all__ = ["adapter_dirs", "one_thread", "refs", "store", "tiny_model_dir"]

pytestmark = pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")


def _lora(path: Path):  # type: ignore[no-untyped-def]
    files = read_dir(path)
    return parse_lora(files["adapter_config.json"], files["adapter_model.safetensors"])


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_merged_weights_are_peft_merge_and_unload_bit_for_bit_whatever_was_active_before(
    tiny_model_dir: Path, adapter_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """Law: activating an adapter gives exactly the weights PEFT's `merge_and_unload` gives, also after switching
    through other adapters (including one that touches fewer layers), so a sampler's output never depends on history."""
    cache = AdapterCache(open_model(tiny_model_dir), capacity=3, merge=True)
    other = make_adapter_dir(tiny_model_dir, tmp_path / "other", seed=7, identity=False)
    merged = MergedBase(cache.base)
    want = {name: _weights(cache.load_dir(name, path)) for name, path in {**adapter_dirs, "other": other}.items()}
    for name in ("trained", "v0", "other", "trained", "other", "v0"):
        got = _weights(merged.activate(name, _lora({**adapter_dirs, "other": other}[name])))
        assert got.keys() == want[name].keys()
        for key, value in want[name].items():
            assert torch.equal(got[key], value), (name, key)


def test_the_base_model_is_left_untouched(tiny_model_dir: Path, adapter_dirs: dict[str, Path]) -> None:
    cache = AdapterCache(open_model(tiny_model_dir), capacity=1, merge=True)
    before = _weights(cache.base)
    MergedBase(cache.base).activate("trained", _lora(adapter_dirs["trained"]))
    assert all(torch.equal(before[k], v) for k, v in cache.base.state_dict().items())


@pytest.mark.parametrize(
    "change", [{"use_dora": True}, {"bias": "all"}, {"modules_to_save": ["lm_head"]}, {"peft_type": "IA3"}]
)
def test_an_adapter_that_is_not_plain_lora_is_refused_and_the_sampler_loads_it_through_peft(
    tiny_model_dir: Path, adapter_dirs: dict[str, Path], tmp_path: Path, change: dict[str, object]
) -> None:
    files = read_dir(adapter_dirs["trained"])
    config = {**json.loads(files["adapter_config.json"]), **change}
    with pytest.raises(UnsupportedLora):
        parse_lora(json.dumps(config).encode(), files["adapter_model.safetensors"])
    if "bias" not in change:
        return  # PEFT itself would need tensors (DoRA magnitudes, a saved lm_head, IA3 vectors) this adapter lacks
    artifacts = LocalArtifacts(tmp_path / "store")
    ref = run(artifacts.put({**files, "adapter_config.json": json.dumps(config).encode()}, name="odd"))
    sampler = TorchSampler(open_model(tiny_model_dir), artifacts)
    run(sampler.policy(ref))
    assert (sampler.lora_loads, sampler.adapters.loads) == (0, 1)


def test_the_sampler_switches_adapters_without_loading_them_again(
    tiny_model_dir: Path, store: LocalArtifacts, refs: dict[str, ArtifactRef]
) -> None:
    sampler = TorchSampler(open_model(tiny_model_dir), store)
    ids = torch.tensor([sampler.encode_prompt("3=")])
    with torch.no_grad():
        first = run(sampler.policy(refs["trained"]))(input_ids=ids).logits.clone()
        run(sampler.policy(refs["v0"]))
        again = run(sampler.policy(refs["trained"]))(input_ids=ids).logits
    assert sampler.loads == 2
    assert torch.equal(first, again)
