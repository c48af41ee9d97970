//! What the loader is asked to do, before the object is loaded: which probes, the map sizes,
//! the read-only globals patched into the object, and per probe where its cgroup hooks attach
//! and whether its links may be pinned. The signal rooms fill it from their own settings
//! (`crate::signals::prepare`); the loader reads it without knowing which room asked what.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use aya::{Btf, Ebpf};

use super::ProbeStatus;
use crate::kernel::KernelBtf;

/// Why the object is loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// `bufscope run`: as configured.
    Run,
    /// `bufscope check`: every probe that can attach does, acting on nothing (a room whose
    /// programs could change the kernel's behaviour configures them to only observe).
    Check,
}

/// Settings of one probe.
#[derive(Clone, Debug, Default)]
struct ProbePlan {
    /// Left off by its room's settings (why).
    off: Option<String>,
    /// Where its cgroup hooks attach (None: the cgroup2 root).
    cgroup: Option<PathBuf>,
    /// Never pinned, even with `--bpf.pin-path`.
    unpinned: bool,
    /// Variants (by index) its room's settings rule out, with why.
    passed_over: Vec<(usize, String)>,
}

/// The loader's instructions.
#[derive(Debug)]
pub struct LoadPlan {
    /// Why the object is loaded.
    pub purpose: Purpose,
    /// Probes switched off by `--probe.disable`.
    pub disabled: BTreeSet<String>,
    /// The log level of the BPF programs' aya-log records.
    pub log_level: tracing::Level,
    sizes: BTreeMap<&'static str, u32>,
    globals: BTreeMap<&'static str, Vec<u8>>,
    probes: BTreeMap<&'static str, ProbePlan>,
    notes: BTreeMap<&'static str, String>,
}

impl LoadPlan {
    /// An empty plan.
    pub fn new(purpose: Purpose, disabled: &[String], log_level: tracing::Level) -> Self {
        Self {
            purpose,
            disabled: disabled.iter().cloned().collect(),
            log_level,
            sizes: BTreeMap::new(),
            globals: BTreeMap::new(),
            probes: BTreeMap::new(),
            notes: BTreeMap::new(),
        }
    }

    /// Map `name` gets `entries` entries (bytes, for a ring buffer) instead of the object's.
    pub fn map_entries(&mut self, name: &'static str, entries: u32) -> &mut Self {
        self.sizes.insert(name, entries);
        self
    }

    /// The read-only global `name` of the object is set to `value`.
    pub fn global<T: aya::Pod>(&mut self, name: &'static str, value: &T) -> &mut Self {
        // SAFETY: T is Pod (`#[repr(C)]`, integer-only, no padding the kernel reads): its
        // bytes are its value.
        let bytes = unsafe {
            std::slice::from_raw_parts((value as *const T).cast::<u8>(), std::mem::size_of::<T>())
        };
        self.globals.insert(name, bytes.to_vec());
        self
    }

    /// Probe `probe` stays off (not configured: `why`, e.g. "off (--guard.mode off)").
    pub fn leave_off(&mut self, probe: &'static str, why: impl Into<String>) -> &mut Self {
        self.probes.entry(probe).or_default().off = Some(why.into());
        self
    }

    /// Probe `probe`'s cgroup hooks attach at `cgroup` instead of the cgroup2 root.
    pub fn cgroup(&mut self, probe: &'static str, cgroup: PathBuf) -> &mut Self {
        self.probes.entry(probe).or_default().cgroup = Some(cgroup);
        self
    }

    /// Variant `variant` of probe `probe` is not tried (`why`: the setting that rules it out),
    /// for probes whose variants differ in what they cover rather than in what a kernel
    /// allows; the loader goes on to the next.
    pub fn pass_over(
        &mut self,
        probe: &'static str,
        variant: usize,
        why: impl Into<String>,
    ) -> &mut Self {
        self.probes
            .entry(probe)
            .or_default()
            .passed_over
            .push((variant, why.into()));
        self
    }

