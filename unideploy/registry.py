"""A lazy registry of plug-ins, shared by exporters, runtimes and (later) optimizer passes.

Built-ins are listed as ``"module:Class"`` strings so that listing plug-ins (``deploy doctor``)
never imports a framework; third parties add theirs through a Python entry-point group.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, entry_points, packages_distributions, version
from typing import Generic, TypeVar

from unideploy.errors import InputError, UnideployError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str, group: str, builtin: dict[str, str]) -> None:
        self.kind = kind
        self.group = group
        self._targets: dict[str, str] = dict(builtin)
        self._loaded: dict[str, type[T]] = {}
        self._broken: dict[str, UnideployError] = {}
        self._scanned = False

    def _scan_entry_points(self) -> None:
        if self._scanned:
            return
        self._scanned = True
        for ep in entry_points(group=self.group):
            self._targets.setdefault(ep.name, ep.value)

    def names(self) -> list[str]:
        self._scan_entry_points()
        return list(self._targets)

    def get(self, name: str) -> type[T]:
        self._scan_entry_points()
        if name not in self._targets:
            raise InputError(
                f"unknown {self.kind} '{name}'",
                f"choose one of: {', '.join(sorted(self._targets))}",
            )
        if name not in self._loaded:
            module_name, _, attr = self._targets[name].partition(":")
            try:
                obj = importlib.import_module(module_name)
                for part in attr.split("."):
                    obj = getattr(obj, part)
            except (ImportError, AttributeError) as exc:
                raise UnideployError(
                    f"{self.kind} plug-in '{name}' ({self._targets[name]}) cannot be loaded: {exc}",
                    "reinstall the package that provides it",
                ) from exc
            self._loaded[name] = obj  # type: ignore[assignment]
        return self._loaded[name]

    def __iter__(self) -> Iterator[tuple[str, type[T]]]:
        """Every plug-in that loads. One that does not is left out (``broken`` says why, and
        ``deploy doctor`` shows it): a broken third-party package must not stop the others; asking
        for it by name (``get``) raises its error."""
        for name in self.names():
            try:
                yield name, self.get(name)
            except UnideployError as exc:
                self._broken[name] = exc

    def broken(self) -> dict[str, UnideployError]:
        """The plug-ins that do not load, with why."""
        for _ in self:
            pass
        return dict(self._broken)


@dataclass(frozen=True)
class Availability:
    """Whether a plug-in can work on this machine; if not, why and the command that fixes it.

    The versions of ``modules`` are read only when ``detail`` is: a gate that asks only ``ok``
    (choosing a runtime at a server's cold start) must not pay for mapping every installed package
    to its modules, which a module whose distribution has another name (pynvml from
    nvidia-ml-py, grpc from grpcio) costs."""

    ok: bool
    note: str = ""
    fix: str | None = None
    modules: tuple[str, ...] = ()

    @property
    def detail(self) -> str:
        versions = ", ".join(module_version(m) for m in self.modules)
        return "; ".join(part for part in (versions, self.note) if part)


def missing_modules(modules: tuple[str, ...]) -> list[str]:
    """Those of ``modules`` that cannot be imported here (found without importing them)."""
    return [m for m in modules if importlib.util.find_spec(m) is None]


def modules_availability(modules: tuple[str, ...], extra: str | None) -> Availability:
    """Availability of a plug-in that only needs some Python modules importable (not imported)."""
    missing = missing_modules(modules)
    if missing:
        fix = f"pip install 'unideploy[{extra}]'" if extra else f"pip install {' '.join(missing)}"
        return Availability(False, f"missing Python module(s): {', '.join(missing)}", fix)
    return Availability(True, modules=modules)


@dataclass(frozen=True)
class ExtraModules:
    """The modules a feature that is not a plug-in imports (Core ML conversion, the Kotlin parser,
    signing), and the extra that installs them: declared beside the feature, so that
    tests/test_extras.py can check that the extra brings them."""

    extra: str
    modules: tuple[str, ...]

    def availability(self) -> Availability:
        return modules_availability(self.modules, self.extra)


@lru_cache(maxsize=1)
def _distributions() -> dict[str, list[str]]:
    return dict(packages_distributions())


def module_version(module: str) -> str:
    """``"name version"`` for an importable module, read from its distribution (no import).

    The distribution named like the module is tried first: mapping modules to distributions reads
    every installed package's metadata (half a second in a full environment), which a server would
    otherwise pay on each cold start, as choosing a runtime asks for its availability."""
    try:
        return f"{module} {version(module)}"
    except PackageNotFoundError:
        pass
    for dist in _distributions().get(module, []):
        try:
            return f"{module} {version(dist)}"
        except PackageNotFoundError:
            continue
    return module
