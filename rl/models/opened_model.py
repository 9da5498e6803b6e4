"""A model directory opened and checked once, at a command's door; every loader below takes the `ModelDir` it returns.

`open_model` checks the directory's listing (`rl.models.model_dir.check_model_dir`) and reads every file a load reads
through the checked opener (`rl.models.model_files.open_model_dir`): the small files' bytes, and the weights' open
descriptors with their checked headers. The `ModelDir` it returns holds them, and every loader (the tokenizer, the
base model, the samplers, the trainer, vLLM) loads from a private copy of what it holds (`ModelDir.staged`), never from
the directory by path: a file swapped in the directory after the door's check is never loaded. A `ModelDir` is made
only here, so a loader cannot be handed an unchecked path (it raises `TypeError`). A process that gets the directory by
path (a Flyte task, a DDP rank) opens its own at its entry. docs/guarantees.md says what a model directory may do.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NoReturn

from rl.models.model_files import CheckedModelDir, open_model_dir, stage_files

__all__ = ["ModelDir", "checked_model", "open_model"]

_OPENER = object()  # what only this module passes to ModelDir


class _Held:
    """What one `open_model` read, shared by a `ModelDir` and its `absolute` twin; the weights close with it."""

    def __init__(self, checked: CheckedModelDir) -> None:
        self.checked = checked
        self.consistent: set[tuple[bool, int]] = set()  # (weights, dtype_bytes) that passed check_model_files
        self.closed = False
        weakref.finalize(self, checked.close)


class ModelDir:
    """A model directory that passed its checks, holding what they read (`open_model`).

    `where` is the directory as messages name it; `weights` and `tokenizer` say what was opened and checked. `str()`
    gives `where`, so messages read as before; there is no `os.fspath`, so it is never reopened by path."""

    __slots__ = ("_held", "tokenizer", "weights", "where")

    def __init__(self, where: Path, held: _Held, *, weights: bool, tokenizer: bool, opener: object) -> None:
        if opener is not _OPENER:
            raise TypeError(
                "a ModelDir is made by rl.models.opened_model.open_model, which checks the directory and holds the "
                "files it checked"
            )
        self.where, self._held, self.weights, self.tokenizer = where, held, weights, tokenizer

    def __repr__(self) -> str:
        return f"ModelDir({str(self.where)!r}, weights={self.weights}, tokenizer={self.tokenizer})"

    def __str__(self) -> str:
        return str(self.where)

    def __reduce__(self) -> NoReturn:
        raise TypeError(
            "a ModelDir holds this process's open files: pass its path to the other process and open it there with "
            "rl.models.opened_model.open_model"
        )

    def absolute(self) -> ModelDir:
        """This opened directory named by its absolute path (what a run records), holding the same checked files."""
        return ModelDir(
            self.where.absolute(), self._held, weights=self.weights, tokenizer=self.tokenizer, opener=_OPENER
        )

    def json(self, name: str) -> Any:
        """The parsed JSON file `name` as the door read it (None when absent)."""
        return self._view(weights=False).json(name)

    def checked_files(self, *, weights: bool = True, dtype_bytes: int = 4) -> CheckedModelDir:
        """What the door read, named by `where`, once `check_model_files` passed on it at `dtype_bytes` a parameter
        (run once per `dtype_bytes`: its memory budget depends on it); without `weights`, the small files alone."""
        from rl.models.model_checks import check_model_files

        view = self._view(weights)
        key = (weights, dtype_bytes if weights else 0)
        if key not in self._held.consistent:
            check_model_files(view, dtype_bytes=dtype_bytes)
            self._held.consistent.add(key)
        return view

    @contextlib.contextmanager
    def staged(self, *, weights: bool = True, dtype_bytes: int = 4) -> Iterator[Path]:
        """A private directory holding what the door read (`checked_files`), for a loader in this process or its
        children to read by path; removed after the block."""
        with stage_files(self.checked_files(weights=weights, dtype_bytes=dtype_bytes)) as stage:
            yield stage

    def close(self) -> None:
        """Close the weights' descriptors (this and its `absolute` twin); the small files' bytes stay readable."""
        self._held.closed = True
        self._held.checked.close()

    def __enter__(self) -> ModelDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _view(self, weights: bool) -> CheckedModelDir:
        held = self._held
        if weights and not self.weights:
            raise TypeError(f"{self!r} was opened without its weights: open it with open_model(..., weights=True)")
        if weights and held.closed:
            raise ValueError(f"{self!r} is closed: its weights' descriptors are gone")
        return CheckedModelDir(self.where, held.checked.files, held.checked.weights if weights else {})


def open_model(
    model_dir: Path, *, weights: bool = True, tokenizer: bool = True, expect: Mapping[str, object] | None = None
) -> ModelDir:
    """Open and check `model_dir` once (`ModelDirError`, `ModelFileError` in one line when it cannot be loaded): its
    listing, with `weights` its config (equal to `expect` where given) and weights and with `tokenizer` its
    tokenizer's files, then every file a load reads through the checked opener (`ModelFileError`). Close the result
    (or use it as a context manager) to release the weights."""
    checked = open_model_dir(Path(model_dir), weights=weights, tokenizer=tokenizer, expect=expect)
    return ModelDir(checked.where, _Held(checked), weights=weights, tokenizer=tokenizer, opener=_OPENER)


def checked_model(model: object, *, weights: bool = False, tokenizer: bool = False) -> ModelDir:
    """`model` if it is a `ModelDir` opened with (at least) `weights` and `tokenizer`; a `TypeError` otherwise (a
    plain path would skip the door's checks)."""
    if not isinstance(model, ModelDir):
        raise TypeError(
            f"expected a ModelDir from rl.models.opened_model.open_model, got {type(model).__name__}: a plain path "
            "skips the model directory's checks"
        )
    if (weights and not model.weights) or (tokenizer and not model.tokenizer):
        raise TypeError(f"{model!r} was opened without the {'weights' if weights else 'tokenizer'} a load here reads")
    return model
