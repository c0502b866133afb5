#!/usr/bin/python3
"""Writes this folder's schemas from their upstream files (see README.md).

  extract.py kubernetes OUT.json CORE.json APPS.json NETWORKING.json
      the OpenAPI v3 component schemas that Deployment, StatefulSet,
      Service, Secret, ConfigMap and NetworkPolicy reach, merged
  extract.py crd OUT.json CRD.yaml VERSION
      a CustomResourceDefinition's openAPIV3Schema for VERSION

Descriptions are dropped (they are most of the bytes); nothing else is
changed. Needs Debian's python3-yaml for the CRDs."""
import json
import sys

KINDS = ["io.k8s.api.apps.v1.Deployment", "io.k8s.api.apps.v1.StatefulSet",
         "io.k8s.api.core.v1.Service", "io.k8s.api.core.v1.Secret",
         "io.k8s.api.core.v1.ConfigMap", "io.k8s.api.networking.v1.NetworkPolicy"]
PREFIX = "#/components/schemas/"


def strip(node):
    if isinstance(node, dict):
        return {k: strip(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [strip(v) for v in node]
    return node


def refs(node, out):
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(PREFIX):
            out.add(ref[len(PREFIX):])
        for v in node.values():
            refs(v, out)
    elif isinstance(node, list):
        for v in node:
            refs(v, out)


def kubernetes(out, documents):
    schemas = {}
    for path in documents:
        with open(path) as f:
            schemas.update(json.load(f)["components"]["schemas"])
    wanted, todo = set(), list(KINDS)
    while todo:
        name = todo.pop()
        if name in wanted:
            continue
        wanted.add(name)
        more = set()
        refs(schemas[name], more)
        todo.extend(more - wanted)
    kept = {name: strip(schemas[name]) for name in sorted(wanted)}
    with open(out, "w") as f:
        json.dump({"components": {"schemas": kept}}, f, indent=1, sort_keys=True)
        f.write("\n")


def crd(out, path, version):
    import yaml
    with open(path) as f:
        doc = yaml.safe_load(f)
    for v in doc["spec"]["versions"]:
        if v["name"] == version:
            with open(out, "w") as f:
                json.dump(strip(v["schema"]["openAPIV3Schema"]), f, indent=1, sort_keys=True)
                f.write("\n")
            return
    sys.exit(f"{path}: no version {version}")


if __name__ == "__main__":
    if sys.argv[1] == "kubernetes":
        kubernetes(sys.argv[2], sys.argv[3:])
    else:
        crd(sys.argv[2], sys.argv[3], sys.argv[4])
