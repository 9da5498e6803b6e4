"""The clustered trainer and the pipelined driver of `rl.deploy.flyte.clustered`.

A clustered task runs with no controller, so it cannot call another task; in local mode such a call would silently
work, so the rule is checked statically over the source of `rl/deploy/flyte/`. The pipelined driver then runs end to end
in Flyte's local mode, where the clustered step forms a one-rank gloo group of its own.
"""

from __future__ import annotations

import ast
import asyncio
from dataclasses import replace
from pathlib import Path

import pytest
from flyte_support import LocalFlyte, isolated_flyte

import rl.deploy.flyte
from rl.deploy.flyte.config import GrpoRunConfig, smoke
from rl.deploy.local import local_grpo
from rl.loop.grpo import GrpoOutcome, run_grpo
from rl.storage.run_dir import open_run

pytestmark = pytest.mark.flyte

FLYTE_DIR = Path(rl.deploy.flyte.__file__).parent
CONFIG = smoke().replace(grpo=replace(smoke().grpo, pipelined=True))


def _decorator_env(decorator: ast.expr) -> str | None:
    """`env` for `@env.task`, `@env.task(...)` or `@module.env.task(...)`; None for anything else."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    if not (isinstance(target, ast.Attribute) and target.attr == "task"):
        return None
    owner = target.value
    if isinstance(owner, ast.Name):
        return owner.id
    if isinstance(owner, ast.Attribute):
        return owner.attr
    return None


def _called_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def clustered_task_violations(sources: dict[str, str]) -> tuple[list[str], list[str]]:
    """(clustered tasks found, "task -> called task" violations) over module sources, following helper functions."""
    trees = {name: ast.parse(text) for name, text in sources.items()}
    clustered_envs: set[str] = set()
    tasks: dict[str, tuple[ast.AsyncFunctionDef | ast.FunctionDef, set[str]]] = {}
    functions: dict[str, list[ast.AsyncFunctionDef | ast.FunctionDef]] = {}
    for tree in trees.values():
        for node in tree.body:
            is_call = isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
            if is_call and (_called_name(node.value) or "").endswith("ClusteredTaskEnvironment"):
                clustered_envs.update(t.id for t in node.targets if isinstance(t, ast.Name))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                functions.setdefault(node.name, []).append(node)
                envs = {env for env in map(_decorator_env, node.decorator_list) if env is not None}
                if envs:
                    tasks[node.name] = (node, envs)
    found, violations = [], []
    for name, (node, envs) in tasks.items():
        if not envs & clustered_envs:
            continue
        found.append(name)
        seen: set[str] = set()
        frontier: list[ast.AST] = [*node.body]
        while frontier:
            for sub in ast.walk(frontier.pop()):
                if not isinstance(sub, ast.Call) or (callee := _called_name(sub)) is None:
                    continue
                if callee in tasks or (callee in ("run", "map") and "flyte" in ast.unparse(sub.func)):
                    violations.append(f"{name} -> {callee}")
                elif callee in functions and callee not in seen:
                    seen.add(callee)
                    frontier.extend(stmt for fn in functions[callee] for stmt in fn.body)
    return found, violations


def _flyte_sources() -> dict[str, str]:
    return {path.name: path.read_text() for path in sorted(FLYTE_DIR.glob("*.py"))}


def test_no_clustered_task_calls_another_task():
    """The training-loop tutorial: a clustered task "has NO controller — it cannot call other tasks, so the loop stays
    in the driver"."""
    found, violations = clustered_task_violations(_flyte_sources())
    assert found == ["train_step_clustered"]
    assert violations == []


def test_the_static_check_catches_a_clustered_task_that_calls_a_task_through_a_helper():
    """The check is not vacuous: a task call hidden one helper deep is reported."""
    sources = {
        "envs.py": "cluster = ClusteredTaskEnvironment(name='c', replicas=2)\nplain = TaskEnvironment(name='p')",
        "tasks.py": (
            "@plain.task\nasync def score(x): return x\n"
            "async def helper(x): return await score(x)\n"
            "@cluster.task(retries=1)\nasync def step(x): return await helper(x)\n"
        ),
    }
    assert clustered_task_violations(sources) == (["step"], ["step -> score"])


