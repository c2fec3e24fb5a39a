"""The policy network: one shared scorer per device-type slot (permutation-equivariant logits).

A plain MLP over the whole observation must learn, for each of the
``max_types`` slots separately, how a type's features make it a good choice.
Here the logit of slot k is ``f(context, features of type k, pooled features
of all types)`` with one small MLP ``f`` shared by every slot, so what is
learnt about one type transfers to every slot and to clusters with a
different number or order of types. The value function is an MLP over the
whole observation. Masks are applied to the logits by sb3-contrib's
distribution as usual.
"""

from __future__ import annotations

from typing import Any

import torch
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
from torch import nn

from schedulers.rl.env import GLOBAL_FEATURES, LAYER_FEATURES, SUMMARY_FEATURES, TYPE_FEATURES


class SlotExtractor(nn.Module):
    """Actor: per-slot logits (latent_dim_pi = max_types); critic: an MLP's last hidden layer."""

    def __init__(self, feature_dim: int, max_types: int, hidden: int = 64,
                 vf_arch: tuple[int, ...] = (128, 128)) -> None:
        super().__init__()
        self.max_types = max_types
        self.ctx = GLOBAL_FEATURES + 2 * LAYER_FEATURES + SUMMARY_FEATURES
        self.per_at = self.ctx + max_types + 1
        self.latent_dim_pi = max_types
        self.latent_dim_vf = vf_arch[-1]
        self.slot = nn.Sequential(nn.Linear(self.ctx + 3 * TYPE_FEATURES, hidden), nn.Tanh(),
                                  nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, 1))
        layers: list[nn.Module] = []
        d = feature_dim
        for h in vf_arch:
            layers += [nn.Linear(d, h), nn.Tanh()]
            d = h
        self.value = nn.Sequential(*layers)

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.forward_actor(features), self.forward_critic(features)

    def forward_actor(self, features: torch.Tensor) -> torch.Tensor:
        B, M = features.shape[0], self.max_types
        ctx = features[:, : self.ctx]
        per = features[:, self.per_at:].reshape(B, M, TYPE_FEATURES)
        present = per[:, :, :1]                          # slot holds a real type
        big = torch.finfo(per.dtype).max
        mx = torch.where(present > 0, per, -big).amax(dim=1)
        mn = torch.where(present > 0, per, big).amin(dim=1)
        pooled = torch.cat([mx, mn], dim=1).clamp(-10, 10)
        x = torch.cat([ctx[:, None, :].expand(B, M, -1), per, pooled[:, None, :].expand(B, M, -1)], dim=2)
        return self.slot(x).squeeze(-1)

    def forward_critic(self, features: torch.Tensor) -> torch.Tensor:
        return self.value(features)


class SlotPolicy(MaskableActorCriticPolicy):
    """MaskableActorCriticPolicy whose logits come straight from :class:`SlotExtractor`."""

    def __init__(self, *args: Any, slot_hidden: int = 64, **kwargs: Any) -> None:
        self.slot_hidden = slot_hidden
        super().__init__(*args, **kwargs)

    def _build_mlp_extractor(self) -> None:
        n_types = int(self.action_space.n)  # type: ignore[attr-defined]
        self.mlp_extractor = SlotExtractor(self.features_dim, n_types, self.slot_hidden)  # type: ignore[assignment]

    def _build(self, lr_schedule: Any) -> None:
        super()._build(lr_schedule)
        self.action_net = nn.Identity()
        last: Any = self.mlp_extractor.slot[-1]  # type: ignore[index]
        nn.init.orthogonal_(last.weight, gain=0.01)
        nn.init.zeros_(last.bias)
        self.optimizer = self.optimizer_class(self.parameters(), lr=lr_schedule(1),  # type: ignore[call-arg]
                                              **self.optimizer_kwargs)

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        data["slot_hidden"] = self.slot_hidden
        return data
