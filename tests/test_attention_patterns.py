"""Module 09 (patterns around attention): the answer key's references (answers.py: RoPE, the
dense attention with every pattern, the projection's columns) against independent
computations (Hugging Face's rotate_half RoPE, PyTorch's SDPA with an explicit bias, the
ALiBi paper's values, a brute-force search of key blocks) and against what the checks
compare with; what the checks catch, shown with stand-ins, from the recorded table where
the inputs are visible ones (the GPU's cases included); the reference passing every visible
check and hidden test; the kernels' block counts and the worked example.

On a CPU the kernels run through Triton's interpreter at small sizes; on a GPU the same
tests run compiled (course.testing picks the tolerances).
"""
import itertools
import math

import course  # noqa: F401  (sets TRITON_INTERPRET on a CPU, before triton is imported)
import pytest
import torch
import torch.nn.functional as F
import triton

from course import DEVICE, INTERPRET, recorded
from course.checks import attention_patterns as checks
from course.testing import CheckFailed, assert_close, randn
from grader import answer_key
from grader.paths import lesson_file
from solutions import attention_patterns as ap

F32, F16 = torch.float32, torch.float16
answers = lesson_file("09_attention_patterns", "answers")


# ---------------------------------------------------------------------------------------
# The references against independent computations

def _rotate_half_rope(x, positions, base):
    """Hugging Face's Llama RoPE: x * cos + rotate_half(x) * sin, the angles repeated twice."""
    D = x.shape[-1]
    inv_freq = 1.0 / base ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    angle = torch.cat([positions[:, None] * inv_freq] * 2, dim=-1)
    x1, x2 = x[..., :D // 2], x[..., D // 2:]
    return x * angle.cos() + torch.cat([-x2, x1], dim=-1) * angle.sin()


def test_rope_reference_is_rotate_half():
    x = randn(2, 3, 11, 24, dtype=torch.float64, seed=1)
    positions = 7 + torch.arange(11, dtype=torch.float64)
    assert_close(answers.turned(x, positions, 500.0), _rotate_half_rope(x, positions, 500.0),
                 quiet=True)


def test_interleaved_pairing_is_halves_with_the_lanes_permuted():
    x = randn(1, 2, 9, 16, dtype=torch.float64, seed=2)
    positions = torch.arange(9, dtype=torch.float64)
    to_interleaved = torch.stack([torch.arange(8), torch.arange(8, 16)], dim=-1).flatten()  # 0, 8, 1, 9, ...
    halves = answers.turned(x, positions)
    interleaved = answers.turned(x[..., to_interleaved], positions, pairing="interleaved")
    assert_close(interleaved, halves[..., to_interleaved], quiet=True)
    assert not torch.allclose(answers.turned(x, positions, pairing="interleaved"), halves)


def test_rope_scores_depend_only_on_the_distance():
    q, k = randn(24, seed=3, dtype=torch.float64), randn(24, seed=4, dtype=torch.float64)
    turned_q = ap.rope(q.expand(1, 1, 40, 24)).double()[0, 0]
    turned_k = ap.rope(k.expand(1, 1, 40, 24)).double()[0, 0]
    scores = turned_q @ turned_k.T
    for shift in (-5, 0, 3):
        diagonal = scores.diagonal(shift)
        assert torch.allclose(diagonal, diagonal[0].expand_as(diagonal), atol=1e-5)
    assert not torch.allclose(scores.diagonal(0)[0], scores.diagonal(3)[0])


def test_rope_offset_turns_from_that_position():
    x = randn(1, 2, 10, 32, seed=5)
    assert_close(ap.rope(x, offset=100), ap.rope(torch.cat([torch.zeros(1, 2, 100, 32), x], 2))[:, :, 100:],
                 quiet=True)


def test_alibi_slopes_are_the_papers():
    assert ap.alibi_slopes(8).tolist() == pytest.approx([2.0 ** -e for e in range(1, 9)])
    twelve = ap.alibi_slopes(12).tolist()  # the 8 of 8 heads, then 4 of the 16 of 16 heads
    assert twelve[:8] == pytest.approx([2.0 ** -e for e in range(1, 9)])
    assert twelve[8:] == pytest.approx([2 ** -0.5, 2 ** -1.5, 2 ** -2.5, 2 ** -3.5])


def test_alibi_solution_equals_the_checks_recursion():
    for heads in range(1, 130):
        assert ap.alibi_slopes(heads).double().tolist() == pytest.approx(answers.alibi_slopes(heads),
                                                                         rel=1e-6)


@pytest.mark.parametrize("causal, gqa", [(False, False), (True, True)])
def test_pattern_reference_without_patterns_is_sdpa(causal, gqa):
    q = randn(2, 4, 30, 16, dtype=torch.float64, seed=6)
    k, v = (randn(2, 2 if gqa else 4, 30, 16, dtype=torch.float64, seed=s) for s in (7, 8))
    o, lse = answers.attention(q, k, v, scale=0.3, causal=causal)
    assert_close(o, F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=0.3, enable_gqa=gqa),
                 quiet=True)


