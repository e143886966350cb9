"""``raylf.report``: the papers' tables, marks, figures and renderers, on a synthetic sweep with
known numbers and on a tiny real one; the tables read alike by pandas, polars and duckdb, and so
do the compacted ones. Ties from the paired test, ranks only over shared settings, the
degenerate-result guard and the stand-in banner in the report and the console leaderboard, on
constructed sweeps and on a real PACFL run that merged every client."""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import duckdb
import numpy as np
import pandas as pd
import polars as pl
import pyarrow.parquet as pq
import pytest

from raylf import report, results
from raylf.config import load_spec
from raylf.experiment import run_experiment
from raylf.methods import METHODS
from raylf.report import figures, render, tables
from raylf.report.__main__ import main
from raylf.sweep.leaderboard import leaderboard
from raylf.sweep.leaderboard import render as render_board

EXAMPLES = Path(__file__).resolve().parents[1] / "tune" / "examples"
PNG = b"\x89PNG\r\n\x1a\n"

# final acc_mean per (method, k) over seeds 0, 1, 2
FINAL = {("fedavg", 2): [0.70, 0.72, 0.74], ("hdcfl", 2): [0.80, 0.82, 0.84],
         ("fedavg", 3): [0.60, 0.62, 0.64], ("hdcfl", 3): [0.65, 0.66, 0.67]}


def _synthetic_trial(root: str, method: str, k: int, seed: int, final: float,
                     status: str = "ok") -> None:
    """Four rounds, evaluated at 2 and 4; validation prefers round 2, whose test accuracy is
    0.1 lower than the final one."""
    trial_id = f"syn-{method}-k{k}-s{seed}"
    trial = {"trial_id": trial_id, "sweep": "syn", "name": "syn", "method": method,
             "dataset": "digits", "scenario": "label_subset", "model": "mlp", "seed": seed,
             "status": status, "error": None if status == "ok" else "Traceback\nValueError: boom",
             "diverged_round": 3 if status == "diverged" else None, "rounds": 4,
             "bytes_up": 4000, "bytes_down": 8000, "acc_mean": final,
             "acc_worst": final - 0.2, "acc_bottom20": final - 0.1, "acc_gap": 0.3,
             "scenario.k": k, "method.name": method, "federation.rounds": 4}
    rounds = []
    for rnd in range(1, 5):
        row = {"trial_id": trial_id, "round": rnd, "participants": 5, "bytes_up": 1000,
               "bytes_down": 2000, "loss": 1.0 / rnd}
        if rnd % 2 == 0:
            row |= {"acc_mean": final - (0.1 if rnd == 2 else 0.0),
                    "val_acc_mean": 0.9 if rnd == 2 else 0.5}
        if method == "hdcfl" and rnd % 2 == 0:
            row |= {"silhouette": 0.3 * rnd / 2, "ari_latent": 0.5 * rnd / 2,
                    "membership_entropy": 1.0 / rnd}
        rounds.append(row)
    clients = [{"trial_id": trial_id, "round": 4, "client_id": c, "group": c % 2, "n_train": 50,
                "split": "test", "deployable": "main", "task": "main", "n_test": 10,
                "correct": int(10 * final), "accuracy": final + 0.02 * (c - 2), "loss": 1.0}
               for c in range(5)]
    tables_ = {"trials": [trial], "rounds": rounds, "clients": clients}
    if method == "hdcfl":
        tables_["alpha"] = [{"trial_id": trial_id, "round": rnd, "target": 0, "peer": p,
                             "alpha": 1.0 / n if p < n else 0.0, "update": rnd}
                            for rnd, n in ((1, 4), (4, 2)) for p in range(4)]
    results.write_trial(root, trial_id, tables_, {"name": "syn"})


