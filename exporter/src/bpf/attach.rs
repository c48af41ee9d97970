//! Loading and attaching one probe variant's hooks, all or nothing.
//!
//! aya loads each program (the verifier's verdict, with the kernel's BTF for typed
//! programs); the attachment is made here, the same way for every hook: a BPF link
//! ([`super::sys`]) that bufscope owns as an fd, pins where it must outlive bufscope, and
//! detaches by closing. Only classic tracepoints on kernels without perf links (before 5.15)
//! are attached through the perf ioctls instead, and cannot be pinned.

use std::collections::HashSet;
use std::fs::File;
use std::os::fd::{AsFd as _, BorrowedFd, OwnedFd};
use std::path::Path;

use anyhow::{Context as _, bail};
use aya::programs::Program;
use aya::{Btf, Ebpf};
use aya_obj::generated::bpf_attach_type as at;

use super::{Hook, sys};

/// One attached hook: the fd that keeps it attached (closing it detaches it, unless pinned).
#[derive(Debug)]
pub struct Link {
    fd: OwnedFd,
    /// A BPF link (else a perf event with a program set by ioctl: not pinnable).
    bpf_link: bool,
    /// The hook, for errors.
    hook: String,
}

impl Link {
    /// Pins the link at `path`: it then outlives bufscope.
    pub fn pin(&self, path: &Path) -> anyhow::Result<()> {
        if !self.bpf_link {
            bail!(
                "{}: this kernel attached it without a BPF link, which cannot be pinned",
                self.hook
            );
        }
        sys::obj_pin(self.fd.as_fd(), path)
            .with_context(|| format!("pinning {}'s link at {}", self.hook, path.display()))
    }
}

/// What attaching needs besides the object.
pub(super) struct AttachEnv<'a> {
    /// The kernel's BTF, for typed programs.
    pub(super) btf: &'a Btf,
    /// The probe's cgroup, opened (None: no cgroup2 mounted; Some(Err): cannot open it).
    pub(super) cgroup: Option<&'a anyhow::Result<File>>,
    /// The kernel has BPF perf links (5.15+): classic tracepoints get a pinnable link.
    pub(super) perf_links: bool,
    /// tracefs, for tracepoint ids.
    pub(super) tracefs: Option<&'a Path>,
}

impl AttachEnv<'_> {
    fn cgroup(&self) -> anyhow::Result<BorrowedFd<'_>> {
        match self.cgroup {
            Some(Ok(f)) => Ok(f.as_fd()),
            Some(Err(e)) => Err(anyhow::anyhow!("{e:#}")),
            None => bail!("no cgroup2 hierarchy is mounted (see /proc/self/mountinfo)"),
        }
    }
}

/// Loads program `hook.prog()` (once: `loaded` records the programs loaded so far), as its
/// type in the object says.
pub(super) fn load(
    ebpf: &mut Ebpf,
    hook: &Hook,
    btf: &Btf,
    loaded: &mut HashSet<&'static str>,
) -> anyhow::Result<()> {
    let prog = hook.prog();
    if loaded.contains(prog) || matches!(hook, Hook::Procfs { .. }) {
        return Ok(());
    }
    let p = ebpf
        .program_mut(prog)
        .with_context(|| format!("program {prog} missing from the BPF object"))?;
    let target = hook.btf_target();
    let typed = |t: Option<&'static str>| {
        t.ok_or_else(|| anyhow::anyhow!("{prog} is a typed program but its hook names no target"))
    };
    match p {
        Program::TracePoint(p) => p.load()?,
        Program::BtfTracePoint(p) => p.load(typed(target)?, btf)?,
        Program::FEntry(p) => p.load(typed(target)?, btf)?,
        Program::FExit(p) => p.load(typed(target)?, btf)?,
        Program::CgroupSockopt(p) => p.load()?,
        Program::CgroupSockAddr(p) => p.load()?,
        Program::CgroupSock(p) => p.load()?,
        other => bail!(
            "{prog}: program type {:?} has no hook kind",
            other.prog_type()
        ),
    }
    loaded.insert(prog);
    Ok(())
}

/// The fd of loaded program `prog`.
pub(super) fn prog_fd<'a>(ebpf: &'a Ebpf, prog: &str) -> anyhow::Result<BorrowedFd<'a>> {
    let p = ebpf
        .program(prog)
        .with_context(|| format!("program {prog} missing from the BPF object"))?;
    Ok(p.fd()?.as_fd())
}

