"""Front doors: `nox -s unit` (all CPU tests), `nox -s lint`, `nox -s gpu`, and the rest below.

CPU sessions install torch through constraints/cpu.txt (the CPU wheel, not a multi-GB CUDA build) and check that they
got it. Virtualenvs are made and filled by uv when nox can find it (`pip install 'nox[uv]'`), else by virtualenv and
pip; they are reused between runs (`nox -R` skips the install step entirely).
"""

from __future__ import annotations

import os
from pathlib import Path

import nox

nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["unit", "lint"]
nox.options.default_venv_backend = "uv|virtualenv"

CPU_CONSTRAINTS = ("-c", "constraints/cpu.txt")
HYPOTHESIS_ENV = {"HYPOTHESIS_PROFILE": os.environ.get("HYPOTHESIS_PROFILE", "dev"), "HF_HUB_OFFLINE": "1"}
TORCH_CPU_INDEX = os.environ.get("RL_TORCH_CPU_INDEX", "https://download.pytorch.org/whl/cpu")
"""Where the pinned CPU torch comes from when no local find-links directory holds it (PyPI's Linux torch is the CUDA
build); `RL_TORCH_CPU_INDEX=` (empty) adds no index, for a mirror already configured in pip or uv."""


def _cpu_torch_source(session: nox.Session) -> list[str]:
    """Installer arguments that make the pinned `torch==X+cpu` findable: a `PIP_FIND_LINKS` directory holding that
    wheel (passed explicitly, since uv ignores pip's configuration), else PyTorch's CPU index. The index is added only
    when needed: where it is unreachable an installer would query it for every package."""
    pin = next(line for line in Path("constraints/cpu.txt").read_text().splitlines() if line.startswith("torch=="))
    wheel = f"torch-{pin.removeprefix('torch==')}-*.whl"
    for directory in os.environ.get("PIP_FIND_LINKS", "").split():
        if Path(directory).is_dir() and any(Path(directory).glob(wheel)):
            return ["--find-links", directory]
    if not TORCH_CPU_INDEX:
        return []
    # uv's default takes each package from the first index that has it; best-match is pip's behaviour.
    uv_only = ["--index-strategy", "unsafe-best-match"] if session.venv_backend == "uv" else []
    return ["--extra-index-url", TORCH_CPU_INDEX, *uv_only]


def _uv_compile(session: nox.Session) -> list[str]:
    """`--compile-bytecode` for uv where Python may not cache bytecode (PYTHONDONTWRITEBYTECODE set). pip byte-compiles
    what it installs, uv leaves it to the first import, which caches it; without that cache every test process would
    compile torch, transformers and peft again (importing them and flyte took 9.3 s instead of 4.9 s here)."""
    return ["--compile-bytecode"] if session.venv_backend == "uv" and os.environ.get("PYTHONDONTWRITEBYTECODE") else []


def _install_cpu(session: nox.Session, *extras: str, editable: bool = True) -> None:
    spec = f".[{','.join(('test', *extras))}]"
    source = (*_cpu_torch_source(session), *_uv_compile(session))
    session.install(*CPU_CONSTRAINTS, *source, *(["-e"] if editable else []), spec)
    _check_cpu_torch(session)


def _check_cpu_torch(session: nox.Session) -> None:
    """Fail the session, saying what to do, if the installed torch is a CUDA build."""
    out = session.run_install("python", "-c", "import torch; print(torch.__version__, torch.version.cuda)", silent=True)
    if out is None:  # nox -R: nothing was installed, nothing to check
        return
    version, cuda = out.strip().splitlines()[-1].split()
    if cuda != "None":
        session.error(
            f"torch {version} is a CUDA build (CUDA {cuda}); CPU sessions need the CPU wheel constraints/cpu.txt pins. "
            f"Remove {session.virtualenv.location} and run nox again where {TORCH_CPU_INDEX or 'your torch index'} "
            "(or a PIP_FIND_LINKS directory holding that wheel) is reachable"
        )
    session.log(f"torch {version}: the CPU build")