def test_pattern_reference_with_every_pattern_is_sdpa_with_an_explicit_bias():
    """KV cache (q_offset = Nk - Nq), RoPE, ALiBi and a window of 9 as one additive mask."""
    Nq, Nk, H = 12, 40, 4
    q, k, v = (randn(1, H, n, 16, dtype=torch.float64, seed=s) for s, n in ((9, Nq), (10, Nk), (11, Nk)))
    slopes = ap.alibi_slopes(H)
    o, lse = answers.attention(q, k, v, scale=0.25, q_offset=Nk - Nq, window=9, rope=True, slopes=slopes)
    distance = (Nk - Nq + torch.arange(Nq))[:, None] - torch.arange(Nk)
    bias = -slopes.double()[:, None, None] * distance.abs()
    bias = bias.masked_fill((distance < 0) | (distance >= 9), float("-inf"))
    turned_q, turned_k = _rotate_half_rope(q, Nk - Nq + torch.arange(Nq, dtype=torch.float64), 10000.0), \
        _rotate_half_rope(k, torch.arange(Nk, dtype=torch.float64), 10000.0)
    assert_close(o, F.scaled_dot_product_attention(turned_q, turned_k, v, attn_mask=bias, scale=0.25),
                 quiet=True)
    assert_close(lse, torch.logsumexp(turned_q @ turned_k.transpose(-1, -2) * 0.25 + bias, -1), quiet=True)


@pytest.mark.parametrize("options", [dict(), dict(causal=True, q_offset=10), dict(window=7, q_offset=25),
                                     dict(rope=True, alibi=True, window=9, q_offset=25, rope_base=500.0),
                                     dict(rope=True, alibi=True, causal=True)])
def test_the_checks_expected_attention_is_the_answer_keys_dense_one(options):
    """The checks' SDPA with a score bias, on q and k turned by the recorded RoPE (computed
    here, as for a hidden test), against answers.attention; grouped heads."""
    q, k, v = checks.pattern_values(2, 4, 2, 15, 40, 24, F32, seed=24,
                                    layouts=("bnhd", "sliced", "contiguous"))
    slopes = ap.alibi_slopes(4) if options.get("alibi") else None
    pattern = checks._pattern(slopes=slopes, **{key: options[key] for key in options if key != "alibi"})
    with recorded.computing(answer_key.resolve):
        asked = {what: recorded.answer("attention_patterns", name, *args) for what, (name, args)
                 in checks.pattern_questions(q, k, v, scale=0.3, blocks=(16, 16), pattern=pattern).items()}
    o, lse = checks._expected_pattern((q, k, v), {which: asked[which] for which in "qk" if which in asked},
                                      scale=0.3, pattern=pattern)
    want_o, want_lse = answers.attention(q, k, v, scale=0.3, **pattern)
    assert_close(o, want_o, atol=1e-6, rtol=1e-6, quiet=True)  # RoPE recorded to 7 digits
    assert_close(lse, want_lse, atol=1e-6, rtol=1e-6, quiet=True)


