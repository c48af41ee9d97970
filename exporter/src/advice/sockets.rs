//! Per-socket findings: one per socket and buffer direction, telling the story of that buffer
//! (every call in order), the verdict with numbers (drops/s; for TCP the throughput ceiling
//! the locked buffer implies at the RTT sock_diag measured), where the fix can be made and
//! what it costs. The verdict comes from what the socket does, never from the call alone.

use std::collections::BTreeMap;
use std::sync::Arc;

use bufscope_api::{Call, Limit, Resolution, Story, Verdict};
use bufscope_common::{SOCK_RCVBUF_LOCK, SOCK_SNDBUF_LOCK, sockopt_flags};
use bufscope_policy::Direction;

use super::fixes;
use super::history::{History, Observation};
use super::*;

/// TCP states as `sk_state` has them.
const TCP_ESTABLISHED: u8 = 1;
const TCP_CLOSE: u8 = 7;
const TCP_LISTEN: u8 = 10;

/// The share of the time the send buffer limited a connection (`tcpi_sndbuf_limited`) from
/// which a send lock costs now.
const SNDBUF_LIMITED_COSTING: f64 = 0.1;

/// Per-socket findings listed per (process, kind) at most; the rest are counted on the
/// first (`sockets`) and named in its summary.
pub const MAX_PER_KIND: usize = 16;

/// Drops of one socket for buffer reasons (receive side).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Dropped {
    pub packets: u64,
    pub rate: f64,
    pub rcvbuf: i32,
}

/// One socket's buffer in one direction, as the rules see it. It owns what it reads (its
/// story is shared with the setsockopt room): a finding kept as gone or resolved outlives the
/// evaluation that made it and is told from it later.
#[derive(Clone, Debug)]
pub(super) struct Candidate {
    pub owner: ProcRef,
    pub inode: u64,
    pub proto: Proto,
    pub netns: u32,
    pub dir: Direction,
    pub story: Option<Arc<SocketStory>>,
    pub drops: Dropped,
}

impl Candidate {
    fn calls(&self) -> Vec<&CallRec> {
        let Some(s) = self.story.as_deref() else {
            return Vec::new();
        };
        s.calls()
            .filter(|c| match c.option {
                BufOption::BufLock => true,
                o => o.is_send() == (self.dir == Direction::Send),
            })
            .collect()
    }

    /// The buffer's size now.
    pub fn bytes(&self) -> i64 {
        match (self.story.as_deref(), self.dir) {
            (Some(s), Direction::Receive) if s.rcvbuf > 0 => s.rcvbuf as i64,
            (Some(s), Direction::Send) if s.sndbuf > 0 => s.sndbuf as i64,
            _ => self.drops.rcvbuf.max(0) as i64,
        }
    }

    fn lock_bit(&self) -> u8 {
        match self.dir {
            Direction::Receive => SOCK_RCVBUF_LOCK,
            Direction::Send => SOCK_SNDBUF_LOCK,
        }
    }

    fn locked(&self) -> bool {
        self.proto == Proto::Tcp
            && self
                .story
                .as_deref()
                .is_some_and(|s| s.locks & self.lock_bit() != 0)
    }
}

/// The host's side of a per-socket finding: the limits and the window it was judged with.
#[derive(Clone, Copy, Debug)]
pub(super) struct HostLimits {
    pub rmem_max: Option<i64>,
    pub wmem_max: Option<i64>,
    pub tcp_rmem_max: i64,
    pub tcp_wmem_max: i64,
    pub udp_sockets: Option<u64>,
    pub window: Duration,
}

impl HostLimits {
    pub fn of(inputs: &Inputs) -> Self {
        Self {
            rmem_max: inputs.rmem_max,
            wmem_max: inputs.wmem_max,
            tcp_rmem_max: inputs.tcp_rmem_max,
            tcp_wmem_max: inputs.tcp_wmem_max,
            udp_sockets: inputs.udp_sockets,
            window: inputs.window,
        }
    }
}

/// What a per-socket finding is told with besides its socket: the host's limits, its
/// namespace's, its process (shared by the process's findings) and how many sockets like it
/// the process has.
#[derive(Clone, Debug)]
pub(super) struct Scene {
    pub host: HostLimits,
    pub ns: Option<NsLimits>,
    pub process: Arc<ProcessRef>,
    pub sockets_like: u64,
}

/// The socket's sock_diag rates between its last two reads.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct TcpRates {
    pub rtt_us: u32,
    pub observed_bps: f64,
    pub sndbuf_limited: f64,
    pub rcv_wscale: u8,
    pub wscale_ok: bool,
    /// Of the memory the send queue charges against the send buffer, the share that is
    /// payload (see [`payload_fraction`]); `None` when no read saw a filled queue.
    pub payload_fraction: Option<f64>,
}

/// The mean fill of a send queue whose writer the kernel wakes when a third of the buffer is
/// free (`sk_stream_write_space` → `sk_stream_is_writeable`: free ≥ queued / 2) and which ACKs
/// drain steadily: between 2/3 and all of the buffer, 5/6 on average.
pub(super) const SNDBUF_REFILL_MEAN: f64 = 5.0 / 6.0;

