"""What the coordinator and every worker rebuild identically from the spec and the federation."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from raylf.config import ResolvedSpec, validate
from raylf.data.federation import Federation
from raylf.data.scenarios import SCENARIOS
from raylf.methods import Method, MethodContext
from raylf.models import SplitModel, build_model
from raylf.seeding import derive
from raylf.training.layout import ParamLayout, model_vector
from raylf.training.sequential import LocalTrainer

REPLICATE_MAX_BYTES = 256 * 2**20  # client_data auto: the most training data copied per worker


@dataclass
class Blueprint:
    """A resolved spec plus its federation: enough to rebuild model, method and trainer."""

    spec: ResolvedSpec
    federation: Federation

    def __reduce__(self):
        # Ship the spec as plain data and re-validate on arrival (no pydantic internals pickled).
        return _rebuild, (self.spec.to_dict(), self.federation)

    def build_model(self, index: int | None = None) -> SplitModel:
        """The common initialization (``index`` None): every client and the server start from
        these weights; with an ``index``, the independently seeded model ``index`` (a cluster
        model of IFCA or FedSoft), shaped by the method's ``Method.build_model``.
        """
        # (1, index), not (index,): a seed key's trailing zeros are ignored, so index 0
        # would otherwise reproduce the common init
        seed = derive(self.spec.seed, "init") if index is None else \
            derive(self.spec.seed, "init", 1, index)
        torch.manual_seed(seed)
        fed = self.federation

        def spec_model(outputs: int) -> SplitModel:
            return build_model(self.spec.model.name, self.spec.model_params, fed.input_shape,
                               outputs)

        return self.spec.method_class.build_model(spec_model, fed, self.spec.method_params)

    @cached_property
    def layout(self) -> ParamLayout:
        return ParamLayout.of(self.build_model())

    def initial_vector(self, index: int | None = None) -> torch.Tensor:
        return model_vector(self.build_model(index), self.layout)

    def context(self) -> MethodContext:
        fed, spec = self.federation, self.spec
        return MethodContext(self.layout, fed.num_clients, fed.n_train, fed.num_classes,
                             spec.federation.rounds, spec.federation.participants_per_round(),
                             spec.seed, fed.groups if self.latent_groups else None,
                             self.initial_vector, spec.federation.batch_size,
                             spec.federation.local_epochs)

    @property
    def latent_groups(self) -> bool:
        """Whether the scenario's groups are true latent groups (rotation, label permutation…)
        rather than a summary such as a Dirichlet client's dominant class."""
        return getattr(SCENARIOS.get(self.spec.scenario.name), "latent_groups", False)

    def method(self) -> Method:
        return self.spec.method_class(self.spec.method_params, self.context())

    def trainer(self, device: torch.device) -> LocalTrainer:
        fed = self.spec.federation
        return LocalTrainer(self.build_model(), self.layout, fed.optimizer, fed.batch_size,
                            fed.local_epochs, device)

    def shards(self) -> list[np.ndarray]:
        """Each worker's home clients: contiguous, nearly equal blocks. A worker evaluates its
        home clients, and with sharded data it alone holds and trains them."""
        clients = np.arange(self.federation.num_clients)
        return np.array_split(clients, self.spec.active_workers())

    @cached_property
    def replicated(self) -> bool:
        """Whether every worker holds all clients' data (``resources.client_data``).

        Then any worker can train any client, so each round's participants are split to
        balance the work instead of by home; clients with resident state (a private head)
        must stay home, so stateful methods always shard (``validate`` refuses ``replicated``
        for them).
        """
        choice = self.spec.resources.client_data
        if choice != "auto":
            return choice == "replicated"
        return (not self.spec.method_class.personal_state
                and len(self.shards()) > 1
                and self.federation.train_bytes() <= REPLICATE_MAX_BYTES)

    def hosted(self) -> list[np.ndarray]:
        """Client ids whose data each worker holds."""
        everyone = np.arange(self.federation.num_clients)
        return [everyone for _ in self.shards()] if self.replicated else self.shards()


def _rebuild(spec: dict, federation: Federation) -> Blueprint:
    return Blueprint(validate(spec), federation)


def pick_device() -> torch.device:
    """cuda when this process can use it (Ray hides GPUs from actors without a share)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def describe_device(device: torch.device) -> str:
    """What a client trained on, as the rounds table's ``worker_device`` and the trials
    table's ``env.device`` record it: ``cuda: <GPU name>`` or ``cpu: <CPU model>``."""
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    import platform

    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            model = next((line.split(":", 1)[1].strip() for line in info
                          if line.startswith("model name")), model)
    except OSError:
        pass
    return f"cpu: {model}"
