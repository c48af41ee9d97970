//! The WAN link model and its forwarder: one thread per direction moving packets from one TUN
//! device to the other with delay, jitter, random loss and a token-bucket rate limit.
//!
//! Link model (LAB-FACTS §2): a packet arriving at `now` is dropped at random with probability
//! `loss` (independently per packet, or in bursts of `loss_burst` packets on average: a
//! two-state Gilbert model with the same long-run loss rate); otherwise it departs (finishes serialisation) at
//! `depart = max(now, busy_until) + len·8/rate` and is delivered at `deliver = depart + delay
//! (+ jitter)`. `busy_until` may lag `now` by up to `burst` bytes' worth of time, which makes
//! the limiter a token bucket of depth `burst`. A packet whose wait for serialisation would
//! exceed `queue` bytes' worth of time is tail-dropped, like a router with a `queue`-byte
//! buffer. Jitter never reorders packets (a delivery is never earlier than the previous one),
//! as on a real serial link.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd as _, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::Error;

/// Parameters of one direction of an emulated link.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkParams {
    /// Rate limit in bit/s (IP packet bytes); `None` for no limit.
    pub rate_bps: Option<u64>,
    /// One-way delay.
    pub delay: Duration,
    /// Jitter: each packet's delay varies uniformly within `delay ± jitter` (without
    /// reordering).
    pub jitter: Duration,
    /// Random loss probability, 0.0 to 1.0 (the long-run fraction of packets lost).
    pub loss: f64,
    /// Mean length of a loss burst in packets: 1.0 loses packets independently; above 1.0 a
    /// two-state (Gilbert) model loses every packet while in its "bad" state, which it enters
    /// with probability `loss / (burst · (1 − loss))` per packet and leaves with probability
    /// `1 / burst`, so that the long-run loss rate is still `loss`.
    pub loss_burst: f64,
    /// Bottleneck buffer in bytes (packets that would wait longer than this many bytes' worth
    /// of serialisation are dropped); `None` picks one bandwidth-delay product of the
    /// round trip (2 × delay), at least 128 KiB.
    pub queue_bytes: Option<u64>,
    /// Token-bucket depth in bytes (0: strict pacing, one packet at a time).
    pub burst_bytes: u64,
    /// Seed of the loss and jitter generator (runs with the same seed drop the same packets).
    pub seed: u64,
}

impl Default for LinkParams {
    fn default() -> Self {
        LinkParams {
            rate_bps: None,
            delay: Duration::ZERO,
            jitter: Duration::ZERO,
            loss: 0.0,
            loss_burst: 1.0,
            queue_bytes: None,
            burst_bytes: 0,
            seed: 0x5eed_b5f1,
        }
    }
}

impl LinkParams {
    /// No delay, no loss, no rate limit.
    pub fn unlimited() -> LinkParams {
        LinkParams::default()
    }

    /// A link limited to `mbit` Mbit/s (10^6 bit/s), no delay.
    pub fn mbit(mbit: u64) -> LinkParams {
        LinkParams {
            rate_bps: Some(mbit.saturating_mul(1_000_000)),
            ..LinkParams::default()
        }
    }

    /// Sets the rate in bit/s (`None`: unlimited).
    pub fn rate_bps(mut self, bps: Option<u64>) -> LinkParams {
        self.rate_bps = bps;
        self
    }

    /// Sets the one-way delay.
    pub fn delay(mut self, delay: Duration) -> LinkParams {
        self.delay = delay;
        self
    }

    /// Sets the one-way delay to half of `rtt_ms` (for a symmetric lab).
    pub fn rtt_ms(self, rtt_ms: u64) -> LinkParams {
        self.delay(Duration::from_micros(rtt_ms.saturating_mul(500)))
    }

    /// Sets the jitter (delay varies within ± this).
    pub fn jitter(mut self, jitter: Duration) -> LinkParams {
        self.jitter = jitter;
        self
    }

    /// Sets the loss probability (0.0 to 1.0).
    pub fn loss(mut self, loss: f64) -> LinkParams {
        self.loss = loss;
        self
    }

    /// Sets the mean loss burst length in packets (1.0: independent losses).
    pub fn loss_burst(mut self, packets: f64) -> LinkParams {
        self.loss_burst = packets;
        self
    }

