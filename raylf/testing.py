"""The method contract as a public tool, in the spirit of scikit-learn's ``check_estimator``.

A method written outside raylf (a module named in ``RAYLF_PLUGINS``, or a class in a user's own
test) is checked with one call::

    from raylf.testing import check_method

    check_method("my_method")  # a registered name, or the class itself

It runs the checks every registered method passes in raylf's own suite
(``tests/test_method_contract.py`` calls this module, so there is one copy of them) on a tiny
in-process workload: the bundled digits, six clients, four rounds, the ``local`` backend. It
raises one ``AssertionError`` naming the method and every check that failed, each with its
reason. The checks are about the contract, not about accuracy: a method that learns nothing
can pass; one whose results depend on anything but the seed, whose uploads differ in shape
between clients, or that keeps state a checkpoint does not restore, cannot.
"""

from __future__ import annotations

import copy
import math
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch

from raylf.config import ResolvedSpec, validate
from raylf.data import build_federation
from raylf.data.federation import ClientData
from raylf.experiment import run_experiment
from raylf.methods import METHODS, Method
from raylf.methods.base import ClientRound, Deployment, Message, Personal
from raylf.runtime import Blueprint
from raylf.runtime.local import LocalRuntime
from raylf.runtime.shard import Reduction, upload_bytes
from raylf.training.sequential import LocalTrainer
from raylf.tree import tensor_bytes

TIMING = {"round_s", "wall_s", "trial_id", "worker_peak_mb"}  # measurements, not results


def client_round(trainer: LocalTrainer, data: ClientData, *, rnd: int = 1, seed: int = 0,
                 payload: dict[str, torch.Tensor] | None = None, personal: Personal = None,
                 extra: Message = None) -> ClientRound:
    """A client hook's argument built by hand, to call one hook of a method in a unit test:
    ``method.local_update(client_round(trainer, data, payload={"model": w}))``."""
    return ClientRound(rnd, data, seed, trainer, trainer.optimizer, payload or {}, personal,
                       extra)


def without_timing(rows: list[dict]) -> list[dict]:
    """Table rows without the columns that measure the run rather than result from it."""
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def run_local_as_a_ray_worker(spec: ResolvedSpec) -> dict:
    """The in-process reference run's tables with one torch thread, as a Ray worker of these
    specs has (its threads = its CPUs): the arithmetic the Ray backend must reproduce."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run_experiment(spec, backend="local").tables
    finally:
        torch.set_num_threads(threads)


def contract_spec(name: str, params: dict[str, Any] | None = None, rounds: int = 4,
                  **sections: dict[str, Any]) -> ResolvedSpec:
    """Six clients, mlp, half participation, a validation split (so both evaluation splits are
    scored); the data the method ``requires``: multi-task digits for ``tasks``, two rotated
    groups for ``groups``. Two workers, so uploads are reduced on more than one. ``sections``
    update the spec's sections of those names (``resources={"workers": 1}``); one that names
    another model, dataset or scenario replaces the contract's."""
    requires = METHODS.get(name).requires
    spec: dict[str, Any] = {
        "name": "contract",
        "seed": 3,
        "dataset": {"name": "digits"},
        "scenario": {"name": "label_subset", "k": 2, "val_fraction": 0.1},
        "model": {"name": "mlp", "hidden": [16]},
        "method": {"name": name},
        "federation": {"num_clients": 6, "participation": 0.5, "rounds": rounds,
                       "batch_size": 16, "optimizer": {"lr": 0.05, "momentum": 0.9}},
        "eval_every": 2,
        "resources": {"workers": 2, "cpus_per_worker": 0.5, "gpus_per_worker": 0.25},
    }
    if params:
        spec["method"]["params"] = dict(params)
    if "tasks" in requires:
        spec["dataset"] = {"name": "digits_multitask"}
        spec["scenario"] = {"name": "multitask_dirichlet", "alpha": 0.5, "val_fraction": 0.1}
    if "groups" in requires:
        spec["scenario"] = {"name": "rotation", "groups": 2, "val_fraction": 0.1}
    for section, changes in sections.items():
        current = spec.get(section, {})
        if changes.get("name", current.get("name")) != current.get("name"):
            current = {}  # another model, dataset or scenario: none of the contract's settings
        spec[section] = {**current, **changes}
    return validate(spec)