def make_synthetic_sweep(root: str | Path) -> str:
    """Known numbers, a failed and a diverged trial (whose accuracies must not count), and
    grouping diagnostics and α rows on hdcfl's trials."""
    root = str(root)
    for (method, k), finals in FINAL.items():
        for seed, final in enumerate(finals):
            _synthetic_trial(root, method, k, seed, final)
    _synthetic_trial(root, "hdcfl", 2, 3, 0.99, status="failed")
    _synthetic_trial(root, "fedavg", 3, 3, 0.01, status="diverged")
    return root


LABEL_SKEW = [str(EXAMPLES / "digits_label_skew.yaml"), "federation.num_clients=6",
              "federation.rounds=2", "eval_every=1", "scenario.val_fraction=0.2"]
MULTITASK = [str(EXAMPLES / "digits_multitask_fmtsvm.yaml"), "federation.rounds=2",
             "federation.batch_size=128", "method.params.reduction=mean",
             "federation.local_epochs=1", "federation.optimizer.lr=0.01"]  # cheap and DP-stable
TINY_RUNS = [
    *[[*LABEL_SKEW, f"method.name={m}", f"scenario.k={k}", f"seed={s}"]
      for m in ("fedavg", "fedavg_se") for k in (2, 3) for s in (0, 1)],
    [*LABEL_SKEW, "method.name=fedavg", "federation.divergence_loss=0.01", "seed=2"],
    MULTITASK,
    [*MULTITASK, "method.params.dp.epsilon=1.0"],
]


def make_tiny_sweep(root: Path) -> str:
    """A real sweep's tables in seconds: in-process experiments (two settings, two methods,
    two seeds, one diverging trial, FMT-SVM with and without DP). Built once per session."""
    if not (root / "tables" / "trials").exists():
        for path, *overrides in TINY_RUNS:
            run_experiment(load_spec(path, overrides), backend="local", out=str(root))
    return str(root)


@pytest.fixture(scope="session")
def tiny_sweep(tmp_path_factory) -> str:
    return make_tiny_sweep(tmp_path_factory.getbasetemp() / "tiny-sweep")


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> report.Sweep:
    return report.load(make_synthetic_sweep(tmp_path_factory.mktemp("synthetic")))


@pytest.fixture(scope="module")
def synthetic_report(synthetic) -> report.Report:
    return report.build(synthetic)


def _cells(table: tables.Table, label: str = "Method") -> pd.DataFrame:
    return table.cells.set_index(label)


def _marks(table: tables.Table, label: str = "Method") -> pd.DataFrame:
    return table.marks.set_index(table.cells[label])


def test_main_table_mean_std_rank_and_marks(synthetic):
    table = tables.main_table(synthetic)
    cells, marks = _cells(table), _marks(table)
    k2, k3 = "digits · label_subset · mlp (k=2)", "digits · label_subset · mlp (k=3)"
    assert list(cells.columns) == [k2, k3, "Avg. rank ↓"]
    # the failed seed (0.99) is left out; the dagger says a seed is missing
    assert cells.at["hdcfl", k2] == "82.00 ± 2.00†"
    assert cells.at["fedavg", k2] == "72.00 ± 2.00"
    assert cells.at["hdcfl", k3] == "66.00 ± 1.00"
    assert cells.at["fedavg", k3] == "62.00 ± 2.00†"
    assert "†: some seeds did not finish" in table.note
    assert list(cells.index) == ["hdcfl", "fedavg"]
    assert cells["Avg. rank ↓"].tolist() == ["1.00", "2.00"]
    assert marks.at["hdcfl", k2] == "best" and marks.at["fedavg", k2] == "second"


def test_unfinished_trials_have_their_own_section(synthetic):
    listed = tables.unfinished(synthetic).cells
    assert sorted(listed["Status"]) == ["diverged", "failed"]
    assert set(listed["Error"]) == {"ValueError: boom"}
    assert listed.set_index("Status").at["diverged", "Round"] == "3"
    counts = tables.statuses(synthetic).cells
    assert counts["failed"].astype(int).sum() == 1 and counts["ok"].astype(int).sum() == 12


