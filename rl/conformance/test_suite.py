"""The packaged suite: every contract bound to the implementation `--rl-impl` names. Run it from any directory:

    pytest --pyargs rl.conformance.test_suite --rl-impl my_package.conformance:IMPL [--rl-seed N]

A tier the implementation does not provide (its factory is None) skips, and the skip says which factory is missing.
The bound classes live in `rl.conformance.bindings`; importing them here is what makes `--pyargs` collect them (in
this order), with the session fixture `implementation` they read.
"""

from __future__ import annotations

from rl.conformance.bindings import bound_algorithm, bound_contracts, bound_ddp

# pytest collects a module's classes in the order they are bound here: the order the suite always ran in.
TestAdvantages = bound_algorithm.TestAdvantages
TestLoss = bound_algorithm.TestLoss
TestDdpShardStep = bound_ddp.TestDdpShardStep
implementation = bound_contracts.implementation  # the session fixture every bound contract reads
TestArtifacts = bound_contracts.TestArtifacts
TestStateStore = bound_contracts.TestStateStore
TestRolloutEngine = bound_contracts.TestRolloutEngine
TestScorer = bound_contracts.TestScorer
TestScoringUtilities = bound_contracts.TestScoringUtilities
TestTrainer = bound_contracts.TestTrainer
TestGrpoDriver = bound_contracts.TestGrpoDriver
TestDriverReplay = bound_contracts.TestDriverReplay
TestAgentic = bound_contracts.TestAgentic
TestVolumeStore = bound_contracts.TestVolumeStore
TestRolloutBuffer = bound_contracts.TestRolloutBuffer
TestTokenLogprobs = bound_contracts.TestTokenLogprobs
TestGenerationBatch = bound_contracts.TestGenerationBatch
TestBatchRewardScorer = bound_contracts.TestBatchRewardScorer
TestRolloutBufferReads = bound_contracts.TestRolloutBufferReads
