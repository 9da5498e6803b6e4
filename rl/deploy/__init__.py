"""The three deployments of one driver (rl.loop): in-process (`local`, with `demo`, and the run's report), on
Flyte (`flyte`), and simulated on the durable-execution engine (`simulated`). Kept apart by import-linter."""
