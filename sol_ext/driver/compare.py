"""SOL against the baselines under several label-noise settings, as a markdown table.

Every (noise setting, method, seed) is one ordinary training run with the same encoder,
epochs and batch size; the table gives mean ± std over seeds of the test MAE and CS.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .checkpoint import atomic_write_text
from .config import COMPARE_METHODS, METHODS, PAPER_SETTINGS, TrainConfig
from .device import resolve_device
from .prepare import prepare_data
from .synthetic_noise import NOISE_TYPES, noise_key
from .train import check_run, fit_run

__all__ = ["DEFAULT_SETTINGS", "COMPARE_METHODS", "default_methods", "method_config",
           "noise_settings", "Comparison", "check_comparison", "run_comparison", "train_comparison", "markdown_tables",
           "mean_std", "mean_std_table",
           "write_comparison", "compare_command"]


def default_methods() -> list[str]:
    """Every method but ``sol-paper``; ``corn`` only where coral-pytorch is installed."""
    try:
        import coral_pytorch  # noqa: F401
        has_coral = True
    except ImportError:
        has_coral = False
    return [m for m in METHODS if m != "corn" or has_coral]


def method_config(base: TrainConfig, method: str) -> TrainConfig:
    """``base`` for one row of a comparison (``sol-paper``: sol with :data:`PAPER_SETTINGS`)."""
    if method == "sol-paper":
        return dataclasses.replace(base, method="sol", **PAPER_SETTINGS)
    return dataclasses.replace(base, method=method)


# Gaussian at several kappas, the other noise types at 0.3 (the paper's Table 1 layout).
DEFAULT_KAPPAS = (0.0, 0.2, 0.3, 0.4)
OTHER_NOISE = ("laplacian", "uniform", "skewed")
DEFAULT_SETTINGS = tuple([("gaussian", k) for k in DEFAULT_KAPPAS] + [(t, 0.3) for t in OTHER_NOISE])


def noise_settings(kappas: Sequence[float] | None = None,
                   noises: Sequence[str] | None = None) -> list[tuple[str, float]]:
    """(noise, kappa) columns: Gaussian at each of ``kappas``, then each other type of ``noises``
    at kappa 0.3 (the paper's layout)."""
    kappas = DEFAULT_KAPPAS if kappas is None else tuple(kappas)
    noises = OTHER_NOISE if noises is None else tuple(noise_key(t) for t in noises)
    for noise in noises:
        if noise in ("gaussian", "none"):
            raise ValueError(f"--noises {noise}: Gaussian noise and clean labels are the --kappas columns "
                             f"(--kappas 0 for clean labels, --kappas 0.3 for Gaussian noise at kappa 0.3); "
                             f"--noises takes the other types, e.g. {','.join(OTHER_NOISE)}.")
    return [("gaussian", float(k)) for k in kappas] + [(t, 0.3) for t in noises]


@dataclass(frozen=True)
class Comparison:
    """A checked comparison (:func:`check_comparison`): every (setting, method, seed) of ``base``."""

    base: TrainConfig
    methods: Sequence[str]
    settings: Sequence[tuple[str, float]]
    seeds: Sequence[int]


def check_comparison(base: TrainConfig, methods: Sequence[str],
                     settings: Sequence[tuple[str, float]], seeds: Sequence[int]) -> Comparison:
    """Refuse, before anything trains, a comparison that would stop half-way or say nothing: an
    empty or repeated ``--methods``/``--seeds``, no noise setting, an unknown noise type, or
    any (setting, method, seed) whose configuration is invalid; the comparison, checked.

    Raises:
        ValueError: naming the option, what was wrong and what is expected.
    """
    def once(values: Sequence[Any], flag: str, example: str) -> None:
        if not values:
            raise ValueError(f"{flag} is empty; expected a comma-separated list such as {example}.")
        repeated = sorted({str(v) for v in values if list(values).count(v) > 1})
        if repeated:
            raise ValueError(f"{flag} lists {', '.join(repeated)} more than once; give each once.")

    once(list(methods), "--methods", ",".join(COMPARE_METHODS[:2]))
    unknown = [m for m in methods if m not in COMPARE_METHODS]
    if unknown:
        raise ValueError(f"--methods: unknown method {unknown[0]!r}; expected some of "
                         f"{', '.join(COMPARE_METHODS)}.")
    once(list(seeds), "--seeds", "0,1,2")
    if not settings:
        raise ValueError("no noise setting to compare: --kappas and --noises are both empty; "
                         "give at least one, e.g. --kappas 0.3.")
    once([k for n, k in settings if n == "gaussian"], "--kappas", "0,0.2,0.3")
    others = [n for n, _ in settings if n != "gaussian"]
    if others:
        once(others, "--noises", ",".join(OTHER_NOISE))
    for noise in others:
        if noise_key(noise) not in NOISE_TYPES or noise_key(noise) in ("gaussian", "none"):
            known = [t for t in NOISE_TYPES if t not in ("gaussian", "none")]
            raise ValueError(f"--noises: unknown noise type {noise!r}; expected some of "
                             f"{', '.join(known)} (Gaussian noise and clean labels are the "
                             f"--kappas columns).")
    resolve_device(base.device)  # a --device that is not there is refused before the first run
    for noise, kappa in settings:
        for seed in seeds:
            for method in methods:
                method_config(dataclasses.replace(base, noise=noise, kappa=kappa, seed=seed),
                              method).validate()
    return Comparison(base, tuple(methods), tuple(settings), tuple(seeds))


def _label(noise: str, kappa: float) -> str:
    return "clean" if kappa == 0 else f"{noise} {kappa:g}"


def run_comparison(base: TrainConfig, methods: Sequence[str], settings: Sequence[tuple[str, float]],
                   seeds: Sequence[int], out_dir: Path,
                   log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Train every (setting, method, seed); return one record per run.

    Runs go to ``out_dir/<noise>-<kappa>/<method>/seed<k>`` (checkpoints only). The data of a
    (setting, seed) are prepared once and shared by the methods, so all methods see the same
    split and the same noisy labels.
    """
    return train_comparison(check_comparison(base, methods, settings, seeds), out_dir, log)


def train_comparison(comparison: Comparison, out_dir: Path,
                     log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """:func:`run_comparison` of a comparison already checked (each configuration validated once,
    by :func:`check_comparison`)."""
    records = []
    total = len(comparison.settings) * len(comparison.seeds) * len(comparison.methods)
    for noise, kappa in comparison.settings:
        for seed in comparison.seeds:
            data_cfg = dataclasses.replace(comparison.base, noise=noise, kappa=kappa, seed=seed)
            data = prepare_data(data_cfg)
            for method in comparison.methods:
                run_dir = out_dir / f"{noise}-{kappa:g}" / method / f"seed{seed}"
                run = check_run(method_config(data_cfg, method), data, run_dir, False,
                                log=lambda _line: None)
                records.append({"noise": noise, "kappa": kappa, "method": method, "seed": seed,
                                **_figures(fit_run(run).results)})
                r = records[-1]
                log(f"[{len(records)}/{total}] {_label(noise, kappa):>14}  {method:<12} seed {seed}: "
                    f"MAE {r['mae']:.3f}  CS {r['cs']:.1f}%  labels changed {r['labels_changed']}")
    return records


def _figures(res: dict[str, Any]) -> dict[str, Any]:
    """The figures a comparison records of one run's results."""
    given, final = res["label_noise_given"], res["label_noise_final"]
    return {"mae": res["test"]["mae"], "cs": res["test"]["cs"], "pearson": res["test"]["pearson"],
            "macro_mae": res["test"]["macro_mae"], "qwk": res["test"]["qwk"],
            "cs_theta": res["cs_theta"], "labels_changed": res["labels_changed"],
            "label_mae_given": None if given is None else given["mae"],
            "label_mae_final": None if final is None else final["mae"],
            "selected_epoch": res["selected_epoch"], "seconds": res["seconds"]}


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def mean_std_table(title: str, settings: Sequence[tuple] | Mapping[tuple, str], methods: Sequence[str],
                   cell: dict[tuple, tuple[float, float]], fmt: str,
                   best: Callable[..., float]) -> list[str]:
    """Markdown lines of one table: a row per method, a column per noise setting (``settings`` in
    order, headed by :func:`_label` of the setting, or a mapping of each setting to its header),
    each cell ``fmt.format(mean, std)`` of ``cell[(setting, method)]`` (blank where missing); the
    ``best`` mean of each column is bold."""
    headers = (dict(settings) if isinstance(settings, Mapping)
               else {setting: _label(*setting) for setting in settings})
    lines = [title, "", "| method | " + " | ".join(headers.values()) + " |",
             "| --- | " + " | ".join("---" for _ in headers) + " |"]
    winners = {s: best(cell[(s, m)][0] for m in methods if (s, m) in cell) for s in headers}
    for m in methods:
        parts = []
        for s in headers:
            if (s, m) not in cell:
                parts.append("")
                continue
            text = fmt.format(*cell[(s, m)])
            parts.append(f"**{text}**" if cell[(s, m)][0] == winners[s] else text)
        lines.append(f"| {m} | " + " | ".join(parts) + " |")
    return lines + [""]


def markdown_tables(records: Sequence[dict[str, Any]], data_name: str, labels_given: bool = False) -> str:
    """Four markdown tables (MAE and macro-MAE, lower is better; CS and QWK, higher is better):
    one row per method,
    one column per noise setting, ``mean ± std`` over seeds; the best mean is bold. With
    ``labels_given`` (a training file with ``--test-data``) the column without added noise is
    headed "labels as given", not "clean"."""
    settings = list(dict.fromkeys((r["noise"], r["kappa"]) for r in records))
    methods = list(dict.fromkeys(r["method"] for r in records))
    seeds = sorted({r["seed"] for r in records})
    theta = records[0]["cs_theta"] if records else 0.0

    def column(setting: tuple[str, float]) -> str:
        return "labels as given" if labels_given and setting[1] == 0 else _label(*setting)

    out = []
    for metric, title, fmt, best in (
            ("mae", "test MAE (lower is better)", "{:.3f} ± {:.3f}", min),
            ("cs", f"test CS@{theta:g} in % (higher is better)", "{:.1f} ± {:.1f}", max),
            ("macro_mae", "test macro-MAE: the mean of per-rank MAEs (lower is better)",
             "{:.3f} ± {:.3f}", min),
            ("qwk", "test quadratic weighted kappa (higher is better)", "{:.3f} ± {:.3f}", max)):
        cell: dict[tuple, tuple[float, float]] = {}
        for s in settings:
            for m in methods:
                # records of an earlier version have no macro-MAE or QWK
                vals = [r[metric] for r in records if (r["noise"], r["kappa"]) == s
                        and r["method"] == m and r.get(metric) is not None]
                if vals:
                    cell[(s, m)] = mean_std(vals)
        out += mean_std_table(f"**{data_name}: {title}, mean ± std over {len(seeds)} seed(s)**",
                              {s: column(s) for s in settings}, methods, cell, fmt, best)
    return "\n".join(out)


def write_comparison(records: Sequence[dict[str, Any]], table: str, out_dir: Path) -> None:
    """``compare.json`` (every run) and ``compare.md`` (the tables), the markdown last."""
    atomic_write_text(out_dir / "compare.json", json.dumps(list(records), indent=2) + "\n")
    atomic_write_text(out_dir / "compare.md", table)


def compare_command(args) -> int:
    """``sol-ext compare``: every option checked, then every run, then the tables."""
    from .console import say
    from .data import is_builtin
    from .options import (
        check_test_data,
        check_threads,
        data_inputs,
        data_kind,
        output_folder,
        set_threads,
        train_config,
    )
    from .outputs import check_compare_folder
    from .rundir import run_folder

    base = train_config(args, noise="gaussian")
    check_threads(args.threads)
    check_test_data(args, base)
    out = output_folder(args.output)
    settings = noise_settings(args.kappas, args.noises)
    methods = default_methods() if args.methods is None else args.methods
    comparison = check_comparison(base, methods, settings, args.seeds)  # before the first run
    check_compare_folder(out, "--output", data_inputs(base))  # before the lock file is made
    set_threads(args.threads, base, "images" if args.encoder not in ("auto", "mlp") else data_kind(base))
    with run_folder(out, note=lambda: f"interrupted; {out / 'compare.md'} was not updated."):
        records = train_comparison(comparison, out, log=say)
        data_name = Path(base.data).name.split(".")[0]
        # a user's own labels are as given (their truth unknown), with or without a test file
        labels_given = base.test_data is not None or not is_builtin(base.data)
        table = markdown_tables(records, data_name, labels_given=labels_given)
        write_comparison(records, table, out)
        print(table)
        return 0
