"""Our own implementations bound for the suite (`ours`) and the contracts bound to the implementation `--rl-impl` names
(collected by `rl.conformance.test_suite`)."""
