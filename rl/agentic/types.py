"""The agentic loop's data: `Weights`, `WorldRef`, `TrialSpec`, `Turn`, `Trajectory`, `Rubric`, `Reward`, `StepResult`,
`TrainerInfo`. They are defined in `rl.types` (`rl.protocols` names them and sits below `rl.agentic`); this module keeps
the names importable from here."""

from __future__ import annotations

from rl.types import Reward, Rubric, StepResult, TrainerInfo, Trajectory, TrialSpec, Turn, Weights, WorldRef

__all__ = ["Reward", "Rubric", "StepResult", "TrainerInfo", "Trajectory", "TrialSpec", "Turn", "Weights", "WorldRef"]
