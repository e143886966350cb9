"""Clustered oracles: references that read the scenario's true latent groups (``requires =
{"groups"}``), the upper bounds clustered methods are read against.

- ``clustered_oracle`` (FedAvg inside each true latent group, SP-CACW's oracle): one whole
  model per group, FedAvg-ed over that group's participants; the sweeps' oracle.
- ``clustered_oracle_se``: FedAvg-SE inside each group (a shared encoder per group, private
  heads), the reference for HDC-FL's prototypes, which are group encoders paired with private
  heads.

FedAvg inside fixed groups is also what PACFL runs once its clustering is done: both compose
the functions of ``raylf.methods.shared`` (a client's group model as a per-client extra, its
update as a share in its group, the scoring).
"""

from __future__ import annotations

import numpy as np
import torch

from raylf.methods.base import ClientUpdate, Deployment, FitPlan, Method, register, share
from raylf.methods.shared import (
    group_deployment,
    group_extras,
    group_means,
    group_plan,
    group_state,
)


def latent_group_ids(ctx) -> np.ndarray:
    """Each client's true group as 0..G−1."""
    assert ctx.latent_groups is not None, "validate refuses scenarios without latent groups"
    return np.unique(ctx.latent_groups, return_inverse=True)[1]


@register
class ClusteredOracle(Method):
    """A whole model per true latent group, n_k-averaged over the group's participants (shares
    reduced per group on the workers); each participant downloads its group's model."""

    name = "clustered_oracle"
    requires = frozenset({"groups"})
    oracle = True

    def server_init(self, init):
        return group_state(init, torch.as_tensor(latent_group_ids(self.ctx)))

    def broadcast(self, state, rnd):
        return {}

    def extras(self, state, client_ids, rnd):
        return group_extras(state, client_ids)

    def aggregate(self, state, uploads, rnd):
        return state | {"models": group_means(state["models"], uploads)}, {}

    def plan(self, client):
        return group_plan(client)

    def deploy(self, client):
        return group_deployment(client)


@register
class ClusteredOracleSE(Method):
    """One shared encoder per latent group, n_k-averaged over that group's participants (shares
    reduced per group on the workers); private heads as in FedAvg-SE. Every participant
    downloads the stacked group encoders, so bytes down count G encoders per client."""

    name = "clustered_oracle_se"
    personal_state = True
    requires = frozenset({"groups"})
    oracle = True

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        self.group_of = latent_group_ids(ctx)
        self.num_groups = int(self.group_of.max()) + 1

    def server_init(self, init):
        encoder = init[self.ctx.layout.part("encoder")]
        return {"encoders": encoder.repeat(self.num_groups, 1)}

    def broadcast(self, state, rnd):
        return {"encoders": state["encoders"]}

    def extras(self, state, client_ids, rnd):
        """Each client's group: which encoder is its."""
        return {int(c): int(self.group_of[int(c)]) for c in client_ids}

    def aggregate(self, state, uploads, rnd):
        return {"encoders": group_means(state["encoders"], uploads, "encoder")}, {}

    def client_init(self, cid, init):
        return init[self.ctx.layout.part("head")].clone()

    def plan(self, client):
        parts = self.ctx.layout.parts
        return FitPlan(self.model(client), lambda trained: ClientUpdate(
            {"encoder": share(trained[parts["encoder"]].clone(), client.data.n_train,
                              client.extra)},
            trained[parts["head"]].clone()))

    def model(self, client) -> torch.Tensor:
        """The client's group encoder with its own head."""
        return torch.cat([client.payload["encoders"][client.extra], client.personal])

    def deploy(self, client):
        return Deployment({"main": self.model(client)})