def test_the_clustered_trainer_is_a_torchrun_jobset_restarted_as_a_whole():
    """The training-loop tutorial: replicas x nproc_per_node ranks under TorchRun; any pod failing restarts the whole
    set."""
    from flyte.clustered import ClusteredTaskTemplate, ClusterFailurePolicy, TorchRun

    from rl.deploy.flyte import clustered, envs

    task = clustered.train_step_clustered
    assert isinstance(task, ClusteredTaskTemplate)
    settings = task.plugin_config.settings
    assert isinstance(settings.runtime, TorchRun) and settings.replicas >= 2
    assert isinstance(settings.failure_policy, ClusterFailurePolicy) and settings.failure_policy.max_restarts >= 1
    driver_deps = {env.name for env in envs.grpo_clustered_driver_env.depends_on}
    assert envs.cluster_train_env.name in driver_deps and clustered.train_rl_clustered.report


@pytest.fixture
def flyte_local(tmp_path, monkeypatch):
    with isolated_flyte(tmp_path, monkeypatch) as local:
        yield local


@pytest.fixture(scope="module")
def pipelined_reference(tmp_path_factory) -> GrpoOutcome:
    config: GrpoRunConfig = CONFIG
    # A DDP rank runs the loss path its config names (`rl.trainer.ddp`), on its shard: with one rank, the whole batch,
    # so the one-process trainer runs the same computation, bit for bit.
    with open_run(tmp_path_factory.mktemp("reference"), command="test") as run:
        deployment = local_grpo(run, config.grpo, model=config.model.tiny, trainer=config.trainer)
        return asyncio.run(run_grpo(config.grpo, deployment.tiers, deployment.store))


def test_the_pipelined_driver_trains_one_step_stale_batches_on_the_clustered_trainer(
    flyte_local: LocalFlyte, pipelined_reference
):
    """The training-loop tutorial: batch N+1 comes from the adapter before N's; the DDP step (one rank here) trains it
    as one process does, bit for bit."""
    from rl.deploy.flyte.clustered import train_rl_clustered

    result = flyte_local.run(train_rl_clustered, config=CONFIG).output
    assert [row.iteration for row in result.history] == [0, 1, 2]
    assert [row.policy_version for row in result.history] == [1, 2, 3]
    assert [row.max_staleness for row in result.history] == [0, 1, 1]
    assert [row.max_staleness for row in pipelined_reference.history] == [0, 1, 1]
    assert result.adapter.hash == pipelined_reference.adapter.digest
    assert result.history == pipelined_reference.history


@pytest.mark.parametrize("tiers", ["cpu", "gpu", "stress"])
def test_every_clustered_pod_requests_disk_for_one_copy_of_its_base_model(tiers: str) -> None:
    """Each pod stores the base model once (local rank 0 downloads it); with no disk request Kubernetes may place the
    pod where 16 GB of bf16 8B weights do not fit, and evict it mid-download. A stress pod holds a float32 8B copy."""
    from rl.deploy.flyte.envs import sizing

    disk = sizing(tiers).cluster_pod.disk
    assert disk is not None
    if tiers == "stress":
        assert disk.endswith("Gi") and int(disk[:-2]) >= 33  # 8.2e9 parameters x 4 bytes, in GiB, rounded up


class _FakeBaseDir:
    """A `flyte.io.Dir` stand-in whose download writes one file, then fails if told to (a pod killed mid-download)."""

    def __init__(self, fail: bool) -> None:
        self.fail, self.downloads = fail, 0

    async def download(self, local_path: Path) -> str:
        self.downloads += 1
        Path(local_path).mkdir(parents=True)
        (Path(local_path) / "model-00001-of-00002.safetensors").write_bytes(b"part")
        if self.fail:
            raise OSError("connection reset mid-download")
        (Path(local_path) / "config.json").write_text("{}")
        return str(local_path)


def test_a_node_cache_copy_appears_only_complete_and_is_downloaded_once(tmp_path: Path) -> None:
    """A failed download leaves neither the model nor a partial copy where a retry would look; a finished one is
    renamed into place whole and found by the next call without downloading again."""
    from rl.deploy.flyte.clustered import _download_once

    target = tmp_path / "cache" / "digest"
    broken = _FakeBaseDir(fail=True)
    with pytest.raises(OSError, match="mid-download"):
        asyncio.run(_download_once(broken, target))  # type: ignore[arg-type]
    assert list((tmp_path / "cache").iterdir()) == []
    good = _FakeBaseDir(fail=False)
    asyncio.run(_download_once(good, target))  # type: ignore[arg-type]
    asyncio.run(_download_once(good, target))  # type: ignore[arg-type]
    assert good.downloads == 1
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "model-00001-of-00002.safetensors"]