    /// Why variant `variant` of probe `probe` is not tried, when its room ruled it out.
    pub fn passed_over(&self, probe: &str, variant: usize) -> Option<&str> {
        self.probes.get(probe).and_then(|p| {
            p.passed_over
                .iter()
                .find(|(v, _)| *v == variant)
                .map(|(_, why)| why.as_str())
        })
    }

    /// Probe `probe` is never pinned: it stops with bufscope even with `--bpf.pin-path`.
    pub fn unpinned(&mut self, probe: &'static str) -> &mut Self {
        self.probes.entry(probe).or_default().unpinned = true;
        self
    }

    /// A setting of `key` that changes what the programs do without being a global (e.g. the
    /// contents of a map filled before attaching): it goes into the pins' fingerprint.
    pub fn note(&mut self, key: &'static str, text: String) -> &mut Self {
        self.notes.insert(key, text);
        self
    }

    /// The map size overrides.
    pub fn sizes(&self) -> impl Iterator<Item = (&'static str, u32)> + Clone + '_ {
        self.sizes.iter().map(|(k, v)| (*k, *v))
    }

    /// The globals to patch.
    pub fn globals(&self) -> impl Iterator<Item = (&'static str, &[u8])> + '_ {
        self.globals.iter().map(|(k, v)| (*k, v.as_slice()))
    }

    /// Why probe `probe` is off by its room's settings or by `--probe.disable`: (why,
    /// whether it is configured).
    pub fn off(&self, probe: &str) -> Option<(String, bool)> {
        if let Some(why) = self.probes.get(probe).and_then(|p| p.off.clone()) {
            return Some((why, false));
        }
        self.disabled
            .contains(probe)
            .then(|| ("disabled".to_string(), true))
    }

    /// Where probe `probe`'s cgroup hooks attach (None: the cgroup2 root).
    pub fn cgroup_of(&self, probe: &str) -> Option<&PathBuf> {
        self.probes.get(probe).and_then(|p| p.cgroup.as_ref())
    }

    /// Whether probe `probe` may be pinned.
    pub fn pinnable(&self, probe: &str) -> bool {
        !self.probes.get(probe).is_some_and(|p| p.unpinned)
    }

    /// Everything in the plan that changes what the programs do, as text for the pins'
    /// fingerprint (pinned programs loaded with other settings are not adopted).
    pub fn fingerprint_text(&self) -> String {
        format!(
            "{:?}|{:?}|{:?}|{:?}|{:?}|{:?}",
            self.disabled, self.sizes, self.globals, self.probes, self.notes, self.log_level
        )
    }
}

/// What the rooms do at two moments of loading, called by the loader without knowing which
/// room does what (`crate::signals` implements it over its list).
pub trait LoadHooks {
    /// The object is loaded, nothing is attached yet: fill maps the programs read (so that no
    /// program ever runs with them empty).
    fn before_attach(&mut self, ebpf: &mut Ebpf) -> anyhow::Result<()>;

    /// Every probe is attached (or not): load programs that are attached later, refuse
    /// settings that cannot work with what attached.
    fn after_attach(&mut self, ebpf: &mut Ebpf, cx: &Attached<'_>) -> anyhow::Result<()>;
}

/// What the load hooks see after everything attached.
pub struct Attached<'a> {
    /// The kernel's BTF as aya parsed it (to load programs attached later).
    pub btf: &'a Btf,
    /// The kernel's BTF as bufscope reads it (what hooks this kernel has).
    pub kernel: &'a KernelBtf,
    /// Per-probe outcome of attaching.
    pub status: &'a [ProbeStatus],
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_change_the_fingerprint() {
        let mut a = LoadPlan::new(Purpose::Run, &[], tracing::Level::INFO);
        let t0 = a.fingerprint_text();
        a.global("X", &7u32);
        let t1 = a.fingerprint_text();
        assert_ne!(t0, t1);
        a.unpinned("p");
        assert_ne!(t1, a.fingerprint_text());
        assert!(!a.pinnable("p") && a.pinnable("q"));
        a.leave_off("q", "off");
        assert_eq!(a.off("q"), Some(("off".into(), false)));
        let b = LoadPlan::new(Purpose::Run, &["q".into()], tracing::Level::INFO);
        assert_eq!(b.off("q"), Some(("disabled".into(), true)));
    }
}