/// The kernel's attach type of a cgroup hook.
fn cgroup_attach_type(hook: &Hook) -> anyhow::Result<at> {
    Ok(match hook {
        Hook::CgroupSetsockopt { .. } => at::BPF_CGROUP_SETSOCKOPT,
        Hook::CgroupGetsockopt { .. } => at::BPF_CGROUP_GETSOCKOPT,
        Hook::CgroupSockCreate { .. } => at::BPF_CGROUP_INET_SOCK_CREATE,
        Hook::CgroupSockRelease { .. } => at::BPF_CGROUP_INET_SOCK_RELEASE,
        Hook::CgroupSockAddr { attach, .. } => match *attach {
            "bind4" => at::BPF_CGROUP_INET4_BIND,
            "bind6" => at::BPF_CGROUP_INET6_BIND,
            "connect4" => at::BPF_CGROUP_INET4_CONNECT,
            "connect6" => at::BPF_CGROUP_INET6_CONNECT,
            "sendmsg4" => at::BPF_CGROUP_UDP4_SENDMSG,
            "sendmsg6" => at::BPF_CGROUP_UDP6_SENDMSG,
            other => bail!("unknown cgroup socket-address attach point {other}"),
        },
        other => bail!("{} is not a cgroup hook", other.describe()),
    })
}

/// The id of tracepoint `category/name` (tracefs `events/<category>/<name>/id`).
fn tracepoint_id(tracefs: Option<&Path>, category: &str, name: &str) -> anyhow::Result<u64> {
    let tracefs = tracefs.context("tracefs is not mounted")?;
    let path = tracefs.join("events").join(category).join(name).join("id");
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "tracepoint {category}/{name} not found ({})",
            path.display()
        )
    })?;
    text.trim()
        .parse()
        .with_context(|| format!("{}: not a number", path.display()))
}

/// Attaches the loaded program of `hook`.
fn link(ebpf: &Ebpf, hook: &Hook, env: &AttachEnv<'_>) -> anyhow::Result<Link> {
    let what = hook.describe();
    if let Hook::Procfs { file } = hook {
        // Nothing to attach: the kernel must show the file (held open while the probe runs).
        let path = Path::new("/proc/self").join(file);
        let f = File::open(&path)
            .with_context(|| format!("{}: not readable on this kernel", path.display()))?;
        return Ok(Link {
            fd: f.into(),
            bpf_link: false,
            hook: what,
        });
    }
    let prog = prog_fd(ebpf, hook.prog())?;
    let (fd, bpf_link) = match hook {
        Hook::Tracepoint { category, name, .. } => {
            let id = tracepoint_id(env.tracefs, category, name)?;
            let perf = sys::perf_event_open_tracepoint(id)
                .with_context(|| format!("perf_event_open of {what}"))?;
            if env.perf_links {
                (
                    sys::link_create(prog, perf.as_fd(), at::BPF_PERF_EVENT)?,
                    true,
                )
            } else {
                sys::perf_attach_legacy(perf.as_fd(), prog)?;
                (perf, false)
            }
        }
        Hook::BtfTracepoint { .. }
        | Hook::BtfTracepointWhere { .. }
        | Hook::Fentry { .. }
        | Hook::Fexit { .. } => (sys::raw_tracepoint_open(prog, None)?, true),
        Hook::CgroupSetsockopt { .. }
        | Hook::CgroupGetsockopt { .. }
        | Hook::CgroupSockCreate { .. }
        | Hook::CgroupSockRelease { .. }
        | Hook::CgroupSockAddr { .. } => {
            let cgroup = env.cgroup()?;
            (
                sys::link_create(prog, cgroup, cgroup_attach_type(hook)?)?,
                true,
            )
        }
        Hook::Procfs { .. } => bail!("{what} has no program to attach"),
    };
    Ok(Link {
        fd,
        bpf_link,
        hook: what,
    })
}

/// Loads and attaches every hook of one variant; on failure the hooks attached so far are
/// detached again (their links dropped) and the error says which hook failed.
pub(super) fn attach(
    ebpf: &mut Ebpf,
    hooks: &[Hook],
    env: &AttachEnv<'_>,
    loaded: &mut HashSet<&'static str>,
) -> anyhow::Result<Vec<Link>> {
    let mut links = Vec::with_capacity(hooks.len());
    for hook in hooks {
        let what = hook.describe();
        load(ebpf, hook, env.btf, loaded).with_context(|| format!("loading {what}"))?;
        links.push(link(ebpf, hook, env).with_context(|| format!("attaching {what}"))?);
    }
    Ok(links)
}
