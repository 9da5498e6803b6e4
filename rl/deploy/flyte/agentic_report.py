"""The agentic driver's live report (`flyte.report`): a row per step, skipped trials, what the run could not show."""

from __future__ import annotations

import html

from rl.deploy.flyte.bindings import attempt_number
from rl.loop.agentic import AgenticConfig, SkippedTrial
from rl.types import StepResult


def render_agentic_report(
    history: list[StepResult],
    config: AgenticConfig,
    status: str,
    notes: list[str],
    skipped: list[SkippedTrial],
) -> str:
    """The driver's report: one row per step, the trials skipped, and what this mode could not show."""
    trials = config.trials_per_step
    rows = "".join(
        f"<tr><td>{h.step}</td><td>{h.n_trials}/{trials}</td><td>{h.mean_reward}</td><td>{h.mean_turns}</td>"
        f"<td>v{h.weights.version}</td></tr>"
        for h in history
    )
    skipped_html = "".join(f"<li>{html.escape(s.trial_id)} ({html.escape(s.stage)})</li>" for s in skipped)
    notes_html = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
    return (
        f"<h2>Agentic RL</h2><p>status: <b>{html.escape(status)}</b> · rubric {html.escape(config.rubric.name)} · "
        f"{config.n_steps} steps x {config.prompts_per_step} prompts x {config.n_samples} samples over "
        f"{config.n_worlds} worlds · driver attempt {attempt_number()}</p>"
        "<table><tr><th>step</th><th>trials</th><th>mean reward</th><th>mean turns</th><th>weights</th></tr>"
        f"{rows}</table>"
        + (f"<h3>Skipped trials</h3><ul>{skipped_html}</ul>" if skipped else "")
        + (f"<h3>Not exercised in this run</h3><ul>{notes_html}</ul>" if notes else "")
    )
