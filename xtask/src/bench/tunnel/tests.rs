//! Unit tests of the bench's flag parsing (loss rows, transports).

#![allow(clippy::unwrap_used)]
use super::*;
use clap::Parser as _;

#[derive(clap::Parser)]
struct Cli {
    #[command(flatten)]
    a: Args,
}

fn args(extra: &[&str]) -> Args {
    Cli::parse_from([&["bench"][..], extra].concat()).a
}

#[test]
fn loss_rows_are_independent_and_bursty_for_each_rate() {
    let l = parse_losses(&args(&[])).unwrap();
    let got: Vec<(f64, f64)> = l.iter().map(|l| (l.rate, l.burst)).collect();
    assert_eq!(
        got,
        [
            (0.01, 1.0),
            (0.01, 8.0),
            (0.05, 1.0),
            (0.05, 8.0),
            (0.10, 1.0),
            (0.10, 8.0)
        ]
    );
    assert_eq!(l[1].label(), "1% loss, bursts of 8");
    assert_eq!(l[4].label(), "10% loss");
    assert!(parse_losses(&args(&["--loss-pct", ""])).unwrap().is_empty());
    for bad in [
        &["--loss-pct", "0"][..],
        &["--loss-pct", "x"],
        &["--loss-burst", "1"],
    ] {
        assert!(parse_losses(&args(bad)).is_err(), "{bad:?}");
    }
}

#[test]
fn transports_expand_and_dedup() {
    let t = parse_transports(&["quic".into(), "quic-stream".into(), "udp".into()]).unwrap();
    assert_eq!(
        t,
        [
            Transport::QuicDatagram,
            Transport::QuicStream,
            Transport::Udp
        ]
    );
    assert!(parse_transports(&["sctp".into()]).is_err());
}
