"""A client worker's logic: hosts a shard of virtual clients and runs their client half.

The data and one reusable model stay resident on the worker's device for the whole experiment;
personal state stays in the worker's CPU memory and visits the device only while its client
trains or is evaluated. A round moves the broadcast in and the uploads out: per-client tensors
stacked per key, shares already summed per key and group.
"""

from __future__ import annotations

import io
import logging
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow.fs as pafs
import torch

from raylf import learning_check
from raylf.methods.base import ClientRound, ClientUpdate, Deployment, FitPlan, Share
from raylf.runtime.blueprint import Blueprint, describe_device, pick_device
from raylf.runtime.memory import peak_memory
from raylf.seeding import client_seed, derive
from raylf.storage import filesystem, publish
from raylf.training.cohort import (
    CohortMember,
    CohortTrainer,
    cohorts,
    not_worthwhile,
    unsupported_reason,
)
from raylf.training.sequential import FitResult
from raylf.tree import finite, map_leaves, tensor_bytes

SPLITS = ("test", "val")
log = logging.getLogger("raylf")


def _with_dead_units(update: ClientUpdate, dead: float | None) -> ClientUpdate:
    if dead is not None:
        update.metrics = {**update.metrics, "dead_relu_fraction": dead}
    return update


def upload_bytes(upload: dict[str, Any]) -> int:
    """Bytes a client sends: each tensor's size; a share adds 8 bytes per (group, weight) pair
    it names (a key in ``averaged`` is weighted by n_k, which the server already knows)."""
    total = 0
    for value in upload.values():
        if isinstance(value, Share):
            total += tensor_bytes(value.value) + 8 * len(value.weights)
        else:
            total += tensor_bytes(value)
    return total


class Reduction:
    """Uploads of one worker's clients: plain tensors stacked per key (with their senders),
    shares summed per key and group in float64 (the same sum however clients are split)."""

    def __init__(self, averaged: frozenset[str], n_train: np.ndarray):
        self.averaged, self.n_train = averaged, n_train
        self.stacked: dict[str, list[torch.Tensor]] = {}
        self.senders: dict[str, list[int]] = {}
        self.sums: dict[str, dict[int, torch.Tensor]] = {}
        self.weights: dict[str, dict[int, float]] = {}

    def add(self, cid: int, upload: dict[str, Any]) -> None:
        for key, value in upload.items():
            if isinstance(value, Share):
                terms, vector = value.weights, value.value
            elif key in self.averaged:
                terms, vector = {0: float(self.n_train[cid])}, value
            else:
                self.stacked.setdefault(key, []).append(value)
                self.senders.setdefault(key, []).append(cid)
                continue
            sums, weights = self.sums.setdefault(key, {}), self.weights.setdefault(key, {})
            for group, weight in terms.items():
                term = weight * vector.double()
                sums[group] = sums[group] + term if group in sums else term
                weights[group] = weights.get(group, 0.0) + weight

    def message(self) -> dict[str, Any]:
        return {
            "uploads": {k: torch.stack(v).cpu() for k, v in self.stacked.items()},
            "senders": {k: np.asarray(v, dtype=np.int64) for k, v in self.senders.items()},
            "sums": {k: {g: t.cpu() for g, t in groups.items()} for k, groups in self.sums.items()},
            "weights": self.weights,
        }


