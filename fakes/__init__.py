"""Deterministic fakes of every tier and a simulator of Flyte's durable execution, for hermetic tests on a CPU."""
