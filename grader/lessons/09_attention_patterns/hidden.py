"""Hidden tests of module 09: the visible cases on inputs the learner never saw (several
seeds; lengths, channels and head dims that are not powers of two nor multiples of the
blocks; grouped heads; fp32 and fp16, bf16 and longer sequences on a GPU; every layout of
the inputs and of the kernels' outputs; values far above and far below zero; RoPE offsets
up to thousands and other bases; head counts from 1 to 128; windows of 1, of a few keys
and longer than the sequence, with and without q_offset), and the answers to the
questions."""
import torch
import triton

from course import INTERPRET
from course.checks import attention_patterns as visible
from course.checks.attention_patterns import BF16, F16, F32, LAYOUTS, MATRIX_LAYOUTS, OUT_LAYOUTS
from course.testing import check_rejects, graded_choice
from solutions import attention_patterns as key

SEEDS = (91, 92, 93)
DTYPES = (F32, F16) if INTERPRET else (F32, F16, BF16)


def _generator(seed):
    g = torch.Generator().manual_seed(seed)

    def pick(options):
        return options[int(torch.randint(len(options), (1,), generator=g))]

    def between(low, high):
        return int(torch.randint(low, high + 1, (1,), generator=g))
    return pick, between


# ---------------------------------------------------------------------------------------
# 1. qkv_projection

def test_qkv_projection(fn):
    def case(*args, **kwargs):
        visible.case_projection_random(fn, *args, quiet=True, **kwargs)
    cases = [  # (B, N, C, heads, kv_heads, D)
        (1, 1, 16, 1, 1, 16), (3, 7, 37, 5, 5, 24), (2, 13, 50, 6, 2, 16), (1, 21, 24, 8, 1, 40),
        (2, 5, 72, 3, 3, 48),
    ]
    for i, ((B, N, C, heads, kv_heads, D), seed) in enumerate(zip(cases, SEEDS * 2)):
        case(B, N, C, heads, kv_heads, D, DTYPES[i % 2], seed=seed + i,
             layouts=(MATRIX_LAYOUTS[i % 3], MATRIX_LAYOUTS[(i + 1) % 3]))
    for i, seed in enumerate(SEEDS):
        pick, between = _generator(seed)
        kv_heads = between(1, 3)
        case(between(1, 3), between(2, 17), between(8, 60), kv_heads * pick((1, 2, 4)), kv_heads,
             pick((16, 24, 32)), pick(DTYPES), seed=seed, kind=pick(("far_above", "far_below")),
             layouts=(pick(MATRIX_LAYOUTS), pick(MATRIX_LAYOUTS)))
    if not INTERPRET:
        case(4, 500, 512, 32, 8, 128, BF16, seed=SEEDS[0], layouts=("contiguous", "transposed"))
        case(2, 333, 1000, 12, 12, 64, F16, seed=SEEDS[1], kind="far_below")
    check_rejects(visible.bad_projection_inputs(fn), name="qkv_projection")


# ---------------------------------------------------------------------------------------
# 2. rope and the question

def test_rope(fn):
    def case(*args, **kwargs):
        visible.case_rope_random(fn, *args, quiet=True, **kwargs)
    cases = [  # (B, H, N, D, offset, base)
        (1, 1, 1, 2, 0, 10000.0), (2, 3, 17, 24, 9, 10000.0), (1, 2, 33, 40, 120, 500000.0),
        (3, 1, 10, 72, 0, 1000.0), (1, 4, 25, 64, 4095, 10000.0), (2, 2, 8, 18, 7, 10000.0),
    ]
    for i, ((B, H, N, D, offset, base), seed) in enumerate(zip(cases, SEEDS * 2)):
        dtype = F16 if offset > 1000 else DTYPES[i % 2]  # fp32 angles are exact to ~1e-5 rad up to ~200
        case(B, H, N, D, dtype, seed=seed + i, offset=offset, base=base, layout=LAYOUTS[i % 4])
    for i, seed in enumerate(SEEDS):
        pick, between = _generator(seed)
        dtype = pick(DTYPES)
        case(between(1, 2), between(1, 3), between(2, 40), 2 * between(4, 40), dtype, seed=seed,
             offset=between(0, 150 if dtype == F32 else 5000),
             kind=pick(("random", "far_above", "far_below")), layout=pick(LAYOUTS))
    if not INTERPRET:
        case(2, 8, 1000, 128, BF16, seed=SEEDS[2], offset=7000, layout="bnhd")
    check_rejects([("an odd head dim (33)", lambda: fn(torch.ones(1, 2, 5, 33, device=visible.DEVICE)))],
                  name="rope")


