"""The package boundary: the wheel ships one top-level package, `rl`, which never imports the test doubles in
`fakes/`; and inside `rl` each layer imports only its own layer and those below it, so the production loop runs
with neither the simulator nor the suite installed in its head.

The layers are declared once, as import-linter contracts in pyproject.toml (`[tool.importlinter]`); `nox -s lint`
runs `lint-imports`, and so do these tests, on the tree and on a copy with planted violations. import-linter reads
`import` statements at any depth, relative ones included; a string naming an rl module (an
`importlib.import_module` target, a lazy table) is an import it cannot see, so `_dynamic_imports` holds those to
the same declared layers."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import setuptools
from parsed_sources import walked_source

ROOT = Path(__file__).resolve().parents[1]
CONTRACTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
LAYERS = next(c for c in CONTRACTS if c["id"] == "layers")
"""The `layers` contract: `LAYERS["layers"]` lists rl's children, highest layer first, siblings joined by `:`."""


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


_SCANS: dict[str, tuple[tuple[tuple[int, str], ...], tuple[tuple[int, str], ...]]] = {}


def _scan(text: str, filename: str) -> tuple[tuple[tuple[int, str], ...], tuple[tuple[int, str], ...]]:
    """(imports, string constants) of a module's source, each as (line, name): one parse per distinct source, so a
    copied tree (the planted checks below) parses only the files it changed. `filename` names a file that fails to
    parse (nothing is kept for it)."""
    if text not in _SCANS:
        _SCANS[text] = _scan_tree(walked_source(text, filename))
    return _SCANS[text]


def _scan_tree(nodes: tuple[ast.AST, ...]) -> tuple[tuple[tuple[int, str], ...], tuple[tuple[int, str], ...]]:
    imports: list[tuple[int, str]] = []
    strings: list[tuple[int, str]] = []
    for node in nodes:
        if isinstance(node, ast.Import):
            imports += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imports += [(node.lineno, node.module)]
            imports += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names if node.module == "rl"]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            strings.append((node.lineno, node.value))
    return tuple(imports), tuple(strings)


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every module `path` imports, at any depth (a function-level import crosses the boundary too)."""
    return list(_scan(path.read_text(), str(path))[0])


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


def _rl_modules(root: Path) -> set[str]:
    return {_module_name(path, root) for path in (root / "rl").rglob("*.py")}


def _layer(module: str) -> int:
    """The index of `module`'s layer in the declared contract (0 is the top: the command line)."""
    child = module.split(".")[1] if "." in module else module
    for index, layer in enumerate(LAYERS["layers"]):
        if child in (name.strip() for name in layer.split(":")):
            return index
    raise AssertionError(f"{module}: rl.{child} is in no layer of pyproject.toml's [tool.importlinter] contract")


def _dynamic_imports(root: Path) -> Iterator[tuple[str, int, str]]:
    """(importer, line, imported) for every string constant in rl/ that names an rl module, alone or as
    `module:attribute`: what `importlib.import_module`, lazy `__getattr__` tables and pytest plugins import."""
    modules = _rl_modules(root)
    for path in sorted((root / "rl").rglob("*.py")):
        for line, value in _scan(path.read_text(), str(path))[1]:
            name = value.partition(":")[0]
            if name in modules and name != "rl":
                yield _module_name(path, root), line, name


