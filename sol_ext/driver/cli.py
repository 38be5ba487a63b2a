"""The ``sol-ext`` command: ``train``, ``predict``, ``export``, ``audit`` and ``compare``.

Errors in the input (a bad data file, an unknown option value, a checkpoint of another run)
print one line ``sol-ext: error: ...`` and exit with status 2; ``--traceback`` (or the environment
variable ``SOL_EXT_TRACEBACK=1``) prints the full traceback above it. Every output path is checked by
:mod:`sol_ext.driver.outputs` before anything is computed; Ctrl-C prints ``sol-ext: interrupted``
and exits with status 130, leaving no partial file.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import dataclasses
import filecmp
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from .config import (
    BASELINE_WEIGHT_DECAY,
    COMPARE_METHODS,
    INFERENCE_MODES,
    METHODS,
    PAPER_SETTINGS,
    RELABEL_RULES,
    SIGMA_GRID,
    SOL_WEIGHT_DECAY_PER_RANK,
    WEIGHT_EMA_SHARE,
    TrainConfig,
)
from .encoders import TORCHVISION_ENCODERS
from .errors import UsageError, command_line_flags, user_error_message
from .loader import AUGMENTATIONS

__all__ = ["main", "build_parser"]

_DEFAULT = TrainConfig()
EXIT_USAGE = 2
THREADS_PER_CORE = 4  # --threads beyond this many per CPU core is a typo (torch fails on 100000)
# The environment variable that shows the traceback behind an error line, as --traceback does.
TRACEBACK_VARIABLE = "SOL_EXT_TRACEBACK"
TRACEBACK_HELP = (f"print the full traceback above an error's one line (also "
                  f"{TRACEBACK_VARIABLE}=1): for debugging your data or the package")


def _positive_list(text: str, kind=float) -> list:
    try:
        return [kind(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of numbers, got {text!r}") from None


def _number_or_auto(text: str) -> float | str:
    if text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'auto', got {text!r}") from None


def _add_data_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("data")
    g.add_argument("--data", default=_DEFAULT.data,
                   help="built-in name (abalone, wine-red, fashion-mnist-blur, "
                        "fashion-mnist-noise) or a .csv/.csv.gz/.npz file or image folder "
                        "(default: %(default)s)")
    g.add_argument("--delimiter", default=None,
                   help="cell separator of the CSV files (--data and --test-data): one character, or "
                        "comma, semicolon, tab (default: sniffed from each file)")
    g.add_argument("--test-data", default=None,
                   help="separate test file with clean labels; --data is then the whole training "
                        "set with labels as given (already noisy: no noise is added by default)")
    g.add_argument("--label-column", default=None,
                   help="label column of a table (CSV, Parquet, Feather) or image list (default: label)")
    g.add_argument("--test-fraction", type=float, default=None,
                   help="test share when --data is split; not with --test-data (default: "
                        f"{_DEFAULT.test_fraction})")
    g.add_argument("--val-fraction", type=float, default=None,
                   help="share of the training data (noisy labels) held out to pick the best "
                        f"epoch; 0: the last epoch is the model (default: {_DEFAULT.val_fraction})")
    i = p.add_argument_group("images")
    i.add_argument("--image-size", type=int, default=None, metavar="PIXELS",
                   help="side every image is resized to (default: 64 for an image list, 28 for "
                        "fashion-mnist-*)")
    i.add_argument("--augment", choices=AUGMENTATIONS, default=None,
                   help="training augmentation: 'flip' flips at random, left to right; 'crop' also "
                        "pads by 1/8 of the side and crops back at a random offset (the content keeps "
                        "its scale); 'resized-crop' is torchvision's RandomResizedCrop (scale 0.5-1) "
                        "and a flip, which rescales blur and grain; 'none' (default: flip)")
    i.add_argument("--workers", type=int, default=None,
                   help="DataLoader processes decoding and augmenting images; 0: in the training "
                        "process (default: the free CPU cores, at most 8). The results do not "
                        "depend on it")


def _add_model_options(p: argparse.ArgumentParser, with_method: bool = True) -> None:
    g = p.add_argument_group("method and encoder")
    if with_method:
        g.add_argument("--method", choices=METHODS, default=_DEFAULT.method,
                       help="sol; sol-no-noise (P = identity: plain order learning); l1 "
                            "regression; ce classification (default: %(default)s)")
    g.add_argument("--encoder", default=_DEFAULT.encoder, metavar="NAME",
                   help="auto (mlp for vectors, cnn for images), mlp, cnn, vgg16bn (the paper's: "
                        "VGG16-BN's convolutional part), or a torchvision classification model: "
                        + ", ".join(TORCHVISION_ENCODERS) + ", ... (its last layer becomes the "
                        "embedding layer) (default: %(default)s)")
    g.add_argument("--embedding-dim", type=int, default=_DEFAULT.embedding_dim,
                   help="embedding size d (default: %(default)s)")
    g.add_argument("--hidden", type=lambda t: _positive_list(t, int),
                   default=list(_DEFAULT.hidden), help="MLP hidden widths, e.g. 128,128")
    g.add_argument("--weights", "--vgg-weights", dest="weights", default=None, metavar="FILE",
                   help="local .pth state dict of the torchvision model (e.g. torchvision's "
                        "resnet18-f37072fd.pth; vgg16_bn's for vgg16bn); nothing is downloaded. "
                        "Images are then normalized with ImageNet's mean and std, inside the model")
    g.add_argument("--no-normalize", dest="normalize", action="store_false",
                   help="do not L2-normalize embeddings and centroids (SOL methods)")
    s = p.add_argument_group(
        "SOL settings", "defaults: ours; --paper restores the paper's Algorithm 1 (docs/math.md §8, §11), "
        "and options given beside it still apply")
    s.add_argument("--paper", action="store_true",
                   help="the published procedure: " + ", ".join(
                       f"{k}={v}" for k, v in PAPER_SETTINGS.items()))
    s.add_argument("--sigma", type=_number_or_auto, default=None,
                   help="noise-model std in ranks, or 'auto': picked from "
                        + ", ".join(f"{s:g}" for s in SIGMA_GRID) + " by validation MAE, "
                        f"one training each (default: {_DEFAULT.sigma})")
    s.add_argument("--tau", type=int, default=None,
                   help=f"similarity threshold in ranks (default: {_DEFAULT.tau})")
    s.add_argument("--margin", type=float, default=None,
                   help=f"margin gamma (default: {_DEFAULT.margin})")
    s.add_argument("--T", dest="T", type=int, default=None,
                   help=f"neighbour range of the discriminative loss (default: {_DEFAULT.T})")
    s.add_argument("--disc-weight", type=float, default=None,
                   help=f"weight lambda of the discriminative loss (default: {_DEFAULT.disc_weight})")
    s.add_argument("--inference", choices=INFERENCE_MODES, default=None,
                   help="rank read-out: 'posterior' = posterior median of p(q|x) ~ freq(q) "
                        "exp(-D[x,q]/t) (not in the paper); 'nearest' = argmin_q D[x,q] (paper "
                        "eq. 6); 'cuts' = the expected rank under p(q|x) against a cut per rank, "
                        "fitted to the training labels for least MAE (not in the paper) "
                        f"(default: {_DEFAULT.inference})")
    s.add_argument("--relabel", choices=RELABEL_RULES, default=None,
                   help="relabeling rule: 'posterior' moves a given label to the median of "
                        "p(rank | x, label) where that puts --relabel-mass on one side of it (not "
                        "in the paper); 'outlier' = the paper's outlier rule, relabels accumulate "
                        f"(default: {_DEFAULT.relabel})")
    s.add_argument("--relabel-mass", type=float, default=None,
                   help=f"posterior mass needed to move a label (default: {_DEFAULT.relabel_mass})")
    s.add_argument("--label-noise", type=_number_or_auto, default=None, metavar="STD",
                   help="std of the label error in ranks for 'posterior' relabeling: 'auto' "
                        "estimates it on the validation split and moves a label where "
                        "--relabel-mass of p(rank | x, label) lies on one side of it; a known std "
                        "(e.g. from labels annotated twice: std of their difference / sqrt 2) "
                        "moves every label to that posterior's median. The encoder trains on the "
                        f"given labels either way (default: {_DEFAULT.label_noise})")
    s.add_argument("--beta", type=float, default=None,
                   help=f"outlier threshold of the 'outlier' rule (default: {_DEFAULT.beta})")
    s.add_argument("--centroid-momentum", type=float, default=None,
                   help="centroids <- normalize(m*old + (1-m)*rule) each epoch; 0 = the paper "
                        f"(default: {_DEFAULT.centroid_momentum})")
    s.add_argument("--convention", choices=("paper", "official"), default=_DEFAULT.convention,
                   help="loss convention; 'official' also floors the relabel step")
    s.add_argument("--pairs", choices=("all", "balanced"), default=_DEFAULT.pairs,
                   help="all pairs of a batch, or the authors' balanced sampler")
    s.add_argument("--pairs-per-class", type=int, default=_DEFAULT.pairs_per_class,
                   help="pairs kept per order relation with --pairs balanced (default: %(default)s)")
    r = s.add_mutually_exclusive_group()
    r.add_argument("--refine", dest="refine", action="store_true", default=None,
                   help="relabel training labels after each epoch (default for sol)")
    r.add_argument("--no-refine", dest="refine", action="store_false",
                   help="never relabel (default for sol-no-noise)")
    o = p.add_argument_group("optimization")
    o.add_argument("--lr", type=float, default=_DEFAULT.lr, help="Adam learning rate "
                                                                 "(default: %(default)s)")
    o.add_argument("--weight-decay", type=_number_or_auto, default=None,
                   help="Adam's L2 weight decay; 'auto': "
                        f"{SOL_WEIGHT_DECAY_PER_RANK:g} x the number of ranks for sol with the mlp "
                        f"encoder, else {BASELINE_WEIGHT_DECAY:g} (default: {_DEFAULT.weight_decay})")
    o.add_argument("--weight-ema", type=_number_or_auto, default=None, metavar="DECAY",
                   help="evaluate, select and save an exponential moving average of the weights "
                        "(this decay per training step; 0: the trained weights; 'auto': "
                        f"over the last {WEIGHT_EMA_SHARE * 100:g} %% of the steps so far for sol, "
                        "none for the baselines) "
                        f"(default: {_DEFAULT.weight_ema})")
    o.add_argument("--epochs", type=int, default=_DEFAULT.epochs, help="(default: %(default)s)")
    o.add_argument("--patience", type=int, default=None,
                   help="stop after this many epochs without a better validation MAE "
                        "(default: train every epoch)")
    o.add_argument("--batch-size", type=int, default=_DEFAULT.batch_size,
                   help="(default: %(default)s)")
    o.add_argument("--device", default=_DEFAULT.device, help="cpu, cuda, cuda:1 or auto "
                                                             "(default: %(default)s)")
    o.add_argument("--amp", action="store_true", default=None,
                   help="mixed precision: autocast to float16 with loss scaling on a GPU (bfloat16 "
                        "on the CPU); the loss itself computes in float32")
    o.add_argument("--backend", choices=("auto", "fused", "reference"), default=_DEFAULT.backend,
                   help="kernel backend of the loss (default: %(default)s)")
    o.add_argument("--threads", type=int, default=0,
                   help="CPU threads of torch; 0: 1 for the MLP encoder (its small products "
                        "lose more to thread hand-offs than they gain), torch's default otherwise")
    o.add_argument("--cs-theta", type=float, default=None,
                   help="CS threshold in label units (default: 2 rank steps)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sol-ext", description="Stochastic Order Learning: rank estimation from noisy labels.")
    parser.add_argument("-V", "--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("--traceback", action="store_true", default=False, help=TRACEBACK_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    t = sub.add_parser("train", help="train one model and report test MAE/CS",
                       description="Train SOL or a baseline. With no option: abalone, Gaussian "
                                   "label noise at kappa 0.3, SOL. Data-parallel under torchrun: "
                                   "torchrun --nproc-per-node N -m sol_ext train ... (--batch-size "
                                   "is then per process).")
    _add_data_options(t)
    n = t.add_argument_group("label noise added to the training labels")
    n.add_argument("--noise", default=None,
                   help="gaussian, laplacian, uniform, skewed, input-dependent or none "
                        "(default: gaussian on the built-in data sets, to show what SOL recovers; "
                        "none on your own file or folder, whose labels are used as given)")
    n.add_argument("--kappa", type=float, default=_DEFAULT.kappa,
                   help="noise ratio: std of the noise / std of the ranks (default: %(default)s)")
    n.add_argument("--noise-fraction", type=float, default=_DEFAULT.noise_fraction,
                   help="share of training samples that get noise (default: %(default)s)")
    _add_model_options(t)
    t.add_argument("--seed", type=int, default=_DEFAULT.seed, help="(default: %(default)s)")
    t.add_argument("--output", default=None,
                   help="output folder: new, empty, or a run's (default: "
                        "runs/<data>-<method>[-paper]-<noise><kappa>-seed<k>, <noise> 'none' "
                        "without added noise)")
    t.add_argument("--resume", action="store_true",
                   help="continue the run in --output from its last checkpoint")
    t.add_argument("--overwrite", action="store_true",
                   help="start afresh even if --output holds a run (its checkpoints, results and "
                        "plots are deleted)")
    t.add_argument("--no-plots", dest="plots", action="store_false", help="skip the PNG plots")
    t.add_argument("--quiet", action="store_true", help="no per-epoch lines, no progress bar")
    t.add_argument("--config", default=None, metavar="FILE",
                   help="TOML file of settings, one 'key = value' line each, keys as the options "
                        "above (epochs = 40, label_column = \"age\"); options given here override it. "
                        "A run's config.toml repeats it from any folder: its relative data paths "
                        "are read from the folder it was trained in (Python < 3.11 needs the tomli "
                        "package)")
    t.add_argument("--print-config", action="store_true",
                   help="print the run's settings as TOML (what --config reads) and exit without "
                        "training")

    pr = sub.add_parser("predict", help="predict labels for new data with a trained run",
                        description="One CSV row per input: id (data row from 0, or image path), "
                                    "prediction and expected value in label units, and one "
                                    "probability column per label value. If the data have the "
                                    "label column, prints MAE, QWK and macro-MAE against it.")
    pr.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="output folder of 'sol-ext train'")
    pr.add_argument("--data", required=True,
                    help="a .csv/.csv.gz/.npz file, an image folder, or a built-in name, with the "
                         "training data's columns (the label column is optional)")
    pr.add_argument("--delimiter", default=None,
                    help="cell separator of a CSV file (default: the training file's, else sniffed)")
    pr.add_argument("--output", default=None,
                    help="where to write the CSV (default: RUN_DIR/predictions.csv, replaced by a "
                         "rerun; '-' for stdout). Never the input file or a file sol-ext wrote into "
                         "a run folder; another existing file needs --overwrite")
    pr.add_argument("--overwrite", action="store_true",
                    help="replace an existing --output file that is neither an input nor sol-ext's")
    pr.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 or auto (default: %(default)s)")
    pr.add_argument("--workers", type=int, default=None,
                    help="DataLoader processes decoding image files; 0: this process (default: the "
                         "free CPU cores, at most 8)")

    ex = sub.add_parser("export", help="write a trained run as a torch.export program (.pt2)",
                        description="A torch.export program that loads and predicts with plain "
                                    "torch (torch.export.load(PATH).module()(x)), without sol_ext; "
                                    "x is float32 or float64 [N, F] raw features in the training "
                                    "column order (one-hot columns included) or images [N, C, H, W] "
                                    "in [0, 1]; a row with NaN or inf gets NaN outputs. Beside it, "
                                    "PATH with the suffix .json names the columns and label values.")
    ex.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="output folder of 'sol-ext train'")
    ex.add_argument("--output", default=None,
                    help="the program's path; its sidecar is the same path with .json as suffix "
                         "(default: RUN_DIR/model.pt2 and RUN_DIR/model.json, replaced by a rerun). "
                         "Never a file sol-ext wrote into a run folder; another existing file needs "
                         "--overwrite")
    ex.add_argument("--overwrite", action="store_true",
                    help="replace an existing program or sidecar that is not sol-ext's run files")

    a = sub.add_parser("audit", help="list the training labels that look wrong, as CSV",
                       description="One row per training sample of a trained run, suspects "
                                   "first: index, given label, current label, predicted label, "
                                   "deviation, outlier flag, score (how likely the label is wrong), "
                                   "suggested label.")
    a.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="output folder of 'sol-ext train'")
    a.add_argument("--csv", default=None,
                   help="where to write the CSV (default: RUN_DIR/audit.csv, replaced by a rerun; "
                        "'-' for stdout). Never a file sol-ext wrote into a run folder; another "
                        "existing file needs --overwrite")
    a.add_argument("--overwrite", action="store_true",
                   help="replace an existing --csv file that is not one of sol-ext's run files")
    a.add_argument("--folds", type=int, default=None, metavar="K",
                   help="judge every training row by a model trained without it: the run's settings "
                        "trained K times, each without one of K folds (default 3; costs about K-1 runs)")
    a.add_argument("--in-sample", action="store_true",
                   help="judge the labels by the run's own model, which trained on them (no training; "
                        "finds few: a model agrees with the labels it fitted)")
    a.add_argument("--label-noise", type=float, default=None, metavar="STD",
                   help="the std of the label error in ranks, if you know it: a label is flagged where "
                        "the median of p(rank | x, label) is another rank (default: the run's "
                        "--label-noise when it is a number, else only labels in a 0.25%% tail of "
                        "p(rank | x): few flags, rarely wrong)")

    c = sub.add_parser("compare", help="SOL against the baselines under label noise",
                       description="Train every method at Gaussian kappa in {0, 0.2, 0.3, 0.4} "
                                   "and Laplacian, uniform, skewed at 0.3, over 3 seeds; print "
                                   "markdown tables of mean ± std test MAE and CS.")
    _add_data_options(c)
    c.add_argument("--methods", type=lambda t: [m.strip() for m in t.split(",") if m.strip()],
                   default=None, help="comma list of " + ", ".join(COMPARE_METHODS) + " (sol-paper: "
                                      "sol with --paper; default: all but sol-paper, corn where "
                                      "coral-pytorch is installed)")
    c.add_argument("--kappas", type=_positive_list, default=None,
                   help="Gaussian noise ratios (default: 0,0.2,0.3,0.4)")
    c.add_argument("--noises", type=lambda t: [m.strip() for m in t.split(",") if m.strip()],
                   default=None, help="other noise types at kappa 0.3 (default: "
                                      "laplacian,uniform,skewed; '' for none)")
    c.add_argument("--seeds", type=lambda t: _positive_list(t, int), default=[0, 1, 2],
                   help="comma list (default: 0,1,2)")
    _add_model_options(c, with_method=False)
    c.add_argument("--output", default="runs/compare",
                   help="folder of the runs and of compare.md (default: %(default)s)")
    for command in (t, pr, ex, a, c):  # also after the command's name; SUPPRESS keeps one given before
        command.add_argument("--traceback", action="store_true", default=argparse.SUPPRESS,
                             help=TRACEBACK_HELP)
    return parser


def _version() -> str:
    from .. import __version__

    return __version__


def _config(args: argparse.Namespace, **override) -> TrainConfig:
    """The run's configuration: the defaults, or the paper's settings with ``--paper``, then the
    ``--config`` file's settings, then every option given on the command line."""
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    from_file = None
    given = None  # without a file, every option that is not None (defaults included) applies
    if getattr(args, "config", None) is not None:
        from .config_file import options_given, read_config_file

        from_file = read_config_file(args.config)
        args.paper = from_file.pop("paper", False) or args.paper  # also names the output folder
        given = options_given(build_parser(), args.argv)
        for option in ("output", "threads"):  # options of the command, not of the training
            if option in from_file and option not in given:
                setattr(args, option, from_file[option])
            from_file.pop(option, None)
    values = dict(PAPER_SETTINGS) if getattr(args, "paper", False) else {}
    values.update(from_file or {})
    values.update({k: v for k, v in vars(args).items()
                   if k in names and v is not None and (given is None or k in given)})
    values.update(override)
    try:
        return TrainConfig(**values).validate()
    except ValueError as exc:
        if from_file and _refused(dict(PAPER_SETTINGS) if args.paper else {}, from_file, str(exc)):
            raise ValueError(f"--config {args.config}: {exc}") from None  # the file's own values
        raise


