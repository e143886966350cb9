"""The pieces of the method contract on their own: grouped shares, setup and collect phases,
several seeded models, trainer primitives, divergence of any fit, worker-written checkpoints,
validation splits and method-defined tables. Toy methods here exist only for these tests."""

from __future__ import annotations

import copy
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from raylf import learning_check, results
from raylf.checkpoints import CheckpointFolders
from raylf.config import SpecError, validate
from raylf.data import build_federation
from raylf.experiment import run_experiment
from raylf.methods import METHODS
from raylf.methods.base import ClientUpdate, Deployment, Phase, share
from raylf.methods.fedavg_se import FedAvgSE
from raylf.models import MODELS, build_model
from raylf.runtime import Blueprint
from raylf.runtime.local import LocalRuntime
from raylf.schema import OptimizerSpec
from raylf.storage import STAGING
from raylf.training.layout import ParamLayout, model_vector
from raylf.training.rewrites import pool_before_rectifying
from raylf.training.sequential import LocalTrainer
from raylf.training.sgd import step_
from raylf.tree import tensor_bytes
from tests.conftest import small_spec_dict


@pytest.fixture
def toy(monkeypatch):
    """Register a toy method for one test only (it must not join the contract suite)."""

    def add(cls):
        monkeypatch.setitem(METHODS._items, cls.name, cls)
        return cls

    return add


def runtime_for(name: str, **changes) -> LocalRuntime:
    spec = validate(small_spec_dict(method__name=name, **changes))
    return LocalRuntime(Blueprint(spec, build_federation(spec)))


class TwoGroups(FedAvgSE):
    """Even clients train encoder model 0, odd ones model 1; odd clients also send a tag."""

    name = "toy_two_groups"
    averaged = frozenset()

    def server_init(self, init):
        encoder = init[self.ctx.layout.part("encoder")]
        return {"encoders": torch.stack([encoder, encoder])}

    def broadcast(self, state, rnd):
        return {"encoders": state["encoders"]}

    def aggregate(self, state, uploads, rnd):
        encoders = state["encoders"].clone()
        for group in uploads.groups("encoder"):
            encoders[group] = uploads.mean("encoder", group)
        return {"encoders": encoders, "last": uploads}, {}

    def local_update(self, client):
        trainer, data = client.trainer, client.data
        trainer.load(client.payload["encoders"][data.cid % 2], "encoder")
        trainer.load(client.personal, "head")
        trainer.fit(data.x_train, data.y_train, seed=client.seed)
        upload = {"encoder": share(trainer.vector("encoder"), data.n_train, data.cid % 2)}
        if data.cid % 2:
            upload["tag"] = torch.full((3,), float(data.cid))
        return ClientUpdate(upload, trainer.vector("head"))

    def deploy(self, client):
        return Deployment({"main": torch.cat([client.payload["encoders"][0], client.personal])})


def test_workers_send_one_sum_per_group_and_means_count_only_senders(toy):
    toy(TwoGroups)
    runtime = runtime_for("toy_two_groups", federation__participation=1.0)
    pool = runtime.coordinator.pool
    messages = []
    train = pool.train
    pool.train = lambda *a: messages.extend(train(*a)) or messages[-len(pool.shards):]
    runtime.run_round(1)
    size = runtime.coordinator.method.ctx.layout.part_size("encoder")
    for message in messages:  # per worker: one vector per group, none per client
        assert "encoder" not in message["uploads"]
        assert all(v.shape == (size,) for v in message["sums"]["encoder"].values())
        assert set(message["sums"]["encoder"]) == {0, 1}
    uploads = runtime.coordinator.state["last"]
    n = runtime.coordinator.federation.n_train
    assert uploads.weight("encoder", 1) == float(n[1::2].sum())
    assert list(uploads.senders["tag"]) == [1, 3, 5, 7]
    expected = sum(n[c] * c for c in (1, 3, 5, 7)) / n[1::2].sum()
    assert torch.allclose(uploads.mean("tag"), torch.full((3,), float(expected)))


def test_grouped_sums_do_not_depend_on_how_clients_are_spread_over_workers(toy):
    toy(TwoGroups)
    states = []
    for workers in (1, 2, 4):
        runtime = runtime_for("toy_two_groups", resources__workers=workers)
        runtime.run_round(1)
        states.append(runtime.coordinator.state["encoders"])
    assert all(torch.equal(states[0], s) for s in states[1:])


