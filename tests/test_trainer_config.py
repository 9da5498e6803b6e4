"""TrainerConfig rejects each bad setting at construction, naming the field and the value it got."""

from __future__ import annotations

import math

import pytest

from rl.trainer.config import TrainerConfig


def test_defaults_are_valid_and_match_the_seed_loss_constants() -> None:
    config = TrainerConfig()
    assert (config.clip_eps, config.kl_beta, config.target_modules) == (0.2, 0.03, "all-linear")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("lora_rank", 0),
        ("lora_alpha", 0),
        ("lora_dropout", 1.0),
        ("target_modules", ()),
        ("target_modules", ("q_proj", "")),
        ("lr", 0.0),
        ("lr", math.nan),
        ("weight_decay", -1.0),
        ("betas", (0.9, 1.0)),
        ("adam_eps", 0.0),
        ("max_grad_norm", 0.0),
        ("clip_eps", 0.0),
        ("clip_eps_high", -0.1),
        ("kl_beta", -0.1),
        ("advantage_scale", "batch"),
        ("std_eps", 0.0),
        ("max_staleness", -1),
        ("seed", -1),
        ("threads", 0),
        ("micro_batch_size", 0),
    ],
)
def test_each_invalid_setting_raises_a_value_error_naming_the_field(field: str, value: object) -> None:
    """The message starts with the field's name so the user knows which setting to fix."""
    with pytest.raises(ValueError, match=f"^{field} "):
        TrainerConfig(**{field: value})  # type: ignore[arg-type]


def test_infinite_max_grad_norm_disables_clipping_and_is_accepted() -> None:
    assert TrainerConfig(max_grad_norm=math.inf).max_grad_norm == math.inf


@pytest.mark.parametrize("value", ["batched", "per_sample"])
def test_a_json_config_carrying_the_retired_loss_path_is_refused_naming_it(value: str) -> None:
    """`loss_path` is gone (the trainer has one loss path): a run config from an earlier version that still carries it,
    even at its old default, is refused by name with what to do, built in Python or validated from JSON."""
    from pydantic import TypeAdapter, ValidationError

    from rl.deploy.flyte.config import GrpoRunConfig
    from rl.deploy.flyte.strict import ConfigError

    advice = r"trainer: loss_path is no longer a trainer setting: .*one loss path.*delete the key"
    with pytest.raises(ConfigError, match=advice):
        GrpoRunConfig(trainer={"lr": 1e-3, "loss_path": value})
    with pytest.raises(ValidationError, match=advice):
        GrpoRunConfig.model_validate_json(f'{{"trainer": {{"loss_path": "{value}"}}}}')
    with pytest.raises(ValidationError, match="loss_path is no longer a trainer setting"):
        TypeAdapter(TrainerConfig).validate_python({"loss_path": value})
    assert TypeAdapter(TrainerConfig).validate_python({"lr": 1e-3}) == TrainerConfig(lr=1e-3)
