"""Visible checks of module 07 (block sizes and tuning). Hidden tests reuse the `case_*`
functions on configurations the learner never sees (hundreds of them: everything here is
arithmetic on whole numbers, so a case costs microseconds).

Each expected value is the answer key's (course/recorded.py: recorded for these inputs,
computed by the grader for a hidden test's), and so are the values of the classic
mistakes, so that the message can name the one a result matches.
"""
import random

import torch

from course.recorded import answer
from course.testing import check_choice, check_rejects, fail  # noqa: F401 (check_choice: test cells)

GRANULE = 16  # every block is a multiple of tl.dot's smallest tile side
FORWARD = (("block_q", "q_len"), ("block_kv", "kv_len"))  # a forward block and its sequence
SUB_BLOCKS = (("block_kv_compute", "block_kv"), ("block_q_dkv", "block_q"),
              ("block_kv_dkv", "block_kv"), ("block_q_dq", "block_q"), ("block_kv_dq", "block_kv"))
BLOCK_NAMES = ("block_q", "block_kv") + tuple(sub for sub, _ in SUB_BLOCKS)
LENGTHS = ("q_len", "kv_len")
PADDED_BY = {"q_len": "block_q", "kv_len": "block_kv"}


# ---------------------------------------------------------------------------------------
# check_block_config

def _divisors(n, at_most):
    return [d for d in range(GRANULE, min(n, at_most) + 1, GRANULE) if n % d == 0]