def test_relative(answer):
    graded_choice(answer, "relative_answer", key.relative_answer,
            "write the score as (R_m q) · (R_n k) = qᵀ R_mᵀ R_n k, and remember what turning by -m "
            "and then by n adds up to.")


# ---------------------------------------------------------------------------------------
# 3. rope_kernel

def test_rope_kernel(kernel):
    def case(*args, **kwargs):
        visible.case_rope_kernel_random(kernel, *args, quiet=True, **kwargs)
    cases = [  # (B, H, N, D, offset, base, block_n)
        (1, 1, 1, 16, 0, 10000.0, 16), (2, 3, 45, 24, 3, 10000.0, 16), (1, 2, 70, 40, 100, 500000.0, 32),
        (3, 1, 17, 80, 0, 1000.0, 16), (1, 2, 33, 64, 3500, 10000.0, 32), (2, 1, 19, 48, 77, 10000.0, 16),
    ]
    for i, ((B, H, N, D, offset, base, block_n), seed) in enumerate(zip(cases, SEEDS * 2)):
        dtype = F16 if offset > 1000 else DTYPES[i % 2]
        case(B, H, N, D, dtype, seed=seed + i, offset=offset, base=base, block_n=block_n,
             layout=LAYOUTS[(i + 1) % 4], out_layout=OUT_LAYOUTS[i % 3])
    for i, seed in enumerate(SEEDS):
        pick, between = _generator(seed + 10)
        dtype = pick(DTYPES)
        case(between(1, 2), between(1, 3), between(1, 60), pick((16, 24, 32, 40, 56)), dtype, seed=seed,
             offset=between(0, 150 if dtype == F32 else 5000), block_n=pick((16, 32)),
             kind=pick(("random", "far_above", "far_below")), layout=pick(LAYOUTS),
             out_layout=pick(OUT_LAYOUTS))
    if not INTERPRET:
        case(2, 8, 1000, 128, BF16, seed=SEEDS[0], offset=7000, block_n=64, layout="bnhd",
             out_layout="sliced")
        case(1, 4, 777, 96, F32, seed=SEEDS[1], offset=1, block_n=128, layout="transposed")


# ---------------------------------------------------------------------------------------
# 4. alibi_slopes

def test_alibi_slopes(fn):
    for heads in (1, 2, 4, 5, 7, 10, 13, 20, 24, 32, 40, 48, 64, 96, 100, 128):
        visible.case_alibi_slopes(fn, heads, quiet=True)
    check_rejects([("heads = -4", lambda: fn(-4))], name="alibi_slopes")


# ---------------------------------------------------------------------------------------
# 5. key_block_range and the question

def test_key_block_range(fn):
    cases = [  # (q_block, n_q, n_k, block_q, block_k, q_offset, causal, window)
        (0, 1, 1, 16, 16, 0, True, 1), (3, 100, 100, 16, 16, 0, False, None),
        (5, 97, 97, 16, 32, 0, True, None), (2, 50, 130, 16, 16, 80, True, 1),
        (6, 129, 129, 16, 16, 0, True, 33), (1, 64, 64, 32, 16, 0, True, 16),
        (2, 64, 64, 16, 32, 0, True, 17), (0, 20, 20, 32, 32, 0, True, 500),
        (31, 4096, 4096, 64, 64, 0, True, 512), (10, 1000, 3000, 64, 32, 2000, True, 700),
        (6, 200, 200, 32, 16, 0, False, 9),  # a window without causal=True is causal too
    ]
    for q_block, n_q, n_k, bq, bk, q_offset, causal, window in cases:
        visible.case_key_block_range(fn, q_block, n_q, n_k, bq, bk, q_offset=q_offset, causal=causal,
                                     window=window)
    for seed in SEEDS:
        pick, between = _generator(seed + 20)
        for _ in range(8):
            bq, bk = pick((16, 32, 64)), pick((16, 32, 64))
            n_q = between(1, 300)
            n_k = n_q + pick((0, 0, between(1, 200)))
            q_offset = pick((0, n_k - n_q, between(0, n_k - n_q)))
            window = pick((None, 1, between(2, 64), between(65, 400)))
            visible.case_key_block_range(fn, between(0, triton.cdiv(n_q, bq) - 1), n_q, n_k, bq, bk,
                                         q_offset=q_offset, causal=bool(between(0, 1)) or window is not None,
                                         window=window)


