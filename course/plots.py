"""Pictures the lessons show: heatmaps, lines and bars, in one consistent style."""
import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator
import torch


def _numpy(t):
    return t.detach().to("cpu", torch.float32).numpy() if isinstance(t, torch.Tensor) else t


def heatmaps(matrices: dict, *, cmap="viridis", annotate=False, figsize_per=3.2, suptitle=None,
             unit=()):
    """One heatmap per entry of {title: 2-D tensor} (queries down, keys across), side by
    side. -inf shows as white. Titles in `unit` (weights) use a fixed 0-1 scale, so an
    all-zero row looks like 0; boolean masks get two colours and a legend."""
    import matplotlib.colors as mcolors
    import matplotlib.patches as mpatches
    import numpy as np
    fig, axes = plt.subplots(1, len(matrices), figsize=(figsize_per * len(matrices), figsize_per),
                             squeeze=False)
    for ax, (title, m) in zip(axes[0], matrices.items()):
        is_mask = isinstance(m, torch.Tensor) and m.dtype == torch.bool
        data = _numpy(m)
        if is_mask:
            ax.imshow(data, cmap=mcolors.ListedColormap(["white", "#333333"]), vmin=0, vmax=1)
            ax.legend(handles=[mpatches.Patch(facecolor="#333333", label="True: hidden"),
                               mpatches.Patch(facecolor="white", edgecolor="gray", label="False: visible")],
                      fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2)
        else:
            limits = dict(vmin=0, vmax=1) if title in unit else {}
            image = ax.imshow(data, cmap=cmap, **limits)
            fig.colorbar(image, ax=ax, fraction=0.046)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("key j")
        ax.set_ylabel("query i")
        if annotate and data.size <= 100 and not is_mask:
            for (i, j), value in np.ndenumerate(data):
                ax.text(j, i, f"{value:.2g}", ha="center", va="center", fontsize=7, color="w")
    if suptitle:
        fig.suptitle(suptitle)
    fig.tight_layout()
    return fig


def lines(x, series: dict, *, title="", xlabel="", ylabel="", logx=False, logy=False, ax=None,
          marker="o"):
    """Several named series against the same x."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    for label, y in series.items():
        ax.plot(_numpy(x), _numpy(y), marker=marker, label=label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return _finish(ax, title, xlabel, ylabel, logx, logy)


def _finish(ax, title, xlabel, ylabel, logx, logy):
    """Titles, log axes (x in powers of two), grid and legend of a line plot."""
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    return ax


def bars(values: dict, *, title="", ylabel="", ax=None, logy=False, groups=None):
    """One bar per entry of {label: value}, labelled with its value.

    groups: optional group index per bar (e.g. the block it belongs to), one colour each.
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    labels, heights = list(values), [float(v) for v in values.values()]
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colors = [palette[g % len(palette)] for g in groups] if groups is not None else "tab:blue"
    rects = ax.bar(labels, heights, color=colors)
    ax.bar_label(rects, labels=[f"{h:.3g}" for h in heights], fontsize=8)
    ax.set(title=title, ylabel=ylabel)
    if logy:
        ax.set_yscale("log")
    return ax


def tile_reads_figure(m_tiles=4, n_tiles=5, k_tiles=3, row=1, col=3):
    """Which tiles of A [m, k] and B [k, n] one output tile C[row, col] reads, and when."""
    a = torch.zeros(m_tiles, k_tiles)
    b = torch.zeros(k_tiles, n_tiles)
    c = torch.zeros(m_tiles, n_tiles)
    a[row] = b[:, col] = 1
    c[row, col] = 1
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2),
                             gridspec_kw={"width_ratios": [k_tiles, n_tiles, n_tiles]})
    for ax, grid, title in zip(axes, (a, b, c), ("A: tiles read", "B: tiles read", "C: the output tile")):
        ax.imshow(grid, cmap="Blues", vmin=0, vmax=1.4)
        ax.set_xticks(range(grid.shape[1]))
        ax.set_yticks(range(grid.shape[0]))
        ax.set_title(title, fontsize=10)
    for step in range(k_tiles):
        axes[0].text(step, row, f"k{step}", ha="center", va="center")
        axes[1].text(col, step, f"k{step}", ha="center", va="center")
    axes[2].text(col, row, "acc", ha="center", va="center")
    fig.tight_layout()
    return fig


