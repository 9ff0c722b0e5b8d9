"""Module 08 (the FlashAttention backward) as a lesson: the pieces its checks are built from,
what they catch, the static reading of the fused kernel's dQ writes, the reference passing
every visible check and hidden test, and the H100 figures the notebook ships against
solutions/PERF.md. (tests/test_backward_kernels.py tests the answer-key kernels themselves.)

On a CPU the kernels run through Triton's interpreter at small sizes; on a GPU the same
tests run compiled (course.testing picks the tolerances).
"""
import ast
import re
import textwrap

import course  # noqa: F401  (sets TRITON_INTERPRET on a CPU, before triton is imported)
import pytest
import torch

from course import DEVICE, INTERPRET, recorded, rules
from course.checks import flash_backward as checks
from course.testing import CheckFailed, assert_close, randn
from grader import answer_key, paths
from solutions import flash_backward as fb
from solutions.naive_attention import attention_reference, attention_scores
from tests import submissions as subs

F32, F16 = torch.float32, torch.float16
LESSON = "08_flash_backward"
answers = paths.lesson_file(LESSON, "answers")


@pytest.fixture
def keyed():
    """The answer key computes what a check asks: these inputs are none of the visible checks'."""
    with recorded.computing(answer_key.resolve):
        yield


def _inputs(B, H, Hkv, Nq, Nk, D, seed, dtype=torch.float64):
    return [randn(B, h, n, D, dtype=dtype, device=DEVICE, seed=seed + i)
            for i, (h, n) in enumerate([(H, Nq), (Hkv, Nk), (Hkv, Nk), (H, Nq)])]


# ---------------------------------------------------------------------------------------
# The references the checks compare with

@pytest.mark.parametrize("causal", [False, True])
def test_float64_references_agree_with_each_other_and_with_the_answer_key(causal):
    """The checks' autograd, the hand-written formulas of the mistakes' emulator (answers.py)
    and the answer key's attention_backward_reference give the same gradients (GQA, Nq != Nk,
    explicit scale)."""
    q, k, v, do = _inputs(2, 4, 2, 13, 21, 24, seed=1, dtype=F32)
    autograd = checks.reference_grads(q, k, v, do, causal, 0.3)
    by_hand = answers.manual_grads(q, k, v, do, causal, 0.3)
    o, lse = checks.forward64(q, k, v, causal, 0.3)
    key = fb.attention_backward_reference(q, k, v, o, do, lse.float(), causal, 0.3)
    assert_close(o, attention_reference(q.double(), k.double(), v.double(), causal, 0.3), quiet=True)
    for a, b, c in zip(autograd, by_hand, key):
        assert_close(b, a, atol=1e-10, rtol=1e-10, quiet=True)
        assert_close(c, a, atol=1e-5, rtol=1e-5, quiet=True)  # lse rounded to fp32


@pytest.mark.parametrize("causal", [False, True])
def test_each_emulated_mistake_changes_the_gradients_and_the_check_describes_it(causal):
    q, k, v, do = _inputs(1, 4, 2, 16, 16, 16, seed=2)
    right = checks.reference_grads(q, k, v, do, causal, 0.25)
    switches = answers.mistake_switches(causal, True, 0.25)
    assert set(switches) <= set(checks._GRAD_MISTAKES)
    for name, switch in switches.items():
        wrong = answers.manual_grads(q, k, v, do, causal, 0.25, **switch)
        assert any(not torch.allclose(w, r, atol=1e-3) for w, r in zip(wrong, right)), name
    recorded_mistakes = answers.grad_mistakes(q, k, v, do, causal, 0.25, "kv")
    assert set(recorded_mistakes) == set(switches)
    assert all(sigs[0] is None for sigs in recorded_mistakes.values())  # dq is not compared
    assert recorded_mistakes["dq_scale_twice"] == [None, None, None]  # dK and dV as they are
    assert set(checks._GRAD_MISTAKES) == set(answers.mistake_switches(True, True, 0.25)) | {"mask_extra"}


