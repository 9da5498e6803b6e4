"""Real GRPO implementations, installed from the registry at pinned versions, bound for the conformance suite.

Each module binds one library's own installed functions as an `rl.conformance.Implementation` named `IMPL`, through
thin adapters that only change shapes and arguments (no formula is written):

- `peers.trl_grpo`: TRL's `GRPOTrainer` (advantages and loss), `nox -s "peers(peer='trl')"`.
- `peers.verl_grpo`: verl's `compute_grpo_outcome_advantage` and actor `ppo_loss`, `nox -s "peers(peer='verl')"`.
- `peers.trl_choices`: the adapters of TRL's GSPO, CISPO and batch-std configurations (bound in `peers.trl_grpo`).
- `peers.trl_trainer`: the one `GRPOTrainer` both run TRL's code through.
- `peers.trl_whole`: TRL's whole step, its generation as a `RolloutEngine` and its training step as a `Trainer`,
  under the engine and trainer laws (`IMPL_WHOLE`, bound in its own module: its record names it).

Libraries that cannot be installed here are copied verbatim, with their provenance (repository, path, lines,
commit) in each module's docstring and the copied lines between marker comments; only the glue that feeds them the
suite's tensors is ours:

- `peers.nemo_rl_grpo`: NeMo-RL's leave-one-out advantages and clipped loss with its KL term.
- `peers.skyrl_grpo`: SkyRL's GRPO advantages and its policy loss beside a sequence-mean KL.
- `peers.tutorial_grpo`: the Flyte training-loop tutorial's own advantages and loss (unionai/unionai-examples).

`nox -s peers-history` replays released bugs (peers/history.toml, read by `peers.history_record`): each
`peers.history.<bug>` module binds one library's own code, the same for the release before the bug's fix and the
release with it.

`nox -s bench-peers` times TRL's whole GRPO loop against ours on the same model, prompts, reward and shape:
`peers.bench_trl` (the orchestrator) runs `peers.bench_ours` and `peers.trl_loop` (the runners) in fresh processes
and tabulates their records (`peers.bench_shapes`, `peers.bench_summary`: pure Python, unit-tested in
tests/test_bench_peers.py).

A module imports its library at import time, so it only imports in the environment `nox -s peers` builds for it. The
package is not part of the wheel: `nox -s peers` copies it to a temporary directory on PYTHONPATH. What each peer
passes, which laws it fails and why (a declared choice or a real bug) is in docs/conformance.md, "Proven on real
peers".
"""