def _refused(base: dict, settings: dict, message: str) -> bool:
    """Whether ``settings`` over ``base``, without the command line, fail with ``message``."""
    try:
        TrainConfig(**{**base, **settings}).validate()
    except ValueError as exc:
        return str(exc) == message
    return False


def _check_threads(requested: int) -> None:
    """Refuse a negative ``--threads`` or more than :data:`THREADS_PER_CORE` per CPU core (checked
    before anything loads: torch fails on an absurd count with a MemoryError, then a crash)."""
    if requested < 0:
        raise UsageError(f"--threads must be >= 0, got {requested}.")
    cores = os.cpu_count() or 1
    if requested > THREADS_PER_CORE * cores:
        raise UsageError(f"--threads {requested}: at most {THREADS_PER_CORE * cores} "
                         f"({THREADS_PER_CORE} per core; this machine has {cores} CPU cores); "
                         f"0 picks a good number.")


def _set_threads(requested: int, cfg: TrainConfig, kind: str) -> None:
    """Set torch's CPU threads: ``requested``, or 1 for the MLP encoder when 0."""
    import torch

    from .encoders import default_encoder

    _check_threads(requested)
    encoder = default_encoder(kind) if cfg.encoder == "auto" else cfg.encoder
    if requested or encoder == "mlp":
        torch.set_num_threads(requested or 1)


