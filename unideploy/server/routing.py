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
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, ValidationError, field_validator, model_validator

from unideploy.server.config import StrictModel, load_yaml, settings_error

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


def _version(value: Any) -> str:
    """A version is a folder name of ASCII digits, never a path."""
    if isinstance(value, bool) or not (
        (isinstance(value, int) and value >= 0) or (isinstance(value, str) and value.isascii() and value.isdigit())
    ):
        raise ValueError(f"version {value!r} must be a version number (a folder of ASCII digits)")
    return str(int(value))


Version = Annotated[str, BeforeValidator(_version)]


class VariantFile(StrictModel):
    name: str = Field(description="1-64 of A-Z a-z 0-9 . _ - (it travels in a response header)")
    version: Version = Field(description="the version this variant serves")
    weight: Annotated[float, Field(strict=True, ge=0)] = Field(description="share of unversioned traffic")

    @field_validator("name")
    @classmethod
    def _header_safe(cls, name: str) -> str:
        if not VARIANT_NAME.fullmatch(name):
            raise ValueError(
                f"variant name {name!r} must be 1-64 of A-Z a-z 0-9 . _ - (it travels in a response header)"
            )
        return name


class ShadowFile(StrictModel):
    version: Version = Field(description="gets a copy of routed traffic; its answers are measured and discarded")


class RoutingFile(StrictModel):
    """``REPO/<model>/routing.yaml``, and the body of the routing API's PUT."""

    variants: list[VariantFile] = Field(description="named versions with weights")
    sticky_header: str | None = Field(None, description="same value of this header, same variant")
    shadow: ShadowFile | None = Field(None, description="a version that gets a copy of the traffic")

    @model_validator(mode="after")
    def _consistent(self) -> RoutingFile:
        if not self.variants:
            raise ValueError("routing needs a non-empty 'variants' list")
        names = [v.name for v in self.variants]
        if len(set(names)) != len(names):
            raise ValueError(f"a variant name is used twice: {', '.join(names)}")
        if sum(v.weight for v in self.variants) <= 0:
            raise ValueError("variant weights add up to zero")
        return self


def parse_routing(data: Any, where: str) -> Routing:
    """Validate a routing document (from routing.yaml or the API); InputError names the problem."""
    try:
        doc = RoutingFile.model_validate(data)
    except ValidationError as exc:
        raise settings_error(where, exc, RoutingFile) from None
    variants = tuple(Variant(v.name, v.version, v.weight) for v in doc.variants)
    return Routing(variants, doc.sticky_header, doc.shadow.version if doc.shadow else None)


def load_routing(model_dir: Path) -> Routing | None:
    path = model_dir / ROUTING_FILE
    return parse_routing(load_yaml(path), str(path)) if path.exists() else None
