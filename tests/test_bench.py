"""The GPU benchmark's report, on the CPU: the CSV of the last H100 run (committed in
solutions/perf/) is re-drawn and tabulated, as `python -m grader bench --plot CSV` does."""
import csv

from grader import paths
from solutions import bench

CSV = paths.SOLUTIONS / "perf" / "bench.csv"


def _tflops(rows, key, impl, field):
    return next(float(r[field]) for r in rows
                if (r["dtype"], r["mode"], r["causal"], r["D"], r["N"]) == key and r["impl"] == impl)


def test_table_and_plots_from_the_saved_run(tmp_path, capsys):
    bench.main(["--plot", str(CSV), "--out", str(tmp_path)])
    out = capsys.readouterr().out
    with open(CSV) as f:
        rows = list(csv.DictReader(f))
    keys = list(dict.fromkeys((r["dtype"], r["mode"], r["causal"], r["D"], r["N"]) for r in rows))
    lines = [line for line in out.splitlines() if line.startswith(("fp16 ", "bf16 "))]
    assert len(lines) == len(keys) == 48, out
    for key, line in zip(keys, lines):
        dtype, mode, causal, d, n = key
        assert line.split()[:5] == [bench.SHORT_DTYPE[dtype], mode, "y" if causal == "True" else "n", d, n]
        # columns between the bars: TFLOPS | eager ratios | graph ratios | memory
        eager, graph = line.split("|")[2].split(), line.split("|")[3].split()
        assert float(eager[0]) == round(_tflops(rows, key, "tuned", "tflops")
                                        / _tflops(rows, key, "sdpa-flash", "tflops"), 2), line
        if mode == "fwd":  # teaching / tuned, the last eager ratio
            assert float(eager[3]) == round(_tflops(rows, key, "teaching", "tflops")
                                            / _tflops(rows, key, "tuned", "tflops"), 2), line
        else:
            assert eager[3] == "n/a", line  # the teaching kernel has no backward
        assert float(graph[0]) == round(_tflops(rows, key, "tuned", "graph_tflops")
                                        / _tflops(rows, key, "sdpa-flash", "graph_tflops"), 2), line
    for name in ("tflops.png", "tflops_graph.png", "memory.png"):
        assert (tmp_path / name).stat().st_size > 10_000, name


