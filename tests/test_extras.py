"""Each extra installs what the commands it enables import. The test venv holds every extra, so a
module that only another extra brings would pass every other test and fail a user who installs the
one extra the docs name (``deploy kserve`` lacked pydantic-settings, ``deploy serve --ray`` the serve
extra). Here each extra's dependency closure is walked through the installed packages' own metadata
and must hold the distribution of every module its plug-ins declare."""

from __future__ import annotations

import tomllib
from importlib.metadata import PackageNotFoundError, distribution, packages_distributions
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from unideploy.edge.codegen.check import PARSERS
from unideploy.edge.coreml import COREML
from unideploy.exporters import EXPORTERS
from unideploy.package.signing import SIGNING
from unideploy.runtimes import RUNTIMES
from unideploy.server import EXTRA_MODULES
from unideploy.targets import TARGETS
from unideploy.web.browser import PLAYWRIGHT

PROJECT = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]


def declared() -> list[tuple[str, str, tuple[str, ...]]]:
    """(who, extra, modules) for every plug-in and command that names the extra installing its modules."""
    found = [(f"the commands of the {extra} extra", extra, modules) for extra, modules in EXTRA_MODULES.items()]
    for kind, registry in (("exporter", EXPORTERS), ("runtime", RUNTIMES)):
        for name in registry.names():
            plugin = registry.get(name)
            if plugin.extra:
                found.append((f"{kind} {name}", plugin.extra, tuple(plugin.required_modules)))
    found += [(f"target {t.name}", t.extra, t.requires) for t in TARGETS.values() if t.extra]
    features = {"Core ML conversion": COREML, "signing": SIGNING, "verifying web sites": PLAYWRIGHT}
    features |= {f"the {language} parser": parser for language, parser in PARSERS.items()}
    return found + [(who, needs.extra, needs.modules) for who, needs in features.items()]


def _wanted(requirement: Requirement, extras: frozenset[str]) -> bool:
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({**default_environment(), "extra": e}) for e in extras | {""})


def closure(extra: str) -> set[str]:
    """Distributions ``pip install 'unideploy[extra]'`` brings, as far as this venv can tell."""
    pending = [(Requirement(r), frozenset[str]()) for r in PROJECT["dependencies"]]
    pending += [(Requirement(r), frozenset[str]()) for r in PROJECT["optional-dependencies"][extra]]
    seen: set[tuple[str, frozenset[str]]] = set()
    names: set[str] = set()
    while pending:
        requirement, parent_extras = pending.pop()
        if not _wanted(requirement, parent_extras):
            continue
        name, extras = canonicalize_name(requirement.name), frozenset(requirement.extras)
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        if name == "unideploy":  # an extra that includes another
            pending += [(Requirement(r), frozenset()) for e in extras for r in PROJECT["optional-dependencies"][e]]
            continue
        try:
            requires = distribution(name).requires or []
        except PackageNotFoundError:
            continue
        names.add(name)
        pending += [(Requirement(r), extras) for r in requires]
    return names


@pytest.mark.parametrize(
    "who, extra, modules",
    # the mindspore extra's rows run in the MindSpore venv (make test), the only one that has it
    [pytest.param(*row, marks=[pytest.mark.mindspore] if row[1] == "mindspore" else []) for row in declared()],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_the_extra_a_plugin_names_installs_its_modules(who, extra, modules):
    providers = packages_distributions()
    installed = [m for m in modules if m in providers]
    if not installed:
        pytest.skip(f"{', '.join(modules)}: not installed in this venv ({extra} is tested in its own)")
    brought = closure(extra)
    missing = [m for m in installed if not {canonicalize_name(d) for d in providers[m]} & brought]
    assert not missing, f"{who} imports {', '.join(missing)}, which pip install 'unideploy[{extra}]' does not bring"
