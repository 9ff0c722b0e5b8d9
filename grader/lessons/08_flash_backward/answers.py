"""What module 08's visible checks ask the answer key (course/recorded.py; recorded for
the learner's copy by `python -m grader build`): the delta of each case, the size of the
terms each gradient sums (its tolerance), and the outputs of the classic mistakes, as
signatures, by which a failing check names the slip. Attention's inputs are keyed by q, k,
v and dO, drawn on the CPU and so the same on any device (O, computed on the device, may
differ in its last bits)."""
import torch

from course.checks.flash_backward import (GPU_CASES, _expand, _f64, _scale, _scores, backward_values,
                                          forward64, preprocess_values)
from grader.answer_key import telling
from solutions.flash_backward import softmax_backward
from solutions.flash_forward import LOG2E

CHECKS = ("check_softmax_backward", "check_attention_backward_reference", "check_bwd_preprocess_kernel",
          "check_bwd_dkdv_kernel", "check_bwd_dq_kernel", "check_accumulate_dq", "check_flash_backward",
          "check_flash_attention_function")


def softmax_mistakes(p, dp, dim):
    """softmax's gradient gone wrong: no sum subtracted, no factor p, sum(dp) unweighted,
    the sum taken entrywise, then the sum over each other dim in turn."""
    p, dp = _f64(p), _f64(dp)
    right = softmax_backward(p, dp, dim)
    wrong = [p * dp, dp - (p * dp).sum(dim, keepdim=True), p * (dp - dp.sum(dim, keepdim=True)),
             p * (dp - p * dp)]
    wrong += [p * (dp - (p * dp).sum(other, keepdim=True))
              for other in range(p.dim()) if other != dim % p.dim()]
    return list(telling(dict(enumerate(wrong)), right).values())


