"""IFCA (Ghosh et al., NeurIPS 2020, "An Efficient Framework for Clustered Federated Learning"): S
cluster models, each client joins the one with the lowest loss on its own training data and trains
only that one.

Option II of the paper (model averaging): a participant uploads its trained model as a share in
the group of its chosen cluster, so the workers reduce one n_k-weighted sum per cluster and a
cluster nobody chose keeps its model. Evaluation chooses by the same training-loss rule and
scores the chosen model on the evaluation split; the choice is the clients-table ``cluster``.

Decision — the loss sample: at most ``loss_samples`` training samples, drawn once per client
from the trial seed, so the choice made for training and for evaluation in a round see the same
samples and the choice recorded for the test and validation splits is the same one. Test or
validation data never enter the choice (the PACFL repo's IFCA baseline picks by test accuracy).
Decision — no re-drawing of inits until every cluster is chosen (the author CIFAR code's
``find_good_initializer``): the S inits are drawn once from the trial seed.
"""

from __future__ import annotations

import torch
from pydantic import Field

from raylf.methods.base import ClientUpdate, Deployment, Method, MethodParams, register, share
from raylf.methods.shared import group_means
from raylf.seeding import generator


class IFCAParams(MethodParams):
    """Defaults: the HDC-FL paper's Table 5 (S = 4, the loss on at most 512 local samples)."""

    clusters: int = Field(4, ge=1, le=64, description="S, the number of cluster models, each "
                                                        "from its own seeded init")
    loss_samples: int = Field(512, ge=1, description="at most this many of a client's training "
                                                      "samples decide its cluster")


def lowest_loss(trainer, models: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> int:
    """Index of the model (a row of ``models``) with the lowest mean loss on (x, y)."""
    losses = []
    for model in models:
        trainer.load(model)
        losses.append(trainer.loss(x, y))
    return int(torch.tensor(losses).argmin())


@register
class IFCA(Method):
    name = "ifca"
    Params = IFCAParams

    def server_init(self, init):
        return {"models": self.ctx.initial_models(self.params.clusters)}

    def broadcast(self, state, rnd):
        return {"models": state["models"]}

    def aggregate(self, state, uploads, rnd):
        return ({"models": group_means(state["models"], uploads)},
                {"clusters_chosen": float(len(uploads.groups("model")))})

    def choose(self, trainer, models: torch.Tensor, data) -> int:
        n = len(data.y_train)
        rows = torch.randperm(n, generator=generator(self.ctx.seed, data.cid))
        rows = rows[: self.params.loss_samples].to(data.y_train.device)
        return lowest_loss(trainer, models, data.x_train[rows], data.y_train[rows])

    def local_update(self, client):
        """The chosen cluster model, fitted as FedAvg's. Not a ``FitPlan`` (so not trained in
        cohorts): the start is chosen by every cluster model's loss on the client's own data,
        which takes the trainer, and a plan is declared before the worker runs anything; the
        fit itself is ``LocalTrainer.fit``'s (``raylf.training.sgd``)."""
        trainer, data, models = client.trainer, client.data, client.payload["models"]
        cluster = self.choose(trainer, models, data)
        trainer.load(models[cluster])
        trainer.fit(data.x_train, data.y_train, seed=client.seed)
        return ClientUpdate({"model": share(trainer.vector(), data.n_train, cluster)})

    def deploy(self, client):
        """The cluster model the same rule chooses now, its rows marked with it."""
        models = client.payload["models"]
        cluster = self.choose(client.trainer, models, client.data)
        return Deployment({"main": models[cluster]}, {"main": {"cluster": cluster}})
