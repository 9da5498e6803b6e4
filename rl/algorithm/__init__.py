"""GRPO's math, with no torch: group advantages (`advantages`), the clipped loss (`loss`) and the checks every
layer that trains on scored rollouts makes (`checks`). The torch trainer that applies it is rl.trainer."""
