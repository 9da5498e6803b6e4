"""The world of the agentic tutorial: `N_DOCS` small documents, one of which carries the sha256 of a secret the agent
must find.

Deterministic from (run seed, world id): building a world twice gives the same files, so `build_world` is cacheable, and
the verifier can recompute the expected answer from the ids alone.
"""

from __future__ import annotations

import functools
import hashlib
import random

from rl.seeding import derive_seed

N_DOCS = 8
DOCS_DIR = "docs"
SECRET_MARKER = "secret_sha256:"
ANSWER_FILE = "answer.txt"
SCRATCH_FILE = "scratch.tmp"


def doc_path(i: int) -> str:
    """The path of document `i` inside a world."""
    return f"{DOCS_DIR}/doc_{i}.txt"


@functools.lru_cache(maxsize=4096)
def world_secret(seed: int, world_id: str) -> tuple[int, str]:
    """(the index of the document holding the secret, the secret itself) for this world."""
    rng = random.Random(derive_seed("world", seed, world_id))
    return rng.randrange(N_DOCS), f"{world_id}-{rng.getrandbits(64):016x}"


@functools.lru_cache(maxsize=4096)
def secret_digest(seed: int, world_id: str) -> str:
    """What a correct trial answers: the sha256 of the world's secret, as written in the secret document."""
    return hashlib.sha256(world_secret(seed, world_id)[1].encode()).hexdigest()


def world_files(seed: int, world_id: str) -> dict[str, str]:
    """Every file of the world, by path: `docs/doc_<i>.txt` for i in 0..N_DOCS-1."""
    secret_doc, _ = world_secret(seed, world_id)
    files: dict[str, str] = {}
    for i in range(N_DOCS):
        lines = [f"title: report {i} for {world_id}", f"owner: team-{i % 3}", f"pages: {10 + i}"]
        if i == secret_doc:
            lines.append(f"{SECRET_MARKER} {secret_digest(seed, world_id)}")
        files[doc_path(i)] = "\n".join(lines) + "\n"
    return files