def _local_runtime(spec: ResolvedSpec) -> LocalRuntime:
    return LocalRuntime(Blueprint(spec, build_federation(spec)))


def _personal_of(runtime: LocalRuntime) -> dict:
    return {c: s for shard in runtime.coordinator.pool.shards for c, s in shard.personal.items()}


def _assert_same_tree(a: Any, b: Any, where: str) -> None:
    if torch.is_tensor(a):
        assert torch.is_tensor(b) and torch.equal(a, b), f"{where} differs"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), \
            f"{where} has keys {sorted(map(str, a))} against {sorted(map(str, b))}"
        for k in a:
            _assert_same_tree(a[k], b[k], f"{where}[{k!r}]")
    else:
        assert a == b, f"{where} is {a!r} against {b!r}"


@contextmanager
def _recorded_uploads() -> Iterator[list[tuple[int, dict]]]:
    """Every client upload handed to a worker's reduction while the block runs, in order."""
    sent: list[tuple[int, dict]] = []
    add = Reduction.add

    def recording(self, cid, upload):
        sent.append((cid, upload))
        add(self, cid, upload)

    Reduction.add = recording
    try:
        yield sent
    finally:
        Reduction.add = add


# ---- the checks: each takes the registered name and the method params of the tiny run ---------
def params_have_valid_defaults(name: str, params: dict | None) -> None:
    """A spec that names the method without params must be valid."""
    METHODS.get(name).Params()


def deploys_what_it_declares(name: str, params: dict | None) -> None:
    """After a round, every client deploys models named in ``deployables`` (in their order),
    with columns only for models it deploys, and under ``evaluation = "shared"`` every client
    deploys the same models: the runtime scores a shared evaluation once for everyone, so a
    per-client model declared shared would be scored as the first client's."""
    cls = METHODS.get(name)
    runtime = _local_runtime(contract_spec(name, params, federation={"participation": 1.0}))
    runtime.setup()
    runtime.run_round(1)
    deployed: dict[int, Deployment] = {}
    for shard in runtime.coordinator.pool.shards:
        deploy = shard.method.deploy

        def recording(client, deploy=deploy):
            deployed[client.cid] = deploy(client)
            return deployed[client.cid]

        shard.method.deploy = recording
    if cls.evaluation == "shared":  # the runtime asks one client per worker: ask them all
        for shard in runtime.coordinator.pool.shards:
            shard.method.evaluation = "per_client"
    runtime.coordinator.evaluate(1)
    assert deployed, "no client deployed anything"
    for cid, deployment in sorted(deployed.items()):
        names = list(deployment.models)
        assert names == [n for n in cls.deployables if n in names], \
            f"client {cid} deploys {names}, not a subset of deployables {cls.deployables} " \
            "in their order"
        assert set(deployment.columns) <= set(names), \
            f"client {cid} gives columns for {sorted(deployment.columns)} but deploys {names}"
    if cls.evaluation == "shared":
        first, *others = deployed.values()
        for cid, deployment in sorted(deployed.items()):
            assert deployment.models.keys() == first.models.keys() and all(
                torch.equal(deployment.models[n], first.models[n]) for n in first.models), \
                f"it declares evaluation = 'shared' but client {cid} deploys other models " \
                f"than client {min(deployed)}; declare evaluation = 'per_client'"


