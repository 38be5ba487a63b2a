"""torchvision classification models as encoders (TorchvisionBackbone), their weights files, the
ImageNet normalization of the pretrainable encoders and the encoder-name checks."""

import pytest
import torch
from torch import nn

torchvision = pytest.importorskip("torchvision")

from sol_ext.driver.encoders import (  # noqa: E402
    IMAGENET_MEAN,
    TORCHVISION_ENCODERS,
    VGG16BN,
    ImageNetNormalize,
    TorchvisionBackbone,
    build_encoder,
    check_encoder_name,
    is_pretrainable,
    uses_imagenet_statistics,
)


def _last_linear(module: nn.Module) -> nn.Linear:
    return [m for m in module.modules() if isinstance(m, nn.Linear)][-1]


@pytest.mark.parametrize("name", TORCHVISION_ENCODERS)
def test_torchvision_encoder_gives_embeddings_of_the_asked_size(name):
    torch.manual_seed(0)
    enc = build_encoder(name, (3, 32, 32), 8).eval()  # vit_b_16: built with image_size=32
    assert isinstance(enc, TorchvisionBackbone)
    with torch.no_grad():
        out = enc(torch.rand(2, 3, 32, 32))
    assert out.shape == (2, 8) and bool(torch.isfinite(out).all())
    head = _last_linear(enc.net)
    assert head is enc.embedding_layer and head.out_features == 8
    keys = enc.state_dict().keys()
    assert not any(k.startswith("normalize.") for k in keys)
    assert all(k.startswith("net.") for k in keys)
    gray = TorchvisionBackbone(name, (1, 32, 32), 8).eval()
    with torch.no_grad():
        assert gray(torch.rand(2, 1, 32, 32)).shape == (2, 8)


def test_weights_file_loads_without_its_classifier(tmp_path):
    source = torchvision.models.resnet18(num_classes=10).state_dict()  # 10 classes: dropped
    plain, prefixed, wrapped = tmp_path / "r18.pth", tmp_path / "dp.pth", tmp_path / "wrapped.pth"
    torch.save(source, plain)
    torch.save({f"module.{k}": v for k, v in source.items()}, prefixed)
    torch.save({"state_dict": source, "epoch": 3}, wrapped)
    for path in (plain, prefixed, wrapped):
        enc = build_encoder("resnet18", (3, 32, 32), 8, weights=str(path))
        assert torch.equal(enc.net.conv1.weight, source["conv1.weight"])
        assert torch.equal(enc.net.layer4[1].bn2.running_var, source["layer4.1.bn2.running_var"])
        assert enc.net.fc.out_features == 8


def test_torchvision_weights_by_name_come_from_the_hub_cache_only(monkeypatch):
    weights_cls = torchvision.models.ResNet18_Weights
    source = torchvision.models.resnet18().state_dict()
    monkeypatch.setattr(weights_cls, "get_state_dict", lambda self, **kw: source)
    enc = TorchvisionBackbone("resnet18", (3, 32, 32), 8, weights="IMAGENET1K_V1")
    assert torch.equal(enc.net.conv1.weight, source["conv1.weight"])

    def offline(self, **kw):
        raise OSError("no network")

    monkeypatch.setattr(weights_cls, "get_state_dict", offline)
    with pytest.raises(ValueError, match="could not be fetched.*local"):
        TorchvisionBackbone("resnet18", (3, 32, 32), 8, weights="DEFAULT")


def test_wrong_weights_files_are_refused(tmp_path):
    features = torchvision.models.vgg.make_layers(torchvision.models.vgg.cfgs["D"], batch_norm=True)
    vgg = tmp_path / "vgg16_bn.pth"  # vgg16_bn's convolutional part (its classifier would be 500 MB)
    torch.save({f"features.{k}": v for k, v in features.state_dict().items()}, vgg)
    with pytest.raises(ValueError, match=r"vgg16_bn\.pth.*does not fit resnet18.*missing.*unexpected"):
        build_encoder("resnet18", (3, 32, 32), 8, weights=str(vgg))
    with pytest.raises(FileNotFoundError, match="Nothing is downloaded"):
        build_encoder("resnet18", (3, 32, 32), 8, weights=str(tmp_path / "missing.pth"))
    listed = tmp_path / "list.pth"
    torch.save([torch.zeros(2)], listed)
    with pytest.raises(ValueError, match="list.pth.*not a state dict"):
        build_encoder("resnet18", (3, 32, 32), 8, weights=str(listed))
    corrupt = tmp_path / "corrupt.pth"
    corrupt.write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match="corrupt.pth.*not a torch file"):
        build_encoder("resnet18", (3, 32, 32), 8, weights=str(corrupt))
    shapes = tmp_path / "r34.pth"
    torch.save(torchvision.models.resnet18(num_classes=10).state_dict() | {"conv1.weight": torch.zeros(1)},
               shapes)
    with pytest.raises(ValueError, match="1 of another shape .conv1.weight"):
        build_encoder("resnet18", (3, 32, 32), 8, weights=str(shapes))


