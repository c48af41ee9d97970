#![allow(clippy::unwrap_used)]
use std::time::Duration;

use bufscope_policy::units::parse_duration;

use super::resolve::decode_key;
use super::values::parse_bandwidth;
use super::*;

const SK: &str = "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=";
const PK: &str = "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=";

fn cli_with(text: &str) -> (Cli, tempfile_path::TempPath) {
    let path = tempfile_path::TempPath::new(text);
    let cli = Cli {
        config: Some(path.0.clone()),
        connect_timeout: Duration::from_secs(10),
        ..Cli::default()
    };
    (cli, path)
}

mod tempfile_path {
    pub struct TempPath(pub std::path::PathBuf);
    impl TempPath {
        pub fn new(text: &str) -> Self {
            static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let p =
                std::env::temp_dir().join(format!("bst-config-{}-{n}.conf", std::process::id()));
            std::fs::write(&p, text).unwrap();
            Self(p)
        }
    }
    impl Drop for TempPath {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

#[test]
fn full_file_parses() {
    let (cli, _p) = cli_with(&format!(
        "# comment\n[Interface]\nPrivateKey = {SK}\nAddress = 10.9.0.1/24, fd09::1/64\nListenPort = 51820\nMTU = 1380\n\
         DNS = 1.1.1.1\n\n[Peer]\nPublicKey = {PK}\nEndpoint = 127.0.0.1:51821\nAllowedIPs = 10.9.0.2/32\n\
         PersistentKeepalive = 25\n\n[Bufscope]\nTransport = tcp\nBufferPolicy = fixed=64K\nTargetBandwidth = 200M\nTargetRtt = 190ms\nInterface = bst9\n"
    ));
    let s = cli.settings().unwrap();
    assert_eq!(s.interface, "bst9");
    assert_eq!(s.addresses.len(), 2);
    assert_eq!(s.listen_port, Some(51820));
    assert_eq!(s.mtu, 1380);
    assert_eq!(s.endpoint, Some("127.0.0.1:51821".parse().unwrap()));
    assert_eq!(s.persistent_keepalive, Some(25));
    assert_eq!(s.transport, TransportKind::Tcp);
    assert_eq!(s.buffer_policy, BufferPolicy::Fixed(65536));
    assert_eq!(
        s.target,
        Some(Target::new(200_000_000, Duration::from_millis(190)))
    );
    assert!(s.allowed_ips.contains("10.9.0.2".parse().unwrap()));
    assert_eq!(s.peer_public_key.as_bytes(), &decode_key("k", PK).unwrap());
}

#[test]
fn flags_override_file() {
    let (mut cli, _p) = cli_with(&format!(
        "[Interface]\nPrivateKey = {SK}\n[Peer]\nPublicKey = {PK}\nAllowedIPs = 10.9.0.2/32\n"
    ));
    cli.transport = Some(TransportKind::Tcp);
    cli.listen_port = Some(4000);
    cli.buffer_policy = Some(BufferPolicy::OsDefault);
    cli.allowed_ips = vec!["10.8.0.0/16".parse().unwrap()];
    let s = cli.settings().unwrap();
    assert_eq!(s.transport, TransportKind::Tcp);
    assert_eq!(s.buffer_policy, BufferPolicy::OsDefault);
    assert!(!s.allowed_ips.contains("10.9.0.2".parse().unwrap()));
    assert!(s.allowed_ips.contains("10.8.1.1".parse().unwrap()));
    assert_eq!(s.interface, DEFAULT_INTERFACE);
    assert_eq!(
        s.mtu, DEFAULT_TCP_MTU,
        "TCP transport defaults to a jumbo inner MTU"
    );
}

#[test]
fn quic_keys_and_defaults() {
    let base = format!(
        "[Interface]\nPrivateKey = {SK}\nListenPort = 51820\n[Peer]\nPublicKey = {PK}\nAllowedIPs = 10.9.0.2/32\n[Bufscope]\nTransport = quic\n"
    );
    let (cli, _p) = cli_with(&base);
    let s = cli.settings().unwrap();
    assert_eq!(s.transport, TransportKind::Quic);
    assert_eq!(s.quic_mode, QuicMode::Datagram);
    assert_eq!(s.congestion, Congestion::Tunnel);
    assert_eq!(s.mtu, DEFAULT_QUIC_DATAGRAM_MTU);
    let (cli, _p) = cli_with(&format!("{base}QuicMode = stream\n"));
    assert_eq!(cli.settings().unwrap().congestion, Congestion::Tunnel);
    let (cli, _p) = cli_with(&format!("{base}QuicMode = stream\nCongestion = BBR\n"));
    let s = cli.settings().unwrap();
    assert_eq!(s.quic_mode, QuicMode::Stream);
    assert_eq!(s.congestion, Congestion::Bbr);
    assert_eq!(
        s.mtu, DEFAULT_TCP_MTU,
        "stream mode: jumbo inner MTU as over TCP"
    );
    let (cli, _p) = cli_with(&format!("{base}Congestion = cubic\n"));
    assert_eq!(cli.settings().unwrap().congestion, Congestion::Cubic);
    // Flags override the file.
    let (mut cli, _p) = cli_with(&format!("{base}QuicMode = stream\n"));
    cli.quic_mode = Some(QuicMode::Datagram);
    assert_eq!(cli.settings().unwrap().quic_mode, QuicMode::Datagram);
    let (cli, _p) = cli_with(&format!("{base}QuicMode = udp\n"));
    let e = format!("{:#}", cli.settings().err().unwrap());
    assert!(e.contains("unknown QUIC mode"), "{e}");
    // Neither an endpoint nor a port: nothing to connect to or listen on.
    let (cli, _p) = cli_with(&base.replace("ListenPort = 51820\n", ""));
    let e = format!("{:#}", cli.settings().err().unwrap());
    assert!(e.contains("QUIC transport needs an Endpoint"), "{e}");
}

#[test]
fn bad_keys_are_named() {
    let (cli, _p) = cli_with(&format!(
        "[Interface]\nPrivateKey = notakey!!\n[Peer]\nPublicKey = {PK}\nAllowedIPs = 10.9.0.2/32\n"
    ));
    let e = format!("{:#}", cli.settings().err().unwrap());
    assert!(e.contains("invalid PrivateKey: not base64"), "{e}");
    let (cli, _p) = cli_with(&format!(
        "[Interface]\nPrivateKey = {SK}\n[Peer]\nPublicKey = AAAA\nAllowedIPs = 10.9.0.2/32\n"
    ));
    let e = format!("{:#}", cli.settings().err().unwrap());
    assert!(
        e.contains("invalid peer PublicKey: 3 bytes instead of 32"),
        "{e}"
    );
}

#[test]
fn file_errors_name_the_line() {
    let (cli, _p) = cli_with("[Interface]\nPrivateKey\n");
    let e = format!("{:#}", cli.settings().err().unwrap());
    assert!(e.contains("line 2"), "{e}");
    let (cli, _p) = cli_with(&format!(
        "[Peer]\nPublicKey = {PK}\n[Peer]\nPublicKey = {PK}\n"
    ));
    let e = format!("{:#}", cli.settings().err().unwrap());
    assert!(e.contains("only one [Peer]"), "{e}");
}

#[test]
fn value_parsers() {
    assert_eq!("recommended".parse(), Ok(BufferPolicy::Recommended));
    assert_eq!("os-default".parse(), Ok(BufferPolicy::OsDefault));
    assert_eq!("fixed=65536".parse(), Ok(BufferPolicy::Fixed(65536)));
    assert_eq!("fixed=4M".parse(), Ok(BufferPolicy::Fixed(4 << 20)));
    assert!("fixed=".parse::<BufferPolicy>().is_err());
    assert!("huge".parse::<BufferPolicy>().is_err());
    assert_eq!(parse_bandwidth("1G"), Ok(1_000_000_000));
    assert_eq!(parse_bandwidth("200Mbit/s"), Ok(200_000_000));
    assert_eq!(parse_duration("190ms"), Ok(Duration::from_millis(190)));
    assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
    assert!(parse_duration("50").is_err(), "a bare number: 50s or 50ms?");
}
