//! The Kubernetes manifests under `deploy/` as the deploy and image tests read them: rendered by
//! the real kustomize, turned into JSON documents by PyYAML (what `deploy/validate.py` uses), and
//! the few readings of those documents both tests take.
//!
//! Like the rest of the test library, these panic with a message instead of returning errors.

use std::process::Command;

use serde_json::Value;

use crate::{output, repo};

/// `kubectl kustomize deploy/kustomize/<target>`: the YAML stream.
pub fn render(target: &str) -> String {
    let dir = repo().join("deploy/kustomize").join(target);
    let (ok, yaml, err) = output(Command::new("kubectl").arg("kustomize").arg(&dir), "");
    assert!(ok, "kubectl kustomize {}: {err}", dir.display());
    yaml
}

/// Kubernetes release the manifests are validated against (kubernetes-validate schemas).
pub const KUBERNETES_VERSION: &str = "1.30.0";

/// `deploy/validate.py -k <KUBERNETES_VERSION> -` on `yaml`, strictly offline against the
/// Kubernetes OpenAPI schemas and the Prometheus Operator's: (success, report).
pub fn validate(yaml: &str) -> (bool, String) {
    let (ok, out, err) = output(
        Command::new("python3")
            .arg(repo().join("deploy/validate.py"))
            .args(["-k", KUBERNETES_VERSION, "-"]),
        yaml,
    );
    (ok, format!("{out}{err}"))
}

/// The documents of a multi-document YAML stream, as JSON (PyYAML, which validate.py uses too).
pub fn docs(yaml: &str) -> Vec<Value> {
    let (ok, json, err) = output(
        Command::new("python3").args([
            "-c",
            "import json, sys, yaml; json.dump([d for d in yaml.safe_load_all(sys.stdin) if d], sys.stdout)",
        ]),
        yaml,
    );
    assert!(ok, "YAML → JSON: {err}");
    serde_json::from_str(&json).unwrap_or_else(|e| panic!("YAML → JSON gave no JSON: {e}"))
}

/// The first document of kind `k`.
pub fn kind<'a>(docs: &'a [Value], k: &str) -> Option<&'a Value> {
    docs.iter().find(|d| d["kind"] == k)
}

/// A list of strings (empty when `v` is no list); panics on an element that is no string.
pub fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|x| {
                    x.as_str()
                        .unwrap_or_else(|| panic!("{x} is not a string"))
                        .to_string()
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Kubernetes quantity → base units (cores or bytes): `250m`, `64Mi`, `1G`, `2`.
pub fn quantity(q: &Value) -> f64 {
    let s = q
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| q.to_string());
    let (num, unit) = s.split_at(s.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(s.len()));
    let n: f64 = num.parse().unwrap_or_else(|_| panic!("quantity {s}"));
    n * match unit {
        "" => 1.0,
        "m" => 1e-3,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        u => panic!("unit {u} in {s}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_in_base_units() {
        let q = |s: &str| quantity(&Value::String(s.into()));
        assert_eq!(q("250m"), 0.25);
        assert_eq!(q("64Mi"), 64.0 * 1024.0 * 1024.0);
        assert_eq!(q("1G"), 1e9);
        assert_eq!(quantity(&serde_json::json!(2)), 2.0);
    }
}