    /// Sets the bottleneck buffer in bytes.
    pub fn queue_bytes(mut self, bytes: u64) -> LinkParams {
        self.queue_bytes = Some(bytes);
        self
    }

    /// Sets the token-bucket depth in bytes.
    pub fn burst_bytes(mut self, bytes: u64) -> LinkParams {
        self.burst_bytes = bytes;
        self
    }

    /// Sets the random seed.
    pub fn seed(mut self, seed: u64) -> LinkParams {
        self.seed = seed;
        self
    }

    /// The bottleneck buffer actually used: `queue_bytes`, or one bandwidth-delay product of
    /// the round trip (at least 128 KiB). `None` without a rate limit.
    pub fn effective_queue_bytes(&self) -> Option<u64> {
        let rate = self.rate_bps?;
        Some(self.queue_bytes.unwrap_or_else(|| {
            let bdp = u128::from(rate) * 2 * self.delay.as_nanos() / 8 / 1_000_000_000;
            u64::try_from(bdp).unwrap_or(u64::MAX).max(128 * 1024)
        }))
    }

    /// Rejects values the forwarder cannot honour.
    pub(crate) fn validate(&self) -> Result<(), Error> {
        if !(0.0..=1.0).contains(&self.loss) {
            return Err(Error::Config(format!(
                "loss {} is not within 0.0..=1.0",
                self.loss
            )));
        }
        if !self.loss_burst.is_finite() || self.loss_burst < 1.0 {
            return Err(Error::Config(format!(
                "loss burst {} is not a mean length of at least 1 packet",
                self.loss_burst
            )));
        }
        if self.loss_burst > 1.0 && self.loss >= 1.0 {
            return Err(Error::Config(
                "bursty loss needs a loss rate below 100%".into(),
            ));
        }
        if self.rate_bps == Some(0) {
            return Err(Error::Config("rate 0 would never deliver anything".into()));
        }
        if self.delay > Duration::from_secs(10) || self.jitter > Duration::from_secs(10) {
            return Err(Error::Config("delay and jitter are limited to 10 s".into()));
        }
        Ok(())
    }
}

impl std::fmt::Display for LinkParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.rate_bps {
            Some(r) => write!(f, "{} Mbit/s", r as f64 / 1e6)?,
            None => write!(f, "unlimited rate")?,
        }
        write!(f, ", one-way delay {:?}", self.delay)?;
        if !self.jitter.is_zero() {
            write!(f, " ± {:?}", self.jitter)?;
        }
        if self.loss > 0.0 {
            write!(f, ", loss {}%", self.loss * 100.0)?;
            if self.loss_burst > 1.0 {
                write!(f, " in bursts of {} packets", self.loss_burst)?;
            }
        }
        if let Some(q) = self.effective_queue_bytes() {
            write!(f, ", queue {} KiB", q / 1024)?;
        }
        Ok(())
    }
}

/// Counters of one direction of the forwarder.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DirectionStats {
    /// Packets read from the ingress TUN device.
    pub packets_in: u64,
    /// Packets written to the egress TUN device.
    pub packets_out: u64,
    /// Bytes (IP packets) written to the egress TUN device.
    pub bytes_out: u64,
    /// Packets dropped by the random loss.
    pub dropped_loss: u64,
    /// Packets tail-dropped because the bottleneck buffer was full.
    pub dropped_queue: u64,
    /// Packets the egress device refused.
    pub write_errors: u64,
}

/// Counters of both directions.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WanStats {
    /// Namespace `a` → namespace `b`.
    pub a_to_b: DirectionStats,
    /// Namespace `b` → namespace `a`.
    pub b_to_a: DirectionStats,
}

#[derive(Debug, Default)]
struct Counters {
    packets_in: AtomicU64,
    packets_out: AtomicU64,
    bytes_out: AtomicU64,
    dropped_loss: AtomicU64,
    dropped_queue: AtomicU64,
    write_errors: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> DirectionStats {
        DirectionStats {
            packets_in: self.packets_in.load(Ordering::Relaxed),
            packets_out: self.packets_out.load(Ordering::Relaxed),
            bytes_out: self.bytes_out.load(Ordering::Relaxed),
            dropped_loss: self.dropped_loss.load(Ordering::Relaxed),
            dropped_queue: self.dropped_queue.load(Ordering::Relaxed),
            write_errors: self.write_errors.load(Ordering::Relaxed),
        }
    }
}

