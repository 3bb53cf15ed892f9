"""Third parties add plug-ins through entry points, without touching unideploy."""

from __future__ import annotations

import sys
import textwrap

import numpy as np
import pytest
from console import plugin_distribution

from unideploy.errors import UnideployError
from unideploy.registry import Registry
from unideploy.runtimes import Runtime
from unideploy.signature import Signature, TensorSpec

PLUGIN = textwrap.dedent("""
    import numpy as np
    from unideploy.registry import Availability
    from unideploy.runtimes import Runtime

    class DoublingRuntime(Runtime):
        name = "doubler"
        formats = ("npy",)
        targets = ("cpu",)

        @classmethod
        def availability(cls):
            return Availability(True, "always")

        def _load(self):
            self.factor = float(np.load(self.path))

        def _run(self, inputs):
            return {"y": inputs["x"] * self.factor}
""")


@pytest.fixture
def installed_plugin(tmp_path, monkeypatch):
    """A real (tiny) distribution on sys.path declaring a ``unideploy.runtimes`` entry point."""
    plugin_distribution(
        tmp_path, "doubler_plugin", PLUGIN, "unideploy.runtimes", "doubler = doubler_plugin:DoublingRuntime"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("doubler_plugin", None)


def test_entry_point_runtime_is_discovered_and_runs(installed_plugin):
    registry: Registry[Runtime] = Registry("runtime", "unideploy.runtimes", builtin={})
    assert "doubler" in registry.names()
    cls = registry.get("doubler")
    np.save(installed_plugin / "factor.npy", np.array(2.0))
    sig = Signature((TensorSpec("x", "float32", ("batch",)),), (TensorSpec("y", "float32", ("batch",)),))
    with cls(installed_plugin / "factor.npy", sig) as runtime:
        np.testing.assert_array_equal(runtime.run({"x": np.array([1.0, 2.0], np.float32)})["y"], [2.0, 4.0])


def test_broken_entry_point_is_reported_not_crashing(tmp_path, monkeypatch):
    dist = tmp_path / "broken-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[unideploy.runtimes]\nbroken = no_such_module:Thing\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry: Registry[Runtime] = Registry("runtime", "unideploy.runtimes", builtin={})
    with pytest.raises(UnideployError, match="runtime plug-in 'broken' .* cannot be loaded"):
        registry.get("broken")


def test_module_versions_are_read_from_their_distributions():
    """Where the distribution is named like the module it is read directly; where it is not
    (grpc from grpcio) the installed packages are mapped to their modules."""
    from importlib.metadata import version

    from unideploy.registry import module_version

    assert module_version("onnxruntime") == f"onnxruntime {version('onnxruntime')}"
    assert module_version("yaml") == f"yaml {version('pyyaml')}"
    assert module_version("no_such_module_anywhere") == "no_such_module_anywhere"


def test_availability_gates_read_no_versions_until_a_person_asks():
    """Choosing a runtime or checking an extra asks only whether the modules are there; the version
    strings deploy doctor prints are read when ``detail`` is, because a module whose distribution
    has another name (grpc from grpcio) costs a scan of every installed package."""
    from unideploy import registry
    from unideploy.server import availability

    registry._distributions.cache_clear()
    found = availability("serve")
    assert found.ok
    assert registry._distributions.cache_info().misses == 0
    assert f"grpc {registry.version('grpcio')}" in found.detail
    assert registry._distributions.cache_info().misses == 1
