//! QUIC stream mode on a lossy path: two namespaces joined by `bufscope-netlab`'s emulated WAN
//! link (190 ms, no rate limit, 20% random loss each way), the `tunnel` congestion controller,
//! which keeps its window at its floor (7 MiB, about 5,000 packets) whatever it loses, and an
//! inner UDP flood each way that keeps the tunnel's send buffers full: tens of thousands of
//! lost packets scattered over the receivers' reassembly buffers. Alongside, a TCP byte stream
//! of known content each way.
//!
//! quinn closes a connection whose stream receive buffer holds more than 1,024 separate
//! pieces ("too many gaps in stream buffer"). The tunnel that carried its packets in one
//! stream with a 16 MiB window closed its connection here within seconds, three times in a
//! row, and the TCP streams stalled. The tunnel must keep the one connection it made, and
//! every byte of the TCP streams must arrive, in order and intact.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use bufscope_netlab::{Lab, LabConfig, LinkParams};
use common::*;

/// How long each direction sends.
const SEND_FOR: Duration = Duration::from_secs(15);
/// The inner TCP port of the transfers.
const PORT: u16 = 5301;

/// The `i`-th 8-byte word of the test stream (splitmix64 of its index): every offset has its
/// own content, so a lost, repeated or reordered piece shows up as a mismatch.
fn word(i: u64) -> [u8; 8] {
    let mut z = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)).to_le_bytes()
}

/// What one direction's transfer did.
#[derive(Debug, Default)]
struct Transfer {
    sent: u64,
    received: u64,
    /// The first offset whose content was wrong.
    bad: Option<u64>,
    /// A socket error on either side (a stalled tunnel makes the reader time out).
    error: Option<String>,
    /// The longest time the reader waited for data.
    longest_wait: Duration,
}

/// Sends the test stream for `SEND_FOR`, then closes; returns the bytes sent.
fn send(mut s: TcpStream) -> (u64, Option<String>) {
    let mut buf = vec![0u8; 64 << 10];
    let mut next = 0u64;
    let start = Instant::now();
    s.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
    while start.elapsed() < SEND_FOR {
        for (k, chunk) in buf.chunks_exact_mut(8).enumerate() {
            chunk.copy_from_slice(&word(next + k as u64));
        }
        if let Err(e) = s.write_all(&buf) {
            return (next * 8, Some(format!("send: {e}")));
        }
        next += (buf.len() / 8) as u64;
    }
    let e = s.shutdown(std::net::Shutdown::Write).err();
    (next * 8, e.map(|e| format!("shutdown: {e}")))
}

/// How long the reader waits for data before it calls the tunnel stalled: Linux's largest
/// retransmission timeout (`TCP_RTO_MAX`, 120 s) and a little. The inner flow loses packets
/// where the UDP flood overfills the tunnel's TUN device, and its retransmission timer backs
/// off, 1, 2, 4, 8, 16 s…, while its round trip is seconds long: with 30 s the reader once
/// gave up on a flow that was only waiting for its next retransmission (CI, 2026-12-06 22:44
/// UTC, both ends of the connection up, nothing closed). A tunnel that lost data for good
/// never delivers it, whatever the wait.
const STALLED_AFTER: Duration = Duration::from_secs(125);

/// Reads the test stream to its end; returns (bytes read, first offset whose content is
/// wrong, error, the longest wait for data).
fn receive(mut s: TcpStream) -> (u64, Option<u64>, Option<String>, Duration) {
    s.set_read_timeout(Some(STALLED_AFTER)).unwrap();
    let mut buf = vec![0u8; 64 << 10];
    let (mut total, mut bad) = (0u64, None);
    let mut longest = Duration::ZERO;
    loop {
        let t0 = Instant::now();
        let r = s.read(&mut buf);
        longest = longest.max(t0.elapsed());
        let n = match r {
            Ok(n) => n,
            Err(e) => {
                return (
                    total,
                    bad,
                    Some(format!("receive after {total} bytes: {e}")),
                    longest,
                );
            }
        };
        if n == 0 {
            return (total, bad, None, longest);
        }
        for (k, b) in buf[..n].iter().enumerate() {
            let off = total + k as u64;
            if bad.is_none() && *b != word(off / 8)[(off % 8) as usize] {
                bad = Some(off);
            }
        }
        total += n as u64;
    }
}

/// The sender's congestion control: CUBIC (Linux's default; this machine's may be BBR, which
/// paces at what it measured instead of filling the tunnel's buffers as a loss-based flow
/// does).
fn set_cubic(s: &TcpStream) {
    use std::os::fd::AsRawFd as _;
    let name = b"cubic";
    // SAFETY: setsockopt reads `name.len()` bytes from a valid buffer.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            name.as_ptr().cast(),
            name.len() as libc::socklen_t,
        )
    };
    assert_eq!(
        rc,
        0,
        "TCP_CONGESTION cubic: {}",
        std::io::Error::last_os_error()
    );
}

/// One transfer from `from` to `to` (inner addresses), run on threads.
fn transfer(
    from: &bufscope_netlab::Netns,
    to: &bufscope_netlab::Netns,
    to_addr: &str,
) -> std::thread::JoinHandle<Transfer> {
    let addr = format!("{to_addr}:{PORT}");
    let listener = to.run_in(|| TcpListener::bind(&addr)).unwrap().unwrap();
    let client = from.run_in(|| TcpStream::connect(&addr)).unwrap().unwrap();
    set_cubic(&client);
    std::thread::spawn(move || {
        let (server, _) = listener.accept().unwrap();
        let rx = std::thread::spawn(move || receive(server));
        let (sent, send_error) = send(client);
        let (received, bad, receive_error, longest_wait) = rx.join().unwrap();
        Transfer {
            sent,
            received,
            bad,
            error: send_error.or(receive_error),
            longest_wait,
        }
    })
}