def test_tuned_bench_tables(tmp_path, capsys):
    """solutions/tuned_bench.py's tables from a CSV: ours over the better tutorial run,
    FP8 over fp16, split over padded head dims."""
    import csv as csv_
    from solutions import tuned_bench as tb
    fwd = dict(section="fwd", dtype="float16", D=128, N=4096, causal=False)
    fp8 = dict(section="fp8", dtype="float16", D=64, N=1024, causal=True)
    dims = dict(section="dims", dtype="float16", D=160, N=16384, causal=False)
    # each round's times: ours against the better tutorial run (tut-ws here: 450 TFLOPS)
    rounds = {"ours": "1.00 1.10 0.90", "tut-ws": "1.05 1.05 0.90", "tut": "2.0 0.5 1.0"}
    configs = {"ours": "128x128x8x2x", "tut": "64x64x4x3", "tut-ws": "128x64x8x2"}
    rows = [tb._row(fwd, "fwd", i, tflops=t, config=configs.get(i, ""), rounds_ms=rounds.get(i, ""))
            for i, t in (("ours", "500.0"), ("tut", "400.0"), ("tut-ws", "450.0"), ("FA2", "250.0"),
                         ("cuDNN", "625.0"))]
    # the FP8 rows carry no round times, as in CSVs written before the field existed
    rows += [tb._row(fp8, "fwd", i, tflops=t, err=e, config="64x32x4x2" if i.startswith("tut") else "")
             for i, t, e in (("fp16", "300.0", "3e-4"), ("e4m3", "450.0", "4e-2"), ("e5m2", "420.0", "8e-2"),
                             ("e5m2-o8", "440.0", "8e-2"), ("tut-e5m2", "400.0", "1e-1"),
                             ("tut-e5m2-ws", "350.0", "1e-1"))]
    rows += [tb._row(dims, "fwd", i, tflops=t) for i, t in (("ours", "390.0"), ("ours-padded", "300.0"),
                                                           ("FA2", "300.0"), ("cuDNN", "600.0"))]
    small = dict(section="small", dtype="float16", D=64, N=1024, causal=True)
    rows += [tb._row(small, "fwd+bwd", i, tflops=t, config=c)
             for i, t, c in (("ours", "200.0", "1.50 1.40 | tut/X 1.20 0.90"), ("FA2", "135.0", "1.00 1.00"),
                             ("tut", "170.0", "1.30 1.20"))]
    path = tmp_path / "t.csv"
    with open(path, "w", newline="") as f:
        writer = csv_.DictWriter(f, fieldnames=tb.FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    tb.main(["--table", str(path)])
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("float16  128  4096 n"))
    assert line.split("|")[2].split() == ["1.11", "0.80", "2.00"], line  # 500/450, 500/625, 500/250
    # by round, tut-ws's time over ours: 1.05, 0.95, 1.00; level or ahead in 2 of 3
    assert line.split("|")[3].split() == ["0.95-1.05", "2/3"], line
    assert line.split("|")[4:] == [" 128x128x8x2x ", " 128x64x8x2"], line  # ours', the better tutorial run's
    line = next(x for x in out.splitlines() if x.startswith("float16   64  1024 y"))
    assert line.split("|")[2].split() == ["1.50", "1.40", "1.05", "1.10"], line  # 450/300, 420/300, 420/400, 440/400
    assert line.split("|")[3].split() == ["n/a"], line
    assert line.split("|")[-1] == " 64x32x4x2", line
    line = next(x for x in out.splitlines() if x.startswith("float16  160 16384 n"))
    assert line.split("|")[2].split() == ["1.30", "0.65", "1.30"], line
    # the small section: a line of per-repetition ratios under the case for ours and the tutorial
    at = out.splitlines().index(next(x for x in out.splitlines() if x.startswith("float16   64  1024 y |       200.0")))
    assert out.splitlines()[at + 1].split() == ["ours", ":", "1.50", "1.40", "|", "tut/X", "1.20", "0.90"]
    assert out.splitlines()[at + 2].split() == ["tut", ":", "1.30", "1.20"]


def test_tuned_bench_times_the_short_forward_from_graphs_too(monkeypatch):
    """At N = GRAPH_N the forward rows come twice: eager, and replayed from CUDA graphs
    (mode fwd-graph, same errors and config); an implementation that cannot be captured
    reads n/a there. Other lengths get no graph rows. (`_graph_ms` scripted: no GPU.)"""
    from solutions import tuned_bench as tb
    graph_ms = {"ours": 0.5, "tut": None}  # None: the capture fails

    def fake_graph_ms(fn, grads, rep=tb.REP_MS):
        ms = graph_ms[fn()]
        if ms is None:
            raise RuntimeError("operation not permitted when stream is capturing")
        return ms

    monkeypatch.setattr(tb, "_graph_ms", fake_graph_ms)
    monkeypatch.setattr(tb, "_ms", lambda fn: {"ours": 1.0, "tut": 2.0}[fn()])
    steps = {"ours": lambda: "ours", "tut": lambda: "tut"}
    for n, expect_graph in ((tb.GRAPH_N, True), (tb.GRAPH_N * 4, False)):
        case = dict(section="fp8", dtype="float16", D=64, N=n, causal=True)
        rows = {name: tb._row(case, "fwd", name, err="1e-2", config="cfg-" + name) for name in steps}
        tb._fill_times(rows, steps, 1e9)
        assert [rows[x]["ms"] for x in steps] == ["1.0000", "2.0000"]
        assert rows["tut"]["rounds_ms"] == " ".join(["2.0000"] * tb.ROUNDS)
        graphed = tb._graph_rows(case, "fwd", rows, steps, 1e9)
        if not expect_graph:
            assert graphed == []
            continue
        ours, tut = graphed
        assert (ours["mode"], ours["ms"], ours["tflops"], ours["err"], ours["config"], ours["status"]) == (
            "fwd-graph", "0.5000", "2.0", "1e-2", "cfg-ours", "ok")
        assert tut["ms"] == "" and tut["status"].startswith("n/a (operation not permitted")