def test_window_blocks(answer):
    graded_choice(answer, "window_blocks_answer", key.window_blocks_answer,
            "find the first key the block's first query sees (2048 - 512 + 1) and its block, and "
            "the block of the last query's own key; count the blocks from one to the other.")


# ---------------------------------------------------------------------------------------
# 6. pattern_attention_kernel

def _random_patterns(seed, count):
    """(B, H, Hkv, Nq, Nk, D, blocks, dtype, layouts, pattern) drawn from seed."""
    pick, between = _generator(seed)
    cases = []
    for _ in range(count):
        Hkv = between(1, 2)
        H = Hkv * pick((1, 2, 3))
        Nq = between(1, 60)
        Nk = Nq + pick((0, between(0, 40)))
        window = pick((None, None, 1, between(2, 30), 200))
        causal = window is not None or bool(between(0, 1))
        pattern = dict(q_offset=pick((0, Nk - Nq, between(0, Nk - Nq))), causal=causal, window=window,
                       rope=bool(between(0, 1)), alibi=bool(between(0, 1)))
        dtype = pick(DTYPES)
        cases.append((between(1, 2), H, Hkv, Nq, Nk, pick((16, 24, 32, 48)), (pick((16, 32)), pick((16, 32))),
                      dtype, tuple(pick(LAYOUTS) for _ in range(3)), pattern))
    return cases


def test_pattern_attention_kernel(kernel):
    def case(*args, **kwargs):
        visible.case_pattern_kernel_random(kernel, *args, quiet=True, **kwargs)
    cases = [  # (B, H, Hkv, Nq, Nk, D, blocks, pattern)
        (1, 1, 1, 1, 1, 16, (16, 16), dict(rope=True, alibi=True, window=1)),
        (2, 3, 1, 45, 70, 24, (16, 32), dict(rope=True, q_offset=25)),
        (1, 4, 4, 50, 50, 40, (32, 16), dict(alibi=True, window=21)),
        (2, 2, 1, 29, 61, 16, (16, 16), dict(rope=True, alibi=True, causal=True, q_offset=32)),
        (1, 6, 2, 64, 64, 32, (16, 16), dict(window=16, alibi=True)),
        (1, 2, 2, 37, 37, 48, (32, 32), dict(rope=True, rope_base=500000.0, window=100)),
    ]
    for i, ((B, H, Hkv, Nq, Nk, D, blocks, pattern), seed) in enumerate(zip(cases, SEEDS * 2)):
        case(B, H, Hkv, Nq, Nk, D, DTYPES[i % 2], seed=seed + i, blocks=blocks,
             layouts=tuple(LAYOUTS[(i + j) % 4] for j in range(3)), out_layout=OUT_LAYOUTS[i % 3], **pattern)
    for i, (B, H, Hkv, Nq, Nk, D, blocks, dtype, layouts, pattern) in \
            enumerate(_random_patterns(SEEDS[1], 4)):
        case(B, H, Hkv, Nq, Nk, D, dtype, seed=SEEDS[2] + i, blocks=blocks, layouts=layouts,
             out_layout=OUT_LAYOUTS[i % 3], **pattern)
    case(1, 2, 1, 40, 40, 64, F32, seed=SEEDS[0], kind="extreme", alibi=True, causal=True, blocks=(16, 16))
    case(1, 2, 2, 41, 50, 32, F16, seed=SEEDS[1], kind="extreme", window=9, q_offset=9, out_layout="sliced",
         layouts=("transposed", "bnhd", "contiguous"))
    case(1, 1, 1, 21, 75, 16, F16, seed=SEEDS[2], kind="big_v", alibi=True, blocks=(32, 16))
    case(1, 2, 1, 18, 66, 24, F16, seed=SEEDS[0], kind="big_v_negative", window=30, q_offset=48,
         out_layout="bnhd", layouts=("sliced", "contiguous", "bnhd"), blocks=(16, 16))
    if not INTERPRET:
        case(2, 8, 2, 1000, 1000, 128, BF16, seed=SEEDS[1], rope=True, alibi=True, window=300,
             blocks=(128, 64))
        case(1, 4, 4, 333, 901, 64, F16, seed=SEEDS[2], rope=True, causal=True, q_offset=568, blocks=(64, 64),
             layouts=("bnhd",) * 3)
        case(2, 2, 1, 300, 300, 256, F32, seed=SEEDS[0], alibi=True, window=77, blocks=(64, 32))


