"""What the console says before a sweep runs: the datasets and pretrained weights still to fetch,
loudly every dataset a run reads as stand-in content, and what a smoke or estimate run is."""

from __future__ import annotations

from raylf.config import ResolvedSpec
from raylf.preflight import DataCheck
from raylf.sweep.load import Loaded
from raylf.sweep.smoke import PRETRAINED, hub_file


def _size(nbytes: float | None) -> str:
    return "size unpublished" if nbytes is None else f"{nbytes / 2**20:,.1f} MiB"


def to_fetch(name: str, root: str) -> str:
    """One dataset still to download: its files, their sizes and the command."""
    from raylf.data.manifest import load_manifest

    files = load_manifest(name).files
    sizes = [f.size for f in files]
    total = None if None in sizes else sum(sizes)
    return (f"to fetch: {name}, {_size(total)} ({', '.join(f.filename for f in files)}) into "
            f"{root}: python -m raylf.datasets fetch {name} --root {root}")


def missing_weights(specs: list[ResolvedSpec]) -> list[str]:
    """Pretrained weights the specs name that are not in torch's hub cache yet."""
    import torchvision.models as tvm

    lines = []
    for model in sorted({s.model.name for s in specs
                         if getattr(s.model_params, "weights", None) == "imagenet"}):
        if model in PRETRAINED and not hub_file(model).is_file():
            weights = getattr(tvm, PRETRAINED[model]).IMAGENET1K_V1
            lines.append(f"to fetch: {model} ImageNet weights, "
                         f"{weights.meta['_file_size']:.1f} MB ({weights.url}) into "
                         f"{hub_file(model).parent} (torchvision downloads it on first use)")
    return lines


def data_notices(check: DataCheck, loaded: Loaded) -> list[str]:
    """What the console says before anything runs: datasets to fetch (a plan), loudly every
    dataset a run reads as stand-in content, and what a smoke or estimate run is."""
    lines = [to_fetch(name, root) for name, root in sorted(check.missing.items())]
    lines += missing_weights([t.spec for t in loaded.trials + loaded.probes])
    if check.standins():
        from raylf.data.standin import notice

        lines += [notice(name) for name in check.standins()]
    kind = type(loaded.mode).__name__
    if kind == "SmokeRun":
        lines.append(f"smoke: {len(loaded.trials)} distinct configuration(s), one seed each, "
                     "resources shrunk to one machine; these tables test that the specs run and "
                     "say nothing about accuracy")
    elif kind == "TimingRun":
        lines.append(f"estimate: timing {len(loaded.trials)} configuration(s) as many at once "
                     "as the sweep would run them, for at most "
                     f"{max(t.spec.federation.rounds for t in loaded.trials)} round(s) each")
    if loaded.mode is not None:
        lines += [f"{kind.removesuffix('Plan').lower()}: {line}" for line in loaded.mode.notes]
    return lines
