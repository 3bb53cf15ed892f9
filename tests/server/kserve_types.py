"""Read KServe manifests back through the KServe SDK's own types: every field must be one the SDK
model declares (an unknown or misspelt field fails), with a value of its declared kind, and the
typed object must serialize to the same document. Run as a script (tests/server/test_kserve.py)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

KINDS = {"ClusterServingRuntime": "V1alpha1ClusterServingRuntime", "InferenceService": "V1beta1InferenceService"}


def typed(data, klass: str):
    import kserve
    from kubernetes.client import models as k8s

    if listed := re.fullmatch(r"[Ll]ist\[(.*)\]", klass):  # "list[X]" (KServe) or "List[X]" (Kubernetes)
        assert isinstance(data, list)
        return [typed(item, listed.group(1)) for item in data]
    if mapped := re.fullmatch(r"(?:dict\(|Dict\[)[^,]*, (.*)[)\]]", klass):
        assert isinstance(data, dict)
        return {key: typed(value, mapped.group(1)) for key, value in data.items()}
    primitive = {"str": str, "int": int, "bool": bool, "float": (int, float), "object": object}
    if klass in primitive:
        assert isinstance(data, primitive[klass]), (data, klass)
        return data
    cls = getattr(kserve.models, klass, None) or getattr(k8s, klass)
    fields = {json_name: attr for attr, json_name in cls.attribute_map.items()}
    unknown = set(data) - set(fields)
    assert not unknown, f"{klass} has no field(s) {unknown}"
    return cls(**{fields[key]: typed(value, cls.openapi_types[fields[key]]) for key, value in data.items()})


def main(paths: list[str]) -> None:
    from kserve.api_client import ApiClient

    for path in paths:
        document = yaml.safe_load(Path(path).read_text())
        assert ApiClient().sanitize_for_serialization(typed(document, KINDS[document["kind"]])) == document, path


if __name__ == "__main__":
    main(sys.argv[1:])
