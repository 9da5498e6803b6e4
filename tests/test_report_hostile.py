"""The report shows values read from a run directory someone may send (the checkpoint's history: task-metric names,
samples, versions): every one goes through the report's one escaping rule. The tests below never list the fields the
report shows; they find them, by walking the fields of `IterationMetrics` and `EvalResult` and the text parameters of
`render_report`, put a hostile string into each, and check the page holds no markup, control character or long value
that was not the report's own."""

from __future__ import annotations

import dataclasses
import inspect
import math
import typing
import unicodedata
from dataclasses import replace
from html.parser import HTMLParser
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from report_rows import evals, rows

from rl.deploy import report
from rl.types import EvalResult, IterationMetrics

LONG = "A" * 3000
HOSTILE = '"><x-pwn a=1>&amp;</code></p><script>alert(1)</script>\x1b]0;title\x07\x1b[2J\u202e\r' + LONG
EXTREMES = (math.nan, math.inf, -math.inf, 1e308, -0.0, 2**62)


class _Markup(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: set[str] = set()
        self.attributes: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.attributes.update(name for name, _ in attrs)

    def handle_endtag(self, tag: str) -> None:
        self.tags.add(tag)


def _markup(page: str) -> _Markup:
    parser = _Markup()
    parser.feed(page)
    parser.close()
    return parser


def _hostile(value: Any, text: str, *, numbers: bool) -> Any:
    """`value` with `text` put wherever the report could print it: a string replaced, a dict given a hostile key (and
    hostile values too when `numbers`), a number replaced when `numbers` (the report escapes whatever the type)."""
    if isinstance(value, dict):
        return {**(dict.fromkeys(value, text) if numbers else value), text: text if numbers else 0.5}
    return text


def _hostile_row(row: IterationMetrics, text: str, *, numbers: bool) -> IterationMetrics:
    """Every field of `row` made hostile: text fields and dict keys always, number fields too when `numbers`."""
    changes = {}
    for f in dataclasses.fields(row):
        value = getattr(row, f.name)
        if isinstance(value, str | dict) or numbers:
            changes[f.name] = _hostile(value, f"{f.name}{text}", numbers=numbers)
    return replace(row, **changes)


def _text_parameters() -> list[str]:
    """The keyword parameters of `render_report` that are text (the title, the status)."""
    hints = typing.get_type_hints(report.render_report)
    return [n for n, p in inspect.signature(report.render_report).parameters.items() if hints.get(n) is str]


def _assert_inert(page: str, benign: str) -> None:
    found, allowed = _markup(page), _markup(benign)
    assert found.tags <= allowed.tags, f"markup from a value: {sorted(found.tags - allowed.tags)}"
    assert found.attributes <= allowed.attributes, f"attributes from a value: {found.attributes - allowed.attributes}"
    hidden = sorted({repr(c) for c in page if c not in "\n\t" and unicodedata.category(c) in ("Cc", "Cf")})
    assert not hidden, f"control characters reached the page: {hidden}"
    assert LONG[:1000] not in page, "a long value was not cut"
    assert "&lt;x-pwn" in page, "no hostile value reached the page: the test put them nowhere it shows"


def test_the_fields_found_cover_what_the_report_shows() -> None:
    """The walk finds the names, values, samples and versions (so the tests below are not vacuous)."""
    rows, evaluations = ({f.name for f in dataclasses.fields(kind)} for kind in (IterationMetrics, EvalResult))
    assert {"task_metrics", "sample_completion", "policy_version"} <= rows and {"policy_version", "k"} <= evaluations
    assert {"title", "status"} <= set(_text_parameters())


def test_every_field_in_the_status_line_and_samples_is_escaped_whatever_its_type() -> None:
    """docs/guarantees.md: "Every value the report shows goes through one escaping rule": a task metric's name (or
    any field: a version, a count, a sample) holding markup, escape sequences or a megabyte is shown as cut, visible
    text in the status line and the samples table."""
    history = rows(3, phases=True)
    benign = report._status(history, evals(5), "running") + report._samples_table(history)
    hostile = [_hostile_row(r, HOSTILE, numbers=True) for r in history]
    evaluation = replace(evals(5)[0], **{f.name: f"{f.name}{HOSTILE}" for f in dataclasses.fields(EvalResult)})
    page = report._status(hostile, [evaluation], f"status{HOSTILE}") + report._samples_table(hostile)
    _assert_inert(page, benign)


@settings(max_examples=25, deadline=None)
@given(text=st.text(st.characters(codec="utf-8") | st.sampled_from("<>&\"'\x1b\u202e\x00"), min_size=1))
def test_a_drawn_string_in_any_field_never_becomes_markup(text: str) -> None:
    """Hypothesis draws the string; the walk puts it into every field of the last row and the latest evaluation."""
    history = rows(2)
    benign = report._status(history, evals(5), "running") + report._samples_table(history)
    marked = f"<x-pwn>{text}{LONG}"
    history[-1] = _hostile_row(history[-1], marked, numbers=True)
    evaluation = replace(evals(5)[0], **{f.name: marked for f in dataclasses.fields(EvalResult)})
    page = report._status(history, [evaluation], marked) + report._samples_table(history)
    _assert_inert(page, benign)


@pytest.mark.heavy
def test_the_whole_page_escapes_every_text_field_chart_titles_included() -> None:
    """The full page (charts too: a task metric's name is a chart title) with every text field, dict key and text
    parameter hostile and every number extreme (NaN, infinities, 2**62): no markup, no control character, nothing
    long, and the page still renders."""
    history = rows(3)
    benign = report.render_report(history, status="running", evals=evals(5))
    hostile = [_hostile_row(r, HOSTILE, numbers=False) for r in history]
    numeric = [f.name for f in dataclasses.fields(IterationMetrics) if isinstance(getattr(history[-1], f.name), float)]
    hostile[-1] = replace(hostile[-1], **{n: EXTREMES[i % len(EXTREMES)] for i, n in enumerate(numeric)})
    text = {name: f"{name}{HOSTILE}" for name in _text_parameters()}
    page = report.render_report(hostile, evals=evals(5), **text)  # type: ignore[arg-type]
    _assert_inert(page, benign)
