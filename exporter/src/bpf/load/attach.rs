//! Step 3 of [`super::load`]: every probe the plan leaves on, in list order — adopted from the
//! pins when its pinned links run the same programs, else attached best variant first (each
//! all-or-nothing) and its links pinned or held.

use std::collections::HashSet;
use std::path::Path;

use anyhow::Context as _;
use aya::{Btf, Ebpf};

use crate::bpf::attach::{AttachEnv, Link, attach};
use crate::bpf::{Hook, LoadPlan, ProbeSpec, ProbeStatus, describe, pins, usable};
use crate::kernel::KernelInfo;

/// What the probes attach to.
pub struct Target<'a> {
    /// The kernel's BTF as aya parsed it.
    pub btf: &'a Btf,
    /// The kernel's layout and BTF as bufscope reads it.
    pub kernel: &'a KernelInfo,
    /// The rooms' plan.
    pub plan: &'a LoadPlan,
    /// The cgroup2 root (None: not mounted).
    pub cgroup_root: Option<&'a Path>,
}

/// Opens a cgroup directory for attaching.
fn open_cgroup(path: &Path) -> anyhow::Result<std::fs::File> {
    std::fs::File::open(path).with_context(|| format!("opening cgroup {}", path.display()))
}

/// Attaches (or adopts) every probe of `probes`; returns their status, in order, and the
/// links of those not pinned (held: dropping them detaches the probes). With `pins`, records
/// which variant of each probe is pinned, removes stale links and writes `META`.
pub fn probes(
    ebpf: &mut Ebpf,
    t: &Target<'_>,
    probes: &[ProbeSpec],
    mut pins: Option<&mut pins::PinDir>,
) -> anyhow::Result<(Vec<ProbeStatus>, Vec<Link>)> {
    let root = t.cgroup_root.map(open_cgroup);
    let tracefs = crate::kernel::tracefs_root();
    let perf_links = t.kernel.btf.has_member("bpf_perf_link", "perf_file");
    let mut status = Vec::with_capacity(probes.len());
    let mut links = Vec::new();
    let mut loaded: HashSet<&'static str> = HashSet::new();
    for (index, spec) in probes.iter().enumerate() {
        if let Some(p) = pins.as_deref_mut() {
            // Set again below when this run pins the probe's links.
            p.set_variant(index, None);
        }
        if let Some((why, configured)) = t.plan.off(spec.name) {
            tracing::info!(probe = spec.name, "probe off: {why}");
            status.push(ProbeStatus::off(*spec, why, configured));
            continue;
        }
        let pin_here = pins.is_some() && t.plan.pinnable(spec.name);
        if let Some(s) = adopt(index, spec, pins.as_deref_mut().filter(|_| pin_here)) {
            status.push(s);
            continue;
        }
        let own_cgroup = t.plan.cgroup_of(spec.name).map(|p| open_cgroup(p));
        let env = AttachEnv {
            btf: t.btf,
            cgroup: own_cgroup.as_ref().or(root.as_ref()),
            perf_links,
            tracefs: tracefs.as_deref(),
        };
        let (mut s, done) = attach_probe(ebpf, spec, t, &env, &mut loaded);
        if let Some(done) = done {
            let pin = pin_here && pinnable(s.variant_hooks(), perf_links, spec.name);
            match pins.as_deref_mut().filter(|_| pin) {
                Some(p) => keep_pinned(p, index, &mut s, done),
                None => links.extend(done),
            }
        }
        status.push(s);
    }
    if let Some(p) = &pins {
        p.drop_stale_links(probes)?;
        p.write_meta()?;
    }
    Ok((status, links))
}

/// Probe `spec` (the `index`-th) adopted from `pins` when its pinned links run the same
/// programs: nothing is loaded, the links keep running.
fn adopt(index: usize, spec: &ProbeSpec, pins: Option<&mut pins::PinDir>) -> Option<ProbeStatus> {
    let p = pins?;
    let i = p.adoptable(index, spec)?;
    p.set_variant(index, Some(i));
    tracing::info!(probe = spec.name, hooks = %describe(spec.variants[i]), "probe adopted (pinned links keep running)");
    Some(ProbeStatus {
        variant: i,
        attached: true,
        error: None,
        pinned: true,
        ..ProbeStatus::off(*spec, "", true)
    })
}

/// Pins the links `done` of the probe of `s`: not pinned is not attached (a half-pinned
/// probe would count wrong). The pins hold the links afterwards (or, on failure, nothing
/// does: detached).
fn keep_pinned(p: &mut pins::PinDir, index: usize, s: &mut ProbeStatus, done: Vec<Link>) {
    let probe = s.spec.name;
    match pin_links(p, probe, &done) {
        Ok(()) => {
            s.pinned = true;
            p.set_variant(index, Some(s.variant));
        }
        Err(e) => {
            tracing::warn!(probe, "probe detached: pinning failed: {e:#}");
            s.error = Some(format!("pinning failed: {e:#}"));
            s.attached = false;
        }
    }
}