def _dynamic_violations(root: Path) -> list[str]:
    return [
        f"{importer} (line {line}) names {imported}, a layer above it"
        for importer, line, imported in _dynamic_imports(root)
        if importer.split(".")[:2] != imported.split(".")[:2] and _layer(imported) < _layer(importer)
    ]


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """import-linter's command line on the tree at `root` (its pyproject.toml and rl/), in a fresh interpreter so that
    the `rl` it analyses is `root`'s and not the one this test process imported."""
    command = [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()"]
    return subprocess.run([*command, "--no-cache"], cwd=root, capture_output=True, text=True, timeout=600)


def _copy_tree(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "rl", tmp_path / "rl", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def _plant(path: Path, after: str, line: str) -> None:
    text = path.read_text()
    assert after in text, f"{path}: the planting point {after!r} moved; update the test"
    path.write_text(text.replace(after, f"{after}{line}\n", 1))


def test_the_tree_keeps_every_import_contract() -> None:
    """Law: every `rl` module imports only its own and lower layers, Flyte code and the simulator stay apart, the
    drivers load no ML framework, nothing imports `fakes`, the engine (rl.durable) imports of rl only seeding, identity
    and errors, the modules of rl.durable, rl.deploy.simulated and rl.deploy.flyte form no circle, and the tier
    protocols never import the agentic domain."""
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.fixture(scope="module")
def planted_lint(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    """import-linter on one copy of the tree with every violation below planted: one run (a fresh interpreter, ~0.3
    CPU-s) serves the checks that read it, each for the violations it planted."""
    root = _copy_tree(tmp_path_factory.mktemp("planted"))
    # The layers: the driver importing the simulator by a relative import and the CPU deployment by an absolute one;
    # the tier protocols importing the agentic domain.
    grpo = root / "rl" / "loop" / "grpo.py"
    _plant(grpo, "from __future__ import annotations\n", "from ..durable import swarm  # noqa")
    _plant(grpo, "from __future__ import annotations\n", "import rl.deploy.local  # noqa")
    _plant(root / "rl" / "protocols.py", "from __future__ import annotations\n", "import rl.agentic.world  # noqa")
    # The forbidden contracts: a Flyte task module reaching for the simulator's worlds; the engine importing scoring.
    _plant(
        root / "rl" / "deploy" / "flyte" / "envs.py",
        "from __future__ import annotations\n",
        "import rl.deploy.simulated.worlds  # noqa",
    )
    _plant(root / "rl" / "durable" / "faults.py", "from __future__ import annotations\n", "import rl.scoring  # noqa")
    return _lint_imports(root)


def test_the_layer_check_sees_a_violation(planted_lint: subprocess.CompletedProcess[str]) -> None:
    """The check is live: in a copy of the tree, the driver importing the simulator by a relative import and the CPU
    deployment (which loads torch) by an absolute one is refused, each named, and so is the tier protocols importing
    the agentic domain (one layer of the main contract, so only its own contract orders them)."""
    result = planted_lint
    assert result.returncode != 0, result.stdout
    assert "rl.protocols -> rl.agentic.world" in result.stdout, result.stdout
    assert "rl.loop.grpo -> rl.durable.swarm" in result.stdout, result.stdout
    assert "rl.loop.grpo -> rl.deploy.local" in result.stdout, result.stdout


def test_the_forbidden_contracts_see_a_violation(planted_lint: subprocess.CompletedProcess[str]) -> None:
    """The forbidden contracts are live: a Flyte task module reaching for the simulator's in-memory worlds is refused,
    though both sit in one layer; so is the engine importing the scoring, a layer below it."""
    result = planted_lint
    assert result.returncode != 0, result.stdout
    assert "rl.deploy.flyte.envs -> rl.deploy.simulated.worlds" in result.stdout, result.stdout
    assert "rl.durable is not allowed to import rl.scoring" in result.stdout, result.stdout


def test_strings_naming_rl_modules_respect_the_layers() -> None:
    """Law: a module named by a string (`importlib.import_module`, a lazy table) is in its namer's layer or below."""
    assert list(_dynamic_imports(ROOT)), "no dynamic import found: the scanner no longer sees rl.cli's commands"
    assert _dynamic_violations(ROOT) == []


def test_the_string_check_sees_a_violation(tmp_path: Path) -> None:
    """The string check is live: `importlib.import_module("rl.durable.swarm")` planted in rl/algorithm/loss.py is
    refused."""
    root = _copy_tree(tmp_path)
    _plant(
        root / "rl" / "algorithm" / "loss.py",
        "from __future__ import annotations\n",
        'import importlib\n_S = importlib.import_module("rl.durable.swarm")',
    )
    line = (root / "rl" / "algorithm" / "loss.py").read_text().splitlines().index(
        '_S = importlib.import_module("rl.durable.swarm")'
    ) + 1
    assert _dynamic_violations(root) == [f"rl.algorithm.loss (line {line}) names rl.durable.swarm, a layer above it"]
