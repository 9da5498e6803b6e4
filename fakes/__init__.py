"""Test doubles that live beside the tests and are not shipped in the wheel: a stand-in for vLLM's public API and the
process-kill chaos harness. What the product needs at run time (the simulator, in-memory backends) is under `rl`."""
