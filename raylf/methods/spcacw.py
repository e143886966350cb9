"""SP-CACW (Kiselman & Levy, "SP-CACW: Convergence-Aware Client Weighting for Selfish Personalized
Learning", sections 3-4 and appendix F): selfish targets weighting their peers' gradients by learned
α, and the paper's reference rules on the same per-step runtime (``raylf.methods.perstep``).

Each target t is a learner; every client (M peers, t included) sends its minibatch gradient at
w_t each step. The server keeps, per target, the weights α (T, M), the bias estimates
b̂_i ← (1 − β)·b̂_i + β·(g_i − g_t) (T, M, P), the Gram matrices A_b += B̂ᵀB̂ and A_g += GᵀG of
the epoch, and the sums of g_t and g_t² for λ_reg; its direction is Σ_i α_i g_i. After one pass
over its own data (K = ⌈n_t/B⌉ steps) the target estimates its smoothness L by Hessian-vector
power iteration on a fresh batch and reports it with κ = η·L; the server then sets α to the
minimizer over the simplex of J(α) = αᵀ(A_b + κ·A_g)α / K + λ_reg·Σα³ (Follow-the-Leader on the
accumulated quadratic proxy; warm-started projected gradient descent until converged) and resets
the accumulators. Everything for all targets is one batched tensor operation per step.

Registered names:
- ``spcacw``: λ_reg = γ·tr(Var(g_t)) over the epoch (raylf's reading; γ = 1), or the paper
  read literally with ``reg_scale: var_norm_sq`` (γ·‖Var(g_t)‖²);
- ``spcacw_noreg``: λ_reg = 0;
- ``selfish_local`` (α = e_t, "Only My Data"), ``selfish_uniform`` (α = 1/M, FedAvg-like) and
  ``selfish_oracle`` (uniform over the target's true latent cluster; needs group labels): fixed α,
  the paper's reference points, with the same steps, optimizer and data order as SP-CACW. They are
  registered names rather than a ``rule`` parameter because the oracle alone needs the scenario's
  group labels (``requires``) and each rule is its own row in a leaderboard; ``selfish_`` keeps
  them apart from the round-based ``local`` method.

``targets: all`` (default) runs one selfish learner per client at once, so the clients table
holds every client's own accuracy and compares with every other method's; ``targets: [0]`` is
the paper's single target (only targets are evaluated). With ``all`` a step costs M² gradients
and the server holds T·M·P bias estimates.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field

from raylf.methods.base import MethodParams, register
from raylf.methods.perstep import PeerStepMethod
from raylf.methods.simplex import minimize_on_simplex
from raylf.seeding import generator
from raylf.training.sgd import epoch_length


def smoothness(trainer, x: torch.Tensor, y: torch.Tensor, iters: int,
               gen: torch.Generator) -> float:
    """The largest |eigenvalue| of the loss Hessian at the loaded weights on (x, y), by power
    iteration with Hessian-vector products (Pearlmutter: one forward and one gradient graph, then
    one backward pass per iteration). Train mode as in training (one forward, so dropout is the
    same for every product); the loaded vector, BatchNorm statistics included, is restored."""
    saved = trainer.flat.clone()
    model = trainer.model
    model.train()
    params = [p for p in model.parameters()]
    for p in params:
        p.requires_grad_(True)
    with torch.backends.cudnn.flags(enabled=False):  # cuDNN RNNs have no double backward
        loss = F.cross_entropy(model(x), y)
        grads = torch.autograd.grad(loss, params, create_graph=True)
        v = [torch.randn(p.shape, generator=gen).to(p.device) for p in params]
        estimate = 0.0
        for _ in range(iters):
            norm = torch.sqrt(sum((u * u).sum() for u in v))
            v = [u / norm for u in v]
            hv = torch.autograd.grad(grads, params, grad_outputs=v, retain_graph=True)
            estimate = abs(float(sum((a * b).sum() for a, b in zip(v, hv))))
            v = [h.detach() for h in hv]
    model.zero_grad(set_to_none=True)
    trainer.flat.copy_(saved)
    return estimate


def trace_variance(total: torch.Tensor, squares: torch.Tensor, k: int,
                   scale: str) -> torch.Tensor:
    """Per target, from the epoch's sums of g and g² over k steps: Σ_p Var(g_p) (``trace``) or
    Σ_p Var(g_p)² (``var_norm_sq``), the sample variance over the k steps (0 when k < 2)."""
    if k < 2:
        return torch.zeros(total.shape[:-1], dtype=total.dtype)
    var = (squares - total * total / k).clamp(min=0) / (k - 1)
    return var.sum(-1) if scale == "trace" else var.pow(2).sum(-1)


class SelfishParams(MethodParams):
    """Default ``all``: every client a target, so the clients table and acc_mean compare with
    every other method's; the paper's setting is ``[0]`` (its section 2, client 0)."""

    targets: Literal["all"] | list[int] = Field(
        "all", description="clients that learn a model of their own: all (one selfish learner "
                           "per client, every client evaluated) or a list of ids ([0]: the "
                           "paper's single target; only targets are evaluated)")


class SPCACWNoRegParams(SelfishParams):
    """A constant β (the SP-CACW paper's section 4.1; 0.1 is raylf's choice) and 10 power
    iterations for L (its appendix F.1 names the method, not the count); PGD runs until
    converged (a fixed small count does not converge late in training), the cap only guards."""

    beta: float = Field(0.1, gt=0, le=1, description="bias EMA rate β, constant (section 4.1)")
    pgd_tol: float = Field(1e-7, gt=0, description="PGD on α stops when no weight changes by "
                                                   "more than this in one step")
    pgd_max_iter: int = Field(100_000, ge=1, description="safety cap on PGD iterations")
    power_iters: int = Field(10, ge=1, description="HVP power iterations for L (appendix F.1)")


class SPCACWParams(SPCACWNoRegParams):
    """Defaults: β, power iterations, λ_reg's reading and γ from the SP-CACW paper's appendix F.1
    and raylf's reading of it (γ = 1 on the trace of the variance; ``var_norm_sq`` is the paper's
    text read literally)."""

    gamma: float = Field(1.0, ge=0, description="λ_reg = γ · (the variance measure below)")
    reg_scale: Literal["trace", "var_norm_sq"] = Field(
        "trace", description="trace: Σ_p Var(g_t,p) over the epoch (units of J); var_norm_sq: "
                             "‖Var(g_t)‖², the paper's formula literally (4-5 orders smaller)")


def check_targets(spec, params: SelfishParams) -> list[tuple[str, str]]:
    """The ``targets`` problems of a selfish method's spec (every one has the parameter)."""
    targets, n = params.targets, spec.federation.num_clients
    if targets == "all" or (targets and len(set(targets)) == len(targets)
                            and all(0 <= t < n for t in targets)):
        return []
    return [("method.params.targets", (
        f"targets must be distinct client ids in 0..{n - 1} (or all); got {targets}"))]


