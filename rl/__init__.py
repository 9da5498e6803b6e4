"""GRPO + LoRA and durable agentic RL loops for Flyte 2, with a hermetic simulator and conformance suite."""

__version__ = "0.1.0"

from rl.platform import refuse_unsupported

refuse_unsupported()
