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

#[test]
fn quinn_windows_row_that_collapsed_is_not_a_pass() {
    use report::quinn_windows_target as t;
    // 2026-12-06 19:28 run: 1.6 → 180.2 / 181.4 Mbit/s, "115×", a defect of the quinn row.
    assert!(!t(180.2 / 1.6, 181.4 / 1.6, 1.6, 1.6));
    // After the chunk limit: 36.2 / 36.4 → 185.7 / 192.2.
    assert!(t(185.7 / 36.2, 192.2 / 36.4, 36.2, 36.4));
    // Policy windows not 3× better.
    assert!(!t(2.9, 3.5, 50.0, 50.0));
}
