"""The protocols of `rl.protocols` on Flyte's own primitives, for code running inside a Flyte task.

- `DirArtifacts` (`Artifacts`): each artifact is a `flyte.io.Dir` in the run's raw-data store. `ArtifactRef.uri` is the
  Dir's path and `ArtifactRef.digest` its content digest (`rl.storage.artifacts.compute_digest`), which also travels as
  the Dir's `hash` so a cached task's key follows the content. `get` reads a private copy and re-hashes it.
- `FlyteReporter` (`Reporter`): publishes `rl.deploy.report.render_report` by `flyte.report.replace` each iteration.

The `CheckpointStore` on Flyte (the driver's checkpoint) is `rl.deploy.flyte.checkpoint_store`.

Local mode differs from a cluster in one way that matters here: a local `Dir` is the producer's own path, not a copy.
`DirArtifacts.put` therefore always copies into a fresh directory under the task's raw-data path, and `get` returns
bytes, so no consumer can mutate a producer's files.
"""

from __future__ import annotations

import html
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import flyte
import flyte.report
from flyte.io import Dir
from flyte.models import TaskContext

from rl.deploy.report import render_report
from rl.errors import ArtifactCorruptError, ArtifactNotFoundError, NotInATaskError
from rl.storage.artifacts import compute_digest, read_dir, validate_files, write_files
from rl.types import ArtifactRef, EvalResult, IterationMetrics


def task_context() -> TaskContext:
    ctx = flyte.ctx()
    if ctx is None:
        raise NotInATaskError("this runs inside a Flyte task (flyte.ctx() is None); call it from a task body")
    return ctx


def is_local() -> bool:
    """Whether the running task is in Flyte's local mode (no replay, no trace memo, no rerun, no attempt number)."""
    ctx = flyte.ctx()
    return ctx is None or ctx.mode == "local"


def attempt_number() -> int:
    """This task attempt's number (`FLYTE_ATTEMPT_NUMBER`); always 0 in local mode."""
    return int(os.environ.get("FLYTE_ATTEMPT_NUMBER", "0"))


def dir_of(ref: ArtifactRef) -> Dir:
    """The `flyte.io.Dir` an artifact ref names, carrying its digest as the Dir's hash."""
    return Dir.from_existing_remote(ref.uri, dir_cache_key=ref.digest)


def ref_of(directory: Dir) -> ArtifactRef:
    """The artifact ref of a Dir produced by `DirArtifacts` (its hash is the content digest)."""
    if not directory.hash:
        raise ValueError(
            f"the directory {directory.path} carries no content digest; pass a Dir produced by DirArtifacts "
            "(or by a task of rl.deploy.flyte), not one made with Dir.from_local or from_existing_remote"
        )
    return ArtifactRef(uri=directory.path, digest=directory.hash)


async def upload_dir(path: Path, name: str) -> Dir:
    """Copy the directory `path` into a fresh location in the task's raw-data store; its hash is its content digest."""
    digest = compute_digest(read_dir(path))
    destination = task_context().raw_data_path.get_random_remote_path(name)
    return await Dir.from_local(path, remote_destination=destination, dir_cache_key=digest)


class DirArtifacts:
    """`Artifacts` on `flyte.io.Dir`: put uploads a copy, get downloads a verified private copy."""

    async def put(self, files: Mapping[str, bytes], *, name: str) -> ArtifactRef:
        checked = validate_files(files)
        with tempfile.TemporaryDirectory(prefix="rl-put-") as tmp:
            staging = Path(tmp) / name
            write_files(checked, staging)
            directory = await upload_dir(staging, name)
        return ArtifactRef(uri=directory.path, digest=compute_digest(checked))

    async def get(self, ref: ArtifactRef) -> dict[str, bytes]:
        directory = Dir.from_existing_remote(ref.uri)
        if not await directory.exists():
            raise ArtifactNotFoundError(
                f"no artifact at {ref.uri} (digest {ref.digest}); it was deleted or never written"
            )
        local = Path(await directory.download())
        try:
            files = read_dir(local)
        finally:
            if local != Path(ref.uri):  # a downloaded copy, not the artifact itself (local mode reads in place)
                shutil.rmtree(local, ignore_errors=True)
        actual = compute_digest(files)
        if actual != ref.digest:
            raise ArtifactCorruptError(f"artifact at {ref.uri} hashes to {actual}, not {ref.digest}: it was changed")
        return files

    async def exists(self, ref: ArtifactRef) -> bool:
        return bool(await Dir.from_existing_remote(ref.uri).exists())


def quiet_transformers() -> None:
    """No per-load progress bars from transformers in task logs (they would bury the task's own lines)."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()


_BASES: dict[tuple[str, str | None], Path] = {}


async def check_base(base: Dir) -> None:
    """Refuse a base model directory that cannot load (`rl.models.model_dir`: config, weights single or sharded with
    every shard present, tokenizer) from its listing and its three small JSON files, downloading no weights: a run on an
    incomplete prefetch fails in its driver, in one line, before any GPU task starts."""
    from rl.errors import ModelDirError
    from rl.models.model_dir import CONFIG_FILE, INDEX_FILE, TOKENIZER_CONFIG, check_model_listing

    if not await base.exists():
        raise ModelDirError(f"model directory {base.path} does not exist; prefetch the model (flyte prefetch hf-model)")
    files = {Path(f.path).name: f for f in await base.list_files()}
    texts: dict[str, str] = {}
    for name in (CONFIG_FILE, INDEX_FILE, TOKENIZER_CONFIG):  # the small JSON files check_model_listing reads
        if name in files:
            async with files[name].open("rb") as handle:
                texts[name] = bytes(await handle.read()).decode("utf-8", errors="replace")
    check_model_listing(base.path, list(files), texts.__getitem__, weights=True, tokenizer=True)


async def local_base(base: Dir) -> Path:
    """A local directory holding the base model `base`: downloaded once per process (a warm replica keeps it)."""
    quiet_transformers()
    key = (base.path, base.hash)
    cached = _BASES.get(key)
    if cached is None or not cached.is_dir():
        cached = _BASES[key] = Path(await base.download())
    return cached


class FlyteReporter:
    """`Reporter` publishing `rl.deploy.report.render_report` to the task's report (`report=True`) after every
    iteration.

    `notes` are shown under the title. A first publication that already has history means this attempt resumed from
    a checkpoint; the report says so.
    """

    def __init__(self, *, title: str, baseline_accuracy: float | None = None, notes: Sequence[str] = ()) -> None:
        self.title, self.baseline_accuracy, self.notes = title, baseline_accuracy, list(notes)
        self.publications = 0

    async def publish(
        self, history: Sequence[IterationMetrics], *, status: str, evals: Sequence[EvalResult] = ()
    ) -> None:
        if self.publications == 0 and history:
            self.notes.append(
                f"resumed from the checkpoint after iteration {history[-1].iteration} (driver attempt "
                f"{attempt_number()}): iterations 0-{history[-1].iteration} were not re-run"
            )
        self.publications += 1
        page = render_report(
            history, status=status, evals=evals, baseline_accuracy=self.baseline_accuracy, title=self.title
        )
        notes = "".join(f"<li>{html.escape(note)}</li>" for note in self.notes)
        if notes:
            page = page.replace("</h2>", f"</h2><ul>{notes}</ul>", 1)
        await flyte.report.replace.aio(page, do_flush=True)
