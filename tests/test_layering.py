"""The package boundary: the wheel ships one top-level package, `rl`, which never imports the test doubles in
`fakes/`; and inside `rl` each layer imports only its own layer and those below it, so the production loop runs
with neither the simulator nor the suite installed in its head."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest
import setuptools

ROOT = Path(__file__).resolve().parents[1]

LAYERS: dict[str, int] = {
    "rl.memory": 1,
    "rl.sim": 1,
    "rl.flyte": 1,
    "rl.conformance": 2,
    "rl.bench": 2,
    "rl.commands": 3,
    "rl.cli": 3,
}
"""Every other `rl` module is the core (layer 0): the domain code, protocols, drivers, engines and trainers. The
simulator, the in-memory backends and the Flyte tasks (layer 1) build on the core; the suite (2) on them, and so do
the benchmarks (2), since `rl bench` times the simulator's chaos scenarios beside the real stack; the command line (3)
on everything."""

FORBIDDEN_PAIRS = {("rl.flyte", "rl.sim"), ("rl.flyte", "rl.memory"), ("rl.sim", "rl.flyte"), ("rl.memory", "rl.flyte")}
"""Within layer 1: production Flyte code never runs on the simulator's fakes, and the simulator never needs Flyte."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every module `path` imports, at any depth (a function-level import crosses the boundary too)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.lineno, node.module)]
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names if node.module == "rl"]
    return found


def _group(module: str) -> str:
    return next((g for g in LAYERS if module == g or module.startswith(g + ".")), "core")


def _layer(module: str) -> int:
    return LAYERS.get(_group(module), 0)


def test_the_wheel_installs_rl_and_nothing_else_at_top_level() -> None:
    """`pip install` of this project adds `rl` to site-packages and no generic name (`fakes`, `tests`) that another
    project's package of the same name would clash with."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    packages = setuptools.find_packages(str(ROOT), include=config["include"], exclude=config.get("exclude", ()))
    assert "rl" in packages
    assert {p.split(".")[0] for p in packages} == {"rl"}, f"the wheel would install {sorted(packages)}"


def test_the_wheel_ships_every_rl_package() -> None:
    """A directory of modules under rl/ without an __init__.py would be left out of the wheel silently."""
    for directory in (ROOT / "rl").rglob("*"):
        if directory.is_dir() and any(directory.glob("*.py")):
            assert (directory / "__init__.py").exists(), f"{directory.relative_to(ROOT)} lacks __init__.py"


RL_MODULES = sorted((ROOT / "rl").rglob("*.py"))


@pytest.mark.parametrize("path", RL_MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_rl_never_imports_fakes(path: Path) -> None:
    bad = [f"line {line}: {name}" for line, name in _imports(path) if name == "fakes" or name.startswith("fakes.")]
    assert not bad, f"{path.relative_to(ROOT)} imports the test doubles, which the wheel does not ship: {bad}"


@pytest.mark.parametrize("path", RL_MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_each_rl_layer_imports_only_its_own_and_lower_layers(path: Path) -> None:
    """Law: the core never imports the simulator, the memory backends, Flyte tasks, the suite or the CLI; Flyte tasks
    never import the simulator; the suite never imports the CLI."""
    me = _module_name(path)
    bad = [
        f"line {line}: {name} (layer {_layer(name)} {_group(name)})"
        for line, name in _imports(path)
        if name.startswith("rl.")
        and _group(name) != _group(me)
        and (_layer(name) > _layer(me) or (_group(me), _group(name)) in FORBIDDEN_PAIRS)
    ]
    assert not bad, f"{me} (layer {_layer(me)} {_group(me)}) imports from above it: {bad}"


def test_the_layer_check_sees_a_violation() -> None:
    """The check is live: a core module that imported the simulator would be caught."""
    assert _layer("rl.sim.durable_sim") > _layer("rl.loop.grpo")
    assert ("rl.flyte", "rl.sim") in FORBIDDEN_PAIRS and _group("rl.flyte.grpo") == "rl.flyte"
    assert _layer("rl.bench.sim") > _layer("rl.sim.chaos") and _layer("rl.bench.cpu") > _layer("rl.loop.grpo")
