"""Encoders ``h``: map a batch of inputs to embeddings ``[B, d]``.

* ``mlp``: tabular features and precomputed embeddings ``[B, F]``.
* ``cnn``: a small convolutional network for images ``[B, C, H, W]``.
* ``vgg16bn``: torchvision's VGG16-BN feature extractor, the paper's encoder, with weights
  from a local file (never downloaded). Needs the optional ``torchvision`` package.
* any torchvision classification model by its name (``resnet18``, ``resnet50``, ``vgg16_bn``,
  ``efficientnet_b0``, ``convnext_tiny``, ``vit_b_16``, ...; see
  ``torchvision.models.list_models(module=torchvision.models)``): the whole network, whose last
  linear layer (the 1000-way ImageNet classifier) becomes the embedding layer, optionally
  initialised from a local state dict file (:class:`TorchvisionBackbone`). Needs ``torchvision``.

The pretrainable encoders (``vgg16bn`` and the torchvision models) take images in ``[0, 1]``
and normalize them with ImageNet's mean and std inside the module (:class:`ImageNetNormalize`),
so the normalization travels with the model into export and prediction.
"""

from __future__ import annotations

import difflib
import functools
import os
import pickle
import re
from collections.abc import Mapping
from typing import Any, Optional, Sequence

import torch
from torch import nn

__all__ = ["ENCODERS", "IMAGENET_MEAN", "IMAGENET_STD", "MLP", "TORCHVISION_ENCODERS", "ImageNetNormalize",
           "SmallCNN", "TorchvisionBackbone", "VGG16BN", "build_encoder", "check_encoder_name",
           "default_encoder", "is_pretrainable", "load_vgg_weights", "uses_imagenet_statistics"]

ENCODERS = ("auto", "mlp", "cnn", "vgg16bn")
"""The built-in encoder names (``auto`` is resolved by the caller with :func:`default_encoder`)."""

TORCHVISION_ENCODERS = ("resnet18", "resnet50", "vgg16_bn", "efficientnet_b0", "convnext_tiny", "vit_b_16")
"""torchvision classification models that are tested as encoders; any other torchvision
classification model name is accepted too."""

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

_INSTALL_HINT = "pip install torchvision (the version that matches your torch) or pip install 'sol_ext[vision]'"


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


class ImageNetNormalize(nn.Module):
    """``(x - mean) / std`` per channel with ImageNet's statistics, for 3-channel images in
    ``[0, 1]``: ``[B, 3, H, W] -> [B, 3, H, W]``.

    The statistics are non-persistent buffers: they move with the module (``.to(device)``,
    export) but are not in its ``state_dict()``.
    """

    def __init__(self, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1),
                             persistent=False)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean.to(x.dtype)) / self.std.to(x.dtype)


