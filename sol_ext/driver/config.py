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
from dataclasses import dataclass
from typing import Any, Optional

from ..pairs import PAIR_MODES
from .data.dispatch import is_builtin
from .encoders import check_encoder_name, is_pretrainable
from .loader import AUGMENTATIONS

__all__ = ["METHODS", "COMPARE_METHODS", "INFERENCE_MODES", "RELABEL_RULES", "PAPER_SETTINGS", "SIGMA_GRID", "FALLBACK_SIGMA",
           "NO_NOISE_SIGMA", "WEIGHT_EMA_SHARE", "SOL_WEIGHT_DECAY_PER_RANK", "BASELINE_WEIGHT_DECAY",
           "MAX_IMAGE_SIZE", "MAX_EPOCHS", "TrainConfig", "CONFIG_FIELDS_FREE_ON_RESUME", "config_mismatches"]

METHODS = ("sol", "sol-no-noise", "l1", "ce", "corn")

# Rows of `sol-ext compare`: the methods, and "sol-paper" = sol with the paper's settings.
COMPARE_METHODS = (*METHODS, "sol-paper")

# Rank read-out of the SOL methods: the posterior median with a label-frequency prior, the paper's
# nearest expectation (eq. 6), or the expected rank against cuts fitted to the training labels (the
# default; neither it nor the median is in the paper); see TrainConfig.inference.
INFERENCE_MODES = ("posterior", "nearest", "cuts")

# Relabeling rule of "sol": "posterior" (default, not in the paper) or the paper's "outlier"
# rule (docs/math.md §8); see sol_ext.refine.
RELABEL_RULES = ("posterior", "outlier")

# The settings of the paper's Algorithm 1 (docs/math.md §8, §11) where our defaults differ; `--paper`
# applies them, so the published procedure is reproduced with one switch.
PAPER_SETTINGS: dict[str, Any] = {
    "sigma": 1.0, "tau": 3, "margin": 0.25, "T": 1, "disc_weight": 1.0, "beta": 0.9,
    "inference": "nearest", "relabel": "outlier", "centroid_momentum": 0.0,
    "val_fraction": 0.0, "patience": None, "weight_ema": 0.0, "weight_decay": 5e-4,
}

# sigma of the noise kernel for "sol-no-noise": P[q, j] = exp(-(j-q)^2 / 2e-6) / ... is the
# identity to float64 precision (the first off-diagonal term is exp(-5e5) = 0), so the loss is
# plain order learning with 0/1 ordering probabilities.
NO_NOISE_SIGMA = 1e-3

# Candidates of `--sigma auto` (the default), in ranks: picked by validation MAE (sol_ext.driver.tuning).
# Measured (docs/measured.md): 1 suits abalone's 29 ranks and wine-red, 0.25 the 8 blur
# levels of fashion-mnist-blur; 2 never won.
SIGMA_GRID = (0.25, 0.5, 1.0)
# sigma where "auto" cannot pick (no validation split): the paper's
FALLBACK_SIGMA = 1.0

# weight_ema="auto" (the default): for the SOL methods, an average of the weights over about this
# share of the steps so far (decay 1 - 1 / (share * step), sol_ext.driver.run.WeightAverage);
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

# Largest image side: far above any backbone's input, and it refuses a typo with a clear error.
MAX_IMAGE_SIZE = 4096

# Fields a resumed run may change: more epochs, patience, another device, kernel backend or number
# of loader processes (augmentation is seeded per sample: the workers do not change the numbers).
CONFIG_FIELDS_FREE_ON_RESUME = frozenset({"epochs", "patience", "device", "backend", "workers"})


