"""The loops as Flyte 2 tasks: thin recipes that bind the tested components to Flyte's primitives.

- `envs`: one TaskEnvironment per tier (rollout, reward, train, clustered train, drivers; agentic sandbox, judge,
  trainer, driver), the image built from this package, per-tier timeouts; sizing chosen at deploy time.
- `config`: typed task inputs (`GrpoRunConfig`, `EngineSpec`, `ModelSpec`, `FaultSpec`) and the `smoke` / `stress`
  profiles.
- `bindings`: the protocols on Flyte: `DirArtifacts` (flyte.io.Dir), `FlyteReporter` (flyte.report).
- `checkpoint_store`: `FlyteStateStore`, the driver's checkpoint in flyte.ctx().checkpoint (`rl.checkpoint` holds the
  format and the other stores), and `CrashAfterCheckpoint`, the driver crash a demo plants.
- `grpo_tasks`: `build_base`, `init_adapter`, `generate`, `score_group`, `train_step`, `evaluate`; `grpo`: the driver
  `train_rl`, which runs `rl.loop.grpo.run_grpo` over tiers whose methods await those tasks.
- `clustered`: `train_step_clustered` (DDP under TorchRun on a ClusteredTaskEnvironment) and the pipelined driver
  `train_rl_clustered`; `grpo_faults` both drivers' failure-injected twins (`train_rl_with_faults`, ...).
- `agentic`: the agentic tutorial's loop — `build_world`, `generate`, `verify_and_judge` (judge under `@flyte.trace`),
  `setup_trainer`, `train_step`, the driver `train`, and `fork` (`flyte.rerun(..., recover=True, rubric=...)`);
  `agentic_faults` its failure-injected run `train_with_faults`, `dir_worlds` its worlds on `flyte.io.Dir`,
  `agentic_report` its report, `agentic_cli` its command line.

The modules import flyte and torch (the configs are the tiny model's and the trainer's own config types); vLLM is
imported only inside a rollout task that runs the vLLM engine, so everything here imports on a CPU-only machine.
"""