def test_gradient_sizes_bound_the_gradients():
    """The tolerance scales with |dS| |K| (and the like): never below the gradient itself."""
    q, k, v, do = _inputs(1, 2, 1, 20, 30, 16, seed=3)
    sizes = answers.manual_grads(q, k, v, do, False, 0.25, absolute=True)
    for grad, size, largest in zip(checks.reference_grads(q, k, v, do, False, 0.25), sizes,
                                   answers.grad_sizes(q, k, v, do, False, 0.25)):
        assert (grad.abs() <= size + 1e-12).all()
        assert largest == float(size.max())


def test_extreme_values_put_rows_of_scores_far_above_and_below_zero():
    for dtype in (F32, F16):
        q, k, _, _ = checks.backward_values(1, 2, 1, 6, 9, 16, dtype, seed=4, kind="extreme")
        s = (attention_scores(q.double(), k.double()))[0, 0]
        assert (s[0::2] > 100).all() and (s[1::2] < -100).all()
    _, p, dp = checks.softmax_values((4, 30), -1, F32, seed=5, kind="extreme")
    assert (p == 0).any() and p.max() > 0.9 and dp.abs().max() > 500


def test_softmax_backward_matches_autograd_in_every_dim():
    for shape, dim in [((4, 7), -1), ((6, 5), 0), ((3, 5, 9), 1)]:
        x = randn(*shape, dtype=torch.float64, seed=6).requires_grad_()
        dp = randn(*shape, dtype=torch.float64, seed=7)
        torch.softmax(x, dim).backward(dp)
        assert_close(fb.softmax_backward(torch.softmax(x, dim).detach(), dp, dim), x.grad, quiet=True)


# ---------------------------------------------------------------------------------------
# The lesson's wrapper and autograd functions (the answer key's), and what the checks catch

@pytest.mark.parametrize("fused", [False, True])
def test_teaching_wrapper_equals_the_tuned_backward(fused):
    q, k, v, do = _inputs(1, 4, 2, 45, 70, 24, seed=8, dtype=F32)
    o, lse = fb.flash_attention(q, k, v, causal=True)
    ours = fb.flash_backward(q, k, v, o, lse, do, causal=True, fused=fused)
    tuned = fb.flash_attention_backward(q, k, v, o, lse, do, causal=True, fused=fused)
    for a, b in zip(ours, tuned):
        assert_close(a, b.double(), quiet=True)


def test_autograd_functions_make_a_trainable_operation():
    class Function(torch.autograd.Function):
        forward = staticmethod(fb.autograd_forward)
        backward = staticmethod(fb.autograd_backward)
    q, k, v, do = _inputs(1, 2, 1, 33, 40, 32, seed=9, dtype=F32)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o, lse = Function.apply(*leaves, False, 0.3, True)
    assert not lse.requires_grad
    o.backward(do)
    expected = checks.reference_grads(q, k, v, do, False, 0.3)
    for leaf, want in zip(leaves, expected):
        assert_close(leaf.grad, want, quiet=True)


@pytest.mark.parametrize("mistake", checks._GRAD_MISTAKES)
def test_checks_name_each_recorded_mistake(mistake):
    """attention_backward_reference emulating a classic mistake fails the visible check,
    which reads the recorded signatures, naming that mistake (the first case it applies
    to: causal for the missing mask, GQA for the group sum), and fails the hidden test,
    which computes them."""
    def wrong(q, k, v, o, do, lse, causal=False, sm_scale=None):
        scale = fb.default_scale(sm_scale, q.shape[-1])
        switches = answers.mistake_switches(causal, q.shape[1] != k.shape[1], scale)
        return answers.manual_grads(q, k, v, do, causal, scale, **switches.get(mistake, {}))
    says = "this matches a classic mistake: " + checks._GRAD_MISTAKES[mistake].format(group=2)
    with pytest.raises(CheckFailed) as failure:
        checks.check_attention_backward_reference(wrong)
    assert says in str(failure.value)
    with pytest.raises(CheckFailed):
        answer_key.hidden(LESSON).test_attention_backward_reference(wrong)


