"""scikit-learn models whose ONNX form (skl2onnx) has text tensors, trained on the real iris data:
a classifier answering species names, the same with its probabilities as ZipMap dicts, and a
regression taking a species name."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def save_text_models(folder: Path) -> dict[str, Path]:
    import onnx
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import StringTensorType
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LinearRegression, LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder

    iris = load_iris()
    features = iris.data.astype(np.float32)
    species = np.array(iris.target_names)[iris.target]
    classifier = LogisticRegression(max_iter=500).fit(features, species)
    onnx.save(to_onnx(classifier, features[:1], options={id(classifier): {"zipmap": False}}), folder / "labels.onnx")
    onnx.save(to_onnx(classifier, features[:1]), folder / "zipmap.onnx")
    lengths = make_pipeline(OneHotEncoder(), LinearRegression()).fit(species.reshape(-1, 1), iris.data[:, 2])
    onnx.save(to_onnx(lengths, initial_types=[("species", StringTensorType([None, 1]))]), folder / "species.onnx")
    np.savez(folder / "features.npz", X=features[::10])  # 15 rows, every species
    np.savez(folder / "species_rows.npz", species=species[::10].reshape(-1, 1))
    np.savez(folder / "truth.npz", features=features, species=species, lengths=iris.data[:, 2])
    files = ("labels.onnx", "zipmap.onnx", "species.onnx", "features.npz", "species_rows.npz", "truth.npz")
    return {name.split(".")[0]: folder / name for name in files}
