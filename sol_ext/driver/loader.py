"""How a run's inputs reach the model: sliced from a tensor, or decoded, augmented and batched by a
``torch.utils.data.DataLoader``.

Vectors, and images held in memory without augmentation, stay one tensor on the device and a batch
is an index into it. Image files (:class:`~sol_ext.driver.data.ImageFiles`), and images that are
augmented, go through a DataLoader: ``workers`` processes decode and transform the samples of each
batch, pinned in memory for the copy to a GPU. Memory then does not grow with the number of images
(with glibc's malloc, only once its mmap threshold is fixed: :func:`keep_large_buffers_off_heap`).

Augmentation is random, yet a run is reproducible with any number of workers: every sample of a
training batch gets a seed drawn from the run's generator in the main process, and its transform
runs under that seed (:class:`SampleSet`), wherever it runs.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
from typing import Callable, Iterator, Optional, Sequence

import torch
from torch import nn

from ..centroids import embed
from .data import ImageFiles, TextRows

__all__ = ["AUGMENTATIONS", "training_transform", "SampleSet", "RunInputs", "auto_workers",
           "embedding_batch_size", "keep_large_buffers_off_heap", "MMAP_THRESHOLD"]

# glibc's default mmap threshold: blocks of at least this many bytes get their own mapping
MMAP_THRESHOLD = 128 * 1024
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)

# Training augmentation of images (docs/math.md does not cover it; docs/images.md):
# "crop": pad by 1/8 of the side (reflected) and crop back at a random offset, then a random
#         horizontal flip: the image content keeps its scale, so blur, grain or wrinkles (what many
#         rank scales measure) look as they do at test time;
# "resized-crop": torchvision's RandomResizedCrop (scale 0.5 … 1, aspect 3/4 … 4/3) and a flip,
#         the ImageNet recipe, which also zooms by up to 1.4x;
# "flip": the random horizontal flip alone;
# "none": the images as they are.
AUGMENTATIONS = ("crop", "resized-crop", "flip", "none")


def training_transform(augment: str, size: Sequence[int]) -> Optional[Callable[[torch.Tensor], torch.Tensor]]:
    """The random transform of a training image ``[C, H, W]`` (torchvision ``transforms.v2``), or
    ``None`` for ``augment="none"``. Evaluation and prediction use no transform."""
    if augment == "none":
        return None
    if augment not in AUGMENTATIONS:
        raise ValueError(f"augment={augment!r} is not an augmentation; expected one of "
                         f"{', '.join(AUGMENTATIONS)}.")
    try:
        from torchvision.transforms import v2
    except ImportError as exc:
        raise ImportError("image augmentation needs torchvision: pip install 'sol_ext[vision]' (or "
                          "torchvision matching your torch), or pass --augment none.") from exc
    size = (int(size[0]), int(size[1]))
    if augment == "flip":
        return v2.RandomHorizontalFlip()
    if augment == "crop":
        pad = max(1, min(size) // 8)
        crop = v2.RandomCrop(size, padding=pad, padding_mode="reflect" if pad < min(size) else "edge")
    else:
        crop = v2.RandomResizedCrop(size, scale=(0.5, 1.0), antialias=True)
    return v2.Compose([crop, v2.RandomHorizontalFlip()])


class SampleSet(torch.utils.data.Dataset):
    """Samples of ``images`` (a tensor ``[N, ...]`` or :class:`ImageFiles`), transformed.

    An item is ``(row, seed)``: the transform of that row runs with torch's random generator seeded
    by ``seed`` (and restored afterwards), so a sample's augmentation does not depend on which
    process, or how many, load it; seed ``None``: the row untransformed (evaluation).
    """

    def __init__(self, images: torch.Tensor | ImageFiles,
                 transform: Optional[Callable[[torch.Tensor], torch.Tensor]] = None):
        self.images = images
        self.transform = transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, item: tuple[int, Optional[int]]) -> torch.Tensor:
        row, seed = item
        x = self.images.read(row) if isinstance(self.images, ImageFiles) else self.images[row]
        if self.transform is None or seed is None:
            return x
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return self.transform(x)


@functools.lru_cache(maxsize=None)
def keep_large_buffers_off_heap() -> bool:
    """Fix glibc malloc's mmap threshold at its default, :data:`MMAP_THRESHOLD` (128 KiB), for
    this process and the loader workers it forks; returns whether it was set (False off glibc).

    glibc raises the threshold to the size of every mapped block that is freed (up to 32 MiB).
    After the first batch, the decoded images (0.6 MB each at 224 px, float32), the batches and
    the activations then come from the heap, and the small tensors that outlive a batch (an
    embedding pass keeps every batch's embeddings) are carved out of the freed holes, so the next
    image no longer fits in them and the heap grows by about one decoded image per image (the
    peak of ``sol-ext train`` at 224 px was 1.35 GB for 1,000 images, 3.79 GB for 6,000). Left at
    128 KiB, each such buffer is a mapping of its own, returned to the system when freed. A
    threshold set in the environment (``MALLOC_MMAP_THRESHOLD_``) is left as it is."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc" \
            or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def _init_worker(worker_id: int) -> None:
    """A loader worker's start: its own decoded images stay off the heap too (a forked worker
    inherits the setting; a spawned one sets it here)."""
    keep_large_buffers_off_heap()


def embedding_batch_size(kind: str, batch_size: int) -> int:
    """Rows per forward pass of the passes without gradient: at least 4,096 for vectors (each pass
    of a small MLP costs more in calls than in arithmetic: 200,000 rows take 0.12 s in passes of
    256, 0.04 s in passes of 4,096), the training batch for images, whose activations set the
    run's peak memory (resnet18 at 224 px on the CPU: 1.2 GB at 64 images, 2.6 GB at 256), and
    for texts, whose batches are padded to their longest text."""
    return batch_size if kind in ("images", "text") else max(4096, batch_size)


def auto_workers(processes_per_machine: int = 1) -> int:
    """Loader processes when ``--workers`` is not given: the CPU cores beside the training process
    (its share of them under torchrun), at most 8."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(0, min(8, cores // max(1, processes_per_machine) - 1))


class _BatchPlan:
    """The batches of rows of the next pass: the batch sampler of a DataLoader whose worker
    processes persist, refilled before each pass (training or embedding), so the workers start
    once per run instead of once per pass."""

    def __init__(self) -> None:
        self.batches: list[list[tuple[int, Optional[int]]]] = []

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def _worker_error(exc: Exception) -> Exception:
    """A DataLoader worker's exception carries the worker's traceback in its message; the last line
    of that traceback is the original message (an unreadable image, named)."""
    text = str(exc)
    if not text.startswith("Caught "):
        return exc
    last = text.strip().splitlines()[-1]
    original = last.split(": ", 1)[1] if ": " in last else last
    return type(exc)(original) if isinstance(exc, (ValueError, OSError)) else exc


class RunInputs:
    """One part of a run's inputs (the fitted rows, the validation split or the test set).

    Args:
        features: ``[N, ...]`` float32 tensor, or :class:`ImageFiles`.
        device: where the model runs.
        transform: the training transform (:func:`training_transform`), or ``None``.
        workers: DataLoader processes (0: load in this process).
    """

    def __init__(self, features: torch.Tensor | ImageFiles, device: torch.device,
                 transform: Optional[Callable[[torch.Tensor], torch.Tensor]] = None, workers: int = 0,
                 progress: str = ""):
        self.device = device
        self.transform = transform
        self.workers = int(workers)
        # a tqdm bar over the embedding passes that decode images (minutes on a large set), named
        # so; "" for none
        self.progress = progress
        self.loaded = isinstance(features, ImageFiles) or transform is not None
        if self.loaded:  # images decoded or copied sample by sample: each pass frees N of them
            keep_large_buffers_off_heap()
        # sliced tensors live on the device; loaded ones on the host, where the workers read them
        self.features = features if self.loaded else features.to(device)
        self._plan = _BatchPlan()
        self._loader: Optional[torch.utils.data.DataLoader] = None

    def __len__(self) -> int:
        return int(self.features.shape[0])

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(self.features.shape[1:])

    def placeholder(self) -> torch.Tensor | TextRows:
        """One input of these rows' shape (zeros; a text of one word), for the embedding width."""
        if isinstance(self.features, TextRows):
            return TextRows(["text"], torch.zeros(1, *self.sample_shape))
        return torch.zeros(1, *self.sample_shape)

    def _load(self, batches: list[list[tuple[int, Optional[int]]]]) -> Iterator[torch.Tensor]:
        pin = self.device.type == "cuda"
        if self._loader is None:
            # persistent workers: started once, and never shut down between passes, where a Ctrl-C
            # arriving during the shutdown would be swallowed by the iterator's __del__
            self._loader = torch.utils.data.DataLoader(
                SampleSet(self.features, self.transform), batch_sampler=self._plan,
                num_workers=self.workers, collate_fn=torch.stack, pin_memory=pin,
                persistent_workers=self.workers > 0, worker_init_fn=_init_worker)
        self._plan.batches = batches
        it = iter(self._loader)
        while True:
            try:
                x = next(it)
            except StopIteration:
                return
            except (ValueError, OSError) as exc:
                raise _worker_error(exc) from None
            yield x.to(self.device, non_blocking=pin)

    def training_batches(self, batches: list[torch.Tensor], generator: torch.Generator) -> Iterator[torch.Tensor]:
        """The inputs ``[b, ...]`` of each batch of rows, on the device, augmented. The seeds of the
        augmentation are drawn from ``generator`` here, before the first batch is loaded."""
        if not self.loaded:
            return (self.features[rows.to(self.device)] for rows in batches)
        if self.transform is None:
            plan = [[(int(r), None) for r in rows] for rows in batches]
        else:
            seeds = [torch.randint(0, 2**62, (rows.numel(),), generator=generator) for rows in batches]
            plan = [list(zip(rows.tolist(), s.tolist())) for rows, s in zip(batches, seeds)]
        return self._load(plan)

    @torch.no_grad()
    def embed(self, model: nn.Module, batch_size: int, rows: Optional[slice] = None) -> torch.Tensor:
        """Embeddings ``[k, d]`` of ``rows`` (default: all) in eval mode, without augmentation."""
        index = range(len(self))[rows if rows is not None else slice(None)]
        if isinstance(self.features, TextRows) and self.progress:
            return self._embed_texts(model, self.features[rows if rows is not None else slice(None)], batch_size)
        if not self.loaded:
            return embed(model, self.features[rows if rows is not None else slice(None)], batch_size,
                         self.device)
        plan = [[(i, None) for i in index[s:s + batch_size]] for s in range(0, len(index), batch_size)]
        if not plan:
            raise ValueError("embed: got an empty data set (0 rows); expected at least one sample.")
        was_training = model.training
        model.eval()
        bar = None
        if self.progress:
            from tqdm import tqdm

            bar = tqdm(total=len(index), desc=self.progress, unit="image", leave=False, dynamic_ncols=True)
        try:
            out = []
            for x in self._load(plan):
                out.append(model(x))
                if bar is not None:
                    bar.update(len(x))
            return torch.cat(out)
        finally:
            model.train(was_training)
            if bar is not None:
                bar.close()

    def _embed_texts(self, model: nn.Module, texts: TextRows, batch_size: int) -> torch.Tensor:
        """:meth:`embed` of rows of text with a bar (a text encoder's pass takes minutes on a CPU)."""
        from tqdm import tqdm

        was_training = model.training
        model.eval()
        bar = tqdm(total=len(texts), desc=self.progress, unit="text", leave=False, dynamic_ncols=True)
        try:
            out = []
            for start in range(0, len(texts), batch_size):
                out.append(model(texts[start:start + batch_size].to(self.device)))
                bar.update(min(batch_size, len(texts) - start))
            if not out:
                raise ValueError("embed: got an empty data set (0 rows); expected at least one sample.")
            return torch.cat(out)
        finally:
            model.train(was_training)
            bar.close()
