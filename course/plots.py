"""Pictures the lessons show: heatmaps, lines and bars, in one consistent style."""
import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator
import torch


def _numpy(t):
    return t.detach().to("cpu", torch.float32).numpy() if isinstance(t, torch.Tensor) else t


def heatmaps(matrices: dict, *, cmap="viridis", annotate=False, figsize_per=3.2, suptitle=None):
    """One heatmap per entry of {title: 2-D tensor}, side by side. -inf shows as white."""
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
