"""The conformance suite's pytest plugin (entry point `rl_conformance`): only what has to be global.

- `--rl-impl module:attr`: the `rl.conformance.Implementation` the packaged suite (`rl.conformance.test_suite`) binds;
- `--rl-seed N`: the seed every law derives its seeds from (default 0), hypothesis's draws included;
- `--rl-examples N`: how many examples each law that draws data runs (default: the law's own, 10 to 20);
- the markers `rl_conformance` (every law) and `rl_<tier>` (one tier's laws);
- after a failing law, the command that reruns exactly it with the same seed.

Installed with the package, so it loads in every pytest run of that environment: it imports nothing but pytest and the
standard library, and does nothing unless contract tests are collected (then, for the packaged suite, it loads the
`--rl-impl` implementation to print its declared `LawSizes` in the header line).
"""

from __future__ import annotations

import hashlib
import shlex
import sys
from collections.abc import Generator
from typing import Any

import pytest

SUITE_MODULE = "rl.conformance.test_suite"
TIER_MARKERS = {
    "rl_artifacts": "the Artifacts laws",
    "rl_state_store": "the CheckpointStore laws",
    "rl_engine": "the RolloutEngine laws",
    "rl_scorer": "the Scorer laws",
    "rl_trainer": "the Trainer laws",
    "rl_driver": "the GRPO driver laws (simulator sweeps and fault scenarios)",
    "rl_replay": "the replay-compatibility laws (a recorded run's actions, issued again)",
    "rl_advantages": "the group-relative advantage laws",
    "rl_loss": "the GRPO loss laws (REINFORCE at ratio 1, clipped ratio, KL penalty, padding, aggregation)",
    "rl_ddp": "the multi-rank shard-step laws (spawned gloo ranks)",
    "rl_accumulation": "the gradient-accumulation law (micro-batched steps against the whole batch's, real trainers)",
    "rl_generation_batch": "the normaliser of each optimizer step a generation batch feeds (accumulated_loss)",
    "rl_agentic": "the agentic loop laws (skipped trials, memoised judge, canonical inputs, exactly-once steps)",
    "rl_volumes": "the versioned copy-on-write volume laws (fork isolation, immutable versions, one writer per name)",
    "rl_buffer": "the rollout buffer laws (immutable versions, exact rows, rescoring changes only rewards)",
    "rl_token_logprobs": "the trainer log-prob laws (teacher forcing at the sampling temperature and cut)",
    "rl_batch_reward": "the batch-reward Scorer laws (one reward per completion, from that completion)",
    "rl_buffer_reads": "the rollout buffer's read law (a stored non-finite reward never read back)",
}
_REPRODUCE = pytest.StashKey[list[str]]()

# Plain `assert`s in the contracts explain themselves when they fail, whether or not the package is installed editable.
_CONTRACT_MODULES = (
    "rl.conformance.support.contract_base",
    "rl.conformance.artifacts_contract",
    "rl.conformance.state_store_contract",
    "rl.conformance.rollout_engine_contract",
    "rl.conformance.scorer_contract",
    "rl.conformance.trainer_contract",
    "rl.conformance.grpo_driver_contract",
    "rl.conformance.driver_replay_contract",
    "rl.conformance.support.advantage_calls",
    "rl.conformance.advantage_contract",
    "rl.conformance.loss_ratio_laws",
    "rl.conformance.loss_kl_laws",
    "rl.conformance.loss_contract",
    "rl.conformance.ddp_shard_step_contract",
    "rl.conformance.agentic_contract",
    "rl.conformance.loop_contract",
    "rl.conformance.volume_store_contract",
    "rl.conformance.rollout_buffer_contract",
    "rl.conformance.batch_reward_scorer_contract",
    "rl.conformance.rollout_buffer_reads_contract",
    "rl.conformance.engine_update_laws",
    "rl.conformance.trainer_memory_laws",
)
pytest.register_assert_rewrite(*(m for m in _CONTRACT_MODULES if m not in sys.modules))


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("rl-conformance", "flyte-rl conformance suite")
    group.addoption(
        "--rl-impl",
        dest="rl_impl",
        default=None,
        metavar="MODULE:ATTR",
        help="the rl.conformance.Implementation that `pytest --pyargs rl.conformance.test_suite` checks",
    )
    group.addoption(
        "--rl-seed",
        dest="rl_seed",
        type=int,
        default=0,
        metavar="N",
        help="seed of the conformance laws (requests, run seeds, fault scenarios, hypothesis draws); default 0",
    )
    group.addoption(
        "--rl-examples",
        dest="rl_examples",
        type=_positive_int,
        default=None,
        metavar="N",
        help="examples each law that draws data runs (default: the law's own, 10 to 20); the explicit hazardous "
        "examples always run first",
    )


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"--rl-examples must be at least 1, got {value}")
    return value


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "rl_conformance: a law of the flyte-rl conformance suite")
    for name, what in TIER_MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {what} of the flyte-rl conformance suite")
    config.stash[_REPRODUCE] = []


