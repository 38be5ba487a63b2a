"""Audit of a trained run's training labels: which ones look wrong, and what they should be.

Reads only the run's selected model (``best.pt``, else ``checkpoint.pt``): given, current and
(when known) clean labels, and the predictions of every training sample. The suggestions follow
the run's own relabeling rule: the posterior rule (the default; every training row, validation
split included, judged from its given label) or the paper's outlier rule (docs/math.md §8), applied once
more to the current labels.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..refine import refine_labels
from .checkpoint import atomic_write_text, load_run_state
from .config import TrainConfig

__all__ = ["AuditReport", "audit_run", "write_audit", "AUDIT_COLUMNS"]

AUDIT_COLUMNS = ("index", "given_label", "current_label", "predicted_label", "deviation",
                 "outlier", "score", "suggested_label")


@dataclass
class AuditReport:
    """Per-sample audit rows and the counts of the printed summary."""

    rows: list[dict[str, Any]]
    num_samples: int
    num_outliers: int
    num_changed_in_training: int | None  # None: the rule never changes the labels trained on
    rule: str                          # how labels were judged: the run's relabeling rule
    clean_known: bool
    outliers_truly_wrong: int | None  # flagged samples whose current label differs from clean
    wrong_total: int | None           # current labels that differ from clean

    def summary(self) -> str:
        n = self.num_samples
        lines = [f"{self.num_outliers} of {n} training labels ({100.0 * self.num_outliers / n:.1f}%) "
                 f"look wrong ({self.rule}); "
                 + ("the model was trained on the given labels."
                    if self.num_changed_in_training is None else
                    f"{self.num_changed_in_training} labels were already changed during training.")]
        if self.clean_known and self.wrong_total is not None:
            lines.append(f"Against the clean labels: {self.wrong_total} current labels are wrong; "
                         f"{self.outliers_truly_wrong} of the {self.num_outliers} flagged ones are.")
        return "\n".join(lines)

    def to_csv(self) -> str:
        cols = list(AUDIT_COLUMNS) + (["clean_label"] if self.clean_known else [])
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.rows)
        return buf.getvalue()


def _fmt(x: float) -> str:
    return f"{x:.10g}"


def audit_run(run_dir: Path) -> AuditReport:
    """Build the audit of the run in ``run_dir`` (a ``sol-ext train`` output folder).

    Columns (label units): ``index`` (row of the sample in the data file), ``given_label`` (the label the
    run started from), ``current_label`` (after the run's relabeling), ``predicted_label``,
    ``deviation`` (current - predicted), ``outlier`` (0/1: the label looks wrong by the run's rule),
    ``score`` (how wrong it looks, in [0, 1]: for the posterior rule the posterior mass on one side
    of the label, as :func:`sol_ext.find_label_issues` scores; for the outlier rule ``|dev|`` over
    the largest ``|dev|`` of the label's group), ``suggested_label`` (the rule's label for flagged
    samples, the current label otherwise), and ``clean_label`` when the clean labels are known.
    Rows are sorted by score, suspects first.
    """
    run_dir = Path(run_dir)
    state = load_run_state(run_dir)
    config = TrainConfig.from_dict(state["config"])
    fp = state["fingerprint"]
    n, lo, step = int(fp["num_ranks"]), float(fp["min_value"]), float(fp["step"])
    audit = state.get("audit")
    if audit is not None:  # posterior rule: every training row, judged from its given label
        given = current = audit["given"].long()
        pred, clean, rows_in_file = audit["predicted"].long(), audit["clean"], audit["rows"]
        suggested = audit["suggested"].long()
        flagged = suggested != given
        # the posterior mass on the far side of the label (sol_ext.find_label_issues' score)
        score = audit["confidence"].double()
        rule = (f"posterior mass >= {config.relabel_mass:g} on one side of the label, label "
                f"noise std estimated: {float(state.get('label_noise_std', 0.0)):.2f} ranks"
                if config.label_noise == "auto" else
                f"posterior median, label noise std {float(config.label_noise):g} ranks")
        changed = None
    else:                  # the paper's outlier rule on the current labels of the fitted rows
        given, current = state["given_labels"].long(), state["labels"].long()
        pred, clean, rows_in_file = state["train_pred"].long(), state["clean_labels"], state.get("train_rows")
        ref = refine_labels(current, pred, n, config.beta,
                            floor_step=config.convention == "official")
        suggested, flagged = ref.labels, ref.outliers
        score = _outlier_scores(ref.deviation, current, n)
        rule = f"outliers at beta={config.beta:g}"
        changed = int((current != given).sum())

    def value(r: torch.Tensor) -> list[str]:
        return [_fmt(lo + step * int(v)) for v in r]

    index = range(current.numel()) if rows_in_file is None else rows_in_file.tolist()
    cols = {"index": [str(i) for i in index],
            "given_label": value(given), "current_label": value(current),
            "predicted_label": value(pred),
            "deviation": [_fmt(step * int(d)) for d in current - pred],
            "outlier": [str(int(f)) for f in flagged],
            "score": [f"{float(v):.6f}" for v in score],
            "suggested_label": value(suggested)}
    if clean is not None:
        cols["clean_label"] = value(clean.long())
    rows = [dict(zip(cols, vals)) for vals in zip(*cols.values())]
    # suspects first: by score, the flagged ones before the rest on a tie, then in file order
    order = sorted(range(len(rows)), key=lambda i: (-float(score[i]), not bool(flagged[i]), i))
    rows = [rows[i] for i in order]
    truly = wrong = None
    if clean is not None:
        wrong_mask = current != clean.long()
        wrong, truly = int(wrong_mask.sum()), int((wrong_mask & flagged).sum())
    return AuditReport(rows=rows, num_samples=current.numel(), num_outliers=int(flagged.sum()),
                       num_changed_in_training=changed, rule=rule,
                       clean_known=clean is not None, outliers_truly_wrong=truly,
                       wrong_total=wrong)


def _outlier_scores(deviation: torch.Tensor, labels: torch.Tensor, num_ranks: int) -> torch.Tensor:
    """The paper's outlier score: ``|dev|`` over the largest ``|dev|`` of the sample's label group
    (0 where that is 0); the rule flags a sample where it reaches beta (docs/math.md §8)."""
    dev = deviation.abs().double()
    largest = torch.zeros(num_ranks, dtype=torch.float64).scatter_reduce(
        0, labels.long(), dev, reduce="amax", include_self=True)[labels.long()]
    return torch.where(largest > 0, dev / largest.clamp_min(1e-300), torch.zeros_like(dev))


def write_audit(report: AuditReport, path: Path) -> None:
    """Write the audit CSV atomically."""
    atomic_write_text(path, report.to_csv())
