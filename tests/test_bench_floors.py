"""`rl.bench.floors`: each phase's floor against a hand-worked case, floors positive and finite on every shape, and
`rl bench --sections floors`' table: one row per phase with its measured time, floor and ratio. No timing asserted."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from rl.bench import floors_run
from rl.bench.floors import PHASES, IterationShape, MachineRates, phase_floors
from rl.cli import main
from rl.errors import InputError
from rl.memory_plan import ModelArch, lora_parameters
from rl.models.opened_model import open_model

# hidden 4, q_width 2 x 2 = 4, kv_width 2, intermediate 8, vocab 10: linear weights q 16 + k 8 + v 8 + o 16 +
# gate 32 + up 32 + down 32 = 144; the head 10 x 4 = 40; weights read 4 x (144 + 40) = 736 bytes.
HAND = ModelArch(hidden=4, layers=1, heads=2, kv_heads=1, head_dim=2, intermediate=8, vocab=10)
UNIT_RATES = MachineRates(matmul_gflops=1.0, bandwidth_gbs=1.0, threads=1)  # a FLOP or a byte takes 1 ns
SMOLLM2_CONFIG = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
}
SMOLLM2 = ModelArch.from_hf_config(SMOLLM2_CONFIG)


def test_each_phase_floor_is_the_hand_worked_count():
    """One prompt of 3 tokens, 2 samples of 2 tokens, LoRA r1 on q_proj (1 x (4 + 4) = 8 parameters)."""
    lora = lora_parameters(HAND, 1, ("q_proj",))
    assert lora == 8
    floors = {f.phase: f for f in phase_floors(HAND, IterationShape.uniform(1, 2, 3, 2), UNIT_RATES, lora=lora)}
    assert list(floors) == list(PHASES)
    # prefill, 3 positions: 2 x 3 x 144 = 864; attention 4 x 4 x (1 + 2 + 3) = 96; head at the last: 2 x 40 = 80.
    assert floors["prefill"].flops == 1040
    assert floors["prefill"].bytes == 736
    # decode, each sample's second token after 3 cached: 2 x 144 + 4 x 4 x 4 + 80 = 432, two samples; one step.
    assert floors["decode"].flops == 864
    assert floors["decode"].bytes == 736
    # teacher-forced, the prompt once (head at its last position) and each sample's first completion token on its
    # cache (head there): policy 2 x 3 x (144 + 8) + 96 + 80 = 1088, then 2 x (144 + 8) + 4 x 4 x (3 + 1) + 80 = 448
    # a sample; reference 864 + 96 + 80 = 1040, then 288 + 64 + 80 = 432 a sample.
    assert floors["teacher_forced_forward"].flops == (1088 + 2 * 448) + (1040 + 2 * 432)
    assert floors["teacher_forced_forward"].bytes == 2 * 736
    # backward: the reference forward's counts, attention once more, LoRA 4 x 8 per position: the prompt
    # 1040 + 96 + 96, each sample 432 + 64 + 32.
    assert floors["backward"].flops == (1040 + 96 + 96) + 2 * (432 + 64 + 32)
    # optimizer: 40 bytes per LoRA parameter, no FLOPs counted.
    assert (floors["optimizer_step"].flops, floors["optimizer_step"].bytes) == (0, 320)
    for f in floors.values():  # at 1 ns per FLOP and per byte, the floor is the larger count in ns
        assert f.floor_s == pytest.approx(max(f.flops, f.bytes) * 1e-9)


def test_the_reference_forward_counts_only_when_the_trainer_runs_it():
    with_ref, without = (
        {f.phase: f for f in phase_floors(HAND, IterationShape.uniform(1, 2, 3, 2), UNIT_RATES, lora=8, reference=r)}
        for r in (True, False)
    )
    assert without["teacher_forced_forward"].flops == 1088 + 2 * 448
    assert with_ref["teacher_forced_forward"].flops - without["teacher_forced_forward"].flops == 1040 + 2 * 432


@pytest.mark.parametrize("arch", [HAND, SMOLLM2], ids=["hand", "smollm2"])
@pytest.mark.parametrize(
    "shape",
    [
        IterationShape.uniform(4, 8, 45, 12),
        IterationShape.uniform(1, 1, 1, 1),
        IterationShape(((3, (1, 5)), (7, (2,)))),
    ],
    ids=["smollm2-demo", "one-token", "ragged"],
)
def test_floors_are_positive_and_finite(arch, shape):
    """Every phase has a positive, finite floor, but decode where every completion is one token (sampled from the
    prefill's logits: no decode forward at all)."""
    rates = MachineRates(matmul_gflops=150.0, bandwidth_gbs=12.0, threads=2)
    one_token = all(n == 1 for _, n in shape.sequences())
    for f in phase_floors(arch, shape, rates, lora=lora_parameters(arch, 8, ("q_proj", "v_proj"))):
        assert math.isfinite(f.floor_s), f
        assert f.floor_s > 0 or (f.phase == "decode" and one_token and f.flops == f.bytes == 0), f


def test_the_shape_of_rollouts_groups_them_by_group_id():
    rollouts = [
        SimpleNamespace(group_id=g, prompt_token_ids=[0] * (g + 2), token_ids=[1] * n)
        for g, n in [(0, 1), (1, 4), (0, 3)]
    ]
    assert IterationShape.from_rollouts(rollouts).groups == ((2, (1, 3)), (3, (4,)))


@pytest.mark.parametrize("groups", [(), ((0, (1,)),), ((3, ()),), ((3, (2, 0)),)])
def test_an_empty_prompt_group_or_completion_is_refused(groups):
    with pytest.raises(InputError):
        IterationShape(groups)


def test_measured_rates_are_positive_and_finite():
    rates = MachineRates.measure(HAND, threads=1, repeats=1, nbytes=1 << 20)
    assert rates.matmul_gflops > 0 and math.isfinite(rates.matmul_gflops)
    assert rates.bandwidth_gbs > 0 and math.isfinite(rates.bandwidth_gbs)


def _fake_iterations(repeats):
    """What `_iterations` returns for `repeats` iterations of 2 prompts x 2 samples: seconds per phase, rollouts."""
    seconds = dict.fromkeys((*PHASES, "sampler_other", "train_other"), 0.01)
    measured = [{**seconds, "iteration": 0.07} for _ in range(repeats)]
    rollouts = [SimpleNamespace(group_id=g, prompt_token_ids=[0, 1, 2], token_ids=[3, 4]) for g in (0, 0, 1, 1)]
    return measured, [rollouts] * repeats


def _table_rows(out: str) -> dict[str, list[str]]:
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines() if line.startswith("| ")]
    return {cells[0]: cells[1:] for cells in rows if cells[0] not in ("phase", "---")}  # header and rule left out