def _kind(cfg: TrainConfig) -> str:
    """Kind of the data set ``cfg.data`` (loads it; used before a comparison)."""
    from .data import load_dataset

    opts = {k: v for k, v in (("label_column", cfg.label_column), ("delimiter", cfg.delimiter))
            if v is not None}
    return load_dataset(cfg.data, **opts).kind


def _say(line: str) -> None:
    print(line, flush=True)  # progress lines show up at once, also when piped to a file


def _default_output(cfg: TrainConfig, paper: bool = False) -> Path:
    """``runs/<data>-<method>[-paper]-<noise><kappa>-seed<k>``: ``sol-paper`` as ``sol-ext
    compare`` names sol with ``--paper``; ``none`` without a kappa where no noise is added."""
    data = Path(cfg.data).name.split(".")[0] or "data"
    method = f"{cfg.method}-paper" if paper else cfg.method
    noise = "none" if cfg.noise == "none" else f"{cfg.noise}{cfg.kappa:g}"
    return Path("runs") / f"{data}-{method}-{noise}-seed{cfg.seed}"


def _output_folder(text: str, flag: str = "--output") -> Path:
    """The folder ``text`` of ``flag``; an empty path is refused (it would mean ``.``)."""
    if not text:
        raise UsageError(f"{flag} '': an empty path; expected a folder (e.g. runs/mine).")
    return Path(text)


