"""Text runs: a column of free text read by a Hugging Face encoder, fine-tuned end to end with SOL
(``sol-ext train --text-column COLUMN --text-encoder FOLDER``; extra ``text``).

* :func:`load_text_model`: the encoder (``AutoModel``, no task head) and its tokenizer from a folder,
  offline.
* :class:`TextEncoder`: the run's encoder. Each batch of :class:`~sol_ext.driver.data.TextRows` is
  tokenized as it comes, padded to its longest text (at most ``max_length`` tokens); the last hidden
  states are averaged over the attention mask (:func:`sol_ext.hf.pool_states`, as
  :class:`sol_ext.hf.SOLTextModel` pools them), so padding never changes an embedding. The other
  feature columns go through an MLP beside it; the two are concatenated and the embedding layer maps
  them to ``d``.
* :func:`save_text_encoder` and :func:`check_text_encoder`: the run folder's ``text_encoder/``, the
  fine-tuned encoder and tokenizer (``save_pretrained``), with the CRC-32 of each file kept in
  ``best.pt``, so a changed or damaged file is refused instead of read as another tokenizer.
"""

from __future__ import annotations

import contextlib
import zlib
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import torch
from torch import nn

from .data import TextRows
from .encoders import MLP

__all__ = ["TEXT_INSTALL", "TEXT_ENCODER_DIR", "TextEncoder", "require_transformers", "load_text_model",
           "build_text_encoder", "save_text_encoder", "check_text_encoder", "file_checksums",
           "encoder_parameters"]

TEXT_INSTALL = "pip install 'sol_ext[text]'"
TEXT_ENCODER_DIR = "text_encoder"  # in a run folder: the fine-tuned encoder and its tokenizer


def require_transformers() -> Any:
    """The ``transformers`` package, or an ImportError of one line saying how to install it."""
    try:
        import transformers
    except ImportError:
        raise ImportError(f"text runs (--text-column, --text-encoder) need Hugging Face transformers: "
                          f"{TEXT_INSTALL} (or pip install transformers)") from None
    return transformers


def load_text_model(folder: str | Path, flag: str = "--text-encoder") -> tuple[nn.Module, Any]:
    """``(encoder, tokenizer)`` from ``folder`` (what ``save_pretrained`` writes), offline: nothing is
    downloaded. Errors name ``flag`` and say what the folder must hold."""
    transformers = require_transformers()
    path = Path(folder)
    expected = ("a folder holding a Hugging Face model and its tokenizer, as save_pretrained writes them "
                "(config.json, the weights, tokenizer files)")
    if not path.is_dir():
        raise FileNotFoundError(f"{flag} {folder}: {'not a folder' if path.exists() else 'no such folder'}; "
                                f"expected {expected}")
    if not (path / "config.json").is_file():
        raise ValueError(f"{flag} {folder} is not a Hugging Face model folder (it has no config.json); "
                         f"expected {expected}")
    try:
        with _quiet(transformers):
            model = transformers.AutoModel.from_pretrained(path, local_files_only=True)
            tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"{flag} {folder}: cannot load a model and tokenizer from it ({first[:300]}); "
                         f"expected {expected}") from None
    if not isinstance(getattr(model.config, "hidden_size", None), int):
        raise ValueError(f"{flag} {folder}: its model ({type(model).__name__}) has no config.hidden_size; "
                         "expected a text encoder such as BERT, MiniLM or RoBERTa")
    return model, tokenizer


@contextlib.contextmanager
def _quiet(transformers: Any) -> Iterator[None]:
    """transformers without its notes and progress bars (loading and saving weights), which would
    interleave with the run's epoch lines."""
    verbosity = transformers.logging.get_verbosity()
    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        yield
    finally:
        transformers.logging.set_verbosity(verbosity)
        if bars:
            transformers.utils.logging.enable_progress_bar()


def _transformer_layers(model: nn.Module) -> Optional[nn.ModuleList]:
    """The stack of transformer layers of a BERT-like (``encoder.layer``) or DistilBERT-like
    (``transformer.layer``) encoder, or None."""
    for owner in ("encoder", "transformer"):
        layers = getattr(getattr(model, owner, None), "layer", None)
        if isinstance(layers, nn.ModuleList):
            return layers
    return None


