//! The table and the targets, checked against the run.

use std::fmt::Write as _;

use super::{Args, Measured, Policy, QuicFigures, Row, Transfer, Transport, Variant};

/// The run's tables (the main one, then what quinn did in the QUIC rows) and the targets.
pub(super) fn render(rows: &[Row], a: &Args) -> (String, String) {
    let mut table = render_table(rows);
    let quic: Vec<&Row> = rows
        .iter()
        .filter(|r| r.variant.transport().is_quic())
        .collect();
    if !quic.is_empty() {
        table.push_str("\n\nWhat quinn did in the QUIC rows:\n\n");
        table.push_str(&render_quic_details(&quic));
    }
    let mut summary = render_summary(rows, a);
    if !quic.is_empty() {
        summary.push_str(&render_quic_summary(rows, a));
    }
    summary.push_str(&render_loss_summary(rows));
    (table, summary)
}

/// The loss rows' target: no connection closed by the transport, in every row.
fn render_loss_summary(rows: &[Row]) -> String {
    let loss: Vec<&Row> = rows.iter().filter(|r| r.loss.is_some()).collect();
    if loss.is_empty() {
        return String::new();
    }
    let mut closes = 0;
    let mut reconnects = 0;
    let mut failed = 0;
    let mut measured = 0;
    for r in &loss {
        match &r.result {
            Ok(m) => {
                measured += 1;
                if let Some(q) = &m.quic {
                    closes += q.transport_closes;
                    reconnects += q.reconnects;
                }
            }
            Err(_) => failed += 1,
        }
    }
    format!(
        "\nTargets (loss rows):\n- connections closed by the transport in {measured} loss rows: {closes} ({reconnects} reconnects; {failed} rows failed) (target 0) {}\n",
        if closes == 0 && failed == 0 {
            "✓"
        } else {
            "✗"
        }
    )
}

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

/// Cores per Gbit/s, two decimals.
pub(super) fn opt_cores(v: Option<f64>) -> String {
    v.map_or("–".into(), |v| format!("{v:.2}"))
}

pub(super) fn opt_ms(v: Option<f64>) -> String {
    v.map_or("–".into(), |v| format!("{v:.1}"))
}

/// The RTT cell of a row: with its loss on loss rows.
fn row_label(r: &Row) -> String {
    match r.loss {
        Some(l) => format!("{}, {}", rtt_label(r.rtt_ms), l.label()),
        None => rtt_label(r.rtt_ms),
    }
}

fn rtt_label(rtt: u64) -> String {
    if rtt == 0 {
        "≈0 (veth)".into()
    } else {
        format!("{rtt} ms")
    }
}

/// The recommended row of the same RTT, loss and transport.
fn reference<'a>(rows: &'a [Row], row: &Row) -> Option<&'a Measured> {
    let t = row.variant.transport();
    rows.iter()
        .find(|r| {
            r.rtt_ms == row.rtt_ms
                && r.loss == row.loss
                && r.variant == Variant::Bufscope(t, Policy::Recommended)
        })
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
/// bufscope-tunnel's default inner MTU over the TCP transport (`DEFAULT_TCP_MTU`), also
/// QUIC stream mode's.
const INNER_MTU_TCP: f64 = 8920.0;
/// bufscope-tunnel's default inner MTU in QUIC datagram mode (`DEFAULT_QUIC_DATAGRAM_MTU`).
const INNER_MTU_QUIC_DGRAM: f64 = 1380.0;
/// QUIC's UDP payload size (`QUIC_INITIAL_MTU`, also quinn's MTU discovery bound).
const QUIC_UDP_PAYLOAD: f64 = 1452.0;
/// QUIC 1-RTT packet overhead: header byte, connection ID (4 bytes towards the listening
/// side, none towards the connecting side: bufscope-tunnel's choice; this counts the larger),
/// 2-byte packet number (quinn's encoding for a few thousand packets in flight), 16-byte AEAD
/// tag.
const QUIC_PACKET_OVERHEAD: f64 = 1.0 + 4.0 + 2.0 + 16.0;