def test_projection_columns_read_the_solutions_views_and_tell_the_slips_apart():
    x, w = checks.projection_inputs(2, 7, 24, (4 + 2 * 4) * 8, F32, seed=25)
    product = x.double() @ w.double().T
    for kv_heads in (4, 2):
        rows = (4 + 2 * kv_heads) * 8
        columns = answers.projection_columns(rows, 4, kv_heads)
        want = ap.qkv_projection(x.double(), w[:rows].double(), 4, kv_heads)
        for got, right in zip((checks._read(product[..., :rows], part) for part in columns["parts"]), want):
            assert torch.allclose(got, right, rtol=1e-12, atol=1e-12)  # the same sums, maybe in another order
        slips = {"per_head", "lanes_outer"} if kv_heads == 4 else {"lanes_outer"}  # per_head: as many k as q
        assert set(columns) == {"parts"} | slips
        assert all(columns[layout] != columns["parts"] for layout in columns if layout != "parts")


def _visible_keys(n_q, n_k, *, q_offset=0, causal=False, window=None):
    """[n_q, n_k] bool: query i (at q_offset + i) sees key j. window W: 0 <= distance < W."""
    distance = (q_offset + torch.arange(n_q))[:, None] - torch.arange(n_k)
    if window is not None:
        return (distance >= 0) & (distance < window)
    return distance >= 0 if causal else torch.ones(n_q, n_k, dtype=torch.bool)


def _block_ranges(n_q, n_k, block_q, block_k, **pattern):
    """[(first, stop)] per query block, found by looking at every key: the key blocks that
    hold a key one of the block's queries sees."""
    sees = _visible_keys(n_q, n_k, **pattern)
    ranges = []
    for qs in range(0, n_q, block_q):
        blocks = sees[qs:qs + block_q].any(0).nonzero().flatten() // block_k
        ranges.append((int(blocks.min()), int(blocks.max()) + 1))
    return ranges


def test_key_block_range_equals_the_brute_force_search():
    g = torch.Generator().manual_seed(12)

    def draw(low, high):
        return int(torch.randint(low, high + 1, (1,), generator=g))
    for _ in range(300):
        n_q, bq, bk = draw(1, 200), 2 ** draw(3, 6), 2 ** draw(3, 6)
        n_k = n_q + draw(0, 100)
        pattern = dict(q_offset=draw(0, n_k - n_q), causal=bool(draw(0, 1)),
                       window=None if draw(0, 1) else draw(1, 150))
        ranges = _block_ranges(n_q, n_k, bq, bk, **pattern)
        assert [ap.key_block_range(i, n_q, n_k, bq, bk, **pattern) for i in range(len(ranges))] == ranges


