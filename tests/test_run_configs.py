"""Issue 16 item 10: the Flyte tasks' run configs (`GrpoRunConfig`, `AgenticRunConfig`) refuse what cannot work when
they are built, from Python or from `flyte run ... --config '<json>'`: unknown keys (at any depth), values out of
range, an unknown reward, a crash injected after the run's last step. So a bad run fails before its first task."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl.agentic.faults import AgenticFaults
from rl.deploy.flyte.agentic import SMOKE as AGENTIC_SMOKE
from rl.deploy.flyte.agentic import AgenticRunConfig
from rl.deploy.flyte.config import FaultSpec, GrpoRunConfig, smoke
from rl.errors import ConfigError


def _flyte_cli(config_type: type, default: object, value: dict) -> object:
    """What `flyte run FILE TASK --config '<json>'` hands the task: Flyte's own CLI parameter type, merged over the
    task's default the way the CLI does."""
    from flyte.cli._params import JsonParamType

    return JsonParamType(config_type, default).convert(json.dumps(value), None, None)


# ------------------------------------------------------------------------------------------------- unknown keys

GRPO_TYPOS = [
    ({"rewrd": "format"}, "rewrd"),
    ({"grpo": {"iterations": 2, "itterations": 3}}, "itterations"),
    ({"trainer": {"learning_rate": 1e-3}}, "learning_rate"),
    ({"model": {"tiny": {"hiden_size": 32}}}, "hiden_size"),
    ({"engine": {"kind": "torch", "thread": 2}}, "thread"),
    ({"faults": {"crash_after_iteration": 1}}, "faults"),  # the production driver takes no fault knob
]


@pytest.mark.parametrize(("value", "typo"), GRPO_TYPOS, ids=[typo for _, typo in GRPO_TYPOS])
def test_grpo_config_json_refuses_an_unknown_key_at_any_depth(value, typo):
    """Before: Flyte dropped the key without a word and the run used the default."""
    with pytest.raises(ValueError, match=typo):
        _flyte_cli(GrpoRunConfig, smoke(), value)


def test_agentic_config_json_refuses_an_unknown_key():
    with pytest.raises(ValueError, match="tool_latency"):
        _flyte_cli(AgenticRunConfig, AGENTIC_SMOKE, {"tool_latency": 0.0})


def test_the_readme_config_examples_still_parse():
    """docs/flyte.md's `--config` lines: the agentic smoke without latency, a longer GRPO run."""
    assert _flyte_cli(AgenticRunConfig, AGENTIC_SMOKE, {"tool_latency_s": 0.0}).tool_latency_s == 0.0
    grpo = {"grpo": {"iterations": 20, "prompts_per_iteration": 8, "group_size": 8}}
    assert _flyte_cli(GrpoRunConfig, smoke(), grpo).grpo.iterations == 20


# ---------------------------------------------------------------------------------------------------- ranges

GRPO_OUT_OF_RANGE = [
    ({"grpo": {"iterations": 0}}, "iterations must be >= 1"),
    ({"grpo": {"iterations": 3, "group_size": 1}}, "group_size must be >= 2"),
    ({"trainer": {"lr": -1e-3}}, "lr must be a finite number > 0"),
    ({"engine": {"threads": 0}}, "threads must be >= 1"),
    ({"engine": {"gpu_memory_utilization": 1.5}}, r"gpu_memory_utilization must be in \(0, 1\]"),
    ({"reward": "bleu"}, "unknown reward 'bleu'"),
    ({"problems": "chess"}, "problems must be one of"),
    ({"engine": {"kind": "vllm", "max_lora_rank": 12}}, "max_lora_rank=12 is not a rank vLLM accepts"),
    (
        {"engine": {"kind": "vllm", "max_lora_rank": 8}, "trainer": {"lora_rank": 16}},
        "trainer.lora_rank=16 exceeds engine.max_lora_rank=8",
    ),
    # vLLM samples a temperature below 0.01 at 0.01 and refuses one above 2: refused before any task starts.
    (
        {"engine": {"kind": "vllm"}, "grpo": {"iterations": 3, "sampling": {"temperature": 0.005}}},
        "temperature=0.005 is below 0.01, which vLLM silently raises it to",
    ),
    (
        {"engine": {"kind": "vllm"}, "grpo": {"iterations": 3, "sampling": {"temperature": 2.5}}},
        "temperature=2.5 is above 2.0, the most vLLM's SamplingParams accepts",
    ),
]