/// The share of the send buffer the kernel lets payload use, from one sock_diag read.
///
/// `tcp_sendmsg` stops queueing when `sk_wmem_queued` (every queued skb at its `truesize`:
/// payload plus the skb's own memory) reaches `sk_sndbuf`, so the payload a locked buffer
/// keeps in flight is the buffer times payload ÷ `wmem_queued`. The payload is what the queue
/// holds by sequence numbers (in flight plus not sent, from `tcp_info`). Read only when the
/// queue held at least half the buffer: a nearly empty queue's few skbs say little.
pub(super) fn payload_fraction(d: &crate::kernel::sock_diag::TcpDiag) -> Option<f64> {
    let queued = u64::from(d.wmem_queued);
    if queued == 0 || d.sndbuf == 0 || 2 * queued < u64::from(d.sndbuf) {
        return None;
    }
    let payload = d.queued_payload()?;
    (payload > 0).then(|| (payload as f64 / queued as f64).min(1.0))
}

fn tcp_rates(s: &SocketStory, dir: Direction) -> Option<TcpRates> {
    let last = s.tcp.last()?;
    let d = last.diag;
    let rtt_us = match dir {
        Direction::Receive if d.rcv_rtt_us > 0 => d.rcv_rtt_us,
        _ => d.rtt_us,
    };
    let mut r = TcpRates {
        rtt_us,
        rcv_wscale: d.rcv_wscale,
        wscale_ok: d.wscale_ok,
        payload_fraction: s.tcp.iter().rev().find_map(|t| payload_fraction(&t.diag)),
        ..TcpRates::default()
    };
    if let [a, b] = s.tcp.as_slice() {
        let dt = b.at.duration_since(a.at).as_secs_f64();
        if dt > 0.0 {
            let bytes = match dir {
                Direction::Send => b.diag.bytes_acked.saturating_sub(a.diag.bytes_acked),
                Direction::Receive => b.diag.bytes_received.saturating_sub(a.diag.bytes_received),
            };
            r.observed_bps = bytes as f64 * 8.0 / dt;
            r.sndbuf_limited = b
                .diag
                .sndbuf_limited_us
                .saturating_sub(a.diag.sndbuf_limited_us) as f64
                / (dt * 1e6);
        }
    }
    Some(r)
}

/// The words for one call.
fn call_notes(c: &CallRec, refused_before: bool, floors_hint: bool) -> Vec<&'static str> {
    let mut n = Vec::new();
    let force = matches!(c.option, BufOption::RcvbufForce | BufOption::SndbufForce);
    if force {
        n.push("force");
    }
    if c.ret == -libc::EPERM {
        n.push("refused");
    }
    if !force && c.option != BufOption::BufLock && refused_before {
        n.push("fallback");
    }
    if c.clamped {
        n.push("clamped");
    }
    if c.ret == 0
        && floors_hint
        && c.requested >= 0
        && (c.effective as i64) > 2 * c.requested as i64
    {
        n.push("above_minimum");
    }
    let bit_set = |bit: u8| c.locks_before & bit == 0 && c.locks_after & bit != 0;
    if c.ret == 0 && (bit_set(SOCK_RCVBUF_LOCK) || bit_set(SOCK_SNDBUF_LOCK)) {
        n.push("locked");
    }
    match c.state {
        TCP_ESTABLISHED => n.push("established"),
        TCP_LISTEN => n.push("listening"),
        TCP_CLOSE => n.push("before_connect"),
        _ => {}
    }
    if c.flags & sockopt_flags::GUARD_RAISED != 0 {
        n.push("guard_raised");
    }
    if c.flags & sockopt_flags::GUARD_SKIPPED != 0 {
        n.push("guard_skipped");
    }
    n
}

fn errno_name(ret: i32) -> Option<&'static str> {
    match -ret {
        0 => None,
        libc::EPERM => Some("EPERM"),
        libc::EINVAL => Some("EINVAL"),
        libc::ENOPROTOOPT => Some("ENOPROTOOPT"),
        _ => Some("error"),
    }
}

/// The story's calls as the API has them, with the facts of each.
fn story_calls(calls: &[&CallRec], proto: Proto) -> Vec<Call<&'static str>> {
    let mut refused = false;
    calls
        .iter()
        .map(|c| {
            let notes = call_notes(c, refused, true)
                .into_iter()
                .filter(|n| {
                    proto == Proto::Tcp
                        || !matches!(*n, "established" | "listening" | "before_connect")
                })
                .collect();
            if c.ret == -libc::EPERM {
                refused = true;
            }
            Call {
                at: c.at,
                option: c.option.as_str(),
                requested: c.requested as i64,
                effective: c.effective as i64,
                error: errno_name(c.ret),
                notes,
            }
        })
        .collect()
}

