"""Hidden tests of module 07: the visible cases on configurations the learner never saw
(hundreds of random block configurations from three seeds, with sequences short and long
on either side; every configuration of the H100 sweep against the shared memory Triton's
compiler reported; random head dims, dtypes, stages, limits and orders; lengths that are
not multiples of the block), and the predictions graded against the sweep's CSV."""
import random

import torch

from course.checks import block_tuning as visible
from course.testing import check_rejects, graded_choice
from solutions import block_tuning as key

SEEDS = (71, 72, 73)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _blocks(*sizes):
    return dict(zip(key.BLOCK_KEYS, sizes))


def test_check_block_config(fn):
    edges = [  # (blocks, q_len, kv_len)
        (_blocks(16, 16, 16, 16, 16, 16, 16), 1, 1),
        (_blocks(16, 16, 16, 16, 16, 16, 16), 17, 15),
        (_blocks(1024, 1024, 1024, 1024, 1024, 1024, 1024), 100_000, 100_000),
        (_blocks(1024, 2048, 512, 256, 2048, 1024, 128), 33, 1000),          # short queries
        (_blocks(240, 112, 96, 160, 64, 48, 224), 5000, 5000),                 # no power of two
        (_blocks(128, 128, 256, 256, 256, 256, 256), 4096, 4096),              # every sub-block too big
        (_blocks(256, 512, 384, 128, 512, 256, 512), 8192, 257),               # short KV, odd length
        (_blocks(64, 64, 32, 64, 64, 32, 32), 64, 64),                         # already a multiple
        (_blocks(512, 512, 128, 512, 512, 512, 512), 77, 77),                  # both short
    ]
    for blocks, q_len, kv_len in edges:
        visible.case_block_config(fn, blocks, q_len, kv_len)
    for seed in SEEDS:
        rng = random.Random(seed)
        for _ in range(100):
            visible.case_block_config(fn, *visible.random_config(rng))
    good = _blocks(128, 64, 64, 64, 64, 128, 64)
    check_rejects(visible.bad_block_inputs(fn) + [
        ("a list instead of a dict", lambda: fn(list(good.values()), 100, 100)),
        ("block_kv = -64", lambda: fn(dict(good, block_kv=-64), 100, 100)),
        ("block_q_dq = 24, not a multiple of 16", lambda: fn(dict(good, block_q_dq=24), 100, 100)),
        ("q_len = 0", lambda: fn(good, 0, 100)),
        ("block_q = True", lambda: fn(dict(good, block_q=True), 100, 100)),
    ], name="check_block_config")


def test_smem_bytes(fn):
    rows = [r for r in key.sweep_rows() if r["impl"] == "teaching"]
    seen = set()
    for r in rows:  # what Triton's compiler gave (or asked for) on the H100
        case = (int(r["block_q"]), int(r["block_k"]), int(r["D"]), torch.float16, int(r["num_stages"]))
        if case not in seen:
            seen.add(case)
            visible.case_smem_bytes(fn, *case, want=int(r["shared_bytes"]))
    rng = random.Random(SEEDS[0])
    for _ in range(60):
        visible.case_smem_bytes(fn, 16 * rng.randint(1, 16), 16 * rng.randint(1, 16),
                                rng.randint(16, 256), rng.choice(DTYPES), rng.randint(1, 6))
    visible.case_smem_bytes(fn, 1, 1, 1, torch.float32, 1)
    check_rejects([("stages = 0", lambda: fn(128, 64, 128, torch.bfloat16, 0)),
                   ("stages = -2", lambda: fn(64, 64, 64, torch.float32, -2))], name="smem_bytes")


def test_prune_configs(fn, smem_limit):
    default = smem_limit()

    def case(configs, head_dim, dtype, limit=None):
        visible.case_prune_configs(fn, configs, head_dim, dtype, limit, default)
    for D in (64, 128):  # the H100 sweep's 54 configurations (the model keeps what compiled)
        case(list(key.SWEEP_CONFIGS), D, torch.float16, key.H100_SMEM_PER_BLOCK)
    rng = random.Random(SEEDS[1])
    for _ in range(25):
        configs = [(16 * rng.randint(1, 16), 16 * rng.randint(1, 16), rng.choice((2, 4, 8)),
                    rng.randint(1, 5)) for _ in range(rng.randint(1, 12))]
        case(configs, rng.randint(16, 256), rng.choice(DTYPES), rng.randint(20_000, 300_000))
    for dtype in (torch.float16, torch.bfloat16):  # at the default limit, and 1 KiB above it
        case(visible.limit_cases(default)[::-1], 16, dtype)
    case([(64, 64, 8, 3)] * 3 + [(256, 128, 4, 4)], 128, torch.bfloat16)
    case([(128, 64, 2, 4), (64, 64, 8, 2), (32, 32, 1, 6)], 96, torch.float16, 150000)
    case([], 128, torch.float32)


def test_fastest(answer):
    graded_choice(answer, "fastest_answer", key.measured_winner(),
                   "on the H100 another configuration ran faster. Weigh the three limits of "
                   "the table: reads of K and V, programs per SM, and what each thread holds.")


def test_why(answer):
    graded_choice(answer, "why_answer", key.why_answer,
                   "each of the other options names one limit and ignores the others; which "
                   "one explains why the largest tile AND the deepest pipeline lost?")


def test_kernel_dram_bytes(fn):
    cases = [(1, 1, 1, 1, 16, torch.float32), (1, 16, 16384, 64, 64, torch.float16),
             (1, 16, 16384, 128, 256, torch.bfloat16), (7, 3, 999, 72, 128, torch.float32),
             (2, 5, 129, 256, 128, torch.float16), (1, 2, 100_000, 40, 64, torch.bfloat16)]
    rng = random.Random(SEEDS[2])
    cases += [(rng.randint(1, 8), rng.randint(1, 32), rng.randint(1, 50_000), rng.randint(16, 256),
               16 * rng.randint(1, 16), rng.choice(DTYPES)) for _ in range(40)]
    for case in cases:
        visible.case_kernel_dram_bytes(fn, *case)