# ---------------------------------------------------------------------------------------
# 7. pattern_attention

def test_pattern_attention(fn, kernel):
    def case(*args, **kwargs):
        visible.case_pattern_wrapper_random(fn, kernel, *args, quiet=True, **kwargs)
    cases = [  # (B, H, Hkv, Nq, Nk, D, blocks, options)
        (1, 1, 1, 1, 1, 16, None, dict(rope=True, alibi=True, window=1)),
        (2, 2, 1, 70, 45, 24, None, dict(rope=True, rope_base=500000.0)),
        (1, 4, 2, 37, 77, 40, (16, 32), dict(alibi=True, causal=True, q_offset=40)),
        (2, 2, 2, 50, 50, 16, (32, 16), dict(window=13, rope=True)),
        (1, 3, 3, 45, 45, 48, None, dict(alibi=True, window=200, sm_scale=0.2)),
        (1, 2, 1, 30, 61, 32, (16, 16), dict(window=20, q_offset=31, rope=True, alibi=True)),
    ]
    for i, ((B, H, Hkv, Nq, Nk, D, blocks, options), seed) in enumerate(zip(cases, SEEDS * 2)):
        case(B, H, Hkv, Nq, Nk, D, DTYPES[i % 2], seed=seed + i, blocks=blocks,
             layouts=tuple(LAYOUTS[(i + j + 2) % 4] for j in range(3)), **options)
    for i, (B, H, Hkv, Nq, Nk, D, blocks, dtype, layouts, pattern) in \
            enumerate(_random_patterns(SEEDS[2], 3)):
        case(B, H, Hkv, Nq, Nk, D, dtype, seed=SEEDS[0] + i, blocks=blocks if i % 2 else None,
             layouts=layouts, **pattern)
    case(1, 2, 2, 41, 41, 64, F16, seed=SEEDS[0], kind="extreme", alibi=True, window=10)
    case(2, 1, 1, 37, 50, 32, F32, seed=SEEDS[1], kind="extreme", causal=True, q_offset=13,
         layouts=("transposed", "sliced", "contiguous"))
    case(1, 1, 1, 19, 70, 16, F16, seed=SEEDS[2], kind="big_v_negative", rope=True, blocks=(16, 32))
    case(1, 2, 1, 23, 64, 24, F32, seed=SEEDS[0], kind="big_v", window=5, q_offset=41,
         layouts=("contiguous", "bnhd", "sliced"))
    if not INTERPRET:
        for dtype in (F16, BF16):  # real sizes, default GPU blocks
            case(2, 8, 2, 1024 + 7, 2048 - 3, 128, dtype, seed=SEEDS[1], rope=True, alibi=True, window=512,
                 q_offset=(2048 - 3) - (1024 + 7), layouts=("bnhd",) * 3)  # a KV cache: Nk - Nq
            case(1, 4, 4, 500, 500, 256, dtype, seed=SEEDS[2], causal=True, alibi=dtype == F16)
    x = torch.ones(1, 2, 8, 16, device=visible.DEVICE)
    check_rejects(visible.bad_inputs(fn) + visible.bad_pattern_options(fn) + [
        ("a window of -3", lambda: fn(x, x, x, window=-3)),
        ("alibi_slopes given as a list", lambda: fn(x, x, x, alibi_slopes=[0.5, 0.25])),
        ("RoPE with an odd head dim (33)", lambda: fn(*(torch.ones(1, 2, 8, 33, device=visible.DEVICE),) * 3,
                                                      rope=True)),
    ], name="pattern_attention")