def memory_hierarchy_figure():
    """The GPU memory hierarchy as boxes: fast and small at the top, large and slow below.

    Figures are approximate, for an H100 SXM (132 SMs).
    """
    from matplotlib.patches import FancyBboxPatch

    fig, ax = plt.subplots(figsize=(9, 5.2))
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 10)
    ax.axis("off")

    def box(x, y, w, h, color, title, lines):
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.05",
                                    facecolor=color, edgecolor="black"))
        ax.text(x + w / 2, y + h - 0.2, title, ha="center", va="top", fontsize=9,
                fontweight="bold")
        ax.text(x + w / 2, y + h - 0.65, "\n".join(lines), ha="center", va="top", fontsize=8)

    # The chip: SMs (each with registers and SRAM), then L2 shared by all SMs.
    ax.add_patch(FancyBboxPatch((0.2, 3.1), 9.6, 6.6, boxstyle="round,pad=0.05",
                                facecolor="none", edgecolor="gray", linestyle="--"))
    ax.text(9.6, 9.55, "GPU chip (die)", fontsize=9, color="gray", va="top", ha="right")
    for i, x in enumerate((0.5, 3.6)):
        ax.add_patch(FancyBboxPatch((x, 5.6), 2.8, 3.7, boxstyle="round,pad=0.05",
                                    facecolor="#f4f4f4", edgecolor="black"))
        ax.text(x + 1.4, 9.2, f"SM {i}  (compute units)", ha="center", va="top", fontsize=9)
        box(x + 0.2, 7.35, 2.4, 1.4, "#c6e5b3", "registers", ["256 KB per SM", "fastest"])
        box(x + 0.2, 5.8, 2.4, 1.4, "#9fd38a", "SRAM (shared mem / L1)",
            ["~228 KB per SM", "~33 TB/s, all SMs together"])
    ax.text(7.6, 7.4, "... 132 SMs", fontsize=11, ha="center")
    box(0.5, 3.4, 9.0, 1.9, "#ffe29a", "L2 cache", ["~50 MB, shared by all SMs",
                                                    "between SRAM and HBM in speed"])
    # Off the chip: HBM stacks, reached through the memory bus.
    box(0.5, 0.2, 9.0, 2.2, "#f6b3a8", "HBM = DRAM (global memory)",
        ["80 GB, off the chip (stacks beside it)", "~3.35 TB/s: about 10x slower than SRAM",
         "holds Q, K, V, O and everything between kernels"])
    ax.annotate("", xy=(5, 2.45), xytext=(5, 3.35), arrowprops=dict(arrowstyle="<->", lw=2))
    ax.text(5.15, 2.9, "every DRAM read/write crosses here", fontsize=8, va="center")
    ax.set_title("GPU memory hierarchy (approximate H100 figures): small and fast at the top")
    fig.tight_layout()
    return fig


