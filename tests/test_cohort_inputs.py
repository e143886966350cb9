"""Cohorts of a model that does not take float pixels: a character LSTM's token ids."""

from __future__ import annotations

import torch

from raylf.models.paper import CharLSTM
from raylf.schema import OptimizerSpec
from raylf.training.cohort import CohortTrainer
from raylf.training.layout import ParamLayout
from raylf.training.sequential import LocalTrainer


def test_auto_cohort_sizing_runs_the_model_on_inputs_of_the_datas_type():
    """``cohort: auto`` measures a member's activations on a batch shaped and typed as the
    data: zeros as token ids, not float zeros an embedding refuses (the smoke run of
    tune/spcacw_shakespeare.yaml found FedAMP's and Ditto's workers dying on it)."""
    net = CharLSTM.build(CharLSTM.Params(embedding=8, hidden=8, layers=1), (50,), 80)
    trainer = LocalTrainer(net, ParamLayout.of(net), OptimizerSpec(), 4, 1, torch.device("cpu"))
    ids = torch.randint(0, 80, (10, 50))
    size = CohortTrainer(trainer).size("auto", 3, 4, ids)
    assert 1 <= size <= 3
