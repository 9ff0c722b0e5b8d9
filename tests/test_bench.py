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