/// One line for the calls: runs of the same option told once ("23 SO_RCVBUF calls, 7.0 MiB
/// down to 4.0 MiB, 22 clamped").
pub(super) fn narrate(calls: &[Call<&'static str>], omitted: u64) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < calls.len() {
        let mut j = i + 1;
        while j < calls.len()
            && calls[j].option == calls[i].option
            && calls[j].error == calls[i].error
        {
            j += 1;
        }
        let run = &calls[i..j];
        let c = &run[0];
        let tag = |c: &Call<&'static str>| -> String {
            let mut t = Vec::new();
            for n in &c.notes {
                match *n {
                    "refused" => t.push("refused: EPERM, no CAP_NET_ADMIN".to_string()),
                    "fallback" => t.push("the fallback".to_string()),
                    "clamped" => t.push("clamped".to_string()),
                    "above_minimum" => {
                        t.push("below the kernel's minimum: granted more than asked".to_string())
                    }
                    "established" => t.push("on the established connection".to_string()),
                    "listening" => {
                        t.push("on the listener (accepted connections inherit it)".to_string())
                    }
                    "before_connect" => t.push("before connect()/listen()".to_string()),
                    "guard_raised" => t.push("raised by the guard".to_string()),
                    "guard_skipped" => t.push("skipped by the guard".to_string()),
                    _ => {}
                }
            }
            if t.is_empty() {
                String::new()
            } else {
                format!(" ({})", t.join(", "))
            }
        };
        if run.len() == 1 {
            let got = if c.error.is_some() {
                String::new()
            } else {
                format!(" -> {}", kib(c.effective as f64))
            };
            parts.push(format!(
                "{} {}{got}{}",
                c.option,
                size_text(c.requested),
                tag(c)
            ));
        } else {
            let clamped = run.iter().filter(|c| c.notes.contains(&"clamped")).count();
            let hi = run.iter().map(|c| c.requested).max().unwrap_or(0);
            let lo = run.iter().map(|c| c.requested).min().unwrap_or(0);
            let last = &run[run.len() - 1];
            let mut s = format!(
                "{} {} calls, {} to {}",
                run.len(),
                c.option,
                size_text(hi),
                size_text(lo)
            );
            if clamped > 0 {
                s.push_str(&format!(", {clamped} clamped"));
            }
            if c.error.is_none() {
                s.push_str(&format!(", the last -> {}", kib(last.effective as f64)));
            } else {
                s.push_str(" (each refused: EPERM)");
            }
            parts.push(s);
        }
        i = j;
    }
    let mut s = parts.join("; then ");
    if omitted > 0 {
        s.push_str(&format!(" ({omitted} calls between not kept)"));
    }
    s
}

/// A request as a person reads it (bytes below 1 KiB, negative values as they are).
fn size_text(v: i64) -> String {
    if v < 0 {
        format!("{v} (\"as much as allowed\")")
    } else if v < 1024 {
        format!("{v} B")
    } else {
        kib(v as f64)
    }
}

/// What kind of finding a candidate is, if any.
fn kind_of(c: &Candidate, calls: &[&CallRec]) -> Option<&'static str> {
    let clamped = calls.iter().any(|c| c.clamped);
    let refused = calls.iter().any(|c| c.ret == -libc::EPERM);
    match c.dir {
        Direction::Receive if c.proto == Proto::Udp && c.drops.packets > 0 => {
            Some(kind::UDP_RCVBUF_DROPS)
        }
        Direction::Receive if c.locked() => Some(kind::TCP_RCVBUF_LOCK),
        Direction::Send if c.locked() => Some(kind::TCP_SNDBUF_LOCK),
        Direction::Receive if clamped => Some(kind::RCVBUF_CLAMPED),
        Direction::Send if clamped => Some(kind::SNDBUF_CLAMPED),
        _ if refused && !reached_after_refusal(calls) => Some(kind::FORCE_REFUSED),
        _ => None,
    }
}

/// A refused FORCE whose size a later call got anyway (the fallback was enough) costs nothing.
fn reached_after_refusal(calls: &[&CallRec]) -> bool {
    let Some(pos) = calls.iter().rposition(|c| c.ret == -libc::EPERM) else {
        return true;
    };
    let want = calls[pos].requested.max(0) as i64;
    calls[pos + 1..]
        .iter()
        .any(|c| c.ret == 0 && c.effective as i64 >= 2 * want)
}