/// A load error with the verifier's log cut to its verdict: the log's last statement before
/// its statistics (e.g. `unknown func bpf_getsockopt#57`), which is what names the reason; the
/// whole log is hundreds of lines of register states.
fn verifier_reason(e: &str) -> String {
    let Some((head, log)) = e.split_once("Verifier output:") else {
        return e.to_string();
    };
    let verdict = log
        .lines()
        .map(str::trim)
        .take_while(|l| !l.starts_with("verification time") && !l.starts_with("processed "))
        .filter(|l| !l.is_empty())
        .last();
    match verdict {
        Some(v) => format!("{head}verifier: {v}"),
        None => e.to_string(),
    }
}

/// Tries the variants of `spec` best first; returns its status and, when one attached, its
/// links.
fn attach_probe(
    ebpf: &mut Ebpf,
    spec: &ProbeSpec,
    t: &Target<'_>,
    env: &AttachEnv<'_>,
    loaded: &mut HashSet<&'static str>,
) -> (ProbeStatus, Option<Vec<Link>>) {
    let mut errors = Vec::new();
    let mut skipped = Vec::new();
    for (i, hooks) in spec.variants.iter().enumerate() {
        if let Some(why) = t.plan.passed_over(spec.name, i) {
            // A setting, not the kernel: not an error of the variant finally used.
            skipped.push((i, why.to_string()));
            continue;
        }
        if let Err(why) = usable(hooks, &t.kernel.btf) {
            errors.push(format!("{}: {why}", describe(hooks)));
            skipped.push((i, why));
            continue;
        }
        match attach(ebpf, hooks, env, loaded) {
            Ok(done) => {
                let error = (!errors.is_empty()).then(|| errors.join("; "));
                match &error {
                    None => {
                        tracing::info!(probe = spec.name, hooks = %describe(hooks), "probe attached")
                    }
                    Some(e) => tracing::info!(
                        probe = spec.name,
                        hooks = %describe(hooks),
                        "probe attached through a fallback ({e})"
                    ),
                }
                let status = ProbeStatus {
                    spec: *spec,
                    attached: true,
                    variant: i,
                    error,
                    skipped,
                    configured: true,
                    pinned: false,
                };
                return (status, Some(done));
            }
            Err(e) => {
                let e = verifier_reason(&format!("{e:#}"));
                errors.push(format!("{}: {e}", describe(hooks)));
                skipped.push((i, e));
            }
        }
    }
    let error = if errors.is_empty() {
        "no variant".to_string()
    } else {
        errors.join("; ")
    };
    tracing::warn!(
        probe = spec.name,
        "probe could not attach, the other probes keep running: {error}"
    );
    let status = ProbeStatus {
        skipped,
        ..ProbeStatus::off(*spec, error, true)
    };
    (status, None)
}

/// Whether the links of `hooks` can be pinned on this kernel: classic tracepoints get a BPF
/// link (which can be pinned) only where the kernel has perf links (5.15+; `struct
/// bpf_perf_link` in BTF); before, they are attached with perf-event ioctls and the probe runs
/// unpinned (it counts while bufscope runs).
fn pinnable(hooks: &[Hook], perf_links: bool, probe: &str) -> bool {
    if hooks.iter().any(|h| matches!(h, Hook::Procfs { .. })) {
        // Nothing of it runs in the kernel: there is nothing to keep.
        return false;
    }
    let ok = perf_links || !hooks.iter().any(|h| matches!(h, Hook::Tracepoint { .. }));
    if !ok {
        tracing::warn!(
            probe,
            "this kernel attaches tracepoints without BPF links (perf links need 5.15+): the \
             probe runs unpinned and stops counting while bufscope is not running"
        );
    }
    ok
}

/// Pins the links of one attached variant at `DIR/links/<probe>_<n>`, each replacing the
/// link an earlier run pinned there (removed right before, after the new one attached); on
/// failure removes what it pinned of this probe.
fn pin_links(pins: &pins::PinDir, probe: &str, links: &[Link]) -> anyhow::Result<()> {
    let result = links.iter().enumerate().try_for_each(|(k, l)| {
        let path = pins.link_path(probe, k);
        if std::fs::symlink_metadata(&path).is_ok() {
            pins.lock.remove_link(&format!("{probe}_{k}"))?;
        }
        l.pin(&path)
    });
    if result.is_err() {
        for k in 0..links.len() {
            let _ = pins.lock.remove_link(&format!("{probe}_{k}"));
        }
    }
    result
}

#[cfg(test)]
mod tests {
    #[test]
    fn verifier_reason_is_the_logs_verdict() {
        let e = "loading cgroup/bind4: the BPF_PROG_LOAD syscall returned Invalid argument \
                 (os error 22). Verifier output: ; #[cgroup_sock_addr(bind4)]\n0: (bf) r6 = r1\n\
                 235: (85) call bpf_getsockopt#57\nunknown func bpf_getsockopt#57\n\
                 verification time 1530 usec\nstack depth 96+0\nprocessed 93 insns\n: Invalid argument";
        assert_eq!(
            super::verifier_reason(e),
            "loading cgroup/bind4: the BPF_PROG_LOAD syscall returned Invalid argument (os error 22). verifier: unknown func bpf_getsockopt#57"
        );
        assert_eq!(super::verifier_reason("no log"), "no log");
    }
}
