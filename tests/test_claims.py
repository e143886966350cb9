"""``raylf.report.claims``: every verdict rule on constructed tables whose answer is known by
hand, each with a case where it comes out the other way. The claims are a test paper's
(``papers.parse``), so the rules are tested apart from what the shipped papers claim."""

from __future__ import annotations

import pytest

from raylf.report import claims, papers
from raylf.report.data import load
from raylf.report.measured import Measured
from tests.test_scorecard import C10_LS2, _write

C100_LS2 = {**C10_LS2, "dataset.name": "cifar100"}
DIGITS = {**C10_LS2, "dataset.name": "digits", "model.name": "mlp", "model.weights": None}
BASE = [0.60, 0.62, 0.64, 0.66, 0.68, 0.70]  # six clients' accuracies


def paper(*claims_: dict) -> papers.Paper:
    """A paper of two settings (CIFAR-10 and CIFAR-100, label subset k = 2) and ``claims_``,
    each over CIFAR-10 on acc_mean per setting unless it says otherwise."""
    default = {"kind": "beats", "metrics": ["acc_mean"], "over": "setting",
               "source": "Table 1: 'a test statement'",
               "scope": {"settings": ["c10"], "text": "CIFAR-10"}}
    return papers.parse({
        "paper": "test", "title": "A test paper", "note": "", "tables": [],
        "settings": {"c10": {"preset": "hdcfl-c10-ls2", "match": ["scenario.name", "scenario.k"]},
                     "c100": {"preset": "hdcfl-c100-ls2",
                              "match": ["scenario.name", "scenario.k"]}},
        "claims": [{"name": f"claim {i}", **default, **c} for i, c in enumerate(claims_)]})


def decide(root, *claims_: dict) -> list[claims.Verdict]:
    return claims.evaluate(Measured(load(str(root))), paper(*claims_))


def write(root, method: str, accuracy: list[float], seeds=(0, 1), setting=C10_LS2, **kw):
    for seed in seeds:
        _write(root, method, seed, accuracy, setting, **kw)


def test_a_method_numerically_behind_is_not_the_best_however_small_the_gap(tmp_path):
    """The papers claim the numerically highest: 0.17 points behind, on a difference the
    paired test cannot tell from noise, is not it; 0.17 points ahead is."""
    noise = [0.01, -0.005, 0.01, -0.005, 0.0, 0.0]
    write(tmp_path / "behind", "hdcfl", BASE)
    write(tmp_path / "behind", "fedce", [a + e for a, e in zip(BASE, noise)])
    best = {"kind": "best", "method": "hdcfl"}
    behind = decide(tmp_path / "behind", best)[0]
    assert behind.verdict == claims.FAILS
    assert "is behind fedce" in behind.numbers and "shown, not used" in behind.numbers
    write(tmp_path / "ahead", "hdcfl", BASE)
    write(tmp_path / "ahead", "fedce", [a - e for a, e in zip(BASE, noise)])
    assert decide(tmp_path / "ahead", best)[0].verdict == claims.HOLDS


def test_five_pairs_under_the_exact_test_are_undecidable_six_are_not(tmp_path):
    """SP-CACW's protocol: one target client, five seeds. Every pair in the claim's favour
    still gives the exact test only p = 2 / 2**5 = 0.0625, for beats and for an equivalence
    alike; a sixth seed brings it to 0.03125."""
    gains = [0.01, 0.02, 0.03, 0.04, 0.05, 0.06]
    rules = ({"method": "hdcfl", "against": ["fedavg_se"]},
             {"kind": "equivalent", "method": "hdcfl", "against": ["fedavg_se"], "margin": 0.1})
    for seeds in (5, 6):
        root = tmp_path / str(seeds)
        for seed, gain in zip(range(seeds), gains):
            _write(root, "fedavg_se", seed, [0.5], C10_LS2, clients=[0])
            _write(root, "hdcfl", seed, [0.5 + gain], C10_LS2, clients=[0])
        beats, same = (decide(root, rule)[0] for rule in rules)
        if seeds == 5:
            assert beats.verdict == same.verdict == claims.UNDECIDABLE
            assert "exact, 5 pairs" in beats.numbers
            assert "smallest attainable p is 0.0625" in beats.numbers
        else:
            assert beats.verdict == same.verdict == claims.HOLDS
            assert "p = 0.031" in beats.numbers