def same_seed_gives_identical_tables(name: str, params: dict | None) -> None:
    """Two runs of one spec write the same rounds and clients tables, and every client is
    scored on both of its evaluation splits."""
    first = run_experiment(contract_spec(name, params)).tables
    second = run_experiment(contract_spec(name, params)).tables
    assert first["trials"][0]["status"] == "ok", \
        f"the run ended {first['trials'][0]['status']}: {first['trials'][0]['error']}"
    for table in ("rounds", "clients"):
        assert without_timing(first[table]) == without_timing(second[table]), \
            f"the {table} tables of two runs with the same seed differ"
    splits = {r["split"] for r in first["clients"]}
    assert splits == {"test", "val"}, f"clients were scored on {sorted(splits)}, not test and val"


def participants_upload_the_same_keys_and_bytes_count_what_was_sent(
        name: str, params: dict | None) -> None:
    """In rounds 1 and 2: exactly the participants train, each later phase hears from exactly
    the clients it asks (every client unless its ``answering`` selects), all participants
    upload the same keys, bytes up are what the clients sent and bytes down at least the
    broadcast to each participant."""
    runtime = _local_runtime(contract_spec(name, params))
    coordinator = runtime.coordinator
    everyone = list(range(coordinator.federation.num_clients))
    asked: list[int] = []
    answer = coordinator.pool.answer

    def recording(number, rnd, payload, work, extras):
        phase = coordinator.method.phases()[number - 1]
        chosen = everyone if phase.answering is None else \
            sorted(int(c) for c in phase.answering(coordinator.state, rnd))
        sent_to = sorted(int(c) for ids in work.values() for c in ids)
        assert sent_to == chosen, \
            f"round {rnd}: phase {phase.name!r} asked {sent_to}, its answering selects {chosen}"
        asked.extend(chosen)
        return answer(number, rnd, payload, work, extras)

    coordinator.pool.answer = recording
    with _recorded_uploads() as sent:
        for rnd in (1, 2):
            sent.clear()
            asked.clear()
            payload = coordinator.method.broadcast(coordinator.state, rnd)
            outcome = runtime.run_round(rnd)
            participants = outcome.record["participant_ids"]
            trained = sent[: len(participants)]  # then the answers of each later phase
            answers = sent[len(participants):]
            assert sorted(c for c, _ in trained) == participants, \
                f"round {rnd}: uploads came from {sorted(c for c, _ in trained)}, " \
                f"not the participants {participants}"
            assert sorted(c for c, _ in answers) == sorted(asked), \
                f"round {rnd}: answers came from {sorted(c for c, _ in answers)}, the phases " \
                f"asked {sorted(asked)}"
            keys = {tuple(sorted(u)) for _, u in trained}
            assert len(keys) == 1, f"round {rnd}: participants uploaded different keys {keys}"
            counted, uploaded = outcome.record["bytes_up"], sum(upload_bytes(u) for _, u in sent)
            assert counted == uploaded, \
                f"round {rnd}: bytes_up is {counted}, the clients sent {uploaded}"
            least = tensor_bytes(payload) * len(participants)
            assert outcome.record["bytes_down"] >= least, \
                f"round {rnd}: bytes_down {outcome.record['bytes_down']} is less than the " \
                f"broadcast to every participant ({least})"


def checkpoint_and_restore_equals_an_uninterrupted_run(name: str, params: dict | None) -> None:
    """Checkpointed after round 2 and restored into fresh workers, a run's rounds, client rows,
    personal state and server state equal those of an uninterrupted run."""
    spec = contract_spec(name, params)
    straight = _local_runtime(spec)
    straight.setup()
    full = [straight.run_round(r) for r in (1, 2, 3, 4)]

    first = _local_runtime(spec)
    first.setup()
    head = [first.run_round(r) for r in (1, 2)]
    with tempfile.TemporaryDirectory() as folder:
        snapshot = copy.deepcopy(first.checkpoint(f"{folder}/round-2"))
        fresh = _local_runtime(spec)  # new workers: nothing carried over but the snapshot
        fresh.restore(snapshot)
    assert fresh.setup() is None, "the setup phase ran again after a restore"
    tail = [fresh.run_round(r) for r in (3, 4)]

    resumed = head + tail
    assert without_timing([o.record for o in resumed]) == \
        without_timing([o.record for o in full]), "the resumed run's rounds table differs"
    assert [o.clients for o in resumed] == [o.clients for o in full], \
        "the resumed run's clients table differs"
    _assert_same_tree(_personal_of(fresh), _personal_of(straight), "personal state")
    _assert_same_tree(fresh.coordinator.state, straight.coordinator.state, "server state")