def test_rl_bench_floors_prints_one_row_per_phase_with_measured_floor_and_ratio(capsys, monkeypatch, tmp_path):
    """The table's layout on faked timings and rates (the real ones: the heavy test below)."""

    async def fake(root, base, real, repeats):
        return _fake_iterations(repeats)

    (tmp_path / "config.json").write_text(json.dumps({**SMOLLM2_CONFIG, "vocab_size": 10}))
    monkeypatch.setattr(
        floors_run, "_model_dir", lambda model, root: open_model(tmp_path, weights=False, tokenizer=False)
    )
    monkeypatch.setattr(floors_run, "_iterations", fake)
    monkeypatch.setattr(MachineRates, "measure", classmethod(lambda cls, arch, threads: UNIT_RATES))
    assert main(["bench", "--sections", "floors", "--repeats", "2", "--json"]) == 0
    out = capsys.readouterr().out
    rows = _table_rows(out)
    assert [line for line in out.splitlines() if line.startswith("| phase")] == [
        "| phase | measured s | floor s | measured / floor |"
    ]
    for phase in (*PHASES, "iteration"):
        measured, floor, ratio = (float(c) for c in rows[phase])
        assert floor > 0 and math.isfinite(ratio)
        assert ratio == pytest.approx(measured / floor, rel=1e-2)  # printed to 3-4 significant figures
    assert rows["sampler_other"][1:] == rows["train_other"][1:] == ["-", "-"]  # no floor bounds them
    figures = json.loads(out.strip().splitlines()[-1])
    for phase in PHASES:
        assert figures[f"floors_{phase}_floor_s"] > 0 and f"floors_{phase}_ratio" in figures


def test_model_without_the_floors_section_is_refused(capsys):
    assert main(["bench", "--sections", "sim", "--model", "smollm2"]) == 2
    assert "--model picks the floors and vllm sections' model" in capsys.readouterr().err


@pytest.mark.heavy
def test_rl_bench_floors_times_the_real_sampler_and_trainer(capsys):
    """Every phase is timed on the tiny model's real iteration: each wrapped function ran (a time above zero)."""
    figures, lines = floors_run.floors_bench(repeats=1)
    for phase in PHASES:
        assert figures[f"floors_{phase}_s"] > 0 and figures[f"floors_{phase}_floor_s"] > 0
    assert len(_table_rows("\n".join(lines))) == len(PHASES) + 3  # and sampler_other, train_other, iteration
