"""The agentic tutorial's RL domain: pure code plus the bodies of its tiers, importable without flyte or ray.

- `types`: the frozen data (Weights, WorldRef, TrialSpec, Trajectory, Reward, ...), re-exported from `rl.types`
- `world`: the world of N_DOCS documents, one holding the hashed secret, deterministic from (seed, world id)
- `volume_worlds`: `VolumeWorlds`, the `WorldStore` (rl.protocols) over copy-on-write volumes
- `agent`: one trial — the policy-driven agent loop in a private fork, seeded by trial id
- `judge`: the deterministic verifier, the rubric formula with seeded noise, the reward
- `bandit`: the bandit update and `BanditTrainer`, exactly-once by its applied-steps ledger
- `ray_trainer`: the trainer as a detached, namespaced Ray actor (extra `ray`, imported lazily)
- `tiers`: SandboxTier, JudgeTier, TrainerTier (what Flyte or simulator tasks wrap) and LocalAgenticTiers
- `faults`: the tutorial's injected faults as tier wrappers (flaky trials, judge flakes, a driver crash after a step)
The driver is `rl.loop.agentic.run_agentic`; its tiers protocol `rl.protocols.AgenticTiers`; design in docs/agentic.md.
"""
