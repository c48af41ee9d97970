//! The reader hook, attached and detached at run time by the drops room.
//!
//! `tp_btf/sock_recv_length` (6.4+; the BPF side is `ebpf/src/drops/reader.rs`) says which
//! process receives from a socket. It would run for every receive on the host, so it is loaded
//! at start (the verifier's verdict is known then) but attached only while the drops room
//! watches a socket — one with drops and more than one live holder (a prefork master and its
//! workers) — and detached when the last such socket stops dropping or is held by one process
//! again. A host without a dropping shared socket runs nothing of it.
//!
//! Attaching is one raw-tracepoint link on a duplicate of the loaded program's fd (the room
//! owns it, not the object); detaching is closing the link. Where the kernel has no such
//! tracepoint (6.1), or `BUFSCOPE_REFUSE_HOOKS` names it, nothing is loaded and a shared
//! socket's drops go to its newest live holder, as the log says at start.
//!
//! Self-metrics (rendered with the drops families, [`ReaderHook::families`]):
//! `bufscope_reader_hook_armed{hook}` (1 while attached),
//! `bufscope_reader_hook_changes_total{action="arm"|"disarm"}` and
//! `bufscope_reader_hook_watched_sockets`.

use anyhow::Context as _;
use aya::programs::BtfTracePoint;
use aya::{Btf, Ebpf};
use bufscope_common::{ReaderKey, ReaderVal, maps, reader};
use prometheus::proto::MetricFamily;

use crate::bpf::switch::{Linked, Switch};
use crate::bpf::table::{Hash, PerCpuHash};
use crate::bpf::{BtfNeed, Hook, PerCpuTable, Table, usable};
use crate::exposition::Spec;
use crate::kernel::KernelBtf;

/// The hook (its program reads `sk` and `ret`: three arguments).
pub const HOOK: Hook = Hook::BtfTracepointWhere {
    prog: reader::PROG,
    name: "sock_recv_length",
    needs: &[BtfNeed::Args(3)],
};

const ARMED: Spec = Spec::gauge(
    "bufscope_reader_hook_armed",
    "Whether the reader hook is attached (1: some socket several processes hold is dropping, and its receivers are recorded).",
    &["hook"],
);
const CHANGES: Spec = Spec::counter(
    "bufscope_reader_hook_changes_total",
    "Times the reader hook was attached (arm) or detached (disarm).",
    &["action"],
);
const WATCHED: Spec = Spec::gauge(
    "bufscope_reader_hook_watched_sockets",
    "Sockets with drops and more than one live holder whose receivers are recorded.",
    &[],
);

/// Whether the reader hook can work with kernel BTF `btf` (why not, when not): for
/// `bufscope check`.
pub fn available(btf: &KernelBtf) -> Result<(), String> {
    usable(&[HOOK], btf)
}

/// Loads the reader program (without attaching it) when the kernel has the hook; logs which
/// rule shared sockets follow. Returns whether it is loaded; never fails the start-up.
pub fn load(ebpf: &mut Ebpf, btf: &Btf, kernel: &KernelBtf) -> bool {
    let loaded = available(kernel).and_then(|()| {
        let p: &mut BtfTracePoint = ebpf
            .program_mut(reader::PROG)
            .context("the reader program is missing from the BPF object")
            .and_then(|p| Ok(p.try_into()?))
            .map_err(|e: anyhow::Error| format!("{e:#}"))?;
        p.load("sock_recv_length", btf)
            .context("loading tp_btf/sock_recv_length")
            .map_err(|e| format!("{e:#}"))
    });
    match loaded {
        Ok(()) => {
            tracing::info!(
                hook = %HOOK.describe(),
                "reader hook loaded: a shared socket's drops go to the process that reads it (attached only while one drops)"
            );
            true
        }
        Err(why) => {
            tracing::info!(
                hook = %HOOK.describe(),
                "reader hook unavailable ({why}): a socket several processes hold has its drops on the newest holder"
            );
            false
        }
    }
}

/// The loaded reader program and its maps, owned by the drops room.
pub struct ReaderHook {
    switch: Box<dyn Switch>,
    armed: bool,
    /// Socket inode → 1: the sockets whose receivers are recorded.
    pub watched: Box<dyn Table<u64, u8>>,
    /// (socket, tgid) → receives and bytes since the key was created.
    pub readers: PerCpuTable<ReaderKey, ReaderVal>,
    arms: u64,
    disarms: u64,
    watching: usize,
}

impl ReaderHook {
    /// Takes the loaded program's fd and its maps out of `ebpf`.
    pub fn take(ebpf: &mut Ebpf) -> anyhow::Result<Self> {
        let p: &BtfTracePoint = ebpf
            .program(reader::PROG)
            .context("the reader program is missing from the BPF object")?
            .try_into()?;
        let prog = p
            .fd()?
            .try_clone()
            .context("duplicating the reader program fd")?;
        Ok(Self::new(
            Box::new(Linked::new(prog)),
            Hash::take(ebpf, maps::WATCHED)?,
            PerCpuHash::take(ebpf, maps::READERS)?,
        ))
    }

    /// The hook over `switch` and its maps (the kernel's, or fakes in tests).
    pub fn new(
        switch: Box<dyn Switch>,
        watched: Box<dyn Table<u64, u8>>,
        readers: PerCpuTable<ReaderKey, ReaderVal>,
    ) -> Self {
        Self {
            switch,
            armed: false,
            watched,
            readers,
            arms: 0,
            disarms: 0,
            watching: 0,
        }
    }

    /// Whether the program is attached.
    pub fn armed(&self) -> bool {
        self.armed
    }

    /// Attaches the program (no-op when attached).
    pub fn arm(&mut self) -> std::io::Result<()> {
        if !self.armed {
            self.switch.attach()?;
            self.armed = true;
            self.arms += 1;
        }
        Ok(())
    }

    /// Detaches the program (no-op when detached).
    pub fn disarm(&mut self) {
        if self.armed {
            self.switch.detach();
            self.armed = false;
            self.disarms += 1;
        }
    }

    /// Records how many sockets are watched (self-metric).
    pub fn set_watched(&mut self, n: usize) {
        self.watching = n;
    }

    /// The reader hook's self-metrics.
    pub fn families(&self, out: &mut Vec<MetricFamily>) {
        let hook = HOOK.describe();
        let mut f = ARMED.family();
        f.push(&[&hook], if self.armed() { 1.0 } else { 0.0 });
        f.done(out);
        // Each action once it happened (the series budget: no series that never moves).
        let mut f = CHANGES.family();
        for (action, n) in [("arm", self.arms), ("disarm", self.disarms)] {
            if n > 0 {
                f.push(&[action], n as f64);
            }
        }
        f.done(out);
        let mut f = WATCHED.family();
        f.push(&[], self.watching as f64);
        f.done(out);
    }
}
