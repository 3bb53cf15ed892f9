"""The TensorRT runtime plug-in. Everything but ``runtime.py`` is pure logic that runs (and is
tested) without a GPU: optimization profiles, engine cache keys, precision plans."""