/// The largest fraction of the emulated link rate (which counts outer IP bytes) that one
/// inner TCP flow can carry: inner TCP payload (MTU − 20 IP − 32 TCP with timestamps) over
/// what crosses the link per inner packet. UDP: + 32 WireGuard + 8 UDP + 20 IP. TCP: the
/// WireGuard packet + 2-byte length prefix rides in outer TCP segments of 1448/1500 bytes.
/// QUIC datagram: + 32 WireGuard + 3 DATAGRAM frame header (type, 2-byte length) + the QUIC
/// packet + 8 UDP + 20 IP. QUIC stream: the framed WireGuard packet rides in STREAM frames
/// (about 10 bytes of frame header) of 1452-byte QUIC packets.
fn payload_ceiling(t: Transport) -> f64 {
    match t {
        Transport::Udp => (INNER_MTU - 52.0) / (INNER_MTU + 60.0),
        Transport::Tcp => (INNER_MTU_TCP - 52.0) / (INNER_MTU_TCP + 34.0) * 1448.0 / 1500.0,
        Transport::QuicDatagram => {
            (INNER_MTU_QUIC_DGRAM - 52.0)
                / (INNER_MTU_QUIC_DGRAM + 32.0 + 3.0 + QUIC_PACKET_OVERHEAD + 28.0)
        }
        Transport::QuicStream => {
            (INNER_MTU_TCP - 52.0) / (INNER_MTU_TCP + 34.0)
                * (QUIC_UDP_PAYLOAD - QUIC_PACKET_OVERHEAD - 10.0)
                / (QUIC_UDP_PAYLOAD + 28.0)
        }
    }
}

/// A target line "`what`: down/up as % of the link (target ≥ 90%, with the ceiling)".
fn link_share(s: &mut String, what: &str, m: &Measured, t: Transport, rate_mbit: u64) {
    let rate = rate_mbit as f64;
    let (d, u) = (m.down.mbit / rate, m.up.mbit / rate);
    let _ = writeln!(
        s,
        "- {what}: down {:.1}%, up {:.1}% of the {rate_mbit} Mbit/s link (target ≥ 90%; header overhead caps one flow at {:.1}% here) {}",
        d * 100.0,
        u * 100.0,
        payload_ceiling(t) * 100.0,
        if d >= 0.9 && u >= 0.9 { "✓" } else { "✗" }
    );
}

const HEADER: [&str; 17] = [
    "RTT",
    "outer",
    "tunnel / buffer policy",
    "outer rcvbuf",
    "idle ms",
    "down Mbit/s",
    "down cores/Gbit/s",
    "down ms",
    "down retr",
    "down rcvbuf drops",
    "up Mbit/s",
    "up cores/Gbit/s",
    "up ms",
    "up retr",
    "up rcvbuf drops",
    "down vs rec.",
    "up vs rec.",
];

/// The table, as Markdown (readable as plain text too).
fn render_table(rows: &[Row]) -> String {
    let lines: Vec<Vec<String>> = rows.iter().map(|r| cells(r, rows, HEADER.len())).collect();
    crate::bench::table(&HEADER, &lines)
}

/// Throughput; for a median of several transfers, with their range.
fn mbit_cell(t: &Transfer) -> String {
    let (lo, hi) = t.spread;
    if hi > lo {
        format!("{:.1} ({:.0}–{:.0})", t.mbit, lo, hi)
    } else {
        format!("{:.1}", t.mbit)
    }
}

/// A row's cells under [`HEADER`]; a failed row says why and leaves `width` cells.
fn cells(r: &Row, rows: &[Row], width: usize) -> Vec<String> {
    let mut cells = vec![
        row_label(r),
        r.variant.transport().name().into(),
        r.variant.label(),
    ];
    match &r.result {
        Ok(m) => {
            let refm = reference(rows, r);
            cells.extend([
                m.rcvbuf.map_or("–".into(), human_bytes),
                opt_ms(m.idle_ms),
                mbit_cell(&m.down),
                opt_cores(m.down.cores_per_gbps),
                opt_ms(m.down.latency_ms),
                m.down.retransmits.to_string(),
                m.down.drops.to_string(),
                mbit_cell(&m.up),
                opt_cores(m.up.cores_per_gbps),
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
            cells.resize(width, String::new());
        }
    }
    cells
}

/// What quinn did in the QUIC rows (from the client's shutdown log), below the main table.
fn render_quic_details(rows: &[&Row]) -> String {
    let header = [
        "RTT",
        "outer",
        "tunnel / buffer policy",
        "cc",
        "dgrams/send (GSO)",
        "dgrams/recv (GRO)",
        "quinn dgram drops",
        "window in effect",
        "reconnects",
        "closed by transport",
    ];
    let lines: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut c = vec![
                row_label(r),
                r.variant.transport().name().into(),
                r.variant.label(),
            ];
            match &r.result {
                Ok(Measured { quic: Some(q), .. }) => {
                    c.extend(quic_cells(r.variant.transport(), q))
                }
                _ => c.resize(header.len(), "–".into()),
            }
            c
        })
        .collect();
    crate::bench::table(&header, &lines)
}

