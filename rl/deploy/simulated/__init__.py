"""The GRPO and agentic deployments simulated on the durable-execution engine (`rl.durable`), with their in-memory tiers
and backends (artifacts, worlds), and the chaos scenarios that torture them: what the driver laws, `rl chaos` and
`rl bench` run on a laptop CPU."""