class Histograms(FedAvgSE):
    """Sends its label histogram once, in the setup phase."""

    name = "toy_histograms"

    def setup(self, client):
        return {"labels": torch.bincount(client.data.y_train,
                                         minlength=self.ctx.num_classes).float()}

    def server_setup(self, state, uploads):
        return state | {"histograms": uploads.tensors["labels"]}


def test_setup_runs_once_before_round_one_and_is_counted(toy, tmp_path):
    toy(Histograms)
    spec = validate(small_spec_dict(method__name="toy_histograms"))
    result = run_experiment(spec, out=str(tmp_path))
    rounds = result.tables["rounds"]
    assert [r["round"] for r in rounds][:2] == [0, 1]
    histogram_bytes = tensor_bytes(torch.zeros(10))
    assert rounds[0]["bytes_up"] == 8 * histogram_bytes
    assert result.trial["bytes_up"] == sum(r["bytes_up"] for r in rounds)
    runtime = runtime_for("toy_histograms")
    runtime.setup()
    fed = runtime.coordinator.federation
    histograms = runtime.coordinator.state["histograms"]
    assert histograms.shape == (8, 10)
    assert histograms.sum(1).tolist() == [float(n) for n in fed.n_train]
    assert runtime.setup() is None  # once only


class Refresh(FedAvgSE):
    """Every second round, every client reports its head norm as a share of group 0."""

    name = "toy_refresh"

    def phases(self):
        return (Phase("refresh", request=lambda state, rnd: {} if rnd % 2 == 0 else None,
                      answer=self.norm, receive=self.mean_norm),)

    def norm(self, client):
        return ClientUpdate({"norm": share(client.personal.norm()[None], 1.0)}, client.personal)

    def mean_norm(self, state, uploads, rnd):
        return state | {"mean_norm": uploads.mean("norm")}, {"reports": uploads.weight("norm")}


def test_collect_asks_every_client_not_only_participants(toy):
    toy(Refresh)
    runtime = runtime_for("toy_refresh")
    first, second = runtime.run_round(1), runtime.run_round(2)
    assert "reports" not in first.record
    assert second.record["reports"] == 8.0 and second.record["participants"] == 4
    assert second.record["bytes_up"] == first.record["bytes_up"] + 8 * (4 + 8)


def test_several_models_are_drawn_from_the_seed_through_the_model_factory():
    spec = validate(small_spec_dict())
    one, two = (Blueprint(spec, build_federation(spec)).context() for _ in range(2))
    models = one.initial_models(3)
    assert torch.equal(models, two.initial_models(3))
    assert len({tuple(m[:5].tolist()) for m in models}) == 3
    common = Blueprint(spec, build_federation(spec)).initial_vector()
    assert not any(torch.equal(m, common) for m in models)


class TwoFits(FedAvgSE):
    """A second fit whose loss explodes, as Ditto's personal update could."""

    name = "toy_two_fits"

    def local_update(self, client):
        update = super().local_update(client)
        data = client.data
        client.trainer.fit(data.x_train, data.y_train, seed=client.seed, epochs=1,
                           loss_fn=lambda out, y: F.cross_entropy(out, y) * 1e9)
        return update


def test_divergence_of_any_fit_ends_the_run(toy):
    toy(TwoFits)
    result = run_experiment(validate(small_spec_dict(method__name="toy_two_fits")))
    assert result.status == "diverged" and result.trial["diverged_round"] == 1


class NanHeads(FedAvgSE):
    """Private heads that turn NaN in the last round while every loss and the uploaded encoder
    stay finite: nothing the server sees diverges, and no later fit starts from them, only the
    final evaluation scores them."""

    name = "toy_nan_heads"

    def local_update(self, client):
        update = super().local_update(client)
        if client.rnd == self.ctx.rounds:
            update.personal = torch.full_like(update.personal, math.nan)
        return update


def test_a_personal_state_that_is_not_finite_ends_the_run_as_diverged(toy):
    toy(NanHeads)
    spec = validate(small_spec_dict(method__name="toy_nan_heads", resources__cohort="off"))
    result = run_experiment(spec)
    last = spec.federation.rounds
    assert result.status == "diverged" and result.trial["diverged_round"] == last
    assert "personal state" in result.error
    assert all(math.isfinite(r["loss"]) for r in result.tables["rounds"])


