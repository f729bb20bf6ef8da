"""The built-in models. Plain nn.Modules: no distributed logic inside."""

from __future__ import annotations

import math

import torch
from torch import nn

from kubetrain.api.training import TrainingSpec


class MLP(nn.Module):
    """Two hidden layers with dropout (so a resume also has to restore the RNG to be exact)."""

    def __init__(self, in_features: int, hidden: int, num_classes: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(in_features, hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out


class SmallCNN(nn.Module):
    """Two 3x3 conv layers on a (C, H, W) image, global average pool, linear head."""

    def __init__(self, in_channels: int, channels: int, num_classes: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, channels, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(channels, channels * 2, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(2),
            nn.Flatten(),
        )
        self.head = nn.Linear(channels * 2 * 4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.features(x))
        return out


def build_model(spec: TrainingSpec, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """The model `spec` names, for inputs of `input_shape` (without the batch axis)."""
    if spec.model == "mlp":
        return MLP(math.prod(input_shape), spec.hidden_size, num_classes)
    if len(input_shape) != 3:
        # Synthetic data is flat; a square feature count is viewed as a one-channel image.
        side = math.isqrt(math.prod(input_shape))
        if side * side != math.prod(input_shape):
            raise ValueError(
                f"model cnn needs image inputs; {math.prod(input_shape)} features are not a square "
                "(set syntheticFeatures to a square such as 64 or 256)"
            )
        return nn.Sequential(nn.Unflatten(1, (1, side, side)), SmallCNN(1, max(spec.hidden_size // 8, 1), num_classes))
    return SmallCNN(input_shape[0], max(spec.hidden_size // 8, 1), num_classes)
