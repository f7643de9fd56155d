"""`--plot`: a PNG bar chart of a benchmark's rates, with the roofline as a dashed line."""
from __future__ import annotations

from typing import Any


def require_matplotlib() -> Any:
    """pyplot (Agg backend), or a clear error naming the extra that installs it."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("--plot needs matplotlib, which is not installed: pip install 'deepinfer[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_chart(path: str, title: str, bars: list[tuple[str, float]], unit: str,
                ceiling: float | None = None, ceiling_label: str = "roofline") -> None:
    plt = require_matplotlib()
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    names = [n for n, _ in bars]
    values = [v for _, v in bars]
    drawn = ax.bar(names, values, color=["#2a6f97", "#a9a9a9", "#6a994e", "#bc4749"][:len(bars)])
    ax.bar_label(drawn, labels=[f"{v:,.0f}" for v in values])
    if ceiling is not None:
        ax.axhline(ceiling, color="#bc4749", linestyle="--", linewidth=1)
        ax.text(len(bars) - 0.5, ceiling, f"{ceiling_label}: {ceiling:,.0f}", ha="right", va="bottom", fontsize=8)
        for name, v in bars[:1]:
            ax.set_xlabel(f"{name}: {100 * v / ceiling:.1f}% of the roofline")
    ax.set_ylabel(unit)
    ax.set_title(title, fontsize=10)
    top = max(values + ([ceiling] if ceiling else []))
    ax.set_ylim(0, top * 1.15)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
