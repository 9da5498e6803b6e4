"""In-memory backends (artifacts, worlds) for the simulator and the conformance suite's reference
tiers: no disk, microseconds."""