def _data_inputs(cfg: TrainConfig) -> list:
    """``(what, path)`` of the data a run reads: no output may be written over them."""
    return [("the --data file", cfg.data), ("the --test-data file", cfg.test_data)]


def _run_data(run_dir: Path, model=None) -> list:
    """The data files the run in ``run_dir`` was trained on (from its loaded ``model`` where given),
    found from any working folder, as inputs no output may replace."""
    from .checkpoint import load_run_state, run_paths

    if model is not None:
        config, read_from = dataclasses.asdict(model.config), model.read_from
    else:
        state = load_run_state(run_dir)
        config, read_from = state.get("config", {}), (state.get("predictor") or {}).get("read_from")
    paths = run_paths(config, read_from)
    return [(f"the training data of {run_dir}", paths["data"]),
            (f"the test data of {run_dir}", paths["test_data"])]


def _same_data(a: str, b: str) -> bool:
    """Whether the data sets ``a`` and ``b`` are one: the same name or path, the same file or
    folder, or two files with the same bytes."""
    if a == b:
        return True
    pa, pb = Path(a), Path(b)
    if not (pa.exists() and pb.exists()):
        return False
    try:
        if os.path.samefile(pa, pb):
            return True
        return pa.is_file() and pb.is_file() and filecmp.cmp(pa, pb, shallow=False)
    except OSError:
        return False