def cohort_training_equals_the_sequential_path(name: str, params: dict | None,
                                               **sections: dict[str, Any]) -> None:
    """For a method that declares its update as a ``FitPlan``: four rounds with the
    participants trained in lockstep cohorts end where four rounds trained one client after
    another do — server state, personal state, the rounds' training losses and every client's
    scores — up to float rounding of the batched kernels (``COHORT_TOLERANCE``). One worker,
    so cohorts form; an optimizer that takes every part of the step (momentum, weight decay,
    clipping). A method without a plan has nothing to check. ``sections`` update the
    contract's spec (``contract_spec``): ``model={"name": ...}`` checks the method on another
    model, e.g. one with BatchNorm and dropout, whose running statistics and masks are each
    client's own."""
    optimizer = {"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-3, "grad_clip": 1.0}

    def trained(cohort: str) -> tuple[LocalRuntime, list]:
        runtime = _local_runtime(contract_spec(
            name, params, **{**sections, "resources": {"workers": 1, "cohort": cohort},
                             "federation": {"optimizer": optimizer}}))
        runtime.setup()
        return runtime, [runtime.run_round(r) for r in (1, 2, 3, 4)]

    shard = _local_runtime(contract_spec(name, params, **sections)).coordinator.pool.shards[0]
    if not shard.method.plans_updates:
        return
    (lockstep, together), (alone, apart) = trained("auto"), trained("off")
    assert lockstep.coordinator.pool.shards[0].cohort is not None, \
        "the runtime trained its plans one client after another (the run's log says why)"
    _assert_close_tree(lockstep.coordinator.state, alone.coordinator.state, "server state")
    _assert_close_tree(_personal_of(lockstep), _personal_of(alone), "personal state")
    for a, b in zip(together, apart):
        rnd = a.record["round"]
        assert math.isclose(a.record["loss"], b.record["loss"], rel_tol=0,
                            abs_tol=COHORT_TOLERANCE) or a.record["loss"] == b.record["loss"] \
            or (math.isnan(a.record["loss"]) and math.isnan(b.record["loss"])), \
            f"round {rnd}: training loss {a.record['loss']} in cohorts, {b.record['loss']} alone"
        assert [_scores(r) for r in a.clients] == [_scores(r) for r in b.clients], \
            f"round {rnd}: the clients' scores differ"


COHORT_TOLERANCE = 1e-5
"""How far cohort training may land from the sequential path: float rounding of batched
kernels, nothing else."""


def _scores(row: dict) -> tuple:
    return (row["split"], row["client_id"], row["deployable"], row["task"], row["n_test"],
            row["correct"])


def _assert_close_tree(a: Any, b: Any, where: str) -> None:
    """``_assert_same_tree`` up to ``COHORT_TOLERANCE`` on floating tensors and floats (a
    server statistic such as FedAMP's ``scale`` is a Python float computed from the uploads)."""
    if torch.is_tensor(a) and a.is_floating_point():
        assert torch.is_tensor(b) and a.shape == b.shape, f"{where} differs in shape"
        gap = float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
        assert gap <= COHORT_TOLERANCE, f"{where} differs by up to {gap:.2e}"
    elif isinstance(a, float):
        assert isinstance(b, float) and math.isclose(a, b, rel_tol=COHORT_TOLERANCE,
                                                     abs_tol=COHORT_TOLERANCE), \
            f"{where} is {a!r} against {b!r}"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), \
            f"{where} has keys {sorted(map(str, a))} against {sorted(map(str, b))}"
        for k in a:
            _assert_close_tree(a[k], b[k], f"{where}[{k!r}]")
    else:
        _assert_same_tree(a, b, where)


