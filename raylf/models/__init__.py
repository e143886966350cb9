"""Models with an explicit encoder / head split (the head is the last classifier layer).

Every model is a ``SplitModel``: ``encoder`` maps inputs to features and ``head`` maps features to
class scores, so methods share or privatize either part by name.
"""

from __future__ import annotations

import math
import pickle
from functools import cache
from pathlib import Path
from urllib.error import URLError

import torch
from pydantic import Field
from torch import nn

from raylf.errors import SpecError

# the package's names for its users (raylf.models.build_model, …), defined in base
from raylf.models.base import MODELS, ModelParams, SplitModel, build_model  # noqa: F401


def _flat_size(module: nn.Module, input_shape: tuple[int, ...]) -> int:
    with torch.no_grad():
        return int(module(torch.zeros(1, *input_shape)).flatten(1).shape[1])


@MODELS.register("mlp")
class MLP:
    """Fully connected network on flattened inputs."""

    class Params(ModelParams):
        hidden: list[int] = Field(default_factory=lambda: [128])

    @staticmethod
    def build(params: Params, input_shape: tuple[int, ...], num_classes: int) -> SplitModel:
        layers: list[nn.Module] = [nn.Flatten()]
        width = math.prod(input_shape)
        for h in params.hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        return SplitModel(nn.Sequential(*layers), nn.Linear(width, num_classes))


def conv_encoder(input_shape: tuple[int, ...], channels: list[int], features: int) -> nn.Module:
    """Conv3×3+ReLU+maxpool2 blocks, flatten, linear to ``features`` (FMT-SVM's encoder).

    The flatten size is measured from the input shape, so 8×8, 28×28, 32×32 and 64×64 all work.
    """
    blocks: list[nn.Module] = []
    in_ch = input_shape[0]
    for ch in channels:
        blocks += [nn.Conv2d(in_ch, ch, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
        in_ch = ch
    convs = nn.Sequential(*blocks, nn.Flatten())
    return nn.Sequential(convs, nn.Linear(_flat_size(convs, input_shape), features), nn.ReLU())


@MODELS.register("cnn")
class CNN:
    class Params(ModelParams):
        channels: list[int] = Field(default_factory=lambda: [16, 32])
        features: int = Field(128, ge=1, description="encoder output size d")

    @staticmethod
    def build(params: Params, input_shape: tuple[int, ...], num_classes: int) -> SplitModel:
        encoder = conv_encoder(input_shape, params.channels, params.features)
        return SplitModel(encoder, nn.Linear(params.features, num_classes),
                          channels_last_on_cpu=True)


def _small_input_stem(conv: nn.Conv2d, in_channels: int) -> nn.Conv2d:
    """3×3 stride-1 first convolution: the CIFAR adaptation that keeps 32×32 maps spatial."""
    return nn.Conv2d(in_channels, conv.out_channels, 3, stride=1, padding=1, bias=False)


class PretrainedParams(ModelParams):
    weights: str | None = Field(
        None, description="imagenet: torchvision's ImageNet-1k weights (downloaded once into "
                          "torch's hub cache); a path: a saved state dict of the torchvision "
                          "network; null: the seeded random init")


@cache
def _pretrained_state(weights: str, enum_name: str) -> dict[str, torch.Tensor]:
    """The state dict ``model.weights`` names, read once per process."""
    if weights == "imagenet":
        import torchvision.models as tvm

        chosen = getattr(tvm, enum_name).IMAGENET1K_V1
        try:
            return chosen.get_state_dict(progress=False)
        except (URLError, OSError) as err:
            where = Path(torch.hub.get_dir()) / "checkpoints" / Path(chosen.url).name
            raise SpecError([("model.weights", (
                f"imagenet: cannot download {chosen.url} ({err}); without internet put that "
                f"file at {where} (torch's hub cache, moved by $TORCH_HOME), or set "
                "model.weights to the path of a saved state dict"))]) from None
    path = Path(weights).expanduser()
    if not path.is_file():
        raise SpecError([("model.weights", (
            f"no file at {path}; give imagenet, the path of a saved state dict, or null"))])
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError) as err:
        raise SpecError([("model.weights", f"{path} is not a readable state dict ({err})")]) \
            from None
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        raise SpecError([("model.weights", f"{path} does not hold a state dict of tensors")])
    return state


def load_pretrained(net: nn.Module, weights: str | None, enum_name: str) -> None:
    """Copy every tensor of the named state dict whose name and shape fit the adapted
    network; the 3×3 stem (ResNet-18's 7×7 does not fit) and the classifier, which the head
    replaces, keep the seeded random init."""
    if weights is None:
        return
    own = net.state_dict()
    fitting = {k: v for k, v in _pretrained_state(weights, enum_name).items()
               if k in own and own[k].shape == v.shape}
    if not fitting:
        raise SpecError([("model.weights", (
            f"{weights} holds no tensor of this network (names or shapes differ); save the "
            "state dict of the same torchvision model"))])
    net.load_state_dict(fitting, strict=False)


@MODELS.register("resnet18")
class ResNet18:
    """torchvision ResNet-18 adapted to 32×32 inputs (3×3 stem, no max-pool)."""

    Params = PretrainedParams

    @staticmethod
    def build(params: PretrainedParams, input_shape: tuple[int, ...],
              num_classes: int) -> SplitModel:
        from torchvision.models import resnet18

        net = resnet18(weights=None, num_classes=num_classes)
        net.conv1 = _small_input_stem(net.conv1, input_shape[0])
        net.maxpool = nn.Identity()
        load_pretrained(net, params.weights, "ResNet18_Weights")
        head, net.fc = net.fc, nn.Identity()
        return SplitModel(net, head)


@MODELS.register("mobilenet_v2")
class MobileNetV2:
    """torchvision MobileNetV2 adapted to 32×32 inputs (stride-1 stem)."""

    class Params(PretrainedParams):
        width_mult: float = Field(1.0, gt=0)

    @staticmethod
    def build(params: Params, input_shape: tuple[int, ...], num_classes: int) -> SplitModel:
        from torchvision.models import mobilenet_v2

        net = mobilenet_v2(weights=None, num_classes=num_classes, width_mult=params.width_mult)
        net.features[0][0] = _small_input_stem(net.features[0][0], input_shape[0])
        load_pretrained(net, params.weights, "MobileNet_V2_Weights")
        head = net.classifier[-1]
        net.classifier[-1] = nn.Identity()
        return SplitModel(net, head, channels_last_on_cpu=True)


from raylf.models import paper  # noqa: E402, F401  (registers char_lstm, vgg16_cifar)