/// The lines of a log about connections ending and restarting, and its last lines, for
/// failure messages.
fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    let mut out: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.contains("QUIC connection with") || l.contains("reconnected"))
        .take(10)
        .collect();
    out.push("…");
    out.extend(&lines[lines.len().saturating_sub(5)..]);
    out.join("\n")
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn stream_mode_keeps_its_connection_and_every_byte_under_scattered_loss() {
    let link = LinkParams::unlimited().rtt_ms(190).loss(0.20);
    let lab = Lab::new(LabConfig::wan(PREFIX, link)).unwrap();
    let dir = TempDir::new();
    let (ka, kb) = (genkey(), genkey());
    let lines = [
        "Transport = quic",
        "QuicMode = stream",
        "Congestion = tunnel",
    ];
    let ep = format!("{}:51822", lab.addr_b());
    let ca = dir.write(
        "a.conf",
        &config(&Side::a(&ka, None), &kb.public, INNER_B, Some(&ep), &lines),
    );
    let cb = dir.write(
        "b.conf",
        &config(
            &Side::b(&kb, Some(51822)),
            &ka.public,
            INNER_A,
            None,
            &lines,
        ),
    );
    let tb = Tunnel::start(lab.b(), &cb, dir.path("b.log"), &[]);
    tb.wait_log("listening on udp", Duration::from_secs(10));
    let ta = Tunnel::start(lab.a(), &ca, dir.path("a.log"), &[]);
    wait_ping(lab.a(), INNER_B, Duration::from_secs(15), &[&ta, &tb]);
    let before = lab.stats().unwrap();

    // Both ways at once: each end's receive buffers see the other's losses. Alongside, an
    // inner UDP flood each way at more than the link carries keeps quinn's send buffers full
    // whatever the TCP flows do (a tunnelled flow that does not back off: the worst case for
    // the receiver's reassembly); what the tunnel cannot take is dropped at its TUN device.
    let _server = measure::iperf3_server(lab.b(), INNER_B, 5201).unwrap();
    let mut flood = lab
        .a()
        .command("iperf3")
        .args(["-c", INNER_B, "-u", "-b", "200M", "-l", "8000", "--bidir"])
        .args(["-t", &SEND_FOR.as_secs().to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let up = transfer(lab.a(), lab.b(), INNER_B);
    let down = transfer(lab.b(), lab.a(), INNER_A);
    let (up, down) = (up.join().unwrap(), down.join().unwrap());
    let _ = flood.wait();
    let after = lab.stats().unwrap();
    let lost = (
        after.a_to_b.dropped_loss - before.a_to_b.dropped_loss,
        after.b_to_a.dropped_loss - before.b_to_a.dropped_loss,
    );
    let logs = (ta.log(), tb.log());
    let secs = SEND_FOR.as_secs_f64();
    println!(
        "up {:.0} Mbit/s, down {:.0} Mbit/s; packets lost on the link a->b {}, b->a {}; \
         longest wait for data up {:.1} s, down {:.1} s",
        up.received as f64 * 8.0 / secs / 1e6,
        down.received as f64 * 8.0 / secs / 1e6,
        lost.0,
        lost.1,
        up.longest_wait.as_secs_f64(),
        down.longest_wait.as_secs_f64()
    );
    let tails = format!(
        "client log:\n{}\nlistener log:\n{}",
        tail(&logs.0),
        tail(&logs.1)
    );
    // One connection from start to end: the client never reconnected, the listener accepted
    // once, and nobody closed anything.
    for log in [&logs.0, &logs.1] {
        assert!(!log.contains("too many gaps"), "{tails}");
        assert!(!log.contains("QUIC connection with"), "{tails}");
    }
    assert!(!logs.0.contains("QUIC reconnected"), "{tails}");
    assert_eq!(logs.1.matches("QUIC connection from").count(), 1, "{tails}");
    for (what, t) in [("a->b", up), ("b->a", down)] {
        assert_eq!(t.error, None, "{what}: {t:?}; {tails}");
        assert_eq!(t.bad, None, "{what}: wrong content at that offset; {tails}");
        assert_eq!(t.received, t.sent, "{what}: bytes lost; {tails}");
        assert!(
            t.sent > 1 << 20,
            "{what}: only {} bytes went through; {tails}",
            t.sent
        );
    }
    // The test is only worth something if the link lost far more packets than quinn's gap
    // limit, in both directions.
    assert!(
        lost.0 > 4 * 1024 && lost.1 > 4 * 1024,
        "lost {lost:?}; {tails}"
    );
    // The client's own count, in its shutdown summary.
    let mut ta = ta;
    let mut proc = ta.proc.take().unwrap();
    proc.signal(libc::SIGTERM);
    let out = proc.wait_output(Duration::from_secs(5)).unwrap();
    assert!(out.status.success(), "{}", ta.log());
    let log = ta.log();
    assert!(
        log.contains("QUIC connections: 1 established, 0 reconnects, 0 closed by the transport"),
        "{log}"
    );
}