def ray_backend_gives_identical_client_results(name: str, params: dict | None) -> None:
    """Two rounds on Ray actors give the in-process run's per-client accuracies and bytes up.

    Needs a Ray this process is connected to, with 1.25 CPUs and half a GPU free (a logical GPU
    will do: ``ray.init(num_gpus=1)``), where the method is registered in every worker (a
    plugin, not a class passed to ``check_method``)."""
    spec = contract_spec(name, params, rounds=2)
    local = run_local_as_a_ray_worker(spec)
    remote = run_experiment(spec, backend="ray").tables
    assert remote["trials"][0]["status"] == "ok", \
        f"the Ray run ended {remote['trials'][0]['status']}: {remote['trials'][0]['error']}"

    def client_results(tables):
        return [(r["split"], r["client_id"], r["deployable"], r["task"], r["accuracy"])
                for r in tables["clients"]]

    assert client_results(remote) == client_results(local), \
        "per-client accuracies on Ray differ from the in-process run's"
    assert [r["bytes_up"] for r in remote["rounds"]] == \
        [r["bytes_up"] for r in local["rounds"]], "bytes up on Ray differ from in process"


Check = Callable[[str, dict | None], None]
CHECKS: dict[str, Check] = {check.__name__: check for check in (
    params_have_valid_defaults,
    deploys_what_it_declares,
    same_seed_gives_identical_tables,
    participants_upload_the_same_keys_and_bytes_count_what_was_sent,
    checkpoint_and_restore_equals_an_uninterrupted_run,
    cohort_training_equals_the_sequential_path,
    ray_backend_gives_identical_client_results,
)}
IN_PROCESS = tuple(n for n in CHECKS if n != ray_backend_gives_identical_client_results.__name__)
"""The checks ``check_method`` runs by default: everything but the one that needs Ray."""


def check_method(method: str | type[Method], *, params: dict[str, Any] | None = None,
                 checks: Iterable[str] = IN_PROCESS) -> None:
    """Run the method contract's ``checks`` (names in ``CHECKS``) on ``method``, a registered
    name or a ``Method`` subclass (registered under its ``name`` for the checks only, when it
    is not already); raise one ``AssertionError`` naming the method and every check that
    failed, chained to the first failure's own error.

    ``params`` are the method's parameters for the tiny runs: shorten loops no contract
    property depends on (raylf's suite runs FedALA with 2 weight-learning passes), or supply
    required ones. Every check runs even after one fails, so one call reports them all."""
    checks = list(checks)
    unknown = [c for c in checks if c not in CHECKS]
    if unknown:
        raise ValueError(f"unknown checks {unknown}; allowed: {', '.join(CHECKS)}")
    if isinstance(method, str):
        name, registration = method, nullcontext()
    else:
        name = method.name
        if name not in METHODS:
            registration = METHODS.temporarily(name, method)
        elif METHODS.get(name) is method:
            registration = nullcontext()
        else:
            raise ValueError(f"another method is registered as {name!r}: "
                             f"{METHODS.get(name).__qualname__}")
    failures: list[tuple[str, BaseException]] = []
    with registration:
        METHODS.get(name)  # an unknown name is the caller's mistake, not a failed check
        for check in checks:
            try:
                CHECKS[check](name, params)
            except Exception as err:  # an error is as much a failed check as an assertion
                failures.append((check, err))
    if failures:
        lines = [f"method {name!r} fails {len(failures)} of {len(checks)} contract checks:"]
        lines += [f"- {check}: {_reason(err)}" for check, err in failures]
        raise AssertionError("\n".join(lines)) from failures[0][1]


def _reason(err: BaseException) -> str:
    """One list item of the failure: the message (lines after the first indented under it),
    prefixed by the error's type unless it is a failed assertion."""
    text = (str(err).strip() or "(no message)").replace("\n", "\n  ")
    return text if isinstance(err, AssertionError) else f"{type(err).__name__}: {text}"
