"""In-memory backends (artifacts, checkpoint store, worlds) for the simulator and the conformance suite's reference
tiers: no disk, microseconds."""