def test_trainer_primitives(small_spec):
    spec = small_spec()
    bp = Blueprint(spec, build_federation(spec))
    trainer = bp.trainer(torch.device("cpu"))
    data = bp.federation.shard(np.arange(2), torch.device("cpu")).client(0)
    trainer.load(bp.initial_vector())
    logits = trainer.predict(data.x_train)
    assert trainer.loss(data.x_train, data.y_train, chunk=7) == pytest.approx(
        float(F.cross_entropy(logits, data.y_train)), rel=1e-6)
    assert trainer.accuracy(data.x_test, data.y_test) == pytest.approx(
        float((trainer.predict(data.x_test).argmax(1) == data.y_test).float().mean()))
    before = trainer.vector()
    x, y = data.x_train[:16], data.y_train[:16]
    grad = trainer.gradient(x, y)
    assert torch.equal(trainer.vector(), before)  # computing a gradient changes nothing
    model = bp.build_model()
    F.cross_entropy(model(x), y).backward()
    expected = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    assert torch.allclose(grad, expected, atol=1e-6)
    assert torch.equal(trainer.gradient(x, y, part="head"), grad[bp.layout.part("head")])
    trainer.fits.clear()
    fit = trainer.fit(data.x_train, data.y_train, seed=1, max_steps=3)
    assert fit.steps == 3 and fit.samples == 3 * spec.federation.batch_size
    many = trainer.fit(data.x_train, data.y_train, seed=1, max_steps=100)
    per_epoch = math.ceil(data.n_train / spec.federation.batch_size)
    assert many.steps == 100 and per_epoch < 100  # epochs continue up to max_steps
    assert trainer.fits == [fit, many]


def test_workers_write_personal_checkpoints_and_only_the_last_few_are_kept(small_spec, tmp_path):
    spec = small_spec(federation__rounds=12)
    taken = []
    result = run_experiment(spec, out=str(tmp_path), checkpoint_every=2,
                            on_round=lambda o, r, p, snapshot: taken.append(snapshot))
    snapshots = [s for s in taken if s is not None]
    assert [int(s["personal"].rsplit("-", 1)[1]) for s in snapshots] == [2, 4, 6, 8, 10, 12]
    folder = tmp_path / "checkpoints" / result.trial_id
    kept = [12 - 2 * i for i in range(CheckpointFolders.KEEP)]
    assert 0 < CheckpointFolders.KEEP < 6
    assert sorted(int(p.name.split("-")[1]) for p in folder.iterdir()) == sorted(kept)
    assert sorted(p.name for p in (folder / "round-6").iterdir()) == [
        STAGING, "worker-0.pt", "worker-1.pt"]
    assert not any((folder / "round-6" / STAGING).iterdir())  # every staged file moved in place
    fresh = LocalRuntime(Blueprint(spec, build_federation(spec)))
    fresh.restore(snapshots[-1])
    heads = {c: h for s in fresh.coordinator.pool.shards for c, h in s.personal.items()}
    assert len(heads) == 8


def test_a_checkpoint_due_within_checkpoint_min_s_of_the_last_is_not_taken(small_spec, tmp_path):
    spec = small_spec(federation__rounds=6)
    taken = []
    run_experiment(spec, out=str(tmp_path), checkpoint_every=2, checkpoint_min_s=1e6,
                   checkpoint_last=True,
                   on_round=lambda o, r, p, snapshot: taken.append(snapshot is not None))
    # round 2 is the first due, 4 comes too soon, and the last round is exempt
    assert taken == [False, True, False, False, False, True]


def test_validation_split_is_carved_from_training_and_selects_the_best_round(small_spec):
    plain = build_federation(small_spec())
    spec = small_spec(scenario__val_fraction=0.2, federation__rounds=4, eval_every=1)
    fed = build_federation(spec)
    assert [list(t) for t in plain.test] == [list(t) for t in fed.test]
    for c in range(fed.num_clients):
        train, val, test = set(fed.train[c]), set(fed.val[c]), set(fed.test[c])
        assert train | val == set(plain.train[c]) and not (train & val) and not (val & test)
        total = len(fed.train[c]) + len(fed.val[c]) + len(fed.test[c])
        assert len(val) == round(0.2 * total)
    assert not plain.has_val
    trial = run_experiment(spec).trial
    rounds = run_experiment(spec).tables["rounds"]
    best = max(rounds, key=lambda r: r["val_acc_mean"])
    assert trial["best_val_round"] == best["round"]
    assert trial["acc_mean_at_best_val"] == best["acc_mean"]


class WithTable(FedAvgSE):
    name = "toy_table"

    def tables(self, state, rnd):
        return {"encoder_norms": [{"norm": float(state["encoder"].norm())}]}


def test_method_tables_are_written_beside_the_standard_ones(toy, small_spec, tmp_path):
    toy(WithTable)
    run_experiment(small_spec(method__name="toy_table"), out=str(tmp_path))
    tables = results.load(tmp_path)
    assert list(tables["encoder_norms"]["round"]) == [1, 2, 3, 4]
    assert set(tables) == {"trials", "rounds", "clients", "encoder_norms"}


