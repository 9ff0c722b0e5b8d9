"""Module 07 reference (solutions/block_tuning.py): the block rules against properties any
right answer has, the shared-memory model against every figure of the H100 sweep, the
figures the lesson ships against the sweep's CSV, the tuned kernel's pruning through this
module's model, and what the checks catch."""
import math
import random
import types

import course  # noqa: F401  (sets TRITON_INTERPRET on a CPU, before triton is imported)
import pytest
import torch

from course.checks import block_tuning as checks
from course.testing import CheckFailed
from grader import answer_key, paths
from solutions import block_tuning as key
from solutions import block_sweep, flash_tuned
from solutions.naive_attention import flash_dram_accesses

ROWS = key.sweep_rows()
TEACHING = [r for r in ROWS if r["impl"] == "teaching"]
ANSWERS = paths.lesson_file("07_block_tuning", "answers")


def _config(row):
    return tuple(int(row[k]) for k in ("block_q", "block_k", "num_warps", "num_stages"))


# ---------------------------------------------------------------------------------------
# check_block_config

def test_worked_example_of_the_lesson():
    blocks = {"block_q": 128, "block_kv": 512, "block_kv_compute": 64, "block_q_dkv": 128,
              "block_kv_dkv": 128, "block_q_dq": 128, "block_kv_dq": 96}
    adjusted, log = key.check_block_config(blocks, 4000, 77)
    assert adjusted == {"block_q": 128, "block_kv": 80, "block_kv_compute": 16, "block_q_dkv": 128,
                        "block_kv_dkv": 80, "block_q_dq": 128, "block_kv_dq": 80,
                        "q_len": 4096, "kv_len": 80}
    assert log == ["block_kv: 512 -> 80: short KV sequence (kv_len = 77)",
                   "block_kv_compute: 64 -> 16: must divide block_kv = 80",
                   "block_kv_dkv: 128 -> 80: must divide block_kv = 80",
                   "block_kv_dq: 96 -> 80: must divide block_kv = 80",
                   "q_len: 4000 -> 4096: padded to a multiple of block_q = 128",
                   "kv_len: 77 -> 80: padded to a multiple of block_kv = 80"]
    lesson = paths.lesson_path("07_block_tuning").read_text()
    for line in log:
        assert line in lesson, line


def test_adjusted_configurations_keep_every_constraint():
    """Properties, not a second implementation: what any right answer satisfies."""
    rng = random.Random(0)
    for _ in range(3000):
        blocks, q_len, kv_len = checks.random_config(rng)
        adjusted, log = key.check_block_config(dict(blocks), q_len, kv_len)
        assert all(adjusted[k] % 16 == 0 and adjusted[k] >= 16 for k in key.BLOCK_KEYS)
        for sub, parent in key.PARENTS.items():
            assert adjusted[parent] % adjusted[sub] == 0
            assert adjusted[sub] <= blocks[sub]  # sub-blocks never grow
        for block, length, n in (("block_q", "q_len", q_len), ("block_kv", "kv_len", kv_len)):
            assert adjusted[block] <= blocks[block] and adjusted[block] < n + 16
            assert adjusted[length] % adjusted[block] == 0 and n <= adjusted[length] < n + adjusted[block]
            for sub, parent in key.PARENTS.items():  # one padding serves the backward too
                if parent == block:
                    assert adjusted[length] % adjusted[sub] == 0
        changed = [k for k in adjusted if adjusted[k] != {**blocks, "q_len": q_len, "kv_len": kv_len}[k]]
        assert [line.split(":")[0] for line in log] == changed  # one line per change, in order
        again = {k: adjusted[k] for k in key.BLOCK_KEYS}  # an adjusted configuration stays
        assert key.check_block_config(again, adjusted["q_len"], adjusted["kv_len"]) == (adjusted, [])


def test_random_configurations_exercise_every_rule():
    rng = random.Random(1)
    seen = set()
    for _ in range(100):
        _, changes = ANSWERS.block_config(*checks.random_config(rng))
        seen |= {name for name, *_ in changes}
    assert seen == set(key.BLOCK_KEYS) | {"q_len", "kv_len"}


def test_bad_configurations_are_rejected():
    good = dict(zip(key.BLOCK_KEYS, (128, 64, 64, 64, 64, 128, 64)))
    for blocks, q_len, kv_len in [(dict(good, block_q=100), 10, 10), ({**good, "x": 16}, 10, 10),
                                  ({k: v for k, v in good.items() if k != "block_q"}, 10, 10),
                                  (good, 0, 10), (good, 10, 2.0), (dict(good, block_kv=True), 10, 10)]:
        with pytest.raises(ValueError):
            key.check_block_config(blocks, q_len, kv_len)
    with pytest.raises(TypeError):
        key.check_block_config(list(good.items()), 10, 10)