/// The running forwarder: two threads, stopped and joined on drop (which closes the TUN fds
/// and so deletes the devices).
#[derive(Debug)]
pub(crate) struct Forwarder {
    stop: OwnedFd,
    threads: Vec<JoinHandle<()>>,
    counters: [Arc<Counters>; 2],
}

impl Forwarder {
    /// Starts forwarding `tun_a → tun_b` with `a_to_b` and `tun_b → tun_a` with `b_to_a`.
    /// `mtu` sizes the packet buffers; `realtime` asks for `SCHED_FIFO` (best effort).
    pub(crate) fn start(
        tun_a: OwnedFd,
        tun_b: OwnedFd,
        a_to_b: &LinkParams,
        b_to_a: &LinkParams,
        mtu: u32,
        realtime: bool,
    ) -> Result<Forwarder, Error> {
        a_to_b.validate()?;
        b_to_a.validate()?;
        // SAFETY: eventfd has no memory-safety preconditions; the fd is owned right away.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if raw < 0 {
            return Err(Error::io("eventfd", std::io::Error::last_os_error()));
        }
        // SAFETY: raw is a fresh fd we own.
        let stop: OwnedFd = unsafe { std::os::fd::FromRawFd::from_raw_fd(raw) };
        let tun_a = Arc::new(tun_a);
        let tun_b = Arc::new(tun_b);
        let counters = [Arc::new(Counters::default()), Arc::new(Counters::default())];
        let mut fwd = Forwarder {
            stop,
            threads: Vec::new(),
            counters: counters.clone(),
        };
        let dirs = [
            (
                "a->b",
                tun_a.clone(),
                tun_b.clone(),
                a_to_b.clone(),
                counters[0].clone(),
            ),
            ("b->a", tun_b, tun_a, b_to_a.clone(), counters[1].clone()),
        ];
        for (i, (label, input, output, params, ctr)) in dirs.into_iter().enumerate() {
            let stop_fd = fwd.stop.as_raw_fd();
            let seed = params.seed ^ (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let buf_len = usize::try_from(mtu).unwrap_or(65535).clamp(576, 65535);
            let t = std::thread::Builder::new()
                .name(format!("netlab {label}"))
                .spawn(move || {
                    if realtime {
                        set_realtime();
                    }
                    let mut d = Direction::new(&params, seed, buf_len, ctr);
                    d.run(input.as_raw_fd(), output.as_raw_fd(), stop_fd);
                })
                .map_err(|e| Error::io("spawning a forwarder thread", e))?;
            fwd.threads.push(t);
        }
        Ok(fwd)
    }