/// The verdict, its severity, and the numbers behind them.
pub(super) struct Judged {
    pub verdict: Verdict,
    pub severity: Severity,
    pub evidence: Vec<(&'static str, f64)>,
    /// What it costs (or why it costs nothing), in words.
    pub cost: String,
}

fn judge_drops(rate: f64, total: u64, window: Duration, judging_since: Option<u64>) -> Judged {
    let mut evidence = vec![("drops_total", total as f64), ("drops_per_second", rate)];
    if let Some(s) = judging_since {
        evidence.push(("seconds_since_change", s as f64));
    }
    if rate > 0.0 {
        Judged {
            verdict: Verdict::Costing,
            severity: drop_severity(rate),
            evidence,
            cost: if judging_since.is_some() {
                format!(
                    "still dropping {} since the buffer changed",
                    drop_rate_text(rate, window)
                )
            } else if rate >= SUSTAINED_DROPS_PER_SECOND {
                format!(
                    "dropping {} over the last {}s",
                    drop_rate_text(rate, window),
                    window.as_secs()
                )
            } else {
                format!(
                    "dropped {} (sporadic; {total} in total)",
                    drop_rate_text(rate, window)
                )
            },
        }
    } else {
        Judged {
            verdict: Verdict::Benign,
            severity: Severity::Info,
            evidence,
            cost: if total > 0 {
                format!(
                    "no drops in the last {}s ({total} before)",
                    window.as_secs()
                )
            } else {
                "no drops at the observed rate".to_string()
            },
        }
    }
}

fn judge_tcp(c: &Candidate, host: &HostLimits) -> Judged {
    let bytes = c.bytes();
    let Some(r) = c.story.as_deref().and_then(|s| tcp_rates(s, c.dir)) else {
        let why = c
            .story
            .as_deref()
            .and_then(|s| s.tcp_error.clone())
            .unwrap_or_else(|| "not read yet".to_string());
        return Judged {
            verdict: Verdict::Benign,
            severity: Severity::Info,
            evidence: vec![(bytes_key(c.dir), bytes as f64)],
            cost: format!("no RTT measured (sock_diag: {why}): nothing shows it costs now"),
        };
    };
    let rtt = r.rtt_us.max(1) as f64 / 1e6;
    // Send: the payload share of the locked buffer may be in flight per RTT (the rest is the
    // queued skbs' overhead; the whole buffer when no read measured the share). Receive: about
    // half of it is advertised as window; a shrunk scale caps the window at 65535 << scale.
    let fraction = match c.dir {
        Direction::Send => r.payload_fraction,
        Direction::Receive => None,
    };
    // With the share measured, the writer's refill is counted too: the kernel wakes a writer
    // waiting for space (blocking send, poll/epoll) only once a third of the buffer is free
    // (`sk_stream_min_wspace`), so the queue swings between 2/3 and all of it as ACKs drain
    // it: 5/6 of it on average.
    let mut cap = match c.dir {
        Direction::Send => match fraction {
            Some(f) => bytes as f64 * f * SNDBUF_REFILL_MEAN * 8.0 / rtt,
            None => bytes as f64 * 8.0 / rtt,
        },
        Direction::Receive => bytes as f64 / 2.0 * 8.0 / rtt,
    };
    let mut evidence = vec![
        (bytes_key(c.dir), bytes as f64),
        ("rtt_us", r.rtt_us as f64),
    ];
    let expected =
        crate::signals::tcp_state::expected_wscale(host.tcp_rmem_max, host.rmem_max.unwrap_or(0));
    let shrunk = c.dir == Direction::Receive && r.wscale_ok && r.rcv_wscale < expected;
    if c.dir == Direction::Receive && r.wscale_ok {
        evidence.push(("wscale", r.rcv_wscale as f64));
        evidence.push(("wscale_expected", expected as f64));
        if shrunk {
            cap = cap.min((65535u64 << r.rcv_wscale.min(14)) as f64 * 8.0 / rtt);
        }
    }
    evidence.push(("throughput_ceiling_bps", cap));
    evidence.push(("observed_bps", r.observed_bps));
    if c.dir == Direction::Send {
        evidence.push(("sndbuf_limited_ratio", r.sndbuf_limited));
        if let Some(f) = fraction {
            evidence.push(("sndbuf_payload_ratio", f));
        }
    }
    let at_ceiling = r.observed_bps >= 0.8 * cap;
    let limited = c.dir == Direction::Send && r.sndbuf_limited >= SNDBUF_LIMITED_COSTING;
    let same_host = r.rtt_us < SAME_HOST_RTT_US;
    let what = match c.dir {
        Direction::Send => "send",
        Direction::Receive => "receive",
    };
    let ceiling = format!(
        "a locked {} {what} buffer{}{} allows ~{} at the measured RTT of {}",
        kib(bytes as f64),
        match fraction {
            Some(f) => format!(
                " (the kernel's queue is {:.0}% payload, the rest skb overhead, and refills \
                 from 2/3 full)",
                f * 100.0
            ),
            None => String::new(),
        },
        if shrunk {
            format!(
                " and window scale {} (the kernel would pick {expected})",
                r.rcv_wscale
            )
        } else {
            String::new()
        },
        mbit(cap),
        rtt_text(r.rtt_us)
    );
    if !same_host && (at_ceiling || limited) {
        Judged {
            verdict: Verdict::Costing,
            severity: Severity::Critical,
            evidence,
            cost: format!(
                "costs throughput now: {ceiling}, and the connection runs at {}{}",
                mbit(r.observed_bps),
                if limited {
                    format!(
                        " (the kernel counted {:.0}% of the time limited by the send buffer)",
                        r.sndbuf_limited * 100.0
                    )
                } else {
                    String::new()
                }
            ),
        }
    } else {
        Judged {
            verdict: Verdict::Benign,
            severity: Severity::Info,
            evidence,
            cost: if same_host {
                format!(
                    "costs nothing at this RTT ({}, the same host); on a {} ms path it would cap the connection at ~{}",
                    rtt_text(r.rtt_us),
                    WAN_RTT.as_millis(),
                    mbit(cap * rtt / WAN_RTT.as_secs_f64())
                )
            } else {
                format!(
                    "below its ceiling now: {ceiling} (observed {})",
                    mbit(r.observed_bps)
                )
            },
        }
    }
}

fn bytes_key(dir: Direction) -> &'static str {
    match dir {
        Direction::Receive => "rcvbuf_bytes",
        Direction::Send => "sndbuf_bytes",
    }
}