def test_tail_table_is_macro_averaged_with_a_tail_rank(synthetic):
    cells = _cells(tables.tail_tables(synthetic)[0])
    # hdcfl: (82 + 66) / 2 mean, worst 20 points lower; fedavg (72 + 62) / 2
    assert cells.at["hdcfl", "Mean"] == "74.00" and cells.at["hdcfl", "Worst"] == "54.00"
    assert cells.at["fedavg", "Bot.20%"] == "57.00"
    # gap ties (0.3 everywhere): tail rank = mean of worst rank 1, bottom20 rank 1, gap rank 1.5
    assert cells.at["hdcfl", "Tail rank ↓"] == "1.17"
    assert len(tables.tail_tables(synthetic)) == 4  # + worst, bottom-20 %, gap per setting


def test_leaderboard_selects_the_round_on_validation_and_labels_test_selection(synthetic):
    table = tables.leaderboard(synthetic)
    assert "validation-selected" in table.title
    first = table.cells.iloc[0]
    assert first["Method"] == "hdcfl" and first["Setting"].endswith("(k=2)")
    assert first["Test acc at val-selected round"] == "72.00 ± 2.00"  # round 2: final − 10
    assert first["Selected round"] == "2.0"
    assert first["Max over rounds (test-selected)"] == "82.00 ± 2.00"
    assert "test-selected" in tables.max_over_rounds(synthetic).cells.columns[2]


def test_a_table_appears_as_soon_as_its_columns_exist(synthetic, synthetic_report, tiny_sweep):
    titles = [s.title for s in synthetic_report.sections]
    assert "Grouping diagnostics" in titles and "Collaboration weights" in titles
    assert "Tasks" not in titles and "Differential privacy" not in titles
    support = tables.alpha_table(synthetic).cells
    assert support["Method"].tolist() == ["hdcfl", "hdcfl"]  # one row per setting
    assert set(support["α support, first update"]) == {"4.00 ± 0.00"}
    assert set(support["α support, last update"]) == {"2.00 ± 0.00"}
    real = [s.title for s in report.build(report.load(tiny_sweep)).sections]
    assert "Tasks" in real and "Differential privacy" in real
    assert "Grouping diagnostics" not in real and "Collaboration weights" not in real


def test_renderers_mark_best_and_second(synthetic_report):
    built = synthetic_report
    markdown = render.markdown(built)
    assert "| hdcfl | **82.00 ± 2.00†** | **66.00 ± 1.00** | **1.00** |" in markdown
    assert "<u>72.00 ± 2.00</u>" in markdown
    assert "![" in markdown and "figures/grouping_diagnostics.png" in markdown
    page = render.html_page(built)
    assert "<b>82.00 ± 2.00†</b>" in page and "<u>72.00 ± 2.00</u>" in page
    assert page.count("data:image/png;base64,") == len(
        [p for s in built.sections for p in s.plots])
    latex = render.latex(built)
    assert r"\textbf{82.00 $\pm$ 2.00$^\dagger$}" in latex
    assert r"\underline{72.00 $\pm$ 2.00}" in latex and r"\_" not in latex.split("\n")[0]


def test_cli_reads_and_writes_through_a_filesystem_uri(tmp_path, capsys):
    root = make_synthetic_sweep(tmp_path / "sweep")
    out = tmp_path / "out"
    assert main([f"file://{root}", "--out", f"file://{out}", "--format", "html"]) == 0
    printed = capsys.readouterr().out
    assert f"report: file://{out}/report.html" in printed
    page = (out / "report.html").read_text()
    assert "Failed, diverged and timed-out trials" in page and "<img" in page
    assert all(p.read_bytes().startswith(PNG) for p in (out / "figures").glob("*.png"))
    assert {p.name for p in (out / "figures").glob("*.png")} >= {
        "learning_curves.png", "client_distributions.png", "grouping_diagnostics.png",
        "bytes_per_round.png", "alpha_support.png"}
    assert main([root]) == 0
    assert "| hdcfl | **82.00 ± 2.00†**" in capsys.readouterr().out
    assert (Path(root) / "report" / "report.md").exists()


