"""The durable-execution simulator and its chaos: a deterministic stand-in for Flyte's durable semantics that the
driver laws, `rl chaos` and `rl bench` run on a laptop CPU."""