@dataclass
class TrainConfig:
    """Everything that determines a run. Units: ranks unless said otherwise."""

    # data
    data: str = "abalone"                   # data set name or file path (sol_ext.driver.data.load_dataset)
    test_data: Optional[str] = None         # separate test file: then `data` is used whole for training
    label_column: Optional[str] = None      # label column of a CSV file
    delimiter: Optional[str] = None         # cell separator of a CSV file; None: sniffed
    test_fraction: float = 0.2
    # label noise added to the training labels (docs/math.md §9); None: "gaussian" on a built-in data set
    # (whose labels are clean: the noise shows what SOL recovers), "none" on a user's own file or
    # folder, whose labels are as noisy as they are
    noise: Optional[str] = None
    kappa: float = 0.3
    noise_fraction: float = 1.0
    # method and encoder
    method: str = "sol"
    # auto: mlp for vectors, cnn for images; or vgg16bn, or a torchvision classification model by
    # name (resnet18, resnet50, vgg16_bn, efficientnet_b0, convnext_tiny, vit_b_16, ...)
    encoder: str = "auto"
    embedding_dim: int = 16
    hidden: tuple[int, ...] = (128, 128)   # MLP widths
    weights: Optional[str] = None           # local state dict of a pretrained encoder (ImageNet)
    # images: side in pixels every image is resized to; None: 64 for image lists, 28 for Fashion-MNIST
    image_size: Optional[int] = None
    # training augmentation of images (sol_ext.driver.loader.AUGMENTATIONS); None: "flip" for images
    augment: Optional[str] = None
    workers: Optional[int] = None           # DataLoader processes for images; None: the free cores
    normalize: bool = True                  # L2-normalize embeddings and centroids (docs/math.md §10.4)
    # SOL hyperparameters (docs/math.md §1, §8, §11)
    sigma: float | str = "auto"            # picked from SIGMA_GRID on the validation split, or a number
    tau: int = 1                            # the paper's 3 lumps most pairs together on few ranks
    margin: float = 0.25
    T: int = 1
    disc_weight: float = 1.0
    beta: float = 0.9
    convention: str = "paper"               # "official" also floors the relabel step (docs/math.md §10.5)
    pairs: str = "all"                      # "all" pairs of a batch or the authors' "balanced" sampler
    pairs_per_class: int = 32
    refine: Optional[bool] = None           # relabeling of training labels; None: on for "sol" only
    # "posterior" (default, not in the paper): correct a given label from p(rank | x, label) (see
    # label_noise); "outlier": the paper's rule, every epoch, relabels trained on (docs/math.md §8)
    relabel: str = "posterior"
    relabel_mass: float = 0.98
    # std of the label error in ranks for the posterior rule: "auto" estimates it on the
    # validation split (centroids.fit_label_noise) and moves a label where `relabel_mass` of its
    # posterior lies on one side; a number is a std the user knows (e.g. from doubly annotated
    # samples), and every label moves to its posterior median. Either way the corrected labels
    # are the run's output and the encoder trains on the given ones.
    label_noise: float | str = "auto"
    # "cuts" (default, not in the paper): the expected rank under the posterior p(q|x) ∝ freq(q)
    # exp(-D/t) against a cut per rank fitted each epoch to the training split's labels for least
    # MAE (SOLHead.fit_cuts; docs/math.md §12.4a). "posterior": the median of that posterior, prior
    # and t fitted each epoch. "nearest": argmin_q D[x, q] (paper eq. 6)
    inference: str = "cuts"
    # centroids <- normalize(m * old + (1 - m) * rule) after each epoch; 0 is the paper's rule
    centroid_momentum: float = 0.5
    # model selection: the epoch of best MAE on a stratified split of the (noisy) training data
    val_fraction: float = 0.1               # 0: no split, the last epoch is the model (paper)
    patience: Optional[int] = None          # stop after this many epochs without improvement
    # optimization
    lr: float = 1e-3
    # Adam's L2 weight decay; "auto": SOL_WEIGHT_DECAY_PER_RANK x the number of ranks for the SOL
    # methods with the MLP encoder, else BASELINE_WEIGHT_DECAY (weight_decay_for)
    weight_decay: float | str = "auto"
    # exponential moving average of the weights over the training steps, this decay per step: the
    # averaged weights are the model every pass over the data uses (centroids, read-out, model
    # selection, checkpoints); training steps update the trained weights. 0: no average; "auto":
    # over the last WEIGHT_EMA_SHARE of the steps so far for the SOL methods, none for the baselines
    weight_ema: float | str = "auto"
    epochs: int = 20
    batch_size: int = 64
    seed: int = 0
    device: str = "cpu"
    amp: bool = False                       # autocast: float16 + loss scaling on CUDA, bfloat16 on CPU
    backend: str = "auto"
    # evaluation
    cs_theta: Optional[float] = None        # CS threshold in label units; None: 2 rank steps

    def __post_init__(self) -> None:
        self.hidden = tuple(int(h) for h in self.hidden)  # a list after a JSON round trip
        if self.noise is None:
            self.noise = "gaussian" if self.test_data is None and is_builtin(self.data) else "none"

    # -- derived settings -------------------------------------------------------------------
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

    @property
    def uses_centroids(self) -> bool:
        return self.method in ("sol", "sol-no-noise")

    @property
    def kernel_sigma(self) -> float:
        """sigma of the noise kernel actually used (tiny for ``sol-no-noise``)."""
        if self.method == "sol-no-noise":
            return NO_NOISE_SIGMA
        if self.sigma == "auto":
            raise ValueError("sigma 'auto' must be resolved (sol_ext.driver.tuning.select_sigma) before "
                             "the noise kernel is built.")
        return float(self.sigma)

    def weight_decay_for(self, num_ranks: int, encoder: str) -> float:
        """Adam's weight decay of a run on ``num_ranks`` ranks with the resolved ``encoder``
        (resolves ``"auto"``: the SOL methods' per-rank decay applies to the MLP encoder only)."""
        if self.weight_decay != "auto":
            return float(self.weight_decay)
        if self.uses_centroids and encoder == "mlp":
            return SOL_WEIGHT_DECAY_PER_RANK * num_ranks
        return BASELINE_WEIGHT_DECAY

    @property
    def selects_model(self) -> bool:
        """Whether a validation split picks the final epoch (else: the last epoch)."""
        return self.val_fraction > 0

    @property
    def refines(self) -> bool:
        """Whether labels are refined after each epoch (SOL only; default on for ``sol``)."""
        if not self.uses_centroids:
            return False
        return self.method == "sol" if self.refine is None else bool(self.refine)

    def validate(self) -> "TrainConfig":
        """Check every value; raise ``ValueError`` naming the bad one and the expected range."""
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ValueError(msg)

        # every number first: an infinite or NaN setting is the cause, not what it leads to (an
        # infinite weight decay diverges the training, which would blame the learning rate).
        # kappa, sigma and label_noise say "finite" in their own checks below.
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            need(f.name in ("kappa", "sigma", "label_noise") or not isinstance(value, float)
                 or math.isfinite(value),
                 f"{f.name}={value} is not a finite number; expected a finite value.")
        need(self.method in METHODS,
             f"unknown method {self.method!r}; expected one of {', '.join(METHODS)}.")
        check_encoder_name(self.encoder)
        need(self.pairs in PAIR_MODES,
             f"unknown pair set {self.pairs!r}; expected one of {', '.join(PAIR_MODES)}.")
        need(self.inference in INFERENCE_MODES,
             f"unknown inference {self.inference!r}; expected one of {', '.join(INFERENCE_MODES)}.")
        need(self.convention in ("paper", "official"),
             f"unknown convention {self.convention!r}; expected 'paper' or 'official'.")
        need(math.isfinite(self.kappa) and self.kappa >= 0,
             f"kappa must be a finite number >= 0, got {self.kappa}.")
        need(0.0 <= self.noise_fraction <= 1.0,
             f"noise fraction must be in [0, 1], got {self.noise_fraction}.")
        need(0.0 < self.test_fraction < 1.0,
             f"test fraction must be in (0, 1), got {self.test_fraction}.")
        need(self.sigma == "auto" or (isinstance(self.sigma, (int, float)) and self.sigma > 0
                                      and math.isfinite(self.sigma)),
             f"sigma must be a finite number > 0 or 'auto', got {self.sigma!r}.")
        need(self.relabel in RELABEL_RULES,
             f"unknown relabel rule {self.relabel!r}; expected one of {', '.join(RELABEL_RULES)}.")
        need(0.5 <= self.relabel_mass < 1.0,
             f"relabel mass must be in [0.5, 1), got {self.relabel_mass}.")
        need(self.label_noise == "auto" or (
            isinstance(self.label_noise, (int, float)) and not isinstance(self.label_noise, bool)
            and math.isfinite(self.label_noise) and self.label_noise >= 0),
             f"label noise must be 'auto' or a finite std in ranks >= 0, got {self.label_noise!r}.")
        need(self.label_noise == "auto" or self.relabel == "posterior",
             "a label noise std is used by the posterior relabeling rule; it does not apply to "
             f"relabel rule {self.relabel!r}.")
        need(0.0 <= self.centroid_momentum < 1.0,
             f"centroid momentum must be in [0, 1), got {self.centroid_momentum}.")
        need(0.0 <= self.val_fraction < 1.0,
             f"validation fraction must be in [0, 1), got {self.val_fraction}.")
        need(self.patience is None or self.patience >= 1,
             f"patience must be >= 1 epoch (or unset), got {self.patience}.")
        need(self.patience is None or self.val_fraction > 0,
             "patience needs a validation split (validation fraction > 0).")
        need(self.tau >= 0, f"tau must be an integer >= 0, got {self.tau}.")
        need(self.margin >= 0, f"margin must be >= 0, got {self.margin}.")
        need(self.disc_weight >= 0, f"disc weight must be >= 0, got {self.disc_weight}.")
        need(self.T >= 1, f"T must be an integer >= 1, got {self.T}.")
        need(0.0 < self.beta <= 1.0, f"beta must be in (0, 1], got {self.beta}.")
        need(self.lr > 0, f"learning rate must be > 0, got {self.lr}.")
        need(self.lr <= MAX_LR, f"lr={self.lr:g} is too large: Adam's first step would overflow "
                                f"float32; expected at most lr={MAX_LR:g}.")
        need(self.weight_decay == "auto" or (isinstance(self.weight_decay, (int, float))
                                             and not isinstance(self.weight_decay, bool)
                                             and self.weight_decay >= 0),
             f"weight decay must be 'auto' or a number >= 0, got {self.weight_decay!r}.")
        need(self.weight_ema == "auto" or (isinstance(self.weight_ema, (int, float))
                                           and not isinstance(self.weight_ema, bool)
                                           and 0.0 <= self.weight_ema < 1.0),
             f"weight EMA decay must be 'auto' or in [0, 1) (0: no average), got {self.weight_ema!r}.")
        need(1 <= self.epochs <= MAX_EPOCHS,
             f"epochs={self.epochs} is out of range; expected 1 … {MAX_EPOCHS} epochs.")
        need(self.batch_size >= 2, f"batch size must be >= 2 (pairs need two samples), "
                                   f"got {self.batch_size}.")
        need(1 <= self.embedding_dim <= MAX_EMBEDDING_DIM,
             f"embedding dim must be in 1 … {MAX_EMBEDDING_DIM}, got {self.embedding_dim}.")
        need(all(h >= 1 for h in self.hidden), f"hidden widths must be >= 1, got {self.hidden}.")
        need(self.pairs_per_class >= 1,
             f"pairs per class must be >= 1, got {self.pairs_per_class}.")
        need(0 <= self.seed <= 2**63 - 1, f"seed must be in 0 … 2**63 - 1, got {self.seed}.")
        need(self.cs_theta is None or self.cs_theta >= 0,
             f"CS threshold must be >= 0, got {self.cs_theta}.")
        need(self.weights is None or is_pretrainable(self.encoder),
             f"--weights applies to a pretrained encoder (vgg16bn or a torchvision model such as "
             f"resnet18), not to --encoder {self.encoder}.")
        need(self.image_size is None or (isinstance(self.image_size, int) and not isinstance(
            self.image_size, bool) and 1 <= self.image_size <= MAX_IMAGE_SIZE),
             f"image size must be a side of 1 … {MAX_IMAGE_SIZE} pixels, got {self.image_size!r}.")
        need(self.augment is None or self.augment in AUGMENTATIONS,
             f"unknown augmentation {self.augment!r}; expected one of {', '.join(AUGMENTATIONS)}.")
        need(self.workers is None or (isinstance(self.workers, int) and self.workers >= 0),
             f"workers must be an integer >= 0 (0: load in the training process), got {self.workers!r}.")
        return self

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["hidden"] = list(self.hidden)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainConfig":
        d = dict(d)
        if "vgg_weights" in d:  # the name before torchvision backbones took weights too
            d["weights"] = d.pop("vgg_weights")
        if "augment" not in d:  # a run from before augmentation existed trained without it
            d["augment"] = "none"
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown configuration keys {sorted(unknown)}; the checkpoint was "
                             f"written by another version of sol_ext.")
        return cls(**d)


def config_mismatches(saved: TrainConfig, current: TrainConfig) -> list[str]:
    """``"field: saved -> current"`` for each field that a resumed run may not change."""
    a, b = saved.to_dict(), current.to_dict()
    return [f"{k}: {a[k]!r} -> {b[k]!r}" for k in a
            if k not in CONFIG_FIELDS_FREE_ON_RESUME and a[k] != b[k]]