class VGG16BN(nn.Module):
    """torchvision's VGG16-BN convolutional part, global average pool -> 512-d, then a linear
    projection when ``embedding_dim != 512``. Takes images in ``[0, 1]``: one-channel images are
    repeated to three, then normalized with ImageNet's mean and std (the statistics its
    pretrained weights were trained with; :class:`ImageNetNormalize`, not in the state dict).

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
        self.normalize = ImageNetNormalize()
        # only the convolutional part of vgg16_bn: its classifier (120M parameters) is not used
        self.features = make_layers(cfgs["D"], batch_norm=True)
        if weights is not None:
            load_vgg_weights(self.features, weights)
        self.proj = nn.Identity() if embedding_dim == 512 else nn.Linear(512, embedding_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        return self.proj(self.features(self.normalize(x)).mean(dim=(2, 3)))


def _read_state_dict(path: str, expected: str) -> dict[str, torch.Tensor]:
    """The tensors of the state dict saved in the existing file ``path``: unwrapped from
    ``{"state_dict": ...}`` or ``{"model": ...}``, without a DataParallel ``module.`` prefix.
    ``expected`` names the expected content in error messages."""
    try:
        state: Any = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        # torch's message advises weights_only=False: unsafe for a file from elsewhere
        raise ValueError(f"{path!r} is not a state dict of tensors: not a torch file, or one holding "
                         f"pickled objects other than tensors, which are not loaded (that could run code "
                         f"from the file); expected {expected}.") from None
    except Exception as exc:  # corrupt file, not a torch file
        reason = (str(exc).strip().splitlines() or [""])[0]
        raise ValueError(f"{path!r} is not a torch state dict file ({type(exc).__name__}: "
                         f"{reason[:200]}); expected {expected}.") from None
    return _as_state_dict(state, repr(path), expected)


def _as_state_dict(state: Any, source: str, expected: str) -> dict[str, torch.Tensor]:
    for wrapper in ("state_dict", "model"):
        if isinstance(state, Mapping) and isinstance(state.get(wrapper), Mapping):
            state = state[wrapper]
            break
    if not isinstance(state, Mapping) or not state:
        what = "an empty dict" if isinstance(state, Mapping) else f"a {type(state).__name__}"
        raise ValueError(f"{source} holds {what}, not a state dict; expected {expected}.")
    bad = [k for k, v in state.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
    if bad:
        raise ValueError(f"{source} is not a state dict: {len(bad)} entries are not named tensors "
                         f"({', '.join(repr(k) for k in bad[:3])}); expected {expected}.")
    return {k.removeprefix("module."): v for k, v in state.items()}


def load_vgg_weights(features: nn.Module, path: str) -> None:
    """Load the ``features.*`` tensors of a local ``vgg16_bn`` state dict into ``features``.

    Classifier weights in the file are ignored.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"VGG16-BN weights file not found: {path!r}. Expected a local "
                                f".pth state dict of torchvision's vgg16_bn (nothing is "
                                f"downloaded).")
    state = _read_state_dict(path, "a state dict of torchvision.models.vgg16_bn")
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


# ----------------------------------------------------------------------------------------------
# torchvision classification models


def _import_torchvision(name: str) -> Any:
    try:
        import torchvision
        import torchvision.models  # noqa: F401  (the model registry)
    except ImportError as exc:
        raise ImportError(f"the encoder {name!r} is not one of the built-in ones ({', '.join(ENCODERS)}), "
                          f"so it would be a torchvision model, but torchvision is not installed: "
                          f"{_INSTALL_HINT}.") from exc
    return torchvision


@functools.lru_cache(maxsize=None)
def _torchvision_classification_models() -> frozenset[str]:
    import torchvision
    import torchvision.models

    return frozenset(torchvision.models.list_models(module=torchvision.models))


def _is_torchvision_name(name: str) -> bool:
    """Whether ``name`` is a torchvision classification model (False without torchvision)."""
    if name in ENCODERS:
        return False
    try:
        _import_torchvision(name)
    except ImportError:
        return False
    return name in _torchvision_classification_models()


def check_encoder_name(name: str) -> None:
    """Raise ``ValueError`` unless ``name`` is a built-in encoder (``auto``, ``mlp``, ``cnn``,
    ``vgg16bn``) or a torchvision classification model. torchvision is imported only for the
    latter (``ImportError`` with the install command when it is missing)."""
    if isinstance(name, str) and name in ENCODERS:
        return
    expected = (f"expected auto, mlp, cnn, vgg16bn, or a torchvision classification model such as "
                f"{', '.join(TORCHVISION_ENCODERS)}, ... "
                f"(torchvision.models.list_models(module=torchvision.models) lists them all)")
    if not isinstance(name, str) or not name:
        raise ValueError(f"unknown encoder {name!r}; {expected}.")
    _import_torchvision(name)
    models = _torchvision_classification_models()
    if name not in models:
        close = difflib.get_close_matches(name, [*ENCODERS, *sorted(models)], n=3)
        hint = f" Did you mean {' or '.join(close)}?" if close else ""
        raise ValueError(f"unknown encoder {name!r}; {expected}.{hint}")


def is_pretrainable(name: str) -> bool:
    """Whether encoder ``name`` takes a weights file: ``vgg16bn`` and the torchvision models."""
    return name == "vgg16bn" or _is_torchvision_name(name)


