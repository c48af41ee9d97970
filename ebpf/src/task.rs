//! The calling task (process context only): who it is, and the files behind its fds.
//!
//! Two ways to read `current`, both from BTF-resolved offsets:
//! - tracing programs (`tp_btf`, classic tracepoints) load through a BTF-typed `current`
//!   (`bpf_get_current_task_btf`, 5.11+) where the kernel has it (`CONFIG.current_task_btf`),
//!   else read it with `bpf_get_current_task` and probe reads; the verifier sees the flag as a
//!   constant and drops the other branch, helper call included;
//! - cgroup programs always use `bpf_get_current_task` and probe reads (every cgroup program
//!   type may call both from 5.10 on; `bpf_get_current_task_btf` came to them later), and the
//!   `cgroup/setsockopt` type reads pid and comm from the task too: it gets
//!   `bpf_get_current_pid_tgid`/`bpf_get_current_comm` only from 6.1 on.

use aya_ebpf::helpers::{
    bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid,
    bpf_get_current_task, bpf_get_current_task_btf, bpf_probe_read_kernel,
};
use bufscope_common::Owner;

use crate::kmem::{kread, load};

/// Whether tracing programs load through a BTF-typed `current` on this kernel.
#[inline(always)]
fn task_btf() -> bool {
    cfg!(current_task_btf) != 0
}

/// `current` for a tracing program: BTF-typed (for [`load`]) where the kernel has
/// `bpf_get_current_task_btf`, else a plain address (for [`kread`]); read through [`tload`].
#[inline(always)]
fn current_task() -> u64 {
    if task_btf() {
        unsafe { bpf_get_current_task_btf() as u64 }
    } else {
        unsafe { bpf_get_current_task() }
    }
}

/// Reads a `T` at `base + off` of a pointer reached from [`current_task`]: a direct load
/// where `current` is BTF-typed (the pointers loaded from it are too), a probe read otherwise.
#[inline(always)]
fn tload<T: Copy + Default>(base: u64, off: u32) -> T {
    if task_btf() {
        load(base, off)
    } else {
        kread(base, off)
    }
}

/// `current->group_leader->start_boottime` (ns since boot: tells reused pids apart) through
/// `read`, 0 when unreadable.
#[inline(always)]
fn start_ns(task: u64, read_ptr: impl Fn(u64, u32) -> u64) -> u64 {
    let leader = read_ptr(task, cfg!(task_group_leader));
    if leader == 0 {
        0
    } else {
        read_ptr(leader, cfg!(task_start_boottime))
    }
}

/// The calling process, as recorded for owners and setsockopt events (tracing programs).
#[inline(always)]
pub(crate) fn current_owner() -> Owner {
    let pid_tgid = bpf_get_current_pid_tgid();
    Owner {
        tgid: (pid_tgid >> 32) as u32,
        pid: pid_tgid as u32,
        cgroup_id: unsafe { bpf_get_current_cgroup_id() },
        start_ns: start_ns(current_task(), tload::<u64>),
        comm: bpf_get_current_comm().unwrap_or_default(),
    }
}

/// [`current_owner`] for cgroup socket programs that have the pid and comm helpers
/// (`cgroup/sock_create`, `cgroup/bind4` and the other socket-address hooks).
#[inline(always)]
pub(crate) fn cgroup_owner() -> Owner {
    let pid_tgid = bpf_get_current_pid_tgid();
    Owner {
        tgid: (pid_tgid >> 32) as u32,
        pid: pid_tgid as u32,
        cgroup_id: unsafe { bpf_get_current_cgroup_id() },
        start_ns: start_ns(unsafe { bpf_get_current_task() }, kread::<u64>),
        comm: bpf_get_current_comm().unwrap_or_default(),
    }
}

/// [`current_owner`] for `cgroup/setsockopt`: everything but the cgroup id read from the task.
#[inline(always)]
pub(crate) fn sockopt_owner() -> Owner {
    let task = unsafe { bpf_get_current_task() };
    Owner {
        tgid: kread(task, cfg!(task_tgid)),
        pid: kread(task, cfg!(task_pid)),
        cgroup_id: unsafe { bpf_get_current_cgroup_id() },
        start_ns: start_ns(task, kread::<u64>),
        comm: kread(task, cfg!(task_comm)),
    }
}

/// `current->group_leader->comm`: the process's name, whichever of its threads (a named
/// worker thread, an io_uring worker) makes the call (cgroup programs: probe reads).
#[inline(always)]
pub(crate) fn leader_comm() -> [u8; 16] {
    let task = unsafe { bpf_get_current_task() };
    let leader: u64 = kread(task, cfg!(task_group_leader));
    kread(leader, cfg!(task_comm))
}

/// `bpf_get_current_ancestor_cgroup_id(level)` from the task (for `cgroup/setsockopt`,
/// which gets that helper only from 6.1 on): the id of the calling task's cgroup2 ancestor
/// at `level`, 0 when its cgroup is shallower.
#[inline(always)]
pub(crate) fn ancestor_cgroup_id(level: u32) -> u64 {
    let task = unsafe { bpf_get_current_task() };
    let cset: u64 = kread(task, cfg!(task_cgroups));
    let cgrp: u64 = kread(cset, cfg!(css_set_dfl_cgrp));
    if cgrp == 0 {
        return 0;
    }
    let depth: i32 = kread(cgrp, cfg!(cgroup_level));
    if depth < 0 || level > depth as u32 {
        return 0;
    }
    let slot = cfg!(cgroup_ancestors) + level * 8;
    if cfg!(cgroup_ancestor_ids) != 0 {
        return kread(cgrp, slot);
    }
    let ancestor: u64 = kread(cgrp, slot);
    let kn: u64 = kread(ancestor, cfg!(cgroup_kn));
    kread(kn, cfg!(kn_id))
}

/// `current->files->fdt->fd[fd]` (a `struct file *`), 0 when out of range: loads through
/// [`tload`] down to the fd array, then one helper read (the array is a plain pointer to the
/// verifier either way).
#[inline(always)]
pub(crate) fn fd_file(fd: u64) -> u64 {
    let files: u64 = tload(current_task(), cfg!(task_files));
    if files == 0 {
        return 0;
    }
    let fdt: u64 = tload(files, cfg!(files_fdt));
    if fdt == 0 {
        return 0;
    }
    let max_fds: u32 = tload(fdt, cfg!(fdt_max_fds));
    if fd >= max_fds as u64 {
        return 0;
    }
    let fd_array: u64 = tload(fdt, cfg!(fdt_fd));
    if fd_array == 0 {
        return 0;
    }
    unsafe { bpf_probe_read_kernel((fd_array + fd * 8) as *const u64) }.unwrap_or(0)
}
