"""The policy network: one shared scorer per device-type slot (permutation-equivariant logits).

A plain MLP over the whole observation must learn, for each of the
``max_types`` slots separately, how a type's features make it a good choice.
Here the logit of slot k is ``f(context, features of type k, pooled features
of all types)`` with one small MLP ``f`` shared by every slot, so what is
learnt about one type transfers to every slot and to clusters with a
different number or order of types. The value function is an MLP over the
whole observation. Masks are applied to the logits by sb3-contrib's
distribution as usual.

The layout of the observation (where the context and the slots lie) defaults
to the placement environment's; another environment (the DAG one, units as
slots) passes its own ``slot_layout``.
"""

from __future__ import annotations

from typing import Any

import torch
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
from torch import nn

# (context features, offset of the first slot, features per slot) of hetsim/Placement-v0
from schedulers.rl.env import slot_layout as placement_layout


class SlotExtractor(nn.Module):
    """Actor: per-slot logits (latent_dim_pi = max_types); critic: an MLP's last hidden layer.

    The observation holds a context vector at ``[0, ctx)`` and ``max_types``
    slots of ``slot_features`` each from ``per_at`` on (``layout``; default
    :func:`placement_layout`); a slot's first feature is 1 when it holds a
    real type (pooling skips the others).
    """

    def __init__(self, feature_dim: int, max_types: int, hidden: int = 64,
                 vf_arch: tuple[int, ...] = (128, 128), layout: tuple[int, int, int] | None = None) -> None:
        super().__init__()
        self.max_types = max_types
        self.ctx, self.per_at, self.slot_features = layout or placement_layout(max_types)
        self.latent_dim_pi = max_types
        self.latent_dim_vf = vf_arch[-1]
        self.slot = nn.Sequential(nn.Linear(self.ctx + 3 * self.slot_features, hidden), nn.Tanh(),
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
        per = features[:, self.per_at:self.per_at + M * self.slot_features].reshape(B, M, self.slot_features)
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
    """MaskableActorCriticPolicy whose logits come straight from :class:`SlotExtractor`.

    ``slot_layout``: the observation's (context features, first slot offset,
    features per slot); None is the placement environment's.
    """

    def __init__(self, *args: Any, slot_hidden: int = 64, slot_layout: tuple[int, int, int] | None = None,
                 **kwargs: Any) -> None:
        self.slot_hidden = slot_hidden
        self.slot_layout = tuple(slot_layout) if slot_layout is not None else None
        super().__init__(*args, **kwargs)

    def _build_mlp_extractor(self) -> None:
        n_types = int(self.action_space.n)  # type: ignore[attr-defined]
        self.mlp_extractor = SlotExtractor(self.features_dim, n_types, self.slot_hidden,  # type: ignore[assignment]
                                           layout=self.slot_layout)  # type: ignore[arg-type]

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
        if self.slot_layout is not None:  # placement policies saved before the option load unchanged
            data["slot_layout"] = self.slot_layout
        return data