def uses_imagenet_statistics(name: str) -> bool:
    """Whether encoder ``name`` normalizes its input with ImageNet's mean and std (inputs are
    expected in ``[0, 1]``): the pretrainable ones, ``vgg16bn`` and the torchvision models."""
    return is_pretrainable(name)


_VIT = re.compile(r"vit_[a-z]+_(\d+)")
# auxiliary classifiers of googlenet/inception_v3: built without them, their tensors in a file are ignored
_AUX_PREFIXES = {"googlenet": ("aux1.", "aux2."), "inception_v3": ("AuxLogits.",)}
# densenet's original checkpoints name "norm.1" what the modules call "norm1" (torchvision remaps too)
_DENSENET_KEY = re.compile(
    r"^(.*denselayer\d+\.(?:norm|relu|conv))\.((?:[12])\.(?:weight|bias|running_mean|running_var))$")


def _embedding_layer_name(net: nn.Module, name: str) -> str:
    """Qualified name of the classification layer that becomes the embedding layer: the last
    ``nn.Linear``; for the models without one (squeezenet) the last ``nn.Conv2d``."""
    linears = [n for n, m in net.named_modules() if isinstance(m, nn.Linear) and n]
    if linears:
        return linears[-1]
    convs = [n for n, m in net.named_modules() if isinstance(m, nn.Conv2d) and n]
    if not convs:
        raise ValueError(f"torchvision model {name!r} has no linear (or convolutional) "
                         f"classification layer to turn into the embedding layer.")
    return convs[-1]


def _replace(net: nn.Module, qualified: str, module: nn.Module) -> None:
    parent_name, _, child = qualified.rpartition(".")
    setattr(net.get_submodule(parent_name) if parent_name else net, child, module)


def _keys_list(keys: Sequence[str], n: int = 3) -> str:
    shown = ", ".join(keys[:n])
    return shown + (", ..." if len(keys) > n else "")


