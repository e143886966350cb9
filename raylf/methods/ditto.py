"""Ditto (Li et al., ICML 2021; methods.md D8): FedAvg's global model plus a personal model per
client pulled towards the global one, min F_k(v) + (λ/2)‖v − w^t‖².

Each round a participant first trains its personal model v_k (resident on its worker) for
``personal_epochs`` with the proximal gradient λ(v_k − w^t) anchored at the received w^t, then
trains its copy of w^t exactly as FedAvg does and uploads it (n_k-weighted mean). Both are
evaluated: ``personal`` (v_k, the method's model) and ``global`` (w^t) in separate columns
(``acc_mean`` and ``acc_mean_global``), never mixed as PFLlib's log does.
"""

from __future__ import annotations

from pydantic import Field

from raylf.methods.base import ClientUpdate, Method, MethodParams, register, score
from raylf.seeding import derive


class DittoParams(MethodParams):
    """Defaults: λ = 1 (the authors' scripts; methods.md Decision), one personal epoch
    (PFLlib ``plocal_epochs``, FL-bench ``pers_epoch``)."""

    lam: float = Field(1.0, ge=0, description="proximal strength λ of the personal model "
                                              "towards the received global model")
    personal_epochs: int = Field(1, ge=1, description="epochs of the personal update per round")


@register
class Ditto(Method):
    name = "ditto"
    Params = DittoParams
    personal_state = True
    evaluation = "own"  # the personal and the global model
    averaged = frozenset({"model"})
    deployables = ("personal", "global")

    def server_init(self, init):
        return {"model": init.clone()}

    def broadcast(self, state, rnd):
        return {"model": state["model"]}

    def aggregate(self, state, uploads, rnd):
        return {"model": uploads.mean("model")}, {}

    def client_init(self, cid, init):
        return init.clone()

    def local_update(self, trainer, payload, personal, data, seed, extra, *, rnd):
        anchor = payload["model"]
        trainer.load(personal)
        trainer.fit(data.x_train, data.y_train, seed=derive(seed, "method", 0),
                    epochs=self.params.personal_epochs, prox=(anchor, self.params.lam))
        personal = trainer.vector()
        trainer.load(anchor)
        trainer.fit(data.x_train, data.y_train, seed=seed)
        return ClientUpdate({"model": trainer.vector()}, personal)

    def deployable(self, payload, personal, extra):
        return personal

    def evaluate(self, trainer, payload, personal, data, extra, *, rnd, seed):
        rows = []
        for name, vector in zip(self.deployables, (personal, payload["model"])):
            trainer.load(vector)
            rows.append(score(trainer.predict(data.x_test), data.y_test) | {"deployable": name})
        return rows