def test_pretrainable_encoders_normalize_with_imagenet_statistics():
    mean_colour = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1).expand(2, 3, 4, 4)
    assert torch.allclose(ImageNetNormalize()(mean_colour), torch.zeros(2, 3, 4, 4), atol=1e-6)
    enc = TorchvisionBackbone("resnet18", (3, 32, 32), 8)
    assert isinstance(enc.normalize, ImageNetNormalize)
    assert torch.allclose(enc.normalize(mean_colour), torch.zeros(2, 3, 4, 4), atol=1e-6)
    vgg = VGG16BN(8)
    assert isinstance(vgg.normalize, ImageNetNormalize)
    assert not any(k.startswith("normalize.") for k in vgg.state_dict())
    # the network sees the normalized image: identity net shows it
    enc.net = nn.Flatten()
    assert torch.allclose(enc(mean_colour), torch.zeros(2, 48), atol=1e-6)


def test_encoder_names_are_checked():
    check_encoder_name("resnet18")
    for name in ("auto", "mlp", "cnn", "vgg16bn", "vit_b_16"):
        check_encoder_name(name)
    with pytest.raises(ValueError, match=r"'resnet1'.*auto, mlp, cnn, vgg16bn, or a torchvision "
                                         r"classification model such as resnet18, resnet50"):
        check_encoder_name("resnet1")
    with pytest.raises(ValueError, match="unknown encoder 'fasterrcnn_resnet50_fpn'"):
        check_encoder_name("fasterrcnn_resnet50_fpn")  # detection, not classification
    assert is_pretrainable("vgg16bn") and is_pretrainable("convnext_tiny")
    assert not any(is_pretrainable(n) for n in ("auto", "mlp", "cnn", "resnet1"))
    assert uses_imagenet_statistics("resnet50") and not uses_imagenet_statistics("cnn")
    with pytest.raises(ValueError, match="weights apply only to pretrainable encoders"):
        build_encoder("cnn", (3, 32, 32), 8, weights="x.pth")
    with pytest.raises(ValueError, match="Use --encoder mlp"):
        build_encoder("resnet18", (12,), 8)
    with pytest.raises(ValueError, match="4 channels"):
        build_encoder("resnet18", (4, 32, 32), 8)


def test_vit_needs_square_inputs_of_whole_patches():
    with pytest.raises(ValueError, match="square"):
        TorchvisionBackbone("vit_b_16", (3, 32, 48), 8)
    with pytest.raises(ValueError, match="multiple of its patch size 16"):
        TorchvisionBackbone("vit_b_16", (3, 40, 40), 8)


def test_export_keeps_the_normalization():
    enc = TorchvisionBackbone("resnet18", (1, 32, 32), 4).eval()
    x = torch.rand(2, 1, 32, 32)
    program = torch.export.export(enc, (x,))
    with torch.no_grad():
        assert torch.allclose(program.module()(x), enc(x), atol=1e-5)


def test_a_weights_file_of_other_pickled_objects_is_refused_without_unsafe_advice(tmp_path):
    import collections
    import pickle

    from sol_ext.driver.encoders import build_encoder

    path = tmp_path / "w.pth"
    with open(path, "wb") as f:
        pickle.dump(collections.OrderedDict(a=1), f)
    with pytest.raises(ValueError, match="pickled objects other than tensors") as info:
        build_encoder("resnet18", (3, 32, 32), 8, weights=str(path))
    assert "weights_only" not in str(info.value)
    path.write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match="not a torch file") as info:
        build_encoder("resnet18", (3, 32, 32), 8, weights=str(path))
    assert "weights_only" not in str(info.value)
