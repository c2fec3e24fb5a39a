"""Module factories that test configs name as {torch: "tests.factories:NAME"}."""

import torch


def two_layer(width: int = 8) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.ReLU(), torch.nn.Linear(width, 2))


def not_a_module() -> int:
    return 3