class NeedsGroups(FedAvgSE):
    name = "toy_needs_groups"
    requires = frozenset({"groups"})


def test_a_method_needing_latent_groups_is_refused_on_a_scenario_without_them(toy):
    toy(NeedsGroups)
    with pytest.raises(SpecError, match="latent group labels.*rotation"):
        validate(small_spec_dict(method__name="toy_needs_groups",
                                 scenario={"name": "dirichlet", "alpha": 0.5}))
    validate(small_spec_dict(method__name="toy_needs_groups", scenario={"name": "rotation"}))


@pytest.mark.parametrize("setting, count", [(3, 3), (0.5, 4)])
def test_eval_clients_scores_a_seeded_sample_and_everyone_at_the_end(small_spec, setting, count):
    spec = small_spec(eval_every=1, eval_clients=setting, method__name="fedavg")
    first, second = (run_experiment(spec).tables["clients"] for _ in range(2))
    by_round = {r: sorted({row["client_id"] for row in first if row["round"] == r})
                for r in (1, 2, 3, 4)}
    assert [len(by_round[r]) for r in (1, 2, 3)] == [count] * 3
    assert by_round[4] == list(range(8))
    assert len({tuple(v) for v in by_round.values()}) > 1  # a new sample each round
    assert first == second


def test_a_cpu_trainer_runs_convolutions_channels_last_with_the_same_results():
    def cnn():
        torch.manual_seed(0)
        return build_model("cnn", MODELS.get("cnn").Params(channels=[4, 8], features=16),
                           (3, 8, 8), 5)

    assert cnn().channels_last_on_cpu  # the CNN asks for it
    x, y = torch.randn(40, 3, 8, 8), torch.arange(40) % 5
    results, layouts = {}, {}
    for channels_last in (True, False):
        model = cnn()
        model.channels_last_on_cpu = channels_last
        layout = ParamLayout.of(model)
        trainer = LocalTrainer(model, layout, OptimizerSpec(lr=0.1, momentum=0.9), 8, 2,
                               torch.device("cpu"))
        seen = layouts.setdefault(channels_last, set())
        for conv in (trainer.model.encoder[0][0], trainer.model.encoder[0][3]):
            conv.register_forward_hook(lambda _m, _a, out, seen=seen: seen.add(
                out.is_contiguous(memory_format=torch.channels_last)))
        fit = trainer.fit(x, y, seed=3)
        results[channels_last] = (fit.loss, trainer.vector(), trainer.predict(x))
    assert layouts == {True: {True}, False: {False}}
    assert results[True][0] == pytest.approx(results[False][0], abs=1e-5)
    assert torch.allclose(results[True][1], results[False][1], atol=1e-5)
    assert torch.allclose(results[True][2], results[False][2], atol=1e-4)


@pytest.mark.parametrize("size", [32, 28])  # 28: the last block pools a 7×7 map
def test_pooling_before_the_relu_changes_no_output_gradient_or_dead_unit(size):
    torch.manual_seed(0)
    built = build_model("cnn", MODELS.get("cnn").Params(channels=[4, 8, 8], features=16),
                        (3, size, size), 5)
    rewritten = copy.deepcopy(built)
    pool_before_rectifying(rewritten)
    kinds = [type(m).__name__ for m in rewritten.encoder[0]]
    assert kinds[:3] == ["Conv2d", "MaxPool2d", "ReLU"] and kinds.count("ReLU") == 3
    x, y = torch.randn(16, 3, size, size), torch.arange(16) % 5
    for model in (built, rewritten):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for _ in range(5):
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
    for a, b in zip(built.parameters(), rewritten.parameters()):
        assert torch.equal(a, b) and torch.equal(a.grad, b.grad)
    assert torch.equal(built(x), rewritten(x))
    if size == 32:  # every map even: the pooled channels are alive exactly where the others are
        assert (learning_check.dead_relu_fraction(built.encoder, x)
                == learning_check.dead_relu_fraction(rewritten.encoder, x))
    trainer = LocalTrainer(built, ParamLayout.of(built), OptimizerSpec(), 8, 1,
                           torch.device("cpu"))
    assert [type(m) for m in trainer.model.encoder[0]] == [type(m) for m in rewritten.encoder[0]]


