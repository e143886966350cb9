"""``raylf.report.scorecard``: the papers' figures and claims against constructed sweeps whose
answers are known by hand (a comparable setting, a stand-in one, one on other data), the
ranks' agreement, claims that hold and do not, per-step and selfish-target settings, the CLI,
and the shipped paper files themselves."""

from __future__ import annotations

import statistics

import pytest

from raylf import results
from raylf.methods import METHODS
from raylf.report import claims, papers, scorecard
from raylf.report.__main__ import main
from raylf.report.data import load
from raylf.report.measured import Measured

# the HDC-FL paper's "C10 LS2" column at raylf's paper scale (preset hdcfl-c10-ls2)
C10_LS2 = {"dataset.name": "cifar10", "scenario.name": "label_subset", "scenario.k": 2,
           "model.name": "resnet18", "model.weights": "imagenet", "federation.num_clients": 20,
           "federation.rounds": 50, "federation.local_epochs": 1, "federation.batch_size": 64}
DIGITS_LS2 = {**C10_LS2, "dataset.name": "digits", "model.name": "mlp",
              "federation.rounds": 20}
CLIENTS = 6
# per method: the seed-0 client accuracies; seed 1 adds 0.02 to each
ACCURACY = {"fedavg_se": [0.95] * CLIENTS, "fedbabu": [0.97] * CLIENTS,
            "fedala": [0.90] * CLIENTS, "hdcfl": [0.90 + 0.01 * c for c in range(CLIENTS)]}


