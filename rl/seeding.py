"""Seeds derived from one run seed, stable across processes, machines and Python versions.

A retried rollout must sample exactly what its first attempt sampled, so its seed is a pure function of where it sits
in the run (run seed, iteration, group): BLAKE2b over an unambiguous byte encoding of its parts (Python's `hash` is
salted per process). Seeds fit in 31 bits (vLLM's `SamplingParams.seed` takes a signed 32-bit int); some two of N
coincide with probability about N**2 / 2**32. One rule: every seed is derived by `derive_seed` and nowhere else, each
with its named function below, new ones leading with a string naming their purpose; four older ones put the run seed
first, and keep that encoding so recorded runs reproduce. The vLLM engine spaces these seeds (`vllm_seed`) without
changing them. Why each of these: docs/design.md#seeds.

Pure Python: every tier derives its seed without torch.
"""

from __future__ import annotations

import functools
import hashlib

__all__ = [
    "SEED_BITS",
    "adapter_init_seed",
    "derive_seed",
    "dropout_seed",
    "eval_problem_seed",
    "eval_seed",
    "prompt_draw_seed",
    "rollout_seed",
]

SEED_BITS = 31
"""Every derived seed lies in `0 .. 2**SEED_BITS - 1`."""

# Changing the personalisation or the encoding changes every seed of every run: replays of old runs would stop matching.
_PERSON = b"flyte-rl.seed.v1"


def derive_seed(*parts: int | str) -> int:
    """A seed in `0 .. 2**31 - 1` that depends on every part, its type and its position, and on nothing else.

    Each part is encoded with a type tag and its length (`int` as signed decimal, `str` as UTF-8), so `("ab", "c")` and
    `("a", "bc")`, `(1,)` and `("1",)`, `(12,)` and `(1, 2)` all encode differently. Name what the seed is for with a
    leading string (`derive_seed("reward", run_seed)`), so seeds for different purposes never share an encoding.

    Raises:
        ValueError: no parts.
        TypeError: a part that is not an `int` or `str` (a `bool` included: it is far more likely a bug than a seed).
    """
    try:
        return _derived(*parts)
    except TypeError:
        _encode(parts)  # an unhashable part (a list) fails the cache's key first: say what was wrong instead
        raise


@functools.lru_cache(maxsize=1 << 16, typed=True)
def _derived(*parts: int | str) -> int:
    """`derive_seed`'s value, memoised: a chaos scenario asks for the same few dozen seeds its reference and every
    rerun asked for (docs/benchmarks.md has the share). `typed=True` keeps `True` apart from `1`, so a bool part
    still reaches `_encode`'s TypeError (errors are never cached)."""
    if not parts:
        raise ValueError("derive_seed needs at least one part")
    digest = hashlib.blake2b(_encode(parts), digest_size=8, person=_PERSON).digest()
    return int.from_bytes(digest, "big") >> (64 - SEED_BITS)


def rollout_seed(run_seed: int, iteration: int, group_id: int) -> int:
    """The sampler seed of one rollout group: the same on every attempt, process and machine.

    One seed per group, not per sample: a sampler draws the group's `n` completions from one seeded request (one
    stream on the torch sampler, one spaced seed per completion on vLLM: see the module docstring).
    """
    return derive_seed("rollout", run_seed, iteration, group_id)


def prompt_draw_seed(run_seed: int, iteration: int) -> int:
    """The seed of an iteration's draw of training prompts (run seed first: see the module docstring)."""
    return derive_seed(run_seed, "prompts", iteration)


def adapter_init_seed(run_seed: int) -> int:
    """The seed the run's first adapter is initialised from (run seed first: see the module docstring)."""
    return derive_seed(run_seed, "init")


def eval_seed(run_seed: int, policy_version: int) -> int:
    """The seed of one evaluation of policy version `policy_version` (run seed first: see the module docstring)."""
    return derive_seed(run_seed, "eval", policy_version)


def eval_problem_seed(evaluation_seed: int, problem: int) -> int:
    """The sampler seed of held-out problem `problem` within one evaluation seeded `evaluation_seed` (its seed first:
    see the module docstring). The "eval" label keeps it apart from every training rollout's seed."""
    return derive_seed(evaluation_seed, "eval", problem)


def dropout_seed(trainer_seed: int, step: int, sample: int) -> int:
    """The seed of the dropout masks of one forward of a train step, named by its first sample: per-sample, the sample;
    batched, the micro-batch's first. So at a micro-batch size of 1 both loss paths draw the same masks."""
    return derive_seed("dropout", trainer_seed, step, sample)


def _encode(parts: tuple[int | str, ...]) -> bytes:
    chunks: list[bytes] = []
    for position, part in enumerate(parts):
        if isinstance(part, bool) or not isinstance(part, int | str):
            raise TypeError(f"seed part {position} must be an int or str, got {type(part).__name__}: {part!r}")
        tag, payload = (b"s", part.encode("utf-8")) if isinstance(part, str) else (b"i", str(part).encode("ascii"))
        chunks.append(tag + len(payload).to_bytes(8, "big") + payload)
    return b"".join(chunks)