SOFTMAX_MISTAKES = {  # what the check says: softmax_backward gone that way
    "was not subtracted": lambda p, dp, dim: p * dp,
    "the factor p in front is missing": lambda p, dp, dim: dp - (p * dp).sum(dim, keepdim=True),
    "the sum must weigh dp by p": lambda p, dp, dim: p * (dp - dp.sum(dim, keepdim=True)),
    "is one number per row": lambda p, dp, dim: p * (dp - p * dp),
    "the sum ran over dim 1, not over the softmax's dim 0":
        lambda p, dp, dim: p * (dp - (p * dp).sum(-1, keepdim=True)),
}


@pytest.mark.parametrize("says", SOFTMAX_MISTAKES)
def test_softmax_check_names_each_recorded_mistake(says):
    def wrong(p, dp, dim=-1):
        return SOFTMAX_MISTAKES[says](p.float(), dp.float(), dim).to(p.dtype)
    with pytest.raises(CheckFailed, match=re.escape(says)):
        checks.check_softmax_backward(wrong)
    with pytest.raises(CheckFailed):
        answer_key.hidden(LESSON).test_softmax_backward(wrong)


@pytest.mark.usefixtures("keyed")
def test_zero_gradients_fail_but_a_single_key_may_give_them():
    def zeros(q, k, v, o, do, lse, causal=False, sm_scale=None):
        return tuple(torch.zeros(t.shape, dtype=torch.float64, device=t.device) for t in (q, k, v))
    with pytest.raises(CheckFailed):
        checks.case_reference(zeros, 1, 2, 2, 20, 20, 16, F32, seed=12, quiet=True)
    # one key: softmax is constant 1, so dQ and dK are 0, and that is right
    checks.case_reference(fb.attention_backward_reference, 1, 2, 2, 5, 1, 16, F32, seed=13, quiet=True)


# ---------------------------------------------------------------------------------------
# The fused kernel's dQ writes, read off the code

def _functions(source):
    return {n.name: n for n in ast.parse(textwrap.dedent(source)).body if isinstance(n, ast.FunctionDef)}


KERNEL = """
@triton.jit
def bwd_dkdv_kernel(Q, DQ, N, BLOCK: tl.constexpr):
    rows = tl.arange(0, BLOCK)
    base = DQ + tl.program_id(1) * N
    helper(base, rows, N)
"""


@pytest.mark.parametrize("helper, problem", [
    ("def helper(ptr, rows, n):\n    tl.atomic_add(ptr + rows, 1.0, mask=rows < n)", None),
    ("def helper(ptr, rows, n):\n    p = ptr + rows\n    tl.store(p, tl.load(p) + 1.0)", "race"),
    ("def helper(ptr, rows, n):\n    tl.store(pointer=ptr + rows, value=1.0)", "race"),
    ("def helper(ptr, rows, n):\n    tl.atomic_xchg(ptr + rows, 1.0)", "atomic_add"),
    ("def helper(ptr, rows, n):\n    tl.store(rows + n, 1.0)", "never adds"),   # not through DQ
    ("def helper(ptr, rows, n):\n    inner(n, q=ptr)\n\ndef inner(n, q):\n    q += n\n"
     "    tl.atomic_add(q, 2.0)", None),                                            # by keyword
])
def test_dq_writes_are_followed_through_assignments_and_calls(helper, problem):
    found = checks.dq_write_problems(_functions(KERNEL + "\n" + helper))
    if problem is None:
        assert found == []
    else:
        assert found and problem in " ".join(found), found


def test_the_answer_keys_fused_kernel_adds_dq_atomically():
    functions = checks.notebook_functions(fb.bwd_dkdv_kernel)
    assert {"bwd_dkdv_kernel", "_dkdv_q_blocks", "_accumulate_dq", "_load_rows"} <= set(functions)
    writes = checks.pointer_writes(functions, "bwd_dkdv_kernel", "DQ")
    assert [(fn, op) for fn, op, _ in writes] == [("_accumulate_dq", "atomic_add")]
    assert checks.dq_write_problems(functions) == []


