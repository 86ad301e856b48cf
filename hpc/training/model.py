"""Models: torchvision ResNets (the study's resnet152 by default) and a tiny CNN for tests.

Stems for 32x32 CIFAR images:
- `torchvision`: the ImageNet stem (7x7 stride-2 conv + 3x3 stride-2 max-pool), as the study used.
  A 32x32 image is 8x8 after the stem, so the network is cheap (0.47 GFLOP/image for resnet152
  forward) but tops out at low accuracy.
- `cifar`: a 3x3 stride-1 conv and no max-pool: the residual stages see 32x32, the usual CIFAR
  recipe. Much better accuracy, ~16x the FLOPs per image (7.44 GFLOP forward for resnet152).
"""

from __future__ import annotations

import torch
from torch import nn

from hpc.settings.schema import ModelConfig


class TinyNet(nn.Module):
    """Three conv-BN-ReLU blocks and a linear head: seconds per epoch on a CPU, for tests."""

    def __init__(self, num_classes: int = 100, width: int = 16):
        super().__init__()

        def block(cin, cout, stride):
            return nn.Sequential(
                nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)
            )

        self.features = nn.Sequential(block(3, width, 1), block(width, 2 * width, 2), block(2 * width, 4 * width, 2))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4 * width, num_classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.features(x)), 1))


def build_model(cfg: ModelConfig) -> nn.Module:
    if cfg.arch == "tiny":
        return TinyNet(cfg.num_classes)
    import torchvision

    model = getattr(torchvision.models, cfg.arch)(
        weights=None, num_classes=cfg.num_classes, zero_init_residual=cfg.zero_init_residual
    )
    if cfg.stem == "cifar":
        model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    return model


def count_flops_per_image(model: nn.Module, image_size: int = 32) -> int:
    """Forward FLOPs (2 x multiply-adds) for one image, counted from the model's conv and linear layers."""
    flops = 0
    hooks = []

    def conv_hook(m: nn.Conv2d, inp: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        nonlocal flops
        kh, kw = m.kernel_size
        flops += 2 * out.shape[1] * out.shape[2] * out.shape[3] * (m.in_channels // m.groups) * kh * kw

    def linear_hook(m: nn.Linear, inp: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        nonlocal flops
        flops += 2 * m.in_features * m.out_features

    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            hooks.append(m.register_forward_hook(conv_hook))
        elif isinstance(m, nn.Linear):
            hooks.append(m.register_forward_hook(linear_hook))
    was_training, autotune = model.training, torch.backends.cudnn.benchmark
    model.eval()
    # A batch of one is no shape the run trains on: cuDNN's heuristics, not its timing of every algorithm
    # for each of the model's convolution shapes at a batch used once, in the start-up before the first step.
    torch.backends.cudnn.benchmark = False
    try:
        with torch.no_grad():
            param = next(model.parameters())
            model(torch.zeros(1, 3, image_size, image_size, device=param.device, dtype=param.dtype))
    finally:
        torch.backends.cudnn.benchmark = autotune
        for h in hooks:
            h.remove()
        model.train(was_training)
    return flops