class _Formulas:
    """The lesson's formulas on one call's inputs, in float64: the forward (S, lse, O) and
    dP = dO Vᵀ once, shared by the gradients of every classic mistake."""

    def __init__(self, q, k, v, do, causal, scale):
        self.q, self.k, self.v, self.do = (_f64(t) for t in (q, k, v, do))
        self.causal, self.scale, H = causal, scale, q.shape[1]
        self.s = _scores(self.q, self.k, causal, scale)
        self.lse = torch.logsumexp(self.s, -1, keepdim=True)
        self.o = torch.softmax(self.s, -1) @ _expand(self.v, H)
        self.dp = self.do @ _expand(self.v, H).transpose(-1, -2)

    def grads(self, *, delta_from="o", ds_form="full", dq_scale=1.0, dk_scale=1.0, lse_base2=False,
              mask_in_backward=None, sum_group=True, absolute=False):
        """(dq, dk, dv), with switches for the classic mistakes: delta from "o" (right:
        rowsum(dO * O)), "do" (dO * dO) or "p" (rowsum(P) = 1); ds_form "full" (P * (dP -
        delta)), "no_delta" (P * dP) or "p" (P); extra factors on dQ and dK; P recomputed as
        exp2(S log2 e - lse) (lse_base2); the causal mask applied in the backward or not
        (mask_in_backward, default: as in the forward); dK/dV of a K/V head from every query
        head of its group or from the first one only. absolute: the last products of absolute
        values (|dS| |K|, ...), the size of the terms each entry sums."""
        q, k, do, scale = self.q, self.k, self.do, self.scale
        H, Hkv = q.shape[1], k.shape[1]
        s = self.s if mask_in_backward in (None, self.causal) else _scores(q, k, mask_in_backward, scale)
        p = torch.exp2(s * LOG2E - self.lse) if lse_base2 else torch.exp(s - self.lse)
        delta = {"o": (do * self.o).sum(-1, keepdim=True), "do": (do * do).sum(-1, keepdim=True),
                 "p": p.sum(-1, keepdim=True)}[delta_from]
        ds = {"full": p * (self.dp - delta), "no_delta": p * self.dp, "p": p}[ds_form]
        if absolute:
            ds, q, k, do = ds.abs(), q.abs(), k.abs(), do.abs()
        dq = dq_scale * scale * ds @ _expand(k, H)
        dk = dk_scale * scale * ds.transpose(-1, -2) @ q
        dv = p.transpose(-1, -2) @ do
        B, _, Nk, D = dk.shape
        grouped = (dk.view(B, Hkv, H // Hkv, Nk, D), dv.view(B, Hkv, H // Hkv, Nk, D))
        dk, dv = (g.sum(2) if sum_group else g[:, :, 0] for g in grouped)
        return dq, dk, dv


def manual_grads(q, k, v, do, causal, scale, **switches):
    """(dq, dk, dv) by the formulas of the lesson, in float64, with the switches of
    _Formulas.grads for the classic mistakes."""
    return _Formulas(q, k, v, do, causal, scale).grads(**switches)


def grad_sizes(q, k, v, do, causal, scale):
    """The largest term each of dq, dk, dv sums (manual_grads' absolute products): the
    scale of the gradient's tolerance, which its own entries (sums that may cancel) are not."""
    return [float(size.max()) for size in manual_grads(q, k, v, do, causal, scale, absolute=True)]


def mistake_switches(causal, gqa, scale):
    """{name: switches of _Formulas.grads} of the classic mistakes of a call (the mask's
    depend on causal, the group sum's on GQA): the names of the check's descriptions."""
    return {
        "delta_from_do": dict(delta_from="do"), "delta_from_p": dict(delta_from="p"),
        "ds_no_delta": dict(ds_form="no_delta"), "ds_is_p": dict(ds_form="p"),
        "dk_scale_missing": dict(dk_scale=1 / scale), "dk_scale_twice": dict(dk_scale=scale),
        "dq_scale_missing": dict(dq_scale=1 / scale), "dq_scale_twice": dict(dq_scale=scale),
        "lse_base2": dict(lse_base2=True),
        **({"mask_missing": dict(mask_in_backward=False)} if causal else
           {"mask_extra": dict(mask_in_backward=True)}),
        **({"group_first_head": dict(sum_group=False)} if gqa else {}),
    }


def grad_mistakes(q, k, v, do, causal, scale, which):
    """{mistake: [signature or None of dq, dk, dv]} of the classic mistakes of this call,
    for the gradients named by `which` ("qkv", "kv", "q"); None for the others and where the
    mistake changes nothing."""
    switches = mistake_switches(causal, q.shape[1] != k.shape[1], scale)
    formulas = _Formulas(q, k, v, do, causal, scale)
    right = formulas.grads()
    wrong = {name: formulas.grads(**switch) for name, switch in switches.items()}
    told = [telling({name: grads[i] for name, grads in wrong.items()}, right[i]) if label in which else {}
            for i, label in enumerate("qkv")]
    return {name: [told[i].get(name) for i in range(3)] for name in wrong}


def delta(q, k, v, do, causal, scale):
    """delta = rowsum(dO * O) [B, H, Nq] (nested lists) of attention's output O (in q's
    dtype, as the kernels read it) and dO."""
    o = forward64(q, k, v, causal, scale)[0].to(q.dtype)
    return (_f64(do) * _f64(o)).sum(-1).tolist()


def _gpu_answers():
    """(name, arguments) of what the checks' GPU_CASES ask (bf16, real sizes), recorded on
    the CPU like the rest."""
    for (B, H, Nq, D, dtype), kwargs in GPU_CASES["check_bwd_preprocess_kernel"]:
        q, k, v, do = preprocess_values(B, H, Nq, D, dtype, seed=kwargs["seed"],
                                        kind=kwargs.get("kind", "random"))
        yield "delta", (q, k, v, do, False, _scale(D, None))
    for check, which in _WHICH.items():
        for (B, H, Hkv, Nq, Nk, D, dtype), kwargs in GPU_CASES[check]:
            q, k, v, do = backward_values(B, H, Hkv, Nq, Nk, D, dtype, seed=kwargs["seed"],
                                          kind=kwargs.get("kind", "random"))
            call = (q, k, v, do, kwargs.get("causal", False), _scale(D, kwargs.get("sm_scale")))
            if check in ("check_bwd_dkdv_kernel", "check_bwd_dq_kernel", "check_accumulate_dq"):
                yield "delta", call  # kernel_inputs
            yield "grad_sizes", call
            yield "grad_mistakes", (*call, "qkv" if kwargs.get("fused") else which)


_WHICH = {  # the gradients each check compares (compare_grads' `which`)
    "check_attention_backward_reference": "qkv", "check_bwd_dkdv_kernel": "kv", "check_bwd_dq_kernel": "q",
    "check_accumulate_dq": "qkv", "check_flash_backward": "qkv", "check_flash_attention_function": "qkv"}
EXTRA = list(_gpu_answers())