def test_an_equivalence_within_its_margin_holds_a_wide_one_is_not_shown_a_gap_fails(tmp_path):
    margin = {"kind": "equivalent", "method": "hdcfl", "against": ["fedavg_se"],
              "margin": 0.01}
    cases = {"close": ([0.002, -0.001, 0.0015, -0.002, 0.001, -0.0005], claims.HOLDS),
             "wide": ([0.03, -0.03, 0.02, -0.02, 0.01, -0.01], claims.NOT_SHOWN),
             "apart": ([-0.05, -0.04, -0.06, -0.05, -0.045, -0.055], claims.FAILS)}
    for name, (offsets, expected) in cases.items():
        write(tmp_path / name, "fedavg_se", BASE)
        write(tmp_path / name, "hdcfl", [a + o for a, o in zip(BASE, offsets)])
        verdict = decide(tmp_path / name, margin)[0]
        assert verdict.verdict == expected, (name, verdict.numbers)
        assert "margin 1.00 points" in verdict.numbers


def test_noninferiority_against_the_strongest_holds_within_the_margin_and_fails_beyond(tmp_path):
    competitive = {"kind": "noninferior", "method": "hdcfl", "margin": 0.01}
    for name, gap, expected in (("near", 0.004, claims.HOLDS), ("far", 0.03, claims.FAILS)):
        write(tmp_path / name, "fedbabu", BASE)
        write(tmp_path / name, "fedavg_se", [a - 0.05 for a in BASE])
        write(tmp_path / name, "hdcfl", [a - gap + 0.001 * (c % 2) for c, a in enumerate(BASE)])
        verdict = decide(tmp_path / name, competitive)[0]
        assert verdict.verdict == expected, verdict.numbers
        assert "the strongest, fedbabu," in verdict.numbers


def test_holm_turns_a_borderline_test_into_not_shown(tmp_path):
    """Eight pairs, the two smallest against: exact two-sided p = 2 × 5 / 256 = 0.039 holds
    alone; beside a second, non-significant test of the same sweep Holm doubles it to 0.078."""
    d = [-0.001, -0.002, 0.003, 0.004, 0.005, 0.006, 0.007, 0.008]
    noise = [0.01, -0.01, 0.02, -0.02, 0.015, -0.015, 0.005, -0.005]
    clients = list(range(8))
    _write(tmp_path, "fedavg_se", 0, [0.5] * 8, C10_LS2, clients=clients)
    _write(tmp_path, "hdcfl", 0, [0.5 + x for x in d], C10_LS2, clients=clients)
    _write(tmp_path, "fedala", 0, [0.5] * 8, C10_LS2, clients=clients)
    _write(tmp_path, "fedbabu", 0, [0.5 + x for x in noise], C10_LS2, clients=clients)
    borderline = {"method": "hdcfl", "against": ["fedavg_se"]}
    alone = decide(tmp_path, borderline)[0]
    assert alone.verdict == claims.HOLDS and "p = 0.039, Holm 0.039" in alone.numbers
    both = decide(tmp_path, borderline, {"method": "fedbabu", "against": ["fedala"]})
    assert both[0].verdict == claims.NOT_SHOWN and "p = 0.039, Holm 0.078" in both[0].numbers
    assert both[1].verdict == claims.NOT_SHOWN


def test_an_oracle_is_never_ranked_but_is_compared_where_named(tmp_path):
    write(tmp_path, "clustered_oracle_se", [a + 0.2 for a in BASE])
    write(tmp_path, "hdcfl", [a + 0.05 for a in BASE])
    write(tmp_path, "fedavg_se", BASE)
    best, top, named = decide(
        tmp_path, {"kind": "best", "method": "hdcfl"},
        {"kind": "top", "methods": ["hdcfl"], "rank": 1},
        {"method": "hdcfl", "against": ["clustered_oracle_se"]})
    assert best.verdict == top.verdict == claims.HOLDS
    assert "is the highest of 2" in best.numbers and "oracle" not in best.numbers
    assert "hdcfl ranks 1 of 2" in top.numbers
    assert named.verdict == claims.FAILS  # 15 points below the oracle, asked for by name


