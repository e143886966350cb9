"""``model.weights`` for the torchvision encoders: a saved state dict, and ImageNet weights
offline (a clear error naming where the file goes; the file placed there then works)."""

from __future__ import annotations

from pathlib import Path
from urllib.error import URLError

import pytest
import torch
import torchvision.models._api as weights_api
from torchvision.models import ResNet18_Weights, mobilenet_v2, resnet18

from raylf.errors import SpecError
from raylf.models import MODELS, _pretrained_state, build_model


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    """A fresh torch hub cache and no network; the loaded-file cache cleared around each test."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))

    def no_network(url, *args, **kwargs):
        cached = Path(torch.hub.get_dir()) / "checkpoints" / Path(url).name
        if cached.is_file():
            return torch.load(cached, weights_only=True)
        raise URLError("no network in this test")

    monkeypatch.setattr(weights_api, "load_state_dict_from_url", no_network)
    _pretrained_state.cache_clear()
    yield
    _pretrained_state.cache_clear()


def build(name: str, weights: str | None, channels: int = 3):
    return build_model(name, MODELS.get(name).Params(weights=weights), (channels, 32, 32), 10)


def test_resnet18_from_a_saved_state_dict_keeps_the_seeded_stem_and_head(tmp_path):
    torch.manual_seed(1)
    source = resnet18(num_classes=1000)
    torch.save(source.state_dict(), tmp_path / "r18.pt")
    model = build("resnet18", str(tmp_path / "r18.pt"))
    assert torch.equal(model.encoder.layer4[1].conv2.weight, source.layer4[1].conv2.weight)
    assert torch.equal(model.encoder.bn1.running_var, source.bn1.running_var)
    assert model.encoder.conv1.weight.shape == (64, 3, 3, 3)  # the 32x32 stem: not loaded
    assert model.head.weight.shape == (10, 512)


def test_mobilenet_v2_from_a_saved_state_dict(tmp_path):
    torch.manual_seed(2)
    source = mobilenet_v2(num_classes=1000)
    torch.save(source.state_dict(), tmp_path / "mnv2.pt")
    model = build("mobilenet_v2", str(tmp_path / "mnv2.pt"))
    assert torch.equal(model.encoder.features[5].conv[0][0].weight,
                       source.features[5].conv[0][0].weight)
    assert torch.equal(model.encoder.features[0][0].weight, source.features[0][0].weight)


def test_imagenet_offline_says_where_to_put_the_file_and_then_uses_it():
    with pytest.raises(SpecError, match="model.weights") as err:
        build("resnet18", "imagenet", channels=1)
    name = Path(ResNet18_Weights.IMAGENET1K_V1.url).name
    where = Path(torch.hub.get_dir()) / "checkpoints" / name
    assert str(where) in str(err.value)
    where.parent.mkdir(parents=True)
    torch.manual_seed(3)
    source = resnet18(num_classes=1000)
    torch.save(source.state_dict(), where)
    model = build("resnet18", "imagenet", channels=1)
    assert torch.equal(model.encoder.layer2[0].conv1.weight, source.layer2[0].conv1.weight)


def test_a_missing_or_foreign_weights_file_is_a_spec_error(tmp_path):
    with pytest.raises(SpecError, match="no file at"):
        build("resnet18", str(tmp_path / "absent.pt"))
    torch.save({"unrelated.weight": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(SpecError, match="holds no tensor of this network"):
        build("resnet18", str(tmp_path / "other.pt"))