def _check_test_data(args: argparse.Namespace, cfg: TrainConfig) -> None:
    """With ``--test-data``: no ``--test-fraction`` (nothing is split), and a test set that is not
    the training set (its score would say nothing)."""
    if cfg.test_data is None:
        return
    if args.test_fraction is not None:
        raise UsageError("--test-fraction applies when --data is split into training and test "
                         "sets; with --test-data the test set is that file: leave --test-fraction "
                         "out, or --test-data.")
    if _same_data(cfg.data, cfg.test_data):
        raise UsageError(f"--test-data {cfg.test_data} holds the same data as the training set "
                         f"(--data {cfg.data}); a test set must be other samples than the "
                         f"training ones.")


def _warn(line: str) -> None:
    print(f"sol-ext: warning: {line}", file=sys.stderr, flush=True)


def _warn_if_few_fitted(cfg: TrainConfig, n_train: int, n_fit: int, world_size: int) -> None:
    """One warning line when the encoder fits fewer than two (global) batches of samples."""
    batch = cfg.batch_size * world_size
    if n_fit >= 2 * batch:
        return
    held = (f" (--val-fraction {cfg.val_fraction:g} holds out {n_train - n_fit} of {n_train})"
            if n_fit < n_train else "")
    samples = "sample" if n_fit == 1 else "samples"
    _warn(f"the encoder fits only {n_fit} training {samples}{held}, fewer than two batches of "
          f"{batch}: its results mean little; lower --val-fraction or --batch-size, or use more "
          f"data.")