def test_window_question_answer_is_the_range():
    first, stop = ap.key_block_range(2048 // 64, 4096, 4096, 64, 64, window=512)
    assert stop - first == 9 and ap.window_blocks_answer == "b"


# ---------------------------------------------------------------------------------------
# The kernels: counts, the worked example, the wrapper

@pytest.mark.parametrize("pattern", [dict(), dict(causal=True), dict(window=20), dict(window=1, q_offset=30)])
def test_wrapper_visits_exactly_the_key_blocks_of_key_block_range(pattern):
    q, k, v = checks.pattern_values(2, 2, 1, 50, 80, 16, F32, seed=13)
    _, _, runs = ap.pattern_attention(q, k, v, block_q=16, block_k=16, **pattern)
    ranges = _block_ranges(50, 80, 16, 16, q_offset=pattern.get("q_offset", 0),
                           causal="causal" in pattern or "window" in pattern, window=pattern.get("window"))
    assert runs.tolist() == [[[stop - first for first, stop in ranges]] * 2] * 2


def test_a_window_runs_fewer_blocks_than_causal():
    q, k, v = checks.pattern_values(1, 1, 1, 128, 128, 16, F32, seed=14)
    causal = ap.pattern_attention(q, k, v, causal=True, block_q=16, block_k=16)[2].sum()
    window = ap.pattern_attention(q, k, v, window=16, block_q=16, block_k=16)[2].sum()
    assert int(causal) == 36 and int(window) == 15  # 8 + 7 blocks: the diagonal and one before


def test_copy_heads_worked_example():
    x = checks.in_layout(randn(2, 3, 37, 40, device=DEVICE), "bnhd")
    y = torch.empty(2, 3, 37, 40, device=DEVICE)
    ap.copy_heads_kernel[(triton.cdiv(37, 16), 6, 1)](x, y, *x.stride(), *y.stride(), 3, 37,
                                                      HEAD_DIM=40, BLOCK_N=16, BLOCK_D=64)
    assert torch.equal(x, y)


def test_projection_views_feed_the_kernel_without_a_copy():
    x, w = checks.projection_inputs(2, 20, 32, (4 + 2 * 2) * 16, F32, seed=15)
    q, k, v = ap.qkv_projection(x, w, 4, 2)
    assert q.untyped_storage().data_ptr() == k.untyped_storage().data_ptr() == v.untyped_storage().data_ptr()
    assert q.stride() == (20 * 128, 16, 128, 1)
    o, _, _ = ap.pattern_attention(q, k, v, causal=True)
    assert_close(o, answers.attention(q, k, v, scale=0.25, causal=True)[0], quiet=True)


# ---------------------------------------------------------------------------------------
# What the checks catch, shown with stand-ins

def test_projection_check_names_a_copy_and_three_gemms():
    def copying(x, w, heads, kv_heads):
        return tuple(t.contiguous() for t in ap.qkv_projection(x, w, heads, kv_heads))

    def three_gemms(x, w, heads, kv_heads):
        D = w.shape[0] // (heads + 2 * kv_heads)
        parts = [x @ part.T for part in w.split([heads * D, kv_heads * D, kv_heads * D])]
        return tuple(p.unflatten(-1, (-1, D)).transpose(1, 2) for p in parts)
    with pytest.raises(CheckFailed, match="copy"):
        checks.case_projection_random(copying, 2, 10, 24, 4, 2, 16, F32, seed=16, quiet=True)
    with pytest.raises(CheckFailed, match="separate"):
        checks.case_projection_random(three_gemms, 2, 10, 24, 4, 2, 16, F32, seed=16, quiet=True)


@pytest.mark.parametrize("mistake, says", [(dict(pairing="interleaved"), "interleaved"),
                                           (dict(turn=-1.0), "other way"), (dict(exponent=1.0), "exponent"),
                                           (dict(shift=37), "offset = 37")])
def test_rope_check_names_the_classic_mistakes_from_the_table(mistake, says):
    switches = {name: value for name, value in mistake.items() if name != "shift"}

    def wrong(x, offset=0, base=ap.ROPE_BASE):
        positions = offset - mistake.get("shift", 0) + torch.arange(x.shape[-2], dtype=torch.float64)
        return answers.turned(x, positions.to(x.device), base, **switches).to(x.dtype)
    with pytest.raises(CheckFailed, match=says):  # a visible case: its mistakes are recorded
        checks.case_rope_random(wrong, 2, 3, 20, 40, F32, seed=2, offset=37, layout="bnhd", quiet=True)


def test_rope_kernel_check_names_frequencies_from_block_d():
    def kernel(grid):
        def launch(x, y, *args, HEAD_DIM, BLOCK_N, BLOCK_D):
            positions = args[-2] + torch.arange(x.shape[2], dtype=torch.float64)
            y.copy_(answers.turned(x, positions.to(x.device), args[-1], width=BLOCK_D).to(y.dtype))
        return launch
    with pytest.raises(CheckFailed, match="BLOCK_D = 64"):  # visible: D = 40 in tiles of 64
        checks.case_rope_kernel_random(_Launched(kernel), 2, 3, 37, 40, F32, seed=2, offset=11, layout="bnhd",
                                       out_layout="sliced", quiet=True)


class _Launched:
    """A stand-in launched as kernel[grid](...): launch(grid) gives the function run."""

    def __init__(self, launch):
        self.launch, self.__name__ = launch, "fake_kernel"

    def __getitem__(self, grid):
        return self.launch(grid)


def _fake_kernel(mistake=None, skip=True):
    """Launched like pattern_attention_kernel: stores answers.attention (with a mistake) and
    the block counts (every key block when skip is False)."""
    def kernel(grid):
        def launch(q, k, v, o, lse, slopes, runs, *args, CAUSAL, ROPE, BLOCK_Q, BLOCK_K, **meta):
            qk_scale, q_offset, window, rope_base = args[-4:]
            Nq = q.shape[2]
            windowed = window < q_offset + Nq  # else the no-window value of plain causal
            pattern = dict(q_offset=q_offset, causal=CAUSAL, window=window if windowed else None,
                           rope=ROPE, rope_base=rope_base, slopes=slopes)
            out, l = answers.attention(q, k, v, scale=qk_scale / checks.LOG2E, mistake=mistake,
                                       blocks=(BLOCK_Q, BLOCK_K), **pattern)
            o.copy_(out.to(o.dtype))
            lse.copy_(l.float())
            ranges = _block_ranges(Nq, k.shape[2], BLOCK_Q, BLOCK_K, q_offset=q_offset, causal=CAUSAL,
                                   window=pattern["window"])
            every = triton.cdiv(k.shape[2], BLOCK_K)
            runs.copy_(torch.tensor([stop - first if skip else every for first, stop in ranges],
                                    dtype=torch.int32).expand_as(runs))
        return launch
    return _Launched(kernel)


def test_kernel_check_passes_a_right_stand_in():
    with recorded.computing(answer_key.resolve):  # inputs of no visible check: as a hidden test
        checks.case_pattern_kernel_random(_fake_kernel(), 1, 4, 2, 30, 45, 24, F32, seed=18, alibi=True,
                                          rope=True, window=9, q_offset=15, blocks=(16, 16),
                                          out_layout="bnhd", quiet=True)


@pytest.mark.parametrize("mistake, says", [(dict(bias_factor=checks.LN2), "log2"),
                                           (dict(head_map=torch.arange(4) // 2), "K/V head"),
                                           (dict(window_extra=1), "one key too long"),
                                           (dict(pairing="interleaved"), "interleaved"),
                                           (dict(q_positions_shift=15), "q_offset")])
def test_kernel_check_names_the_classic_mistakes(mistake, says):
    with recorded.computing(answer_key.resolve), pytest.raises(CheckFailed, match=says):
        checks.case_pattern_kernel_random(_fake_kernel(mistake), 1, 4, 2, 30, 45, 24, F32, seed=19,
                                          alibi=True, rope=True, window=9, q_offset=15, blocks=(16, 16),
                                          quiet=True)


def test_kernel_check_refuses_masking_instead_of_skipping():
    shape, options = checks.KERNEL_CASES[3]  # a visible case: its counts are recorded
    assert options.get("window") == 20
    with pytest.raises(CheckFailed, match="skip the others"):
        checks.case_pattern_kernel_random(_fake_kernel(skip=False), *shape, **options, quiet=True)


def test_a_gpu_wrapper_finds_its_blocks_recorded_or_is_told_which_are():
    """Without block_q and block_k a wrapper on a GPU chooses its blocks: the table holds the
    counts of the visible cases for every size in GPU_BLOCK_SIZES, and says so for others."""
    for shape, options in checks.WRAPPER_CASES + checks.WRAPPER_GPU_CASES:
        if "blocks" in options:
            continue
        B, H, _, Nq, Nk = shape[:5]
        pattern = checks._pattern(**{key: options[key] for key in ("q_offset", "causal", "window")
                                     if key in options})
        for blocks in itertools.product(checks.GPU_BLOCK_SIZES, repeat=2):
            counts = checks._expected_blocks(B, H, Nq, Nk, blocks, pattern, name="pattern_attention")
            ranges = _block_ranges(Nq, Nk, *blocks, q_offset=pattern["q_offset"], causal=pattern["causal"],
                                   window=pattern["window"])
            assert counts.tolist() == [[[stop - first for first, stop in ranges]] * H] * B
        with pytest.raises(CheckFailed, match=r"BLOCK_Q=512, BLOCK_K=64; the visible checks know"):
            checks._expected_blocks(B, H, Nq, Nk, (512, 64), pattern, name="pattern_attention")


def _rope_kernel_stand_in(grid):
    def launch(x, y, *args, HEAD_DIM, BLOCK_N, BLOCK_D):
        positions = args[-2] + torch.arange(x.shape[2], dtype=torch.float64)
        y.copy_(answers.turned(x, positions.to(x.device), args[-1]).to(y.dtype))
    return launch


def test_the_gpu_cases_find_every_answer_in_the_table():
    """A learner's checks on a GPU read the table alone (no answer key): right stand-ins pass
    the GPU's cases here, and the wrapper's questions are recorded for every block size it
    may choose."""
    for shape, options in checks.PROJECTION_GPU_CASES:
        checks.case_projection_random(ap.qkv_projection, *shape, **options, quiet=True)
    for shape, options in checks.ROPE_GPU_CASES:
        checks.case_rope_random(ap.rope, *shape, **options, quiet=True)
    for shape, options in checks.ROPE_KERNEL_GPU_CASES:
        checks.case_rope_kernel_random(_Launched(_rope_kernel_stand_in), *shape, **options, quiet=True)
    for shape, options in checks.KERNEL_GPU_CASES:
        checks.case_pattern_kernel_random(_fake_kernel(), *shape, **options, quiet=True)
    for shape, options in checks.WRAPPER_GPU_CASES:
        q, k, v = checks.pattern_values(*shape, seed=options["seed"])
        slopes = torch.tensor(recorded.answer("attention_patterns", "alibi_slopes", shape[1]), dtype=F32)
        chosen = ("q_offset", "causal", "window", "rope")
        pattern = checks._pattern(slopes=slopes, **{key: options[key] for key in chosen if key in options})
        for blocks in itertools.product(checks.GPU_BLOCK_SIZES, repeat=2):
            for name, args in checks.pattern_questions(q, k, v, scale=shape[5] ** -0.5, blocks=blocks,
                                                       pattern=pattern).values():
                recorded.answer("attention_patterns", name, *args)


def test_the_table_stays_small():
    """Outputs are recorded whole (RoPE's), so the GPU's cases are kept small: the learner's
    copy installs the table."""
    assert (recorded.FOLDER / "attention_patterns.json").stat().st_size < 2_000_000


# ---------------------------------------------------------------------------------------
# The reference passes every visible check and hidden test

CHECKED = {  # test cell -> (visible check, the reference objects it takes)
    "test_qkv_projection": ("check_qkv_projection", (ap.qkv_projection,)),
    "test_rope": ("check_rope", (ap.rope,)),
    "test_relative": ("check_choice", (ap.relative_answer,)),
    "test_rope_kernel": ("check_rope_kernel", (ap.rope_kernel,)),
    "test_alibi_slopes": ("check_alibi_slopes", (ap.alibi_slopes,)),
    "test_key_block_range": ("check_key_block_range", (ap.key_block_range,)),
    "test_window_blocks": ("check_choice", (ap.window_blocks_answer,)),
    "test_pattern_attention_kernel": ("check_pattern_attention_kernel", (ap.pattern_attention_kernel,)),
    "test_pattern_attention": ("check_pattern_attention",
                               (ap.pattern_attention, ap.pattern_attention_kernel)),
}


@pytest.mark.parametrize("test_cell", CHECKED)
def test_reference_passes_visible_checks_and_hidden_tests(test_cell):
    check, args = CHECKED[test_cell]
    extra = {"name": test_cell[5:] + "_answer"} if check == "check_choice" else {}
    getattr(checks, check)(*args, **extra)
    getattr(answer_key.hidden("09_attention_patterns"), test_cell)(*args)


def test_wrong_answers_fail():
    hidden = answer_key.hidden("09_attention_patterns")
    for test_cell, right in (("test_relative", ap.relative_answer),
                             ("test_window_blocks", ap.window_blocks_answer)):
        for wrong in set("abcd") - {right}:
            with pytest.raises(CheckFailed, match="not the right choice"):
                getattr(hidden, test_cell)(wrong)
        with pytest.raises(CheckFailed, match="one letter"):
            getattr(hidden, test_cell)(9)


@pytest.mark.skipif(not INTERPRET, reason="on a GPU the kernels compile when they run")
def test_kernel_compiles_for_gpu():
    checks.compile_kernel_for_gpu(ap.pattern_attention_kernel)


def test_inputs_of_each_kind_sit_where_they_say():
    x, _ = checks.projection_inputs(1, 4, 16, 48, F32, seed=21, kind="far_below")
    assert x.median() < -100
    assert checks.rope_values(1, 1, 4, 16, F16, seed=22, kind="far_above").median() > 100
    for layout in checks.MATRIX_LAYOUTS:
        t = randn(3, 16, seed=23)
        assert torch.equal(checks.in_layout(t, layout), t)
    assert math.isclose(float(ap.alibi_slopes(1)), 2 ** -8)
