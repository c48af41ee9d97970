#!/usr/bin/env python3
"""Validate Kubernetes manifests offline, strictly (unknown fields are errors).

Built-in kinds are checked against the Kubernetes OpenAPI schemas that the `kubernetes-validate`
package ships for each release; the Prometheus Operator's PodMonitor / ServiceMonitor against
the schema of the `cloudcoil-models-prometheus-operator` models (generated from the operator's
CRDs), made strict the same way. No cluster and no network needed.

    kubectl kustomize deploy/kustomize/overlays/gateway | deploy/validate.py -k 1.30.0 -

Prints `OK <kind>/<name>` or `FAIL <kind>/<name>: <reason>` per document; exits 1 on any failure.
`cargo xtask setup` installs both packages (pinned versions in xtask/src/setup.rs).
"""

import argparse
import sys

import jsonschema
import kubernetes_validate
import yaml

OPERATOR_KINDS = {"PodMonitor", "ServiceMonitor", "PrometheusRule"}
OPERATOR_API = "monitoring.coreos.com/v1"


def strict(schema):
    """Every object schema that lists properties rejects the others (like kubectl --validate=strict)."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        pattern = out.get("pattern")
        if isinstance(pattern, str) and "(?i)" in pattern and not pattern.startswith("(?i)"):
            # Go's RE2 allows inline flags anywhere (`^(?i)(abort|warn)?$`); Python's re only first.
            out["pattern"] = "(?i)" + pattern.replace("(?i)", "")
        if out.get("type") == "object" and "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(x) for x in schema]
    return schema


def validate_operator(doc):
    from cloudcoil.models.prometheus_operator import v1

    if doc.get("apiVersion") != OPERATOR_API:
        raise ValueError(f"apiVersion {doc.get('apiVersion')!r}, expected {OPERATOR_API}")
    model = getattr(v1, doc["kind"])
    jsonschema.validate(doc, strict(model.model_json_schema(by_alias=True)))
    model.model_validate(doc)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-k", "--kubernetes-version", default="1.30.0")
    ap.add_argument("files", nargs="+", help="multi-document YAML files, - for stdin")
    a = ap.parse_args()
    failed = 0
    count = 0
    for f in a.files:
        text = sys.stdin.read() if f == "-" else open(f, encoding="utf-8").read()
        for doc in yaml.safe_load_all(text):
            if not doc:
                continue
            count += 1
            what = f"{doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"
            try:
                if doc.get("kind") in OPERATOR_KINDS:
                    validate_operator(doc)
                    how = "prometheus-operator schema"
                else:
                    kubernetes_validate.validate(doc, a.kubernetes_version, strict=True)
                    how = f"kubernetes {a.kubernetes_version} strict"
                print(f"OK {what} ({how})")
            except Exception as e:  # noqa: BLE001 - report every kind of failure per document
                failed += 1
                msg = str(e).splitlines()[0] if str(e) else type(e).__name__
                print(f"FAIL {what}: {type(e).__name__}: {msg}")
    if count == 0:
        print("FAIL: no documents")
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