def test_a_macro_claim_names_the_baseline_it_dropped(tmp_path):
    """fedce ran on CIFAR-10 only: the largest block shared by the methods is both settings
    without it, and the verdict says so."""
    scope = {"settings": ["c10", "c100"], "text": "both"}
    for setting in (C10_LS2, C100_LS2):
        write(tmp_path, "hdcfl", [a + 0.05 for a in BASE], setting=setting,
              tag=setting["dataset.name"])
        write(tmp_path, "fedavg_se", BASE, setting=setting, tag=setting["dataset.name"])
    write(tmp_path, "fedce", [a + 0.1 for a in BASE], tag="cifar10")
    verdict = decide(tmp_path, {"kind": "best", "method": "hdcfl", "over": "macro",
                                "scope": scope})[0]
    assert verdict.verdict == claims.HOLDS
    assert "dropped (not in every setting of the block): fedce" in verdict.where
    assert verdict.where.startswith("mean over cifar10 · label_subset · resnet18; cifar100")


def test_outside_its_scope_a_claim_is_only_exploratory(tmp_path):
    write(tmp_path, "fedavg_se", BASE, setting=DIGITS)
    write(tmp_path, "hdcfl", [a + 0.05 for a in BASE], setting=DIGITS)
    inside, outside = decide(tmp_path, {"method": "hdcfl", "against": ["fedavg_se"]})
    assert inside.verdict == claims.UNTESTABLE and not inside.exploratory
    assert "no real setting of the sweep lies in the claim's scope (CIFAR-10)" in inside.where
    assert outside.exploratory and outside.verdict == claims.HOLDS
    assert outside.scope == "exploratory: outside the paper's scope (CIFAR-10)"


def test_accuracy_rising_with_a_field_between_settings_alike_otherwise(tmp_path):
    rises = {"kind": "rises_with", "method": "fmtsvm", "field": "federation.local_epochs"}
    for name, sign, expected in (("rises", 1, claims.HOLDS), ("falls", -1, claims.FAILS)):
        for epochs, shift in ((1, 0.0), (5, 0.05 * sign)):
            write(tmp_path / name, "fmtsvm", [a + shift for a in BASE],
                  setting={**C10_LS2, "federation.local_epochs": epochs}, tag=f"-E{epochs}")
        verdict = decide(tmp_path / name, rises)[0]
        assert verdict.verdict == expected
        assert "local_epochs 5" in verdict.numbers and "local_epochs 1" in verdict.numbers


def test_fewer_bytes_by_a_stated_factor(tmp_path):
    for method, sent in (("fmtsvm", 2_000), ("fed_pure_cnn", 500_000)):
        write(tmp_path, method, BASE, rounds={"bytes_up": sent, "bytes_down": 0,
                                              "participants": 1})
    claim = {"kind": "fewer_bytes", "method": "fmtsvm", "against": ["fed_pure_cnn"],
             "metrics": ["bytes_up_per_client_round"]}
    assert decide(tmp_path, {**claim, "factor": 200})[0].verdict == claims.HOLDS
    lower = decide(tmp_path, {**claim, "factor": 400})[0]  # 250x is not 400x
    assert lower.verdict == claims.FAILS and "250.0x fewer, at least 400x asked" in lower.numbers


def test_a_claim_file_without_scope_margin_or_source_is_refused():
    with pytest.raises(ValueError, match="needs margin"):
        paper({"kind": "equivalent", "method": "hdcfl", "against": ["fedavg_se"]})
    with pytest.raises(ValueError, match="scope names no setting"):
        paper({"method": "hdcfl", "against": ["fedavg_se"],
               "scope": {"settings": ["nowhere"], "text": "?"}})
    with pytest.raises(ValueError, match="needs a source"):
        paper({"method": "hdcfl", "against": ["fedavg_se"], "source": ""})
