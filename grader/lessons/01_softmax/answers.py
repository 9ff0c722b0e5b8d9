"""What module 01's visible checks ask the answer key (course/recorded.py): the outputs of
the classic mistakes, as signatures, by which a failing check names the slip."""
import torch

from grader.answer_key import signatures

CHECKS = ("check_softmax_naive", "check_softmax_stable", "check_online_softmax",
          "check_softmax_kernel", "check_softmax")


def _softmax(x, dim):
    return torch.softmax(x.to(torch.float64), dim=dim)


def _told_apart(outputs, right):
    """The outputs' signatures, in order, each telling its mistake from the others."""
    return list(signatures(dict(enumerate(outputs)), right).values())


def _max_outputs(x, dim):
    x32 = x.float()
    e, shifted = torch.exp(x32), torch.exp(x32 - x32.max())
    return [e / e.sum(dim=dim, keepdim=True), shifted / shifted.sum(dim=dim, keepdim=True)]


def max_mistakes(x, dim):
    """No max subtracted; the max of the whole tensor subtracted (in float32, as the
    learner's code would)."""
    return _told_apart(_max_outputs(x, dim), _softmax(x, dim))


def _online(x, block_size, *, max_first=False, start=float("-inf")):
    m, total = torch.tensor(start), torch.tensor(0.0)
    x = x.to(torch.float32)
    for begin in range(0, x.numel(), block_size):
        block = x[begin:begin + block_size]
        m_new = torch.maximum(m, block.max())
        total = total * torch.exp((m_new if max_first else m) - m_new) + torch.exp(block - m_new).sum()
        m = m_new
    return torch.exp(x - m) / total


def online_mistakes(x, block_size):
    """The max replaced before the sum is rescaled; the running max started at 0."""
    return _told_apart([_online(x, block_size, max_first=True), _online(x, block_size, start=0.0)],
                       _softmax(x, -1))


def kernel_mistakes(x):
    """A row-softmax kernel's slips on x [rows, cols]: padding lanes loaded as 0, the max
    mistakes, and (below float32) the exps summed in the input's dtype."""
    n_rows, n_cols = x.shape
    block = 1 << max(n_cols - 1, 0).bit_length()
    padded = torch.cat([x.double(), x.new_zeros(n_rows, block - n_cols).double()], dim=1)
    outputs = [torch.softmax(padded, -1)[:, :n_cols], *_max_outputs(x, -1)]
    if x.dtype != torch.float32:
        e = torch.exp(x.float() - x.float().amax(-1, keepdim=True)).to(x.dtype)
        outputs.append(e.double() / e.double().sum(-1, keepdim=True).to(x.dtype).double())
    return _told_apart(outputs, _softmax(x, -1))