/// Every per-socket candidate: each story's directions, and UDP sockets that dropped.
pub(super) fn candidates(inputs: &Inputs) -> Vec<Candidate> {
    let mut drops: BTreeMap<u64, (ProcRef, Dropped, u32)> = BTreeMap::new();
    for d in &inputs.drops {
        let full = matches!(&*d.reason, "SOCKET_RCVBUFF" | "PROTO_MEM");
        if d.proto != Proto::Udp || d.inode == 0 || !full {
            continue;
        }
        let Some(o) = d.owner else { continue };
        let e = drops
            .entry(d.inode)
            .or_insert((o, Dropped::default(), d.netns));
        e.1.packets += d.packets;
        e.1.rate += d.rate;
        e.1.rcvbuf = e.1.rcvbuf.max(d.rcvbuf);
    }
    let mut out = Vec::new();
    for s in &inputs.stories {
        for dir in [Direction::Receive, Direction::Send] {
            let dropped = match dir {
                Direction::Receive => drops.remove(&s.inode).map(|d| d.1).unwrap_or_default(),
                Direction::Send => Dropped::default(),
            };
            out.push(Candidate {
                owner: s.owner,
                inode: s.inode,
                proto: s.proto,
                netns: s.netns,
                dir,
                story: Some(s.clone()),
                drops: dropped,
            });
        }
    }
    // Sockets that drop but were never sized: their namespace is the drops' own.
    for (inode, (owner, d, netns)) in drops {
        out.push(Candidate {
            owner,
            inode,
            proto: Proto::Udp,
            netns,
            dir: Direction::Receive,
            story: None,
            drops: d,
        });
    }
    out
}

/// What a verdict was judged from, kept to tell it again ([`SocketFinding::render`]).
#[derive(Clone, Copy, Debug)]
pub(super) enum Judgement {
    /// Drops/s (over the window, or since the buffer changed) and the seconds since it did.
    Drops {
        rate: f64,
        since_change: Option<u64>,
    },
    /// A locked TCP buffer: judged from the story's sock_diag reads.
    Tcp,
}

/// What the lifecycle made of a finding in the evaluation that showed it (`history.rs`).
#[derive(Clone, Debug)]
pub(super) enum Settled {
    /// The buffer changed this long ago (seconds): judged resolved after [`RESOLVE_AFTER`]
    /// without drops.
    ///
    /// [`RESOLVE_AFTER`]: super::history::RESOLVE_AFTER
    Changing(u64),
    /// A larger buffer stopped the drops.
    Resized(Box<Resolution>),
}

/// What became of a finding's socket after it was last shown (`history.rs`).
#[derive(Clone, Debug)]
pub(super) enum Fate {
    /// It closed while it cost; nothing of its program replaced it yet: its last numbers and
    /// when it was last seen.
    Gone(bufscope_api::Snapshot, u64),
    /// Its program's new socket does not cost.
    Restarted(Box<Resolution>),
}

/// One per-socket finding as the evaluation and the history keep it: numbers, enums and
/// shared references, no text. Its words, story and fixes are told by
/// [`SocketFinding::render`], only where a finding is served (`/api/v1/findings`): `/metrics`
/// needs its process, kind and severity only, and 10,000 sockets' findings told in full took
/// ≈40 MB per copy.
#[derive(Clone, Debug)]
pub struct SocketFinding {
    pub(super) cand: Candidate,
    pub(super) scene: Arc<Scene>,
    pub(super) kind: &'static str,
    pub(super) judged: Judgement,
    pub(super) verdict: Verdict,
    pub(super) severity: Severity,
    /// `drops_per_second` as the evidence shows it (None: a kind without drops).
    pub(super) rate: Option<f64>,
    /// `observed_bps` as the evidence shows it (TCP locks; 0 otherwise).
    pub(super) observed_bps: f64,
    /// Drops total and per second shown instead of the judged ones: a closed socket's
    /// finding that keeps the story it had tells this evaluation's drops.
    pub(super) drops_shown: Option<(f64, f64)>,
    pub(super) settled: Option<Settled>,
    pub(super) fate: Option<Fate>,
    pub(super) since: u64,
    pub(super) changed_at: u64,
}

/// A per-socket finding as an evaluation lists it: shared with the history, with what only
/// the list says.
#[derive(Clone, Debug)]
pub(super) struct Listed {
    pub finding: Arc<SocketFinding>,
    /// Findings of this kind on its process, and whether it is the first of them (which
    /// names how many more there are); none for gone and resolved ones.
    pub group: Option<(u64, bool)>,
    /// What the guard does about it (one text per process and rule).
    pub guard: Option<Arc<str>>,
}

