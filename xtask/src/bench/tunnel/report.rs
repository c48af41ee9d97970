//! The table and the targets, checked against the run.

use std::fmt::Write as _;

use super::{Args, Measured, Policy, Row, Transport, Variant};

pub(super) fn human_bytes(n: u64) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{}M", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{}K", n >> 10)
    } else if n >= 1 << 20 {
        format!("{:.1}M", n as f64 / f64::from(1 << 20))
    } else {
        n.to_string()
    }
}

pub(super) fn opt_ms(v: Option<f64>) -> String {
    v.map_or("–".into(), |v| format!("{v:.1}"))
}

fn rtt_label(rtt: u64) -> String {
    if rtt == 0 {
        "≈0 (veth)".into()
    } else {
        format!("{rtt} ms")
    }
}

/// The recommended row of the same RTT and transport.
fn reference(rows: &[Row], rtt: u64, t: Transport) -> Option<&Measured> {
    rows.iter()
        .find(|r| r.rtt_ms == rtt && r.variant == Variant::Bufscope(t, Policy::Recommended))
        .and_then(|r| r.result.as_ref().ok())
}

fn ratio(x: f64, of: Option<f64>) -> String {
    match of {
        Some(o) if o > 0.0 => format!("{:.2}×", x / o),
        _ => "–".into(),
    }
}

/// Inner MTU over UDP (bufscope-tunnel's and wireguard-go's default).
const INNER_MTU: f64 = 1420.0;
/// bufscope-tunnel's default inner MTU over the TCP transport (`DEFAULT_TCP_MTU`).
const INNER_MTU_TCP: f64 = 8920.0;

/// The largest fraction of the emulated link rate (which counts outer IP bytes) that one
/// inner TCP flow can carry: inner TCP payload (MTU − 20 IP − 32 TCP with timestamps) over
/// what crosses the link per inner packet. UDP: + 32 WireGuard + 8 UDP + 20 IP. TCP: the
/// WireGuard packet + 2-byte length prefix rides in outer TCP segments of 1448/1500 bytes.
fn payload_ceiling(t: Transport) -> f64 {
    match t {
        Transport::Udp => (INNER_MTU - 52.0) / (INNER_MTU + 60.0),
        Transport::Tcp => (INNER_MTU_TCP - 52.0) / (INNER_MTU_TCP + 34.0) * 1448.0 / 1500.0,
    }
}

/// The table, as Markdown (readable as plain text too).
pub(super) fn render_table(rows: &[Row]) -> String {
    let header = [
        "RTT",
        "outer",
        "tunnel / buffer policy",
        "outer rcvbuf",
        "idle ms",
        "down Mbit/s",
        "down ms",
        "down retr",
        "down rcvbuf drops",
        "up Mbit/s",
        "up ms",
        "up retr",
        "up rcvbuf drops",
        "down vs rec.",
        "up vs rec.",
    ];
    let mut lines: Vec<Vec<String>> = Vec::new();
    for r in rows {
        let mut cells = vec![
            rtt_label(r.rtt_ms),
            r.variant.transport().name().into(),
            r.variant.label(),
        ];
        match &r.result {
            Ok(m) => {
                let refm = reference(rows, r.rtt_ms, r.variant.transport());
                cells.extend([
                    m.rcvbuf.map_or("–".into(), human_bytes),
                    opt_ms(m.idle_ms),
                    format!("{:.1}", m.down.mbit),
                    opt_ms(m.down.latency_ms),
                    m.down.retransmits.to_string(),
                    m.down.drops.to_string(),
                    format!("{:.1}", m.up.mbit),
                    opt_ms(m.up.latency_ms),
                    m.up.retransmits.to_string(),
                    m.up.drops.to_string(),
                    ratio(m.down.mbit, refm.map(|x| x.down.mbit)),
                    ratio(m.up.mbit, refm.map(|x| x.up.mbit)),
                ]);
            }
            Err(e) => {
                let short: String = e
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .chars()
                    .take(80)
                    .collect();
                cells.push(format!("failed: {short}"));
                cells.resize(header.len(), String::new());
            }
        }
        lines.push(cells);
    }
    crate::bench::table(&header, &lines)
}