class ClientShard:
    def __init__(self, blueprint: Blueprint, client_ids: np.ndarray, threads: int | None = None,
                 index: int = 0):
        if threads:
            torch.set_num_threads(threads)
        self.index = index  # this worker's number: names its checkpoint file
        self.device = pick_device()
        self.device_name = describe_device(self.device)
        self.seed = blueprint.spec.seed
        self.is_evaluation_round = blueprint.spec.evaluates
        self.divergence_loss = blueprint.spec.federation.divergence_loss
        self.method = blueprint.method()
        self.trainer = blueprint.trainer(self.device)
        self.data = blueprint.federation.shard(client_ids, self.device)
        self.n_train = blueprint.federation.n_train
        self.splits = SPLITS if blueprint.federation.has_val else SPLITS[:1]
        self.cohort_setting = blueprint.spec.resources.cohort
        self.cohort: CohortTrainer | None = None
        if self.cohort_setting != "off" and self.method.plans_updates:
            model, shape = self.trainer.model, tuple(blueprint.federation.input_shape)
            reason = unsupported_reason(model)
            if reason is None and self.cohort_setting == "auto":
                reason = not_worthwhile(model, shape, self.device)
            if reason is None:
                self.cohort = CohortTrainer(self.trainer)
            else:
                log.warning("%s: no cohort training (%s); clients train one after another",
                            blueprint.spec.model.name, reason)
        self.phases = self.method.phases()
        self.personal: dict[int, Any] = {}
        if self.method.personal_state:
            init = blueprint.initial_vector()
            self.personal = {int(c): self.method.client_init(int(c), init) for c in client_ids}

    def _to_device(self, tree: Any) -> Any:
        return map_leaves(tree, lambda t: t.to(self.device, non_blocking=True), torch.Tensor)

    def _client(self, cid: int, rnd: int, seed: int, payload: dict[str, torch.Tensor],
                extras: dict[int, Any]) -> ClientRound:
        """Client ``cid``'s view of a hook: what it received, its state and data, the seed."""
        return ClientRound(rnd, self.data.client(cid), seed, self.trainer, self.trainer.optimizer,
                           payload, self._to_device(self.personal.get(cid)), extras.get(cid))

    def _logged(self, run: Callable[[], ClientUpdate]) -> tuple[ClientUpdate, list[FitResult]]:
        """A client's update and every fit and gradient it ran (the trainer's log)."""
        self.trainer.fits.clear()
        update = run()
        return update, list(self.trainer.fits)

    def _run_clients(self, client_ids: np.ndarray,
                     step: Callable[[int], tuple[ClientUpdate, list[FitResult]]]) -> dict:
        """``step(cid)`` → (update, fits) for each client in turn, reduced. Every fit and
        gradient is checked: a non-finite loss or one above ``federation.divergence_loss``
        stops the shard there (the experiment ends as diverged), and so does a personal state
        that is not finite (the server never sees it, and it would be evaluated as a model)."""
        reduction = Reduction(self.method.averaged, self.n_train)
        losses, up_bytes, metrics, diverged = [], [], [], False
        for cid in map(int, client_ids):
            update, fits = step(cid)
            if self.method.personal_state:
                self.personal[cid] = map_leaves(update.personal, lambda t: t.cpu(), torch.Tensor)
            reduction.add(cid, update.upload)
            losses.append(fits[-1].loss if fits else math.nan)
            up_bytes.append(upload_bytes(update.upload))
            metrics.append(update.metrics)
            if any(not math.isfinite(f.loss) or f.loss > self.divergence_loss for f in fits) \
                    or not finite(update.personal):
                diverged = True
                break
        return {
            "client_ids": np.asarray(client_ids[: len(losses)], dtype=np.int64),
            "loss": np.asarray(losses, dtype=np.float64),
            "diverged": diverged,
            "bytes_up": np.asarray(up_bytes, dtype=np.int64),
            "metrics": metrics,
            "peak_memory": peak_memory(self.device),
            "device": self.device_name,
            **reduction.message(),
        }

    def setup(self, client_ids: np.ndarray) -> dict[str, Any]:
        """The one-shot setup uploads of ``client_ids`` (seeded as round 0, never a round)."""

        def step(cid: int):
            client = self._client(cid, 0, derive(self.seed, "client", 0, cid), {}, {})
            return self._logged(lambda: ClientUpdate(self.method.setup(client),
                                                     self.personal.get(cid)))

        return self._run_clients(client_ids, step)

    def train(self, rnd: int, payload: dict[str, torch.Tensor], client_ids: np.ndarray,
              extras: dict[int, Any]) -> dict[str, Any]:
        """Local updates of ``client_ids`` (ascending): in lockstep cohorts when the method
        declares its update as a plan and the model allows it, else one after another.

        The trained models are probed for dead ReLUs on evaluation rounds only: the probe is
        read with that round's accuracies (``learning_check.not_learning``), and on other
        rounds it cost the heavy CNN a forward pass per client (2.7 ms of its ~80 ms)."""
        payload = self._to_device(payload)
        seeds = {int(c): client_seed(self.seed, rnd, int(c)) for c in client_ids}
        probe = self.is_evaluation_round(rnd)
        done = self._train_cohorts(rnd, payload, client_ids, extras, seeds, probe)

        def step(cid: int):
            if done is not None:
                update, fits, dead = done[cid]
                return _with_dead_units(update, dead), fits
            update, fits = self._logged(lambda: self.method.local_update(
                self._client(cid, rnd, seeds[cid], payload, extras)))
            # only a model this round trained is probed: after gradients alone (the per-step
            # methods) the loaded weights are whatever an earlier round left, not a result
            if probe and fits and fits[-1].steps > 0:
                update = _with_dead_units(update, self._dead_units(cid))
            return update, fits

        return self._run_clients(client_ids, step)

    def _dead_units(self, cid: int) -> float | None:
        """The dead-ReLU fraction of the model the client's training left loaded (a
        rounds-table diagnostic; ``raylf.learning_check``)."""
        probe = self.data.client(cid).x_train[: learning_check.PROBE_SAMPLES]
        return learning_check.dead_relu_fraction(self.trainer.model.encoder, probe)

    def _train_cohorts(self, rnd: int, payload, client_ids: np.ndarray,
                       extras: dict[int, Any], seeds: dict[int, int],
                       probe: bool) -> dict[int, tuple] | None:
        """Every client's (update, fits, dead-ReLU fraction if ``probe``, else None) from cohort
        training, or None when this round trains one client after another (cohorts off, one
        client, a plan-less method, an unsupported model, or plans of different shapes); the
        first refusal is logged with its reason. A plan of several stages (``FitPlan.finish``
        returning the next plan) trains each stage of the cohort in lockstep; cohort training
        changes nothing until it has finished, so a refusal at any stage leaves the whole round
        to the sequential path."""
        if self.cohort is None or len(client_ids) < 2 or not self.method.plans_updates:
            return None
        plans = {int(c): self.method.plan(self._client(int(c), rnd, seeds[int(c)], payload,
                                                       extras))
                 for c in client_ids}
        ids = [int(c) for c in client_ids]
        size = self.cohort.size(self.cohort_setting, len(ids), self.trainer.batch_size,
                                self.data.train.x)
        done: dict[int, tuple] = {}
        fits: dict[int, list[FitResult]] = {c: [] for c in ids}
        for block in cohorts(len(ids), size):
            pending = {c: plans[c] for c in ids[block]}
            while pending:
                stage = list(pending)
                first = pending[stage[0]]
                if len({plan.shape() for plan in pending.values()}) > 1:
                    self._sequential("the participants' plans differ in shape (trainable "
                                     "parts, anchor, loss, targets, length, reference names "
                                     "or optimizer)")
                    return None
                members = [CohortMember(self.data.position[c], plan.start, plan.seed(seeds[c]),
                                        plan.anchor, plan.mu, plan.terms, plan.references,
                                        plan.after_step)
                           for c, plan in pending.items()]
                try:
                    vectors, results = self.cohort.fit(
                        members, self.data.train, first.targets, trainable=first.trainable,
                        loss_fn=first.loss_fn, epochs=first.epochs, max_steps=first.max_steps,
                        optimizer=first.optimizer)
                except RuntimeError as err:  # e.g. an op of the loss without a vmap rule
                    self._sequential(f"vmap failed: {str(err).splitlines()[0]}")
                    return None
                following = {}
                for c, vector, fit in zip(stage, vectors, results):
                    fits[c].append(fit)
                    # a vector of its own, as the trainer's: a row kept as personal state
                    # would keep the whole cohort's stack alive, and in its checkpoint
                    outcome = pending[c].finish(vector.clone())
                    if isinstance(outcome, FitPlan):
                        following[c] = outcome
                    else:
                        done[c] = (outcome, fits[c], None)
                finished = [k for k, c in enumerate(stage) if c not in following]
                if probe and finished:
                    dead = self._cohort_dead_units([stage[k] for k in finished],
                                                   vectors[finished],
                                                   [members[k] for k in finished])
                    for k, fraction in zip(finished, dead):
                        done[stage[k]] = done[stage[k]][:2] + (fraction,)
                pending = following
        return done

    def _cohort_dead_units(self, ids: list[int], vectors: torch.Tensor,
                           members: list[CohortMember]) -> list[float | None]:
        """The cohort's dead-ReLU fractions: one batched probe, or one client at a time for a
        model without one."""
        dead = self.cohort.dead_relu_fractions(vectors, self.data.train,
                                               [m.position for m in members])
        if dead is not None:
            return dead
        one_by_one = []
        for c, vector in zip(ids, vectors):
            self.trainer.load(vector)
            one_by_one.append(self._dead_units(c))
        return one_by_one

    def _sequential(self, reason: str) -> None:
        """Stop cohort training for this worker, saying why once in the run's log."""
        log.warning("%s: training clients one after another: %s", self.method.name, reason)
        self.cohort = None

    def answer(self, number: int, rnd: int, payload: dict[str, torch.Tensor],
               client_ids: np.ndarray, extras: dict[int, Any]) -> dict[str, Any]:
        """The answers of ``client_ids`` to the method's phase ``number`` (from 1) of round
        ``rnd``, each seeded apart from the client's training and other phases."""
        payload = self._to_device(payload)
        answer = self.phases[number - 1].answer

        def step(cid: int):
            seed = derive(self.seed, "client", rnd, cid, number)
            return self._logged(lambda: answer(self._client(cid, rnd, seed, payload, extras)))

        return self._run_clients(client_ids, step)

    def evaluate(self, rnd: int, payload: dict[str, torch.Tensor], client_ids: np.ndarray,
                 extras: dict[int, Any]) -> list[dict[str, Any]]:
        """``client_ids`` (a contiguous run of hosted clients, or a sample of them), each with
        the models it deploys on its own test split, and on its validation split when the
        scenario has one: one forward pass over the block for a ``shared`` evaluation, many
        clients' models per batched pass when the worker trains in cohorts, else one model at a
        time. A client deploys once per round, whatever the splits."""
        payload = self._to_device(payload)
        ids = [int(c) for c in client_ids]
        if not ids:
            return []

        def deployment(cid: int) -> Deployment:
            return self.method.deploy(self._client(cid, rnd, derive(self.seed, "evaluate", rnd,
                                                                    cid), payload, extras))

        shared = deployment(ids[0]) if self.method.evaluation == "shared" else None
        deployed = {c: shared or deployment(c) for c in ids}
        rows = []
        for split in self.splits:
            scored = None
            if shared is not None:
                scored = self._shared_rows(shared, ids, split)
            elif self.cohort is not None:
                try:
                    scored = self._cohort_rows(deployed, split)
                except RuntimeError as err:  # e.g. an op of the model without a vmap rule
                    self._sequential(f"vmap failed: {str(err).splitlines()[0]}")
            if scored is None:
                scored = self._sequential_rows(deployed, split)
            rows += self._client_rows(rnd, split, deployed, scored)
        return rows

    def _client_rows(self, rnd: int, split: str, deployed: dict[int, Deployment],
                     scored: dict[tuple[int, str], list[dict]]) -> list[dict[str, Any]]:
        """Clients-table rows from each (client, deployable)'s scores: who, where, the
        constant predictor's rate, the scores, the deployment's columns, and the gain over
        ``gain_over`` on the reported deployable's rows."""
        groups, labels = self.data.groups, self.data.split(split)
        reported, reference = self.method.deployables[0], self.method.gain_over
        rows = []
        for c, deployment in deployed.items():
            span = labels.rows(self.data.position[c])
            for name in deployment.models:
                for row in scored[c, name]:
                    extra = dict(deployment.columns.get(name, {}))
                    if reference is not None and name == reported:
                        base = next(r for r in scored[c, reference] if r["task"] == row["task"])
                        extra["accuracy_gain"] = None if row["accuracy"] is None or \
                            base["accuracy"] is None else row["accuracy"] - base["accuracy"]
                    rows.append({"round": rnd, "client_id": c,
                                 "group": int(groups[self.data.position[c]]),
                                 "n_train": int(self.n_train[c]), "split": split,
                                 "deployable": name,
                                 "majority_rate": self._majority(labels, row["task"], span),
                                 **row, **extra})
        return rows

    def _targets(self, split, rows):
        """The evaluation targets the method scores against: labels, or ``{task: labels}``."""
        if self.method.targets == "labels":
            return split.y[rows]
        return {task: labels[rows] for task, labels in split.tasks.items()}

    @staticmethod
    def _majority(split, task: str, span: slice) -> float | None:
        """A constant predictor's accuracy on one client's labels of ``task`` (None for a task
        the split does not hold), so a run stuck at it is seen (``raylf.learning_check``)."""
        labels = split.y if task == "main" else split.tasks.get(task)
        return None if labels is None else learning_check.majority_rate(labels[span])

    def _shared_rows(self, shared: Deployment, ids: list[int],
                     split: str) -> dict[tuple[int, str], list[dict]]:
        """Each shared model in one forward pass over the whole block, scored per client."""
        data = self.data.split(split)
        spans = [data.rows(self.data.position[c]) for c in ids]
        if all(a.stop == b.start for a, b in zip(spans, spans[1:])):  # a contiguous block
            rows = slice(spans[0].start, spans[-1].stop)
        else:  # a sample of clients (eval_clients)
            rows = torch.cat([torch.arange(r.start, r.stop) for r in spans]).to(self.device)
        scored = {}
        for name, model in shared.models.items():
            self.trainer.load(model)
            logits, at = self.trainer.predict(data.x[rows]), 0
            for c, span in zip(ids, spans):
                n = span.stop - span.start
                scored[c, name] = self.method.scores(
                    logits[at: at + n], self._targets(data, slice(span.start, span.stop)))
                at += n
        return scored

    def _sequential_rows(self, deployed: dict[int, Deployment],
                         split: str) -> dict[tuple[int, str], list[dict]]:
        """Each client's models loaded and run on its own rows, one at a time."""
        data, scored = self.data.split(split), {}
        for c, deployment in deployed.items():
            span = data.rows(self.data.position[c])
            for name, model in deployment.models.items():
                self.trainer.load(model)
                scored[c, name] = self.method.scores(self.trainer.predict(data.x[span]),
                                                     self._targets(data, span))
        return scored

    def _cohort_rows(self, deployed: dict[int, Deployment],
                     split: str) -> dict[tuple[int, str], list[dict]]:
        """Every client's models on its own rows, many per batched pass (inputs padded to the
        largest client of the batch)."""
        data = self.data.split(split)
        models = [(c, name, model) for c, deployment in deployed.items()
                  for name, model in deployment.models.items()]
        spans = [data.rows(self.data.position[c]) for c, _, _ in models]
        if not models:
            return {}
        size = self.cohort.size(self.cohort_setting, len(models), max(
            s.stop - s.start for s in spans) or 1, data.x)
        scored = {}
        for block in cohorts(len(models), size):
            longest = max(s.stop - s.start for s in spans[block])
            if longest == 0:  # nobody in this block has rows in this split
                outputs = [data.x.new_zeros(0)] * (block.stop - block.start)
            else:
                index = torch.stack([torch.arange(longest, device=self.device) + s.start
                                     for s in spans[block]]).clamp(max=len(data.y) - 1)
                outputs = self.cohort.predict(torch.stack([m for _, _, m in models[block]]),
                                              data.x[index])
            for (c, name, _), out, span in zip(models[block], outputs, spans[block]):
                scored[c, name] = self.method.scores(out[: span.stop - span.start],
                                                     self._targets(data, span))
        return scored

    # ---- checkpoints of personal state -----------------------------------------------------
    def save_personal(self, folder: str) -> None:
        """Write this worker's personal states to ``folder`` (local path or URI) itself, so a
        checkpoint never funnels every client's state through the coordinator."""
        if not self.personal:
            return
        fs, path = filesystem(folder)
        fs.create_dir(path, recursive=True)
        buffer = io.BytesIO()
        torch.save(self.personal, buffer)
        publish(fs, f"{path}/worker-{self.index}.pt", buffer.getvalue())

    def load_personal(self, folder: str) -> None:
        """Take this worker's clients' states from every worker file in ``folder``."""
        if not self.method.personal_state:
            return
        fs, path = filesystem(folder)
        selector = pafs.FileSelector(path, allow_not_found=False)
        found: set[int] = set()
        for info in fs.get_file_info(selector):
            if not (info.base_name.startswith("worker-") and info.base_name.endswith(".pt")):
                continue
            with fs.open_input_stream(info.path) as source:
                states = torch.load(io.BytesIO(source.read()), weights_only=True)
            for cid, state in states.items():
                if int(cid) in self.personal:
                    self.personal[int(cid)] = state
                    found.add(int(cid))
        missing = sorted(set(self.personal) - found)
        if missing:
            raise FileNotFoundError(f"checkpoint {folder} holds no personal state for clients "
                                    f"{missing[:10]}{'…' if len(missing) > 10 else ''}")