def _write(root, method: str, seed: int, accuracy: list[float], setting: dict,
           origin: str = "real", extra: dict | None = None, clients: list[int] | None = None,
           tag: str = "") -> None:
    """One ok trial: its clients' final test accuracies and the trials row they summarize."""
    trial_id = f"{method}-s{seed}{tag}"
    clients = list(range(len(accuracy))) if clients is None else clients
    ordered = sorted(accuracy)
    bottom = ordered[: max(1, len(ordered) // 5)]
    trial = {"trial_id": trial_id, "sweep": "sc", "name": "sc", "method": method,
             "dataset": setting["dataset.name"], "scenario": setting["scenario.name"],
             "model": setting["model.name"], "seed": seed, "status": "ok", "data_origin": origin,
             "acc_mean": statistics.mean(accuracy), "acc_worst": ordered[0],
             "acc_bottom20": statistics.mean(bottom), "acc_gap": ordered[-1] - ordered[0],
             "method.name": method, "round_unit": METHODS.get(method).round_unit, **setting,
             **(extra or {})}
    rows = [{"trial_id": trial_id, "round": setting["federation.rounds"], "client_id": c,
             "n_train": 160, "split": "test", "deployable": "main", "task": "main",
             "accuracy": a} for c, a in zip(clients, accuracy)]
    results.write_trial(str(root), trial_id, {"trials": [trial], "rounds": [], "clients": rows},
                        {"name": "sc"})


def _sweep(root, setting: dict, origin: str = "real") -> str:
    for method, accuracy in ACCURACY.items():
        for seed in (0, 1):
            _write(root, method, seed, [a + 0.02 * seed for a in accuracy], setting, origin)
    return str(root)


@pytest.fixture(scope="module")
def comparable(tmp_path_factory) -> scorecard.Report:
    root = _sweep(tmp_path_factory.mktemp("comparable"), C10_LS2)
    return scorecard.build(load(root), papers.load("hdcfl"))


def _table(report, title: str):
    return next(t for s in report.sections for t in s.tables if t.title.startswith(title))


def test_a_comparable_cell_shows_the_paper_figure_and_the_difference(comparable):
    cells = _table(comparable, "Table 1").cells.set_index("Paper cell")
    row = cells.loc["FedAvg-SE × C10 LS2"]
    assert row["Paper"] == "97.17 ± 0.62"
    # seeds 0.95 and 0.97: 96.00 ± 1.41, 1.17 points below the paper
    assert row["raylf"] == "96.00 ± 1.41 (2 seeds)"
    assert row["Δ raylf − paper"] == "-1.17"
    settings = _table(comparable, "Paper settings").cells
    verdicts = dict(zip(settings["Paper setting"].str.split().str[0], settings["Verdict"]))
    # label subset k = 2 is also CIFAR-100's LS2 column, on other data
    assert verdicts == {"hdcfl-c10-ls2": "comparable", "hdcfl-c100-ls2":
                        "not comparable: dataset.name cifar10 (paper: cifar100)"}


def test_stand_in_and_other_data_are_not_compared(tmp_path):
    standin = scorecard.build(load(_sweep(tmp_path / "standin", C10_LS2, origin="standin")),
                              papers.load("hdcfl"))
    verdicts = _table(standin, "Paper settings").cells["Verdict"]
    assert all(v.startswith("not comparable: stand-in data") for v in verdicts)
    assert not any(t.title.startswith("Table") for s in standin.sections for t in s.tables)
    assert standin.banner and "Stand-in data" in standin.banner[0]
    claimed = _table(standin, "The paper's claims").cells.set_index("Claim")["Verdict"]
    assert set(claimed) == {claims.UNTESTABLE}  # no claim is decided on stand-in data

    digits = scorecard.build(load(_sweep(tmp_path / "digits", DIGITS_LS2)), papers.load("hdcfl"))
    verdict = _table(digits, "Paper settings").cells["Verdict"].iloc[0]
    assert "dataset.name digits (paper: cifar10)" in verdict
    assert "federation.rounds 20 (paper: 50)" in verdict


def test_rank_agreement_is_kendall_tau_over_the_shared_methods(comparable):
    ranks = _table(comparable, "Kendall").cells
    row = ranks[(ranks["Table"] == "Table 1")
                & (ranks["Paper setting"] == "hdcfl-c10-ls2")].iloc[0]
    # paper: fedavg_se 97.17 > fedbabu 96.99 > fedala 96.51; raylf: fedbabu > fedavg_se >
    # fedala. Of the 3 pairs, (fedavg_se, fedbabu) is discordant: τ = (2 - 1) / 3
    assert row["Methods"] == "3"
    assert row["Kendall τ"] == f"{1 / 3:.3f}"
    assert scorecard.tau_text([0.9, 0.8], [0.1, 0.2]) == "n/a"


def test_a_claim_that_holds_and_one_that_does_not(comparable):
    verdicts = _table(comparable, "The paper's claims").cells.set_index("Claim")
    beats = verdicts.loc["HDC-FL beats FedAvg-SE in mean client accuracy"]
    # hdcfl is 0.90 + 0.01 c on client c against fedavg_se's 0.95: worse on 5 of 6 clients
    assert beats["Verdict"] == claims.FAILS
    competitive = verdicts.loc[
        "HDC-FL is competitive with the best method in macro-averaged mean accuracy"]
    assert competitive["Verdict"] == claims.FAILS  # fedbabu is 4.5 points higher on every pair


def test_beats_holds_when_every_pair_is_better(tmp_path):
    for seed in (0, 1):
        _write(tmp_path, "fedavg_se", seed, [0.80 + 0.01 * c for c in range(CLIENTS)], C10_LS2)
        _write(tmp_path, "hdcfl", seed, [0.85 + 0.01 * c for c in range(CLIENTS)], C10_LS2)
    verdicts = {v.claim.name: v for v in claims.evaluate(Measured(load(str(tmp_path))),
                                                          papers.load("hdcfl"))}
    beats = verdicts["HDC-FL beats FedAvg-SE in mean client accuracy"]
    assert beats.verdict == claims.HOLDS
    assert "Δ +5.00 points" in beats.numbers and "12 pairs" in beats.numbers
    # the highest worst client (85.00 against 80.00) holds on the means: no test needed
    assert verdicts["HDC-FL has the highest macro-averaged worst-client accuracy"].verdict \
        == claims.HOLDS


def test_per_step_and_round_based_methods_meet_in_epochs(tmp_path):
    """SP-CACW's 120 steps of ⌈160 / 32⌉ = 5 per epoch are FedAMP's 24 rounds of one epoch."""
    setting = {"dataset.name": "digits", "scenario.name": "label_permutation",
               "scenario.clusters": 3, "model.name": "mlp", "federation.num_clients": 4,
               "federation.local_epochs": 1, "federation.batch_size": 32}
    for seed in (0, 1):
        _write(tmp_path, "spcacw", seed, [0.9] * 4, {**setting, "federation.rounds": 120})
        _write(tmp_path, "fedamp", seed, [0.8] * 4, {**setting, "federation.rounds": 24})
    trials = Measured(load(str(tmp_path))).trials
    assert trials["setting"].nunique() == 1
    assert set(trials["epochs"]) == {24.0}


def test_a_selfish_target_setting_compares_the_targets_rows(tmp_path):
    """SP-CACW scores its target (client 0) only; FedAMP's value is then client 0's, not the
    mean over its four clients. (50 steps of 5 per epoch: FedAMP's 10 rounds.)"""
    setting = {"dataset.name": "digits", "scenario.name": "rotation", "scenario.step": 4.0,
               "model.name": "mlp", "federation.num_clients": 4, "federation.local_epochs": 1,
               "federation.batch_size": 32, "federation.rounds": 10}
    for seed in (0, 1):
        _write(tmp_path, "spcacw", seed, [0.7], {**setting, "federation.rounds": 50},
               extra={"method.params.targets": "[0]"}, clients=[0])
        _write(tmp_path, "fedamp", seed, [0.6, 0.9, 0.9, 0.9], setting)
    measured = Measured(load(str(tmp_path)))
    values = measured.values("acc_mean").groupby(measured.trials["method"]).mean()
    assert values["fedamp"] == pytest.approx(0.6)
    assert values["spcacw"] == pytest.approx(0.7)
    assert set(measured.pairs("acc_mean")["client_id"]) == {0}


def test_cli_writes_the_scorecard_and_exits_2_on_an_unknown_paper(tmp_path, capsys):
    root = _sweep(tmp_path / "sweep", C10_LS2)
    assert main([root, "--paper", "hdcfl", "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "97.17 ± 0.62" in printed
    assert (tmp_path / "out" / "scorecard-hdcfl.md").read_text().startswith("# raylf scorecard")
    assert main([root, "--paper", "nosuchpaper"]) == 2
    assert "unknown paper 'nosuchpaper'" in capsys.readouterr().err
    # FMT-SVM's methods never ran here: no cell, no claim
    assert main([root, "--paper", "fmtsvm"]) == 2
    assert "none of its claims" in capsys.readouterr().err


@pytest.mark.parametrize("name", papers.names())
def test_every_paper_file_parses_with_registered_methods_and_provenance(name):
    paper = papers.load(name)
    assert paper.figures and paper.claims
    for figure in paper.figures:
        assert figure.method in METHODS, figure
        for field in ("file", "table", "row", "column", "printed", "setting", "metric"):
            assert getattr(figure, field), (field, figure)
        assert figure.file == paper.file
    for claim in paper.claims:
        assert claim.kind in claims.KINDS
        assert claim.over in ("setting", "macro")
        assert all(m in METHODS for m in (*claim.methods, *claim.against)), claim
        assert claim.source
    assert all(m in METHODS for m in paper.references)


def test_hdcfl_tail_tables_are_read_in_the_right_order():
    """Worst ≤ bottom 20 % ≤ mean in every cell: the unlabelled blocks are Tables 7 and 8."""
    by = {}
    for f in papers.load("hdcfl").figures:
        by.setdefault((f.setting, f.method), {})[f.metric] = f.mean
    for key, cell in by.items():
        assert cell["acc_worst"] <= cell["acc_bottom20"] <= cell["acc_mean"], key