@pytest.mark.parametrize("momentum, grad_clip", [(0.0, None), (0.9, None), (0.9, 0.5)])
def test_the_trainer_steps_exactly_as_torch_optim_sgd(momentum, grad_clip):
    """The trainer's step (``raylf.training.sgd.step_``) uses SGD's functional form and clips per
    client; a plain ``clip_grad_norm_`` + ``torch.optim.SGD`` loop over the same batches (head
    frozen, weight decay) must end on the same weights, bit for bit."""
    torch.manual_seed(0)
    model = build_model("mlp", MODELS.get("mlp").Params(hidden=[12]), (1, 4, 4), 3)
    x, y = torch.randn(30, 1, 4, 4), torch.arange(30) % 3
    cfg = OptimizerSpec(lr=0.1, momentum=momentum, weight_decay=0.01, grad_clip=grad_clip)
    reference = copy.deepcopy(model)
    layout = ParamLayout.of(model)
    trainer = LocalTrainer(model, layout, cfg, 8, 2, torch.device("cpu"))
    trainer.fit(x, y, seed=5, trainable=("encoder",))

    torch_optim_fit(reference, x, y, torch.optim.SGD(
        reference.encoder.parameters(), lr=0.1, momentum=momentum, weight_decay=0.01), grad_clip)
    assert torch.equal(trainer.vector(), model_vector(reference, layout))


def torch_optim_fit(reference: nn.Module, x: torch.Tensor, y: torch.Tensor,
                    opt: torch.optim.Optimizer, grad_clip: float | None) -> None:
    """What the trainer's fit of the encoder (2 epochs, batches of 8, shuffled by seed 5) is
    checked against: a plain torch loop with ``clip_grad_norm_`` and a ``torch.optim``
    optimizer over the encoder's parameters."""
    gen = torch.Generator().manual_seed(5)
    for _ in range(2):
        order = torch.randperm(len(x), generator=gen)
        for start in range(0, len(x), 8):
            idx = order[start: start + 8]
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(reference(x[idx]), y[idx]).backward()
            if grad_clip is not None:
                nn.utils.clip_grad_norm_(reference.encoder.parameters(), grad_clip)
            opt.step()


def test_a_step_of_stacked_clients_is_each_clients_own_step():
    """``raylf.training.sgd.step_`` on clients stacked along dim 0 (the cohort's) gives each
    client the step it takes alone (the trainers' and the per-step runtime's, dimension one),
    clipping included: the step is per client by construction, not by a test of each path."""
    torch.manual_seed(0)
    cfg = OptimizerSpec(lr=0.1, momentum=0.9, weight_decay=0.01, grad_clip=0.5)
    shapes = [(5, 3), (5,), (2, 5)]
    weights = [torch.randn(4, *s) for s in shapes]
    grads = [torch.randn(4, *s) * torch.tensor([0.1, 1, 3, 10]).view(-1, *[1] * len(s))
             for s in shapes]
    momenta = [torch.randn(4, *s) for s in shapes]
    anchors = [torch.randn(4, *s) for s in shapes]
    alone = [[[t[c: c + 1].clone() for t in tree] for tree in (weights, grads, momenta, anchors)]
             for c in range(4)]
    step_(weights, grads, momenta, cfg, anchors=anchors, mu=0.3)
    for c, (w, g, m, a) in enumerate(alone):
        step_(w, g, m, cfg, anchors=a, mu=0.3)
        assert all(torch.equal(x[c: c + 1], y) for x, y in zip(weights, w))
        assert all(torch.equal(x[c: c + 1], y) for x, y in zip(momenta, m))


def test_local_training_leaves_torch_dynamo_unimported():
    """Constructing a ``torch.optim.SGD`` imports ``torch._dynamo``: 3–4 s in every fresh worker
    process on this kind of machine, paid again by every trial. A whole local experiment must
    not import it."""
    code = ("import sys; from raylf.config import validate; "
            "from raylf.experiment import run_experiment; "
            "from tests.conftest import small_spec_dict; "
            "r = run_experiment(validate(small_spec_dict(federation__rounds=2))); "
            "assert r.tables['trials'][0]['status'] == 'ok', r.tables['trials'][0]['error']; "
            "assert 'torch._dynamo' not in sys.modules, 'torch._dynamo was imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1], timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_a_row_of_a_stacked_tensor_travels_alone():
    """Extras that are rows of one stacked tensor (FedAMP's clouds, a group's model) are sent
    on storages of their own: pickled as views, each would carry every row."""
    import pickle

    import torch

    from raylf.runtime.coordinator import own_storage

    stacked = torch.zeros(8, 1000)
    row = own_storage(stacked[3])
    assert len(pickle.dumps(row)) < 2 * 4000 < len(pickle.dumps(stacked[3]))
    assert own_storage(stacked) is stacked and torch.equal(row, stacked[3])