def test_the_atomic_rule_reads_the_submitted_notebook():
    rule = checks.AtomicDQ()

    def problems(nb):
        cells = [rules.Cell(f"cell {i}", c.source) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
        return rule.problems(rules._definitions(cells))
    assert problems(subs.solution_notebook(LESSON)) == []
    racy = subs.with_bug(LESSON, subs.bugs_of(LESSON)["dq_not_atomic"])
    assert "atomic" in " ".join(problems(racy))
    assert problems(subs.release(LESSON))  # nothing written: no atomic add either


# ---------------------------------------------------------------------------------------
# The reference passes every visible check and hidden test; wrong answers fail

CHECKED = {  # test cell -> (visible check, the reference objects it takes)
    "test_softmax_backward": ("check_softmax_backward", (fb.softmax_backward,)),
    "test_attention_backward_reference": ("check_attention_backward_reference",
                                          (fb.attention_backward_reference,)),
    "test_bwd_preprocess_kernel": ("check_bwd_preprocess_kernel", (fb.bwd_preprocess_kernel,)),
    "test_bwd_dkdv_kernel": ("check_bwd_dkdv_kernel", (fb.bwd_dkdv_kernel,)),
    "test_bwd_dq_kernel": ("check_bwd_dq_kernel", (fb.bwd_dq_kernel,)),
    "test_accumulate_dq": ("check_accumulate_dq", (fb.bwd_dkdv_kernel,)),
    "test_flash_backward": ("check_flash_backward", (fb.flash_backward, fb.bwd_dkdv_kernel)),
    # attention_gradients of the answer key goes through the lesson's FlashAttentionFunction
    "test_flash_attention_function": ("check_flash_attention_function",
                                      (fb.attention_gradients, fb.bwd_dkdv_kernel)),
    "test_fused_tradeoff": ("check_choice", (fb.fused_tradeoff_answer,)),
}


@pytest.mark.parametrize("test_cell", CHECKED)
def test_reference_passes_visible_checks_and_hidden_tests(test_cell):
    check, args = CHECKED[test_cell]
    extra = {"name": "fused_tradeoff_answer"} if check == "check_choice" else {}
    getattr(checks, check)(*args, **extra)
    getattr(answer_key.hidden(LESSON), test_cell)(*args)


def test_wrong_tradeoff_answers_fail():
    hidden = answer_key.hidden(LESSON)
    for wrong in set("abcd") - {fb.fused_tradeoff_answer}:
        with pytest.raises(CheckFailed, match="not the right choice"):
            hidden.test_fused_tradeoff(wrong)


def test_shipped_h100_figures_equal_perf_md():
    """The notebook's fwd+bwd TFLOPS are the fp16 rows of PERF.md's final backward table."""
    text = (paths.SOLUTIONS / "PERF.md").read_text()
    table = next(part for part in text.split("### Final: fwd+bwd through the public API")[1].split("\n\n")
                 if part.startswith("| dtype"))
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()[2:]]
    measured = {(int(r[1]), r[3] == "yes", int(r[2])): (int(r[6]), int(r[7]), int(r[8]))
                for r in rows if r[0] == "fp16"}
    assert len(measured) == 12
    for (D, causal), impls in fb.H100_TRAIN_TFLOPS.items():
        for n, fa2, dq_kernel, fused in zip(fb.H100_TRAIN_SEQ_LENS, impls["sdpa-flash"], impls["dQ kernel"],
                                            impls["fused, atomic dQ"]):
            assert measured[(D, causal, n)] == (fa2, dq_kernel, fused), (D, causal, n)
    wins = sum(dq > fused for impls in fb.H100_TRAIN_TFLOPS.values()
               for dq, fused in zip(impls["dQ kernel"], impls["fused, atomic dQ"]))
    assert wins == 9  # what answer c says


@pytest.mark.skipif(not INTERPRET, reason="on a GPU the kernels compile when they run")
def test_kernels_compile_for_gpu():
    checks.compile_kernels_for_gpu(fb.bwd_dkdv_kernel, fb.bwd_dq_kernel)


def test_lesson_states_the_rules_its_hidden_tests_enforce():
    text = " ".join(re.sub(r"\n# ?", " ", paths.lesson_path(LESSON).read_text()).split())
    for phrase in ("No autograd", "defined once", "computed from `DQ` must be `tl.atomic_add`",
                   "must launch all three kernels", "`autograd_forward` must launch module 05's"):
        assert phrase in text, phrase
