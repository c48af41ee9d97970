//! The Debian and PyPI packages the tests and benchmarks drive, and installing what is missing
//! (`apt-get`, `pip`).

use std::path::Path;
use std::process::Command;

use anyhow::{Context as _, bail};

use crate::util::{is_root, run_cmd};

/// Debian packages and one binary each provides (the binary is how we tell it is installed).
pub const DEBIAN_PACKAGES: &[(&str, &str)] = &[
    ("iproute2", "/usr/sbin/ip"),
    ("iputils-ping", "/usr/bin/ping"),
    ("iperf3", "/usr/bin/iperf3"),
    ("wireguard-go", "/usr/bin/wireguard-go"),
    ("wireguard-tools", "/usr/bin/wg"),
    ("openvpn", "/usr/sbin/openvpn"),
    // A real resolver whose per-socket finding is checked (integration/tests/findings_live.rs).
    ("unbound", "/usr/sbin/unbound"),
    // A QUIC server (quic-go) and an IKE daemon whose per-socket findings are checked the same
    // way.
    ("caddy", "/usr/bin/caddy"),
    ("strongswan-charon", "/usr/lib/ipsec/charon"),
    ("socat", "/usr/bin/socat"),
    ("prometheus", "/usr/bin/promtool"),
    ("bpftool", "/usr/sbin/bpftool"),
    ("bpftrace", "/usr/bin/bpftrace"),
    ("libcap2-bin", "/usr/sbin/capsh"),
    ("procps", "/usr/bin/pgrep"),
    ("chromium", "/usr/bin/chromium"),
    ("openssl", "/usr/bin/openssl"),
    ("curl", "/usr/bin/curl"),
    // `bufscope top` is tested in a real terminal (integration/tests/top.rs).
    ("tmux", "/usr/bin/tmux"),
    // `kubectl kustomize` renders deploy/kustomize (integration/tests/deploy.rs); the package
    // comes from the cloud SDK apt repository of these machines' image.
    ("kubectl", "/usr/bin/kubectl"),
];

/// PyPI packages the deploy tests' offline validator (deploy/validate.py) imports: Kubernetes
/// OpenAPI schemas per release, and the Prometheus Operator's PodMonitor/ServiceMonitor models.
pub const PIP_PACKAGES: &[(&str, &str)] = &[
    ("kubernetes-validate==1.37.0", "kubernetes_validate"),
    (
        "cloudcoil-models-prometheus-operator==0.80.1.0",
        "cloudcoil.models.prometheus_operator",
    ),
    // The OpenMetrics parser the scrape-truth test checks /metrics with.
    (
        "prometheus-client==0.26.0",
        "prometheus_client.openmetrics.parser",
    ),
];

/// Installs the missing Debian and PyPI packages of the lists above.
pub fn ensure() -> anyhow::Result<()> {
    ensure_debian_packages()?;
    ensure_pip_packages()
}

fn ensure_debian_packages() -> anyhow::Result<()> {
    apt_install(
        &missing_packages(DEBIAN_PACKAGES),
        "run `cargo xtask setup` as root or apt-get install them",
    )
}

/// The packages of `packages` (a Debian package and one file it installs) whose file is
/// missing.
pub(crate) fn missing_packages<'a>(packages: &[(&'a str, &str)]) -> Vec<&'a str> {
    packages
        .iter()
        .filter(|(_, file)| !Path::new(file).exists())
        .map(|(pkg, _)| *pkg)
        .collect()
}

/// Installs the Debian packages `missing` with apt-get (nothing when it is empty); not being
/// root is an error that names them and says `what_to_do`.
pub(crate) fn apt_install(missing: &[&str], what_to_do: &str) -> anyhow::Result<()> {
    if missing.is_empty() {
        return Ok(());
    }
    if !is_root() {
        bail!("missing Debian packages {missing:?}: {what_to_do}");
    }
    run_cmd(Command::new("apt-get").args(["update", "-qq"]))?;
    run_cmd(
        Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(missing),
    )
}

fn ensure_pip_packages() -> anyhow::Result<()> {
    let missing: Vec<&str> = PIP_PACKAGES
        .iter()
        .filter(|(_, module)| {
            !Command::new("python3")
                .args(["-c", &format!("import {module}")])
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .map(|(req, _)| *req)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    run_cmd(
        Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(&missing),
    )
    .context("pip install of the deploy validator's packages failed")
}
