//! `cargo xtask gen`: the files generated from others, written anew. Today one:
//! `deploy/kustomize/base/prometheusrule.yaml`, the Prometheus Operator's form of
//! `dashboards/alerts.yaml` (the same groups, indented under `spec:`). A unit test fails when
//! the committed file is not what this generates.

use anyhow::Context as _;

use crate::util::workspace_root;

/// The alert rules, as Prometheus reads them.
const ALERTS: &str = "dashboards/alerts.yaml";
/// The same rules as a PrometheusRule (kustomize's base).
const PROMETHEUS_RULE: &str = "deploy/kustomize/base/prometheusrule.yaml";

/// What precedes the groups in the PrometheusRule.
const RULE_HEADER: &str = "\
# Generated from dashboards/alerts.yaml by `cargo xtask gen`: edit that file, then run it (a
# test fails when the two differ). Add the label your Prometheus's ruleSelector wants.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: bufscope
  labels:
    app.kubernetes.io/name: bufscope
spec:
";

/// Arguments of `cargo xtask gen`.
#[derive(clap::Args, Default)]
pub struct Args {
    /// Only check that the generated files are current (exit non-zero when one is not).
    #[arg(long)]
    pub check: bool,
}

/// Writes (or, with `--check`, compares) every generated file.
pub fn run(a: &Args) -> anyhow::Result<()> {
    let root = workspace_root();
    let alerts =
        std::fs::read_to_string(root.join(ALERTS)).with_context(|| format!("reading {ALERTS}"))?;
    let want = prometheus_rule(&alerts)?;
    let path = root.join(PROMETHEUS_RULE);
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    if have == want {
        eprintln!("xtask gen: {PROMETHEUS_RULE} is current");
    } else if a.check {
        anyhow::bail!("{PROMETHEUS_RULE} is not generated from {ALERTS}: run `cargo xtask gen`");
    } else {
        std::fs::write(&path, want).with_context(|| format!("writing {PROMETHEUS_RULE}"))?;
        eprintln!("xtask gen: wrote {PROMETHEUS_RULE}");
    }
    Ok(())
}

/// The PrometheusRule of `alerts` (the text of alerts.yaml): its `groups:` block, comments
/// before it left out, indented under `spec:`.
pub fn prometheus_rule(alerts: &str) -> anyhow::Result<String> {
    let start = alerts
        .lines()
        .position(|l| l == "groups:")
        .with_context(|| format!("{ALERTS} has no top-level `groups:`"))?;
    let mut out = String::from(RULE_HEADER);
    for l in alerts.lines().skip(start) {
        if !l.trim().is_empty() {
            out.push_str("  ");
        }
        out.push_str(l);
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prometheus_rule_is_generated_from_the_alerts() {
        let root = workspace_root();
        let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap_or_default();
        let want = prometheus_rule(&read(ALERTS)).unwrap_or_default();
        assert!(
            read(PROMETHEUS_RULE) == want,
            "{PROMETHEUS_RULE} is not what {ALERTS} generates: run `cargo xtask gen`"
        );
    }

    #[test]
    fn groups_are_indented_under_spec_and_comments_before_them_dropped() {
        let r = prometheus_rule("# c\ngroups:\n  - name: g\n\n    rules: []\n").unwrap_or_default();
        assert!(
            r.ends_with("spec:\n  groups:\n    - name: g\n\n      rules: []\n"),
            "{r}"
        );
        assert!(prometheus_rule("rules: []\n").is_err());
    }
}
