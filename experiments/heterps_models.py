"""Models of the HeterPS reproduction that the zoo does not have: a DLRM-like recommender.

``dlrm`` follows DLRM (Naumov et al. 2019, the Criteo configuration scaled
down): 13 dense features through a bottom MLP 512-256-64; 26 sparse fields,
each an ``nn.EmbeddingBag(rows, 64, mode="sum")`` pooling ``pooling`` ids a
sample; the pairwise dot products of the 27 vectors (lower triangle, 351
values) concatenated with the bottom output into a top MLP 1024-1024-512-256-1.

The layer list is extracted with :func:`sim.torch_extract.from_torch` on the
meta device (no memory for the 26 tables of ``rows x 64`` floats is
allocated) and committed as experiments/configs/heterps/dlrm.yaml:

    python -m experiments.heterps_models
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sim.workload import save_model_file

OUT = Path(__file__).parent / "configs" / "heterps" / "dlrm.yaml"


def dlrm(batch: int = 2, tables: int = 26, rows: int = 1_000_000, dim: int = 64, dense: int = 13,
         bottom: tuple[int, ...] = (512, 256), top: tuple[int, ...] = (1024, 1024, 512, 256),
         pooling: int = 4) -> tuple[Any, Any]:
    """``(module, example_input)`` of the DLRM-like model (on the current default device)."""
    import torch
    from torch import nn

    def mlp(widths: list[int], last_relu: bool) -> nn.Sequential:
        mods: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
            mods.append(nn.Linear(a, b))
            if last_relu or i < len(widths) - 2:
                mods.append(nn.ReLU())
        return nn.Sequential(*mods)

    class Interaction(nn.Module):
        """Pairwise dot products of the field vectors, strictly lower triangle."""

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            z = torch.bmm(x, x.transpose(1, 2))
            i, j = torch.tril_indices(x.shape[1], x.shape[1], offset=-1, device=x.device)
            return z[:, i, j]

    class Dlrm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bottom = mlp([dense, *bottom, dim], last_relu=True)
            self.emb = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum") for _ in range(tables))
            self.interaction = Interaction()
            self.top = mlp([dim + (tables + 1) * tables // 2, *top, 1], last_relu=False)

        def forward(self, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            b = self.bottom(x)
            e = [emb(ids[:, t]) for t, emb in enumerate(self.emb)]
            z = self.interaction(torch.stack([b, *e], dim=1))
            return self.top(torch.cat([b, z], dim=1))

    return Dlrm(), (torch.randint(0, rows, (batch, tables, pooling)), torch.randn(batch, dense))


def main() -> None:
    import torch

    from sim.torch_extract import from_torch

    with torch.device("meta"):
        module, example = dlrm()
    model = from_torch(module, example, name="dlrm")
    save_model_file(model, OUT)
    print(f"{OUT}: {len(model.layers)} layers, {model.param_bytes / 1e9:.2f} GB params, "
          f"{model.fwd_flops / 1e6:.2f} MFLOP/sample fwd")


if __name__ == "__main__":
    main()
