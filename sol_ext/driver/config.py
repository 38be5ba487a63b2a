"""Configuration of one training run, its defaults and its checks.

The defaults are what measured best on real data (docs/measured.md); where they differ
from the paper's Algorithm 1 (docs/math.md §8, §11), :data:`PAPER_SETTINGS` holds the paper's values and
``sol-ext train --paper`` applies them. Differences: the posterior-median read-out instead of
eq. 6, the posterior relabeling rule instead of the outlier rule, damped centroids, tau 1
instead of 3, the epoch picked on a validation split instead of the last one, and a moving
average of the weights (docs/math.md §12.9). The learning
rate is 1e-3 instead of the paper's 1e-4 (also under ``--paper``): the paper fine-tunes a
pretrained VGG16 for 100 epochs, while here a small encoder starts from scratch and must converge
in ~20 epochs.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from typing import Any, Optional, Tuple, Union

from .data.load import is_builtin
from .encoders import TORCHVISION_ENCODERS, check_encoder_name, is_pretrainable
from .loader import AUGMENTATIONS
from .pairs import PAIR_MODES

__all__ = ["METHODS", "COMPARE_METHODS", "READOUTS", "RELABEL_RULES", "PAPER_SETTINGS", "SIGMA_GRID", "FALLBACK_SIGMA",
           "NO_NOISE_SIGMA", "WEIGHT_EMA_SHARE", "SOL_WEIGHT_DECAY_PER_RANK", "BASELINE_WEIGHT_DECAY",
           "MAX_IMAGE_SIZE", "MAX_EPOCHS", "TrainConfig", "CONFIG_FIELDS_FREE_ON_RESUME", "config_mismatches",
           "OPTION_GROUPS", "setting", "option_of", "setting_kinds"]

METHODS = ("sol", "sol-no-noise", "l1", "ce", "corn")

# Rows of `sol-ext compare`: the methods, and "sol-paper" = sol with the paper's settings.
COMPARE_METHODS = (*METHODS, "sol-paper")

# Rank read-out of the SOL methods: the posterior median with a label-frequency prior, the paper's
# nearest expectation (eq. 6), or the expected rank against cuts fitted to the training labels (the
# default; neither it nor the median is in the paper); see TrainConfig.readout.
READOUTS = ("posterior", "nearest", "cuts")

# Relabeling rule of "sol": "posterior" (default, not in the paper) or the paper's "outlier"
# rule (docs/math.md §8); see sol_ext.refine.
RELABEL_RULES = ("posterior", "outlier")

# sigma of the noise kernel for "sol-no-noise": P[q, j] = exp(-(j-q)^2 / 2e-6) / ... is the
# identity to float64 precision (the first off-diagonal term is exp(-5e5) = 0), so the loss is
# plain order learning with 0/1 ordering probabilities.
NO_NOISE_SIGMA = 1e-3

# Candidates of `--sigma auto` (the default), in ranks: picked by validation MAE (sol_ext.driver.train.SigmaSearch).
# Measured (docs/measured.md): 1 suits abalone's 29 ranks and wine-red, 0.25 the 8 blur
# levels of fashion-mnist-blur; 2 never won.
SIGMA_GRID = (0.25, 0.5, 1.0)
# sigma where "auto" cannot pick (no validation split): the paper's
FALLBACK_SIGMA = 1.0

# weight_ema="auto" (the default): for the SOL methods, an average of the weights over about this
# share of the steps so far (decay 1 - 1 / (share * step), sol_ext.driver.weight_ema.WeightAverage);
# none for the baselines.
# Measured (docs/measured.md, "Many ranks"): SOL's embedding fits label noise within a few epochs and the
# average undoes part of it (62 ranks with annotator noise: test MAE 2.33 -> 2.25). A fixed decay
# per step lags on small data sets (wine-red, kappa 1, decay 0.995 = 11 epochs of 18 steps:
# 0.433 -> 0.471), and a fixed number of epochs on short runs (fashion-mnist-blur, 5 epochs, an
# average over 2 of them: 0.13 -> 1.18 on one seed). CORN, which fits the noise slowly, got no
# better with an average.
WEIGHT_EMA_SHARE = 0.1

# weight_decay="auto" (the default): Adam's L2 weight decay is this times the number of ranks for
# the SOL methods with the MLP encoder, and BASELINE_WEIGHT_DECAY (the paper's 5e-4) otherwise.
# SOL's loss sums over the ranks, so an L2 term added to its gradient weighs less the more ranks
# there are; the baselines' unnormalized outputs and the image encoders do worse with a strong
# decay (docs/math.md §12.10; the measurements are in docs/measured.md, "Many ranks").
SOL_WEIGHT_DECAY_PER_RANK = 0.01
BASELINE_WEIGHT_DECAY = 5e-4

# Largest embedding size: far above any use (the paper's is 512), and it refuses a typo such as
# 100000000 with a clear error instead of an allocation failure.
MAX_EMBEDDING_DIM = 65536

# Most epochs of a run: far above any use (the paper trains 100), and it refuses a typo such as
# 99999999999999999999, which would train without end, with a clear error.
MAX_EPOCHS = 100_000

# Largest learning rate: Adam's first step, lr / (1 - beta1) = 10 lr, overflows float32 (3.4e38)
# from ~3e37 on, a RuntimeError inside torch; anything near this diverges at once anyway.
MAX_LR = 1e30

# Text runs: AdamW's decoupled weight decay with weight_decay="auto", and the share of the steps the
# learning rates warm up over by default: what fine-tuning a pretrained sentence encoder usually
# takes (benchmarks/bench_finetune.py). A text is cut to at most MAX_TEXT_TOKENS tokens: far above any
# encoder's positions, and it refuses a typo with a clear error.
TEXT_WEIGHT_DECAY = 0.01
TEXT_WARMUP = 0.1
MAX_TEXT_TOKENS = 65536

# Largest image side: far above any backbone's input, and it refuses a typo with a clear error.
MAX_IMAGE_SIZE = 4096

# Fields a resumed run may change: more epochs, patience, another device, kernel backend or number
# of loader processes (augmentation is seeded per sample: the workers do not change the numbers).
CONFIG_FIELDS_FREE_ON_RESUME = frozenset({"epochs", "patience", "device", "backend", "workers"})


# Where each setting shows in `sol-ext train --help` (and `compare --help`), in this order: the
# option groups' titles and descriptions. None: the command's own options.
OPTION_GROUPS: dict[str, Optional[str]] = {
    "data": None,
    "images": None,
    "text": "a column of free text read by a Hugging Face encoder, fine-tuned end to end (extra text)",
    "label noise added to the training labels": None,
    "method and encoder": None,
    "SOL settings": "defaults: ours; --paper restores the paper's Algorithm 1 (docs/math.md §8, "
                    "§11), and options given beside it still apply",
    "optimization": None,
}

# A setting whose value --paper leaves alone.
_NOT_IN_PAPER = object()


def _need(ok: bool, message: str) -> None:
    """Raise ``ValueError(message)`` unless ``ok``: one check of :meth:`TrainConfig.validate`."""
    if not ok:
        raise ValueError(message)


# How a setting's command-line option is spelled and shown, beside its help and group: argparse's
# choices and metavar, the option's flag (default: "--" and the field's name with dashes) and other
# spellings kept as they are.
_OPTION_FORM = {"choices": None, "metavar": None, "flag": None, "aliases": ()}


def setting(default: Any, help: str, group: Optional[str], *, paper: Any = _NOT_IN_PAPER,
            **form: Any) -> Any:
    """A :class:`TrainConfig` field with everything its command-line option needs, so that the
    option, its help, the ``--config`` file's key and ``--paper``'s value are defined here only
    (:mod:`sol_ext.driver.options` builds the parser from them).

    Args:
        default: the field's default (shown in the help where it is not None).
        help: the option's help; say in words what a None default means.
        group: the help's option group (:data:`OPTION_GROUPS`); None: a command's own option.
        paper: the value of the paper's Algorithm 1, applied by ``--paper`` (:data:`PAPER_SETTINGS`).
        form: how the option is spelled and shown (:data:`_OPTION_FORM`): ``choices`` and
            ``metavar`` as argparse's; ``flag``, the option's spelling (default ``--`` and the
            field's name with dashes); ``aliases``, other spellings kept as they are.
    """
    unknown = sorted(set(form) - set(_OPTION_FORM))
    if unknown:
        raise TypeError(f"setting() got {', '.join(unknown)}; an option's form is some of "
                        f"{', '.join(_OPTION_FORM)}.")
    form = {**_OPTION_FORM, **form}
    metadata = {"help": help, "group": group, "paper": paper, **form, "aliases": tuple(form["aliases"])}
    return dataclasses.field(default=default, metadata=metadata)


# Settings of a fixed set of values that TrainConfig.validate checks with their own message.
_CHECKED_WITH_THEIR_RANGE = ("method", "pairs", "readout", "convention", "relabel", "augment")


@dataclass
class TrainConfig:
    """Everything that determines a run. Units: ranks unless said otherwise.

    Each field is a ``sol-ext train`` option (:func:`setting`): its help text is the field's
    documentation."""

    # -- data
    data: str = setting(
        "abalone", "built-in name (abalone, wine-red, fashion-mnist-blur, fashion-mnist-noise) or a "
        ".csv/.csv.gz/.npz file or image folder", "data")
    test_data: Optional[str] = setting(
        None, "separate test file with clean labels; --data is then the whole training set with "
        "labels as given (already noisy: no noise is added by default)", "data")
    label_column: Optional[str] = setting(
        None, "label column of a table (CSV, Parquet, Feather) or image list (default: label)", "data")
    delimiter: Optional[str] = setting(
        None, "cell separator of the CSV files (--data and --test-data): one character, or comma, "
        "semicolon, tab (default: sniffed from each file)", "data")
    encoding: Optional[str] = setting(
        None, "text encoding of the CSV files (--data and --test-data), e.g. cp1252 for Windows-1252, "
        "Excel's on Windows (default: UTF-8); a file to predict is read with it too", "data")
    test_fraction: float = setting(
        0.2, "test share when --data is split, below 1; 0 trains on every row, with no test set "
        "(the run then reports no test figures); not with --test-data", "data")
    test_label_column: Optional[str] = setting(
        None, "label column of --test-data where it is named otherwise than in --data (default: "
        "--label-column)", "data")
    # columns of a table: text columns are one-hot encoded with the training file's categories
    id_column: Optional[str] = setting(
        None, "column naming each row (an id): left out of the features, and carried into "
        "predictions.csv and the audit instead of row numbers", "data", metavar="COLUMN")
    feature_columns: Optional[str] = setting(
        None, "the feature columns, comma-separated (default: every column but the label, the id and "
        "--drop-columns)", "data", metavar="A,B,...")
    drop_columns: Optional[str] = setting(
        None, "columns left out of the features, comma-separated", "data", metavar="A,B,...")
    categorical: Optional[str] = setting(
        None, "columns one-hot encoded, comma-separated, also when they hold numbers (codes such as "
        "1, 2, 3). Columns of words are one-hot encoded without it", "data", metavar="A,B,...")
    missing: str = setting(
        "skip", "rows with a missing feature value (an empty or NaN cell): skip leaves them out, impute "
        "fills each cell with its column's median (text: its most common value), error stops and "
        "counts them; a warning says how many", "data", choices=("skip", "impute", "error"))
    # the label scale (a LabelGrid's grid); each end or step not given is inferred from the labels
    label_min: Optional[float] = setting(
        None, "label value of the lowest rank (default: the smallest training label)", "data",
        metavar="VALUE")
    label_max: Optional[float] = setting(
        None, "label value of the highest rank (default: the largest training label)", "data",
        metavar="VALUE")
    label_step: Optional[float] = setting(
        None, "label units between neighbouring ranks, e.g. 1 for whole grades, 0.5 for halves "
        "(default: inferred from the labels)", "data", metavar="VALUE")
    # label noise added to the training labels (docs/math.md §9)
    noise: Optional[str] = setting(
        "auto", "gaussian, laplacian, uniform, skewed, input-dependent, none, or auto: gaussian on "
        "the built-in data sets, to show what SOL recovers; none on your own file or folder, whose "
        "labels are used as given", "label noise added to the training labels")
    kappa: float = setting(
        0.3, "noise ratio: std of the noise / std of the ranks",
        "label noise added to the training labels")
    noise_fraction: float = setting(
        1.0, "share of training samples that get noise", "label noise added to the training labels")
    # -- method and encoder
    method: str = setting(
        "sol", "sol; sol-no-noise (P = identity: plain order learning); l1 regression; ce "
        "classification; corn (coral-pytorch)", "method and encoder", choices=METHODS)
    encoder: str = setting(
        "auto", "auto (mlp for vectors, cnn for images), mlp, cnn, vgg16bn (the paper's: "
        "VGG16-BN's convolutional part), or a torchvision classification model: "
        + ", ".join(TORCHVISION_ENCODERS) + ", ... (its last layer becomes the embedding layer)",
        "method and encoder", metavar="NAME")
    embedding_dim: int = setting(16, "embedding size d", "method and encoder")
    hidden: Tuple[int, ...] = setting((128, 128), "MLP hidden widths, e.g. 128,128", "method and encoder")
    weights: Optional[str] = setting(
        None, "local .pth state dict of the torchvision model (e.g. torchvision's "
        "resnet18-f37072fd.pth; vgg16_bn's for vgg16bn); nothing is downloaded. Images are then "
        "normalized with ImageNet's mean and std, inside the model", "method and encoder",
        metavar="FILE")
    # -- text: a column of free text read by a Hugging Face encoder (sol_ext.driver.text)
    text_column: Optional[str] = setting(
        None, "column of free text (a review, a description) read by --text-encoder instead of one-hot "
        "encoded; the other feature columns join it", "text", metavar="COLUMN")
    text_encoder: Optional[str] = setting(
        None, "folder of a Hugging Face encoder and its tokenizer (save_pretrained's), loaded offline and "
        "fine-tuned; the run folder keeps the fine-tuned one in text_encoder/", "text", metavar="FOLDER")
    max_length: int = setting(
        64, "tokens read of each text (longer ones are cut); a batch is padded to its longest text",
        "text", metavar="TOKENS")
    train_layers: Optional[int] = setting(
        None, "fine-tune only the top N transformer layers (the token embeddings and the layers below "
        "stay as loaded: faster on a CPU) (default: all)", "text", metavar="N")
    text_lr: float = setting(
        1e-4, "AdamW learning rate of the text encoder; --lr is that of the layers on top (the embedding "
        "layer, the other features' MLP)", "text", paper=2e-5)
    warmup: Optional[float] = setting(
        None, "share of the training steps over which the learning rates rise linearly from 0; they then "
        "fall linearly to 0 at the last step (default: 0.1 for text runs; text runs only)", "text",
        metavar="SHARE")
    # -- images
    image_size: Optional[int] = setting(
        None, "side every image is resized to (default: 64 for an image list, 28 for "
        "fashion-mnist-*)", "images", metavar="PIXELS")
    augment: Optional[str] = setting(
        None, "training augmentation: 'flip' flips at random, left to right; 'crop' also pads by 1/8 "
        "of the side and crops back at a random offset (the content keeps its scale); "
        "'resized-crop' is torchvision's RandomResizedCrop (scale 0.5-1) and a flip, which rescales "
        "blur and grain; 'none' (default: flip)", "images", choices=AUGMENTATIONS)
    workers: Optional[int] = setting(
        None, "DataLoader processes decoding and augmenting images; 0: in the training process "
        "(default: the free CPU cores, at most 8). The results do not depend on it", "images")
    normalize: bool = setting(
        True, "do not L2-normalize embeddings and centroids (SOL methods)", "method and encoder")
    # -- SOL hyperparameters (docs/math.md §1, §8, §11)
    sigma: Union[float, str] = setting(
        "auto", "noise-model std in ranks, or 'auto': picked from "
        + ", ".join(f"{s:g}" for s in SIGMA_GRID) + " by validation MAE, one training each",
        "SOL settings", paper=1.0)
    tau: int = setting(1, "similarity threshold in ranks (the paper's 3 lumps most pairs together "
                          "on few ranks)", "SOL settings", paper=3)
    margin: float = setting(0.25, "margin gamma", "SOL settings", paper=0.25)
    T: int = setting(1, "neighbour range of the discriminative loss", "SOL settings", paper=1)
    disc_weight: float = setting(1.0, "weight lambda of the discriminative loss", "SOL settings",
                                 paper=1.0)
    beta: float = setting(0.9, "outlier threshold of the 'outlier' rule", "SOL settings", paper=0.9)
    convention: str = setting(
        "paper", "loss convention; 'official' also floors the relabel step (docs/math.md §10.5)",
        "SOL settings", choices=("paper", "official"))
    pairs: str = setting("all", "all pairs of a batch, or the authors' balanced sampler",
                         "SOL settings", choices=PAIR_MODES)
    pairs_per_class: int = setting(32, "pairs kept per order relation with --pairs balanced",
                                   "SOL settings")
    refine: Optional[bool] = setting(
        None, "relabel training labels after each epoch (--refine: default for sol) or never "
        "(--no-refine: default for sol-no-noise)", "SOL settings")
    relabel: str = setting(
        "posterior", "relabeling rule: 'posterior' moves a given label to the median of "
        "p(rank | x, label) where that puts --relabel-mass on one side of it (not in the paper); "
        "'outlier' = the paper's outlier rule, relabels accumulate", "SOL settings",
        choices=RELABEL_RULES, paper="outlier")
    relabel_mass: float = setting(0.98, "posterior mass needed to move a label", "SOL settings")
    # Either way the corrected labels are the run's output and the encoder trains on the given ones.
    label_noise: Union[float, str] = setting(
        "auto", "std of the label error in ranks for 'posterior' relabeling: 'auto' estimates it on "
        "the validation split and moves a label where --relabel-mass of p(rank | x, label) lies on "
        "one side of it; a known std (e.g. from labels annotated twice: std of their difference / "
        "sqrt 2) moves every label to that posterior's median. The encoder trains on the given "
        "labels either way", "SOL settings", metavar="STD")
    readout: str = setting(
        "cuts", "rank read-out (SOLHead's readout=): 'posterior' = posterior median of p(q|x) ~ freq(q) exp(-D[x,q]/t) "
        "(not in the paper); 'nearest' = argmin_q D[x,q] (paper eq. 6); 'cuts' = the expected rank "
        "under p(q|x) against a cut per rank, fitted to the training labels for least MAE (not in "
        "the paper; docs/math.md §12.4a)", "SOL settings", choices=READOUTS, paper="nearest")
    momentum: float = setting(
        0.5, "centroid momentum m (SOLHead's momentum=): centroids <- normalize(m*old + "
        "(1-m)*rule) each epoch; 0 = the paper", "SOL settings", paper=0.0)
    # model selection: the epoch of best MAE on a stratified split of the (noisy) training data
    val_fraction: float = setting(
        0.1, "share of the training data (noisy labels) held out to pick the best epoch; 0: the "
        "last epoch is the model (the paper)", "data", paper=0.0)
    patience: Optional[int] = setting(
        None, "stop after this many epochs without a better validation MAE (default: train every "
        "epoch)", "optimization", paper=None)
    # -- optimization
    lr: float = setting(1e-3, "Adam learning rate (the paper's 1e-4 fine-tunes a pretrained VGG16; "
                              "a small encoder from scratch needs more)", "optimization")
    weight_decay: Union[float, str] = setting(
        "auto", f"Adam's L2 weight decay; 'auto': {SOL_WEIGHT_DECAY_PER_RANK:g} x the number of "
        f"ranks for sol with the mlp encoder, else {BASELINE_WEIGHT_DECAY:g}", "optimization",
        paper=5e-4)
    weight_ema: Union[float, str] = setting(
        "auto", "evaluate, select and save an exponential moving average of the weights (this decay "
        "per training step; 0: the trained weights; 'auto': over the last "
        f"{WEIGHT_EMA_SHARE * 100:g} %% of the steps so far for sol, none for the baselines)",
        "optimization", metavar="DECAY", paper=0.0)
    epochs: int = setting(20, "passes over the training data", "optimization")
    batch_size: int = setting(64, "samples per training step (per process under torchrun)",
                              "optimization")
    seed: int = setting(0, "seed of the noise, the split, the initialization and the batches", None)
    device: str = setting("auto", "cpu, cuda, cuda:1, or auto: cuda when a GPU is available, else cpu",
                          "optimization")
    amp: bool = setting(
        False, "mixed precision: autocast to float16 with loss scaling on a GPU (bfloat16 on the "
        "CPU); the loss itself computes in float32", "optimization")
    backend: str = setting("auto", "kernel backend of the loss", "optimization",
                           choices=("auto", "fused", "reference"))
    # -- evaluation
    cs_theta: Optional[float] = setting(
        None, "CS threshold in label units (default: 2 rank steps)", "optimization")

    def __post_init__(self) -> None:
        self.hidden = tuple(int(h) for h in self.hidden)  # a list after a JSON round trip
        # "auto" (or None) resolves by the data; a written configuration says "auto" again, so a
        # template of the built-in data pointed at a file of one's own adds no noise to its labels
        self._noise_automatic = self.noise in (None, "auto")
        if self._noise_automatic:
            self.noise = "gaussian" if self.test_data is None and is_builtin(self.data) else "none"

    # -- derived settings -------------------------------------------------------------------
    @property
    def noise_automatic(self) -> bool:
        """Whether ``noise`` was resolved from ``"auto"`` (by the data) rather than given."""
        return getattr(self, "_noise_automatic", False)

    def check_ranks(self, num_ranks: int) -> None:
        """Refuse settings wider than the rank scale of data of ``num_ranks`` ranks: a tau that
        makes every pair "similar" beyond the scale's own width, or a sigma that spreads every
        label evenly over all ranks. (tau = n - 1, e.g. the default 1 on two ranks, orders no pair
        either, but the discriminative loss still learns; it is allowed.)"""
        if self.uses_centroids and self.tau >= max(num_ranks, 2):
            raise ValueError(f"tau={self.tau} makes every pair of the data's {num_ranks} ranks "
                             f"'similar' (|r_x - r_y| <= tau), so no pair is ordered; expected tau in "
                             f"0 … {max(num_ranks - 2, 0)}.")
        if self.method == "sol" and self.sigma != "auto" and float(self.sigma) > num_ranks:
            raise ValueError(f"sigma={self.sigma:g} ranks is wider than the data's {num_ranks} ranks: the "
                             f"noise model then makes every rank about equally likely for any label, "
                             f"and the loss carries no order; expected 0 < sigma <= {num_ranks}.")

    def augmentation(self, kind: str) -> str:
        """The training augmentation for data of ``kind``: ``augment``, by default "flip" for images
        and "none" otherwise; asking for one on vectors is an error."""
        if kind != "images":
            if self.augment not in (None, "none"):
                raise ValueError(f"augment={self.augment} applies to images; the data are {kind}: "
                                 "leave it out.")
            return "none"
        # measured (docs/images.md): the flip alone beat no augmentation on fashion-mnist-blur
        # (test MAE 0.091 vs 0.133 at 20 epochs); pad-and-crop did not (0.136), a resized crop,
        # which rescales the blur the ranks measure, was far worse (0.36 vs 0.15 at 5 epochs)
        return "flip" if self.augment is None else self.augment

    def column_list(self, name: str) -> list[str]:
        """The columns of the comma-separated setting ``name`` (``feature_columns``, ...)."""
        text = getattr(self, name)
        return [] if text is None else [c.strip() for c in text.split(",")]

    @property
    def uses_centroids(self) -> bool:
        return self.method in ("sol", "sol-no-noise")

    @property
    def kernel_sigma(self) -> float:
        """sigma of the noise kernel actually used (tiny for ``sol-no-noise``)."""
        if self.method == "sol-no-noise":
            return NO_NOISE_SIGMA
        if self.sigma == "auto":
            raise ValueError("sigma 'auto' must be resolved (sol_ext.driver.train.SigmaSearch) before "
                             "the noise kernel is built.")
        return float(self.sigma)

    @property
    def reads_text(self) -> bool:
        """Whether the run reads a text column with a text encoder (``text_column``)."""
        return self.text_column is not None

    @property
    def warmup_share(self) -> float:
        """The share of the steps the learning rates warm up over (text runs)."""
        return TEXT_WARMUP if self.warmup is None else float(self.warmup)

    def weight_decay_for(self, num_ranks: int, encoder: str) -> float:
        """Adam's weight decay of a run on ``num_ranks`` ranks with the resolved ``encoder``
        (resolves ``"auto"``: the SOL methods' per-rank decay applies to the MLP encoder only; a text
        encoder's AdamW decays by TEXT_WEIGHT_DECAY)."""
        if self.weight_decay != "auto":
            return float(self.weight_decay)
        if encoder == "text":
            return TEXT_WEIGHT_DECAY
        if self.uses_centroids and encoder == "mlp":
            return SOL_WEIGHT_DECAY_PER_RANK * num_ranks
        return BASELINE_WEIGHT_DECAY

    @property
    def selects_model(self) -> bool:
        """Whether a validation split picks the final epoch (else: the last epoch)."""
        return self.val_fraction > 0

    @property
    def searches_sigma(self) -> bool:
        """Whether a run picks sigma by a search (one training per candidate of :data:`SIGMA_GRID`)."""
        return self.method == "sol" and self.sigma == "auto" and self.selects_model

    @property
    def refines(self) -> bool:
        """Whether labels are refined after each epoch (SOL only; default on for ``sol``)."""
        if not self.uses_centroids:
            return False
        return self.method == "sol" if self.refine is None else bool(self.refine)

    def validate(self) -> "TrainConfig":
        """Check every value; raise ``ValueError`` naming the bad one and the expected range (the
        first bad one, in the order below)."""
        self._check_finite()
        self._check_choices()
        self._check_data()
        self._check_sol()
        self._check_training()
        self._check_model()
        self._check_text()
        return self

    def _check_text(self) -> None:
        """A text column and its encoder come together, on a table file, with the text encoder."""
        _need((self.text_column is None) == (self.text_encoder is None),
              "text_column= names the column a text encoder reads and text_encoder= the encoder's folder: "
              + ("pass text_encoder= too (a folder with a Hugging Face model and its tokenizer)."
                 if self.text_encoder is None else "pass text_column= too (the column of texts)."))
        _need(not self.reads_text or not is_builtin(self.data),
              f"text_column= names a column of a table file of yours; the built-in data set {self.data!r} has "
              "no text: pass --data a table with a text column.")
        _need(not self.reads_text or self.encoder in ("auto", "text"),
              f"--encoder {self.encoder}: a text run's encoder is text_encoder=; leave --encoder out.")
        _need(self.encoder != "text" or self.reads_text,
              "--encoder text reads a text column: pass text_column= and text_encoder=.")
        _need(2 <= self.max_length <= MAX_TEXT_TOKENS,
              f"max_length={self.max_length} is out of range; expected 2 … {MAX_TEXT_TOKENS} tokens per text.")
        _need(self.train_layers is None or self.train_layers >= 1,
              f"train_layers={self.train_layers} must be at least 1 (the top layer), or left out to "
              "fine-tune every layer.")
        _need(self.text_lr > 0 and self.text_lr <= MAX_LR,
              f"text_lr={self.text_lr:g} is out of range; expected a learning rate > 0 (default 1e-4).")
        _need(self.warmup is None or 0.0 <= self.warmup < 1.0,
              f"warmup={self.warmup} is out of range; expected a share of the steps in [0, 1).")
        for name in ("warmup", "train_layers"):
            _need(getattr(self, name) is None or self.reads_text,
                  f"{name}= applies to text runs (text_column=, text_encoder=); leave {name}= out.")

    def _check_finite(self) -> None:
        """Every number is finite."""
        # every number first: an infinite or NaN setting is the cause, not what it leads to (an
        # infinite weight decay diverges the training, which would blame the learning rate).
        # kappa, sigma and label_noise say "finite" in their own checks below.
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            _need(f.name in ("kappa", "sigma", "label_noise") or not isinstance(value, float)
                  or math.isfinite(value),
                  f"{f.name}={value} is not a finite number; expected a finite value.")

    def _check_choices(self) -> None:
        """The method, the encoder, the pair set, the read-out, the loss convention and every other
        setting of a fixed set of values are known ones."""
        _need(self.method in METHODS,
              f"unknown method {self.method!r}; expected one of {', '.join(METHODS)}.")
        if self.encoder != "text":  # a text run's encoder is its text_encoder folder
            check_encoder_name(self.encoder)
        _need(self.pairs in PAIR_MODES,
              f"unknown pair set {self.pairs!r}; expected one of {', '.join(PAIR_MODES)}.")
        _need(self.readout in READOUTS,
              f"unknown readout {self.readout!r}; expected one of {', '.join(READOUTS)}.")
        _need(self.convention in ("paper", "official"),
              f"unknown convention {self.convention!r}; expected 'paper' or 'official'.")
        # every other setting with a fixed set of values: a --config file is not held to the
        # option's choices by the parser
        for f in dataclasses.fields(self):
            choices, value = f.metadata.get("choices"), getattr(self, f.name)
            if choices is not None and value is not None and f.name not in _CHECKED_WITH_THEIR_RANGE:
                _need(value in choices, f"{f.name}={value!r} is not one of {', '.join(choices)}.")

    def _check_data(self) -> None:
        """The added noise, the test split, the columns and the label scale fit the data."""
        _need(math.isfinite(self.kappa) and self.kappa >= 0,
              f"kappa must be a finite number >= 0, got {self.kappa}.")
        _need(0.0 <= self.noise_fraction <= 1.0,
              f"noise fraction must be in [0, 1], got {self.noise_fraction}.")
        _need(0.0 <= self.test_fraction < 1.0,
              f"test_fraction={self.test_fraction:g} is out of range; expected the share of the data "
              "held out as the test set, at least 0 (no test set: every row trains) and below 1.")
        _need(self.feature_columns is None or self.drop_columns is None,
              "feature_columns= lists the columns to use and drop_columns= those to leave out: pass "
              "one of them.")
        for name in ("id_column", "feature_columns", "drop_columns", "categorical"):
            _need(getattr(self, name) is None or not is_builtin(self.data),
                  f"{name}= applies to a table file of yours; the built-in data set {self.data!r} has "
                  f"its own columns: leave {name}= out.")
        for name in ("feature_columns", "drop_columns", "categorical"):
            text = getattr(self, name)
            entries = [] if text is None else [c.strip() for c in text.split(",")]
            if "" in entries:  # "a,,b": a typo, or a column's name lost
                raise ValueError(f"{name}={text!r} has an empty entry (entry {entries.index('') + 1} of "
                                 f"{len(entries)}); name one column between each pair of commas, e.g. a,b.")
        _need(self.test_label_column is None or self.test_data is not None,
              "test_label_column= names the label column of test_data=; there is no test_data=.")
        for name in ("label_min", "label_max", "label_step"):
            value = getattr(self, name)
            _need(value is None or math.isfinite(value),
                  f"{name}={value} is not a finite number; expected a label value.")
            _need(value is None or not is_builtin(self.data),
                  f"{name}= sets the label scale of a file of yours; the built-in data set "
                  f"{self.data!r} has its own: leave {name}= out.")
        _need(self.label_step is None or self.label_step > 0,
              f"label_step={self.label_step} must be > 0 (label units per rank).")
        _need(self.label_min is None or self.label_max is None or self.label_min < self.label_max,
              f"label_min={self.label_min} must be below label_max={self.label_max}.")

    def _check_sol(self) -> None:
        """SOL's noise width, its relabeling rule and the centroids' momentum."""
        _need(self.sigma == "auto" or (isinstance(self.sigma, (int, float)) and self.sigma > 0
                                       and math.isfinite(self.sigma)),
              f"sigma must be a finite number > 0 or 'auto', got {self.sigma!r}.")
        _need(self.relabel in RELABEL_RULES,
              f"unknown relabel rule {self.relabel!r}; expected one of {', '.join(RELABEL_RULES)}.")
        _need(0.5 <= self.relabel_mass < 1.0,
              f"relabel mass must be in [0.5, 1), got {self.relabel_mass}.")
        _need(self.label_noise == "auto" or (
             isinstance(self.label_noise, (int, float)) and not isinstance(self.label_noise, bool)
             and math.isfinite(self.label_noise) and self.label_noise >= 0),
              f"label noise must be 'auto' or a finite std in ranks >= 0, got {self.label_noise!r}.")
        _need(self.label_noise == "auto" or self.relabel == "posterior",
              "a label noise std is used by the posterior relabeling rule; it does not apply to "
              f"relabel rule {self.relabel!r}.")
        _need(0.0 <= self.momentum < 1.0,
              f"momentum must be in [0, 1), got {self.momentum}.")

    def _check_training(self) -> None:
        """Model selection, the loss's weights and the optimizer's steps."""
        _need(0.0 <= self.val_fraction < 1.0,
              f"validation fraction must be in [0, 1), got {self.val_fraction}.")
        _need(self.patience is None or self.patience >= 1,
              f"patience must be >= 1 epoch (or unset), got {self.patience}.")
        _need(self.patience is None or self.val_fraction > 0,
              "patience needs a validation split (validation fraction > 0).")
        _need(self.tau >= 0, f"tau must be an integer >= 0, got {self.tau}.")
        _need(self.margin >= 0, f"margin must be >= 0, got {self.margin}.")
        _need(self.disc_weight >= 0, f"disc weight must be >= 0, got {self.disc_weight}.")
        _need(self.T >= 1, f"T must be an integer >= 1, got {self.T}.")
        _need(0.0 < self.beta <= 1.0, f"beta must be in (0, 1], got {self.beta}.")
        _need(self.lr > 0, f"learning rate must be > 0, got {self.lr}.")
        _need(self.lr <= MAX_LR, f"lr={self.lr:g} is too large: Adam's first step would overflow "
                                 f"float32; expected at most lr={MAX_LR:g}.")
        _need(self.weight_decay == "auto" or (isinstance(self.weight_decay, (int, float))
                                              and not isinstance(self.weight_decay, bool)
                                              and self.weight_decay >= 0),
              f"weight decay must be 'auto' or a number >= 0, got {self.weight_decay!r}.")
        _need(self.weight_ema == "auto" or (isinstance(self.weight_ema, (int, float))
                                            and not isinstance(self.weight_ema, bool)
                                            and 0.0 <= self.weight_ema < 1.0),
              f"weight EMA decay must be 'auto' or in [0, 1) (0: no average), got {self.weight_ema!r}.")
        _need(1 <= self.epochs <= MAX_EPOCHS,
              f"epochs={self.epochs} is out of range; expected 1 … {MAX_EPOCHS} epochs.")
        _need(self.batch_size >= 2, f"batch size must be >= 2 (pairs need two samples), "
                                    f"got {self.batch_size}.")

    def _check_model(self) -> None:
        """The encoder's shape, its pretrained weights, image handling and the seed."""
        _need(1 <= self.embedding_dim <= MAX_EMBEDDING_DIM,
              f"embedding dim must be in 1 … {MAX_EMBEDDING_DIM}, got {self.embedding_dim}.")
        _need(all(h >= 1 for h in self.hidden), f"hidden widths must be >= 1, got {self.hidden}.")
        _need(self.pairs_per_class >= 1,
              f"pairs per class must be >= 1, got {self.pairs_per_class}.")
        _need(0 <= self.seed <= 2**63 - 1, f"seed must be in 0 … 2**63 - 1, got {self.seed}.")
        _need(self.cs_theta is None or self.cs_theta >= 0,
              f"CS threshold must be >= 0, got {self.cs_theta}.")
        _need(self.weights is None or is_pretrainable(self.encoder),
              f"--weights applies to a pretrained encoder (vgg16bn or a torchvision model such as "
              f"resnet18), not to --encoder {self.encoder}.")
        _need(self.image_size is None or (isinstance(self.image_size, int) and not isinstance(
             self.image_size, bool) and 1 <= self.image_size <= MAX_IMAGE_SIZE),
              f"image size must be a side of 1 … {MAX_IMAGE_SIZE} pixels, got {self.image_size!r}.")
        _need(self.augment is None or self.augment in AUGMENTATIONS,
              f"unknown augmentation {self.augment!r}; expected one of {', '.join(AUGMENTATIONS)}.")
        _need(self.workers is None or (isinstance(self.workers, int) and self.workers >= 0),
              f"workers must be an integer >= 0 (0: load in the training process), got {self.workers!r}.")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["hidden"] = list(self.hidden)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown configuration keys {sorted(unknown)}; the checkpoint was "
                             f"written by another version of sol_ext.")
        return cls(**d)


# The settings of the paper's Algorithm 1 (docs/math.md §8, §11) where our defaults differ, from each
# field's setting(paper=...); `--paper` applies them, so the published procedure is reproduced with
# one switch.
PAPER_SETTINGS: dict[str, Any] = {f.name: f.metadata["paper"] for f in dataclasses.fields(TrainConfig)
                                  if f.metadata["paper"] is not _NOT_IN_PAPER}


def option_of(name: str) -> dict[str, Any]:
    """The command-line option of the TrainConfig field ``name``: :func:`setting`'s arguments, the
    field's ``default`` and the ``flag`` it is spelled with."""
    field = {f.name: f for f in dataclasses.fields(TrainConfig)}[name]
    return {**field.metadata, "default": field.default,
            "flag": field.metadata["flag"] or "--" + name.replace("_", "-")}


def setting_kinds() -> dict[str, tuple[str, ...]]:
    """TrainConfig field -> the kinds of value it takes, from its type hint: ``"str"``, ``"int"``,
    ``"float"`` (an integer is taken as a float), ``"bool"``, ``"int list"``, and ``"auto"`` (the
    string "auto") beside ``"float"`` for a number or "auto". Optional fields take the same kinds
    (None is "unset", which the command line and the file leave out)."""
    hints = typing.get_type_hints(TrainConfig)
    simple = {str: "str", int: "int", float: "float", bool: "bool"}
    kinds = {}
    for f in dataclasses.fields(TrainConfig):
        hint = hints[f.name]
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if typing.get_origin(hint) is Union and len(args) == 1:  # Optional[X]
            hint = args[0]
        if hint in simple:
            kinds[f.name] = (simple[hint],)
        elif hint == Union[float, str]:  # a number or "auto" (sigma, label_noise, weight_decay, ...)
            kinds[f.name] = ("float", "auto")
        elif hint == Tuple[int, ...]:
            kinds[f.name] = ("int list",)
        else:  # a new kind of field: say so where it is declared, not as a wrong file later
            raise TypeError(f"TrainConfig.{f.name}: no command-line form for {hint}")
    return kinds


def config_mismatches(saved: TrainConfig, current: TrainConfig) -> list[str]:
    """``"field: saved -> current"`` for each field that a resumed run may not change."""
    a, b = saved.to_dict(), current.to_dict()
    return [f"{k}: {a[k]!r} -> {b[k]!r}" for k in a
            if k not in CONFIG_FIELDS_FREE_ON_RESUME and a[k] != b[k]]
