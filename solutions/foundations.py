"""Module 00, reference answers: the level-0 quiz (vectors, softmax, memory, masks).

Each answer is a module-level name the lesson's exercise cells fill in; the given data
(u, v, a, b, x) is pasted into the lesson's locked cells by `# given:` directives, and the
hidden tests take the answer key from here, so every answer and given value exists once.
"""
import torch

u = torch.tensor([1.0, 2.0, 3.0])
v = torch.tensor([4.0, 5.0, 6.0])
a = torch.tensor([[1.0, 2.0],
                  [3.0, 4.0]])
b = torch.tensor([[5.0, 6.0],
                  [7.0, 8.0]])
x = torch.tensor([[1.0, 2.0, 3.0],
                  [3.0, 2.0, 1.0]])

# Q1: sqrt(3^2 + 4^2).
q01_l2_norm = torch.linalg.vector_norm(torch.tensor([3.0, 4.0])).item()

# Q2: 1*4 + 2*5 + 3*6.
q02_dot = torch.dot(u, v).item()

# Q3: row i of a times column j of b.
q03_matmul = a @ b

# Q4: softmax of a vector, then along each dimension of a 2x3 tensor.
q04_softmax_123 = torch.softmax(torch.tensor([1.0, 2.0, 3.0]), dim=0)
q04_softmax_dim0 = torch.softmax(x, dim=0)
q04_softmax_dim1 = torch.softmax(x, dim=1)
# Scores are [queries, keys]: each query's weights over the keys sum to 1.
q04_attention_dim = 1

# Q5: SRAM is on chip, inside each SM: small and fast. DRAM (HBM) is off chip: large, slower.
q05_sram_vs_dram = "b"

# Q6: exp overflows for large scores; softmax(x - c) = softmax(x).
q06_subtract_max = "b"

# Q7: load a block into SRAM once, reuse it many times.
q07_tiling = "b"

# Q8: query i may see keys j <= i; the blocked entries (j > i) get -inf.
q08_causal_mask = torch.full((4, 4), float("-inf")).triu(1)
# With all scores equal, query i spreads its weight evenly over keys 0..i.
q08_causal_weights = torch.softmax(torch.zeros(4, 4) + q08_causal_mask, dim=-1)


# Q9
def q09_masked_softmax(scores, mask):
    """Softmax over the last dim of `scores`, where mask == 1 marks blocked entries.

    Blocked entries must get weight exactly 0; every row has at least one open entry.
    """
    return torch.softmax(scores.masked_fill(mask.bool(), float("-inf")), dim=-1)


# Q10: unfused attention writes S (N x N) and reads it back, then writes P and reads it
# back; FP16 is 2 bytes per element. A fused kernel keeps S and P in SRAM.
q10_fusion_bytes_saved = 4 * 1024 * 1024 * 2

# Q11: half the bytes and tensor-core speed; FP32 where rounding errors add up.
q11_low_precision = "c"
