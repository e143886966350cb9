from types import SimpleNamespace

from raylf import results
from raylf.sweep.leaderboard import leaderboard, render


def trial_row(tid, method, dataset, acc, seed=0):
    return {"trial_id": tid, "method": method, "dataset": dataset, "scenario": "label_subset",
            "model": "mlp", "seed": seed, "status": "ok", "acc_mean": acc}


def test_methods_on_different_data_are_ranked_only_within_their_setting(tmp_path):
    rows = [trial_row("a0", "fedavg", "digits", 0.70), trial_row("a1", "fedavg", "digits", 0.72, 1),
            trial_row("b0", "local", "digits", 0.80),
            # a second deployable's column (HDC-FL's shared encoder) does not rank the row
            trial_row("d0", "hdcfl", "digits", 0.81) | {"acc_mean_shared": 0.60},
            {**trial_row("c0", "fmtsvm", "digits_multitask", None), "acc_mean_binary": 0.9,
             "acc_mean_binary_own_heads": 0.1}]
    for row in rows:
        results.write_trial(tmp_path, row["trial_id"], {"trials": [row]}, {})
    trials = [SimpleNamespace(trial_id=r["trial_id"], point={}) for r in rows]
    board = leaderboard(str(tmp_path), trials)
    assert board["setting"].tolist() == ["digits · label_subset · mlp"] * 3 + [
        "digits_multitask · label_subset · mlp"]
    assert board["method"].tolist() == ["hdcfl", "local", "fedavg", "fmtsvm"]
    assert board.loc[2, "seeds"] == 2
    text = render(board)
    assert "ranked within each setting" in text
    first, second = text.split("setting: digits_multitask")
    assert "| 1 | hdcfl" in first and "| 2 | local" in first and "| 3 | fedavg" in first
    # alone in its setting: not ranked at all (not third behind the digits methods, nor first)
    assert "| - | fmtsvm" in second and "alone in its setting" in second


def test_a_method_listed_twice_with_other_parameters_gets_a_row_each(tmp_path):
    """Per-FedAvg's two variants, each its own entry of the sweep (no grid): two rows named by
    the parameter that tells them apart, not one row of both."""
    rows = [trial_row(f"{variant}{seed}", "perfedavg", "digits", acc, seed)
            | {"method.params.variant": variant, "method.params.alpha": 0.03}
            for variant, acc in (("fo", 0.9), ("hf", 0.8)) for seed in (0, 1)]
    for row in rows:
        results.write_trial(tmp_path, row["trial_id"], {"trials": [row]}, {})
    trials = [SimpleNamespace(trial_id=r["trial_id"], point={}) for r in rows]
    board = leaderboard(str(tmp_path), trials)
    assert board["entry"].tolist() == ["perfedavg [variant=fo]", "perfedavg [variant=hf]"]
    assert board["seeds"].tolist() == [2, 2]


def test_a_grid_over_whole_scenarios_names_each_by_its_setting_not_its_point(tmp_path):
    rows = [trial_row("p0", "fedavg", "digits", 0.9) | {"scenario.k": 2},
            trial_row("d0", "fedavg", "digits", 0.8) | {"scenario": "dirichlet",
                                                         "scenario.alpha": 0.1}]
    for row in rows:
        results.write_trial(tmp_path, row["trial_id"], {"trials": [row]}, {})
    points = {"p0": {"scenario": {"name": "label_subset", "k": 2}},
              "d0": {"scenario": {"name": "dirichlet", "alpha": 0.1}}}
    trials = [SimpleNamespace(trial_id=t, point=p) for t, p in points.items()]
    board = leaderboard(str(tmp_path), trials)
    assert dict(zip(board["setting"], board["entry"])) == {
        "digits · label_subset · mlp": "fedavg", "digits · dirichlet · mlp": "fedavg"}