def test_cli_fails_cleanly_without_trials(tmp_path, capsys):
    """A folder holding no sweep is the user's mistake: exit 2, one message, no traceback."""
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no trials" in err and "Traceback" not in err
    assert main([str(tmp_path / "not-there")]) == 2


def test_real_sweep_per_task_privacy_and_unfinished(tiny_sweep):
    sweep = report.load(tiny_sweep)
    per_task = tables.per_task(sweep).cells
    assert set(per_task["Deployable"]) == {"global_heads", "own_heads"}
    assert {"binary acc", "binary AUC", "multiclass acc", "multiclass AUC"} <= set(per_task)
    assert (per_task["KB up / client / round"].astype(float) > 0).all()
    dp = tables.privacy(sweep).cells.set_index("ε per round")
    assert set(dp.index) == {"∞ (no DP)", "1.00"}
    assert float(dp.at["1.00", "ε composed (all rounds)"]) > float(
        dp.at["1.00", "ε achieved / round"])
    assert tables.unfinished(sweep).cells["Status"].tolist() == ["diverged"]
    assert "validation-selected" in tables.leaderboard(sweep).title
    assert tables.main_table(sweep).cells.shape == (4, 5)  # 4 configurations; 3 settings, rank


def _with_columns(folder: Path) -> list[str]:
    """The files duckdb can read: a trial with no rows for a table (a diverged trial's clients)
    writes a file without columns, which duckdb refuses; it holds no rows to count."""
    files = sorted(folder.glob("*.parquet"))
    readable = [str(f) for f in files if pq.read_schema(f).names]
    assert all(pq.read_metadata(f).num_rows == 0 for f in files if str(f) not in readable)
    return readable


def test_tables_read_alike_by_pandas_polars_and_duckdb(tiny_sweep):
    loaded = results.load(tiny_sweep)
    for name in ("trials", "rounds", "clients"):
        folder = Path(tiny_sweep) / "tables" / name
        frame = pl.concat([pl.read_parquet(f) for f in sorted(folder.glob("*.parquet"))],
                          how="diagonal_relaxed")
        files = _with_columns(folder)
        count = duckdb.sql("select count(*) from read_parquet($files, union_by_name=true)",
                           params={"files": files}).fetchall()[0][0]
        assert len(frame) == len(loaded[name]) == count
        if name == "trials":
            duckdb_mean = duckdb.sql(
                "select avg(acc_mean) from read_parquet($files, union_by_name=true)",
                params={"files": files}).fetchall()[0][0]
            pandas_mean = loaded[name]["acc_mean"].mean()
            assert pandas_mean == pytest.approx(frame["acc_mean"].mean())
            assert pandas_mean == pytest.approx(duckdb_mean)
            assert 0 < pandas_mean < 1


# ---- paired statistics, shared ranks, degenerate results, stand-in data ------------------------

CLIENTS = 6
STEP = 1 / 64  # accuracies on a dyadic grid: every difference below is exact


def _judged_trial(root: str, method: str, seed: int, accuracy: np.ndarray, k: int = 2,
                  origin: str | None = None, params: dict | None = None,
                  diagnostics: dict | None = None) -> None:
    """An ok trial with the given per-client final accuracies (two rounds)."""
    trial_id = f"j-{method}-k{k}-s{seed}"
    lowest = np.sort(accuracy)[: math.ceil(0.2 * len(accuracy))]
    trial = {"trial_id": trial_id, "sweep": "j", "name": "j", "method": method,
             "dataset": "digits", "scenario": "label_subset", "model": "mlp", "seed": seed,
             "status": "ok", "rounds": 2, "bytes_up": 200, "bytes_down": 200,
             "acc_mean": float(accuracy.mean()),
             "acc_worst": float(accuracy.min()), "acc_bottom20": float(lowest.mean()),
             "acc_gap": float(accuracy.max() - accuracy.min()), "scenario.k": k,
             "method.name": method, "proposed_in": METHODS.get(method).proposed_in,
             **(params or {}),
             **({"data_origin": origin} if origin else {})}
    rounds = [{"trial_id": trial_id, "round": r, "participants": 3, "bytes_up": 100,
               "bytes_down": 100, "loss": 1.0, **(diagnostics or {}),
               **({"acc_mean": float(accuracy.mean())} if r == 2 else {})} for r in (1, 2)]
    clients = [{"trial_id": trial_id, "round": 2, "client_id": c, "group": 0, "n_train": 40,
                "split": "test", "deployable": "main", "task": "main", "n_test": 64,
                "correct": int(64 * a), "accuracy": float(a), "loss": 1.0}
               for c, a in enumerate(accuracy)]
    results.write_trial(root, trial_id, {"trials": [trial], "rounds": rounds,
                                         "clients": clients}, {"name": "j"})


