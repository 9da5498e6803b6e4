"""The durable-execution simulator: a deterministic stand-in for Flyte's durable semantics (tasks, retries, crashes,
replay, virtual time, swarm fault plans). It knows nothing of RL; `rl.deploy.simulated` runs the loops on it."""
