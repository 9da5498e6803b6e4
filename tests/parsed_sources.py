"""One parse per source file per test process: the static scans of rl/ and fakes/ (layering, platform imports, strict
JSON, docstring length) each walked every module's tree, parsing the package three or four times per worker."""

from __future__ import annotations

import ast
import functools
from pathlib import Path


@functools.cache
def _walked(text: str, filename: str) -> tuple[ast.AST, ...]:
    return tuple(ast.walk(ast.parse(text, filename)))


def walked(path: Path) -> tuple[ast.AST, ...]:
    """Every node of `path`'s tree, in `ast.walk` order; shared between scans, so read them, never change them.
    Keyed by the text read now: a file edited during the run is parsed again."""
    return _walked(path.read_text(encoding="utf-8"), str(path))


def walked_source(text: str, filename: str) -> tuple[ast.AST, ...]:
    """`walked` for source text already read."""
    return _walked(text, filename)


def parsed(path: Path) -> ast.Module:
    """`path`'s module tree (the root `walked` starts from); shared, so read it, never change it."""
    root = walked(path)[0]
    assert isinstance(root, ast.Module)
    return root
