"""`RL_NCCL_DEBUG=1` turns on NCCL's and torch.distributed's diagnostics in a clustered task: it travels with every
task environment, `join_process_group` sets the variables before the process group starts (keeping any the user set),
and docs/gpu.md names each one."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import flyte
import pytest
import torch.distributed as dist

from rl.deploy.flyte.nccl_debug import NCCL_DEBUG_ENV, apply_nccl_diagnostics, nccl_diagnostics

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_the_switch_off_sets_nothing() -> None:
    for off in ({}, {NCCL_DEBUG_ENV: "0"}, {NCCL_DEBUG_ENV: ""}):
        env = dict(off)
        assert apply_nccl_diagnostics(env) == {} and env == off


def test_the_switch_on_sets_every_diagnostic_and_keeps_what_the_user_set() -> None:
    env = {NCCL_DEBUG_ENV: "1", "NCCL_DEBUG": "TRACE"}
    added = apply_nccl_diagnostics(env)
    assert env["NCCL_DEBUG"] == "TRACE" and "NCCL_DEBUG" not in added
    assert {name: env[name] for name in added} == {k: v for k, v in nccl_diagnostics().items() if k != "NCCL_DEBUG"}
    assert env["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL" and env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"


@pytest.mark.heavy  # imports Flyte and the clustered task (~10 s on a loaded core)
def test_joining_the_process_group_applies_the_switch_first(monkeypatch: pytest.MonkeyPatch) -> None:
    from rl.deploy.flyte.clustered import join_process_group

    for name in nccl_diagnostics():  # absent now and after the test (setenv records the state to restore)
        monkeypatch.setenv(name, "x")
        monkeypatch.delenv(name)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(NCCL_DEBUG_ENV, "1")
    rank, world_size, device, created = join_process_group()  # outside torchrun: a one-rank gloo group of its own
    try:
        assert (rank, world_size, device, created) == (0, 1, "cpu", True)
        assert {name: os.environ.get(name) for name in nccl_diagnostics()} == nccl_diagnostics()
    finally:
        dist.destroy_process_group()


@pytest.mark.heavy  # imports Flyte and declares every environment
def test_every_task_environment_carries_the_switch() -> None:
    """Including the clustered trainer's, whose pods start the NCCL group."""
    import rl.deploy.flyte.envs as envs

    declared = [v for v in vars(envs).values() if isinstance(v, flyte.Environment)]
    assert envs.cluster_train_env in declared
    assert all(NCCL_DEBUG_ENV in env.env_vars for env in declared), [e.name for e in declared]


@pytest.mark.slow
def test_the_switch_travels_from_the_deploying_shell() -> None:
    """The value is the deploying shell's, read when the environments are declared (a fresh interpreter: ~3 s of
    imports on a quiet core, 27 s on a loaded one)."""
    code = "import rl.deploy.flyte.envs as e; print(e.ENV_VARS['RL_NCCL_DEBUG'], e.ROLLOUT_ENV_VARS['RL_NCCL_DEBUG'])"
    env = {**os.environ, NCCL_DEBUG_ENV: "1", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["1", "1"]


def test_the_docs_name_the_switch_and_every_variable_it_sets() -> None:
    gpu = (DOCS / "gpu.md").read_text()
    section = re.search(r"^## NCCL diagnostics\n(.*?)(?=^## |\Z)", gpu, flags=re.M | re.S)
    assert section, "docs/gpu.md has no '## NCCL diagnostics' section"
    for name in (NCCL_DEBUG_ENV, *nccl_diagnostics()):
        assert f"`{name}" in section.group(1), name
    assert NCCL_DEBUG_ENV in (DOCS / "flyte.md").read_text()