def _accuracies(seeds: int) -> np.ndarray:
    return np.random.default_rng(0).integers(20, 50, (seeds, CLIENTS)) * STEP


def make_ranked_sweep(root: Path) -> str:
    """k = 2 and 3: hdcfl 4 steps above fedavg on every seed and client, local ± 1 step around
    hdcfl (alternating over clients: tied); k = 4: fmtsvm alone. k = 3 ran on stand-in data."""
    root = str(root)
    base = _accuracies(3)
    wobble = STEP * np.where(np.arange(CLIENTS) % 2, 1.0, -1.0)
    for k in (2, 3):
        origin = "standin" if k == 3 else "real"
        for seed in range(3):
            hdcfl = base[seed] + 4 * STEP
            for method, accuracy in (("fedavg", base[seed]), ("hdcfl", hdcfl),
                                     ("local", hdcfl + wobble)):
                _judged_trial(root, method, seed, accuracy, k, origin)
    for seed in range(3):
        _judged_trial(root, "fmtsvm", seed, base[seed], 4, "real")
    return root


def make_degenerate_sweep(root: Path) -> str:
    """pacfl with the per-client accuracies of fedavg and one cluster on every round; local
    distinct."""
    root = str(root)
    base = _accuracies(2)
    for seed in range(2):
        _judged_trial(root, "fedavg", seed, base[seed])
        _judged_trial(root, "pacfl", seed, base[seed], params={"method.params.threshold": 3.2},
                      diagnostics={"clusters": 1.0})
        _judged_trial(root, "local", seed, base[seed] + 2 * STEP)
    return root


def _board(root: str) -> pd.DataFrame:
    """The console leaderboard over every trial under ``root``; a method's parameters set away
    from their defaults are its grid point (the trials row records every one, resolved)."""
    trials = results.load(root)["trials"]
    params = [c for c in trials if c.startswith("method.params.")]

    def point(row) -> dict:
        defaults = METHODS.get(row["method"]).Params().model_dump(mode="json")
        return {c: row[c] for c in params if pd.notna(row[c])
                and row[c] != defaults.get(c.removeprefix("method.params."))}
    return leaderboard(root, [SimpleNamespace(trial_id=row["trial_id"], point=point(row))
                              for _, row in trials.iterrows()])


@pytest.fixture(scope="module")
def ranked(tmp_path_factory) -> report.Sweep:
    return report.load(make_ranked_sweep(tmp_path_factory.mktemp("ranked")))


def test_the_report_opens_with_the_claims_the_sweep_can_decide(ranked):
    """hdcfl runs beside fedavg and local: its paper's claims are decided on the real setting
    (k = 2; k = 3 is stand-in data), and open the report, as exploratory results (digits lie
    outside the paper's CIFAR scope). fmtsvm is alone at k = 4: nothing of its paper can be
    decided, so no row of it."""
    first = report.build(ranked).sections[0]
    assert first.title == "Claims"
    cells = first.tables[0].cells.set_index("Claim")
    assert set(cells["Paper"]) == {"hdcfl"}
    assert set(cells["Decided on"]) == {f"mean over {ranked.settings[0]}"}
    assert cells["Scope"].str.startswith("exploratory: outside the paper's scope").all()
    # local is hdcfl ± 1.56 points, alternating over clients: the mean ties, but ahead on the
    # worst client means nothing unless numerically ahead
    worst = cells.loc["HDC-FL has the highest macro-averaged worst-client accuracy"]
    assert worst["Verdict"] == "does not hold" and "is behind local" in worst["Numbers"]
    # half the pairs lie more than the 1-point margin below: not shown, either way
    competitive = cells.loc[
        "HDC-FL is competitive with the strongest method in macro-averaged mean accuracy"]
    assert competitive["Verdict"] == "not shown"
    assert "18 pairs" in competitive["Numbers"]