fn quic_cells(t: Transport, q: &QuicFigures) -> [String; 7] {
    let f = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.2}"));
    [
        q.congestion.clone().unwrap_or_else(|| "–".into()),
        f(q.datagrams_per_send),
        f(q.datagrams_per_recv),
        q.quinn_drops.map_or("–".into(), |d| d.to_string()),
        match (t, q.window) {
            (Transport::QuicStream, Some(w)) => format!("≈{}", human_bytes(w)),
            _ => "–".into(),
        },
        q.reconnects.to_string(),
        q.transport_closes.to_string(),
    ]
}

/// The targets of the QUIC and strongest-peer rows, checked against this run (and its UDP rows, if it had them).
/// What quinn's default stream window (1.25 MB, the connection's window in stream mode) allows one flow at
/// 190 ms, in Mbit/s: 1.25 MB × 8 / 0.19 s.
const QUINN_WINDOW_CAP_190_MBIT: f64 = 52.6;

/// The "quinn's windows → policy windows" target: the policy windows ≥ 3× quinn's both ways,
/// and quinn's windows at least half of what they allow (a collapse of the quinn-windows row,
/// such as 1.6 Mbit/s from chunks larger than a stream's credit, is a defect, not a gain).
pub(super) fn quinn_windows_target(
    down_ratio: f64,
    up_ratio: f64,
    quinn_down: f64,
    quinn_up: f64,
) -> bool {
    let floor = QUINN_WINDOW_CAP_190_MBIT / 2.0;
    down_ratio >= 3.0 && up_ratio >= 3.0 && quinn_down >= floor && quinn_up >= floor
}

fn render_quic_summary(rows: &[Row], a: &Args) -> String {
    let get = |rtt: u64, t: Transport, p: Policy| {
        rows.iter()
            .find(|r| r.rtt_ms == rtt && r.loss.is_none() && r.variant == Variant::Bufscope(t, p))
            .and_then(|r| r.result.as_ref().ok())
    };
    let mark = |ok: bool| if ok { "✓" } else { "✗" };
    let mut s = String::from("\nTargets (QUIC transport: windows, link share, ≈0 throughput):\n");
    if let Some(r) = get(190, Transport::QuicStream, Policy::Recommended) {
        let vs = get(190, Transport::QuicStream, Policy::OsDefault).map(|o| {
            (
                r.down.mbit / o.down.mbit.max(1e-9),
                r.up.mbit / o.up.mbit.max(1e-9),
                o,
            )
        });
        link_share(
            &mut s,
            "quic stream, policy windows at 190 ms",
            r,
            Transport::QuicStream,
            a.rate_mbit,
        );
        if let Some((dr, ur, o)) = vs {
            let _ = writeln!(
                s,
                "- quic stream, quinn's windows → policy windows at 190 ms: down {:.1} → {:.1} Mbit/s ({dr:.1}×), up {:.1} → {:.1} ({ur:.1}×) (target ≥ 3×, with quinn's windows at ≥ half the {QUINN_WINDOW_CAP_190_MBIT} Mbit/s their 1.25 MB allows one flow at 190 ms: below that the row is a defect of the tunnel, not the policy's gain) {}",
                o.down.mbit,
                r.down.mbit,
                o.up.mbit,
                r.up.mbit,
                mark(quinn_windows_target(dr, ur, o.down.mbit, o.up.mbit))
            );
        }
    }
    for rtt in [50, 190] {
        if let Some(r) = get(rtt, Transport::QuicDatagram, Policy::Recommended) {
            link_share(
                &mut s,
                &format!("quic datagram at {rtt} ms"),
                r,
                Transport::QuicDatagram,
                a.rate_mbit,
            );
        }
    }
    for t in [Transport::QuicDatagram, Transport::QuicStream] {
        if let Some(r) = get(0, t, Policy::Recommended) {
            let drops = r.down.drops + r.up.drops;
            let udp = get(0, Transport::Udp, Policy::Recommended).map_or_else(
                || "no UDP rows in this run".to_string(),
                |u| {
                    format!(
                        "{:.2}× / {:.2}× the UDP transport's {:.0} / {:.0}",
                        r.down.mbit / u.down.mbit.max(1e-9),
                        r.up.mbit / u.up.mbit.max(1e-9),
                        u.down.mbit,
                        u.up.mbit
                    )
                },
            );
            let _ = writeln!(
                s,
                "- {} recommended at ≈0 (veth): down {:.0}, up {:.0} Mbit/s, outer rcvbuf drops {} ({udp}) (target ≥ 1000 Mbit/s with zero drops) {}",
                t.name(),
                r.down.mbit,
                r.up.mbit,
                drops,
                mark(r.down.mbit >= 1000.0 && r.up.mbit >= 1000.0 && drops == 0)
            );
        }
    }
    s
}