class TorchvisionBackbone(nn.Module):
    """A torchvision classification model as an encoder ``[B, C, H, W] -> [B, d]``.

    The network is built with ``torchvision.models.get_model(name, weights=None)``, optionally
    loaded with ``weights``, and its classification layer (the last ``nn.Linear``: resnet's ``fc``,
    vgg's ``classifier.6``, efficientnet's ``classifier.1``, convnext's ``classifier.2``, vit's
    ``heads.head``) is replaced by a new ``nn.Linear(in_features, embedding_dim)``; every other
    layer, pretrained ones included (e.g. vgg's 4096-wide classifier layers), is kept.

    Inputs are images in ``[0, 1]`` with 1 or 3 channels; one channel is repeated to three. They
    are normalized with ImageNet's mean and std inside the module (``self.normalize``, an
    :class:`ImageNetNormalize` whose buffers are not in the state dict).

    Args:
        name: a torchvision classification model (``torchvision.models.list_models(
            module=torchvision.models)``), e.g. ``resnet18``.
        input_shape: ``[C, H, W]`` of one sample. ViT models are built for square ``H x W``
            images (``H`` a multiple of the patch size); their ImageNet weights need 224 x 224.
        embedding_dim: ``d``.
        weights: ``None`` (random initialisation), the path of a local file holding a state dict
            of that torchvision model (``torch.save(model.state_dict(), path)``, e.g. torchvision's
            ``resnet18-f37072fd.pth``; also ``{"state_dict": ...}``/``{"model": ...}`` and
            DataParallel's ``module.`` prefix), or the name of one of torchvision's weights for the
            model (``DEFAULT``, ``IMAGENET1K_V1``, ...), read from torch hub's cache. Nothing is
            downloaded on purpose: the classification layer's tensors may be missing or of another
            shape, every other tensor must fit.
    """

    def __init__(self, name: str, input_shape: Sequence[int], embedding_dim: int,
                 weights: Optional[str] = None):
        super().__init__()
        check_encoder_name(name)
        if name in ENCODERS:
            raise ValueError(f"{name!r} is a built-in encoder, not a torchvision model; use build_encoder.")
        tv = _import_torchvision(name)
        shape = tuple(int(s) for s in input_shape)
        if len(shape) != 3:
            raise ValueError(f"the {name} encoder needs images [C, H, W]; got samples of shape "
                             f"{list(shape)}. Use --encoder mlp for vectors.")
        channels, height, width = shape
        if channels not in (1, 3):
            raise ValueError(f"{name} takes 1- or 3-channel images, got {channels} channels.")
        if embedding_dim < 1:
            raise ValueError(f"embedding_dim must be >= 1, got {embedding_dim}.")
        self.name = name
        self.in_channels = channels

        config: dict[str, Any] = {"weights": None}
        vit = _VIT.fullmatch(name)
        if vit:
            patch = int(vit.group(1))
            if height != width or height % patch:
                raise ValueError(f"{name} needs square images whose side is a multiple of its patch "
                                 f"size {patch} (224 x 224 for its ImageNet weights); got "
                                 f"{height} x {width}.")
            config["image_size"] = height
        elif name == "maxvit_t":
            config["input_size"] = (height, width)
        elif name in _AUX_PREFIXES:
            # as torchvision does: no auxiliary classifiers; pretrained weights expect the input
            # transformed from ImageNet statistics to theirs
            config.update(aux_logits=False, init_weights=weights is None,
                          transform_input=weights is not None)
        net = tv.models.get_model(name, **config)
        head_name = _embedding_layer_name(net, name)
        if weights is not None:
            self._load(net, head_name, weights, tv)

        head = net.get_submodule(head_name)
        if isinstance(head, nn.Linear):
            new_head: nn.Module = nn.Linear(head.in_features, embedding_dim)
        else:  # squeezenet: a 1x1 convolution to the classes, then ReLU and average pooling
            new_head = nn.Conv2d(head.in_channels, embedding_dim, kernel_size=1)
            parent_name, _, child = head_name.rpartition(".")
            parent = net.get_submodule(parent_name) if parent_name else net
            if isinstance(parent, nn.Sequential):
                names = [n for n, _ in parent.named_children()]
                after = names[names.index(child) + 1:]
                if after and isinstance(parent.get_submodule(after[0]), nn.ReLU):
                    setattr(parent, after[0], nn.Identity())  # embeddings are not clipped at 0
        _replace(net, head_name, new_head)
        self.head_name = head_name
        self.normalize = ImageNetNormalize()
        self.net = net

    @property
    def embedding_layer(self) -> nn.Module:
        """The layer that replaced the classification layer (``net.<head_name>``)."""
        return self.net.get_submodule(self.head_name)

    def _load(self, net: nn.Module, head_name: str, weights: str, tv: Any) -> None:
        expected = f"a state dict of torchvision.models.{self.name}"
        if os.path.isfile(weights):
            source = repr(weights)
            state = _read_state_dict(weights, expected)
        else:
            enum = self._weights_enum(weights, tv)
            if enum is None:
                raise FileNotFoundError(
                    f"{self.name} weights file not found: {weights!r}. Nothing is downloaded: expected "
                    f"a local .pth file holding {expected} (or the name of one of torchvision's "
                    f"weights for it, such as DEFAULT, when torch hub's cache holds them).")
            source = f"torchvision's {enum!r}"
            try:
                raw = enum.get_state_dict(progress=False)
            except Exception as exc:
                raise ValueError(f"torchvision's weights {enum!r} for {self.name} could not be fetched "
                                 f"({type(exc).__name__}: {str(exc)[:200]}); nothing is downloaded on "
                                 f"purpose when offline: pass a local .pth file holding {expected} "
                                 f"(e.g. {os.path.basename(enum.url)}).") from None
            state = _as_state_dict(raw, source, expected)

        if self.name.startswith("densenet"):
            state = {(m.group(1) + m.group(2) if (m := _DENSENET_KEY.match(k)) else k): v
                     for k, v in state.items()}
        head_keys = {f"{head_name}.{k}" for k in net.get_submodule(head_name).state_dict()}
        aux = _AUX_PREFIXES.get(self.name, ())
        state = {k: v for k, v in state.items() if k not in head_keys and not k.startswith(aux)}
        own = {k: v for k, v in net.state_dict().items() if k not in head_keys}
        missing = [k for k in own if k not in state and not k.endswith("num_batches_tracked")]
        unexpected = [k for k in state if k not in own]
        mismatched = [f"{k}: {list(v.shape)} in the file, {list(own[k].shape)} in the model"
                      for k, v in state.items() if k in own and v.shape != own[k].shape]
        if missing or unexpected or mismatched:
            problems = [f"{len(keys)} {what} ({_keys_list(keys)})"
                        for what, keys in (("missing", missing), ("unexpected", unexpected),
                                           ("of another shape", mismatched)) if keys]
            hint = ""
            if _VIT.fullmatch(self.name) and any(k.startswith("encoder.pos_embedding") for k in mismatched):
                hint = (" A ViT's position embeddings fix its input size: ImageNet weights need "
                        "224 x 224 images (384 or 518 for the SWAG ones).")
            raise ValueError(f"{source} does not fit {self.name}: {', '.join(problems)}; expected "
                             f"{expected}.{hint}")
        net.load_state_dict(state, strict=False)

    def _weights_enum(self, weights: str, tv: Any) -> Any:
        """torchvision's weights named ``weights`` for this model, or None."""
        try:
            enum_cls = tv.models.get_model_weights(self.name)
            return enum_cls.verify(weights)
        except (KeyError, ValueError, TypeError, AttributeError):
            return None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.in_channels == 1:
            x = x.expand(-1, 3, -1, -1)
        return self.net(self.normalize(x))