def test_ties_come_from_the_paired_test_and_a_method_alone_is_not_ranked(ranked):
    table = tables.main_table(ranked)
    cells, marks = _cells(table), _marks(table)
    k2, k3, k4 = (s for s in ranked.settings)
    assert k3.endswith("(k=3) [STAND-IN DATA]") and k4.endswith("(k=4)")
    # hdcfl and local tie on the paired test: both bold; fedavg, 4 steps below, underlined
    assert marks.at["hdcfl", k2] == marks.at["local", k2] == "best"
    assert marks.at["fedavg", k2] == "second" and marks.at["fedavg", k3] == "second"
    # fmtsvm is alone at k = 4: no mark, no rank; the others rank over k = 2 and 3 only
    assert marks.at["fmtsvm", k4] == "" and cells.at["fmtsvm", "Avg. rank ↓"] == "-"
    assert cells.at["fedavg", "Avg. rank ↓"] == "3.00"
    assert "not ranked (fmtsvm do not share these settings)" in table.note
    paired = tables.paired_statistics(ranked).cells.set_index(["Setting", "Method"])
    assert paired.at[(k2, "local"), "vs best"].startswith("tied: ")
    assert paired.at[(k2, "fedavg"), "vs best: Δ [95 % CI]"] == "-6.25 [-6.25, -6.25]"
    assert paired.at[(k2, "fedavg"), "vs best: Wilcoxon"].endswith("(18 pairs)")
    assert paired.at[(k2, "fedavg"), "vs paper's method"] == "hdcfl"
    assert k4 not in set(paired.index.get_level_values("Setting"))  # nothing to compare
    tail = tables.tail_tables(ranked)[0]
    assert list(tail.cells["Method"]) == ["hdcfl", "local", "fedavg"] or \
        list(tail.cells["Method"]) == ["local", "hdcfl", "fedavg"]
    assert "not shown: fmtsvm" in tail.note


@pytest.fixture(scope="module")
def ranked_report(ranked) -> report.Report:
    return report.build(ranked)


def test_critical_difference_figure_with_two_settings_sharing_three_methods(ranked_report,
                                                                            tmp_path):
    section = next(s for s in ranked_report.sections if s.title.startswith("Paired statistics"))
    assert [p.name for p in section.plots] == ["critical_difference"]
    assert section.plots[0].png.startswith(PNG)
    assert "Friedman's test: χ² = 4.00" in section.text  # fedavg last in both settings
    # one setting shared by three methods: no Friedman test, no figure, and the report says so
    few = report.load(make_degenerate_sweep(tmp_path / "few"))
    assert figures.critical_difference(few) is None
    assert "1 setting(s) × 3 configuration(s)" in tables.rank_summary(few)


def test_standin_settings_get_a_banner_and_a_mark(ranked, ranked_report):
    built = ranked_report
    assert len(built.banner) == 1 and "(k=3) ran on stand-in data" in built.banner[0]
    markdown = render.markdown(built)
    assert markdown.index("> **WARNING: stand-in data.") < markdown.index("## Accuracy")
    assert "(k=3) [STAND-IN DATA] |" in markdown  # the main table's column
    assert "class='banner'>WARNING: stand-in data." in render.html_page(built)
    assert r"\fbox{\parbox{\linewidth}{\textbf{WARNING: stand-in data." in render.latex(built)
    text = render_board(_board(ranked.root))
    assert text.startswith("WARNING: stand-in data.")
    assert "setting: digits · label_subset · mlp (k=3) [STAND-IN DATA]" in text
    assert "setting: digits · label_subset · mlp (k=2)\n" in text


