"""What the libraries that read a model directory print, escaped as the `rl` command's own output is.

transformers names tensors, files and keys of the directory it loads in its log (its load report lists every
unexpected tensor by name), and a name is the directory's choice: escape sequences in it would reach the terminal
raw. While a command runs (`rl.cli.main`), every log record of `LIBRARIES` and every warning goes through
`rl.errors.shown` (control characters as escapes), line by line, each line and the line count cut.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from typing import Any

from rl.errors import shown

__all__ = ["LIBRARIES", "escaped", "escaped_library_output"]

LIBRARIES = frozenset({"transformers", "tokenizers", "huggingface_hub", "safetensors", "peft", "vllm"})
LINE_CHARS = 300
MAX_LINES = 60


def escaped(message: str) -> str:
    """`message` safe for a terminal: each line through `shown` (cut to `LINE_CHARS`), at most `MAX_LINES` lines."""
    lines = message.split("\n")
    kept = [shown(line, LINE_CHARS) for line in lines[:MAX_LINES]]
    if len(lines) > MAX_LINES:
        kept.append(f"… ({len(lines) - MAX_LINES} more lines)")
    return "\n".join(kept)


@contextlib.contextmanager
def escaped_library_output() -> Iterator[None]:
    """Within: the log records of `LIBRARIES` (whatever handler prints them) and all warnings are `escaped`."""
    make_record = logging.getLogRecordFactory()
    show_warning = warnings.showwarning

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make_record(*args, **kwargs)
        if record.name.partition(".")[0] in LIBRARIES:
            with contextlib.suppress(Exception):  # a malformed record: logging reports it as it would have
                record.msg, record.args = escaped(record.getMessage()), None
        return record

    def showwarning(
        message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None
    ) -> None:
        show_warning(escaped(str(message)), category, shown(filename), lineno, file, line)

    logging.setLogRecordFactory(factory)
    warnings.showwarning = showwarning
    try:
        yield
    finally:
        if logging.getLogRecordFactory() is factory:
            logging.setLogRecordFactory(make_record)
        if warnings.showwarning is showwarning:
            warnings.showwarning = show_warning
