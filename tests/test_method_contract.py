"""The contract every registered method must pass. The checks live in ``raylf.testing``, the
public ``check_method`` a plugin's author runs too; a method joins this suite by being
registered, and what it needs from the scenario (``requires``) picks the tiny federation."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import pytest
from pydantic import Field

from raylf import plugins
from raylf.methods import METHODS, MethodParams
from raylf.methods.base import Deployment, Method
from raylf.methods.fedavg import FedAvg
from raylf.methods.fedavg_se import FedAvgSE
from raylf.runtime.ray_backend import warm_actors
from raylf.testing import IN_PROCESS, check_method

NAMES = METHODS.names()
HOOKS = [n for n, v in vars(Method).items() if callable(v) and not n.startswith("_")
         and n != "Params"]
# Loops whose length no contract property depends on: FedALA's first weight learning (up to 50
# passes per never-sampled client at every evaluation), FedBABU's fine-tuning, FedRep's head
# epochs and pFedMe's local rounds, shortened so the suite spends its time on the contract, not
# on them. pFedMe's 20 local rounds of 5 steps at λ·lr = 1.5 also amplify the batched kernels'
# float rounding past the cohort check's 1e-5 by round 4 (6e-8 after round 1, 5e-4 after 4).
SHORTER = {"fedala": {"start_passes": 2}, "fedbabu": {"finetune_epochs": 1},
           "fedrep": {"head_epochs": 1}, "pfedme": {"local_rounds": 2}}


def one_per_implementation(names: list[str]) -> list[str]:
    """The first of the methods whose contract hooks are the same functions (those differing
    only in parameters, e.g. spcacw and its weighting rules): what a process boundary can break
    lives in the functions, so the Ray test runs each implementation once."""
    seen: dict[tuple, str] = {}
    for name in names:
        cls = METHODS.get(name)
        seen.setdefault(tuple(getattr(cls, h) for h in HOOKS), name)
    return sorted(seen.values())


@pytest.mark.parametrize("check", IN_PROCESS)
@pytest.mark.parametrize("name", NAMES)
def test_registered_method_passes(name, check):
    check_method(name, params=SHORTER.get(name), checks=[check])


@pytest.fixture(scope="module")
def warm_ray(ray_cluster):
    """Every method's Ray run after the first takes over the previous run's actors, as the
    trials of a reused Tune trial process do: equal results also show nothing leaks between
    the experiments an actor serves."""
    with warm_actors():
        yield ray_cluster


@pytest.mark.parametrize("name", one_per_implementation(NAMES))
def test_backends_give_identical_client_accuracies(warm_ray, name):
    check_method(name, params=SHORTER.get(name),
                 checks=["ray_backend_gives_identical_client_results"])


def test_a_plugin_method_outside_raylf_passes_check_method(monkeypatch):
    monkeypatch.setenv(plugins.ENV_VAR, "tests.plugins.annealed")
    plugins.load_plugins()
    check_method("annealed_prox")


class NoDefaultsParams(MethodParams):
    mu: float = Field(ge=0)


class Leaky(FedAvg):
    """Params without a default, and a count its updates start from that lives outside what a
    seed fixes and a checkpoint restores (on the class)."""

    name = "toy_leaky"
    Params = NoDefaultsParams
    calls = itertools.count()

    def plan(self, client):
        plan = super().plan(client)
        return replace(plan, start=plan.start + 1e-3 * next(self.calls))


class SharesPersonalHeads(FedAvgSE):
    """Declares ``shared`` evaluation while each client deploys its own head."""

    name = "toy_shares_personal_heads"
    evaluation = "shared"


class DeploysUndeclared(FedAvg):
    """Deploys a model under a name its ``deployables`` do not list."""

    name = "toy_deploys_undeclared"

    def deploy(self, client):
        return Deployment({"unlisted": client.payload["model"]})


@pytest.mark.parametrize("method, words", [
    (SharesPersonalHeads, "declares evaluation = 'shared' but client 1 deploys other models"),
    (DeploysUndeclared, "deploys ['unlisted'], not a subset of deployables ('main',)"),
])
def test_check_method_refuses_a_deployment_its_declarations_contradict(method, words):
    with pytest.raises(AssertionError, match="deploys_what_it_declares") as failed:
        check_method(method, checks=["deploys_what_it_declares"])
    assert words in str(failed.value)


def test_check_method_names_the_method_and_every_check_it_fails():
    checks = ["params_have_valid_defaults",
              "participants_upload_the_same_keys_and_bytes_count_what_was_sent",
              "same_seed_gives_identical_tables"]  # the cheap ones: it fails the first and last
    with pytest.raises(AssertionError) as failed:
        check_method(Leaky, params={"mu": 0.0}, checks=checks)
    message = str(failed.value)
    assert message.startswith("method 'toy_leaky' fails 2 of 3 contract checks:")
    failed_checks = {line[2:].split(":")[0] for line in message.splitlines()
                     if line.startswith("- ")}
    assert failed_checks == {checks[0], checks[2]}
    assert "toy_leaky" not in METHODS  # registered for the checks only
    with pytest.raises(ValueError, match="unknown checks"):
        check_method("fedavg", checks=["no_such_check"])


def test_the_worked_example_of_the_contract_page_passes_check_method(monkeypatch):
    """docs/method-contract.md's worked example, run exactly as the page writes it: a personal
    model whose loss distils the global model's outputs, declared as a plan, passes every
    in-process check, cohort equality included."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "method-contract.md").read_text()
    example = page.split("## Worked example", 1)[1].split("```python\n", 1)[1].split("```")[0]
    monkeypatch.setattr(METHODS, "_items", dict(METHODS._items))  # registered for this test
    namespace: dict = {}
    exec(compile(example, "docs/method-contract.md", "exec"), namespace)  # noqa: S102
    method = namespace["DistilledPersonal"]
    assert method.plan is not Method.plan and method.local_update is Method.local_update
    check_method(method)