def _cmd_train(args: argparse.Namespace) -> int:
    from .checkpoint import (
        BEST_NAME,
        CHECKPOINT_NAME,
        SIGMA_SEARCH_NAME,
        atomic_write_text,
        sigma_search_progress,
    )
    from .config_file import CONFIG_FILE_NAME, config_toml
    from .outputs import check_run_inputs
    from .parallel import Parallel
    from .prepare import prepare_data
    from .report import clear_results, format_table, noise_label, write_outputs
    from .rundir import check_output_folder, run_folder
    from .train import check_resume, fitted_samples, resolve_device, searches_sigma, train

    if args.resume and args.overwrite:
        raise UsageError("--resume and --overwrite exclude each other: --resume continues the run "
                         "in --output, --overwrite discards it; pass one of them.")
    cfg = _config(args)  # without --noise: gaussian on a built-in set, else none (TrainConfig)
    _check_threads(args.threads)  # after the --config file, which may set it
    _check_test_data(args, cfg)
    if args.print_config:
        sys.stdout.write(config_toml(cfg, paper=args.paper, output=args.output, threads=args.threads))
        return 0
    par = Parallel.from_environment()  # torchrun: one of several processes
    device = resolve_device(cfg.device, par)
    out = (_output_folder(args.output) if args.output is not None
           else _default_output(cfg, paper=args.paper))
    par.start(device)
    try:
        if par.is_main:  # before the lock file: a folder that is not a run's stays untouched
            check_output_folder(out)
            check_run_inputs(out, "--output", _data_inputs(cfg))
        # one run at a time in `out` (rank 0 holds it for all); a Ctrl-C says what it holds
        with run_folder(out) if par.is_main else contextlib.nullcontext(out):
            if par.is_main:
                has_run = (out / CHECKPOINT_NAME).exists()
                search = None if has_run else sigma_search_progress(out)
                if (has_run or search) and not (args.resume or args.overwrite):
                    what = "a run" if has_run else "an unfinished sigma search (--sigma auto)"
                    raise UsageError(f"{out} already holds {what}; pass --resume to continue it, "
                                     f"--overwrite to start afresh, or another --output.")
                if args.resume and search and not searches_sigma(cfg):
                    raise UsageError(f"--resume: {out} holds an unfinished sigma search, which "
                                     f"continues with the options it started with (--sigma auto); "
                                     f"or pass --overwrite to start afresh.")
                if args.resume and not (has_run or search):
                    raise UsageError(f"--resume: no checkpoint in {out}; train without --resume "
                                     f"first.")
            say = (lambda _line: None) if args.quiet or not par.is_main else _say
            start = time.perf_counter()
            data = prepare_data(cfg)
            n_fit = fitted_samples(cfg, data)  # a too small validation split names --val-fraction
            if par.is_main:
                _warn_if_few_fitted(cfg, int(data.train_given.numel()), n_fit, par.world_size)
            _set_threads(args.threads, cfg, data.kind)
            processes = (f", {par.world_size} processes x batch {cfg.batch_size}"
                         if par.enabled else "")
            say(f"{data.name}: {data.train_x.shape[0]} training / {data.test_x.shape[0]} test "
                f"samples, {data.num_ranks} ranks; {cfg.method}, noise "
                f"{noise_label(cfg.noise, cfg.kappa)}{processes} -> {out}")
            if par.is_main:
                if args.resume:
                    # refuse other settings or data, or fewer epochs, before anything changes;
                    # the last results stay until the resumed run writes its own
                    check_resume(out, cfg, data.fingerprint())
                elif args.overwrite:
                    # the old run goes: predict/export/audit must not find its model or results
                    clear_results(out)
                    for name in (CHECKPOINT_NAME, BEST_NAME, CONFIG_FILE_NAME):
                        (out / name).unlink(missing_ok=True)
                    shutil.rmtree(out / SIGMA_SEARCH_NAME, ignore_errors=True)
            outcome = train(cfg, data, out, resume=args.resume,
                            progress=not args.quiet and sys.stdout.isatty(), log=say, parallel=par)
            if par.is_main:
                # the settings as --config reads them, then the results (written last)
                atomic_write_text(out / CONFIG_FILE_NAME, config_toml(
                    cfg, paper=args.paper, threads=args.threads, relative_to=data.read_from))
                path = write_outputs(outcome, data, out, plots=args.plots)
                print(format_table([outcome.results]))
                print(f"{time.perf_counter() - start:.1f} s; results in {path}")
            # every process leaves the group together: one that tore its gloo connections down
            # while rank 0 still wrote the outputs sometimes aborted ("terminate called without
            # an active exception")
            par.barrier()
            return 0
    finally:
        par.stop()