def target_ids(targets: Literal["all"] | list[int], num_clients: int) -> np.ndarray:
    """The learners of a selfish method: sorted target ids."""
    return np.arange(num_clients) if targets == "all" else np.array(sorted(targets))


def weighted_directions(alpha: torch.Tensor, grads: torch.Tensor) -> torch.Tensor:
    """(T, P) directions Σ_i α_ti g_i from every client's upload ``grads`` (M, T, P), its
    gradients at each target's weights: the step of SP-CACW and of every reference rule."""
    peers = grads.transpose(0, 1)  # (T, M, P): target t's peers' gradients at w_t
    return torch.einsum("tm,tmp->tp", alpha.to(peers.dtype), peers)


def local_alpha(targets: np.ndarray, num_clients: int) -> torch.Tensor:
    """α = e_t: each target on its own gradients only ("Only My Data")."""
    return F.one_hot(torch.as_tensor(targets), num_clients).double()


def uniform_alpha(targets: np.ndarray, num_clients: int) -> torch.Tensor:
    """α = 1/M for every peer: FedAvg-like, and SP-CACW's start before its first update."""
    return torch.full((len(targets), num_clients), 1.0 / num_clients, dtype=torch.float64)


def oracle_alpha(targets: np.ndarray, latent_groups: np.ndarray) -> torch.Tensor:
    """Uniform over the peers in the target's true latent cluster."""
    groups = torch.tensor(latent_groups)
    same = (groups[torch.as_tensor(targets)][:, None] == groups[None, :]).double()
    return same / same.sum(1, keepdim=True)


