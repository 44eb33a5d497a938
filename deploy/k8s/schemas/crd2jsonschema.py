#!/usr/bin/env python3
"""Turn a CustomResourceDefinition's openAPIV3Schema into a strict JSON schema.

    crd2jsonschema.py CRD.yaml VERSION > KIND.json

Strict like `kubectl apply --validate=strict` (the API server's field validation): an
object that lists its properties refuses any other, unless the CRD marks it
x-kubernetes-preserve-unknown-fields or gives it additionalProperties (a map). OpenAPI's
`nullable` becomes a JSON-schema null type. Descriptions are dropped (the CRD has them;
the schema only has to decide). apiVersion and kind are pinned to the CRD's, so a file
of another kind cannot pass by accident.
"""

import json
import re
import sys

import yaml


def ecma_pattern(p):
    """A Go regexp's case-insensitive flag `(?i)`, which ECMA-262 regexps (JSON schema's)
    lack, as [aA] classes; a pattern too intricate for that is dropped (the CRD's own
    validation still holds it, this schema is only looser there)."""
    if "(?i)" not in p:
        return p
    p = p.replace("(?i)", "")
    if "[" in p or "\\" in p:
        return None
    return re.sub(r"[A-Za-z]", lambda m: f"[{m[0].lower()}{m[0].upper()}]", p)


def strict(node):
    if isinstance(node, list):
        return [strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "description" or key.startswith("x-kubernetes-"):
            continue
        if key == "properties":
            out[key] = {name: strict(sub) for name, sub in value.items()}
        elif key == "pattern":
            if (ecma := ecma_pattern(value)) is not None:
                out[key] = ecma
        else:
            out[key] = strict(value)
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
    preserve = node.get("x-kubernetes-preserve-unknown-fields", False)
    if "properties" in node and "additionalProperties" not in node and not preserve:
        out["additionalProperties"] = False
    return out


def main():
    path, version = sys.argv[1], sys.argv[2]
    with open(path) as f:
        crd = next(d for d in yaml.safe_load_all(f) if d)
    spec = crd["spec"]
    (served,) = [v for v in spec["versions"] if v["name"] == version]
    schema = strict(served["schema"]["openAPIV3Schema"])
    schema["properties"]["apiVersion"] = {"const": f"{spec['group']}/{version}"}
    schema["properties"]["kind"] = {"const": spec["names"]["kind"]}
    schema["required"] = sorted(set(schema.get("required", [])) | {"apiVersion", "kind", "metadata"})
    # metadata is `type: object` in a CRD (the API server checks it): hold it to the
    # fields a manifest sets, so a typo there fails too.
    schema["properties"]["metadata"] = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "namespace": {"type": "string"},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
        },
        "required": ["name"],
        "additionalProperties": False,
    }
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", **schema}
    json.dump(schema, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