def random_config(rng):
    """(blocks, q_len, kv_len) drawn from rng (a random.Random): blocks that are
    multiples of 16 but rarely powers of two; sub-blocks half the time a divisor of their
    block, else any multiple of 16 up to twice it; sequences long, or short (as a
    cross-attention's text tokens or a decoding step), either of them."""
    blocks = {"block_q": GRANULE * rng.randint(1, 24), "block_kv": GRANULE * rng.randint(1, 32)}
    for sub, parent in SUB_BLOCKS:
        whole = blocks[parent]
        blocks[sub] = (rng.choice(_divisors(whole, whole)) if rng.random() < 0.5
                       else GRANULE * rng.randint(1, 2 * whole // GRANULE))
    short = rng.randint(0, 3)
    q_len = rng.randint(1, 200) if short == 0 else rng.randint(1, 40000)
    kv_len = rng.randint(1, 300) if short in (0, 1) else rng.randint(1, 40000)
    return {key: blocks[key] for key in BLOCK_NAMES}, q_len, kv_len


def _call_name(blocks, q_len, kv_len):
    return (f"check_block_config({{{', '.join(f'{k}: {v}' for k, v in blocks.items())}}}, "
            f"q_len={q_len}, kv_len={kv_len})")


def _wrong_block(key, got, want, blocks, mistakes, q_len, kv_len):
    """Why a forward block (rule 1) is wrong."""
    length_name = dict(FORWARD)[key]
    length = q_len if key == "block_q" else kv_len
    room = mistakes["room"][key]
    if got == length and length % GRANULE:
        return (f"{key} became {length}, the sequence length itself: blocks are multiples of "
                f"{GRANULE}, so round {length_name} = {length} up to one ({room})")
    if key == "block_kv" and got == mistakes["kv_fitted_to_q_len"] != want:
        return ("block_kv was fitted to q_len, not kv_len: the key/value blocks follow the "
                f"KV sequence, which in cross-attention has its own length (kv_len = {kv_len})")
    if got == blocks[key] and want < got:
        return (f"{key} = {got} is longer than the sequence ({length_name} = {length}, {room} "
                f"rounded up to {GRANULE}): shrink it to {room}, or most of its work is padding")
    if want == blocks[key]:
        return (f"{key} was changed, but it is no longer than {length_name} rounded up to "
                f"{GRANULE} ({room}): only a block longer than its sequence shrinks")
    return f"{key} shrinks to {length_name} = {length} rounded up to a multiple of {GRANULE}"


def _wrong_sub_block(key, got, want, blocks, out):
    """Why a sub-block (rule 2) is wrong."""
    parent = dict(SUB_BLOCKS)[key]
    block, asked = out[parent], blocks[key]
    if block % got:
        why = (f"{key} = {got} does not divide {parent} = {block} ({block} % {got} = "
               f"{block % got}): a sub-block must divide its block")
        if blocks[parent] % got == 0 and blocks[parent] != block:
            why += (f". It divided {parent} = {blocks[parent]} as given, but {parent} was shrunk "
                    f"to {block} first: check the sub-blocks after rule 1")
        return why
    if block % asked == 0:
        return (f"{key} = {asked} divides {parent} = {block} already: a sub-block changes only "
                "when it does not divide its block")
    return (f"{key} should be the largest multiple of {GRANULE} that divides {parent} = "
            f"{block} and is at most the {asked} asked for: {want}, not {got}")


def _wrong_length(key, got, want, blocks, out, lengths):
    """Why a padded sequence length (rule 3) is wrong."""
    block_name = PADDED_BY[key]
    block, length = out[block_name], lengths[key]
    other_name = "block_kv" if block_name == "block_q" else "block_q"
    if got < length:
        return (f"{key} = {length} became {got}, shorter than the sequence: padding rounds up, "
                f"to the smallest multiple of {block_name} = {block} at or above {length}")
    if got % block and got % out[other_name] == 0:
        return (f"{key} was padded to a multiple of {other_name} = {out[other_name]}: each "
                f"sequence is padded to a multiple of its own block, {block_name} = {block}")
    if got % block:
        return f"{key} = {got} is not a multiple of {block_name} = {block}"
    if got == length:
        return f"{key} = {length} was not padded: it must become a multiple of {block_name} = {block}"
    return (f"{key} was padded to {got}; the smallest multiple of {block_name} = {block} at or "
            f"above {length} is {want}")


def _check_adjusted(adjusted, want, mistakes, blocks, q_len, kv_len, name):
    if not isinstance(adjusted, dict):
        fail(f"{name}: the adjusted configuration should be a dict, got {type(adjusted).__name__}")
    keys = set(BLOCK_NAMES + LENGTHS)
    missing, extra = sorted(keys - set(adjusted)), sorted(set(adjusted) - keys, key=str)
    if missing or extra:
        fail(f"{name}: the adjusted configuration should hold the seven blocks and the padded "
             f"q_len and kv_len, nothing else" + (f"; missing {missing}" if missing else "")
             + (f"; unknown {extra}" if extra else ""))
    for key in BLOCK_NAMES + LENGTHS:
        got = adjusted[key]
        if isinstance(got, bool) or not isinstance(got, int) or got < 1:
            fail(f"{name}: {key} should be a positive whole number, got {got!r}")
        if got == want[key]:
            continue
        if key in dict(FORWARD):
            why = _wrong_block(key, got, want[key], blocks, mistakes, q_len, kv_len)
        elif key in dict(SUB_BLOCKS):
            why = _wrong_sub_block(key, got, want[key], blocks, want)
        else:
            why = _wrong_length(key, got, want[key], blocks, want, {"q_len": q_len, "kv_len": kv_len})
        fail(f"{name}: {key} is {got}, expected {want[key]}.\n  {why}")


def _check_log(log, changes, name):
    if not isinstance(log, (list, tuple)) or not all(isinstance(line, str) for line in log):
        fail(f"{name}: the log should be a list of strings, one line per change, got {log!r}")
    lines = list(log)
    heads = [f"{key}: {old} -> {new}" for key, old, new, _ in changes]
    for i, (head, (*_, names)) in enumerate(zip(heads, changes)):
        if i >= len(lines):
            fail(f"{name}: the log has {len(lines)} line(s), but {len(changes)} value(s) changed: "
                 f"no line for '{head}'. Every change gets one log line, in the order the rules "
                 f"make them; expected lines starting: {heads}")
        line = lines[i]
        if not line.startswith(head + ":"):
            where = [j for j, other in enumerate(lines) if other.startswith(head + ":")]
            fail(f"{name}: log line {i + 1} should start with '{head}: ', got {line!r}"
                 + (f" (that change is on line {where[0] + 1}: the lines follow the order of the "
                    "rules: forward blocks, then sub-blocks, then padding)" if where else
                    f". Each line reads 'key: old -> new: why'; expected lines starting: {heads}"))
        why = line[len(head) + 1:]
        if names not in why:
            fail(f"{name}: log line {i + 1} ({line!r}) should say why, naming "
                 + (f"the length that forced it ({names})" if names.isdigit() else
                    f"the block it depends on ({names})"))
    if len(lines) > len(changes):
        fail(f"{name}: the log has {len(lines)} lines but only {len(changes)} value(s) changed; "
             f"lines for changes that were not made: {lines[len(changes):]}")


def case_block_config(fn, blocks, q_len, kv_len):
    name = _call_name(blocks, q_len, kv_len)
    want, changes = answer("block_tuning", "block_config", blocks, q_len, kv_len)
    mistakes = answer("block_tuning", "block_config_mistakes", blocks, q_len, kv_len)
    try:
        result = fn(dict(blocks), q_len, kv_len)
    except ZeroDivisionError as error:
        fail(f"{name} raised ZeroDivisionError ({error}): a block reached 0. Blocks are "
             f"multiples of {GRANULE} (rule 1 rounds a length up to one), and rule 2 tries only "
             f"multiples of {GRANULE}, down to {GRANULE}, which divides every block")
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        fail(f"{name} should return a pair (adjusted, log), got {type(result).__name__}")
    adjusted, log = result
    _check_adjusted(adjusted, want, mistakes, blocks, q_len, kv_len, name)
    _check_log(log, changes, name)


def _blocks(q, kv, kv_compute, q_dkv, kv_dkv, q_dq, kv_dq):
    return dict(zip(BLOCK_NAMES, (q, kv, kv_compute, q_dkv, kv_dkv, q_dq, kv_dq)))


def bad_block_inputs(fn):
    good = _blocks(128, 64, 32, 64, 64, 128, 32)
    without = {k: v for k, v in good.items() if k != "block_kv_dq"}
    return [("a configuration without block_kv_dq", lambda: fn(without, 1024, 1024)),
            ("an unknown key 'block_k'", lambda: fn(dict(good, block_k=64), 1024, 1024)),
            ("block_q = 100, not a multiple of 16", lambda: fn(dict(good, block_q=100), 1024, 1024)),
            ("block_kv_compute = 0", lambda: fn(dict(good, block_kv_compute=0), 1024, 1024)),
            ("kv_len = 0", lambda: fn(good, 1024, 0)),
            ("q_len = 10.5", lambda: fn(good, 10.5, 1024))]


def check_block_config_rules(check_block_config):
    def case(blocks, q_len, kv_len):
        case_block_config(check_block_config, blocks, q_len, kv_len)
    case(_blocks(128, 64, 32, 64, 64, 128, 32), 4096, 4096)      # nothing to change
    case(_blocks(128, 128, 48, 128, 128, 64, 128), 4096, 4096)   # 48 does not divide 128
    case(_blocks(192, 64, 64, 128, 64, 192, 256), 3072, 2048)    # 128 does not divide 192; 256 > 64
    case(_blocks(128, 96, 32, 64, 96, 64, 48), 1000, 1000)       # both sequences padded
    case(_blocks(64, 96, 32, 64, 96, 64, 48), 640, 1000)         # kv padded to a multiple of 96
    case(_blocks(128, 256, 64, 128, 128, 64, 256), 4096, 77)     # short cross-attention KV
    case(_blocks(128, 128, 64, 64, 128, 128, 64), 1, 4096)       # one query (decoding)
    rng = random.Random(7)
    for _ in range(40):
        case(*random_config(rng))
    check_rejects(bad_block_inputs(check_block_config), name="check_block_config")
    print("ok  check_block_config: 47 configurations adjusted and logged as the rules say; "
          "bad configurations rejected")


# ---------------------------------------------------------------------------------------
# smem_bytes and prune_configs

def _element(dtype):
    return torch.empty((), dtype=dtype).element_size()


def _smem_mistakes(head_dim, dtype, stages, width):
    """What each value of answers.py's smem_mistakes comes from."""
    size = _element(dtype)
    return (
        "the K and V tiles were counted once, not once per pipeline stage: with num_stages = "
        f"{stages}, {stages} K tiles and {stages} V tiles are in shared memory at once",
        "one tile per stage was counted: each stage holds a K tile and a V tile",
        "the Q tile was counted for every stage: it is loaded once and held for the whole loop",
        "the Q tile was left out: it stays in shared memory for the whole loop",
        f"{stages} - 1 stages were counted: the pipeline keeps num_stages K and V tiles",
        f"elements, not bytes: multiply by the bytes of one element ({size} for "
        f"{str(dtype).replace('torch.', '')})",
        f"head_dim = {head_dim} was not padded: tiles are BLOCK_D = max(16, next power of two) "
        f"= {width} wide")


def _whole(got, name):
    if isinstance(got, bool) or not isinstance(got, int):
        fail(f"{name} should be a whole number of bytes (an int), got {got!r}")


def case_smem_bytes(fn, block_q, block_kv, head_dim, dtype, stages, want=None):
    """want: the bytes to expect (default: the answer key's model)."""
    dtype_name = str(dtype).replace("torch.", "")
    name = f"smem_bytes({block_q}, {block_kv}, {head_dim}, torch.{dtype_name}, {stages})"
    got = fn(block_q, block_kv, head_dim, dtype, stages)
    _whole(got, name)
    args = (block_q, block_kv, head_dim, dtype, stages)
    want = answer("block_tuning", "smem_bytes", *args) if want is None else want
    width = answer("block_tuning", "block_d", head_dim)
    mistakes = zip(_smem_mistakes(head_dim, dtype, stages, width),
                   answer("block_tuning", "smem_mistakes", *args))
    if got != want:
        named = [text for text, value in mistakes if value == got]
        fail(f"{name} is {got}, expected {want} bytes: a Q tile of {block_q} rows plus {stages} "
             f"K and V tiles of {block_kv} rows, each row {width} elements of "
             f"{_element(dtype)} bytes"
             + (f".\n  this matches a classic mistake: {named[0]}" if named else ""))


def check_smem_bytes(smem_bytes):
    def case(*args):
        case_smem_bytes(smem_bytes, *args)
    case(64, 64, 40, torch.float32, 3)     # each classic mistake gives another number here
    case(128, 64, 64, torch.float16, 3)    # module 05's blocks on a GPU, D = 64
    case(128, 128, 128, torch.float16, 4)  # the compiler refused this one: 294,912 bytes
    case(64, 32, 256, torch.bfloat16, 2)
    case(16, 16, 16, torch.float16, 1)     # the smallest: one stage, no pipelining
    case(48, 80, 96, torch.float32, 5)
    check_rejects([("stages = 0", lambda: smem_bytes(64, 64, 64, torch.float16, 0))], name="smem_bytes")
    print("ok  smem_bytes: Q once, K and V per stage, BLOCK_D wide, in bytes")


def case_prune_configs(fn, configs, head_dim, dtype, limit, default_limit):
    """limit None: the call leaves it out, and default_limit is expected."""
    dtype_name = str(dtype).replace("torch.", "")
    name = (f"prune_configs({len(configs)} configs, head_dim={head_dim}, torch.{dtype_name}"
            + (f", limit={limit})" if limit is not None else ") (default limit)"))
    got = fn(list(configs), head_dim, dtype) if limit is None else fn(list(configs), head_dim, dtype, limit)
    if not isinstance(got, (list, tuple)):
        fail(f"{name} should return a list of configurations, got {type(got).__name__}")
    got = [tuple(c) if isinstance(c, (list, tuple)) else c for c in got]
    lim = default_limit if limit is None else limit

    def smem(c, stages):
        return answer("block_tuning", "smem_bytes", c[0], c[1], head_dim, dtype, stages)
    # Each configuration's bytes, and as if num_warps were its stages (a classic slip): the
    # same answers whatever the limit, so a GPU's own default limit asks nothing new.
    need = {c: smem(c, c[3]) for c in configs}
    by_warps = {c: smem(c, c[2]) for c in configs}
    want = [c for c in configs if need[c] <= lim]
    if got == want:
        return
    stray = [c for c in got if c not in configs]
    kept_too_many = [c for c in got if c in need and need[c] > lim]
    dropped = [c for c in want if c not in got]
    if stray:
        fail(f"{name} returned {stray[0]!r}, which is not one of the configurations given: "
             "return the (block_q, block_kv, num_warps, num_stages) tuples that fit, unchanged")
    if sorted(got) == sorted(want):
        fail(f"{name} kept the right configurations in another order: keep the order given (it is "
             "the autotuner's list, best guess first)")
    if kept_too_many:
        c = kept_too_many[0]
        why = (f"{name} kept {c}, which needs {need[c]} bytes, more than the limit of {lim}")
        if limit is None and need[c] <= 228 * 1024:
            why += (": the default limit is smem_limit(), what ONE program may use (on an H100 "
                    "232,448 bytes); an SM's 228 KiB include 1 KiB the driver keeps per program")
        elif by_warps[c] <= lim:
            why += f": the pipeline depth is num_stages, the 4th entry ({c[3]}), not num_warps ({c[2]})"
        fail(why)
    c = dropped[0]
    why = f"{name} dropped {c}, which needs {need[c]} bytes, within the limit of {lim}"
    if need[c] == lim:
        why += ": a configuration that needs exactly the limit fits (<=)"
    elif by_warps[c] > lim:
        why += f": the pipeline depth is num_stages, the 4th entry ({c[3]}), not num_warps ({c[2]})"
    fail(why)


H100_LIMIT = 232448  # what one program may use on an H100: smem_limit() there and on a CPU


def limit_cases(limit):
    """Configurations at the limit: one needs exactly `limit` bytes (it fits), one needs
    1 KiB more (it does not), at head dim 16 in fp16 (32 bytes per row of a tile)."""
    rows = limit // 32
    return [(rows - 32, 16, 4, 1), (rows, 16, 4, 1)]


def check_prune_configs(prune_configs, smem_limit):
    default = smem_limit()
    sweep = [(bq, bk, w, s) for bq in (64, 128, 256) for bk in (32, 64, 128) for w in (4, 8)
             for s in (2, 3, 4)]

    def case(configs, head_dim, dtype, limit=None):
        case_prune_configs(prune_configs, configs, head_dim, dtype, limit, default)
    case(sweep, 128, torch.float16, H100_LIMIT)         # 8 of 54 do not fit an H100
    case(sweep[::-1], 64, torch.float32, 150000)        # another order, fp32
    case([(128, 64, 8, 3), (128, 128, 4, 4), (64, 64, 4, 2)], 128, torch.float16)
    # At the H100's limit and 1 KiB above (an SM's 228 KiB), with the default limit: at the
    # limit itself on an H100 and a CPU, and the same inputs (recorded bytes) on any GPU;
    # then at an A100's limit, passed, so that every machine tries exactly a limit (<=).
    case(limit_cases(H100_LIMIT), 16, torch.float16)
    case(limit_cases(166912), 16, torch.float16, 166912)
    case([(128, 64, 2, 4), (64, 64, 8, 2)], 80, torch.bfloat16, 150000)  # stages: the 4th entry
    case([], 64, torch.float16, H100_LIMIT)
    print(f"ok  prune_configs: keeps what fits in the limit (default {default:,} bytes here), "
          "in the order given")


# ---------------------------------------------------------------------------------------
# kernel_dram_bytes

def _dram_mistakes(N, block_q, size, width):
    """What each value of answers.py's dram_mistakes comes from."""
    return (
        f"elements, not bytes: multiply by the bytes of one element ({size} here), and count "
        "the LSE's 4 bytes per row",
        "elements, not bytes: multiply the counts of Q, K, V and O by the bytes of one element",
        "the LSE was left out: the kernel also writes one fp32 number (4 bytes) per query row",
        "the LSE was counted in the inputs' dtype: it is fp32, 4 bytes per row",
        "one (batch, head) was counted: every one of the B x H heads moves its own bytes",
        f"the query blocks were counted with N // block_q: a ragged last block ({N % block_q} "
        "rows) reads all of K and V too (ceil)",
        "K and V were counted as read once: every query block reads all of them",
        f"the head dim was padded to {width}: masked lanes are not read from DRAM, count D")


def case_kernel_dram_bytes(fn, B, H, N, D, block_q, dtype):
    dtype_name = str(dtype).replace("torch.", "")
    name = f"kernel_dram_bytes(B={B}, H={H}, N={N}, D={D}, block_q={block_q}, torch.{dtype_name})"
    try:
        got = fn(B, H, N, D, block_q, dtype)
    except ValueError as error:
        fail(f"{name} raised ValueError: {error}. Module 04's flash_dram_accesses(N, d, M) takes "
             "an SRAM of M elements and uses blocks of b = M // (4 d) rows: for blocks of "
             "block_q rows, pass M = 4 * D * block_q")
    _whole(got, name)
    args = (B, H, N, D, block_q, dtype)
    want = answer("block_tuning", "kernel_dram_bytes", *args)
    width = answer("block_tuning", "block_d", D)
    mistakes = zip(_dram_mistakes(N, block_q, _element(dtype), width),
                   answer("block_tuning", "dram_mistakes", *args))
    if got != want:
        named = [text for text, value in mistakes if value == got]
        fail(f"{name} is {got:,}, expected {want:,} bytes: Q and O once, K and V once per query "
             f"block ({-(-N // block_q)} blocks), {_element(dtype)} bytes each, plus 4 bytes of "
             f"LSE per row, for each of the {B * H} heads"
             + (f".\n  this matches a classic mistake: {named[0]}" if named else ""))


def check_kernel_dram_bytes(kernel_dram_bytes):
    def case(*args):
        case_kernel_dram_bytes(kernel_dram_bytes, *args)
    case(2, 3, 1000, 80, 64, torch.float32)     # a ragged last block; each mistake differs here
    case(1, 16, 16384, 64, 128, torch.float16)  # the sweep's shape
    case(4, 2, 77, 48, 128, torch.bfloat16)     # one block covers the sequence
    case(1, 1, 1, 16, 16, torch.float16)
    case(3, 5, 4097, 128, 256, torch.float16)
    print("ok  kernel_dram_bytes: module 04's model with blocks of block_q rows, in bytes, "
          "with the LSE")