def test_block_check_names_a_log_out_of_order():
    def swapped(blocks, q_len, kv_len):
        adjusted, log = key.check_block_config(blocks, q_len, kv_len)
        return adjusted, log[::-1]
    with pytest.raises(CheckFailed, match="order of the rules"):
        checks.case_block_config(swapped, dict(zip(key.BLOCK_KEYS, (128, 96, 32, 64, 96, 64, 48))),
                                 1000, 1000)


def test_block_check_names_a_change_that_was_not_needed():
    def eager(blocks, q_len, kv_len):
        adjusted, log = key.check_block_config(blocks, q_len, kv_len)
        return dict(adjusted, block_q_dq=16), log
    with pytest.raises(CheckFailed, match="divides block_q = 128 already"):
        checks.case_block_config(eager, dict(zip(key.BLOCK_KEYS, (128, 64, 32, 64, 64, 128, 32))),
                                 4096, 4096)


# ---------------------------------------------------------------------------------------
# Shared memory

def test_model_equals_the_compiler_on_every_configuration_of_the_sweep():
    for r in TEACHING:
        bq, bk, _, s = _config(r)
        assert key.smem_bytes(bq, bk, int(r["D"]), torch.float16, s) == int(r["shared_bytes"]), r


def test_prune_keeps_exactly_what_compiled_on_the_h100():
    assert key.H100_SMEM_PER_BLOCK == 227 * 1024 == key.H100_SMEM_PER_SM - key.SMEM_RESERVED_PER_PROGRAM
    for D in (64, 128):
        for causal in ("False", "True"):
            for N in ("1024", "4096", "16384"):
                rows = [r for r in TEACHING if int(r["D"]) == D and r["causal"] == causal and r["N"] == N]
                assert len(rows) == 54
                kept = key.prune_configs([_config(r) for r in rows], D, torch.float16,
                                         key.H100_SMEM_PER_BLOCK)
                assert kept == [_config(r) for r in rows if r["status"] == "ok"]
    assert sum(r["status"] != "ok" for r in TEACHING) == 48  # 8 configurations x 6 shapes, D = 128


def test_default_limit_is_this_machines():
    expected = (torch.cuda.get_device_properties(0).shared_memory_per_block_optin
                if torch.cuda.is_available() else 232448)
    assert key.smem_limit() == expected
    exact, above = checks.limit_cases(expected)
    assert key.prune_configs([above, exact], 16, torch.float16) == [exact]


def test_prune_check_reads_the_same_answers_with_any_default_limit():
    """The visible check's default limit is the machine's (smem_limit()): whatever it is,
    the answers recorded on a CPU suffice, and the reference passes."""
    for default in (232448, 166912, 101376, 65536):
        def prune(configs, head_dim, dtype, limit=default):
            return key.prune_configs(configs, head_dim, dtype, limit)
        checks.check_prune_configs(prune, lambda default=default: default)


def test_stages_below_one_are_refused():
    for stages in (0, -1):
        with pytest.raises(ValueError):
            key.smem_bytes(64, 64, 64, torch.float16, stages)


def test_tuned_kernel_prunes_with_this_model(monkeypatch):
    """flash_tuned's autotuner hook keeps its shortlist's configs that prune_configs keeps."""
    monkeypatch.setattr(flash_tuned, "INTERPRET", False)
    shapes = [c for short in flash_tuned.SHORTLIST.values() for c in short]
    shapes += [flash_tuned.SHORT_Q, flash_tuned.FP32]
    configs = [flash_tuned._config(*c) for c in dict.fromkeys(shapes)]
    q = torch.empty(1, 1, 4096, 128, dtype=torch.float16)
    for limit, block_d in ((232448, 128), (101376, 128), (101376, 256), (50000, 64)):
        props = types.SimpleNamespace(shared_memory_per_block_optin=limit)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device, props=props: props)
        kept = flash_tuned._prune(configs, {"Q": q, "N_Q": 4096, "N_K": 4096, "CAUSAL": False, "BLOCK_D": block_d})
        wanted = flash_tuned.SHORTLIST[block_d]
        fit = key.prune_configs(wanted, block_d, torch.float16, limit)
        got = [(c.kwargs["BLOCK_Q"], c.kwargs["BLOCK_K"], c.num_warps, c.num_stages) for c in kept]
        assert got == (fit or [flash_tuned.FP32]), (limit, block_d)


# ---------------------------------------------------------------------------------------
# Traffic

def test_kernel_bytes_are_module_04s_model_in_bytes():
    assert key.kernel_dram_bytes(1, 1, 1000, 64, 128, torch.float32) == (
        flash_dram_accesses(1000, 64, 4 * 64 * 128) * 4 + 4000)
    assert flash_dram_accesses(1000, 64, 4 * 64 * 128) == 2 * 1000 * 64 * (1 + math.ceil(1000 / 128))


def test_intensity_under_the_model_is_about_block_q():
    for D in (64, 128):
        for bq in (64, 128, 256):
            flops = 4 * 16 * 16384 ** 2 * D
            intensity = flops / key.kernel_dram_bytes(1, 16, 16384, D, bq, torch.float16)
            assert 0.98 * bq < intensity < bq


