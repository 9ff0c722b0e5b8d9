"""Pictures the lessons show: heatmaps, lines and bars, in one consistent style."""
import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator
import torch


def _numpy(t):
    return t.detach().to("cpu", torch.float32).numpy() if isinstance(t, torch.Tensor) else t


def heatmaps(matrices: dict, *, cmap="viridis", annotate=False, figsize_per=3.2, suptitle=None):
    """One heatmap per entry of {title: 2-D tensor} (queries down, keys across), side by
    side. -inf shows as white."""
    fig, axes = plt.subplots(1, len(matrices), figsize=(figsize_per * len(matrices), figsize_per),
                             squeeze=False)
    for ax, (title, m) in zip(axes[0], matrices.items()):
        data = _numpy(m)
        image = ax.imshow(data, cmap=cmap)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("key j")
        ax.set_ylabel("query i")
        if annotate and data.size <= 100:
            for (i, j), value in __import__("numpy").ndenumerate(data):
                ax.text(j, i, f"{value:.2g}", ha="center", va="center", fontsize=7, color="w")
        fig.colorbar(image, ax=ax, fraction=0.046)
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
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
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
