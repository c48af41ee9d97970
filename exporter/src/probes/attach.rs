//! Attaching one probe variant's hooks all-or-nothing, and handing their links over to be
//! pinned ([`super::pins`]).

use std::collections::HashSet;

use anyhow::Context as _;
use aya::programs::links::FdLink;
use aya::programs::{
    BtfTracePoint, CgroupAttachMode, CgroupSock, CgroupSockAddr, CgroupSockopt, FEntry, FExit,
    TracePoint,
};
use aya::{Btf, Ebpf};

use super::{Hook, pins};

/// What attaching needs besides the object.
pub(super) struct AttachEnv<'a> {
    pub(super) btf: &'a Btf,
    /// The cgroup2 root, opened (None: no cgroup2 mounted; Some(Err): cannot open it).
    pub(super) cgroup: Option<&'a anyhow::Result<std::fs::File>>,
    /// The guard's cgroup, opened (as `cgroup`).
    pub(super) guard_cgroup: Option<&'a anyhow::Result<std::fs::File>>,
    /// Whether the links will be pinned.
    pub(super) pin: bool,
}

impl AttachEnv<'_> {
    fn guard_cgroup(&self) -> anyhow::Result<&std::fs::File> {
        match self.guard_cgroup {
            Some(Ok(f)) => Ok(f),
            Some(Err(e)) => Err(anyhow::anyhow!("{e:#}")),
            None => Err(anyhow::anyhow!(
                "no cgroup2 hierarchy is mounted (see /proc/self/mountinfo)"
            )),
        }
    }

    fn cgroup(&self) -> anyhow::Result<&std::fs::File> {
        match self.cgroup {
            Some(Ok(f)) => Ok(f),
            Some(Err(e)) => Err(anyhow::anyhow!("{e:#}")),
            None => Err(anyhow::anyhow!(
                "no cgroup2 hierarchy is mounted (see /proc/self/mountinfo)"
            )),
        }
    }
}

/// Finishes one attached hook through aya: `None` detaches it (a variant that did not fully
/// attach), `Some(path)` takes its link from aya and pins it there.
type Finish = Box<dyn FnOnce(&mut Ebpf, Option<&std::path::Path>) -> anyhow::Result<()>>;

/// One attached hook.
pub(super) enum Attached {
    /// Its link is owned by aya's program.
    Aya(Finish),
    /// A cgroup link made here to be pinned ([`pins::cgroup_link`]).
    Raw(std::os::fd::OwnedFd),
}

impl Attached {
    /// Detaches it.
    pub(super) fn undo(self, ebpf: &mut Ebpf) {
        match self {
            Attached::Aya(f) => {
                let _ = f(ebpf, None);
            }
            Attached::Raw(fd) => drop(fd),
        }
    }

    /// Pins its link at `path` (the link then outlives bufscope).
    pub(super) fn pin(self, ebpf: &mut Ebpf, path: &std::path::Path) -> anyhow::Result<()> {
        match self {
            Attached::Aya(f) => f(ebpf, Some(path)),
            Attached::Raw(fd) => pins::pin_fd(std::os::fd::AsFd::as_fd(&fd), path),
        }
    }
}

/// The [`Finish`] of program `$prog` of type `$ty` attached as `$id`; `$into` turns the
/// taken link into an [`FdLink`] (or says why it cannot be pinned).
macro_rules! finish {
    ($ty:ty, $prog:expr, $id:expr, $into:expr) => {{
        let (prog, id) = ($prog, $id);
        Attached::Aya(Box::new(
            move |ebpf: &mut Ebpf, pin: Option<&std::path::Path>| {
                let p = program::<$ty>(ebpf, prog)?;
                match pin {
                    None => {
                        let _ = p.detach(id);
                        Ok(())
                    }
                    Some(path) => {
                        let link: FdLink = $into(p.take_link(id)?)?;
                        link.pin(path).with_context(|| {
                            format!("pinning {prog}'s link at {}", path.display())
                        })?;
                        Ok(())
                    }
                }
            },
        ))
    }};
}

/// The link of a tracepoint or a cgroup socket program as an [`FdLink`]: kernels before 5.15
/// attach tracepoints through perf-event ioctls, without a link to pin.
fn fd_link<L>(link: L) -> anyhow::Result<FdLink>
where
    FdLink: TryFrom<L, Error = aya::programs::links::LinkError>,
{
    FdLink::try_from(link).map_err(|e| {
        anyhow::anyhow!("{e}: this kernel attached it without a BPF link, which cannot be pinned")
    })
}

/// Links aya makes but cannot hand over (`cgroup/{set,get}sockopt`) are made by
/// [`pins::cgroup_link`] when pinned.
fn not_pinnable(_: aya::programs::cgroup_sockopt::CgroupSockoptLink) -> anyhow::Result<FdLink> {
    anyhow::bail!("aya cannot hand over a cgroup sockopt link")
}

/// The program `prog` of the object as type `P`.
pub(super) fn program<'a, P>(ebpf: &'a mut Ebpf, prog: &str) -> anyhow::Result<&'a mut P>
where
    &'a mut P: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    let p = ebpf
        .program_mut(prog)
        .with_context(|| format!("program {prog} missing from the object"))?;
    Ok(p.try_into()?)
}

/// How cgroup programs attach: aya makes a BPF link (every kernel bufscope supports has them:
/// 5.7+), which takes no attach flags (the kernel refuses any, even `BPF_F_ALLOW_MULTI`, with
/// EINVAL; aya passes the mode as those flags) and always coexists with other programs on the
/// same cgroup. So the mode is "none".
fn cgroup_mode() -> CgroupAttachMode {
    CgroupAttachMode::Single
}

