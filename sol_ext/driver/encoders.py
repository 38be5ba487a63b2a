"""Encoders ``h``: map a batch of inputs to embeddings ``[B, d]``.

* ``mlp``: tabular features and precomputed embeddings ``[B, F]``.
* ``cnn``: a small convolutional network for images ``[B, C, H, W]``.
* ``vgg16bn``: torchvision's VGG16-BN feature extractor, the paper's encoder, with weights
  from a local file (never downloaded). Needs the optional ``torchvision`` package.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

import torch
from torch import nn

__all__ = ["ENCODERS", "MLP", "SmallCNN", "VGG16BN", "build_encoder", "default_encoder"]

ENCODERS = ("auto", "mlp", "cnn", "vgg16bn")


class MLP(nn.Module):
    """Fully connected encoder ``[B, F] -> [B, d]``: (Linear, ReLU) per hidden layer, then Linear."""

    def __init__(self, in_features: int, embedding_dim: int, hidden: Sequence[int] = (128, 128),
                 dropout: float = 0.0):
        super().__init__()
        layers: list[nn.Module] = []
        width = in_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
            width = h
        layers.append(nn.Linear(width, embedding_dim))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.flatten(1))


class SmallCNN(nn.Module):
    """Three conv blocks (conv 3x3, batch norm, ReLU, 2x2 max pool), global average pool and a
    linear layer: ``[B, C, H, W] -> [B, d]``. Any ``H, W >= 8``."""

    def __init__(self, in_channels: int, embedding_dim: int, width: int = 32):
        super().__init__()
        blocks: list[nn.Module] = []
        c = in_channels
        for out in (width, 2 * width, 4 * width):
            blocks += [nn.Conv2d(c, out, 3, padding=1, bias=False), nn.BatchNorm2d(out),
                       nn.ReLU(inplace=True), nn.MaxPool2d(2)]
            c = out
        self.features = nn.Sequential(*blocks)
        self.head = nn.Linear(c, embedding_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))


class VGG16BN(nn.Module):
    """torchvision's VGG16-BN convolutional part, global average pool -> 512-d, then a linear
    projection when ``embedding_dim != 512``. One-channel images are repeated to three.

    Args:
        embedding_dim: output size.
        weights: path of a local ``.pth`` file holding a ``vgg16_bn`` state dict (the whole
            classifier's, or just ``features.*``); ``None`` starts from random weights.
    """

    def __init__(self, embedding_dim: int = 512, weights: Optional[str] = None):
        super().__init__()
        try:
            from torchvision.models.vgg import cfgs, make_layers
        except ImportError as exc:
            raise ImportError(
                "the vgg16bn encoder needs torchvision, which is not installed. Install the "
                "version that matches your torch (pip install 'sol_ext[vision]' or "
                "pip install torchvision), or choose --encoder cnn.") from exc
        # only the convolutional part of vgg16_bn: its classifier (120M parameters) is not used
        self.features = make_layers(cfgs["D"], batch_norm=True)
        if weights is not None:
            load_vgg_weights(self.features, weights)
        self.proj = nn.Identity() if embedding_dim == 512 else nn.Linear(512, embedding_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        return self.proj(self.features(x).mean(dim=(2, 3)))


def load_vgg_weights(features: nn.Module, path: str) -> None:
    """Load the ``features.*`` tensors of a local ``vgg16_bn`` state dict into ``features``.

    Classifier weights in the file are ignored.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"VGG16-BN weights file not found: {path!r}. Expected a local "
                                f".pth state dict of torchvision's vgg16_bn (nothing is "
                                f"downloaded).")
    state = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and "state_dict" in state:
        state = state["state_dict"]
    state = {k.removeprefix("module."): v for k, v in state.items()}
    feats = {k.removeprefix("features."): v for k, v in state.items()
             if k.startswith("features.")}
    if not feats:
        raise ValueError(f"{path!r} holds no 'features.*' tensors; expected a state dict of "
                         f"torchvision.models.vgg16_bn.")
    try:
        features.load_state_dict(feats, strict=True)
    except RuntimeError as exc:
        raise ValueError(f"{path!r} does not fit VGG16-BN's convolutional part "
                         f"({str(exc).splitlines()[0]}); expected a state dict of "
                         f"torchvision.models.vgg16_bn.") from None


def default_encoder(kind: str) -> str:
    """Encoder for a data set kind (``tabular``/``embeddings`` -> ``mlp``, ``images`` -> ``cnn``)."""
    return "cnn" if kind == "images" else "mlp"


def build_encoder(name: str, input_shape: Sequence[int], embedding_dim: int,
                  hidden: Sequence[int] = (128, 128), weights: Optional[str] = None) -> nn.Module:
    """Build an encoder for inputs of shape ``input_shape`` (one sample, without batch dim).

    Args:
        name: ``mlp``, ``cnn`` or ``vgg16bn`` (``auto`` is resolved by the caller).
        input_shape: ``[F]`` for vectors, ``[C, H, W]`` for images.
        embedding_dim: ``d``.
        hidden: hidden widths of the MLP.
        weights: local VGG16-BN weights file (``vgg16bn`` only).
    """
    if embedding_dim < 1:
        raise ValueError(f"embedding_dim must be >= 1, got {embedding_dim}.")
    shape = tuple(int(s) for s in input_shape)
    if name == "mlp":
        f = 1
        for s in shape:
            f *= s
        return MLP(f, embedding_dim, hidden)
    if name in ("cnn", "vgg16bn"):
        if len(shape) != 3:
            raise ValueError(f"the {name} encoder needs images [C, H, W]; the data has samples of "
                             f"shape {list(shape)}. Use --encoder mlp for vectors.")
        if name == "cnn":
            return SmallCNN(shape[0], embedding_dim)
        if shape[0] not in (1, 3):
            raise ValueError(f"vgg16bn takes 1- or 3-channel images, got {shape[0]} channels.")
        return VGG16BN(embedding_dim, weights)
    raise ValueError(f"unknown encoder {name!r}; expected one of {', '.join(ENCODERS)}.")
