"""Reader for one MedIMeta dataset folder (as unpacked by ``raylf.data.extract``).

Expected layout, per the MedIMeta paper and its reader package (not yet checked against the real
zips, hence the search and the explicit errors): somewhere below the dataset folder an
``info.yaml``, next to it ``images/NNNNNN.tiff`` (sample order = file-name order) and one
``task_labels/<task name>.npy`` per task. Images are read with PIL as grey and resized once at
load; ``images.hdf5`` is ignored so that h5py is not needed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

from raylf.data.manifest import DatasetError

# raylf's dataset name -> the MedIMeta dataset id and, per raylf task key (``binary``,
# ``multiclass``: the keys FMT-SVM reads), MedIMeta's task name; the label files are
# task_labels/<task name>.npy
DATASETS: dict[str, tuple[str, dict[str, str]]] = {
    "pneumonia": ("pneumonia", {"binary": "pneumonia presence", "multiclass": "disease class"}),
    "breast_ultrasound": ("bus", {"binary": "malignancy", "multiclass": "case category"}),
}


def _info(folder: Path) -> tuple[Path, dict]:
    found = sorted(folder.rglob("info.yaml"), key=lambda p: len(p.parts))
    if not found:
        raise DatasetError(f"no info.yaml below {folder}: not a MedIMeta dataset folder")
    meta = yaml.safe_load(found[0].read_text(encoding="utf-8")) or {}
    return found[0].parent, meta if isinstance(meta, dict) else {}


def _task_names(meta: dict) -> list[str]:
    """Task names info.yaml declares (a list of mappings with ``task_name``, or of strings)."""
    tasks = meta.get("tasks") or []
    return [t.get("task_name", "") if isinstance(t, dict) else str(t) for t in tasks]


def load(folder: Path, tasks: dict[str, str], size: int
         ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """float32 N×1×size×size images in [0, 1] and, per raylf task key, int64 labels."""
    from PIL import Image

    base, meta = _info(folder)
    declared = _task_names(meta)
    labels = {}
    for key, name in tasks.items():
        path = base / "task_labels" / f"{name}.npy"
        if not path.is_file():
            have = sorted(p.stem for p in (base / "task_labels").glob("*.npy"))
            raise DatasetError(f"{path} missing: task {name!r} ({key}) not found; task label "
                               f"files present: {have}; info.yaml declares: {declared}")
        labels[key] = np.load(path, allow_pickle=False).reshape(-1).astype(np.int64)
    images = sorted((base / "images").glob("*.tif*"))
    sizes = {len(v) for v in labels.values()}
    if len(sizes) != 1 or len(images) not in sizes:
        raise DatasetError(f"{base}: {len(images)} images in images/ but task labels of "
                           f"lengths {sorted(sizes)}; the dataset folder is incomplete")

    def grey(path: Path) -> np.ndarray:
        with Image.open(path) as img:
            return np.asarray(img.convert("L").resize((size, size), Image.BILINEAR))

    x = np.stack([grey(p) for p in images])[:, None].astype(np.float32) / 255.0
    return x, labels