def predicted_vs_measured(x, predicted: dict, measured: dict, *, title="", xlabel="", ylabel="",
                          logx=True, logy=True, ax=None):
    """A model against measurements: each entry of predicted {label: y} is a line over x;
    each entry of measured {label: (xs, ys)} is a set of large markers, without a line."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 3.8))
    for label, y in predicted.items():
        ax.plot(_numpy(x), _numpy(y), label=label)
    for label, (xs, ys) in measured.items():
        ax.plot(_numpy(xs), _numpy(ys), linestyle="none", marker="X", markersize=10, label=label)
    return _finish(ax, title, xlabel, ylabel, logx, logy)


def flash_tiles_figure(q_blocks=4, k_blocks=4, program=2, causal=False, ax_title=None):
    """Which tiles of Q, K, V one FlashAttention program (query block `program`) loads,
    and in which order: its Q tile once, then K tile j and V tile j at step j. S and P
    exist one tile at a time; with causal (blocks as tall as they are wide), the tiles
    after the diagonal are skipped and the diagonal tile is masked inside."""
    import matplotlib.colors as mcolors
    import numpy as np

    steps = min(program + 1, k_blocks) if causal else k_blocks
    q = np.zeros((q_blocks, 1))
    kt = np.zeros((1, k_blocks))
    v = np.zeros((k_blocks, 1))
    s = np.zeros((q_blocks, k_blocks))
    o = np.zeros((q_blocks, 1))
    q[program] = o[program] = 1
    kt[0, :steps] = v[:steps, 0] = 1
    s[program, :steps] = 1
    if causal:
        s[program, program + 1:] = -1  # skipped
    cmap = mcolors.ListedColormap(["#d9d9d9", "white", "#9ecae1"])
    fig, axes = plt.subplots(1, 5, figsize=(13, 3.4),
                             gridspec_kw={"width_ratios": [1.2, k_blocks, k_blocks, 1.2, 1.2]})
    panels = [(q, "Q: its tile,\nloaded once"), (kt, "Kᵀ: tile j at step j"),
              (s, "S = Q Kᵀ, P: one tile\nat a time, never stored"), (v, "V: tile j at step j"),
              (o, "O: stored once,\nafter the last step")]
    for ax, (grid, title) in zip(axes, panels):
        ax.imshow(grid, cmap=cmap, vmin=-1.5, vmax=1.5, aspect="auto")
        ax.set_xticks(range(grid.shape[1]))
        ax.set_yticks(range(grid.shape[0]))
        ax.set_xticks(np.arange(-0.5, grid.shape[1]), minor=True)
        ax.set_yticks(np.arange(-0.5, grid.shape[0]), minor=True)
        ax.grid(which="minor", color="gray", linewidth=0.8)
        ax.tick_params(which="minor", length=0)
        ax.set_title(title, fontsize=9)
    for ax in (axes[0], axes[4]):
        ax.set_xticks([])
        ax.set_ylabel("query block")
    axes[3].set_xticks([])
    axes[3].set_ylabel("key block")
    axes[1].set_yticks([])
    axes[1].set_xlabel("key block")
    axes[2].set_xlabel("key block")
    axes[2].set_ylabel("query block")
    for j in range(steps):
        axes[1].text(j, 0, f"step {j}", ha="center", va="center", fontsize=8)
        axes[3].text(0, j, f"{j}", ha="center", va="center", fontsize=8)
        axes[2].text(j, program, "masked" if causal and j == program else f"{j}",
                     ha="center", va="center", fontsize=8)
    if causal:
        for j in range(program + 1, k_blocks):
            axes[2].text(j, program, "skipped", ha="center", va="center", fontsize=7, color="dimgray")
    axes[0].text(0, program, "q", ha="center", va="center")
    axes[4].text(0, program, "acc / l", ha="center", va="center", fontsize=8)
    fig.suptitle(ax_title or f"program {program} of one (batch, head)"
                 + (", causal" if causal else "") + f": {steps} steps", fontsize=10)
    fig.tight_layout()
    return fig


def online_row_figure(history, final, dims=3):
    """One query row through FlashAttention's loop: `history` holds (m, l, acc) after each
    key block (of a single row: B = H = Nq = 1), `final` the row of softmax(s) V. Plots the
    running max, the running sum and the first `dims` entries of acc / l against the final
    output (dashed)."""
    ms = [float(m.flatten()[0]) for m, _, _ in history]
    ls = [float(l.flatten()[0]) for _, l, _ in history]
    outs = torch.stack([(acc.flatten(0, -2)[0] / l.flatten()[0]).double() for _, l, acc in history])
    steps = list(range(1, len(history) + 1))
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.4))
    lines(steps, {"m (running max)": ms}, title="running max after each key block",
          xlabel="key blocks seen", ax=axes[0])
    lines(steps, {"l (running sum)": ls}, title="running sum after each key block",
          xlabel="key blocks seen", ax=axes[1])
    final = _numpy(final.flatten())
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for d in range(min(dims, outs.shape[1])):
        color = palette[d % len(palette)]
        axes[2].plot(steps, _numpy(outs[:, d]), marker="o", color=color, label=f"(acc / l)[{d}]")
        axes[2].axhline(float(final[d]), color=color, linestyle="--", alpha=0.7)
    axes[2].set(title="output so far (dashed: final O)", xlabel="key blocks seen")
    axes[2].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[2].grid(alpha=0.3)
    axes[2].legend(fontsize=8)
    fig.tight_layout()
    return fig


def tflops_figure(seq_lens, tflops: dict, *, title="", ax=None):
    """TFLOPS of each implementation ({name: [TFLOPS per length]}) against the sequence
    length; the name "teaching" (or a name containing "yours") is drawn thicker."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    for name, values in tflops.items():
        mine = name == "teaching" or "yours" in name
        ax.plot(list(seq_lens), [float(v) for v in values], marker="o", label=name,
                linewidth=3 if mine else 1.5, zorder=3 if mine else 2)
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(seq_lens), [str(n) for n in seq_lens])
    ax.set(title=title, xlabel="sequence length N", ylabel="TFLOPS")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return ax


def masks(masks: dict, *, size_per_cell=0.5):
    """Boolean masks side by side, each entry of {title: [n_q, n_k] bool tensor} drawn with
    queries down and keys across: True (hidden) black, False (visible) white, one tick per
    query and key, a thin line around every cell."""
    widths = [max(m.shape[1], 4) for m in masks.values()]  # room for the title
    height = max(m.shape[0] for m in masks.values())
    fig, axes = plt.subplots(1, len(masks), squeeze=False, gridspec_kw={"width_ratios": widths},
                             figsize=(size_per_cell * (sum(widths) + 2 * len(masks)),
                                      size_per_cell * height + 1.2))
    for ax, (title, m) in zip(axes[0], masks.items()):
        data = _numpy(m)
        ax.imshow(data, cmap="Greys", vmin=0, vmax=1)
        rows, cols = data.shape
        ax.set_xticks(range(cols))
        ax.set_yticks(range(rows))
        ax.set_xticks([c - 0.5 for c in range(1, cols)], minor=True)
        ax.set_yticks([r - 0.5 for r in range(1, rows)], minor=True)
        ax.grid(which="minor", color="gray", linewidth=0.5)
        ax.tick_params(which="minor", length=0)
        ax.set_title(title, fontsize=10)
        ax.set(xlabel="key j", ylabel="query i")
    fig.tight_layout()
    return fig