@pytest.mark.parametrize(("value", "message"), GRPO_OUT_OF_RANGE, ids=[m for _, m in GRPO_OUT_OF_RANGE])
def test_grpo_config_refuses_a_value_out_of_range_from_json_and_from_python(value, message):
    """The same check from `--config` JSON (a ValueError from Flyte's CLI) and from Python (a `ConfigError`)."""
    with pytest.raises(ValueError, match=message):
        _flyte_cli(GrpoRunConfig, smoke(), value)
    fields = {k: v for k, v in value.items() if not isinstance(v, dict)}
    if fields:
        with pytest.raises(ConfigError, match=message):
            smoke(**fields)


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_agentic_config_refuses_counts_below_one_and_absurd_worlds(data):
    """Each count must be >= 1; more worlds than prompts per step is refused (prompt p explores world p mod W)."""
    field = data.draw(st.sampled_from(["n_steps", "n_worlds", "prompts_per_step", "n_samples", "max_turns"]))
    value = data.draw(st.integers(max_value=0))
    with pytest.raises(ConfigError, match=f"{field} must be >= 1, got {value}"):
        AgenticRunConfig(**{field: value})
    worlds = data.draw(st.integers(min_value=4, max_value=10**9))
    with pytest.raises(ConfigError, match=f"n_worlds {worlds} is more than the 3 prompts per step"):
        AgenticRunConfig(n_worlds=worlds, prompts_per_step=3)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"lr": -2.0}, "lr must be a finite number > 0"),
        ({"lr": float("inf")}, "lr must be a finite number > 0"),
        ({"tool_latency_s": -0.1}, "tool_latency_s must be >= 0"),
        ({"tool_latency_s": 60.0}, "under generate's 300 s timeout"),
        ({"max_turns": 0}, "max_turns must be >= 1"),
    ],
)
def test_agentic_config_refuses_rates_and_latencies_out_of_range(value, message):
    with pytest.raises(ConfigError, match=message):
        AgenticRunConfig(**value)
    if all(isinstance(v, int) or abs(v) != float("inf") for v in value.values()):
        with pytest.raises(ValueError, match=message):
            _flyte_cli(AgenticRunConfig, AGENTIC_SMOKE, value)


def test_grpo_fault_inputs_refuse_a_typo_a_bad_iteration_and_one_beyond_the_run():
    """`train_rl_with_faults`' `--faults` JSON refuses an unknown key and a negative iteration; a crash after the run's
    last iteration is refused against the config before the first task."""
    with pytest.raises(ValueError, match="crash_after"):
        _flyte_cli(FaultSpec, FaultSpec(), {"crash_after": 1})
    with pytest.raises(ValueError, match="crash_after_iteration must be -1"):
        _flyte_cli(FaultSpec, FaultSpec(), {"crash_after_iteration": -2})
    with pytest.raises(ConfigError, match="crash_after_iteration must be -1"):
        FaultSpec(crash_after_iteration=-2)
    config = smoke()
    config.check_faults(FaultSpec(crash_after_iteration=2))
    with pytest.raises(ConfigError, match="beyond the run's 3 iterations"):
        config.check_faults(FaultSpec(crash_after_iteration=3))


def test_agentic_fault_inputs_refuse_an_unknown_key():
    """`train_with_faults --faults '<json>'`: a misspelt key is refused (a dataclass input would have dropped it)."""
    from rl.deploy.flyte.agentic_faults import AgenticFaultSpec

    with pytest.raises(ValueError, match="flaky_rate"):
        _flyte_cli(AgenticFaultSpec, AgenticFaultSpec(), {"flaky_rate": 0.3})
    spec = _flyte_cli(AgenticFaultSpec, AgenticFaultSpec(), {"flaky_trial_rate": 0.3})
    assert spec.faults() == AgenticFaults(flaky_trial_rate=0.3)


def test_agentic_train_inputs_refuse_a_crash_step_beyond_the_run():
    """`train_with_faults`' faults are checked against the config before the first task."""
    config = AgenticRunConfig(n_steps=3)
    config.check_faults(AgenticFaults(crash_driver_at_step=2, flaky_trial_rate=0.25, judge_flake_rate=0.3))
    for bad, message in [((3, 0.0, 0.0), "beyond the run's 3 steps"), ((0, 1.5, 0.0), "flaky_trial_rate must be")]:
        crash, flaky, judge = bad
        with pytest.raises(ConfigError, match=message):
            config.check_faults(
                AgenticFaults(crash_driver_at_step=crash, flaky_trial_rate=flaky, judge_flake_rate=judge)
            )


def test_configs_replace_revalidates():
    """`.replace` (the models' `dataclasses.replace`) checks the result too."""
    assert smoke().replace(reward="format").reward == "format"
    with pytest.raises(ConfigError, match="unknown reward"):
        smoke().replace(reward="bleu")
    with pytest.raises(ConfigError, match="n_steps must be >= 1"):
        AGENTIC_SMOKE.replace(n_steps=0)


# ---------------------------------------------------------------------------------------- before the first task


def test_an_unknown_reward_fails_before_the_grpo_driver_starts_a_task(monkeypatch):
    """A config built without validation (`model_construct`) is still refused by `run_driver` before `build_base`
    (before: only at the first `score_group`, after the base model was built)."""
    import asyncio

    import rl.deploy.flyte.grpo as grpo
    import rl.deploy.flyte.grpo_driver as grpo_driver

    started: list[str] = []

    async def build_base(*args, **kwargs):
        started.append("build_base")
        raise AssertionError("a task started")

    monkeypatch.setattr(grpo_driver, "build_base", build_base)
    config = GrpoRunConfig.model_construct(**{**dict(smoke()), "reward": "bleu"})
    with pytest.raises(ValueError, match="unknown reward 'bleu'"):
        asyncio.run(grpo.run_driver(config, step_task=grpo.train_step, title="t"))
    assert started == []


def test_every_registered_problem_set_serves_prompts_and_an_unknown_name_is_refused():
    """Each name in `rl.problems.PROBLEM_SETS` builds a problem set with training and held-out prompts; another name is
    an InputError listing the names there are."""
    from rl.errors import InputError
    from rl.problems import PROBLEM_SETS, problem_set

    for name in PROBLEM_SETS:
        problems = problem_set(name)
        assert problems.train_prompts() and problems.eval_prompts()
    refused = r"unknown problem set 'poetry'; choose one of \['addition', 'arithmetic', 'digits'\]"
    with pytest.raises(InputError, match=refused):
        problem_set("poetry")
