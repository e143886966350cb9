"""The models of SP-CACW's settings (the SP-CACW paper's appendix G), each a ``SplitModel`` whose
head is the last Linear layer."""

from __future__ import annotations

from pydantic import Field
from torch import nn

from raylf.errors import SpecError
from raylf.models.base import MODELS, ModelParams, SplitModel

VGG16 = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


class LastStep(nn.Module):
    """Embedding → stacked LSTM (zero initial states each batch) → the last step's output: the
    features the next character is predicted from."""

    def __init__(self, vocab: int, embedding: int, hidden: int, layers: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab, embedding)
        self.lstm = nn.LSTM(embedding, hidden, layers, batch_first=True)

    def forward(self, x):
        out, _ = self.lstm(self.embedding(x))
        return out[:, -1]


@MODELS.register("char_lstm")
class CharLSTM:
    """Appendix G.3: embedding 256, 2-layer LSTM 256, a Linear to the vocabulary. Inputs are
    int64 windows of character ids (the ``shakespeare`` source, seq_len 50); the vocabulary is
    the label set, so ids index the same alphabet the head predicts."""

    class Params(ModelParams):
        embedding: int = Field(256, ge=1)
        hidden: int = Field(256, ge=1)
        layers: int = Field(2, ge=1)

    @staticmethod
    def build(params: Params, input_shape: tuple[int, ...], num_classes: int) -> SplitModel:
        if len(input_shape) != 1:
            raise SpecError([("model.name", (
                f"char_lstm reads windows of token ids (N×L); the dataset's inputs have shape "
                f"{input_shape} (use dataset shakespeare)"))])
        encoder = LastStep(num_classes, params.embedding, params.hidden, params.layers)
        return SplitModel(encoder, nn.Linear(params.hidden, num_classes))


@MODELS.register("vgg16_cifar")
class VGG16CIFAR:
    """Appendix G.2 (Table 2): VGG16's thirteen 3×3 convolutions, each followed by BatchNorm,
    ReLU and 2D dropout (0.3), five 2×2 max-pools, then a 512-wide hidden layer with BatchNorm,
    ReLU and dropout (0.5) before the output layer (the head). 32×32 inputs become 1×1×512."""

    class Params(ModelParams):
        conv_dropout: float = Field(0.3, ge=0, lt=1)
        hidden_dropout: float = Field(0.5, ge=0, lt=1)
        hidden: int = Field(512, ge=1, description="classifier width")
        width: float = Field(1.0, gt=0, description="channel multiplier (1 = the paper's)")

    @staticmethod
    def build(params: Params, input_shape: tuple[int, ...], num_classes: int) -> SplitModel:
        if len(input_shape) != 3 or min(input_shape[1:]) < 32:
            raise SpecError([("model.name", (
                f"vgg16_cifar needs C×H×W images of at least 32×32 (five 2×2 max-pools); the "
                f"dataset's inputs have shape {input_shape}"))])
        layers: list[nn.Module] = []
        channels = input_shape[0]
        for item in VGG16:
            if item == "M":
                layers.append(nn.MaxPool2d(2, 2))
                continue
            out = max(1, round(item * params.width))
            layers += [nn.Conv2d(channels, out, 3, padding=1), nn.BatchNorm2d(out),
                       nn.ReLU(inplace=True), nn.Dropout2d(params.conv_dropout)]
            channels = out
        flat = channels * (input_shape[1] // 32) * (input_shape[2] // 32)
        layers += [nn.Flatten(), nn.Linear(flat, params.hidden), nn.BatchNorm1d(params.hidden),
                   nn.ReLU(inplace=True), nn.Dropout(params.hidden_dropout)]
        return SplitModel(nn.Sequential(*layers), nn.Linear(params.hidden, num_classes))