impl Listed {
    /// A gone or resolved finding the history keeps.
    pub fn kept(finding: Arc<SocketFinding>) -> Self {
        Self {
            finding,
            group: None,
            guard: None,
        }
    }

    /// The finding as `/api/v1/findings` shows it.
    pub fn render(&self) -> Finding {
        let mut f = self.finding.render();
        if let Some((n, first)) = self.group {
            f.evidence.insert("sockets", n as f64);
            if first && n > MAX_PER_KIND as u64 {
                f.summary.push_str(&format!(
                    " ({} more sockets of this process have this finding; the {MAX_PER_KIND} costliest are listed)",
                    n - MAX_PER_KIND as u64
                ));
            }
        }
        f.guard = self.guard.as_deref().map(str::to_string);
        f
    }
}

impl SocketFinding {
    /// Its process.
    pub fn pid(&self) -> u32 {
        self.scene.process.pid
    }

    /// Its kind.
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// Its severity.
    pub fn severity(&self) -> Severity {
        self.severity
    }

    /// Its verdict.
    pub fn verdict(&self) -> Verdict {
        self.verdict
    }

    /// Whether its story has calls (a socket whose story the setsockopt room forgot does not).
    pub(super) fn told(&self) -> bool {
        !self.cand.calls().is_empty()
    }

    /// `drops_per_second` as its evidence shows it (0 without).
    pub(super) fn drops_per_second(&self) -> f64 {
        self.rate.unwrap_or(0.0)
    }

    /// What it costs, for ranking within a (process, kind).
    fn cost(&self) -> f64 {
        self.rate.unwrap_or(0.0) + self.observed_bps / 1e9
    }

    fn judge(&self) -> Judged {
        match self.judged {
            Judgement::Drops { rate, since_change } => judge_drops(
                rate,
                self.cand.drops.packets,
                self.scene.host.window,
                since_change,
            ),
            Judgement::Tcp => judge_tcp(&self.cand, &self.scene.host),
        }
    }

    /// The finding as `/api/v1/findings` shows it.
    pub fn render(&self) -> Finding {
        let calls = self.cand.calls();
        let mut f = finding(&self.scene, &self.cand, self.kind, &calls, self.judge());
        if let Some((total, rate)) = self.drops_shown {
            f.evidence.insert("drops_total", total);
            f.evidence.insert("drops_per_second", rate);
        }
        match &self.settled {
            Some(Settled::Resized(r)) => history::tell_resolved(&mut f, Resolution::clone(r)),
            Some(Settled::Changing(since)) => f.summary.push_str(&format!(
                " (the buffer changed {since}s ago: called resolved after {}s without drops)",
                history::RESOLVE_AFTER
            )),
            None => {}
        }
        match &self.fate {
            Some(Fate::Gone(before, last_seen)) => history::tell_gone(&mut f, before, *last_seen),
            Some(Fate::Restarted(r)) => history::tell_resolved(&mut f, Resolution::clone(r)),
            None => {}
        }
        f.verdict = Some(self.verdict);
        f.severity = self.severity;
        f.since = self.since;
        f.changed_at = self.changed_at;
        f
    }
}

/// The per-socket findings, with their lifecycle (first seen, resolved) from `history`.
pub(super) fn socket_findings(b: &mut Builder<'_>, history: &mut History, now: u64) {
    let inputs = b.inputs;
    let host = HostLimits::of(inputs);
    let cands = candidates(inputs);
    let known: std::collections::HashSet<u64> = cands.iter().map(|c| c.inode).collect();
    let mut made: Vec<Arc<SocketFinding>> = Vec::new();
    for c in cands {
        let kind = kind_of(&c, &c.calls());
        let obs = Observation {
            pid: c.owner.tgid,
            inode: c.inode,
            program: b.program(&c.owner),
            proto: c.proto,
            dir: c.dir,
            bytes: c.bytes(),
            drops_total: c.drops.packets,
            window_rate: c.drops.rate,
            kind,
        };
        let Some(kind) = kind else {
            history.observe_quiet(obs, now);
            continue;
        };
        let since_change = history.seconds_since_change(&obs, now);
        let (judged, j) = if kind == kind::TCP_RCVBUF_LOCK || kind == kind::TCP_SNDBUF_LOCK {
            (Judgement::Tcp, Figures::of(&judge_tcp(&c, &host)))
        } else {
            let rate = history.rate(&obs, now);
            (
                Judgement::Drops { rate, since_change },
                Figures::drops(rate),
            )
        };
        let f = SocketFinding {
            scene: b.scene(&c, host),
            cand: c,
            kind,
            judged,
            verdict: j.verdict,
            severity: j.severity,
            rate: j.rate,
            observed_bps: j.observed_bps,
            drops_shown: None,
            settled: None,
            fate: None,
            since: now,
            changed_at: now,
        };
        // Settled one by one: the evaluation holds each finding once, shared with the
        // history.
        made.push(history.settle(f, &obs, now));
    }
    // Live sockets of programs whose costing socket is gone: a restart's new socket, which
    // the rules see nowhere else when the program never sizes it.
    for l in inputs.live.iter().filter(|l| !known.contains(&l.inode)) {
        for (dir, bytes) in [(Direction::Receive, l.rcvbuf), (Direction::Send, l.sndbuf)] {
            history.observe_quiet(
                Observation {
                    pid: l.owner.tgid,
                    inode: l.inode,
                    program: b.program(&l.owner),
                    proto: l.proto,
                    dir,
                    bytes,
                    drops_total: l.drops,
                    window_rate: 0.0,
                    kind: None,
                },
                now,
            );
        }
    }
    push_grouped(b, made);
}

