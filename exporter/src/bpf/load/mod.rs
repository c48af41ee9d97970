//! [`load()`]: the object loaded and the probes attached, in three steps that each do one
//! thing:
//!
//! 1. **plan** ([`Settings::plan`]): what this kernel and the rooms' [`LoadPlan`] make of the
//!    object — the globals (`CONFIG`, `COMPAT`, the log level), and with `--bpf.pin-path` the
//!    pin directory's decision ([`pins::prepare`], from the fingerprint of all of it);
//! 2. **configure** ([`configure::object`]): aya's loader given those globals, the map sizes
//!    and the pin paths, the object loaded (maps made or reused, nothing attached);
//! 3. **attach** ([`attach::probes`]): every probe the plan leaves on, adopted from the pins
//!    or attached best variant first, its links pinned or held.
//!
//! The rooms' [`LoadHooks`] run between 2 and 3 and after 3.

mod attach;
mod configure;

use std::path::Path;

use anyhow::Context as _;
use aya::Btf;

use super::{LoadHooks, LoadPlan, OBJECT, ProbeSpec, Probes, choice, pins, trim_heap};
use crate::kernel::KernelInfo;
pub use configure::RINGBUF_WAKEUP_BYTES;

/// What the object is loaded with, decided before anything is loaded.
pub struct Settings {
    /// `CONFIG`: the kernel's layout and the fast paths.
    pub config: bufscope_common::Config,
    /// `COMPAT`: what the older-kernel programs need.
    pub compat: bufscope_common::CompatConfig,
    /// aya-log's level filter.
    pub log_level: u8,
    /// The cgroup2 root (None: not mounted).
    pub cgroup_root: Option<std::path::PathBuf>,
}

impl Settings {
    /// Step 1: the settings for `kernel` and `plan`.
    pub fn plan(kernel: &KernelInfo, plan: &LoadPlan) -> Self {
        Self {
            config: configure::fast_path_config(kernel),
            compat: crate::kernel::compat::build(&kernel.btf, &kernel.reasons).unwrap_or_else(
                |e| {
                    tracing::warn!("older-kernel hooks unusable: {e}");
                    bufscope_common::CompatConfig::zeroed()
                },
            ),
            log_level: configure::aya_log_level(plan.log_level),
            cgroup_root: crate::kernel::cgroup2_root(),
        }
    }

    /// With `--bpf.pin-path`: the pin directory's decision for this object and these
    /// settings (pinned programs loaded with other settings are not adopted).
    fn pins(&self, plan: &LoadPlan, lock: pins::dir::PinLock) -> anyhow::Result<pins::PinDir> {
        let maps = pins::persistent_maps(OBJECT, plan.sizes())?;
        let mut fp = pins::Fingerprint::default();
        let settings = format!(
            "{:?}|{:?}|{}|{:?}|{:?}|{}",
            self.config,
            self.compat,
            self.log_level,
            self.cgroup_root,
            std::env::var(choice::REFUSE_ENV).ok(),
            plan.fingerprint_text(),
        );
        fp.add(OBJECT).add(settings.as_bytes());
        for m in &maps {
            fp.add(format!("{m:?}").as_bytes());
        }
        pins::prepare(lock, &maps, fp.value())
    }
}

/// Loads the object with this kernel's layout and the plan's settings, and attaches every
/// probe of `probes` the plan leaves on (each all-or-nothing, best variant first). With
/// `pin_dir` (locked by [`pins::dir::PinLock::acquire`]), pins (or adopts) the persistent
/// maps and the probes' links ([`pins`]). The rooms' `hooks` run before anything is attached
/// and after everything is.
pub fn load(
    kernel: &KernelInfo,
    btf_path: &Path,
    probes: &[ProbeSpec],
    plan: &LoadPlan,
    hooks: &mut dyn LoadHooks,
    pin_dir: Option<pins::dir::PinLock>,
) -> anyhow::Result<Probes> {
    let btf = Btf::parse_file(btf_path, aya::Endianness::default())
        .with_context(|| format!("parsing {}", btf_path.display()))?;
    let settings = Settings::plan(kernel, plan);
    let mut pins = pin_dir.map(|l| settings.pins(plan, l)).transpose()?;
    let mut ebpf = configure::object(&btf, &settings, plan, pins.as_ref())?;
    hooks.before_attach(&mut ebpf)?;
    let (status, links) = attach::probes(
        &mut ebpf,
        &attach::Target {
            btf: &btf,
            kernel,
            plan,
            cgroup_root: settings.cgroup_root.as_deref(),
        },
        probes,
        pins.as_mut(),
    )?;
    hooks.after_attach(
        &mut ebpf,
        &super::Attached {
            btf: &btf,
            kernel: &kernel.btf,
            status: &status,
        },
    )?;
    // The parsed BTF (tens of MiB of small allocations) is gone: give the pages back.
    drop(btf);
    trim_heap();
    Ok(Probes {
        ebpf,
        status,
        pins,
        links,
    })
}