def test_tuned_bench_names_the_config_that_ran(monkeypatch):
    """The config column: the Triton kernel's tiles, "gluon" where flash_gluon's kernel
    ran (a launch with no autotuned config), nothing before any launch."""
    from solutions import flash_tuned
    from solutions import tuned_bench as tb
    for last, text in ((flash_tuned._config(128, 64, 8, 3), "128x64x8x3"),
                       (flash_tuned._config(128, 128, 4, 2, "ws"), "128x128x4x2xws"),
                       (flash_tuned.GLUON, "gluon"), (None, "")):
        monkeypatch.setattr(flash_tuned, "LAST_CONFIG", [last])
        assert tb._chosen_config() == text
    # each row's column: ours' rows (FP8's too) ours, SDPA's none, the tutorial's its own
    monkeypatch.setattr(tb, "_tutorial_config", lambda: "64x64x4x3")
    monkeypatch.setattr(flash_tuned, "LAST_CONFIG", [flash_tuned._config(128, 64, 8, 3)])
    assert [tb._config_that_ran(n) for n in ("ours", "ours-padded", "e4m3", "e5m2-o8", "FA2", "cuDNN",
                                             "tut", "tut-e5m2-ws")] == ["128x64x8x3"] * 4 + ["", ""] + ["64x64x4x3"] * 2


