"""Planted bugs in our production code (`rl/`), each the kind of mistake a fork makes, for measuring what the packaged
conformance suite catches of what `tests/` catches (`scripts/mutants/run.py`, `docs/mutants.md`).

Each `Mutant` replaces one exact snippet of one file. The snippet must occur exactly once in the tree
(`tests/test_mutants_catalogue.py` checks every entry, so an edit to `rl/` that moves a snippet fails fast instead of
silently dropping a mutant), and the replacement must change behaviour, never only formatting.

`hints` are the test files most likely to kill the mutant: the runner tries them first and, only when they pass, runs
the whole of `tests/`, so a killed mutant costs seconds. They never decide "survived".
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CATALOGUE", "TIERS", "Mutant", "by_id"]

TIERS = (
    "advantages",
    "loss",
    "engine",
    "scorer",
    "trainer",
    "artifacts",
    "state-store",
    "grpo-driver",
    "checkpoint",
    "agentic",
    "ddp",
    "volumes",
    "buffer",
)


@dataclass(frozen=True)
class Mutant:
    id: str
    tier: str
    file: str
    old: str
    new: str
    models: str  # the fork's mistake, and the guarantee it breaks
    hints: tuple[str, ...] = ()


CATALOGUE: tuple[Mutant, ...] = (
    # --- advantages (rl/algorithm/advantages.py) ---
    Mutant(
        "adv-sample-std",
        "advantages",
        "rl/algorithm/advantages.py",
        "statistics.pstdev(group_rewards) + math.ldexp(eps, -shift)",
        "statistics.stdev(group_rewards) + math.ldexp(eps, -shift)",
        "sample std (n-1) instead of the declared population std: advantages scaled by sqrt((n-1)/n)",
        ("tests/test_advantages.py",),
    ),
    Mutant(
        "adv-eps-dropped",
        "advantages",
        "rl/algorithm/advantages.py",
        "statistics.pstdev(group_rewards) + math.ldexp(eps, -shift), 0",
        "statistics.pstdev(group_rewards), 0",
        "eps silently dropped from the denominator: the declared std_eps is not applied",
        ("tests/test_advantages.py",),
    ),
    Mutant(
        "adv-no-all-equal-guard",
        "advantages",
        "rl/algorithm/advantages.py",
        "        if _all_equal(group_rewards):\n            continue\n",
        "",
        "all-equal guard removed: a no-signal group gets the float-mean residue (1e-13 / eps) instead of exact zeros",
        ("tests/test_advantages.py",),
    ),
    Mutant(
        "adv-batch-mean",
        "advantages",
        "rl/algorithm/advantages.py",
        "mean = statistics.fmean(group_rewards)",
        "mean = statistics.fmean(rewards_f)",
        "baseline is the batch mean, not the group's: advantages depend on other groups and do not centre per group",
        ("tests/test_advantages.py",),
    ),
    # --- loss (rl/algorithm/loss.py) ---
    Mutant(
        "loss-sign-flip",
        "loss",
        "rl/algorithm/loss.py",
        "loss = -(surrogate - beta * kl)",
        "loss = surrogate + beta * kl",
        "objective's sign flipped (gradient ascent on the loss): not REINFORCE at ratio 1",
        ("tests/test_loss.py",),
    ),
    Mutant(
        "loss-kl-sign",
        "loss",
        "rl/algorithm/loss.py",
        "loss = -(surrogate - beta * kl)",
        "loss = -(surrogate + beta * kl)",
        "KL penalty added with the wrong sign: pushes the policy away from the reference",
        ("tests/test_loss.py",),
    ),
    Mutant(
        "loss-kl-k1",
        "loss",
        "rl/algorithm/loss.py",
        "return torch.expm1(delta) - delta",
        "return -delta",
        "k1 estimator (ref - new) instead of k3: the per-token penalty can go negative",
        ("tests/test_loss.py",),
    ),
    Mutant(
        "loss-clip-one-sided",
        "loss",
        "rl/algorithm/loss.py",
        "clipped = torch.clamp(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high)",
        "clipped = torch.clamp(ratio, max=1.0 + clip_eps_high)",
        "ratio clipped above only: a negative-advantage sample below 1 - eps keeps pushing (gain not capped)",
        ("tests/test_loss.py",),
    ),
    Mutant(
        "loss-clip-both-sides",
        "loss",
        "rl/algorithm/loss.py",
        "return torch.minimum(ratio * advantage, clipped * advantage)",
        "return clipped * advantage",
        "the pessimistic min dropped: the clip also zeroes the gradient of a move that lowers the objective",
        ("tests/test_loss.py",),
    ),
    Mutant(
        "loss-ratio-inverted",
        "loss",
        "rl/algorithm/loss.py",
        "return torch.exp(new_logp - old_logp.detach())",
        "return torch.exp(old_logp.detach() - new_logp)",
        "importance ratio inverted (old over new)",
        ("tests/test_loss.py",),
    ),
    Mutant(
        "loss-masked-token-sum",
        "loss",
        "rl/algorithm/loss.py",
        "surrogate_mean = (surrogate * weight).sum(dim=1) / tokens  # [B]",
        "surrogate_mean = (surrogate * weight).sum(dim=1)  # [B]",
        "the padded loss sums a completion's tokens instead of averaging them: long completions weigh more",
        ("tests/test_loss.py",),
    ),
    Mutant(
        "loss-batch-sum",
        "loss",
        "rl/algorithm/loss.py",
        "loss = rows.mean()",
        "loss = rows.sum()",
        "batch aggregation sums completions instead of averaging: the step size grows with the batch",
        ("tests/test_loss.py",),
    ),
    Mutant(
        "loss-token-sum",
        "loss",
        "rl/algorithm/loss.py",
        "surrogate = clipped_surrogate(ratio, advantage, eps_low, eps_high).mean()",
        "surrogate = clipped_surrogate(ratio, advantage, eps_low, eps_high).sum()",
        "token sum instead of token mean per completion: long completions weigh more (another aggregation)",
        ("tests/test_loss.py",),
    ),
    # --- engine (rl/samplers/decoding.py, rl/samplers/torch_sampler.py) ---
    Mutant(
        "engine-unseeded",
        "engine",
        "rl/samplers/decoding.py",
        'generators = [torch.Generator(device="cpu").manual_seed(seed) for seed in seeds]',
        'generators = [torch.Generator(device="cpu") for _ in seeds]\n    for g in generators:\n        g.seed()',
        "sampler's generator seeded from the OS: a retried request samples other tokens",
        ("tests/test_torch_sampler.py",),
    ),
    Mutant(
        "engine-seed-not-passed",
        "engine",
        "rl/samplers/torch_sampler.py",
        "                seeds=[requests[i].seed for i in members],\n",
        "                seeds=[0 for i in members],\n",
        "the request's seed never reaches the sampler: every group and iteration samples the same stream",
        ("tests/test_torch_sampler.py",),
    ),
    Mutant(
        "engine-cache-by-version",
        "engine",
        "rl/samplers/torch_sampler.py",
        "            model = await self.policy(first.adapter)\n",
        '            model = self.adapters.get(f"v{first.policy_version}")\n'
        "            if model is None:\n"
        '                with tempfile.TemporaryDirectory(prefix="rl-adapter-") as tmp:\n'
        "                    await materialize(self.artifacts, first.adapter, Path(tmp))\n"
        '                    model = self.adapters.load_dir(f"v{first.policy_version}", Path(tmp))\n',
        "adapter cached by its version label, not its digest: a new adapter under a known version serves the stale one",
        ("tests/test_torch_sampler.py",),
    ),
    Mutant(
        "engine-logprobs-missing",
        "engine",
        "rl/samplers/torch_sampler.py",
        "                logprobs=s.logprobs,\n",
        "                logprobs=[],\n",
        "rollouts carry no sampling log-probs (the loss then has no old policy)",
        ("tests/test_torch_sampler.py",),
    ),
    Mutant(
        "engine-sampling-temperature",
        "engine",
        "rl/samplers/decoding.py",
        "        probs = logp.exp()\n",
        "        probs = torch.softmax(logits.float() / 0.7, dim=-1)\n",
        "samples at temperature 0.7 but records the temperature-1 log-probs: the ratio's denominator is not the "
        "probability each token was drawn with",
        ("tests/test_torch_sampler.py",),
    ),
    Mutant(
        "engine-batch-ignores-adapter",
        "engine",
        "rl/samplers/torch_sampler.py",
        "buckets.setdefault((request.adapter.digest, request.max_tokens, request.sampling), []).append(i)",
        "buckets.setdefault((request.max_tokens, request.sampling), []).append(i)",
        "one call's requests bucketed without their adapter: every request of a bucket sampled from the first's",
        ("tests/test_torch_sampler.py",),
    ),
    # --- issue 40: the end of a completion, two groups' seeds, an engine used after close ---
    Mutant(
        "engine-finished-rows-decode-on",
        "engine",
        "rl/samplers/decoding.py",
        "newly = (nxt.squeeze(1) == eos_token_id) & ~finished",
        "newly = nxt.squeeze(1) == eos_token_id",
        "a row that sampled <eos> keeps decoding and every later <eos> moves its end: a completion runs past its first "
        "end-of-sequence token, with the tokens after it",
        ("tests/test_torch_sampler.py",),
    ),
    Mutant(
        "engine-torch-per-row-seed-plus-index",
        "engine",
        "rl/samplers/decoding.py",
        "        nxt = draw_tokens(probs, generators, bounds)  # [rows, 1]\n",
        "        nxt = draw_tokens(\n"
        "            probs,\n"
        "            [\n"
        '                torch.Generator(device="cpu").manual_seed(s_i * 1_000_003 + t)\n'
        "                for s_i in [s + i for s, k in zip(seeds, ns, strict=True) for i in range(k)]\n"
        "            ],\n"
        "            range(rows + 1),\n"
        "        )  # [rows, 1]\n",
        "row i of a group seeded s draws from a stream of its own seeded s + i (vLLM's per-sample seeds, as they are): "
        "groups seeded s and s + 1 share all samples but one",
        ("tests/test_torch_sampler.py",),
    ),
    Mutant(
        "engine-vllm-seed-stride-one",
        "engine",
        "rl/samplers/vllm_requests.py",
        "    return seed * VLLM_SEED_STRIDE\n",
        "    return seed\n",
        "vLLM gets the group's seed as it is: it seeds completion i with seed + i, so groups seeded s and s + 1 share "
        "n - 1 completions",
        ("tests/test_vllm_adapter.py",),
    ),
    Mutant(
        "engine-vllm-close-keeps-adapter-paths",
        "engine",
        "rl/samplers/vllm.py",
        "        llm, self._llm = self._llm, None\n        self._adapter_dirs.clear()\n",
        "        llm, self._llm = self._llm, None\n",
        "close deletes the adapter copies but keeps their paths: the engine used again hands vLLM directories that no "
        "longer exist",
        ("tests/test_vllm_adapter.py",),
    ),
    # --- scorer (rl/scoring.py, rl/rewards.py) ---
    Mutant(
        "scorer-sorted",
        "scorer",
        "rl/scoring.py",
        "return [float(self.reward(r.completion, r.answer)) for r in rollouts]",
        "return sorted(float(self.reward(r.completion, r.answer)) for r in rollouts)",
        "a group's rewards returned sorted: they no longer follow their rollouts",
        ("tests/test_rewards.py",),
    ),
    Mutant(
        "scorer-nan-unscorable",
        "scorer",
        "rl/rewards.py",
        "return CORRECT_BONUS if predicted is not None and predicted == _canonical_reference(answer) else 0.0",
        'return float("nan") if predicted is None else CORRECT_BONUS if predicted == _canonical_reference(answer) '
        "else 0.0",
        "an unscorable completion (no number) scored NaN, which passes through the scorer",
        ("tests/test_rewards.py",),
    ),
    Mutant(
        "scorer-thousands-separator-dropped",
        "scorer",
        "rl/rewards.py",
        '_NUMBER = re.compile(r"-?(?:\\d{1,3}(?:,\\d{3})+(?!\\d)|\\d+)(?:\\.\\d+)?")',
        '_NUMBER = re.compile(r"-?\\d+(?:\\.\\d+)?")',
        "answer extraction reads numbers without thousands separators: '#### 1,200' extracts 1 (a correct answer "
        "scored wrong)",
        ("tests/test_rewards.py",),
    ),
    Mutant(
        "metrics-pass-at-k-biased",
        "scorer",
        "rl/metrics.py",
        "    return 1.0 - none_correct\n",
        "    return 1.0 - (1.0 - c / n) ** k\n",
        "pass@k as 1 - (1 - c/n)^k (samples drawn with replacement): biased low, the eval curves wrong",
        ("tests/test_metrics.py",),
    ),
    # --- trainer (rl/trainer/step.py, rl/trainer/adapter.py) ---
    Mutant(
        "trainer-optimizer-dropped",
        "trainer",
        "rl/trainer/step.py",
        "optimizer = build_optimizer(params, config, optimizer_state)",
        "optimizer = build_optimizer(params, config, None)",
        "optimizer state not carried between steps: a fresh AdamW every step",
        ("tests/test_peft_trainer.py",),
    ),
    Mutant(
        "trainer-unseeded-init",
        "trainer",
        "rl/trainer/adapter.py",
        "        torch.manual_seed(seed)\n        model = get_peft_model(base, lora)",
        "        torch.seed()\n        model = get_peft_model(base, lora)",
        "LoRA init seeded from the OS, not the init seed: version 0 differs between attempts",
        ("tests/test_peft_trainer.py",),
    ),
    Mutant(
        "trainer-step-noop",
        "trainer",
        "rl/trainer/step.py",
        "    prepared.optimizer.step()\n",
        "",
        "gradients computed but the optimizer never steps: the adapter never changes",
        ("tests/test_peft_trainer.py",),
    ),
    Mutant(
        "trainer-optimizer-saved-bf16",
        "trainer",
        "rl/trainer/optimizer_state.py",
        "            parts.setdefault(name, []).append(value.detach().reshape(-1).cpu())\n",
        "            parts.setdefault(name, []).append(value.detach().reshape(-1).cpu().bfloat16().to(value.dtype))\n",
        "optimizer moments saved at bfloat16 precision (a smaller artifact) while the warm trainer continues from the "
        "exact ones: a step restored from the artifacts differs from the step continued in memory",
        ("tests/test_peft_trainer.py",),
    ),
    Mutant(
        "trainer-staleness-unchecked",
        "trainer",
        "rl/trainer/step.py",
        "        worst = max(worst, check_staleness(i, rollout.policy_version, trained, config.max_staleness))\n",
        "        worst = max(worst, trained - rollout.policy_version)\n",
        "the trainer's staleness check dropped: a batch of any staleness (or from a newer policy) is trained on",
        ("tests/test_peft_trainer.py", "tests/test_checks.py"),
    ),
    Mutant(
        "trainer-teacher-forcing-temperature",
        "trainer",
        "rl/samplers/decoding.py",
        "    logp = sampling_logprobs(picked.float(), sampling, keep=keep)  # [B, T_max, V]\n",
        "    logp = sampling_logprobs(picked.float() / 0.7, sampling, keep=keep)  # [B, T_max, V]\n",
        "the trainer teacher-forces at temperature 0.7 while the sampler records at 1: every ratio is off on-policy",
        ("tests/test_peft_trainer.py", "tests/test_torch_sampler.py"),
    ),
    Mutant(
        "trainer-advantage-scale-ignored",
        "trainer",
        "rl/trainer/step.py",
        "batch.rewards, scale=config.advantage_scale, eps=config.std_eps",
        'batch.rewards, scale="none", eps=config.std_eps',
        "the trainer ignores its configured advantage scale (Dr. GRPO whatever the config declares): the bound "
        "advantages function is right, the step is not",
        ("tests/test_peft_trainer.py",),
    ),
    # --- artifacts (rl/storage/artifacts.py) ---
    Mutant(
        "artifacts-aliasing",
        "artifacts",
        "rl/storage/artifacts.py",
        "        return self._read_verified(ref)\n\n    async def exists",
        '        return self.__dict__.setdefault("_reads", {}).setdefault(ref.digest, self._read_verified(ref))\n\n'
        "    async def exists",
        "reads memoised and the same dict handed to every caller: one consumer's edit reaches the next",
        ("tests/test_artifacts.py",),
    ),
    Mutant(
        "artifacts-digest-ignores-content",
        "artifacts",
        "rl/storage/artifacts.py",
        "        h.update(content)\n",
        "",
        "digest over paths and sizes only: two different artifacts of the same shape share an address",
        ("tests/test_artifacts.py",),
    ),
    Mutant(
        "artifacts-missing-is-empty",
        "artifacts",
        "rl/storage/artifacts.py",
        '        if kind != "dir":\n            raise ArtifactNotFoundError(',
        '        if kind != "dir":\n            return {}\n            raise ArtifactNotFoundError(',
        "a missing ref reads as an empty artifact instead of raising",
        ("tests/test_artifacts.py",),
    ),
    # --- checkpoint store (rl/storage/checkpoint/file_store.py) ---
    Mutant(
        "state-in-place-write",
        "state-store",
        "rl/storage/checkpoint/file_store.py",
        "        with self.fs.directory(self.path.parent) as dfd:  # held: each step below is one call by name\n",
        '        with self.fs.open_file(self.path, "wb", perm=0o600) as f:  # no-follow kept: only the tear\n'
        "            f.write(data[: len(data) // 2])\n"
        '            await __import__("asyncio").sleep(0)  # an async file API awaits between chunks\n'
        "            f.write(data[len(data) // 2 :])\n"
        "        return\n"
        "        with self.fs.directory(self.path.parent) as dfd:  # held: each step below is one call by name\n",
        "checkpoint written in place (in chunks, yielding between them): a save cancelled midway leaves a torn blob",
        ("tests/test_kill_points.py",),
    ),
    Mutant(
        "state-keeps-first-write",
        "state-store",
        "rl/storage/checkpoint/file_store.py",
        "        self.path.parent.mkdir(parents=True, exist_ok=True)\n",
        "        if self.path.exists():\n"
        "            return\n"
        "        self.path.parent.mkdir(parents=True, exist_ok=True)\n",
        "save is a no-op once a checkpoint exists (create-only): the store keeps the first write",
        ("tests/test_grpo_driver.py",),
    ),
    # --- GRPO driver (rl/loop/grpo.py) ---
    Mutant(
        "grpo-resume-skips-iteration",
        "grpo-driver",
        "rl/loop/grpo.py",
        "    start = state.iteration + 1\n",
        "    start = state.iteration + (2 if resumed_from >= 0 else 1)\n",
        "off-by-one on resume: the iteration after the checkpointed one (its prompts) is skipped",
        ("tests/test_grpo_driver.py",),
    ),
    Mutant(
        "grpo-resume-repeats-iteration",
        "grpo-driver",
        "rl/loop/grpo.py",
        "    start = state.iteration + 1\n",
        "    start = max(state.iteration, 0)\n",
        "resume restarts at the checkpointed iteration: its step is applied twice",
        ("tests/test_grpo_driver.py",),
    ),
    Mutant(
        "grpo-finish-order",
        "grpo-driver",
        "rl/loop/grpo.py",
        "    for gid in sorted(groups):\n",
        "    for gid in groups:\n",
        "groups handed to the train step in finish order, not group-id order: a replayed step has other inputs",
        ("tests/test_grpo_driver.py",),
    ),
    Mutant(
        "grpo-nan-swallowed",
        "grpo-driver",
        "rl/loop/grpo.py",
        "        refuse_non_finite(iteration, groups[gid], group_rewards)\n",
        "        pass\n",
        "the driver's reward check off (`rl.algorithm.checks.finite_rewards` not called): non-finite rewards pass "
        "into the train step instead of raising NonFiniteRewardError naming the iteration",
        ("tests/test_grpo_driver.py",),
    ),
    Mutant(
        "grpo-nan-half-committed",
        "grpo-driver",
        "rl/loop/grpo.py",
        "        rollouts.extend(groups[gid])\n        rewards.extend(float(r) for r in group_rewards)\n",
        "        rollouts.extend(groups[gid])\n        rewards.extend(float(r) for r in group_rewards)\n"
        "        if tiers.buffer is not None:\n"
        "            await tiers.buffer.append(iteration, groups[gid], [float(r) for r in group_rewards], None)\n",
        "each group's rollouts streamed to the rollout buffer as it is checked: a NaN in a later group leaves the "
        "earlier groups of its iteration committed",
        ("tests/test_grpo_driver.py",),
    ),
    Mutant(
        "grpo-staleness-off",
        "grpo-driver",
        "rl/loop/grpo.py",
        'state.policy_version, config.max_staleness, f"iteration {iteration}: ")',
        'state.policy_version, 2**62, f"iteration {iteration}: ")',
        "staleness check off: rollouts older than max_staleness are trained on",
        ("tests/test_grpo_driver.py", "tests/test_checks.py"),
    ),
    Mutant(
        "grpo-seed-ignores-iteration",
        "grpo-driver",
        "rl/loop/grpo.py",
        "seed=rollout_seed(config.seed, iteration, gid)",
        "seed=rollout_seed(config.seed, 0, gid)",
        "rollout seeds per (run seed, group) only: every iteration re-samples group g with the same seed",
        ("tests/test_grpo_driver.py",),
    ),
    Mutant(
        "grpo-prompts-unseeded",
        "grpo-driver",
        "rl/loop/grpo.py",
        "    rng = random.Random(prompt_draw_seed(config.seed, iteration))\n",
        "    rng = random.Random()\n",
        "the iteration's prompts drawn unseeded: a retried or resumed iteration trains on other prompts",
        ("tests/test_grpo_driver.py",),
    ),
    Mutant(
        "grpo-pipelined-resume-fresh-adapter",
        "grpo-driver",
        "rl/loop/grpo.py",
        "                if state.previous_adapter is not None\n"
        "                else (state.adapter, state.policy_version)",
        "                if state.previous_adapter is None\n                else (state.adapter, state.policy_version)",
        "pipelined resume generates the next batch with the newest adapter, not the one an uninterrupted run used",
        ("tests/test_grpo_driver.py",),
    ),
    # --- checkpoint (rl/storage/checkpoint/format.py, rl/storage/checkpoint/resume.py) ---
    Mutant(
        "ckpt-history-dropped",
        "checkpoint",
        "rl/storage/checkpoint/format.py",
        'history=[IterationMetrics.from_dict(row) for row in d["history"]],',
        "history=[],",
        "history not restored from the checkpoint: a resumed run reports only its own iterations",
        ("tests/test_grpo_driver.py",),
    ),
    Mutant(
        "ckpt-digest-unchecked",
        "checkpoint",
        "rl/storage/checkpoint/format.py",
        '    if _plain_digest(doc["state"]) != doc["digest"]:\n',
        "    if False:\n",
        "checkpoint digest not verified: a partial or altered (but parseable) checkpoint is resumed",
        ("tests/test_grpo_driver.py",),
    ),
    Mutant(
        "ckpt-corrupt-is-fresh",
        "checkpoint",
        "rl/storage/checkpoint/resume.py",
        '    state = decode_state(blob, str(path) if path is not None else "the driver checkpoint")\n',
        "    try:\n"
        '        state = decode_state(blob, str(path) if path is not None else "the driver checkpoint")\n'
        '    except __import__("rl.errors").errors.CheckpointCorruptError:\n'
        "        return None\n",
        "a torn or foreign checkpoint silently treated as no checkpoint: the run restarts from iteration 0",
        ("tests/test_grpo_driver.py",),
    ),
    Mutant(
        "ckpt-other-schema-accepted",
        "checkpoint",
        "rl/storage/checkpoint/format.py",
        '    if doc["schema"] != SCHEMA_VERSION or type(doc["schema"]) is not int:\n',
        '    if type(doc["schema"]) is not int:\n',
        "a checkpoint of another schema version is read as this one",
        ("tests/test_grpo_driver.py",),
    ),
    Mutant(
        "ckpt-other-config-accepted",
        "checkpoint",
        "rl/storage/checkpoint/resume.py",
        "    if state.config_digest != config.digest():\n",
        "    if not state.config_digest:\n",
        "a checkpoint written under another configuration is resumed",
        ("tests/test_grpo_driver.py",),
    ),
    Mutant(
        "ckpt-missing-adapter-accepted",
        "checkpoint",
        "rl/storage/checkpoint/resume.py",
        "        if not await artifacts.exists(ref):\n",
        "        if False:\n",
        "a checkpoint naming an artifact the store no longer has is resumed (fails later, untyped)",
        ("tests/test_grpo_driver.py",),
    ),
    Mutant(
        "ckpt-missing-optimizer-accepted",
        "checkpoint",
        "rl/storage/checkpoint/resume.py",
        '    for what, ref in (("adapter", state.adapter), ("optimizer state", state.optimizer_state)):\n',
        '    for what, ref in (("adapter", state.adapter),):\n',
        "the resume verifies only the checkpoint's adapter: a lost optimizer state is resumed (fails later, untyped)",
        ("tests/test_grpo_driver.py",),
    ),
    # --- agentic driver and tiers (rl/loop/agentic.py, rl/agentic/) ---
    Mutant(
        "agentic-landing-order",
        "agentic",
        "rl/loop/agentic.py",
        "await tiers.train_step(step, canonical_rewards(rewards), world_ids, config.lr)",
        "await tiers.train_step(step, rewards, world_ids, config.lr)",
        "rewards sent to the train step in landing order: a replayed step hashes differently",
        ("tests/test_agentic_loop.py",),
    ),
    Mutant(
        "agentic-trial-failure-fatal",
        "agentic",
        "rl/loop/agentic.py",
        '            skipped.append(SkippedTrial(trial_id=trial_id, stage="generate", reason=repr(traj)))\n',
        "            raise traj\n",
        "a trial that fails every retry is fatal to its step instead of skipped and counted",
        ("tests/test_agentic_loop.py",),
    ),
    Mutant(
        "agentic-judge-fatal",
        "agentic",
        "rl/loop/agentic.py",
        '            skipped.append(SkippedTrial(trial_id=trial_id, stage="verify_and_judge", reason=repr(reward)))\n',
        "            raise reward\n",
        "a judging that fails every retry is fatal to its step instead of skipped and counted",
        ("tests/test_agentic_loop.py",),
    ),
    Mutant(
        "agentic-judge-untraced",
        "agentic",
        "rl/agentic/tiers.py",
        "        score = await self.call_judge(traj, rubric)\n",
        '        score = await getattr(self.call_judge, "__wrapped__", self.call_judge)(traj, rubric)\n',
        "the vendor judge called unwrapped, outside the durable trace: a judging retry bills the judge again",
        ("tests/test_agentic_loop.py", "tests/test_agentic_chaos.py"),
    ),
    Mutant(
        "agentic-rubric-ignored",
        "agentic",
        "rl/agentic/tiers.py",
        "        score = await self.call_judge(traj, rubric)\n",
        "        score = await self.call_judge(traj, Rubric())\n",
        "the judge always scores the default rubric: a run forked with a new rubric is not re-judged",
        ("tests/test_agentic_loop.py",),
    ),
    Mutant(
        "agentic-no-ledger",
        "agentic",
        "rl/agentic/bandit.py",
        "        done = self._applied.get(step)\n",
        "        done = None\n        self._applied.pop(step, None)\n",
        "the trainer keeps no applied-steps ledger: a retried step is applied twice",
        ("tests/test_agentic_trainer.py",),
    ),
    Mutant(
        "agentic-payload-conflict-ignored",
        "agentic",
        "rl/agentic/bandit.py",
        "            if done.digest != digest:\n",
        "            if False:\n",
        "a step re-sent with a different payload silently returns the recorded weights",
        ("tests/test_agentic_trainer.py",),
    ),
    # --- DDP shard step (rl/trainer/ddp.py) ---
    Mutant(
        "ddp-empty-shard-skips-sync",
        "ddp",
        "rl/trainer/ddp.py",
        "    (sync_forward().float().sum() * 0.0).backward()  # the one synchronising backward\n",
        "    if sample_loss_fns:\n        (sync_forward().float().sum() * 0.0).backward()\n",
        "a rank with an empty shard skips the synchronising backward: the other ranks deadlock in the all-reduce",
        ("tests/test_ddp.py",),
    ),
    Mutant(
        "ddp-no-no-sync",
        "ddp",
        "rl/trainer/ddp.py",
        "    with ddp_model.no_sync():\n",
        "    if True:\n",
        "every per-sample backward all-reduces: collective counts differ between ranks with unequal shards",
        ("tests/test_ddp.py",),
    ),
    Mutant(
        "trainer-micro-batch-mean-over-accumulation-steps",
        "trainer",
        "rl/trainer/batched_loss.py",
        "            return rows.sum() * loss_scale\n",
        "            return rows.mean() * loss_scale * len(indices) / math.ceil(len(indices) / size)\n",
        "each micro-batch's own mean divided by the number of micro-batches (loss / gradient_accumulation_steps): "
        "right for equal micro-batches, the short last one's samples over-weighted",
        ("tests/test_peft_trainer.py",),
    ),
    Mutant(
        "ddp-train-step-scale-forgets-world-size",
        "ddp",
        "rl/trainer/ddp.py",
        "        mine, scale = shard(prepared.contributing, rank, world_size), world_size / n\n",
        "        mine, scale = shard(prepared.contributing, rank, world_size), 1.0 / n\n",
        "each rank's losses scaled by 1 / batch: DDP's average over ranks divides the full-batch gradient by the world "
        "size (the shard step itself is right)",
        ("tests/test_ddp.py",),
    ),
    Mutant(
        "ddp-train-step-scale-by-local-shard",
        "ddp",
        "rl/trainer/ddp.py",
        "        mine, scale = shard(prepared.contributing, rank, world_size), world_size / n\n",
        "        mine = shard(prepared.contributing, rank, world_size)\n        scale = 1.0 / max(1, len(mine))\n",
        "each rank's loss is the mean over its own shard: right on even shards, on 5 samples over 2 ranks the samples "
        "weigh 1/3 and 1/2 where each should weigh 2/5",
        ("tests/test_ddp.py",),
    ),
    # --- volumes (rl/storage/volumes/writable.py) ---
    Mutant(
        "volume-fork-writes-in-place",
        "volumes",
        "rl/storage/volumes/writable.py",
        '        fs.write_atomic(path, data, tmp_name=f".{path.name}.tmp-{uuid.uuid4().hex[:8]}", perm=mode)\n',
        "        if fs.kind(path) is not None:\n"
        "            fs.chmod(path, mode)\n"
        '        with fs.open_file(path, "wb", perm=mode) as f:\n'
        "            f.write(data)\n"
        "        return path\n"
        '        fs.write_atomic(path, data, tmp_name=f".{path.name}.tmp-{uuid.uuid4().hex[:8]}", perm=mode)\n',
        "a fork's write_bytes writes the inherited (hard-linked) inode in place: the write leaks into the parent",
        ("tests/test_volumes.py",),
    ),
    Mutant(
        "volume-truncate-shared",
        "volumes",
        "rl/storage/volumes/writable.py",
        "                fs.unlink(path)\n",
        "                fs.chmod(path, 0o644)\n",
        "open_for_write('w') truncates the shared inode instead of unlinking it: the parent version changes",
        # Killed by test_volumes' test_opening_an_inherited_file_to_truncate_leaves_the_parent_version_whole (the state
        # machine alone catches it only under some seeds: --rl-seed 1 or 3, not the default).
        ("tests/test_volumes.py",),
    ),
    Mutant(
        "volume-not-sealed",
        "volumes",
        "rl/storage/volumes/writable.py",
        "        self._seal_modes(data, stats, dirs, durable=durable)\n",
        "",
        "finalize does not seal modes: a published version stays writable and can be mutated",
        ("tests/test_volumes.py",),
    ),
    Mutant(
        "volume-symlink-depth-off-by-one",
        "volumes",
        "rl/storage/volumes/manifest.py",
        "    if ups > len(PurePosixPath(rel).parts) - 1:\n",
        "    if ups > len(PurePosixPath(rel).parts):\n",
        "a symlink's '..' steps counted against its path's length, not its directory's depth: a link may climb one "
        "level above the volume's root",
        ("tests/test_volume_symlinks.py", "tests/test_volumes.py"),
    ),
    # --- rollout buffer (rl/storage/volumes/buffer.py) ---
    Mutant(
        "buffer-float-rounding",
        "buffer",
        "rl/storage/volumes/buffer.py",
        '"reward": float(w)}',
        '"reward": round(float(w), 6)}',
        "rewards rounded to 6 decimals when stored: the buffer does not round-trip a reward",
        ("tests/test_buffer.py",),
    ),
    Mutant(
        "buffer-reappend-silently-kept",
        "buffer",
        "rl/storage/volumes/buffer.py",
        "            if base.files[relpath].sha256 == hashlib.sha256(payload).hexdigest():\n",
        "            if True:\n",
        "re-appending an iteration with different rows silently keeps the old rows",
        ("tests/test_buffer.py",),
    ),
    Mutant(
        "buffer-infinite-reward-appended",
        "buffer",
        "rl/storage/volumes/buffer.py",
        "or not math.isfinite(reward):\n"
        '            raise RowSchemaError(f"row {i} of iteration {iteration} has reward {reward!r}; rewards '
        'are finite numbers")\n'
        "        try:\n"
        "            lines.append(_ROW_ENCODER.encode(dict(row)))\n",
        "or reward != reward:\n"
        '            raise RowSchemaError(f"row {i} of iteration {iteration} has reward {reward!r}; rewards '
        'are finite numbers")\n'
        "        try:\n"
        "            lines.append(json.dumps(dict(row), ensure_ascii=False))\n",
        "append checks a reward for NaN only and writes with json.dumps' default (infinities allowed): a row with an "
        "infinite reward is stored",
        ("tests/test_buffer.py",),
    ),
    Mutant(
        "buffer-infinite-reward-read",
        "buffer",
        "rl/storage/volumes/buffer.py",
        "    reward: _Finite\n",
        "    reward: float\n",
        "a row read back is checked for a number, not a finite one: a stored 1e999 reward is read as infinity",
        ("tests/test_buffer.py",),
    ),
    # --- issue 47 §1: the sampling settings a user sets (temperature, top-k, top-p) ---
    Mutant(
        "engine-vllm-raw-logprobs",
        "engine",
        "rl/samplers/vllm_requests.py",
        'VLLM_LOGPROBS_MODE = "processed_logprobs"',
        'VLLM_LOGPROBS_MODE = "raw_logprobs"',
        "vLLM records raw log-probs, before the temperature and the cut (TRL #4159): at any setting but the default "
        "the recorded behaviour policy is not the one sampled",
        ("tests/test_vllm_adapter.py",),
    ),
    Mutant(
        "engine-sampler-ignores-temperature",
        "engine",
        "rl/samplers/decoding.py",
        "    scores = logits / sampling.temperature if sampling.temperature != 1.0 else logits\n",
        "    scores = logits\n",
        "the sampler and teacher forcing drop the temperature: a run set to T = 0.6 samples and trains at T = 1",
        ("tests/test_torch_sampler.py", "tests/test_peft_trainer.py"),
    ),
    Mutant(
        "engine-top-p-drops-the-top-token",
        "engine",
        "rl/samplers/decoding.py",
        "        below[..., -1] = False  # the most probable token is always kept\n",
        "",
        "a top-p small enough to cut every token leaves nothing to sample: the most probable token is not kept",
        ("tests/test_torch_sampler.py",),
    ),
    # --- issue 47 §4: planted in the last round's code, passed every test and law until these were added ---
    Mutant(
        "engine-vllm-refused-adapter-cached",
        "engine",
        "rl/samplers/vllm.py",
        "        check_adapter_dir(final)  # a pickle, a regex target, a damaged header: refused before vLLM's worker "
        "reads it\n"
        "        self._check_servable(adapter, final)\n"
        "        self._adapter_dirs[adapter.digest] = final\n",
        "        self._adapter_dirs[adapter.digest] = final\n"
        "        check_adapter_dir(final)  # a pickle, a regex target, a damaged header: refused before vLLM's worker "
        "reads it\n"
        "        self._check_servable(adapter, final)\n",
        "the staged adapter directory is cached before it is checked: a refused adapter's retry finds it cached and "
        "hands it to vLLM, whose worker fails the load and kills the engine core",
        ("tests/test_vllm_adapter.py",),
    ),
    Mutant(
        "volume-racy-window-skipped-for-copies",
        "volumes",
        "rl/storage/volumes/writable.py",
        "            and inh.mtime_ns < self._forked_at_ns - self._store.racy_ns\n",
        "            and (not inh.shares_parent_inode or inh.mtime_ns < self._forked_at_ns - self._store.racy_ns)\n",
        "a fork's own copy (share='copy' or 'reflink') is trusted from its stat however young: rewritten in place "
        "within one timestamp step, it keeps its parent's digest in the new manifest",
        ("tests/test_volumes.py",),
    ),
    Mutant(
        "volume-racy-window-skipped",
        "volumes",
        "rl/storage/volumes/writable.py",
        "            and inh.mtime_ns < self._forked_at_ns - self._store.racy_ns\n",
        "",
        "no racy window: an inherited file rewritten in place within one timestamp step (same inode, size and mtime) "
        "keeps its parent's digest in the new manifest",
        ("tests/test_volumes.py",),
    ),
    Mutant(
        "adapter-header-bound-by-constant",
        "artifacts",
        "rl/models/model_dir.py",
        "if not 2 <= length <= min(size - 8, MAX_SAFETENSORS_HEADER)",
        "if not 2 <= length <= MAX_SAFETENSORS_HEADER",
        "an adapter's safetensors header length is bounded by safetensors' 100 MiB cap, not by the file's size: a "
        "header claiming more bytes than the file holds passes the check and reaches a loader",
        ("tests/test_run_dir_attacks.py",),
    ),
)


def by_id() -> dict[str, Mutant]:
    return {m.id: m for m in CATALOGUE}