/// A verdict's figures without its words (what the lifecycle and the ranking read).
struct Figures {
    verdict: Verdict,
    severity: Severity,
    rate: Option<f64>,
    observed_bps: f64,
}

impl Figures {
    /// [`judge_drops`]'s figures, without its words.
    fn drops(rate: f64) -> Self {
        let (verdict, severity) = if rate > 0.0 {
            (Verdict::Costing, drop_severity(rate))
        } else {
            (Verdict::Benign, Severity::Info)
        };
        Self {
            verdict,
            severity,
            rate: Some(rate),
            observed_bps: 0.0,
        }
    }

    /// The figures of a told verdict.
    fn of(j: &Judged) -> Self {
        let get = |k: &str| {
            j.evidence
                .iter()
                .find(|(key, _)| *key == k)
                .map(|(_, v)| *v)
        };
        Self {
            verdict: j.verdict,
            severity: j.severity,
            rate: get("drops_per_second"),
            observed_bps: get("observed_bps").unwrap_or(0.0),
        }
    }
}

/// Keeps at most [`MAX_PER_KIND`] findings per (process, kind): the costliest; each one's
/// cost is read once, not per comparison.
fn push_grouped(b: &mut Builder<'_>, made: Vec<Arc<SocketFinding>>) {
    let mut keyed: Vec<(f64, Arc<SocketFinding>)> =
        made.into_iter().map(|f| (f.cost(), f)).collect();
    keyed.sort_by(|(cx, x), (cy, y)| {
        (x.pid(), x.kind, x.severity)
            .cmp(&(y.pid(), y.kind, y.severity))
            .then(cy.total_cmp(cx))
    });
    let mut sorted = keyed.into_iter().map(|(_, f)| f).peekable();
    while let Some(first) = sorted.next() {
        let (pid, kind) = (first.pid(), first.kind);
        let mut group = vec![first];
        while let Some(f) = sorted.next_if(|f| f.pid() == pid && f.kind == kind) {
            group.push(f);
        }
        let n = group.len() as u64;
        group.truncate(MAX_PER_KIND);
        b.sockets
            .extend(group.into_iter().enumerate().map(|(k, finding)| Listed {
                finding,
                group: Some((n, k == 0)),
                guard: None,
            }));
    }
}