def test_tuned_bench_names_the_tutorials_config(monkeypatch):
    """The tutorial's rows name the config its autotuner took: its time can change with
    that choice from one run to the next. Nothing without a tutorial or before its launch."""
    import types
    import course  # noqa: F401  (sets TRITON_INTERPRET on a CPU, before triton is imported)
    import torch
    import triton
    import triton.language as tl
    from solutions import tuned_bench as tb

    # an autotuned kernel as the tutorial's is (one config: the interpreter times none)
    @triton.autotune([triton.Config({"BLOCK_M": 32, "BLOCK_N": 16}, num_warps=4, num_stages=2)], key=["n"])
    @triton.jit
    def _attn_fwd(X, n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        offs = tl.arange(0, BLOCK_M)
        tl.store(X + offs, tl.load(X + offs, mask=offs < n) + BLOCK_N, mask=offs < n)

    monkeypatch.setattr(tb, "TUT", None)
    assert tb._tutorial_config() == ""
    monkeypatch.setattr(tb, "TUT", types.SimpleNamespace(_attn_fwd=_attn_fwd))
    assert tb._tutorial_config() == ""
    x = torch.randn(20, device="cuda" if torch.cuda.is_available() else "cpu")
    before = x.clone()
    _attn_fwd[(1,)](x, 20)
    assert torch.equal(x, before + 16) and tb._tutorial_config() == "32x16x4x2"


def test_tuned_bench_compiles_each_config_with_its_descriptor_tiles():
    """Compiling ahead (`--jobs`) runs each config's pre_hook before compiling it, as a
    launch does: our descriptor configs are compiled for the tiles their hook gives the
    host-made descriptors. Without the hooks every descriptor config got the wrapper's
    placeholder tiles (16 x 16) and failed to compile on the GPU. A config that fails is
    reported, and the others are still compiled."""
    import types
    import course  # noqa: F401  (sets TRITON_INTERPRET on a CPU, before triton is imported)
    import triton
    import triton.language as tl
    from solutions import flash_tuned as ft
    from solutions import tuned_bench as tb

    @triton.jit
    def kernel(Q_DESC, K_DESC, V_DESC, BLOCK_D: tl.constexpr, V_T: tl.constexpr, BLOCK_Q: tl.constexpr,
               BLOCK_K: tl.constexpr, TMA: tl.constexpr, WS: tl.constexpr, Q_DEVICE: tl.constexpr):
        pass

    shapes = [(64, 32, 4, 3, "tma"), (64, 64, 4, 2), (128, 64, 8, 3, "tma"), (128, 32, 8, 2, "tma")]
    tuned = triton.autotune([ft._config(*s) for s in shapes], key=[])(kernel)
    compiled = []

    def warmup(*args, grid, **kwargs):
        if kwargs["BLOCK_K"] == 32 and kwargs["BLOCK_Q"] == 128:
            raise ValueError("out of shared memory")
        compiled.append((kwargs["BLOCK_Q"], kwargs["BLOCK_K"], [d.block_shape for d in args]))

    tuned.fn = types.SimpleNamespace(warmup=warmup)
    descs = [types.SimpleNamespace(shape=[2, 3, 100, 64], block_shape=[1, 1, 16, 16]) for _ in range(3)]
    failed = tb.warm_configs(tuned, descs, dict(BLOCK_D=64, V_T=False))
    assert compiled == [
        (64, 32, [[1, 1, 64, 64], [1, 1, 32, 64], [1, 1, 32, 64]]),
        (64, 64, [[1, 1, 64, 64], [1, 1, 32, 64], [1, 1, 32, 64]]),  # pointers: no hook
        (128, 64, [[1, 1, 128, 64], [1, 1, 64, 64], [1, 1, 64, 64]]),
    ]
    assert len(failed) == 1 and "BLOCK_Q: 128, BLOCK_K: 32" in failed[0], failed
    assert "out of shared memory" in failed[0] and tuned.nargs is None


def test_tuned_bench_runs_the_cases_that_dims_and_causal_select(monkeypatch):
    """--dims and --causal narrow every section but check, in the timed process and in
    the processes that compile ahead (they index the same narrowed list)."""
    import torch
    from solutions import tuned_bench as tb
    monkeypatch.setattr(tb, "LENGTHS", tb.LENGTHS)
    monkeypatch.setattr(tb, "DIMS", tb.DIMS)
    monkeypatch.setattr(tb, "CAUSAL", tb.CAUSAL)
    everything = {s: tb.cases(s) for s in tb.SECTIONS}
    tb._select(((1024, 4096), (128,), True))
    fp8 = tb.cases("fp8")
    assert [(c["D"], c["N"], c["causal"]) for c in fp8] == [(128, 1024, True), (128, 4096, True)]
    assert [(c["dtype"], c["D"], c["causal"]) for c in tb.cases("small")] == [
        (torch.bfloat16, 128, True), (torch.float16, 128, True)]
    assert tb.cases("dims") == [] and tb.cases("check") == everything["check"]
    worker = tb._selection()
    tb._select((tb.LENGTHS, None, None))
    assert len(tb.cases("fp8")) == 8
    tb._select(worker)
    assert tb.cases("fp8") == fp8 and len(everything["fp8"]) == 12


def test_tuned_bench_gives_the_tutorial_our_fp8_tensors(monkeypatch):
    """The fp8 section's tutorial rows run on the very e5m2 tensors "e5m2-o8" reads (V
    with keys contiguous, as both kernels want it), the descales folded into the softmax
    scale (the tutorial takes none), with and without warp specialization."""
    import torch
    from solutions import tuned_bench as tb
    calls = []

    class Tutorial:
        @staticmethod
        def forward(q, k, v, causal, scale, warp_specialize):
            calls.append((q, k, v, causal, scale, warp_specialize))
            return q
    monkeypatch.setattr(tb, "TUT", Tutorial)
    D = 64
    q32, k32, v32 = (torch.randn(2, 3, 40, D, generator=torch.Generator().manual_seed(s)) * 3
                     for s in range(3))
    impls, refs = tb._fp8_impls(dict(causal=True, D=D, N=40), q32, k32, v32)
    impls["tut-e5m2"]()
    impls["tut-e5m2-ws"]()
    q8, k8, v8, dq, dk, _ = refs["e5m2"]
    assert [c[5] for c in calls] == [False, True] and all(c[3] is True for c in calls)
    for q, k, v, _, scale, _ in calls:
        assert q is q8 and k is k8 and q8.dtype == torch.float8_e5m2
        assert torch.equal(v.float(), v8.float()) and v.stride(-2) == 1  # keys contiguous
        assert abs(scale - D ** -0.5 * dq.item() * dk.item()) < 1e-12 * scale


def _leaky_causal(q, k, v, scale, block=64):
    """Causal attention as the tutorial's forward computes it on a 64 x 128 tile: in every
    odd 64-query block the diagonal block's keys are all seen once unmasked (later keys
    too), and the ones up to the query once more."""
    import torch
    n = q.shape[-2]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    odd_diagonal = (i // block % 2 == 1) & (j // block == i // block)
    count = (j <= i).double() + odd_diagonal.double()
    s = (q @ k.transpose(-1, -2)).double() * scale
    w = count * torch.exp(s - s.amax(-1, keepdim=True))
    return (w / w.sum(-1, keepdim=True)) @ v.double()


def test_tuned_bench_flags_an_fp8_forward_that_sees_later_keys(monkeypatch):
    """The fp8 section checks each FP8 output against fp32 on its own dequantized inputs
    too (FP8_KERNEL_TOL): a forward that lets some queries see later keys reads 0.24 from
    the unquantized reference, under its 0.3, but 0.22 from its own inputs' (an honest
    kernel: 0.02-0.07). The tutorial's causal FP8 forward did this on a 64 x 128 tile."""
    import torch
    from solutions import flash_tuned as ft
    from solutions import tuned_bench as tb
    monkeypatch.setattr(tb, "DEV", "cpu")
    monkeypatch.setattr(tb, "H", 2)
    monkeypatch.setattr(tb, "TOTAL", 256)
    monkeypatch.setattr(tb, "_fill_times", lambda rows, steps, flops: None)
    monkeypatch.setattr(tb, "_graph_rows", lambda *args: [])
    monkeypatch.setattr(tb, "_config_that_ran", lambda name: "")
    D = 64

    def impls(case, q32, k32, v32):
        (q8, dq), (k8, dk), (v8, dv) = (ft.quantize_fp8(t, torch.float8_e5m2) for t in (q32, k32, v32))
        q, k, v = (t.float() * d for t, d in ((q8, dq), (k8, dk), (v8, dv)))
        honest = tb._ref32(q, k, v, True)
        leaky = _leaky_causal(q, k, v, D ** -0.5)
        return ({"e5m2": lambda: honest, "tut-e5m2": lambda: (leaky / dv).float()},
                {"e5m2": (q8, k8, v8, dq, dk, dv)})
    monkeypatch.setattr(tb, "_fp8_impls", impls)
    rows = {r["impl"]: r for r in tb.run_fp8(dict(section="fp8", dtype=torch.float16, D=D, N=256, causal=True))}
    assert rows["e5m2"]["status"] == "ok"
    assert 0.2 < float(rows["tut-e5m2"]["err"]) < 0.3 and 0.2 < float(rows["tut-e5m2"]["err_kernel"])
    assert rows["tut-e5m2"]["status"].startswith("WRONG")


def test_tuned_bench_lets_the_tutorial_choose_for_each_case(monkeypatch):
    """The tutorial's autotuner keys leave out the causal flag: every case starts with
    its cache empty, so a causal case is tuned (and pruned) as causal."""
    import types
    from solutions import tuned_bench as tb
    seen = []

    def run_fwd(case):
        seen.append(dict(tuner.cache))
        tuner.cache[(case["N"], 64)] = "config for causal=%s" % case["causal"]
        return []
    tuner = types.SimpleNamespace(cache={})
    monkeypatch.setattr(tb, "TUT", types.SimpleNamespace(_attn_fwd=tuner))
    monkeypatch.setattr(tb, "run_fwd", run_fwd)
    for causal in (False, True):
        tb.run_case("fwd", dict(N=1024, causal=causal), reps=1)
    assert seen == [{}, {}]
