"""Flat parameter vectors: where each tensor of a ``SplitModel`` lives in one vector, encoder
first, then head, so what a client receives, keeps or uploads is a slice of it."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

PARTS = ("encoder", "head")


@dataclass(frozen=True)
class Slot:
    name: str
    shape: tuple[int, ...]
    offset: int
    numel: int
    is_param: bool


@dataclass(frozen=True)
class ParamLayout:
    """Where each tensor of a ``SplitModel`` lives in its flat vector: encoder first, then head.

    Encoder and head are contiguous ranges, so a method shares or keeps a part by slicing.
    """

    slots: tuple[Slot, ...]
    parts: dict[str, slice]

    @classmethod
    def of(cls, model: nn.Module) -> ParamLayout:
        slots, parts, offset = [], {}, 0
        for part in PARTS:
            start = offset
            module = getattr(model, part)
            named = [(f"{part}.{n}", t, True) for n, t in module.named_parameters()]
            named += [(f"{part}.{n}", t, False) for n, t in module.named_buffers()
                      if t.is_floating_point()]
            for name, tensor, is_param in named:
                slots.append(Slot(name, tuple(tensor.shape), offset, tensor.numel(), is_param))
                offset += tensor.numel()
            parts[part] = slice(start, offset)
        return cls(tuple(slots), parts)

    @property
    def size(self) -> int:
        return self.parts[PARTS[-1]].stop

    @property
    def param_mask(self) -> torch.Tensor:
        """True where the flat vector holds a trained parameter, False on running statistics:
        what a method averages, corrects or mixes as weights and leaves alone as statistics."""
        mask = torch.zeros(self.size, dtype=torch.bool)
        for slot in self.slots:
            if slot.is_param:
                mask[slot.offset: slot.offset + slot.numel] = True
        return mask

    def part(self, name: str) -> slice:
        return self.parts[name]

    def part_size(self, name: str) -> int:
        s = self.parts[name]
        return s.stop - s.start


def model_vector(model: nn.Module, layout: ParamLayout) -> torch.Tensor:
    """The flat vector of a freshly built model (its initialization)."""
    state = dict(model.named_parameters()) | dict(model.named_buffers())
    return torch.cat([state[s.name].detach().reshape(-1).float() for s in layout.slots])
