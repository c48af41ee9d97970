//! The reader hook, attached and detached at run time.
//!
//! `tp_btf/sock_recv_length` (6.4+; the BPF side is `ebpf/src/drops/reader.rs`) says which process
//! receives from a socket. It would run for every receive on the host, so it is loaded at
//! start (the verifier's verdict is known then) but attached only while the drops room watches
//! a socket — one with drops and more than one live holder (a prefork master and its
//! workers) — and detached when the last such socket stops dropping or is held by one process
//! again. A host without a dropping shared socket runs nothing of it.
//!
//! Attaching is one `BPF_RAW_TRACEPOINT_OPEN` on a duplicate of the loaded program's fd (the
//! room owns it, not the object); detaching is closing the link fd. Where the kernel has no
//! such tracepoint (6.1), or `BUFSCOPE_REFUSE_HOOKS` names it, nothing is loaded and a shared
//! socket's drops go to its newest live holder, as the log says at start.
//!
//! Self-metrics (rendered with the drops families, [`families`]):
//! `bufscope_reader_hook_armed{hook}` (1 while attached), `bufscope_reader_hook_changes_total{action="arm"|"disarm"}`
//! and `bufscope_reader_hook_watched_sockets`.

use std::os::fd::{AsFd as _, AsRawFd as _, FromRawFd as _, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use anyhow::Context as _;
use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuHashMap};
use aya::programs::{BtfTracePoint, ProgramFd};
use aya::{Btf, Ebpf};
use bufscope_common::{ReaderKey, ReaderVal, reader};
use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};

use super::{BtfNeed, Hook, ProbeStatus, usable};
use crate::kernel::KernelBtf;

/// The hook (its program reads `sk` and `ret`: three arguments).
pub const HOOK: Hook = Hook::BtfTracepointWhere {
    prog: reader::PROG,
    name: "sock_recv_length",
    needs: &[BtfNeed::Args(3)],
};

/// Process-wide state for the self-metrics: the exporter's health list is fixed at start,
/// this changes while it runs.
static LOADED: AtomicBool = AtomicBool::new(false);
static ARMED: AtomicBool = AtomicBool::new(false);
static ARMS: AtomicU64 = AtomicU64::new(0);
static DISARMS: AtomicU64 = AtomicU64::new(0);
static WATCHED: AtomicU64 = AtomicU64::new(0);

/// Whether the reader hook can work with kernel BTF `btf` (why not, when not): for
/// `bufscope check`.
pub fn available(btf: &KernelBtf) -> Result<(), String> {
    usable(&[HOOK], btf)
}

/// Loads the reader program (without attaching it) when the drops probe attached and the
/// kernel has the hook; logs which rule shared sockets follow. Never fails the start-up.
pub fn load(ebpf: &mut Ebpf, btf: &Btf, kernel: &KernelBtf, status: &[ProbeStatus]) {
    let drops = status
        .iter()
        .any(|s| s.spec.name == crate::signals::drops::PROBE.name && s.attached);
    if !drops {
        return;
    }
    let loaded = available(kernel).and_then(|()| {
        let p: &mut BtfTracePoint =
            super::program(ebpf, reader::PROG).map_err(|e| format!("{e:#}"))?;
        p.load("sock_recv_length", btf)
            .context("loading tp_btf/sock_recv_length")
            .map_err(|e| format!("{e:#}"))
    });
    match loaded {
        Ok(()) => {
            LOADED.store(true, Ordering::Relaxed);
            tracing::info!(
                hook = %HOOK.describe(),
                "reader hook loaded: a shared socket's drops go to the process that reads it (attached only while one drops)"
            );
        }
        Err(why) => tracing::info!(
            hook = %HOOK.describe(),
            "reader hook unavailable ({why}): a socket several processes hold has its drops on the newest holder"
        ),
    }
}

/// The loaded reader program and its maps, owned by the drops room.
pub struct ReaderHook {
    prog: ProgramFd,
    link: Option<OwnedFd>,
    /// Socket inode → 1: the sockets whose receivers are recorded.
    pub watched: BpfHashMap<MapData, u64, u8>,
    /// (socket, tgid) → receives and bytes since the key was created.
    pub readers: PerCpuHashMap<MapData, ReaderKey, ReaderVal>,
}

