"""``python -m raylf.datasets``: the datasets a spec can name, the download cache, and a look at any
scenario before running it.

    list [--root DIR]                                 every dataset name, where its data come from
                                                      and, for downloads, whether it is cached
                                                      (real or stand-in)
    fetch NAME... [--allow-unverified] [--force]      download, verify and unpack into the cache
    verify NAME... | path NAME                        re-hash a fetched dataset / print its folder
    standin NAME... [--root DIR] [--seed N] [--size S] write format-true stand-ins (random content
                                                      in the real files' layout) to check a spec
                                                      offline; default DIR: <cache root>/standin
    describe                                          the paper presets and their notes
    describe PRESET [--plot FILE] [--seed N]          per-client table (and label-distribution
    describe --spec FILE [--plot FILE]                figure) of a preset or an experiment spec

The cache root is ``--root DIR``, else ``$RAYLF_DATA``, else ``~/.cache/raylf/data``.
Exit codes: 0 ok, 1 dataset missing or broken, 2 invalid spec or usage (a stand-in refused where
real data are included).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from raylf.config import validate
from raylf.data import build_federation, presets, standin
from raylf.data.cache import (
    ENV_VAR,
    REAL,
    STANDIN,
    data_root,
    dataset_origin,
    fetch,
    locate,
    read_marker,
    standin_root,
    verify,
)
from raylf.data.manifest import DatasetError, list_manifests, manifest_names
from raylf.data.sources import SOURCES, load_source
from raylf.errors import SpecError
from raylf.schema import load_raw

# where the data of each source without a manifest come from (the others are downloaded)
_LOCAL_ORIGINS = {
    "digits": "bundled with scikit-learn",
    "digits_multitask": "bundled with scikit-learn (digits, relabelled into two tasks)",
    "digits28": "generated from scikit-learn's digits: 10,000 MNIST-sized 28×28 images by "
                "seeded random affines (dataset.n_samples, dataset.seed)",
    "digits28_multitask": "generated like digits28, relabelled into two tasks",
    "synthetic": "generated from the seed (dataset.seed)",
    "npz": "your own .npz file (dataset.path)",
}

# fields a preset leaves to the experiment; describe only needs the data side
_FILL = {"model": {"name": "mlp"}, "method": {"name": "fedavg"}, "federation": {"rounds": 1}}


def resolve(preset: str | None, spec_file: str | None, root: str | None, seed: int | None):
    """A validated spec for a preset (completed with placeholders) or a spec file."""
    if spec_file is not None:
        raw = load_raw(spec_file)
    elif preset not in presets.PRESETS:
        raise SpecError([("preset", f"unknown preset {preset!r}; allowed: "
                                    f"{', '.join(presets.names())}")])
    else:
        raw = presets.merge_under(_FILL, presets.get(preset))
    dataset = raw.get("dataset") if isinstance(raw, dict) else None
    if root is not None and isinstance(dataset, dict) and dataset.get("name") in SOURCES and \
            "root" in SOURCES.get(dataset["name"]).Params.model_fields:
        dataset["root"] = root
    if seed is not None:
        raw["seed"] = seed
    return validate(raw, spec_file)


def client_table(fed, y: np.ndarray) -> list[dict[str, Any]]:
    """One row per client: sizes, group and the label counts (as the client sees labels)."""
    rows = []
    for k in range(fed.num_clients):
        seen = [y[idx] if fed.label_maps is None else fed.label_maps[k][y[idx]]
                for idx in (fed.train[k], fed.test[k])]
        counts = np.bincount(np.concatenate(seen), minlength=fed.num_classes)
        rows.append({"client": k, "group": int(fed.groups[k]), "n_train": len(fed.train[k]),
                     "n_test": len(fed.test[k]), "counts": counts,
                     "train_counts": np.bincount(seen[0], minlength=fed.num_classes)})
    return rows


def print_table(spec, rows: list[dict[str, Any]], note: str | None, normalization=None) -> None:
    print(f"dataset {spec.dataset.name}  scenario {spec.scenario.name} "
          f"{spec.scenario_params.model_dump(exclude={'test_fraction', 'val_fraction'})}  "
          f"clients {len(rows)}  seed {spec.seed}")
    if note:
        print(f"note: {note}")
    print(f"{'client':>6} {'group':>5} {'n_train':>8} {'n_test':>7} {'classes':>7}  present")
    for r in rows:
        present = np.flatnonzero(r["counts"])
        listing = " ".join(map(str, present)) if len(present) <= 12 else \
            " ".join(map(str, present[:12])) + " …"
        print(f"{r['client']:>6} {r['group']:>5} {r['n_train']:>8} {r['n_test']:>7} "
              f"{len(present):>7}  {listing}")
    if normalization is not None:
        stats = "" if normalization.mean is None else (
            f" ({normalization.origin}): mean {_rounded(normalization.mean)} std "
            f"{_rounded(normalization.std)}")
        print(f"inputs: normalize {normalization.mode}{stats}")


def _rounded(values: tuple[float, ...]) -> str:
    shown = ", ".join(f"{v:.4f}" for v in values[:6])
    return f"[{shown}{', …' if len(values) > 6 else ''}]"


def plot(rows: list[dict[str, Any]], title: str, path: str) -> None:
    """Client × class heat map of each client's train label shares, clients sorted by group."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted(rows, key=lambda r: (r["group"], r["client"]))
    shares = np.stack([r["train_counts"] / max(1, r["train_counts"].sum()) for r in rows])
    height = min(12.0, 1.5 + 0.22 * len(rows))
    width = min(16.0, 3.0 + 0.12 * shares.shape[1] + 2)
    fig, ax = plt.subplots(figsize=(max(width, 6.0), max(height, 3.0)))
    image = ax.imshow(shares, aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_xlabel("class")
    ax.set_ylabel("client (latent group)")
    step = max(1, len(rows) // 40)
    ax.set_yticks(range(0, len(rows), step))
    ax.set_yticklabels([f"{r['client']} (g{r['group']})" for r in rows][::step], fontsize=7)
    ax.set_title(title, fontsize=10)
    fig.colorbar(image, ax=ax, label="share of the client's train samples")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def describe(args: argparse.Namespace) -> int:
    if args.preset is None and args.spec is None:
        print(f"{len(presets.PRESETS)} presets (use: preset: NAME in a spec, or "
              f"describe NAME):")
        for name in presets.names():
            p = presets.PRESETS[name]
            extra = {k: v for k, v in p["scenario"].items() if k != "name"}
            print(f"  {name:28s} {p['dataset']['name']:18s} {p['scenario']['name']} {extra} "
                  f"clients={p['federation']['num_clients']} model="
                  f"{p.get('model', {}).get('name', '-')}")
            print(f"  {'':28s} note: {p['note']}")
        return 0
    spec = resolve(args.preset, args.spec, args.root, args.seed)
    source = load_source(spec.dataset.name, spec.dataset_params)
    if source.origin == STANDIN:
        print(standin.notice(spec.dataset.name,
                             data_root(spec.dataset_params.root) / spec.dataset.name))
    fed = build_federation(spec, source)
    rows = client_table(fed, source.y)
    note = presets.PRESETS[args.preset]["note"] if args.preset else None
    print_table(spec, rows, note, fed.normalization)
    if args.plot:
        plot(rows, f"{args.preset or args.spec}: {spec.dataset.name} / {spec.scenario.name}, "
                   f"{fed.num_clients} clients", args.plot)
        print(f"figure: {args.plot}")
    return 0


def origin(name: str) -> str:
    """Where the data of a source without a manifest come from; for a source missing from
    ``_LOCAL_ORIGINS``, the first line of its docstring."""
    if name in _LOCAL_ORIGINS:
        return _LOCAL_ORIGINS[name]
    return (SOURCES.get(name).__doc__ or "").strip().split("\n")[0]


_STATE = {REAL: "present", STANDIN: "STAND-IN", None: "absent"}


def list_datasets(args: argparse.Namespace) -> int:
    """One row per name ``dataset.name`` accepts; downloadable ones with their state in the
    cache root (``present`` means the real data; a stand-in is shown as such) and whether the
    stand-in root next to it holds a stand-in."""
    root, standins = data_root(args.root), standin_root(args.root)
    manifests = {m.name: m for m in list_manifests()}
    print(f"cache root: {root}")
    print(f"stand-in root: {standins}")
    print(f"{'dataset':18s} {'cache':8s} {'stand-in':8s} {'digest':10s} {'tasks':32s} data from")
    for name in sorted(set(SOURCES.names()) | set(manifests)):
        m = manifests.get(name)
        if m is None:
            print(f"{name:18s} {'':8s} {'':8s} {'':10s} {'':32s} {origin(name)}")
            continue
        state = _STATE[dataset_origin(name, root, m)]
        written = "written" if dataset_origin(name, standins, m) == STANDIN else "-"
        digest = "verified" if m.verified else "UNVERIFIED"
        tasks = ", ".join(f"{t}({len(c)})" for t, c in m.tasks.items())
        print(f"{name:18s} {state:8s} {written:8s} {digest:10s} {tasks:32s} "
              f"downloaded from {', '.join(m.hosts)}")
    return 0


def fetch_datasets(args: argparse.Namespace) -> int:
    for name in args.names:
        path = fetch(name, args.root, allow_unverified=args.allow_unverified, force=args.force,
                     progress=True)
        print(f"{name}: {path}")
    return 0


def verify_datasets(args: argparse.Namespace) -> int:
    for name in args.names:
        folder = verify(name, args.root)
        kind = " (STAND-IN, checked against the digests it was written with)" \
            if dataset_origin(name, args.root) == STANDIN else ""
        print(f"{name}: ok {folder}{kind}")
    return 0


def print_path(args: argparse.Namespace) -> int:
    folder, found = locate(args.names[0], args.root)
    if found == STANDIN:
        print(standin.notice(args.names[0], folder), file=sys.stderr)
    print(folder)
    return 0


def write_standins(args: argparse.Namespace) -> int:
    """Write each stand-in and say where it is, what it is and how a spec reads it."""
    if args.seed < 0:
        raise SpecError([("--seed", f"a seed is a non-negative integer, got {args.seed}")])
    for name in args.names:
        folder = standin.write(name, args.root, seed=args.seed, size=args.size)
        counts = read_marker(folder)["standin"]["counts"]
        print(f"{name}: stand-in written to {folder} (seed {args.seed}, {args.size} size: "
              f"{', '.join(f'{k} {v:,}' for k, v in counts.items())}): random content in the real "
              f"files' format, not the real {name}; a spec reads it with dataset.root: "
              f"{folder.parent}")
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m raylf.datasets",
                                  description="raylf datasets, their download cache and a "
                                              "per-client look at a scenario")
    sub = top.add_subparsers(dest="cmd", required=True)

    def command(name: str, run: Callable[[argparse.Namespace], int], summary: str,
                root_help: str = f"cache root (default: ${ENV_VAR}, else ~/.cache/raylf/data)"
                ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=summary, description=summary)
        p.set_defaults(run=run)
        p.add_argument("--root", default=None, metavar="DIR", help=root_help)
        return p

    command("list", list_datasets, "list every dataset name and where its data come from")
    p_fetch = command("fetch", fetch_datasets, "download, verify and unpack datasets")
    p_fetch.add_argument("names", nargs="+", metavar="NAME")
    p_fetch.add_argument("--allow-unverified", action="store_true",
                         help="accept files that have no published digest")
    p_fetch.add_argument("--force", action="store_true", help="re-verify even if complete")
    p_verify = command("verify", verify_datasets, "re-hash the files of fetched datasets")
    p_verify.add_argument("names", nargs="+", metavar="NAME")
    p_path = command("path", print_path, "print the folder of a fetched dataset")
    p_path.add_argument("names", nargs=1, metavar="NAME")
    p_standin = command("standin", write_standins,
                        "write format-true stand-ins: seeded random content in the real files' "
                        "layout, through the real fetch, to check a spec without the data",
                        root_help=f"root to write them into (default: {standin_root()}, the "
                                  "stand-in root inside the cache root); a spec reads them with "
                                  "dataset.root: DIR")
    p_standin.add_argument("names", nargs="+", metavar="NAME", choices=manifest_names())
    p_standin.add_argument("--seed", type=int, default=0,
                           help="seed of the content, ≥ 0 (default 0)")
    p_standin.add_argument("--size", choices=sorted(standin.SIZES), default="preset",
                           help="preset: every paper preset at its client count (default); "
                                "smoke: the least a smoke run of at most 10 clients needs")
    p_describe = command("describe", describe, "per-client table of a preset or a spec",
                         root_help="cache root of the data")
    p_describe.add_argument("preset", nargs="?", help="paper preset (omit to list them)")
    p_describe.add_argument("--spec", help="an experiment spec instead of a preset")
    p_describe.add_argument("--plot", metavar="FILE", help="write the label-distribution PNG")
    p_describe.add_argument("--seed", type=int, help="partition seed (default: the spec's)")
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.run(args)
    except SpecError as err:
        print(err, file=sys.stderr)
        return err.exit_code
    except standin.StandinRefused as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except DatasetError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
