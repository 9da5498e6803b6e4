"""Re-scoring a run's stored rollouts (the RL overview tutorial: "Try a new reward on old rollouts") generates
nothing."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from rl.cli import main
from rl.storage.volumes.buffer import PANDAS_DTYPES, VolumeBuffer
from rl.storage.volumes.rollout_buffer import BUFFER_NAME
from rl.storage.volumes.store import LocalVolumeStore


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    assert main(["demo", "grpo", "--iterations", "3", "--prompts", "2", "--samples", "4", "--out", str(out)]) == 0
    return out


@pytest.mark.heavy
def test_the_demo_keeps_one_buffer_version_per_iteration_readable_by_pandas(demo_run):
    """The training-loop tutorial: "Store them on a volume that each iteration forks and adds to"; every version stays
    addressable."""
    buffer = VolumeBuffer(LocalVolumeStore(demo_run / "volumes"), BUFFER_NAME)
    versions = buffer.versions()
    assert [buffer.iterations(v) for v in versions] == [[0], [0, 1], [0, 1, 2]]
    frame = pd.read_json(buffer.path(versions[-1], 2), lines=True, dtype=PANDAS_DTYPES)
    assert len(frame) == 2 * 4 and set(frame["iteration"]) == {2}
    metrics = [json.loads(line) for line in (demo_run / "metrics.jsonl").read_text().splitlines()]
    assert frame["reward"].mean() == pytest.approx(metrics[2]["mean_reward"])


def test_rescore_writes_a_new_version_and_generates_nothing(demo_run, capsys, monkeypatch):
    """`rl rescore --reward format` re-scores every stored rollout; a sampler that refuses to run proves none ran."""
    import rl.samplers.decoding as sampler

    def refuse(*args, **kwargs):
        raise AssertionError("rescoring must not generate")

    monkeypatch.setattr(sampler, "sample_group", refuse)
    buffer = VolumeBuffer(LocalVolumeStore(demo_run / "volumes"), BUFFER_NAME)
    head = buffer.head()
    before = buffer.read(head)
    assert main(["rescore", str(demo_run), "--reward", "format", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["rollouts_rescored"] == 3 * 2 * 4 and summary["generated"] == 0
    assert summary["mean_reward_before"] == pytest.approx(sum(r["reward"] for r in before) / len(before))
    after = buffer.read(summary["buffer_version"])
    assert [r["completion"] for r in after] == [r["completion"] for r in before]
    assert summary["mean_reward_after"] == pytest.approx(sum(0.2 * ("####" in r["completion"]) for r in before) / 24)
    assert buffer.read(head) == before  # the source version is untouched


def test_rescore_imports_no_sampler_or_trainer(demo_run):
    code = (
        "import sys; from rl.cli import main; "
        f"main(['rescore', {str(demo_run)!r}, '--reward', 'correctness']); "
        "print(sorted(m for m in sys.modules if m.startswith(('rl.samplers', 'rl.trainer', 'torch'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_rescore_with_an_unknown_reward_names_the_known_ones(demo_run, capsys):
    assert main(["rescore", str(demo_run), "--reward", "bleu"]) == 2
    assert "known rewards: correctness, default, format" in capsys.readouterr().err


def test_rescore_of_a_directory_without_a_buffer_says_what_to_do(tmp_path, capsys):
    assert main(["rescore", str(tmp_path), "--reward", "format"]) == 2
    assert "no rollout buffer" in capsys.readouterr().err