def _law_function(item: pytest.Item) -> Any:
    obj = getattr(item, "obj", None)
    return getattr(obj, "__func__", obj)


def law_seed(rl_seed: int, law: str) -> int:
    """The hypothesis seed of one law under `--rl-seed`: distinct per law and per run seed, stable across runs."""
    return int.from_bytes(hashlib.sha256(f"{rl_seed}:{law}".encode()).digest()[:8], "big")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """Under `--rl-seed N` (N != 0) or `--rl-examples`, run a drawing law with a seed derived from N and that many
    examples, for this call only.

    The laws are derandomized (seed 0 draws what it always drew, so a fork's record stays comparable), so a seed must
    reach hypothesis some other way. Hypothesis reads a decorated test's seed and settings from
    `_hypothesis_internal_use_seed` / `_hypothesis_internal_use_settings` at every call (what `@hypothesis.seed` and
    `@settings` set); both are put back after the call, so another plugin that changed them (the self-test's
    no-shrinking run) keeps its change, and a contract class shared by several runs in one process is never left
    altered."""
    rl_seed = int(item.config.getoption("rl_seed", default=0) or 0)
    examples = item.config.getoption("rl_examples", default=None)
    function = _law_function(item)
    own = getattr(function, "_hypothesis_internal_use_settings", None)
    if item.get_closest_marker("rl_conformance") is None or own is None or (rl_seed == 0 and examples is None):
        return (yield)
    from hypothesis import is_hypothesis_test, settings

    own_seed = getattr(function, "_hypothesis_internal_use_seed", None)
    changes: dict[str, Any] = {"database": None}
    if examples is not None:
        changes["max_examples"] = examples
    function._hypothesis_internal_use_settings = settings(own, **changes)
    # Only a @given law takes a seed this way (hypothesis refuses one on any other test); a law that runs hypothesis
    # itself (the volume state machine) derives it from `rl_seed` with `law_seed`.
    if rl_seed != 0 and is_hypothesis_test(function):
        function._hypothesis_internal_use_seed = law_seed(rl_seed, function.__qualname__)
    try:
        return (yield)
    finally:
        function._hypothesis_internal_use_settings = own
        function._hypothesis_internal_use_seed = own_seed


def reproduce_command(item: pytest.Item) -> str:
    """The command that reruns exactly this law with the same seed and examples (and implementation, for the packaged
    suite)."""
    seed = item.config.getoption("rl_seed", default=0)
    examples = item.config.getoption("rl_examples", default=None)
    examples_arg = f" --rl-examples {examples}" if examples is not None else ""
    module = getattr(getattr(item, "module", None), "__name__", "")
    if module == SUITE_MODULE:
        node = "::".join([SUITE_MODULE, *item.nodeid.split("::")[1:]])
        impl = item.config.getoption("rl_impl", default=None)
        impl_arg = f" --rl-impl {shlex.quote(impl)}" if impl else ""
        return f"pytest --pyargs {shlex.quote(node)}{impl_arg} --rl-seed {seed}{examples_arg}"
    return f"pytest {shlex.quote(item.nodeid)} --rl-seed {seed}{examples_arg}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report: pytest.TestReport = yield
    if report.failed and item.get_closest_marker("rl_conformance") is not None:
        line = reproduce_command(item)
        report.sections.append(("rl-conformance: reproduce", line))
        item.config.stash.setdefault(_REPRODUCE, []).append(line)
    return report


def pytest_collection_finish(session: pytest.Session) -> None:
    if not any(item.get_closest_marker("rl_conformance") for item in session.items):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        impl = session.config.getoption("rl_impl", default=None)
        seed = session.config.getoption("rl_seed", default=0)
        examples = session.config.getoption("rl_examples", default=None)
        reporter.write_line(
            f"rl-conformance: seed={seed}"
            + (f" examples={examples}" if examples is not None else "")
            + (f" impl={impl}" if impl else "")
            + _declared_sizes(impl, session)
        )


def _declared_sizes(impl: str | None, session: pytest.Session) -> str:
    """` draw_fraction=F (...)` when the packaged suite's implementation declares smaller sampling laws, so a record
    says the laws ran at less power; empty otherwise, or when it does not load (its fixture then says why)."""
    suite = (getattr(getattr(item, "module", None), "__name__", "") == SUITE_MODULE for item in session.items)
    if not impl or not any(suite):
        return ""
    from rl.conformance.implementation import load_implementation
    from rl.errors import ImplementationError

    try:
        declared = load_implementation(impl).sizes.declared()
    except ImplementationError:
        return ""
    return f" {declared} (the sampling engine laws draw that share of their groups)" if declared else ""


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    lines = config.stash.get(_REPRODUCE, [])
    if lines:
        terminalreporter.section("rl-conformance: reproduce each failed law with")
        for line in lines:
            terminalreporter.write_line(line)