def test_small_query_blocks_measured_above_the_dram_roof():
    """What the lesson says of the roofline: the model's DRAM traffic is an overcount."""
    above = []
    for D in (64, 128):
        for config, t in zip(key.SWEEP_CONFIGS, key.H100_SWEEP_TFLOPS[(D, False, 16384)]):
            roof = key.H100_HBM_TB_PER_S * 4 * 16 * 16384 ** 2 * D / key.kernel_dram_bytes(
                1, 16, 16384, D, config[0], torch.float16)
            if t is not None and t > roof:
                above.append((D, config))
    assert {D for D, c in above if c[0] == 64} == {64, 128}  # 64-row blocks beat their roof at both D
    assert not [c for _, c in above if c[0] == 256]
    assert max(t for c, t in zip(key.SWEEP_CONFIGS, key.H100_SWEEP_TFLOPS[(128, False, 16384)])
               if c[0] == 64 and t is not None) == 409.8  # "measured up to 410"


# ---------------------------------------------------------------------------------------
# The figures the lesson ships, against the CSV

def test_sweep_literals_equal_the_csv():
    assert key.SWEEP_CONFIGS == tuple(block_sweep.CONFIGS)
    for D, shared in key.H100_SWEEP_SHARED.items():
        rows = {_config(r): int(r["shared_bytes"]) for r in TEACHING if int(r["D"]) == D}
        assert shared == tuple(rows[c] for c in key.SWEEP_CONFIGS)
    for (D, causal, N), speeds in key.H100_SWEEP_TFLOPS.items():
        assert speeds == tuple(key.measured_tflops(ROWS, D, causal, N, c) for c in key.SWEEP_CONFIGS)
    assert len(key.H100_SWEEP_TFLOPS) == len(key.H100_SWEEP_SDPA) == 12
    for (D, causal, N), pair in key.H100_SWEEP_SDPA.items():
        got = {r["impl"]: float(r["tflops"]) for r in ROWS if r["impl"].startswith("sdpa")
               and (int(r["D"]), r["causal"], int(r["N"])) == (D, str(causal), N)}
        assert pair == (got["sdpa-flash"], got["sdpa-cudnn"])


def test_prediction_facts_and_answers():
    D, causal, N = key.PREDICT_SHAPE
    regs = {_config(r): int(r["regs"]) for r in TEACHING
            if (int(r["D"]), r["causal"], int(r["N"])) == (D, str(causal), N) and r["status"] == "ok"}
    assert key.PREDICT_REGISTERS == {k: regs[c] for k, c in key.PREDICT_CONFIGS.items()}
    assert key.fastest_answer == key.measured_winner() == "c"
    speeds = sorted((key.measured_tflops(ROWS, D, causal, N, c) for c in key.PREDICT_CONFIGS.values()),
                    reverse=True)
    assert speeds[0] > 1.1 * speeds[1]  # a clear winner, well beyond run-to-run noise
    held = {k: min(key.programs_per_sm(key.smem_bytes(bq, bk, D, torch.float16, s),
                                       key.PREDICT_REGISTERS[k], w).values())
            for k, (bq, bk, w, s) in key.PREDICT_CONFIGS.items()}
    assert held == {"a": 5, "b": 2, "c": 2, "d": 1}
    assert key.why_answer in "abcd" and len(key.why_answer) == 1


def test_checks_agree_with_the_given_constants():
    assert checks.BLOCK_NAMES == key.BLOCK_KEYS
    assert checks.SUB_BLOCKS == tuple(key.PARENTS.items())
    assert checks.GRANULE == key.MIN_BLOCK


# ---------------------------------------------------------------------------------------
# The reference passes every visible check and hidden test

CHECKED = {
    "test_check_block_config": ("check_block_config_rules", (key.check_block_config,)),
    "test_smem_bytes": ("check_smem_bytes", (key.smem_bytes,)),
    "test_prune_configs": ("check_prune_configs", (key.prune_configs, key.smem_limit)),
    "test_fastest": ("check_choice", (key.fastest_answer,)),
    "test_why": ("check_choice", (key.why_answer,)),
    "test_kernel_dram_bytes": ("check_kernel_dram_bytes", (key.kernel_dram_bytes,)),
}


@pytest.mark.parametrize("test_cell", CHECKED)
def test_reference_passes_visible_checks_and_hidden_tests(test_cell):
    check, args = CHECKED[test_cell]
    extra = {"name": test_cell[5:] + "_answer"} if check == "check_choice" else {}
    getattr(checks, check)(*args, **extra)
    getattr(answer_key.hidden("07_block_tuning"), test_cell)(*args)


def test_wrong_answers_fail():
    hidden = answer_key.hidden("07_block_tuning")
    for test_cell, right in (("test_fastest", key.fastest_answer), ("test_why", key.why_answer)):
        for wrong in set("abcd") - {right}:
            with pytest.raises(CheckFailed, match="not the right choice"):
                getattr(hidden, test_cell)(wrong)
