"""What every model shares: its parameters' base class, the encoder / head split
(``SplitModel``) and the registry the model modules register into. A module of its own so that
the model modules (``raylf.models`` itself and ``paper``) import it without importing each
other."""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict
from torch import nn

from raylf.registry import Registry


class ModelParams(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # finite numbers only


class SplitModel(nn.Module):
    # ``channels_last_on_cpu``: whether a CPU trainer runs this model's convolutions on
    # channels-last activations (``raylf.training.rewrites.run_channels_last``), set by the models
    # measured faster that way. Local SGD of one client, batch 32, one thread, this 2-core Xeon,
    # NCHW time over channels-last time: cnn [16, 32] on 3×32×32 1.45×, on 1×28×28 1.18×, on
    # 1×8×8 1.09×; mobilenet_v2 on 3×32×32 1.51×; resnet18 0.89× and vgg16_cifar 0.78× (slower:
    # left NCHW).
    def __init__(self, encoder: nn.Module, head: nn.Module, channels_last_on_cpu: bool = False):
        super().__init__()
        self.encoder = encoder
        self.head = head
        self.channels_last_on_cpu = channels_last_on_cpu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


MODELS: Registry = Registry("model")


def build_model(name: str, params: BaseModel, input_shape: tuple[int, ...],
                num_classes: int) -> SplitModel:
    return MODELS.get(name).build(params, tuple(input_shape), num_classes)
