"""The open local objective: the declared optimizers (SGD, Adam) and loss terms that see the
batch, the outputs, the features and frozen reference models, on both trainers."""

from __future__ import annotations

import copy

import pytest
import torch

from raylf.config import validate
from raylf.data import build_federation
from raylf.errors import SpecError
from raylf.models import MODELS, build_model
from raylf.runtime import Blueprint
from raylf.runtime.local import LocalRuntime
from raylf.schema import OptimizerSpec
from raylf.training.layout import ParamLayout, model_vector
from raylf.training.objective import reference_forward
from raylf.training.sequential import LocalTrainer
from tests.conftest import small_spec_dict
from tests.test_cohort import assert_close, trained
from tests.test_contract_primitives import torch_optim_fit


def mlp(seed: int = 0):
    torch.manual_seed(seed)
    return build_model("mlp", MODELS.get("mlp").Params(hidden=[12]), (1, 4, 4), 3)


@pytest.mark.parametrize("weight_decay, grad_clip", [(0.0, None), (0.01, 0.5)])
def test_the_trainer_steps_exactly_as_torch_optim_adam(weight_decay, grad_clip):
    """Adam is one entry of the declared set: a plain ``clip_grad_norm_`` + ``torch.optim.Adam``
    loop over the same batches (head frozen) ends on the trainer's weights, bit for bit."""
    model = mlp()
    x, y = torch.randn(30, 1, 4, 4), torch.arange(30) % 3
    cfg = OptimizerSpec(name="adam", lr=0.01, betas=(0.8, 0.99), eps=1e-6,
                        weight_decay=weight_decay, grad_clip=grad_clip)
    reference = copy.deepcopy(model)
    layout = ParamLayout.of(model)
    trainer = LocalTrainer(model, layout, OptimizerSpec(), 8, 2, torch.device("cpu"))
    trainer.fit(x, y, seed=5, trainable=("encoder",), optimizer=cfg)

    torch_optim_fit(reference, x, y, torch.optim.Adam(
        reference.encoder.parameters(), lr=0.01, betas=(0.8, 0.99), eps=1e-6,
        weight_decay=weight_decay), grad_clip)
    assert torch.equal(trainer.vector(), model_vector(reference, layout))


@pytest.mark.parametrize("method", ["fedprox", "ditto"])
def test_cohorts_match_the_sequential_path_under_adam(method):
    def run(cohort):
        spec = validate(small_spec_dict(
            method__name=method, resources__cohort=cohort, resources__workers=1,
            scenario={"name": "dirichlet", "alpha": 0.5}, federation__local_epochs=2,
            federation__optimizer={"name": "adam", "lr": 0.01, "weight_decay": 1e-4,
                                   "grad_clip": 1.0}))
        return LocalRuntime(Blueprint(spec, build_federation(spec)))

    lockstep, alone = run("auto"), run("off")
    (_, c_state, c_personal), (_, s_state, s_personal) = trained(lockstep), trained(alone)
    assert lockstep.coordinator.pool.shards[0].cohort is not None
    assert_close(c_state, s_state)
    assert_close(c_personal, s_personal)


@pytest.mark.parametrize("optimizer, field, words", [
    ({"name": "adam", "momentum": 0.9}, "federation.optimizer",
     "momentum belong to another optimizer than adam"),
    ({"betas": [0.8, 0.9]}, "federation.optimizer", "betas belong to another optimizer than sgd"),
    ({"name": "rmsprop"}, "federation.optimizer.name", "'sgd' or 'adam'"),
    ({"name": "adam", "betas": [0.9, 1.0]}, "federation.optimizer.betas", "in [0, 1)"),
])
def test_an_optimizer_setting_of_another_optimizer_is_refused(optimizer, field, words):
    with pytest.raises(SpecError) as failed:
        validate(small_spec_dict(federation__optimizer=optimizer))
    assert field in str(failed.value) and words in str(failed.value)


def test_sgd_specs_dump_as_before_adam_and_adam_specs_dump_their_own_settings():
    """An SGD spec's digest and trials-table columns are what they were before Adam existed."""
    sgd = validate(small_spec_dict()).to_dict()["federation"]["optimizer"]
    assert set(sgd) == {"name", "lr", "momentum", "weight_decay", "grad_clip"}
    adam = validate(small_spec_dict(federation__optimizer={"name": "adam"})).flat()
    assert adam["federation.optimizer.betas"] == "[0.9, 0.999]"
    assert "federation.optimizer.momentum" not in adam


def test_the_per_step_methods_refuse_an_optimizer_whose_state_they_do_not_keep():
    with pytest.raises(SpecError, match="federation.optimizer.name: spcacw steps its learners"):
        validate(small_spec_dict(method__name="spcacw", federation__optimizer={"name": "adam"}))


def test_a_reference_forward_leaves_the_trainer_as_it_was():
    model = mlp()
    trainer = LocalTrainer(model, ParamLayout.of(model), OptimizerSpec(), 8, 1,
                           torch.device("cpu"))
    loaded, other = trainer.vector(), model_vector(mlp(seed=1), trainer.layout)
    x = torch.randn(5, 1, 4, 4)
    trainer.model.train()
    seen = reference_forward(trainer.model, trainer.parameters_of(other), x)
    assert trainer.model.training and torch.equal(trainer.vector(), loaded)
    trainer.load(other)
    assert torch.equal(seen.outputs, trainer.predict(x))
    assert torch.equal(seen.features, trainer.model.encoder(x).detach())