fn finding(
    scene: &Scene,
    c: &Candidate,
    kind: &'static str,
    calls: &[&CallRec],
    j: Judged,
) -> Finding {
    let host = &scene.host;
    let api_calls = story_calls(calls, c.proto);
    let omitted = c.story.as_deref().map_or(0, |s| s.omitted());
    let ns = scene.ns;
    let (sysctl, host_value) = match c.dir {
        Direction::Receive => ("net.core.rmem_max", host.rmem_max),
        Direction::Send => ("net.core.wmem_max", host.wmem_max),
    };
    let limit = Limit {
        sysctl,
        bytes: match (ns, c.dir) {
            (Some(n), Direction::Receive) if n.scope != LimitScope::Absent => {
                n.rmem_max.or(host_value)
            }
            (Some(n), Direction::Send) if n.scope != LimitScope::Absent => {
                n.wmem_max.or(host_value)
            }
            (Some(_), _) => host_value,
            (None, _) => host_value,
        },
        scope: ns.map_or("host", |n| n.scope.as_str()),
        unreadable: ns.and_then(|n| n.unreadable_text()),
    };
    let bytes = c.bytes();
    let proto = c.proto.as_str();
    let dir_word = match c.dir {
        Direction::Receive => "receive",
        Direction::Send => "send",
    };
    let history = if api_calls.is_empty() {
        match c.dir {
            Direction::Receive => format!(
                "never sized by the program (the default net.core.rmem_default applies: {})",
                kib(bytes as f64)
            ),
            Direction::Send => "never sized by the program".to_string(),
        }
    } else {
        narrate(&api_calls, omitted)
    };
    let summary = format!(
        "{} socket {} {dir_word} buffer: {history}; now {}; {}",
        proto.to_uppercase(),
        c.inode,
        kib(bytes as f64),
        j.cost
    );
    let mut evidence: BTreeMap<&'static str, f64> = j.evidence.into_iter().collect();
    let requested = calls
        .iter()
        .filter(|c| c.option != BufOption::BufLock)
        .map(|c| c.requested as i64)
        .max();
    if let Some(r) = requested {
        evidence.insert("requested_bytes", r as f64);
    }
    evidence.insert("effective_bytes", bytes as f64);
    evidence.insert("calls", calls.len() as f64 + omitted as f64);
    if let Some(v) = limit.bytes {
        evidence.insert("limit_bytes", v as f64);
        if c.dir == Direction::Receive {
            evidence.insert("rmem_max_bytes", v as f64);
        }
    }
    if kind == kind::UDP_RCVBUF_DROPS {
        evidence.insert(
            "recommended_bytes",
            policy::recommended_udp_buffer(None).0 as f64,
        );
        evidence.insert("rcvbuf_bytes", bytes as f64);
    }
    if kind == kind::TCP_RCVBUF_LOCK {
        evidence.insert("sockets_locked", 1.0);
        evidence.insert("tcp_rmem_max_bytes", host.tcp_rmem_max as f64);
    }
    if kind == kind::TCP_SNDBUF_LOCK {
        evidence.insert("tcp_wmem_max_bytes", host.tcp_wmem_max as f64);
    }
    let fixes = fixes::fixes(scene, c, kind, calls, requested);
    let fix = fixes::one_line(&fixes);
    let socket = Some(SocketRef {
        inode: c.inode,
        proto,
        netns: u64::from(c.netns),
    });
    let rule = match (c.proto, kind) {
        (Proto::Tcp, _) => Rule::TcpAutotune.citation(),
        _ => policy::recommended_udp_buffer(None).1.citation(),
    };
    let mut f = Finding {
        kind,
        severity: j.severity,
        process: ProcessRef::clone(&scene.process),
        socket,
        summary,
        fix,
        evidence,
        rule,
        guard: None,
        verdict: Some(j.verdict),
        story: Some(Story {
            direction: dir_word,
            calls: api_calls,
            calls_total: c.story.as_deref().map_or(0, |s| {
                s.calls()
                    .filter(|x| match x.option {
                        BufOption::BufLock => true,
                        o => o.is_send() == (c.dir == Direction::Send),
                    })
                    .count() as u64
                    + omitted
            }),
            calls_omitted: omitted,
            final_bytes: bytes,
            limit: Some(limit),
        }),
        fixes,
        ..Finding::default()
    };
    if f.story.as_ref().is_some_and(|s| s.calls.is_empty()) {
        // No calls: the story is the default size and the drops.
        if let Some(s) = f.story.as_mut() {
            s.calls_total = 0;
        }
    }
    f.severity = j.severity;
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(option: BufOption, requested: i32, effective: i32, ret: i32, clamped: bool) -> CallRec {
        CallRec {
            at: 1,
            option,
            requested,
            applied: requested,
            effective,
            ret,
            clamped,
            locks_before: 0,
            locks_after: 0,
            state: 0,
            flags: 0,
        }
    }

    #[test]
    fn a_probing_sequence_is_told_once() {
        let mut calls = Vec::new();
        let mut v = 7 << 20;
        for _ in 0..23 {
            calls.push(call(BufOption::Rcvbuf, v, 8_388_608, 0, v > 4_194_304));
            v = v * 15 / 16;
        }
        let refs: Vec<&CallRec> = calls.iter().collect();
        let api = story_calls(&refs, Proto::Udp);
        assert_eq!(api.len(), 23);
        let s = narrate(&api, 0);
        assert!(s.starts_with("23 SO_RCVBUF calls, 7.0 MiB to "), "{s}");
        assert!(s.contains("clamped"), "{s}");
        assert!(!s.contains("; then"), "one run: {s}");
    }

    #[test]
    fn force_refused_then_fallback_is_one_story() {
        let calls = [
            call(
                BufOption::RcvbufForce,
                7 << 20,
                212_992,
                -libc::EPERM,
                false,
            ),
            call(BufOption::Rcvbuf, 7 << 20, 8_388_608, 0, true),
        ];
        let refs: Vec<&CallRec> = calls.iter().collect();
        let api = story_calls(&refs, Proto::Udp);
        assert_eq!(api[0].error, Some("EPERM"));
        assert_eq!(api[0].notes, vec!["force", "refused"]);
        assert_eq!(api[1].notes, vec!["fallback", "clamped"]);
        let s = narrate(&api, 0);
        assert!(
            s.contains("SO_RCVBUFFORCE 7.0 MiB (refused: EPERM")
                && s.contains("then SO_RCVBUF 7.0 MiB -> 8.0 MiB (the fallback, clamped)"),
            "{s}"
        );
    }

    #[test]
    fn below_the_minimum_is_granted_more() {
        let c = call(BufOption::Rcvbuf, 1000, 2304, 0, false);
        let api = story_calls(&[&c], Proto::Udp);
        assert_eq!(api[0].notes, vec!["above_minimum"]);
        assert!(narrate(&api, 0).contains("granted more than asked"));
    }

    #[test]
    fn a_send_buffer_set_on_an_established_connection_says_so() {
        let mut c = call(BufOption::Sndbuf, 96_000, 192_000, 0, false);
        c.state = TCP_ESTABLISHED;
        c.locks_after = SOCK_SNDBUF_LOCK;
        let api = story_calls(&[&c], Proto::Tcp);
        assert_eq!(api[0].notes, vec!["locked", "established"]);
        assert!(narrate(&api, 0).contains("on the established connection"));
    }
}
