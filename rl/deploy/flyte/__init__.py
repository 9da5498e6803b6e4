"""The loops as Flyte 2 tasks: thin recipes that bind the tested components to Flyte's primitives.

`envs` (one TaskEnvironment per tier), `config` (typed task inputs and profiles), `bindings` (`DirArtifacts`,
`FlyteReporter`) and `checkpoint_store` (the driver's checkpoint in flyte.ctx().checkpoint); the GRPO loop's tasks
(`grpo_tasks`), driver (`grpo`), clustered trainer and pipelined driver (`clustered`) and failure-injected twins
(`grpo_faults`); the agentic loop (`agentic`, `agentic_faults`, `dir_worlds`, `agentic_report`, `agentic_cli`).
What each holds: docs/flyte.md#the-modules.

The modules import flyte and torch (the configs are the tiny model's and the trainer's own config types); vLLM is
imported only inside a rollout task that runs the vLLM engine, so everything here imports on a CPU-only machine.
"""
