"""The figures of the documentation site, drawn from the measurements committed in benchmarks/results/.

    python scripts/docs_figures.py          # writes docs/img/*.png (needs matplotlib)

Nothing is measured here: each figure plots a results file that a benchmark wrote, so the pictures
say what the tables beside them say. Rerun it after a benchmark's results change, and commit the PNGs.
"""
from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
OUT = ROOT / "docs" / "img"
DPI = 100  # small files: the site shows them at about their pixel size


def _load(path: str):
    return json.loads((RESULTS / path).read_text())


def _save(fig, name: str) -> None:
    fig.tight_layout()
    fig.savefig(OUT / name, dpi=DPI)
    plt.close(fig)
    print(f"docs/img/{name}: {(OUT / name).stat().st_size // 1024} KB")


def _mean_std(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / max(len(values) - 1, 1))


def accuracy() -> None:
    """Test MAE against the label-noise level, per method, on the three data sets (Gaussian noise;
    mean and std over the seeds): the rows of docs/measured.md's tables, i.e. the grid of
    benchmarks/results/accuracy/accuracy.json with the reruns under the current defaults in place of
    its rows (current-defaults/, then the sol rows of cuts-default/)."""
    rows = _load("accuracy/accuracy.json")
    for rerun in ("accuracy/current-defaults/accuracy.json", "accuracy/cuts-default/accuracy.json"):
        newer = _load(rerun)
        replaced = {(r["method"], r["data"]) for r in newer}
        rows = [r for r in rows if (r["method"], r["data"]) not in replaced] + newer
    methods = ["sol", "sol-noise-known", "l1", "ce", "corn"]
    datasets = ["abalone", "wine-red", "fashion-mnist-blur"]
    fig, axes = plt.subplots(1, 3, figsize=(10, 3.2))
    for ax, data in zip(axes, datasets):
        for method in methods:
            cells = defaultdict(list)
            for r in rows:
                if r["data"] == data and r["noise"] == "gaussian" and r["method"] == method:
                    cells[r["kappa"]].append(r["mae"])
            if not cells:
                continue
            kappas = sorted(cells)
            stats = [_mean_std(cells[k]) for k in kappas]
            ax.errorbar(kappas, [m for m, _ in stats], yerr=[s for _, s in stats], marker="o", ms=4,
                        capsize=3, label=method, lw=1.5 if method.startswith("sol") else 1,
                        ls="--" if method == "sol-noise-known" else "-")
        ax.set_title(data)
        ax.set_xlabel("label noise κ (Gaussian)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test MAE (lower is better)")
    axes[-1].legend(fontsize=8)
    _save(fig, "accuracy.png")


def speed_and_memory() -> None:
    """Forward + backward of StochasticOrderLoss on an H100, fused kernels against the plain-PyTorch
    reference: time and the extra memory a step adds (benchmarks/results/gpu/h100-bench-checked.json)."""
    rows = _load("gpu/h100-bench-checked.json")
    sizes = [f"B={r['B']}\nn={r['n']}" for r in rows]
    x = range(len(rows))
    for name, key, scale, unit in (("speed.png", "both", 1e3, "ms"), ("memory.png", "memory", 1 / 2**20, "MB")):
        fig, ax = plt.subplots(figsize=(5.5, 3.2))
        fused = [r["fused"][key] * scale for r in rows]
        reference = [r["reference"][key] * scale if r["reference"] else None for r in rows]
        ax.bar([i - 0.2 for i in x], fused, width=0.4, label="fused (sol_ext)")
        ax.bar([i + 0.2 for i in x if reference[i] is not None], [v for v in reference if v is not None],
               width=0.4, label="reference (PyTorch)")
        for i, v in enumerate(reference):
            if v is None:
                ax.text(i + 0.2, fused[i], "reference:\ndoes not\nfit", ha="center", va="bottom", fontsize=8)
        ax.set_yscale("log")
        ax.set_ylim(0.1, max(v for v in fused + reference if v is not None) * 3)
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xticks(list(x), sizes)
        what = "time of forward + backward" if key == "both" else "extra memory of forward + backward"
        ax.set_ylabel(f"{unit} (log scale)")
        ax.set_title(f"{what}, H100, d=512", fontsize=10)
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        _save(fig, name)


def label_issues() -> None:
    """AUROC of finding the wrong labels, ours against cleanlab's, one point per data set, noise and
    seed (benchmarks/results/label_issues/label_issues.json; SOL's out-of-fold probabilities)."""
    rows = _load("label_issues/label_issues.json")
    fig, ax = plt.subplots(figsize=(4.2, 4))
    marks = {"abalone": "o", "wine-red": "s", "many-ranks": "^", "vader": "D"}
    for data, mark in marks.items():
        points = [(r["sol"]["cleanlab"]["auroc"], r["sol"]["sol_ext"]["auroc"]) for r in rows
                  if r["data"] == data and "sol" in r and not math.isnan(r["sol"]["sol_ext"]["auroc"])]
        if points:
            ax.scatter(*zip(*points), marker=mark, s=22, label=data, alpha=0.8)
    ax.plot([0.4, 1.0], [0.4, 1.0], color="grey", lw=1, ls="--")
    ax.set_xlim(0.4, 1.0)
    ax.set_ylim(0.4, 1.0)
    ax.set_xlabel("AUROC, cleanlab (self-confidence)")
    ax.set_ylabel("AUROC, sol_ext (ordinal score)")
    ax.set_title("ranking the wrong labels first\n(above the line: ours is better)", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    _save(fig, "label-issues.png")


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    accuracy()
    speed_and_memory()
    label_issues()