def test_console_leaderboard_marks_ties_and_does_not_rank_a_lone_method(ranked):
    board = _board(ranked.root)
    k2 = board[board["setting"].str.endswith("(k=2)")].set_index("entry")
    assert k2.at["local", "tied"] and not k2.at["fedavg", "tied"]
    assert k2.at["fedavg", "best_delta"] == pytest.approx(-4 * STEP)
    assert k2.at["fedavg", "best_pairs"] == 18 and k2.at["fedavg", "paper"] == "hdcfl"
    text = render_board(board)
    assert "| vs best | vs hdcfl |" in text
    assert "| - | fmtsvm | - |" in text and "- (alone in its setting)" in text
    assert "tied: " in text and "degenerate" not in text
    # the board is written as a table by the sweep: every column converts to Arrow
    results.to_table(board.to_dict("records"), {})


def test_console_leaderboard_ranks_nothing_against_trials_that_all_failed(tmp_path):
    """A method whose rival has no finished trial is alone: no rank; a sweep whose every trial
    failed still prints its statuses."""
    _judged_trial(str(tmp_path), "local", 0, _accuracies(1)[0])
    failed = {"trial_id": "f0", "sweep": "j", "method": "fedavg", "dataset": "digits",
              "scenario": "label_subset", "model": "mlp", "seed": 0, "status": "failed",
              "scenario.k": 2}
    results.write_trial(str(tmp_path), "f0", {"trials": [failed]}, {})
    text = render_board(_board(str(tmp_path)))
    assert "| - | local |" in text and "| - | fedavg |" in text and "0/0/1/0" in text
    alone = report.load(str(tmp_path))
    main_table, tail = tables.main_table(alone), tables.tail_tables(alone)[0]
    assert list(main_table.cells.columns) == ["Method", "digits · label_subset · mlp"]
    assert "nothing is ranked" in main_table.note and set(main_table.marks.iloc[0]) == {""}
    assert tail.cells["Method"].tolist() == ["local"] and "Tail rank ↓" not in tail.cells
    only_failed = tmp_path / "only-failed"
    results.write_trial(str(only_failed), "f0", {"trials": [failed]}, {})
    assert "| - | fedavg | - | 1 | 0/0/1/0 | - (alone in its setting) |" in render_board(
        _board(str(only_failed)))


def test_degenerate_results_are_flagged_in_the_report_and_the_leaderboard(tmp_path):
    sweep = report.load(make_degenerate_sweep(tmp_path / "sweep"))
    flags = _cells(tables.checks(sweep))["Flag"]
    assert flags["pacfl"].startswith("identical to fedavg: ")
    assert "PACFL ran as FedAvg (2 of 2 seeds); look at method.params.threshold (3.2)" in \
        flags["pacfl"]
    assert flags["fedavg"].startswith("identical to pacfl") and "local" not in flags
    main_table = tables.main_table(sweep)
    main_cells = _cells(main_table)
    assert main_cells.iloc[:, 0].str.endswith("‡").tolist() == [
        m != "local" for m in main_cells.index]
    assert r"$^\ddagger$" in render.latex_table(main_table)
    text = render_board(_board(sweep.root))
    assert "  ! pacfl [threshold=3.2]: identical to fedavg: " in text
    assert "  ! local" not in text


def test_nothing_degenerate_no_flag(synthetic, synthetic_report, tiny_sweep):
    assert synthetic.flags().empty and synthetic_report.banner == []
    assert "Checks" not in [s.title for s in synthetic_report.sections]
    real = report.load(tiny_sweep)
    assert real.flags().empty and real.standin == []
    assert "degenerate" not in render_board(_board(tiny_sweep))


