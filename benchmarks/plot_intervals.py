"""The figure of bench_intervals' results: coverage held against coverage requested, per data cell, score
and target, drawn from the stored results (no rerun).

    python benchmarks/plot_intervals.py        # benchmarks/results/intervals/intervals.json -> docs/img/intervals.png

Each cell has two panels. The upper one: how often the intervals calibrated on the noisy labels
(target ``labels``) held the noisy label, for the three scores of :mod:`sol_ext.intervals` and the class
sets (LAC, APS) made contiguous. The lower one: how often the intervals held the clean rank, for the
``labels`` target and the two readings of the ``clean`` target (the default fitted deconvolution, and
``deconvolve=False``), per score. The diagonal is the requested coverage; the error bars are the standard
deviation over seeds. Needs matplotlib.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "intervals" / "intervals.json"
FIGURE = ROOT / "docs" / "img" / "intervals.png"

SCORES = ("hpd", "cumulative", "absolute")
CLASS_SETS = ("lac", "aps")
# the results' target names, and how the figure names them
CLEAN_TARGETS = {"labels": "labels", "clean": "clean (default)",
                 "clean, deconvolve=False": "clean, deconvolve=False"}
CELLS_PER_ROW = 5
MARKERS = {"hpd": "o", "cumulative": "s", "absolute": "^", "lac": "v", "aps": "D"}


def series(summary: list[dict], cell: str, method: str, target: str, held: str) -> tuple[list, list, list]:
    """``(requested, held, std)`` of one cell, method and target, in requested order; ``held``:
    ``"noisy"`` or ``"clean"``."""
    rows = sorted((r for r in summary if r["cell"] == cell and r["method"] == method and r["target"] == target),
                  key=lambda r: r["coverage"])
    return ([r["coverage"] for r in rows], [r[f"{held}_coverage"] for r in rows],
            [r[f"{held}_coverage_std"] for r in rows])


def figure(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    summary, cells = results["summary"], results["cells"]
    requested = sorted({r["coverage"] for r in summary})
    # cells in blocks of CELLS_PER_ROW columns, each block two rows: the noisy label above the clean rank
    blocks = -(-len(cells) // CELLS_PER_ROW)
    columns = min(len(cells), CELLS_PER_ROW)
    fig, grid = plt.subplots(2 * blocks, columns, figsize=(3.2 * columns, 3.2 * 2 * blocks), sharex=True,
                             squeeze=False)
    axes = [[grid[2 * (j // columns) + row][j % columns] for j in range(len(cells))] for row in (0, 1)]
    for j in range(len(cells), blocks * columns):  # the last block's empty places
        grid[-2][j % columns].axis("off")
        grid[-1][j % columns].axis("off")
    lows = [requested[0] - 0.05, requested[-1] + 0.05]
    for j, cell in enumerate(cells):
        top, bottom = axes[0][j], axes[1][j]
        for k, method in enumerate(SCORES + CLASS_SETS):
            x, y, e = series(summary, cell, method, "labels", "noisy")
            if x:
                top.errorbar([v + 0.004 * (k - 2) for v in x], y, yerr=e, marker=MARKERS[method], capsize=2,
                             label=method)
        for t, (target, name) in enumerate(CLEAN_TARGETS.items()):
            for k, method in enumerate(SCORES):
                x, y, e = series(summary, cell, method, target, "clean")
                if x and not all(v != v for v in y):  # a cell without clean ranks has NaN
                    bottom.errorbar([v + 0.004 * (3 * t + k - 4) for v in x], y, yerr=e, marker=MARKERS[method],
                                    color=f"C{t}", capsize=2, linestyle="-" if k == 0 else ":",
                                    label=f"{name}, {method}")
        for ax in (top, bottom):
            ax.plot(lows, lows, color="grey", linewidth=0.8, linestyle="--")
            ax.set_xticks(requested, [f"{v:.0%}" for v in requested])
            ax.grid(alpha=0.3)
        top.set_title(cell)
        bottom.set_xlabel("requested coverage")
        if j % columns == 0:
            top.set_ylabel("noisy label held (target labels)")
            bottom.set_ylabel("clean rank held")
    # the first cell has every method and target: its lines name them all, in an empty place if there is one
    for row, size in ((0, 7), (1, 6)):
        lines = axes[row][0].get_legend_handles_labels()
        if len(cells) < blocks * columns:
            grid[row - 2][-1].legend(*lines, fontsize=size + 1, loc="center")
        else:
            axes[row][-1].legend(*lines, fontsize=size, loc="lower right")
    fig.suptitle(f"Rank intervals: coverage held vs requested ({results['seeds']} seeds, label noise "
                 f"kappa = {results['kappa']:g}; dashed: held = requested)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    from io import BytesIO

    from PIL import Image  # matplotlib's own dependency

    drawn = BytesIO()
    fig.savefig(drawn, format="png", dpi=100)
    # 64 colours are the figure's own; the site keeps each figure under 150 kB
    Image.open(drawn).convert("RGB").quantize(64).save(path, optimize=True)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help=f"bench_intervals' json (default {RESULTS})")
    parser.add_argument("--output", type=Path, default=FIGURE, help=f"the PNG (default {FIGURE})")
    args = parser.parse_args(argv)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("matplotlib is not installed: no figure (pip install matplotlib)")
        return 1
    figure(json.loads(args.results.read_text()), args.output)
    print(f"figure -> {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
