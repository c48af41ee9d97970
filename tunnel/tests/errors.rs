//! Clear one-line errors, exit status 1, for the four mistakes operators make: a bad key, a
//! missing `CAP_NET_ADMIN`, a missing `/dev/net/tun`, an unreachable endpoint.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::Command;

use bufscope_netlab::{Netns, unique_name};
use common::*;

fn good_config(dir: &TempDir, endpoint: &str, bufscope: &[&str]) -> std::path::PathBuf {
    let (ka, kb) = (genkey(), genkey());
    let me = Side::a(&ka, None);
    dir.write(
        "a.conf",
        &config(&me, &kb.public, INNER_B, Some(endpoint), bufscope),
    )
}

#[test]
fn bad_private_key() {
    let dir = TempDir::new();
    let kb = genkey();
    let conf = dir.write(
        "bad.conf",
        &format!(
            "[Interface]\nPrivateKey = c2hvcnQ=\n[Peer]\nPublicKey = {}\nAllowedIPs = 10.0.0.2/32\n",
            kb.public
        ),
    );
    let mut cmd = Command::new(BIN);
    cmd.arg("-c").arg(&conf);
    expect_one_line_error(
        cmd,
        &["invalid PrivateKey", "5 bytes instead of 32", "wg genkey"],
    );

    // A good private key and a bad peer key.
    let good = genkey();
    let conf2 = dir.write(
        "bad2.conf",
        &format!(
            "[Interface]\nPrivateKey = {}\n[Peer]\nPublicKey = not/base64!\nAllowedIPs = 10.0.0.2/32\n",
            good.private
        ),
    );
    let mut cmd2 = Command::new(BIN);
    cmd2.arg("-c").arg(&conf2);
    expect_one_line_error(cmd2, &["invalid peer PublicKey", "not base64"]);
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn missing_cap_net_admin() {
    let dir = TempDir::new();
    let conf = good_config(&dir, "192.0.2.1:51820", &[]);
    let ns = Netns::create(unique_name(PREFIX, "e")).unwrap();
    let mut cmd = ns.command("setpriv");
    cmd.args([
        "--inh-caps=-net_admin",
        "--bounding-set=-net_admin",
        "--",
        BIN,
        "-c",
    ])
    .arg(&conf);
    expect_one_line_error(cmd, &["missing CAP_NET_ADMIN", "setcap cap_net_admin+ep"]);
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn missing_dev_net_tun() {
    let dir = TempDir::new();
    // A reachable endpoint, so that the TUN device is the only thing missing.
    let conf = good_config(&dir, &format!("{OUTER_B}:51820"), &[]);
    let net = Net::new();
    let ns = &net.a;
    // A private mount namespace where /dev/net is an empty tmpfs: /dev/net/tun does not exist
    // for this process only.
    let script = format!(
        "mount -t tmpfs bsttmp /dev/net && exec {BIN} -c {}",
        conf.display()
    );
    let mut cmd = ns.command("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c", &script]);
    expect_one_line_error(cmd, &["TUN device /dev/net/tun is missing", "modprobe tun"]);
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn unreachable_endpoint_udp_and_tcp() {
    let dir = TempDir::new();
    // A namespace with only loopback: no route to 192.0.2.1.
    let ns = Netns::create(unique_name(PREFIX, "e")).unwrap();
    let conf = good_config(&dir, "192.0.2.1:51820", &[]);
    expect_no_route(&ns, &conf, "192.0.2.1:51820");

    let conf = good_config(&dir, "192.0.2.1:51820", &["Transport = tcp"]);
    let mut cmd = ns.command(BIN);
    cmd.arg("-c").arg(&conf);
    let line = expect_one_line_error(
        cmd,
        &[
            "cannot connect to endpoint 192.0.2.1:51820 over TCP",
            "unreachable",
        ],
    );
    // Nothing was left behind: the TUN device went with the process.
    assert!(!ns.ip(["link"]).unwrap().contains("bsttun"), "{line}");
}