class FixedSelfish(PeerStepMethod):
    """A reference rule: one learner per target stepping along Σ_i α_ti g_i with α fixed by
    ``alpha``; the same steps, optimizer and data order as SP-CACW, nothing learned."""

    Params = SelfishParams

    @classmethod
    def check(cls, spec, params):
        return super().check(spec, params) + check_targets(spec, params)

    def learner_ids(self):
        return target_ids(self.params.targets, self.ctx.num_clients)

    def alpha(self) -> torch.Tensor:
        """The rule's weights (T, M), float64."""
        raise NotImplementedError

    def server_init(self, init):
        return super().server_init(init) | {"alpha": self.alpha()}

    def directions(self, state, grads, rnd):
        return state, weighted_directions(state["alpha"], grads), {}


@register
class SPCACW(PeerStepMethod):
    """One learner per target stepping along Σ_i α_ti g_i, α learned by Follow-the-Leader on the
    epoch's quadratic proxy, as the module docstring details."""

    name = "spcacw"
    Params = SPCACWParams
    proposed_in = "SP-CACW: Convergence-Aware Client Weighting for Selfish Personalized Learning"

    @classmethod
    def check(cls, spec, params):
        return super().check(spec, params) + check_targets(spec, params)

    def learner_ids(self):
        return target_ids(self.params.targets, self.ctx.num_clients)

    # ---- server half ----------------------------------------------------------------------
    def server_init(self, init):
        t, m, p = len(self.learners), self.ctx.num_clients, init.numel()
        zeros = torch.zeros(t, dtype=torch.float64)
        return super().server_init(init) | {
            "alpha": uniform_alpha(self.learners, m),
            "bias": torch.zeros(t, m, p),
            "gram_b": torch.zeros(t, m, m, dtype=torch.float64),
            "gram_g": torch.zeros(t, m, m, dtype=torch.float64),
            "g_sum": torch.zeros(t, p, dtype=torch.float64),
            "g_sq": torch.zeros(t, p, dtype=torch.float64),
            "steps": torch.zeros(t, dtype=torch.int64),
            "updates": torch.zeros(t, dtype=torch.int64),
            "updated_round": torch.zeros(t, dtype=torch.int64),
            "L": zeros, "lam_reg": zeros.clone(),
            "pgd_iters": torch.zeros(t, dtype=torch.int64),
        }

    def directions(self, state, grads, rnd):
        direction = weighted_directions(state["alpha"], grads)
        peers = grads.transpose(0, 1)  # (T, M, P): target t's peers' gradients at w_t
        own = peers[torch.arange(len(self.learners)), torch.as_tensor(self.learners)]
        beta = self.params.beta
        bias = (1 - beta) * state["bias"] + beta * (peers - own[:, None])
        own64 = own.double()
        state = state | {
            "bias": bias,
            "gram_b": state["gram_b"] + torch.einsum("tip,tjp->tij", bias, bias).double(),
            "gram_g": state["gram_g"] + torch.einsum("tip,tjp->tij", peers, peers).double(),
            "g_sum": state["g_sum"] + own64,
            "g_sq": state["g_sq"] + own64 * own64,
            "steps": state["steps"] + 1,
        }
        return state, direction, {}

    def after_reports(self, state, uploads, rnd):
        """α updates of the targets that finished an epoch (they reported their smoothness)."""
        if "smoothness" not in uploads:
            return state, {}
        state = {k: v.clone() if torch.is_tensor(v) else v for k, v in state.items()}
        due = torch.as_tensor([self.index[int(c)] for c in uploads.senders["smoothness"]])
        lipschitz, kappa = uploads.tensors["smoothness"].double().T
        steps = state["steps"][due].double()
        lam = torch.as_tensor([self.lam_reg(state["g_sum"][k], state["g_sq"][k],
                                            int(state["steps"][k])) for k in due.tolist()],
                              dtype=torch.float64)
        q = (state["gram_b"][due] + kappa[:, None, None] * state["gram_g"][due]) \
            / steps[:, None, None]
        solution = minimize_on_simplex(q.numpy(), lam.numpy(), state["alpha"][due].numpy(),
                                       tol=self.params.pgd_tol,
                                       max_iter=self.params.pgd_max_iter)
        state["alpha"][due] = torch.from_numpy(solution.alpha)
        state["L"][due], state["lam_reg"][due] = lipschitz, lam
        state["pgd_iters"][due] = torch.from_numpy(solution.iterations)
        state["updates"][due] += 1
        state["updated_round"][due] = rnd
        for key in ("gram_b", "gram_g", "g_sum", "g_sq", "steps"):
            state[key][due] = 0
        due = due.tolist()
        return state, self.update_diagnostics(state, due)

    def lam_reg(self, total: torch.Tensor, squares: torch.Tensor, steps: int) -> float:
        """λ_reg = γ·(the epoch's variance measure of g_t), from its sums over ``steps``."""
        measure = trace_variance(total, squares, steps, self.params.reg_scale)
        return self.params.gamma * float(measure)

    def update_diagnostics(self, state, due: list[int]) -> dict[str, float]:
        """The first target's α, support, L, λ_reg when it updated; means over the targets
        updated this round when there are several."""
        out: dict[str, float] = {}
        alpha = state["alpha"]
        support = (alpha[due] > 0).sum(1).double()
        if 0 in due:
            out |= {f"alpha_{i}": float(a) for i, a in enumerate(alpha[0])}
            out |= {"alpha_support": float((alpha[0] > 0).sum()), "L": float(state["L"][0]),
                    "lam_reg": float(state["lam_reg"][0]),
                    "pgd_iters": float(state["pgd_iters"][0])}
        if len(self.learners) > 1:
            out |= {"alpha_support_mean": float(support.mean()),
                    "L_mean": float(state["L"][due].mean()),
                    "lam_reg_mean": float(state["lam_reg"][due].mean()),
                    "pgd_iters_max": float(state["pgd_iters"][due].max())}
        return out

    def tables(self, state, rnd):
        """``alpha``: one row per (target, peer) for every target whose α changed this round."""
        updated = torch.nonzero(state["updated_round"] == rnd).flatten().tolist()
        rows: list[dict[str, Any]] = []
        for k in updated:
            for peer, a in enumerate(state["alpha"][k].tolist()):
                rows.append({"target": int(self.learners[k]), "peer": peer, "alpha": a,
                             "update": int(state["updates"][k])})
        return {"alpha": rows} if rows else {}

    # ---- client half ----------------------------------------------------------------------
    def learner_upload(self, client, personal):
        """At the end of each pass over its data, a target estimates L on a fresh batch at its
        new weights and reports (L, κ = lr·L)."""
        trainer, data = client.trainer, client.data
        if client.rnd % epoch_length(data.n_train, trainer.batch_size):
            return {}
        gen = generator(client.seed, 0)
        pick = torch.randperm(data.n_train, generator=gen)[: trainer.batch_size]
        pick = pick.to(data.x_train.device)
        trainer.load(personal["weights"])
        lipschitz = smoothness(trainer, data.x_train[pick], data.y_train[pick],
                               self.params.power_iters, gen)
        return {"smoothness": torch.tensor([lipschitz, client.optimizer.lr * lipschitz])}


@register
class SPCACWNoReg(SPCACW):
    """The ablation without λ_reg: SP-CACW's α on the quadratic proxy alone."""

    name = "spcacw_noreg"
    Params = SPCACWNoRegParams

    def lam_reg(self, total, squares, steps):
        return 0.0


@register
class SelfishLocal(FixedSelfish):
    name = "selfish_local"

    def alpha(self):
        return local_alpha(self.learners, self.ctx.num_clients)


@register
class SelfishUniform(FixedSelfish):
    name = "selfish_uniform"

    def alpha(self):
        return uniform_alpha(self.learners, self.ctx.num_clients)


@register
class SelfishOracle(FixedSelfish):
    name = "selfish_oracle"
    requires = frozenset({"groups"})
    oracle = True

    def alpha(self):
        return oracle_alpha(self.learners, self.ctx.latent_groups)
