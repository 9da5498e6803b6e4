"""The report as a person sees it: headless chromium at a wide and a narrow window draws every chart, logs no
error, and puts nothing past the right edge (the old single wide figure cut its last chart off at 1300 px)."""

from __future__ import annotations

import pytest
from chromium import browser_context
from report_rows import MARKED_TASK, evals, rows

from rl.deploy.report import panels, render_report

pytestmark = pytest.mark.browser

HISTORY = rows(40, task=MARKED_TASK, completion="7" * 300 + " then a sentence with ordinary words")
EVALS = evals(40)

_LAYOUT = """() => {
  const width = window.innerWidth;
  const beyond = [];
  for (const el of document.querySelectorAll("*")) {
    const right = el.getBoundingClientRect().right;
    if (right > width + 0.5) beyond.push(`${el.tagName}.${el.getAttribute("class") || ""} right=${right}`);
  }
  const figures = [...document.querySelectorAll("figure.panel")].map((f) => {
    const svgs = f.querySelectorAll("svg");
    const box = svgs[0] ? svgs[0].getBoundingClientRect() : { width: 0, height: 0, top: -1 };
    return { key: f.dataset.panel, svgs: svgs.length, width: box.width, height: box.height, top: box.top };
  });
  return {
    width,
    scrollWidth: document.documentElement.scrollWidth,
    svgs: document.querySelectorAll("svg").length,
    beyond: beyond.slice(0, 10),
    figures,
  };
}"""


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    path = tmp_path_factory.mktemp("report") / "report.html"
    path.write_text(render_report(HISTORY, status="running", evals=EVALS, baseline_accuracy=0.1, title="GRPO + LoRA"))
    return path


@pytest.mark.parametrize(("width", "columns"), [(1300, 4), (700, 2), (400, 1)])
def test_every_chart_renders_inside_the_window_without_console_errors(report, width, columns):
    """One nonzero SVG per panel, no element's right edge past the viewport, no horizontal scroll, no error."""
    with browser_context(width) as context:
        page = context.new_page()
        errors: list[str] = []
        page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(report.as_uri())
        layout = page.evaluate(_LAYOUT)

    expected = [p.key for p in panels(HISTORY, EVALS, 0.1)]
    assert [f["key"] for f in layout["figures"]] == expected and len(expected) == 10
    assert layout["svgs"] == len(expected)
    for figure in layout["figures"]:
        assert figure["svgs"] == 1 and figure["width"] > 0 and figure["height"] > 0, figure
    assert errors == []
    assert layout["width"] == width
    assert layout["beyond"] == [] and layout["scrollWidth"] <= width
    first_row = [f for f in layout["figures"] if f["top"] == layout["figures"][0]["top"]]
    assert len(first_row) == columns  # the charts wrap to the window instead of overflowing it


_MARKUP = (
    '<img src=x onerror="document.body.dataset.pwned=1"><script>document.body.dataset.pwned=1</script>'
    '<svg onload="document.body.dataset.pwned=1"></svg>$\\foo{$'
)


def _markup_checkpoint_report(tmp_path) -> str:
    """The report a resume renders from a checkpoint whose every text field, dict key and name holds markup (its digest
    recomputed), plus markup the schema would refuse (a row's adapter_version, an evaluation's k) put straight into
    the report, which must escape it anyway."""
    import dataclasses
    import json

    from rl.identity import content_digest
    from rl.storage.checkpoint.format import DriverState, decode_state, encode_state
    from rl.types import ArtifactRef, EvalResult

    ref = ArtifactRef(uri=_MARKUP, digest=_MARKUP[:200])
    marked = [
        dataclasses.replace(
            r,
            sample_question=_MARKUP,
            sample_completion=_MARKUP,
            task_metrics={_MARKUP[:200]: 0.5, "accuracy": 0.5},
            extra={_MARKUP[:200]: 1.0},
            phase_s={_MARKUP[:200]: 1.0, "generate": 0.5},
        )
        for r in rows(3)
    ]
    state = dataclasses.replace(
        DriverState.initial(_MARKUP[:200], ref, ref),
        iteration=2,
        history=marked,
        evals=[EvalResult(1, 4, 0.5, 0.5, 8)],
        previous_adapter=ref,
        buffer_version=_MARKUP[:200],
        config={_MARKUP[:200]: _MARKUP},
    )
    doc = json.loads(encode_state(state))
    doc["digest"] = content_digest(doc["state"])
    loaded = decode_state(json.dumps(doc).encode())
    history = list(loaded.history)
    history[-1] = dataclasses.replace(history[-1], policy_version=_MARKUP)  # type: ignore[arg-type]
    evals = [*loaded.evals, EvalResult(2, _MARKUP, 0.5, 0.5, 8)]  # type: ignore[arg-type]
    return render_report(history, status=_MARKUP, evals=evals, baseline_accuracy=0.1, title=_MARKUP)


def test_a_report_from_a_checkpoint_full_of_markup_runs_no_script(tmp_path):
    """Chromium loads the report of a checkpoint whose every field holds markup: no script ran, no handler fired,
    no dialog opened, and the markup shows as text."""
    path = tmp_path / "report.html"
    path.write_text(_markup_checkpoint_report(tmp_path))
    with browser_context(1300) as context:
        page = context.new_page()
        dialogs: list[str] = []
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        page.goto(path.as_uri())
        page.wait_for_load_state("load")
        pwned = page.evaluate("() => document.body.dataset.pwned ?? null")
        scripts = page.evaluate("() => document.querySelectorAll('script, img, [onload], [onerror]').length")
        text = page.evaluate("() => document.body.innerText")
    assert pwned is None and dialogs == []
    assert scripts == 0
    assert "<script>document.body.dataset.pwned=1</script>" in text
