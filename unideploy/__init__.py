"""unideploy: export, verify, optimize and serve ML models through one package format.

The Python API mirrors the CLI::

    import unideploy
    unideploy.export("model.pt", "model.udp", input_shapes=["x:1x3x32x32"])
    with unideploy.open_package("model.udp") as pkg:
        outputs = unideploy.run(pkg, {"x": batch})
"""

from __future__ import annotations

__version__ = "0.1.0"

from unideploy.api import export, open_package, optimize, run

__all__ = ["__version__", "export", "open_package", "optimize", "run"]
