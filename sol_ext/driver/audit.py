"""Audit of a trained run's training labels: which ones look wrong, and what they should be.

By default every training row is judged out of sample: the run's settings are trained ``folds``
times, each without one fold, and each row's ``p(q | x)`` comes from the model that did not see it
(:func:`cross_validated_probabilities`). Scores, flags and suggested labels are those of
:func:`sol_ext.find_label_issues` on these probabilities, so the two agree row for row.

``folds=None`` reads the run's selected model only (``best.pt``, else ``checkpoint.pt``), in sample:
the suggestions of the run's own relabeling rule, the posterior rule (every training row, validation
split included, judged from its given label) or the paper's outlier rule (docs/math.md §8), applied
once more to the current labels. A model judges the labels it fitted too kindly, so this finds few.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from ..label_issues import DEFAULT_MIN_SCORE, find_label_issues, label_issue_scores, sharpen_through_noise
from ..readout import median_ranks
from ..refine import label_noise_kernel, refine_labels
from .checkpoint import atomic_write_text, load_run_state, run_paths
from .config import TrainConfig
from .loader import RunInputs, embedding_batch_size
from .methods import head_probabilities
from .model import TrainedModel, load_run
from .prepare import PreparedData, prepare_data
from .train import check_run, fit_run

__all__ = ["AuditReport", "audit_run", "write_audit", "AUDIT_COLUMNS", "DEFAULT_FOLDS",
           "OutOfSample", "cross_validated_probabilities", "fold_of_rows", "audit_command"]

# Folds of `sol-ext audit`: benchmarks/bench_label_issues.py found 3 and 5 folds equal within their
# spread over seeds in AUROC and flags on abalone, wine-red and VADER; 3 cost 1.6-2.7 times one run's
# time at torch's default thread count, 5 cost 3.2-5.0 times.
DEFAULT_FOLDS = 3

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
    # out of sample: [N, n] p(q | x) of the rows in file order, what find_label_issues was given (with a
    # known noise, sharpened through its kernel)
    probabilities: torch.Tensor | None = None
    note: str | None = None           # a last line of the summary: what the rule cannot see

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
        if self.note:
            lines.append(self.note)
        return "\n".join(lines)

    def to_csv(self) -> str:
        # the id column, where the run has one, follows "index" (as in the rows)
        cols = list(self.rows[0]) if self.rows else list(AUDIT_COLUMNS)
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.rows)
        return buf.getvalue()


def _fmt(x: float) -> str:
    return f"{x:.10g}"


def audit_run(run_dir: Path, folds: int | None = DEFAULT_FOLDS, log: Callable[[str], None] = print,
              label_noise: float | None = None) -> AuditReport:
    """Build the audit of the run in ``run_dir`` (a ``sol-ext train`` output folder): out of sample
    with ``folds`` folds (:func:`cross_validated_probabilities`; the data are read again from the
    run's configuration), or in sample from the run's own model with ``folds=None``.

    Out of sample, the flags are :func:`sol_ext.find_label_issues`' defaults on the fold models'
    ``p(q | x)``: labels in a tail of ``p`` holding at most 0.25 %, few flags and few right labels
    among them, since these probabilities cannot tell labels the features predict loosely from noisy
    ones. With a known label-noise std (``label_noise`` in ranks, else the run's ``--label-noise``
    when it is a number) they are its posterior rule through that noise kernel, on the fold models'
    probabilities sharpened through it (:func:`sol_ext.label_issues.sharpen_through_noise`), which
    flags many more.

    Columns (label units): ``index`` (row of the sample in the data file), ``given_label`` (the label the
    run started from), ``current_label`` (after the run's relabeling), ``predicted_label``,
    ``deviation`` (current - predicted), ``outlier`` (0/1: the label looks wrong by the run's rule),
    ``score`` (how wrong it looks, in [0, 1]: for the posterior rule the posterior mass on one side
    of the label, as :func:`sol_ext.find_label_issues` scores; for the outlier rule ``|dev|`` over
    the largest ``|dev|`` of the label's group), ``suggested_label`` (the rule's label for flagged
    samples, the current label otherwise), and ``clean_label`` when the clean labels are known; the
    run's id column (``--id-column``) after ``index``; out of sample, ``p_<value>`` for each label
    value: the row's probabilities from the model that did not train on it (what cleanlab's
    ``pred_probs`` are). Rows are sorted by score, suspects first.
    """
    if label_noise is not None and (isinstance(label_noise, bool) or not isinstance(label_noise, (int, float))
                                    or not label_noise >= 0 or label_noise == float("inf")):
        raise ValueError(f"label_noise must be a finite std in ranks >= 0, got {label_noise!r}")
    if label_noise is not None and folds is None:
        raise ValueError("label_noise applies to the out-of-sample audit (folds); the in-sample audit "
                         "follows the run's own rule")
    run = _AuditedRun.read(Path(run_dir))
    if folds is not None:
        judged = _judge_out_of_sample(run, folds, label_noise, log)
    elif run.state.get("audit") is not None:
        judged = _judge_by_posterior(run)
    else:
        judged = _judge_by_outliers(run)
    if folds is None and not bool((judged.score > 0).any()):
        judged.note = ("In sample every score is 0: the run's model agrees with each label it was trained "
                       "on, so nothing is ranked; the out-of-sample audit (without --in-sample) ranks "
                       "the labels.")
    return _report(run, judged)


@dataclass
class _AuditedRun:
    """The run an audit reads: its saved state, its configuration (data and encoder weights read
    again from where the run read them) and its label scale (``n`` ranks from ``lo`` by ``step``)."""

    run_dir: Path
    state: dict[str, Any]
    config: TrainConfig
    n: int
    lo: float
    step: float

    @classmethod
    def read(cls, run_dir: Path) -> "_AuditedRun":
        state = load_run_state(run_dir)
        located = run_paths(state["config"], (state.get("predictor") or {}).get("read_from"))
        config = dataclasses.replace(TrainConfig.from_dict(state["config"]), **located)
        fp = state["fingerprint"]
        return cls(run_dir, state, config, int(fp["num_ranks"]), float(fp["min_value"]), float(fp["step"]))

    def value(self, ranks: torch.Tensor) -> list[str]:
        """Ranks as label values, as the CSV writes them."""
        return [_fmt(self.lo + self.step * int(v)) for v in ranks]


@dataclass
class _Judgement:
    """What one way of auditing says about every training row (ranks; rows in the data file)."""

    given: torch.Tensor
    current: torch.Tensor
    pred: torch.Tensor
    suggested: torch.Tensor
    flagged: torch.Tensor
    score: torch.Tensor
    clean: torch.Tensor | None
    rows_in_file: torch.Tensor | None
    rule: str
    changed: int | None = None  # labels the run changed while training (the outlier rule)
    note: str | None = None
    data: PreparedData | None = None  # the data read again (out of sample)
    out_of_sample: torch.Tensor | None = None  # [N, n] the fold models' p(q | x)
    probabilities: torch.Tensor | None = None  # what find_label_issues was given


def _judge_out_of_sample(run: _AuditedRun, folds: int, label_noise: float | None,
                        log: Callable[[str], None]) -> _Judgement:
    """Every training row judged by the fold model that did not train on it
    (:func:`cross_validated_probabilities`), flagged by :func:`sol_ext.find_label_issues`."""
    config, state = run.config, run.state
    data = prepare_data(config)
    if data.fingerprint() != state["fingerprint"]:
        raise ValueError(f"the data of {run.run_dir} ({config.data}) have changed since the run; the "
                         f"out-of-sample audit retrains on them: pass --in-sample, or train again")
    sigma = (state.get("sigma_choice") or {}).get("sigma")
    fold_config = dataclasses.replace(config, sigma=sigma) \
        if config.sigma == "auto" and sigma is not None else config
    oos = cross_validated_probabilities(fold_config, data, folds, log=log)
    given = data.train_given.long()
    probabilities = oos.probabilities
    if label_noise is None and config.label_noise != "auto":
        label_noise = float(config.label_noise)
    kernel = None if label_noise is None else label_noise_kernel(run.n, float(label_noise))
    if kernel is not None:  # the true rank's p(q | x), not the noisy label's
        probabilities = torch.from_numpy(sharpen_through_noise(given, probabilities, kernel))
    flagged = torch.from_numpy(find_label_issues(given, probabilities, noise_kernel=kernel))
    # the corrected label: the median of the same posterior the flag was read from
    post = probabilities if kernel is None else probabilities * kernel[:, given].T
    rule = (f"out of sample, {folds} folds in {oos.seconds:.0f} s; "
            + (f"labels in a tail of p(rank | x): one-sided mass >= {DEFAULT_MIN_SCORE:g}"
               if kernel is None else f"posterior median, label noise std {float(label_noise):g} ranks"))
    note = None if kernel is not None else (
        "Only labels beyond the model's own uncertainty are flagged: to any model, labels the features "
        "predict loosely look like noisy ones. If you know the std of the label noise, --label-noise STD "
        "flags by it.")
    return _Judgement(
        given=given, current=given, pred=median_ranks(probabilities),
        suggested=torch.where(flagged, median_ranks(post / post.sum(dim=1, keepdim=True)), given),
        flagged=flagged, score=torch.from_numpy(label_issue_scores(given, probabilities, kernel)),
        clean=data.train_clean, rows_in_file=data.train_rows, rule=rule, note=note, data=data,
        out_of_sample=oos.probabilities, probabilities=probabilities)


def _judge_by_posterior(run: _AuditedRun) -> _Judgement:
    """In sample, the run's posterior rule: every training row, judged from its given label."""
    audit, config = run.state["audit"], run.config
    given, suggested = audit["given"].long(), audit["suggested"].long()
    rule = (f"in sample: posterior mass >= {config.relabel_mass:g} on one side of the label, label "
            f"noise std estimated: {float(run.state.get('label_noise_std', 0.0)):.2f} ranks"
            if config.label_noise == "auto" else
            f"in sample: posterior median, label noise std {float(config.label_noise):g} ranks")
    # the score: the posterior mass on the far side of the label (sol_ext.find_label_issues')
    return _Judgement(given=given, current=given, pred=audit["predicted"].long(), suggested=suggested,
                      flagged=suggested != given, score=audit["confidence"].double(),
                      clean=audit["clean"], rows_in_file=audit["rows"], rule=rule)


def _judge_by_outliers(run: _AuditedRun) -> _Judgement:
    """In sample, the paper's outlier rule on the current labels of the fitted rows."""
    state, config = run.state, run.config
    given, current = state["given_labels"].long(), state["labels"].long()
    pred = state["train_pred"].long()
    ref = refine_labels(current, pred, run.n, config.beta, floor_step=config.convention == "official")
    return _Judgement(given=given, current=current, pred=pred, suggested=ref.labels,
                      flagged=ref.outliers, score=_outlier_scores(ref.deviation, current, run.n),
                      clean=state["clean_labels"], rows_in_file=state.get("train_rows"),
                      rule=f"in sample: outliers at beta={config.beta:g}",
                      changed=int((current != given).sum()))


def _report(run: _AuditedRun, judged: _Judgement) -> AuditReport:
    """The audit's rows (suspects first) and the counts of its summary."""
    j, config = judged, run.config
    index = range(j.current.numel()) if j.rows_in_file is None else j.rows_in_file.tolist()
    cols = {"index": [str(i) for i in index]}
    if config.id_column is not None:  # the rows by their ids too, read again from the data
        row_ids = (j.data or prepare_data(config)).row_ids
        cols[config.id_column] = [row_ids[i] for i in index]
    cols.update({"given_label": run.value(j.given), "current_label": run.value(j.current),
                 "predicted_label": run.value(j.pred),
                 "deviation": [_fmt(run.step * int(d)) for d in j.current - j.pred],
                 "outlier": [str(int(f)) for f in j.flagged],
                 "score": [f"{float(v):.6f}" for v in j.score],
                 "suggested_label": run.value(j.suggested)})
    if j.clean is not None:
        cols["clean_label"] = run.value(j.clean.long())
    if j.out_of_sample is not None:  # each row's out-of-sample p(label value | x), e.g. for cleanlab
        for q in range(run.n):
            cols[f"p_{_fmt(run.lo + run.step * q)}"] = [f"{float(p):.6g}" for p in j.out_of_sample[:, q]]
    rows = [dict(zip(cols, vals)) for vals in zip(*cols.values())]
    # suspects first: by score, the flagged ones before the rest on a tie, then in file order
    order = sorted(range(len(rows)), key=lambda i: (-float(j.score[i]), not bool(j.flagged[i]), i))
    truly = wrong = None
    if j.clean is not None:
        wrong_mask = j.current != j.clean.long()
        wrong, truly = int(wrong_mask.sum()), int((wrong_mask & j.flagged).sum())
    return AuditReport(rows=[rows[i] for i in order], num_samples=j.current.numel(),
                       num_outliers=int(j.flagged.sum()), num_changed_in_training=j.changed,
                       rule=j.rule, clean_known=j.clean is not None, outliers_truly_wrong=truly,
                       wrong_total=wrong, probabilities=j.probabilities, note=j.note)


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


# -- out-of-sample probabilities ------------------------------------------------------------------


@dataclass
class OutOfSample:
    """``p(q | x)`` of every training row from a model that did not train on it.

    Attributes:
        probabilities: ``[N, n]`` float64, row ``i`` from the model of the folds without row ``i``.
        fold: ``[N]`` int64 fold of each row (``0 … folds-1``).
        seconds: wall time of the ``folds`` trainings.
    """

    probabilities: torch.Tensor
    fold: torch.Tensor
    seconds: float


def fold_of_rows(labels: torch.Tensor, folds: int, seed: int) -> torch.Tensor:
    """``[N]`` fold of each row, stratified by label: each rank's rows, shuffled with ``seed``, are
    dealt to the folds in turn (so every fold sees every rank that has ``folds`` rows or more)."""
    labels = labels.long().cpu()
    gen = torch.Generator().manual_seed(int(seed))
    shuffled = torch.randperm(labels.numel(), generator=gen)
    order = shuffled[torch.sort(labels[shuffled], stable=True).indices]
    fold = torch.empty(labels.numel(), dtype=torch.int64)
    fold[order] = torch.arange(labels.numel()) % folds
    return fold


def cross_validated_probabilities(config: TrainConfig, data: PreparedData, folds: int = DEFAULT_FOLDS,
                                  log: Callable[[str], None] = print) -> OutOfSample:
    """Train ``config`` ``folds`` times, each time without one fold of ``data``'s training rows, and
    read every row's ``p(q | x)`` from the model that did not see it (cleanlab's ``cv_n_folds``).

    A model judges the labels it trained on too kindly: it has fitted their noise. Each fold's run
    has the settings of ``config`` (its own validation split, epochs, read-out fitted on its own
    rows); ``sigma="auto"`` would search sigma in every fold, so pass the run's pick. Costs about
    ``folds - 1`` runs of ``data`` (each trains on ``(folds - 1) / folds`` of it).
    """
    if isinstance(folds, bool) or not isinstance(folds, int) or folds < 2:
        raise ValueError(f"folds must be an integer >= 2 (each row is judged by a model trained on the "
                         f"other folds), got {folds!r}")
    given = data.train_given.long()
    if given.numel() < 2 * folds:
        raise ValueError(f"folds={folds} needs at least {2 * folds} training rows, got {given.numel()}")
    config.validate()  # once: every fold trains with these settings
    started = time.perf_counter()
    fold = fold_of_rows(given, folds, config.seed)
    probabilities = torch.zeros(given.numel(), data.num_ranks, dtype=torch.float64)
    # the fold runs read inputs already scaled by the whole run's scaling
    preprocessing = None if data.preprocessing is None else {**data.preprocessing, "scaling": None}
    for k in range(folds):
        keep, held = torch.nonzero(fold != k)[:, 0], torch.nonzero(fold == k)[:, 0]
        part = dataclasses.replace(
            data, train_x=data.train_x[keep], train_given=given[keep],
            train_clean=None if data.train_clean is None else data.train_clean[keep],
            test_x=data.train_x[held], test_ranks=given[held],
            train_rows=None if data.train_rows is None else data.train_rows[keep],
            preprocessing=preprocessing)
        with tempfile.TemporaryDirectory(prefix="sol-ext-audit-") as tmp:
            run = check_run(config, part, Path(tmp), False, log=lambda _line: None)
            fit_run(run)
            model = load_run(tmp, device=run.context.device)
            probabilities[held] = _probabilities(model, data.train_x[held])
        log(f"fold {k + 1}/{folds}: trained on {keep.numel()} rows, judged {held.numel()} "
            f"({time.perf_counter() - started:.0f} s)")
    return OutOfSample(probabilities=probabilities, fold=fold, seconds=time.perf_counter() - started)


@torch.no_grad()
def _probabilities(model: TrainedModel, x: torch.Tensor) -> torch.Tensor:
    """``[M, n]`` float64 ``p(q | x)`` of inputs already in the model's scaling."""
    h = RunInputs(x, model.device, workers=model.workers).embed(
        model.model, embedding_batch_size(model.kind, model.config.batch_size))
    if model.head is not None:
        p = model.head.probabilities(model.head.dissimilarity(h))
    else:
        p = head_probabilities(model.method, model.model, h, model.num_ranks)
    p = p.detach().to("cpu", torch.float64)
    return p / p.sum(dim=1, keepdim=True)


def audit_command(args) -> int:
    """``sol-ext audit``: the audit of the run in ``args.run_dir`` as CSV (a file or stdout) and
    its summary."""
    import sys

    from .checkpoint import run_data
    from .errors import UsageError
    from .outputs import check_output

    to_stdout = args.csv == "-"
    default = args.run_dir / "audit.csv"  # a rerun replaces it
    path = None if to_stdout else check_output(
        str(default) if args.csv is None else args.csv, "--csv", inputs=run_data(args.run_dir),
        replaceable=[default], overwrite=args.overwrite)
    if args.in_sample and args.folds is not None:
        raise UsageError("--folds and --in-sample exclude each other: --folds K judges out of "
                         "sample, --in-sample by the run's own model")
    if args.folds is not None and args.folds < 2:
        raise UsageError(f"--folds must be >= 2 (each row is judged by a model trained on the other "
                         f"folds), got {args.folds}")
    if args.label_noise is not None and (args.in_sample or not 0 <= args.label_noise < float("inf")):
        raise UsageError(f"--label-noise {args.label_noise:g}: expected a std in ranks >= 0, for the "
                         f"out-of-sample audit (not with --in-sample)")
    folds = None if args.in_sample else DEFAULT_FOLDS if args.folds is None else args.folds
    from .options import check_threads, set_threads

    check_threads(args.threads)
    if folds is not None:  # the fold trainings get train's threads (the MLP's: 1, many times faster)
        from .checkpoint import load_run_state

        state = load_run_state(args.run_dir)
        set_threads(args.threads, TrainConfig.from_dict(state["config"]),
                    (state.get("predictor") or {}).get("kind", "tabular"))
    report = audit_run(args.run_dir, folds=folds, label_noise=args.label_noise,
                       log=(lambda line: print(line, file=sys.stderr)) if to_stdout else print)
    if to_stdout:
        sys.stdout.write(report.to_csv())
        print(report.summary(), file=sys.stderr)
        return 0
    write_audit(report, path)
    print(report.summary())
    print(f"per-sample audit: {path}")
    return 0
