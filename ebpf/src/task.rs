//! The calling task (process context only): who it is, and the files behind its fds.

use aya_ebpf::helpers::{
    bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid,
    bpf_get_current_task_btf, bpf_probe_read_kernel,
};
use bufscope_common::Owner;

use crate::kmem::load;

/// `current` as a BTF-typed (trusted) `struct task_struct *`, for [`load`].
#[inline(always)]
pub(crate) fn current_task() -> u64 {
    unsafe { bpf_get_current_task_btf() as u64 }
}

/// The calling process, as recorded for owners and setsockopt events.
#[inline(always)]
pub(crate) fn current_owner() -> Owner {
    let pid_tgid = bpf_get_current_pid_tgid();
    let leader: u64 = load(current_task(), cfg!(task_group_leader));
    let start_ns = if leader == 0 {
        0
    } else {
        load::<u64>(leader, cfg!(task_start_boottime))
    };
    Owner {
        tgid: (pid_tgid >> 32) as u32,
        pid: pid_tgid as u32,
        cgroup_id: unsafe { bpf_get_current_cgroup_id() },
        start_ns,
        comm: bpf_get_current_comm().unwrap_or_default(),
    }
}

/// `current->files->fdt->fd[fd]` (a `struct file *`), 0 when out of range. Direct loads down
/// to the fd array (a plain pointer to the verifier), then one helper read.
#[inline(always)]
pub(crate) fn fd_file(fd: u64) -> u64 {
    let files: u64 = load(current_task(), cfg!(task_files));
    if files == 0 {
        return 0;
    }
    let fdt: u64 = load(files, cfg!(files_fdt));
    if fdt == 0 {
        return 0;
    }
    let max_fds: u32 = load(fdt, cfg!(fdt_max_fds));
    if fd >= max_fds as u64 {
        return 0;
    }
    let fd_array: u64 = load(fdt, cfg!(fdt_fd));
    if fd_array == 0 {
        return 0;
    }
    unsafe { bpf_probe_read_kernel((fd_array + fd * 8) as *const u64) }.unwrap_or(0)
}
