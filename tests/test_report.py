"""``raylf.report``: the papers' tables, marks, figures and renderers, on a synthetic sweep with
known numbers and on a tiny real one; the tables read alike by pandas, polars and duckdb."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pandas as pd
import polars as pl
import pyarrow.parquet as pq
import pytest

from raylf import report, results
from raylf.config import load_spec
from raylf.experiment import run_experiment
from raylf.report import render, tables
from raylf.report.__main__ import main

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
    assert main([str(tmp_path)]) == 1
    assert "no trials" in capsys.readouterr().err


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