/// Attaches every hook of one variant; on failure detaches what did attach.
pub(super) fn attach(
    ebpf: &mut Ebpf,
    hooks: &[Hook],
    env: &AttachEnv<'_>,
    loaded: &mut HashSet<&'static str>,
) -> anyhow::Result<Vec<Attached>> {
    let mut done: Vec<Attached> = Vec::new();
    for hook in hooks {
        match attach_one(ebpf, hook, env, loaded) {
            Ok(a) => done.push(a),
            Err(e) => {
                for a in done {
                    a.undo(ebpf);
                }
                return Err(e);
            }
        }
    }
    Ok(done)
}

/// `BPF_CGROUP_GETSOCKOPT`, `BPF_CGROUP_SETSOCKOPT` (`enum bpf_attach_type`).
const BPF_CGROUP_GETSOCKOPT: u32 = 21;
const BPF_CGROUP_SETSOCKOPT: u32 = 22;

/// Attaches a `cgroup/{set,get}sockopt` program at `cgroup`: through aya, or (to be pinned)
/// with a link made here.
fn attach_sockopt(
    ebpf: &mut Ebpf,
    prog: &'static str,
    cgroup: &std::fs::File,
    pin: bool,
    loaded: &mut HashSet<&'static str>,
    (kind, what): (u32, &str),
) -> anyhow::Result<Attached> {
    let p: &mut CgroupSockopt = program(ebpf, prog)?;
    if loaded.insert(prog) {
        p.load().with_context(|| format!("loading {what} {prog}"))?;
    }
    if pin {
        let fd = pins::cgroup_link(
            std::os::fd::AsFd::as_fd(p.fd()?),
            std::os::fd::AsFd::as_fd(cgroup),
            kind,
        )
        .with_context(|| format!("attaching {what}"))?;
        return Ok(Attached::Raw(fd));
    }
    let id = p
        .attach(cgroup, cgroup_mode())
        .with_context(|| format!("attaching {what}"))?;
    Ok(finish!(CgroupSockopt, prog, id, not_pinnable))
}

fn attach_one(
    ebpf: &mut Ebpf,
    hook: &Hook,
    env: &AttachEnv<'_>,
    loaded: &mut HashSet<&'static str>,
) -> anyhow::Result<Attached> {
    Ok(match *hook {
        Hook::Tracepoint {
            prog,
            category,
            name,
        } => {
            let p: &mut TracePoint = program(ebpf, prog)?;
            if loaded.insert(prog) {
                p.load().with_context(|| format!("loading {prog}"))?;
            }
            let id = p
                .attach(category, name)
                .with_context(|| format!("attaching to tracepoint {category}/{name}"))?;
            finish!(TracePoint, prog, id, fd_link)
        }
        Hook::BtfTracepoint { prog, name } | Hook::BtfTracepointWhere { prog, name, .. } => {
            let p: &mut BtfTracePoint = program(ebpf, prog)?;
            if loaded.insert(prog) {
                p.load(name, env.btf)
                    .with_context(|| format!("loading tp_btf/{name}"))?;
            }
            let id = p
                .attach()
                .with_context(|| format!("attaching tp_btf/{name}"))?;
            finish!(BtfTracePoint, prog, id, |l| anyhow::Ok(FdLink::from(l)))
        }
        Hook::Fentry { prog, func } => {
            let p: &mut FEntry = program(ebpf, prog)?;
            if loaded.insert(prog) {
                p.load(func, env.btf)
                    .with_context(|| format!("loading fentry/{func}"))?;
            }
            let id = p
                .attach()
                .with_context(|| format!("attaching fentry/{func}"))?;
            finish!(FEntry, prog, id, |l| anyhow::Ok(FdLink::from(l)))
        }
        Hook::Fexit { prog, func } => {
            let p: &mut FExit = program(ebpf, prog)?;
            if loaded.insert(prog) {
                p.load(func, env.btf)
                    .with_context(|| format!("loading fexit/{func}"))?;
            }
            let id = p
                .attach()
                .with_context(|| format!("attaching fexit/{func}"))?;
            finish!(FExit, prog, id, |l| anyhow::Ok(FdLink::from(l)))
        }
        Hook::CgroupSetsockopt { prog } => attach_sockopt(
            ebpf,
            prog,
            env.cgroup()?,
            env.pin,
            loaded,
            (
                BPF_CGROUP_SETSOCKOPT,
                "cgroup/setsockopt at the cgroup2 root",
            ),
        )?,
        Hook::CgroupGetsockopt { prog } => attach_sockopt(
            ebpf,
            prog,
            env.guard_cgroup()?,
            env.pin,
            loaded,
            (
                BPF_CGROUP_GETSOCKOPT,
                "cgroup/getsockopt at the guard's cgroup",
            ),
        )?,
        Hook::CgroupSockAddr { prog, attach } => {
            let cgroup = env.guard_cgroup()?;
            let p: &mut CgroupSockAddr = program(ebpf, prog)?;
            if loaded.insert(prog) {
                p.load()
                    .with_context(|| format!("loading cgroup/{attach} {prog}"))?;
            }
            let id = p
                .attach(cgroup, cgroup_mode())
                .with_context(|| format!("attaching cgroup/{attach} at the guard's cgroup"))?;
            finish!(CgroupSockAddr, prog, id, fd_link)
        }
        Hook::CgroupSockCreate { prog } => {
            let cgroup = env.cgroup()?;
            let p: &mut CgroupSock = program(ebpf, prog)?;
            if loaded.insert(prog) {
                p.load()
                    .with_context(|| format!("loading cgroup/sock_create {prog}"))?;
            }
            let id = p
                .attach(cgroup, cgroup_mode())
                .context("attaching cgroup/sock_create at the cgroup2 root")?;
            finish!(CgroupSock, prog, id, fd_link)
        }
    })
}
