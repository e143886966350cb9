"""``raylf.stats`` and ``raylf.guards`` on constructed frames with known answers: paired
comparisons (a constant difference on every seed and client is significant, noise is tied),
ranks only over methods that share settings, Friedman and Nemenyi against Demšar's worked
numbers, and the degenerate-result and stand-in flags."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from raylf import guards, stats

SEEDS, CLIENTS = 3, 10
NOISE = 1e-9  # far below any accuracy step, far above float rounding of the sums


def _base() -> np.ndarray:
    return np.random.default_rng(0).uniform(0.4, 0.9, (SEEDS, CLIENTS))


def _alternating() -> np.ndarray:
    """± NOISE alternating over clients: noise whose signed ranks cancel exactly."""
    return NOISE * np.where(np.arange(CLIENTS) % 2, 1.0, -1.0)[None, :].repeat(SEEDS, 0)


def _values(setting: str, entries: dict[str, np.ndarray], methods: dict[str, str] | None = None
            ) -> pd.DataFrame:
    """``paired_values`` rows: one per entry, seed and client."""
    rows = [{"trial_id": f"{entry}-s{seed}", "setting": setting, "entry": entry,
             "method": (methods or {}).get(entry, entry), "seed": seed, "client_id": client,
             "value": float(accuracy[seed, client])}
            for entry, accuracy in entries.items()
            for seed in range(SEEDS) for client in range(CLIENTS)]
    return pd.DataFrame(rows)


def _keyed(accuracy: np.ndarray) -> pd.Series:
    index = pd.MultiIndex.from_product([range(SEEDS), range(CLIENTS)], names=["seed", "client"])
    return pd.Series(accuracy.ravel(), index=index)


def test_a_constant_difference_on_every_seed_and_client_is_significant():
    base = _base()
    result = stats.paired(_keyed(base - 0.05), _keyed(base))
    assert result.pairs == SEEDS * CLIENTS
    assert result.delta == pytest.approx(-0.05)
    assert result.low == pytest.approx(-0.05) and result.high == pytest.approx(-0.05)
    assert result.p < 1e-4 and not result.tied


def test_methods_identical_up_to_noise_are_tied():
    base = _base()
    result = stats.paired(_keyed(base + _alternating()), _keyed(base))
    assert abs(result.delta) < NOISE and result.pairs == SEEDS * CLIENTS
    assert result.tied and result.p > 0.5  # signs balanced: far from rejecting
    exact = stats.paired(_keyed(base), _keyed(base))  # every difference zero
    assert exact.delta == 0 and exact.tied


def test_pairs_are_matched_by_seed_and_client_not_by_position():
    base = _base()
    shuffled = _keyed(base - 0.05).sample(frac=1.0, random_state=1)
    assert stats.paired(shuffled, _keyed(base)).delta == pytest.approx(-0.05)
    assert stats.paired(_keyed(base).iloc[:CLIENTS], _keyed(base).iloc[CLIENTS:]) is None


def test_versus_marks_ties_with_the_best_and_compares_with_the_papers_method():
    base = _base()
    values = pd.concat([
        _values("S", {"local": base, "fedavg_se": base + _alternating(), "fedavg": base - 0.05,
                      "hdcfl(groups=2)": base - 0.02, "hdcfl(groups=4)": base - 0.10},
                {"hdcfl(groups=2)": "hdcfl", "hdcfl(groups=4)": "hdcfl"}),
        _values("T", {"fmtsvm": base}),
    ])
    means = values.groupby(["setting", "entry"], sort=False)["value"].mean()
    result = stats.versus(values, means, reproduced=("hdcfl", "fmtsvm"))
    s = result.loc["S"]
    best = set(s["best"])  # local and fedavg_se differ by noise: either is best, both tie
    assert best <= {"local", "fedavg_se"} and len(best) == 1
    assert s.at["fedavg_se", "tied"] and s.at["local", "tied"]
    assert not s.at["fedavg", "tied"] and s.at["fedavg", "best_p"] < 1e-4
    assert s.at["fedavg", "best_delta"] == pytest.approx(-0.05)
    assert s.at["fedavg", "best_pairs"] == SEEDS * CLIENTS
    # the paper's method is its best configuration; against it, fedavg is 3 points lower
    assert set(s["paper"]) == {"hdcfl(groups=2)"}
    assert s.at["fedavg", "paper_delta"] == pytest.approx(-0.03)
    assert math.isnan(s.at["hdcfl(groups=2)", "paper_delta"])  # not against itself
    alone = result.loc[("T", "fmtsvm")]
    assert pd.isna(alone["best"]) and not alone["tied"]  # alone: nothing to be best against


def test_lower_is_better_picks_the_lowest_as_best():
    base = _base()
    values = _values("S", {"a": base, "b": base + 0.1})
    means = values.groupby(["setting", "entry"])["value"].mean()
    result = stats.versus(values, means, higher_is_better=False).loc["S"]
    assert set(result["best"]) == {"a"} and result.at["b", "best_delta"] == pytest.approx(0.1)


def test_per_seed_values_where_a_setting_lacks_client_rows():
    trials = pd.DataFrame({"trial_id": ["a0", "b0", "c0"], "setting": ["S", "S", "T"],
                           "entry": ["a", "b", "c"], "method": ["a", "b", "c"], "seed": [0, 0, 0],
                           "score": [0.5, 0.6, 0.7]})
    per_client = pd.DataFrame({"trial_id": ["c0", "c0"], "client_id": [0, 1],
                               "value": [0.6, 0.8]})
    values = stats.paired_values(trials, "score", per_client).set_index("trial_id")
    assert values.loc[["a0", "b0"], "client_id"].tolist() == [stats.SEED_LEVEL] * 2
    assert values.loc["c0", "value"].tolist() == [0.6, 0.8]


def test_client_accuracy_takes_the_reported_deployable_on_test_at_the_last_round():
    """Ditto reports its personal models (``acc_mean``) and suffixes the global one
    (``acc_mean_a_global``); the clients table holds the global rows first."""
    rows = [{"trial_id": "t", "round": r, "client_id": 0, "split": split, "deployable": d,
             "task": task, "accuracy": acc}
            for r, split, d, task, acc in [
                (2, "test", "global", "a", 0.0), (1, "test", "personal", "main", 0.1),
                (2, "test", "personal", "a", 0.6), (2, "test", "personal", "b", 0.8),
                (2, "val", "personal", "a", 0.0)]]
    trials = pd.DataFrame([{"trial_id": "t", "acc_mean_a": 0.6, "acc_mean_a_global": 0.0}])
    reported = stats.reported_rows(pd.DataFrame(rows), trials)
    assert set(reported["deployable"]) == {"personal"} and set(reported["split"]) == {"test"}
    frame = stats.client_accuracy(reported)
    assert frame["value"].tolist() == [pytest.approx(0.7)]  # mean over the two tasks
    at_first = stats.client_accuracy(reported, pd.Series({"t": 1}))
    assert at_first["value"].tolist() == [pytest.approx(0.1)]
    swapped = trials.rename(columns={"acc_mean_a_global": "acc_mean_a_personal"})
    assert set(stats.reported_rows(pd.DataFrame(rows), swapped)["deployable"]) == {"global"}


def test_ranks_only_over_methods_that_share_the_settings():
    present = pd.DataFrame({"S1": [1, 1, 1, 0], "S2": [1, 1, 1, 0], "S3": [0, 0, 0, 1],
                            "S4": [1, 0, 0, 1]}, index=list("ABCD")).astype(bool)
    assert stats.shared_block(present) == (["S1", "S2"], ["A", "B", "C"])
    alone = pd.DataFrame({"S1": [True, False], "S2": [False, True]}, index=["A", "B"])
    assert stats.shared_block(alone) == ([], [])


def test_friedman_and_nemenyi_match_the_worked_numbers():
    # three methods in the same order on four settings: average ranks 1, 2, 3, Friedman's
    # χ² = 12N/(k(k+1)) Σ(R_j − (k+1)/2)² = 8 with p = e^{−4}; Demšar's q_0.05 for k = 3 is
    # 2.343, so CD = 2.343 · sqrt(3·4 / (6·4))
    means = pd.DataFrame({f"S{i}": [0.9 - i / 100, 0.8, 0.7] for i in range(4)},
                         index=["best", "middle", "worst"])
    test = stats.rank_test(means)
    assert test.ranks.to_dict() == {"best": 1.0, "middle": 2.0, "worst": 3.0}
    assert test.statistic == pytest.approx(8.0) and test.p == pytest.approx(math.exp(-4))
    assert test.cd == pytest.approx(2.343 * math.sqrt(12 / 24), abs=2e-3)
    assert stats.rank_test(means.iloc[:2]) is None  # two methods: no Friedman test
    assert stats.rank_test(means[["S0"]]) is None  # one setting: no ranks across settings


# ---- guards ----------------------------------------------------------------------------------


def test_identical_results_are_flagged_both_ways_and_only_them():
    base = _base()
    values = pd.concat([
        _values("S", {"fedavg": base, "pacfl": base + _alternating() / 10, "local": base + 0.01}),
        _values("T", {"fedavg": base, "local": base}).query("seed == 0 or entry == 'fedavg'"),
    ])
    flags = guards.identical(values).set_index(["setting", "entry"])["flag"]
    assert flags[("S", "pacfl")].startswith("identical to fedavg")
    assert flags[("S", "fedavg")].startswith("identical to pacfl")
    assert ("S", "local") not in flags.index
    # only seed 0 shared: identical on every shared seed
    assert f"(1 seeds × {CLIENTS} clients)" in flags[("T", "local")]


def test_different_clients_or_seed_level_values_are_never_identical():
    base = _base()
    values = _values("S", {"a": base, "b": base})
    fewer = values[~((values["entry"] == "b") & (values["client_id"] == 0))]
    assert guards.identical(fewer).empty
    assert guards.identical(values.assign(client_id=stats.SEED_LEVEL)).empty


def _trials(*specs) -> pd.DataFrame:
    return pd.DataFrame([{"trial_id": t, "setting": "S", "entry": e, "method": m, **extra}
                         for t, e, m, extra in specs])


def test_collapse_diagnostics_name_the_parameter_to_look_at():
    trials = _trials(("p0", "pacfl", "pacfl", {"method.params.threshold": 3.2}),
                     ("p1", "pacfl", "pacfl", {"method.params.threshold": 3.2}),
                     ("i0", "ifca", "ifca", {}), ("a0", "fedamp", "fedamp", {}),
                     ("h0", "hdcfl", "hdcfl", {}), ("f0", "fedsoft", "fedsoft", {}),
                     ("h1", "hdcfl(groups=1)", "hdcfl", {"method.params.groups": 1}),
                     ("s0", "spcacw", "spcacw", {}), ("n0", "spcacw_noreg", "spcacw_noreg", {}))
    rounds = pd.DataFrame([
        {"trial_id": "p0", "clusters": 1.0}, {"trial_id": "p0", "clusters": 1.0},
        {"trial_id": "p1", "clusters": 1.0},
        {"trial_id": "i0", "clusters_chosen": 1.0}, {"trial_id": "i0", "clusters_chosen": 2.0},
        {"trial_id": "a0", "xi_self_mean": 0.995}, {"trial_id": "a0", "xi_self_mean": 0.999},
        {"trial_id": "h0", "groups_used": 1.0}, {"trial_id": "h0"},  # a round without refresh
        {"trial_id": "h0", "groups_used": 1.0}, {"trial_id": "h1", "groups_used": 1.0},
    ])
    alpha = pd.DataFrame([
        {"trial_id": t, "target": target, "peer": peer, "alpha": weight}
        for t, own in (("s0", 1.0), ("n0", 0.5)) for target in range(2) for peer in range(2)
        for weight in [own if peer == target else 1 - own]])
    flags = guards.collapsed(trials, rounds, alpha).set_index("entry")["flag"]
    assert set(flags.index) == {"pacfl", "fedamp", "hdcfl", "spcacw"}
    assert "PACFL ran as FedAvg (2 of 2 seeds)" in flags["pacfl"]
    assert flags["pacfl"].endswith("look at method.params.threshold (3.2) / "
                                   "method.params.threshold_scale (its default)")
    assert "FedAMP ran as local training" in flags["fedamp"]
    assert "method.params.sigma (its default)" in flags["fedamp"]
    assert "method.params.groups (its default) / method.params.temperature" in flags["hdcfl"]
    assert "α = e_t" in flags["spcacw"] and "method.params.gamma" in flags["spcacw"]
    # ifca chose two clusters once; fedsoft logged nothing; spcacw_noreg mixes its α; hdcfl with
    # one group asked for one group (the one-prototype ablation)
    assert guards.collapsed(trials, pd.DataFrame(), None).empty  # columns absent: no flag


def test_standin_settings_are_marked_and_absent_origin_is_tolerated():
    trials = pd.DataFrame({"data_origin": ["real", "standin", "real", None]})
    settings = pd.Series(["A", "B", "B", "C"])
    assert guards.mark_standin(trials, settings).tolist() == [
        "A", "B" + guards.STANDIN_MARK, "B" + guards.STANDIN_MARK, "C"]
    assert guards.mark_standin(trials.drop(columns="data_origin"), settings).tolist() == [
        "A", "B", "B", "C"]
    banner = guards.standin_banner(["B" + guards.STANDIN_MARK])
    assert banner.startswith("WARNING: stand-in data. B ran on stand-in data")


def test_the_smallest_p_a_signed_rank_test_can_give_on_its_pairs():
    """Exact test, n pairs of distinct sizes: every pair on the tested side gives one-sided
    p = 2**-n whatever the signs observed; with ties or zeros the normal approximation runs,
    and its bound is that of the same magnitudes all on one side."""
    for n in (5, 6, 8):
        d = np.arange(1, n + 1) / 100 * np.where(np.arange(n) % 2, 1, -1)
        result = stats.one_sided(d, 0.0, "greater")
        assert result.method == "exact" and result.p_min == pytest.approx(2.0 ** -n)
        assert result.p > result.p_min
    tied = np.array([0.01, 0.01, 0.0, -0.02, 0.03, 0.01])
    result = stats.one_sided(tied, 0.0, "less")
    assert result.method == "asymptotic"
    assert result.p_min == pytest.approx(stats.one_sided(-np.abs(tied), 0.0, "less").p)
    # a shift moves the test: d − 0.05 is below zero for every pair
    assert stats.one_sided(np.arange(1, 7) / 100, 0.07, "less").p == pytest.approx(2.0 ** -6)


def test_holm_multiplies_the_smallest_p_by_the_family_size_and_keeps_the_order():
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert stats.holm([0.2]) == [0.2] and stats.holm([]) == []