class TextEncoder(nn.Module):
    """A Hugging Face encoder with the other features' MLP and the embedding layer:
    :class:`~sol_ext.driver.data.TextRows` ``[B]`` -> ``[B, d]``.

    Args:
        model: the encoder (``AutoModel``), its outputs' ``last_hidden_state [B, L, hidden_size]``.
        tokenizer: its tokenizer.
        feature_count: ``F``, the other feature columns (0: the text alone).
        embedding_dim: ``d``.
        hidden: the MLP's hidden widths.
        max_length: tokens read of each text.
        train_layers: fine-tune only this many top transformer layers (None: all of the encoder).
    """

    def __init__(self, model: nn.Module, tokenizer: Any, feature_count: int, embedding_dim: int,
                 hidden: Sequence[int] = (128, 128), max_length: int = 64, train_layers: Optional[int] = None):
        super().__init__()
        self.text = model
        self.tokenizer = tokenizer  # not a module: its files are saved beside the encoder's
        self.max_length = int(max_length)
        positions = getattr(model.config, "max_position_embeddings", None)
        if isinstance(positions, int) and self.max_length > positions:
            raise ValueError(f"max_length={self.max_length} is more tokens than the encoder reads ({positions}); "
                             f"pass max_length= of at most {positions}")
        self.table = MLP(feature_count, embedding_dim, hidden) if feature_count else None
        width = model.config.hidden_size + (embedding_dim if self.table is not None else 0)
        self.embedding = nn.Linear(width, embedding_dim)
        if train_layers is not None:
            self._train_top_layers(int(train_layers))

    def _train_top_layers(self, count: int) -> None:
        layers = _transformer_layers(self.text)
        if layers is None:
            raise ValueError(f"train_layers={count}: the encoder ({type(self.text).__name__}) has no stack of "
                             "transformer layers to choose from; leave train_layers= out to fine-tune all of it")
        if not 1 <= count <= len(layers):
            raise ValueError(f"train_layers={count}: the encoder has {len(layers)} transformer layers; expected "
                             f"1 … {len(layers)}, or leave train_layers= out to fine-tune all of them")
        for parameter in self.text.parameters():
            parameter.requires_grad_(False)
        for layer in layers[len(layers) - count:]:
            for parameter in layer.parameters():
                parameter.requires_grad_(True)

    def tokens(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        """The encoder's inputs of ``texts``: token ids and attention mask ``[B, L]``, padded to the
        longest text (at most ``max_length`` tokens), on the encoder's device."""
        device = self.embedding.weight.device
        encoded = self.tokenizer(list(texts), padding=True, truncation=True, max_length=self.max_length,
                                 return_tensors="pt")
        return {name: value.to(device) for name, value in encoded.items()}

    def forward(self, rows: TextRows) -> torch.Tensor:
        from ..hf import pool_states

        tokens = self.tokens(rows.texts.tolist())
        states = self.text(**tokens).last_hidden_state
        parts = [pool_states(states, tokens.get("attention_mask"), "mean")]
        if self.table is not None:
            parts.append(self.table(rows.features.to(parts[0].device)))
        return self.embedding(torch.cat(parts, dim=1))


def build_text_encoder(folder: str | Path, input_shape: Sequence[int], embedding_dim: int,
                       hidden: Sequence[int], max_length: int, train_layers: Optional[int],
                       flag: str = "--text-encoder") -> TextEncoder:
    """The :class:`TextEncoder` of the encoder in ``folder``, for ``input_shape = [F]`` other features."""
    model, tokenizer = load_text_model(folder, flag)
    return TextEncoder(model, tokenizer, int(input_shape[0]) if input_shape else 0, embedding_dim, hidden,
                       max_length, train_layers)


def encoder_parameters(model: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """``(the text encoder's trainable parameters, every other one)`` of a model whose encoder is a
    :class:`TextEncoder`: they train at different learning rates."""
    text = {id(p) for p in model.encoder.text.parameters()}
    trainable = [p for p in model.parameters() if p.requires_grad]
    return [p for p in trainable if id(p) in text], [p for p in trainable if id(p) not in text]


def file_checksums(folder: Path) -> dict[str, int]:
    """The CRC-32 of every file under ``folder``, by its path relative to it."""
    return {path.relative_to(folder).as_posix(): zlib.crc32(path.read_bytes())
            for path in sorted(folder.rglob("*")) if path.is_file()}


def save_text_encoder(encoder: TextEncoder, folder: Path) -> dict[str, int]:
    """Write the encoder and its tokenizer into ``folder`` (``save_pretrained``; what was there goes)
    and return the CRC-32 of each file written (:func:`file_checksums`)."""
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    with _quiet(require_transformers()):
        encoder.text.save_pretrained(folder)
        encoder.tokenizer.save_pretrained(folder)
    return file_checksums(folder)


def check_text_encoder(folder: Path, checksums: Optional[dict[str, int]]) -> None:
    """Refuse a run's ``text_encoder/`` folder that lacks a file it was written with, or one whose bytes
    no longer match the CRC-32 recorded in ``best.pt``."""
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is missing: a text run keeps its fine-tuned encoder and tokenizer "
                                f"there; restore the folder from a copy, or train the run again")
    for name, crc in (checksums or {}).items():
        path = folder / name
        if not path.is_file():
            raise ValueError(f"{folder}: the file {name} of the run's text encoder is missing; restore the folder "
                             "from a copy, or train the run again")
        if zlib.crc32(path.read_bytes()) != crc:
            raise ValueError(f"{folder}: {name} no longer matches the checksum stored when sol-ext wrote it; "
                             "restore the folder from a copy, or train the run again")