@nox.session
def unit(session: nox.Session) -> None:
    """All fast CPU tests: math properties, simulator, drivers, chaos, real tiny-model parts.

    Runs on one pytest-xdist worker per CPU core, at most 4 (each worker imports torch and collects the suite; `-- -n 0`
    runs in one process, for `--pdb`). `nox -s unit -- --with-flyte` also runs the Flyte local-mode tests (what
    `nox -s integration` runs on its own).
    """
    _install_cpu(session)
    args = list(session.posargs)
    skipped = ["gpu", "slow", "ray"] + ([] if "--with-flyte" in args else ["flyte"])
    args = [a for a in args if a != "--with-flyte"]
    workers = ("-n", "auto", "--maxprocesses", "4", "--dist", "worksteal")
    session.run("pytest", *workers, "-m", " and ".join(f"not {m}" for m in skipped), *args, env=HYPOTHESIS_ENV)


@nox.session
def slow(session: nox.Session) -> None:
    """Multi-process DDP on gloo and the learning test: minutes, not seconds."""
    _install_cpu(session)
    session.run("pytest", "-m", "slow", *session.posargs, env=HYPOTHESIS_ENV)


@nox.session
def integration(session: nox.Session) -> None:
    """The Flyte tasks in Flyte's real local mode (`flyte`-marked tests): both loops end to end on the tiny model."""
    _install_cpu(session)
    session.run("pytest", "-m", "flyte", *session.posargs, env=HYPOTHESIS_ENV)


@nox.session
def ray(session: nox.Session) -> None:
    """The detached Ray trainer actor against a real local Ray (`ray.init` on this machine)."""
    _install_cpu(session, "ray")
    session.run("pytest", "-m", "ray", *session.posargs, env=HYPOTHESIS_ENV)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check, ruff format --check, mypy on rl/."""
    _install_cpu(session, "lint")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")


@nox.session
def demo(session: nox.Session) -> None:
    """The GRPO demo: a tiny offline model learns a prompt-dependent task on the CPU (~1-2 min), report in runs/."""
    _install_cpu(session)
    session.run("rl", "demo", "grpo", *(session.posargs or ["--fresh"]), env=HYPOTHESIS_ENV)


@nox.session
def chaos(session: nox.Session) -> None:
    """1,000 seeded fault scenarios per loop (GRPO, pipelined GRPO, agentic) plus a kill-at-every-point sweep."""
    _install_cpu(session)
    seeds = session.posargs[0] if session.posargs else "1000"
    for loop in ("grpo", "grpo-pipelined", "agentic"):
        session.run("rl", "chaos", "--loop", loop, "--seeds", seeds, env=HYPOTHESIS_ENV)


@nox.session
def conformance(session: nox.Session) -> None:
    """The conformance suite as a fork runs it: the installed package, from a temporary directory outside the repo (so
    neither our conftest.py nor our pytest settings leak in), against our fakes and the real CPU stack."""
    import tempfile

    _install_cpu(session, editable=False)
    repo = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="rl-conformance-") as tmp:
        session.chdir(tmp)
        try:
            for impl in ("fakes.conformance_impl:FAKES", "fakes.conformance_impl:REAL_CPU"):
                suite = ("--pyargs", "rl.conformance.test_suite", "--rl-impl", impl, "-p", "no:cacheprovider")
                session.run("pytest", *suite, *session.posargs, env=HYPOTHESIS_ENV)
        finally:
            session.chdir(repo)


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks printed side by side: simulator replay, chaos scenario rate, pipelining on the virtual clock."""
    _install_cpu(session)
    session.run("rl", "bench", *session.posargs, env=HYPOTHESIS_ENV)


@nox.session
def gpu(session: nox.Session) -> None:
    """Real vLLM, CUDA LoRA training and multi-GPU DDP. Needs a CUDA machine; vllm brings its own torch.

    RL_GPU_STRICT=1: a missing CUDA or vllm fails the run instead of skipping every test (a green job that tested
    nothing); fewer GPUs than a test needs still skips it.
    """
    session.install("-e", ".[test,gpu]")
    env = {**HYPOTHESIS_ENV, "RL_GPU_STRICT": "1"}
    session.run("pytest", "gpu_tests", "-m", "gpu", *session.posargs, env=env)