/// The strongest peers, where they ran: no target but at RTT ≈0, the ratio, drops and CPU.
fn render_peer_summary(rows: &[Row], a: &Args) -> String {
    let get = |rtt: u64, v: Variant| {
        rows.iter()
            .find(|r| r.rtt_ms == rtt && r.loss.is_none() && r.variant == v)
            .and_then(|r| r.result.as_ref().ok())
    };
    let mark = |ok: bool| if ok { "✓" } else { "✗" };
    let mut s = String::new();
    for v in [Variant::WireguardGoUpstream, Variant::BoringtunCli] {
        for &rtt in &a.rtts {
            if let (Some(r), Some(p)) = (
                get(rtt, Variant::Bufscope(Transport::Udp, Policy::Recommended)),
                get(rtt, v),
            ) {
                let (d, u) = (
                    r.down.mbit / p.down.mbit.max(1e-9),
                    r.up.mbit / p.up.mbit.max(1e-9),
                );
                let _ = write!(
                    s,
                    "- udp recommended vs {} at {}: down {d:.2}×, up {u:.2}×; outer rcvbuf drops {}+{} vs {}+{}; \
                     cores per Gbit/s down {} vs {}, up {} vs {}",
                    v.label(),
                    rtt_label(rtt),
                    r.down.drops,
                    r.up.drops,
                    p.down.drops,
                    p.up.drops,
                    opt_cores(r.down.cores_per_gbps),
                    opt_cores(p.down.cores_per_gbps),
                    opt_cores(r.up.cores_per_gbps),
                    opt_cores(p.up.cores_per_gbps),
                );
                if rtt == 0 && v == Variant::WireguardGoUpstream {
                    // Ahead in both directions, without drops, as steady, and no dearer per bit.
                    let width = |t: &Transfer| t.spread.1 - t.spread.0;
                    let steady = width(&r.down) <= width(&p.down) && width(&r.up) <= width(&p.up);
                    let cheaper = |x: Option<f64>, y: Option<f64>| match (x, y) {
                        (Some(x), Some(y)) => x <= y,
                        _ => false,
                    };
                    let cpu = cheaper(r.down.cores_per_gbps, p.down.cores_per_gbps)
                        && cheaper(r.up.cores_per_gbps, p.up.cores_per_gbps);
                    let _ = write!(
                        s,
                        "; spread down {:.0} vs {:.0}, up {:.0} vs {:.0} Mbit/s \
                         (targets: ≥ 1.5× both ways {}, zero drops {}, spread no wider {}, cores per Gbit/s no higher {})",
                        width(&r.down),
                        width(&p.down),
                        width(&r.up),
                        width(&p.up),
                        mark(d.min(u) >= 1.5),
                        mark(r.down.drops + r.up.drops == 0),
                        mark(steady),
                        mark(cpu),
                    );
                }
                s.push('\n');
            }
        }
    }
    s
}

/// The targets, checked against this run.
fn render_summary(rows: &[Row], a: &Args) -> String {
    let get = |rtt: u64, v: Variant| {
        rows.iter()
            .find(|r| r.rtt_ms == rtt && r.loss.is_none() && r.variant == v)
            .and_then(|r| r.result.as_ref().ok())
    };
    let mark = |ok: bool| if ok { "✓" } else { "✗" };
    let mut s = String::from(
        "Targets (buffer policy vs the Lightway seed, bufscope-tunnel vs the other tunnels):\n",
    );
    for t in [Transport::Udp, Transport::Tcp] {
        if let Some(m) = get(50, Variant::Bufscope(t, Policy::Recommended)) {
            link_share(
                &mut s,
                &format!("{} recommended at 50 ms", t.name()),
                m,
                t,
                a.rate_mbit,
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
    s.push_str(&render_peer_summary(rows, a));
    s
}
