"""Clustered oracle: FedAvg-SE run separately inside each true latent group (a reference that
reads the scenario's group labels, the upper bound clustered methods are read against)."""

from __future__ import annotations

import numpy as np
import torch

from raylf.methods.base import ClientUpdate, FitPlan, Method, register, share


@register
class ClusteredOracle(Method):
    """One shared encoder per latent group, n_k-averaged over that group's participants (shares
    reduced per group on the workers); private heads as in FedAvg-SE. Every participant
    downloads the stacked group encoders, so bytes down count G encoders per client."""

    name = "clustered_oracle"
    personal_state = True
    requires = frozenset({"groups"})

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        assert ctx.latent_groups is not None, "validate refuses scenarios without latent groups"
        labels, self.group_of = np.unique(ctx.latent_groups, return_inverse=True)
        self.num_groups = len(labels)

    def server_init(self, init):
        encoder = init[self.ctx.layout.part("encoder")]
        return {"encoders": encoder.repeat(self.num_groups, 1)}

    def broadcast(self, state, rnd):
        return {"encoders": state["encoders"]}

    def extras(self, state, client_ids):
        """Each client's group: which encoder is its."""
        return {int(c): int(self.group_of[int(c)]) for c in client_ids}

    def aggregate(self, state, uploads, rnd):
        encoders = state["encoders"].clone()
        for g in uploads.groups("encoder"):
            encoders[g] = uploads.mean("encoder", g)
        return {"encoders": encoders}, {}

    def client_init(self, cid, init):
        return init[self.ctx.layout.part("head")].clone()

    def plan(self, payload, personal, data, extra):
        parts = self.ctx.layout.parts
        return FitPlan(self.deployable(payload, personal, extra), lambda trained: ClientUpdate(
            {"encoder": share(trained[parts["encoder"]].clone(), data.n_train, extra)},
            trained[parts["head"]].clone()))

    def deployable(self, payload, personal, extra):
        return torch.cat([payload["encoders"][extra], personal])