def _program_names(programs):
    """Grid indices as a lesson writes them: (3, 0, 0) -> "program 3" on a 1-D grid,
    (1, 2, 0) -> "program (1, 2)" on a 2-D one."""
    dims = 1 + max((i for p in programs for i, v in enumerate(p) if v), default=0)
    return [f"program {p[0]}" if dims == 1 else f"program {p[:dims]}" for p in programs]


def kernel_accesses(accesses, panels, *, show="program", title=""):
    """What a kernel did, from `course.bounds.recording()`. panels: [(argument name, 2-D
    tensor, "load" or "store")]; each element is coloured by the program that loaded or
    stored it (show="program"; a number when several did) or by how many times it was
    (show="count"). Lanes that fell outside every tensor are counted in the title."""
    import numpy as np
    fig, axes = plt.subplots(1, len(panels), squeeze=False, figsize=(4.2 * len(panels), 3.4))
    programs = sorted({a.program for a in accesses if a.tensor})
    cmap = plt.get_cmap("tab20", max(len(programs), 1))
    for ax, (name, t, verb) in zip(axes[0], panels):
        rows, cols = t.shape
        r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
        where = {int(o): (i, j) for o, i, j in zip(
            (t.storage_offset() + r * t.stride(0) + c * t.stride(1)).ravel(), r.ravel(), c.ravel())}
        owner = np.full((rows, cols), np.nan)
        count = np.zeros((rows, cols), dtype=int)
        for a in accesses:
            if a.verb == verb and a.tensor == name:
                for o in a.offsets.tolist():
                    if o in where:  # not a guard margin around the tensor
                        count[where[o]] += 1
                        owner[where[o]] = programs.index(a.program)
        if show == "count":
            image = ax.imshow(count, cmap="viridis", vmin=0)
            fig.colorbar(image, ax=ax, fraction=0.046, label=f"times {verb}ed")
        else:
            ax.imshow(np.ma.masked_invalid(owner), cmap=cmap, vmin=-0.5, vmax=len(programs) - 0.5)
            for (i, j), n in np.ndenumerate(count):
                if n > 1:
                    ax.text(j, i, n, ha="center", va="center", fontsize=7)
        outside = sum(a.outside for a in accesses if a.verb == verb)
        ax.set_title(f"{name}: {verb}s" + (f"\n{outside} lanes outside every tensor!" if outside else ""),
                     fontsize=10)
        ax.set(xlabel="column", ylabel="row")
    if show != "count" and len(programs) <= 16:
        axes[0][-1].legend(handles=[plt.Rectangle((0, 0), 1, 1, color=cmap(k)) for k in range(len(programs))],
                           labels=_program_names(programs), fontsize=7,
                           loc="upper left", bbox_to_anchor=(1.02, 1), borderaxespad=0)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def program_order_figure(m_tiles=8, n_tiles=8, group=4, wave=16):
    """The launch order of a matmul's output tiles, row by row against grouped, with the
    first `wave` programs (those running at once) shaded, and the A and B tiles that
    wave needs per step along K: tiles shared by programs running together are read from
    DRAM once (they stay in the L2 cache), so fewer distinct tiles means less traffic."""
    import numpy as np

    def grouped(pid):  # `group` row-tiles at a time, down the columns of that band
        band, rest = divmod(pid, group * n_tiles)
        rows = min(group, m_tiles - band * group)
        return band * group + rest % rows, rest // rows

    orders = {"row by row": lambda pid: divmod(pid, n_tiles), f"grouped, {group} rows at a time": grouped}
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.6))
    for ax, (name, where) in zip(axes, orders.items()):
        order = np.zeros((m_tiles, n_tiles), dtype=int)
        for pid in range(m_tiles * n_tiles):
            order[where(pid)] = pid
        first = order < wave
        ax.imshow(first, cmap="Blues", vmin=0, vmax=1.6)
        for (i, j), pid in np.ndenumerate(order):
            ax.text(j, i, pid, ha="center", va="center", fontsize=8)
        a_tiles, b_tiles = len(set(np.nonzero(first)[0])), len(set(np.nonzero(first)[1]))
        ax.set_title(f"{name}\nfirst {wave} programs read {a_tiles} A + {b_tiles} B tiles "
                     f"= {a_tiles + b_tiles} per K step", fontsize=10)
        ax.set(xlabel="column tile of C (B tile)", ylabel="row tile of C (A tile)")
    fig.tight_layout()
    return fig