    /// Current counters.
    pub(crate) fn stats(&self) -> WanStats {
        WanStats {
            a_to_b: self.counters[0].snapshot(),
            b_to_a: self.counters[1].snapshot(),
        }
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to our eventfd.
        unsafe { libc::write(self.stop.as_raw_fd(), (&one as *const u64).cast(), 8) };
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Low real-time priority of the forwarder threads: enough to run ahead of ordinary
/// (compiling, testing) processes, low enough not to compete with kernel RT threads.
const RT_PRIORITY: i32 = 10;

/// Best effort: `SCHED_FIFO` for the calling thread, so that a busy machine does not delay
/// packets. The threads sleep whenever no packet is due, and the kernel's RT throttling
/// (`sched_rt_runtime_us`) bounds them anyway. Failure (no `CAP_SYS_NICE`) is ignored.
fn set_realtime() {
    let param = libc::sched_param {
        sched_priority: RT_PRIORITY,
    };
    // SAFETY: pthread_setschedparam on the current thread with a valid sched_param.
    unsafe { libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &param) };
}

/// The two-state (Gilbert) loss model's state: every packet is lost in the losing state.
struct Burst {
    enter: u64,
    leave: u64,
    losing: bool,
}

/// A packet waiting in the delay line.
struct Pkt {
    deliver: Instant,
    len: usize,
    buf: Vec<u8>,
}

/// Most packets read in one go before due packets are written out.
const READ_BATCH: usize = 64;
/// Cap of the delay line without a rate limit (bytes in flight inside the forwarder).
const UNLIMITED_QUEUE_BYTES: u64 = 256 << 20;

/// One direction's state.
struct Direction {
    rate_bps: Option<u64>,
    delay: Duration,
    jitter_ns: u64,
    loss_threshold: u64,
    /// Bursty loss: thresholds of entering and leaving the losing state (`None`: independent
    /// losses with `loss_threshold`).
    burst: Option<Burst>,
    queue_ns: u64,
    burst_ns: u64,
    buf_len: usize,
    rng: u64,
    busy_until: Option<Instant>,
    last_deliver: Option<Instant>,
    line: VecDeque<Pkt>,
    line_bytes: u64,
    pool: Vec<Vec<u8>>,
    ctr: Arc<Counters>,
}

impl Direction {
    fn new(p: &LinkParams, seed: u64, buf_len: usize, ctr: Arc<Counters>) -> Direction {
        let ns_for = |bytes: u64| match p.rate_bps {
            Some(r) => u64::try_from(u128::from(bytes) * 8 * 1_000_000_000 / u128::from(r))
                .unwrap_or(u64::MAX),
            None => 0,
        };
        // Probabilities as thresholds on a uniform u64: true when rng < threshold.
        let threshold = |prob: f64| {
            if prob >= 1.0 {
                u64::MAX
            } else {
                (prob.max(0.0) * u64::MAX as f64) as u64
            }
        };
        let loss_threshold = threshold(p.loss);
        let burst = (p.loss > 0.0 && p.loss_burst > 1.0).then(|| Burst {
            enter: threshold(p.loss / (p.loss_burst * (1.0 - p.loss))),
            leave: threshold(1.0 / p.loss_burst),
            losing: false,
        });
        Direction {
            rate_bps: p.rate_bps,
            delay: p.delay,
            jitter_ns: u64::try_from(p.jitter.as_nanos()).unwrap_or(u64::MAX),
            loss_threshold,
            burst,
            queue_ns: ns_for(p.effective_queue_bytes().unwrap_or(0)),
            burst_ns: ns_for(p.burst_bytes),
            buf_len,
            rng: seed | 1,
            busy_until: None,
            last_deliver: None,
            line: VecDeque::with_capacity(4096),
            line_bytes: 0,
            pool: Vec::new(),
            ctr,
        }
    }