impl ReaderHook {
    /// Takes the program's fd and its maps out of `ebpf`; None when [`load`] did not load it.
    pub fn take(ebpf: &mut Ebpf) -> anyhow::Result<Option<Self>> {
        if !LOADED.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let p: &mut BtfTracePoint = super::program(ebpf, reader::PROG)?;
        let prog = p
            .fd()?
            .try_clone()
            .context("duplicating the reader program fd")?;
        let watched = crate::signals::take_map(ebpf, reader::WATCHED)?;
        let readers = crate::signals::take_map(ebpf, reader::READERS)?;
        Ok(Some(Self {
            prog,
            link: None,
            watched,
            readers,
        }))
    }

    /// Whether the program is attached.
    pub fn armed(&self) -> bool {
        self.link.is_some()
    }

    /// Attaches the program (no-op when attached).
    pub fn arm(&mut self) -> std::io::Result<()> {
        if self.link.is_some() {
            return Ok(());
        }
        // union bpf_attr for BPF_RAW_TRACEPOINT_OPEN: name (0: the program's own attach
        // target, a tp_btf program's BTF id), prog_fd.
        #[repr(C)]
        struct RawTpOpen {
            name: u64,
            prog_fd: u32,
            _pad: u32,
        }
        let attr = RawTpOpen {
            name: 0,
            prog_fd: self.prog.as_fd().as_raw_fd() as u32,
            _pad: 0,
        };
        const BPF_RAW_TRACEPOINT_OPEN: libc::c_int = 17;
        // SAFETY: attr is a valid, fully initialised bpf_attr prefix of the size passed.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_RAW_TRACEPOINT_OPEN,
                &attr as *const RawTpOpen,
                std::mem::size_of::<RawTpOpen>() as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the kernel returned a new fd that nothing else owns.
        self.link = Some(unsafe { OwnedFd::from_raw_fd(fd as i32) });
        ARMED.store(true, Ordering::Relaxed);
        ARMS.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Detaches the program (no-op when detached).
    pub fn disarm(&mut self) {
        if self.link.take().is_some() {
            ARMED.store(false, Ordering::Relaxed);
            DISARMS.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Publishes how many sockets are watched (self-metric).
    pub fn set_watched(&self, n: usize) {
        WATCHED.store(n as u64, Ordering::Relaxed);
    }
}

impl Drop for ReaderHook {
    fn drop(&mut self) {
        self.disarm();
    }
}

/// One sample with `labels`: a counter when `counter`, else a gauge.
pub fn sample(labels: &[(&str, &str)], value: f64, counter: bool) -> Metric {
    let mut m = Metric::default();
    m.set_label(
        labels
            .iter()
            .map(|(k, v)| {
                let mut l = LabelPair::default();
                l.set_name((*k).into());
                l.set_value((*v).into());
                l
            })
            .collect(),
    );
    if counter {
        let mut c = Counter::default();
        c.set_value(value);
        m.set_counter(c);
    } else {
        let mut g = Gauge::default();
        g.set_value(value);
        m.set_gauge(g);
    }
    m
}

fn family(name: &str, help: &str, kind: MetricType, metrics: Vec<Metric>) -> MetricFamily {
    let mut mf = MetricFamily::default();
    mf.set_name(name.into());
    mf.set_help(help.into());
    mf.set_field_type(kind);
    mf.set_metric(metrics);
    mf
}

/// The reader hook's self-metrics (none when it was not loaded: the kernel lacks the hook).
pub fn families(out: &mut Vec<MetricFamily>) {
    if !LOADED.load(Ordering::Relaxed) {
        return;
    }
    let hook = HOOK.describe();
    let armed = if ARMED.load(Ordering::Relaxed) {
        1.0
    } else {
        0.0
    };
    out.push(family(
        "bufscope_reader_hook_armed",
        "Whether the reader hook is attached (1: some socket several processes hold is dropping, and its receivers are recorded).",
        MetricType::GAUGE,
        vec![sample(&[("hook", hook.as_str())], armed, false)],
    ));
    out.push(family(
        "bufscope_reader_hook_changes_total",
        "Times the reader hook was attached (arm) or detached (disarm).",
        MetricType::COUNTER,
        vec![
            sample(
                &[("action", "arm")],
                ARMS.load(Ordering::Relaxed) as f64,
                true,
            ),
            sample(
                &[("action", "disarm")],
                DISARMS.load(Ordering::Relaxed) as f64,
                true,
            ),
        ],
    ));
    out.push(family(
        "bufscope_reader_hook_watched_sockets",
        "Sockets with drops and more than one live holder whose receivers are recorded.",
        MetricType::GAUGE,
        vec![sample(&[], WATCHED.load(Ordering::Relaxed) as f64, false)],
    ));
}
