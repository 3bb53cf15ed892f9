"""A/B routing: named variants pointing at versions, with weights, sticky keys and a shadow.

``REPO/<model>/routing.yaml`` (hot-reloaded, or replaced through the routing API)::

    variants:
      - {name: control, version: 1, weight: 90}
      - {name: candidate, version: 2, weight: 10}
    sticky_header: x-user-id          # same header value -> same variant, always
    shadow: {version: 3}              # gets a copy of the traffic; answers discarded, measured

A request naming a version explicitly bypasses routing.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from unideploy.errors import InputError

ROUTING_FILE = "routing.yaml"
VARIANT_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")


@dataclass(frozen=True)
class Variant:
    name: str
    version: str
    weight: float


@dataclass(frozen=True)
class Routing:
    variants: tuple[Variant, ...]
    sticky_header: str | None = None
    shadow_version: str | None = None

    @property
    def versions(self) -> set[str]:
        return {v.version for v in self.variants} | ({self.shadow_version} if self.shadow_version else set())

    def choose(self, headers: Mapping[str, str], rng: random.Random) -> Variant:
        """Weighted choice; with a sticky key, a hash of it replaces the random draw."""
        key = headers.get(self.sticky_header.lower()) if self.sticky_header else None
        if key is not None:
            digest = hashlib.sha256(key.encode()).digest()
            point = int.from_bytes(digest[:8], "big") / 2**64
        else:
            point = rng.random()
        total = sum(v.weight for v in self.variants)
        edge = 0.0
        for variant in self.variants:
            edge += variant.weight / total
            if point < edge:
                return variant
        return self.variants[-1]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "variants": [{"name": v.name, "version": v.version, "weight": v.weight} for v in self.variants]
        }
        if self.sticky_header:
            out["sticky_header"] = self.sticky_header
        if self.shadow_version:
            out["shadow"] = {"version": self.shadow_version}
        return out


def _check_version(version: Any, where: str) -> None:
    """A version is a folder name of ASCII digits, never a path."""
    if isinstance(version, bool) or not (
        (isinstance(version, int) and version >= 0)
        or (isinstance(version, str) and version.isascii() and version.isdigit())
    ):
        raise InputError(f"{where}: version {version!r} must be a version number (a folder of ASCII digits)")


def parse_routing(data: Any, where: str) -> Routing:
    """Validate a routing document (from routing.yaml or the API); InputError names the problem."""
    if not isinstance(data, dict) or not isinstance(data.get("variants"), list) or not data["variants"]:
        raise InputError(f"{where}: routing needs a non-empty 'variants' list")
    variants, names = [], set()
    for item in data["variants"]:
        if not isinstance(item, dict) or not {"name", "version", "weight"} <= set(item):
            raise InputError(f"{where}: each variant needs name, version and weight, got {item!r}")
        weight = item["weight"]
        if not isinstance(item["name"], str) or not VARIANT_NAME.fullmatch(item["name"]):
            raise InputError(
                f"{where}: variant name {item['name']!r} must be 1-64 of A-Z a-z 0-9 . _ - "
                "(it travels in a response header)"
            )
        if not isinstance(weight, (int, float)) or isinstance(weight, bool) or not math.isfinite(weight) or weight < 0:
            raise InputError(f"{where}: variant '{item['name']}' has an invalid weight {weight!r}")
        _check_version(item["version"], f"{where}: variant '{item['name']}'")
        if str(item["name"]) in names:
            raise InputError(f"{where}: variant name '{item['name']}' is used twice")
        names.add(str(item["name"]))
        variants.append(Variant(item["name"], str(int(item["version"])), float(weight)))
    if sum(v.weight for v in variants) <= 0:
        raise InputError(f"{where}: variant weights add up to zero")
    unknown = set(data) - {"variants", "sticky_header", "shadow"}
    if unknown:
        raise InputError(f"{where}: unknown routing key(s) {', '.join(sorted(unknown))}")
    shadow = data.get("shadow")
    if shadow is not None and (not isinstance(shadow, dict) or "version" not in shadow):
        raise InputError(f"{where}: shadow must be a mapping with a version")
    if shadow is not None:
        _check_version(shadow["version"], f"{where}: shadow")
    sticky = data.get("sticky_header")
    if sticky is not None and not isinstance(sticky, str):
        raise InputError(f"{where}: sticky_header must be a header name")
    return Routing(tuple(variants), sticky, str(int(shadow["version"])) if shadow else None)


def load_routing(model_dir: Path) -> Routing | None:
    from unideploy.server.config import load_yaml

    path = model_dir / ROUTING_FILE
    return parse_routing(load_yaml(path), str(path)) if path.exists() else None
