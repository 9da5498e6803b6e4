"""Checkpointing: what a driver writes so a later attempt resumes where it died, and the stores that keep it.

- `format`: the GRPO driver's checkpoint (`DriverState`), encoded as a versioned, self-verifying JSON document.
- `resume`: loading it for a run (refusing another run's or a damaged one) and saving the next one.
- `file_store`: `FileCheckpointStore`, one file replaced atomically (the `flyte.ctx().checkpoint` role outside Flyte).
- `memory_store`: `MemoryCheckpointStore`, in memory, with planted tears and corruption, for driver tests.

The same role on Flyte is `rl.deploy.flyte.checkpoint_store.FlyteCheckpointStore` (over `flyte.ctx().checkpoint`), and
on the simulator `rl.durable.checkpoint_store.SimCheckpointStore`: both live with the code of their platform.
"""