    /// xorshift64*.
    fn next_random(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Whether the next packet is lost (independently, or by the burst model's state).
    fn lose(&mut self) -> bool {
        if self.loss_threshold == 0 {
            return false;
        }
        let r = self.next_random();
        match &mut self.burst {
            None => r < self.loss_threshold,
            Some(b) => {
                // The state changes before the packet: a burst of mean length 1/leave.
                b.losing = if b.losing { r >= b.leave } else { r < b.enter };
                b.losing
            }
        }
    }

    fn run(&mut self, input: RawFd, output: RawFd, stop: RawFd) {
        // Timers as precise as the kernel allows (default slack is 50 µs).
        // SAFETY: prctl(PR_SET_TIMERSLACK) only affects this thread.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
        let mut fds = [
            libc::pollfd {
                fd: input,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: stop,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        loop {
            let timeout = self
                .line
                .front()
                .map(|p| p.deliver.saturating_duration_since(Instant::now()));
            let ts = timeout.map(|d| libc::timespec {
                // Not `libc::time_t`, deprecated on musl: `into()` fits the field.
                tv_sec: i32::try_from(d.as_secs()).unwrap_or(i32::MAX).into(),
                tv_nsec: libc::c_long::from(d.subsec_nanos() as i32),
            });
            let tsp = ts
                .as_ref()
                .map_or(std::ptr::null(), |t| t as *const libc::timespec);
            // SAFETY: fds and ts are valid for the call; a null sigmask keeps the current one.
            let rc = unsafe { libc::ppoll(fds.as_mut_ptr(), 2, tsp, std::ptr::null()) };
            if rc < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return;
                }
            }
            if fds[1].revents != 0 {
                return;
            }
            if fds[0].revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
                return;
            }
            if fds[0].revents & libc::POLLIN != 0 {
                self.read_batch(input);
            }
            self.deliver_due(output);
        }
    }

    /// Reads up to READ_BATCH packets (until EAGAIN) and enqueues them.
    fn read_batch(&mut self, input: RawFd) {
        for _ in 0..READ_BATCH {
            let mut buf = self.pool.pop().unwrap_or_else(|| vec![0u8; self.buf_len]);
            // SAFETY: buf is valid for buf.len() writable bytes.
            let n = unsafe { libc::read(input, buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                self.pool.push(buf);
                return;
            }
            self.enqueue(buf, n.unsigned_abs(), Instant::now());
        }
    }

    /// Applies loss, rate and delay to one packet that arrived at `now`.
    fn enqueue(&mut self, buf: Vec<u8>, len: usize, now: Instant) {
        self.ctr.packets_in.fetch_add(1, Ordering::Relaxed);
        if self.lose() {
            self.ctr.dropped_loss.fetch_add(1, Ordering::Relaxed);
            self.pool.push(buf);
            return;
        }
        let depart = match self.rate_bps {
            Some(rate) => {
                let floor = now
                    .checked_sub(Duration::from_nanos(self.burst_ns))
                    .unwrap_or(now);
                let start = self.busy_until.map_or(floor, |b| b.max(floor));
                let wait = start.saturating_duration_since(now);
                if u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX) > self.queue_ns {
                    self.ctr.dropped_queue.fetch_add(1, Ordering::Relaxed);
                    self.pool.push(buf);
                    return;
                }
                let tx = Duration::from_nanos(
                    u64::try_from(len as u128 * 8 * 1_000_000_000 / u128::from(rate))
                        .unwrap_or(u64::MAX),
                );
                let done = start + tx;
                self.busy_until = Some(done);
                done.max(now)
            }
            None => {
                if self.line_bytes + len as u64 > UNLIMITED_QUEUE_BYTES {
                    self.ctr.dropped_queue.fetch_add(1, Ordering::Relaxed);
                    self.pool.push(buf);
                    return;
                }
                now
            }
        };
        let mut deliver = depart + self.delay;
        if self.jitter_ns > 0 {
            let span = self.jitter_ns.saturating_mul(2).saturating_add(1);
            let offset = self.next_random() % span;
            deliver = if offset >= self.jitter_ns {
                deliver + Duration::from_nanos(offset - self.jitter_ns)
            } else {
                deliver
                    .checked_sub(Duration::from_nanos(self.jitter_ns - offset))
                    .unwrap_or(depart)
                    .max(depart)
            };
        }
        if let Some(last) = self.last_deliver {
            deliver = deliver.max(last);
        }
        self.last_deliver = Some(deliver);
        self.line_bytes += len as u64;
        self.line.push_back(Pkt { deliver, len, buf });
    }

    /// Writes every packet whose delivery time has come.
    fn deliver_due(&mut self, output: RawFd) {
        let now = Instant::now();
        while self.line.front().is_some_and(|p| p.deliver <= now) {
            let Some(p) = self.line.pop_front() else {
                break;
            };
            self.line_bytes -= p.len as u64;
            // SAFETY: p.buf holds at least p.len initialised bytes.
            let n = unsafe { libc::write(output, p.buf.as_ptr().cast(), p.len) };
            if n < 0 {
                self.ctr.write_errors.fetch_add(1, Ordering::Relaxed);
            } else {
                self.ctr.packets_out.fetch_add(1, Ordering::Relaxed);
                self.ctr
                    .bytes_out
                    .fetch_add(p.len as u64, Ordering::Relaxed);
            }
            self.pool.push(p.buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(p: &LinkParams) -> Direction {
        Direction::new(p, 42, 1500, Arc::new(Counters::default()))
    }

    #[test]
    fn serialisation_and_delay_follow_the_link_model() {
        // 12 Mbit/s: a 1500-byte packet takes exactly 1 ms.
        let mut d = dir(&LinkParams::mbit(12).delay(Duration::from_millis(10)));
        let t0 = Instant::now();
        for _ in 0..3 {
            d.enqueue(vec![0; 1500], 1500, t0);
        }
        let times: Vec<Duration> = d.line.iter().map(|p| p.deliver - t0).collect();
        assert_eq!(times, [11, 12, 13].map(Duration::from_millis));
    }

    #[test]
    fn queue_limit_tail_drops() {
        // 3000-byte buffer at 12 Mbit/s = 2 ms of backlog allowed.
        let mut d = dir(&LinkParams::mbit(12).queue_bytes(3000));
        let t0 = Instant::now();
        for _ in 0..5 {
            d.enqueue(vec![0; 1500], 1500, t0);
        }
        // Waits of 0, 1 and 2 ms are accepted; 3 and 4 ms exceed the buffer.
        assert_eq!(d.line.len(), 3);
        assert_eq!(d.ctr.dropped_queue.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn burst_lets_packets_through_back_to_back() {
        let mut d = dir(&LinkParams::mbit(12).burst_bytes(3000));
        let t0 = Instant::now() + Duration::from_secs(1);
        for _ in 0..3 {
            d.enqueue(vec![0; 1500], 1500, t0);
        }
        let times: Vec<Duration> = d.line.iter().map(|p| p.deliver - t0).collect();
        assert_eq!(times, [0, 0, 1].map(Duration::from_millis));
    }

    #[test]
    fn loss_rate_matches_probability() {
        let mut d = dir(&LinkParams::unlimited().loss(0.2));
        let t0 = Instant::now();
        for _ in 0..100_000 {
            d.enqueue(vec![0; 100], 100, t0);
        }
        let lost = d.ctr.dropped_loss.load(Ordering::Relaxed) as f64 / 100_000.0;
        assert!((lost - 0.2).abs() < 0.01, "lost {lost}");
    }

    #[test]
    fn bursty_loss_keeps_the_rate_and_the_mean_burst_length() {
        for (loss, burst) in [(0.01, 4.0), (0.05, 8.0), (0.10, 3.0)] {
            let mut d = dir(&LinkParams::unlimited().loss(loss).loss_burst(burst));
            let t0 = Instant::now();
            let n = 400_000;
            let mut bursts = 0u64;
            let mut prev_lost = false;
            for _ in 0..n {
                let before = d.ctr.dropped_loss.load(Ordering::Relaxed);
                d.enqueue(vec![0; 100], 100, t0);
                let lost = d.ctr.dropped_loss.load(Ordering::Relaxed) > before;
                if lost && !prev_lost {
                    bursts += 1;
                }
                prev_lost = lost;
                d.line.clear();
            }
            let lost = d.ctr.dropped_loss.load(Ordering::Relaxed);
            let rate = lost as f64 / n as f64;
            let mean = lost as f64 / bursts as f64;
            assert!((rate - loss).abs() < loss * 0.15, "loss {rate} for {loss}");
            assert!(
                (mean - burst).abs() < burst * 0.15,
                "burst {mean} for {burst}"
            );
        }
        // Independent losses come in runs of 1 / (1 - loss) on average.
        let mut d = dir(&LinkParams::unlimited().loss(0.05));
        assert!(d.burst.is_none());
        assert!(
            LinkParams::unlimited()
                .loss(0.05)
                .loss_burst(0.5)
                .validate()
                .is_err()
        );
        d.enqueue(vec![0; 100], 100, Instant::now());
    }

    #[test]
    fn jitter_stays_in_range_and_never_reorders() {
        let j = Duration::from_millis(5);
        let mut d = dir(&LinkParams::unlimited()
            .delay(Duration::from_millis(20))
            .jitter(j));
        let t0 = Instant::now();
        for i in 0..1000u64 {
            d.enqueue(vec![0; 100], 100, t0 + Duration::from_millis(i * 10));
        }
        let mut prev = t0;
        let mut spread = (Duration::MAX, Duration::ZERO);
        for (i, p) in d.line.iter().enumerate() {
            assert!(p.deliver >= prev, "reordered");
            prev = p.deliver;
            let lat = p.deliver - (t0 + Duration::from_millis(i as u64 * 10));
            spread = (spread.0.min(lat), spread.1.max(lat));
        }
        assert!(spread.0 >= Duration::from_millis(15) && spread.0 < Duration::from_millis(16));
        assert!(spread.1 <= Duration::from_millis(25) && spread.1 > Duration::from_millis(24));
    }

    #[test]
    fn default_queue_is_one_bdp() {
        let p = LinkParams::mbit(200).rtt_ms(50);
        assert_eq!(p.effective_queue_bytes(), Some(1_250_000));
        assert_eq!(
            LinkParams::mbit(1).effective_queue_bytes(),
            Some(128 * 1024)
        );
        assert_eq!(LinkParams::unlimited().effective_queue_bytes(), None);
    }
}