def default_encoder(kind: str) -> str:
    """Encoder for a data set kind (``tabular``/``embeddings`` -> ``mlp``, ``images`` -> ``cnn``,
    ``text`` -> ``text``: a Hugging Face encoder, :mod:`sol_ext.driver.text`)."""
    return {"images": "cnn", "text": "text"}.get(kind, "mlp")


def build_encoder(name: str, input_shape: Sequence[int], embedding_dim: int,
                  hidden: Sequence[int] = (128, 128), weights: Optional[str] = None) -> nn.Module:
    """Build an encoder for inputs of shape ``input_shape`` (one sample, without batch dim).

    Args:
        name: ``mlp``, ``cnn``, ``vgg16bn`` or a torchvision classification model such as
            ``resnet18`` (``auto`` is resolved by the caller).
        input_shape: ``[F]`` for vectors, ``[C, H, W]`` for images.
        embedding_dim: ``d``.
        hidden: hidden widths of the MLP.
        weights: local weights file of a pretrainable encoder (``vgg16bn`` or a torchvision
            model; see :class:`VGG16BN` and :class:`TorchvisionBackbone`).
    """
    if embedding_dim < 1:
        raise ValueError(f"embedding_dim must be >= 1, got {embedding_dim}.")
    shape = tuple(int(s) for s in input_shape)
    if name == "auto":
        raise ValueError("encoder 'auto' is resolved by the caller (default_encoder(kind)); "
                         "build_encoder takes mlp, cnn, vgg16bn or a torchvision model.")
    check_encoder_name(name)
    if weights is not None and name in ("mlp", "cnn"):
        raise ValueError(f"weights apply only to pretrainable encoders (vgg16bn or a torchvision "
                         f"model), not to {name}.")
    if name == "mlp":
        f = 1
        for s in shape:
            f *= s
        return MLP(f, embedding_dim, hidden)
    if len(shape) != 3:
        raise ValueError(f"the {name} encoder needs images [C, H, W]; the data has samples of "
                         f"shape {list(shape)}. Use --encoder mlp for vectors.")
    if name == "cnn":
        return SmallCNN(shape[0], embedding_dim)
    if shape[0] not in (1, 3):
        raise ValueError(f"{name} takes 1- or 3-channel images, got {shape[0]} channels.")
    if name == "vgg16bn":
        return VGG16BN(embedding_dim, weights)
    return TorchvisionBackbone(name, shape, embedding_dim, weights)