def _copy_trials(source: str, target: Path, keep) -> None:
    """The files of the trials ``keep`` selects (a row of the trials table), every table."""
    trials = results.load(source)["trials"]
    for trial_id in trials.loc[trials.apply(keep, axis=1), "trial_id"]:
        for file in Path(source, "tables").glob(f"*/{trial_id}.parquet"):
            (target / "tables" / file.parent.name).mkdir(parents=True, exist_ok=True)
            shutil.copy(file, target / "tables" / file.parent.name / file.name)


def test_real_pacfl_that_merged_every_client_reads_identical_to_fedavg(tiny_sweep, tmp_path):
    """The acceptance run: PACFL with a threshold above every subspace angle (forced: 3.2 rad,
    absolute, above the largest possible principal angle π/2) next to the tiny sweep's own
    fedavg trials of the same setting and seeds."""
    _copy_trials(tiny_sweep, tmp_path, lambda row: row["method"] == "fedavg"
                 and row["scenario.k"] == 2 and row["status"] == "ok")
    for seed in (0, 1):
        run_experiment(load_spec(LABEL_SKEW[0], [*LABEL_SKEW[1:], "method.name=pacfl",
                                                 "method.params.threshold=3.2",
                                                 "method.params.threshold_scale=absolute",
                                                 "scenario.k=2", f"seed={seed}"]),
                       backend="local", out=str(tmp_path))
    built = report.build(report.load(str(tmp_path)))
    assert built.sections[0].title == "Checks"
    assert built.banner == ["2 degenerate result(s) flagged: see Checks (marked ‡ in the tables)."]
    assert "| pacfl | identical to fedavg: the same per-client final test accuracy on every " \
        "shared seed (2 seeds × 6 clients); collapsed: one cluster" in render.markdown(built)
    text = render_board(_board(str(tmp_path)))
    assert "  ! pacfl [threshold=3.2, threshold_scale=absolute]: identical to fedavg: " in text


def test_compacted_tables_read_unchanged_by_pandas_polars_and_duckdb(tiny_sweep, tmp_path):
    root = tmp_path / "sweep"
    shutil.copytree(Path(tiny_sweep) / "tables", root / "tables")
    written = results.compact(str(root))
    loaded = results.load(root)
    assert set(written) == set(loaded) >= {"trials", "rounds", "clients"}
    assert {n: len(f) for n, f in results.load(root).items()} == {
        n: len(f) for n, f in loaded.items()}  # the per-trial reader reads no row twice
    for name, path in written.items():  # the rows in load's order, each reader as it is
        pd.testing.assert_frame_equal(pd.read_parquet(path), loaded[name])
        polars = pl.read_parquet(path)
        assert polars.columns == list(loaded[name].columns) and polars.height == len(loaded[name])
        assert duckdb.read_parquet(path).columns == list(loaded[name].columns)
        assert duckdb.sql(f"select count(*) from read_parquet('{path}')").fetchall() == [
            (len(loaded[name]),)]
    mean = duckdb.sql(f"select avg(acc_mean) from read_parquet('{written['trials']}')")
    mean = mean.fetchall()[0][0]
    assert mean == pytest.approx(loaded["trials"]["acc_mean"].mean())
    assert pl.read_parquet(written["trials"])["acc_mean"].mean() == pytest.approx(mean)
    assert results.main(["compact", str(tmp_path / "missing")]) == 2


def test_the_report_and_the_leaderboard_stand_on_results_alone():
    """Reading tables needs neither the methods nor torch, Ray or the sweep layer: a fresh
    interpreter importing ``raylf.report`` and ``raylf.sweep.leaderboard`` loads none of them."""
    import subprocess
    import sys

    code = ("import sys, raylf.report, raylf.report.__main__, raylf.sweep.leaderboard; "
            "print(' '.join(sorted(sys.modules)))")
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                check=True).stdout.split())
    for name in ("raylf.methods", "raylf.experiment", "raylf.sweep.spec", "raylf.runtime",
                 "raylf.training", "torch", "ray"):
        assert name not in loaded, f"reading results imports {name}"