def _cmd_audit(args: argparse.Namespace) -> int:
    from .audit import DEFAULT_FOLDS, audit_run, write_audit
    from .outputs import check_output

    to_stdout = args.csv == "-"
    default = args.run_dir / "audit.csv"  # a rerun replaces it
    path = None if to_stdout else check_output(
        str(default) if args.csv is None else args.csv, "--csv", inputs=_run_data(args.run_dir),
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


def _cmd_predict(args: argparse.Namespace) -> int:
    from .loader import auto_workers
    from .model import load_run
    from .outputs import check_output
    from .predict import format_scores, prediction_csv, score_prediction
    from .train import resolve_device

    if args.workers is not None and args.workers < 0:
        raise UsageError(f"--workers must be >= 0, got {args.workers}.")
    to_stdout = args.output == "-"
    model = load_run(args.run_dir, device=resolve_device(args.device),
                     workers=auto_workers() if args.workers is None else args.workers)
    default = args.run_dir / "predictions.csv"  # a rerun replaces it
    inputs = [("the --data file", args.data), *_run_data(args.run_dir, model)]
    path = None if to_stdout else check_output(
        str(default) if args.output is None else args.output, "--output", inputs=inputs,
        replaceable=[default], overwrite=args.overwrite)
    if args.delimiter is not None:
        from .data.tables import table_format

        read = Path(args.data) / "labels.csv" if Path(args.data).is_dir() else Path(args.data)
        if table_format(read) != "csv":  # as train refuses it
            raise UsageError(f"--delimiter {args.delimiter} applies to CSV files only; {args.data} is not one: "
                             f"leave --delimiter out.")
        model.preprocessing = {**model.preprocessing, "delimiter": args.delimiter}
    prediction = model.predict_table(args.data)
    csv_bytes = prediction_csv(prediction)
    scores = score_prediction(model, prediction)
    if to_stdout:
        sys.stdout.flush()
        sys.stdout.buffer.write(csv_bytes)
        sys.stdout.buffer.flush()
        if scores is not None:
            print(format_scores(scores), file=sys.stderr)
        return 0
    from .checkpoint import atomic_write_bytes

    atomic_write_bytes(path, csv_bytes)
    print(f"{len(prediction.ids)} predictions ({model.method}) -> {path}")
    if scores is not None:
        print(format_scores(scores))
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from .export import export_run, sidecar_path
    from .model import load_run
    from .outputs import check_output

    model = load_run(args.run_dir)
    default = args.run_dir / "model.pt2"
    own = [default, sidecar_path(default)]  # a rerun replaces the default export
    inputs = _run_data(args.run_dir, model)
    text = str(default) if args.output is None else args.output
    if text and sidecar_path(text) == Path(text):
        raise UsageError(f"--output {text}: the program would share its name with its .json "
                         f"sidecar; choose a name that does not end in .json, e.g. model.pt2.")
    path = check_output(text, "--output", inputs=inputs, replaceable=own, overwrite=args.overwrite,
                        stdout_ok=False)
    check_output(str(sidecar_path(path)), f"--output {text} (its sidecar)", inputs=inputs,
                 replaceable=own, overwrite=args.overwrite, stdout_ok=False)
    side = export_run(model, path)
    print(f"exported {model.method} -> {path} (torch.export; needs plain torch only), "
          f"inputs and label values -> {side}")
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from .compare import (
        check_comparison,
        default_methods,
        markdown_tables,
        noise_settings,
        run_comparison,
        write_comparison,
    )
    from .outputs import check_compare_folder
    from .rundir import run_folder

    _check_threads(args.threads)
    base = _config(args, noise="gaussian")
    _check_test_data(args, base)
    out = _output_folder(args.output)
    settings = noise_settings(args.kappas, args.noises)
    methods = default_methods() if args.methods is None else args.methods
    check_comparison(base, methods, settings, args.seeds)  # every option before the first run
    check_compare_folder(out, "--output", _data_inputs(base))  # before the lock file is made
    _set_threads(args.threads, base, "images" if args.encoder not in ("auto", "mlp") else _kind(base))
    with run_folder(out, note=lambda: f"interrupted; {out / 'compare.md'} was not updated."):
        records = run_comparison(base, methods, settings, args.seeds, out, log=_say)
        data_name = Path(base.data).name.split(".")[0]
        from .data import is_builtin

        # a user's own labels are as given (their truth unknown), with or without a test file
        labels_given = base.test_data is not None or not is_builtin(base.data)
        table = markdown_tables(records, data_name, labels_given=labels_given)
        write_comparison(records, table, out)
        print(table)
        return 0


def _process_label() -> str:
    """``" (rank 1 of 4)"`` under torchrun (every process reports its own failure), else ``""``."""
    from .parallel import Parallel

    try:
        par = Parallel.from_environment()
    except ValueError:
        return ""
    return f" (rank {par.rank} of {par.world_size})" if par.enabled else ""


def end_process(status: int) -> None:
    """End the command's process now with ``status``, without the interpreter's shutdown.

    Tearing down torch's modules and libraries takes about 0.3 s: a sixth of a 200,000-row
    ``sol-ext predict``. The exit handlers still run first (the DataLoader workers' cleanup among
    them) and the output streams are flushed. Under torchrun they are skipped too: after
    DistributedDataParallel, torch's gloo can abort in the shutdown ("terminate called without an
    active exception"), which would report a finished run as failed.
    """
    world_size = os.environ.get("WORLD_SIZE", "1")
    if not (world_size.isdigit() and int(world_size) > 1):
        atexit._run_exitfuncs()  # what the shutdown would run first; documented since Python 2
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe (`| head`) has nothing to flush to
            stream.flush()
    os._exit(status)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``sol-ext``; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)  # argparse exits with status 2 on bad syntax
    args.argv = list(sys.argv[1:] if argv is None else argv)  # which options were typed (--config)
    handler = {"train": _cmd_train, "predict": _cmd_predict, "export": _cmd_export,
               "audit": _cmd_audit, "compare": _cmd_compare}[args.command]
    try:
        from .parallel import Parallel

        par = Parallel.from_environment()
        if par.enabled and args.command != "train":
            raise UsageError(f"'sol-ext {args.command}' runs in one process; of the commands only "
                             f"'train' runs under torchrun.")
        return handler(args)
    except KeyboardInterrupt as exc:
        # a run says what its output folder holds (rundir.RunInterrupted); elsewhere, nothing
        # was written
        # (a bare KeyboardInterrupt has an empty message, but is true as an object)
        _print_traceback_if_asked(args)
        print(f"sol-ext: {str(exc) or 'interrupted; nothing was written.'}", file=sys.stderr)
        return 130
    except Exception as exc:
        # bad input: the message says what and how to fix it, with the command's flags; no
        # traceback unless asked for. Anything else is a bug and keeps its traceback.
        message = user_error_message(exc, command_line_flags(parser))
        if message is None:
            raise
        _print_traceback_if_asked(args)
        where = _process_label()
        print(f"sol-ext: error{where}: {message}", file=sys.stderr)
        return EXIT_USAGE


def traceback_asked(args: argparse.Namespace) -> bool:
    """Whether ``--traceback`` was given or ``SOL_EXT_TRACEBACK`` is set to a true value."""
    value = os.environ.get(TRACEBACK_VARIABLE, "").strip().lower()
    return bool(getattr(args, "traceback", False)) or value not in ("", "0", "false", "no", "off")


def _print_traceback_if_asked(args: argparse.Namespace) -> None:
    """The traceback of the exception being handled, on stderr, where :func:`traceback_asked`."""
    if traceback_asked(args):
        import traceback

        traceback.print_exc(file=sys.stderr)


if __name__ == "__main__":  # pragma: no cover
    _status = main()
    end_process(_status)