/// The targets, checked against this run.
pub(super) fn render_summary(rows: &[Row], a: &Args) -> String {
    let get = |rtt: u64, v: Variant| {
        rows.iter()
            .find(|r| r.rtt_ms == rtt && r.variant == v)
            .and_then(|r| r.result.as_ref().ok())
    };
    let mark = |ok: bool| if ok { "✓" } else { "✗" };
    let mut s = String::from("Targets (issue 5):\n");
    for t in [Transport::Udp, Transport::Tcp] {
        if let Some(m) = get(50, Variant::Bufscope(t, Policy::Recommended)) {
            let rate = a.rate_mbit as f64;
            let (d, u) = (m.down.mbit / rate, m.up.mbit / rate);
            let _ = writeln!(
                s,
                "- {} recommended at 50 ms: down {:.1}%, up {:.1}% of the {} Mbit/s link (target ≥ 90%; \
                 header overhead caps one flow at {:.1}% here) {}",
                t.name(),
                d * 100.0,
                u * 100.0,
                a.rate_mbit,
                payload_ceiling(t) * 100.0,
                mark(d >= 0.9 && u >= 0.9)
            );
        }
    }
    if let (Some(f), Some(r)) = (
        get(
            190,
            Variant::Bufscope(Transport::Tcp, Policy::Fixed(a.fixed_bytes)),
        ),
        get(190, Variant::Bufscope(Transport::Tcp, Policy::Recommended)),
    ) {
        let (d, u) = (
            r.down.mbit / f.down.mbit.max(1e-9),
            r.up.mbit / f.up.mbit.max(1e-9),
        );
        let _ = writeln!(
            s,
            "- tcp fixed={} → recommended at 190 ms: down {:.1} → {:.1} Mbit/s ({d:.1}×), up {:.1} → {:.1} Mbit/s ({u:.1}×); \
             seed (Lightway, Linux): down 11.2 → 160.9 (14.3×), up 8.6 → 59.3 (6.9×); target: same order {}",
            human_bytes(a.fixed_bytes),
            f.down.mbit,
            r.down.mbit,
            f.up.mbit,
            r.up.mbit,
            mark(d >= 5.0 && u >= 5.0)
        );
    }
    for &rtt in &a.rtts {
        if let (Some(r), Some(w)) = (
            get(rtt, Variant::Bufscope(Transport::Udp, Policy::Recommended)),
            get(rtt, Variant::WireguardGo),
        ) {
            let (d, u) = (
                r.down.mbit / w.down.mbit.max(1e-9),
                r.up.mbit / w.up.mbit.max(1e-9),
            );
            let wg_drops = w.down.drops + w.up.drops;
            let verdict = if wg_drops < 1000 {
                "(wireguard-go has no thousands of drops here: not a target row)".to_string()
            } else if rtt > 0 {
                // The link caps both: the ratio cannot exceed ceiling × rate / wireguard-go.
                let cap = payload_ceiling(Transport::Udp) * a.rate_mbit as f64;
                format!(
                    "(link-bound: at most {:.2}× / {:.2}× is possible at {} Mbit/s; bufscope drops {})",
                    cap / w.down.mbit.max(1e-9),
                    cap / w.up.mbit.max(1e-9),
                    a.rate_mbit,
                    mark(r.down.drops + r.up.drops == 0)
                )
            } else {
                mark(d.min(u) >= 1.5 && r.down.drops + r.up.drops == 0).to_string()
            };
            let _ = writeln!(
                s,
                "- udp recommended vs wireguard-go at {}: down {d:.2}×, up {u:.2}×; outer rcvbuf drops {}+{} vs {}+{} \
                 (target ≥ 1.5× with zero drops where wireguard-go has thousands) {verdict}",
                rtt_label(rtt),
                r.down.drops,
                r.up.drops,
                w.down.drops,
                w.up.drops,
            );
        }
    }
    s
}
