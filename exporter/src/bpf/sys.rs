//! Every raw `bpf(2)` and `perf_event_open(2)` call bufscope makes itself, in one place (as
//! aya keeps its own in `sys/bpf.rs`). aya loads the object and the programs; the calls here
//! are the ones aya 0.14 does not offer in a form bufscope can use: links it can pin whatever
//! the program type, batch reads of hash maps, and the probe that tells a seccomp filter from a
//! missing capability. The attribute layouts are the kernel's own, as `aya-obj` generates them
//! from the UAPI headers.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;

use aya_obj::generated::{bpf_attach_type, bpf_attr, bpf_cmd, perf_event_attr, perf_type_id};

/// `bpf(cmd, attr)`: the syscall's non-negative result, or errno.
fn bpf(cmd: bpf_cmd, attr: &mut bpf_attr) -> io::Result<i64> {
    // SAFETY: `attr` is a fully initialised `union bpf_attr` (zeroed, then the command's
    // members set) of the size passed; every pointer in it refers to memory that outlives the
    // call (its callers below keep the buffers and strings alive across it).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd as libc::c_long,
            attr as *mut bpf_attr,
            std::mem::size_of::<bpf_attr>() as libc::c_uint,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// A zeroed `union bpf_attr` (the kernel requires every byte it does not read to be 0).
fn zeroed() -> bpf_attr {
    // SAFETY: `bpf_attr` is a union of integer-only structs: all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

/// `bpf()` for a command that returns a new fd.
fn bpf_fd(cmd: bpf_cmd, attr: &mut bpf_attr) -> io::Result<OwnedFd> {
    let fd = bpf(cmd, attr)?;
    let fd = i32::try_from(fd).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
    // SAFETY: the kernel returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `BPF_MAP_LOOKUP_AND_DELETE_ELEM`: copies the value of `key` into `value` and deletes the
/// entry in one step, so nothing the probes add between a read and a delete is lost (hash
/// maps: 5.14+; `value` holds one value per possible CPU, each padded to 8 bytes, for a
/// per-CPU map). `ENOENT` when the key is not there.
pub fn map_lookup_and_delete(map: BorrowedFd<'_>, key: &[u8], value: &mut [u8]) -> io::Result<()> {
    let mut attr = zeroed();
    attr.__bindgen_anon_2.map_fd = map.as_raw_fd() as u32;
    attr.__bindgen_anon_2.key = key.as_ptr() as u64;
    attr.__bindgen_anon_2.__bindgen_anon_1.value = value.as_mut_ptr() as u64;
    bpf(bpf_cmd::BPF_MAP_LOOKUP_AND_DELETE_ELEM, &mut attr).map(|_| ())
}

/// `BPF_LINK_CREATE`: attaches program `prog` to `target` (a cgroup, a perf event) as a BPF
/// link, which can be pinned and which detaches when its last reference goes. No flags: a
/// cgroup link always coexists with other programs on the same cgroup, and the kernel refuses
/// attach flags on links.
pub fn link_create(
    prog: BorrowedFd<'_>,
    target: BorrowedFd<'_>,
    attach_type: bpf_attach_type,
) -> io::Result<OwnedFd> {
    let mut attr = zeroed();
    attr.link_create.__bindgen_anon_1.prog_fd = prog.as_raw_fd() as u32;
    attr.link_create.__bindgen_anon_2.target_fd = target.as_raw_fd() as u32;
    attr.link_create.attach_type = attach_type as u32;
    bpf_fd(bpf_cmd::BPF_LINK_CREATE, &mut attr)
}

/// `BPF_RAW_TRACEPOINT_OPEN`: attaches a tracing program (`tp_btf`, `fentry`, `fexit`) to the
/// target it was loaded for (`name` None), or a raw tracepoint program to tracepoint `name`.
/// Returns the link.
pub fn raw_tracepoint_open(prog: BorrowedFd<'_>, name: Option<&CStr>) -> io::Result<OwnedFd> {
    let mut attr = zeroed();
    attr.raw_tracepoint.name = name.map_or(0, |n| n.as_ptr() as u64);
    attr.raw_tracepoint.prog_fd = prog.as_raw_fd() as u32;
    bpf_fd(bpf_cmd::BPF_RAW_TRACEPOINT_OPEN, &mut attr)
}

/// `BPF_OBJ_PIN`: pins the BPF object (map, link) `fd` at `path` on a bpffs.
pub fn obj_pin(fd: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let mut attr = zeroed();
    attr.__bindgen_anon_4.pathname = c.as_ptr() as u64;
    attr.__bindgen_anon_4.bpf_fd = fd.as_raw_fd() as u32;
    bpf(bpf_cmd::BPF_OBJ_PIN, &mut attr).map(drop)
}

/// One `BPF_MAP_LOOKUP_BATCH` call on the hash map `map`: up to `count` entries from the
/// position `token` (None: the start) into `keys`/`values`. Returns the entries copied and
/// the next position, None when the map has no more (the kernel's `ENOENT`).
pub fn map_lookup_batch(
    map: BorrowedFd<'_>,
    token: Option<u32>,
    count: u32,
    keys: &mut [u8],
    values: &mut [u8],
) -> io::Result<(u32, Option<u32>)> {
    let token_in = token.unwrap_or(0);
    let mut next = 0u32;
    let mut attr = zeroed();
    attr.batch.in_batch = if token.is_some() {
        (&raw const token_in) as u64
    } else {
        0
    };
    attr.batch.out_batch = (&raw mut next) as u64;
    attr.batch.keys = keys.as_mut_ptr() as u64;
    attr.batch.values = values.as_mut_ptr() as u64;
    attr.batch.count = count;
    attr.batch.map_fd = map.as_raw_fd() as u32;
    let r = bpf(bpf_cmd::BPF_MAP_LOOKUP_BATCH, &mut attr);
    // SAFETY: `batch` is the member this command uses; the kernel wrote the count it copied.
    let copied = unsafe { attr.batch.count };
    match r {
        Ok(_) => Ok((copied, Some(next))),
        // The last chunk: `count` says how many were copied before the end.
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok((copied, None)),
        Err(e) => Err(e),
    }
}

/// `BPF_ENABLE_STATS(BPF_STATS_RUN_TIME)`: the kernel counts every BPF program's run time and
/// runs while the returned fd is open (it costs each program run two clock reads).
pub fn enable_run_time_stats() -> io::Result<OwnedFd> {
    let mut attr = zeroed();
    attr.enable_stats.type_ = aya_obj::generated::bpf_stats_type::BPF_STATS_RUN_TIME as u32;
    bpf_fd(bpf_cmd::BPF_ENABLE_STATS, &mut attr)
}

/// `BPF_OBJ_GET_INFO_BY_FD` of program `prog`: its (`run_time_ns`, `run_cnt`), the kernel's
/// totals of the runs it counted while run-time stats were on.
pub fn prog_run_stats(prog: BorrowedFd<'_>) -> io::Result<(u64, u64)> {
    // SAFETY: `bpf_prog_info` is integer-only: all-zero is a valid value.
    let mut info: aya_obj::generated::bpf_prog_info = unsafe { std::mem::zeroed() };
    let mut attr = zeroed();
    attr.info.bpf_fd = prog.as_raw_fd() as u32;
    attr.info.info_len = std::mem::size_of_val(&info) as u32;
    attr.info.info = (&raw mut info) as u64;
    bpf(bpf_cmd::BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    Ok((info.run_time_ns, info.run_cnt))
}

/// True when a seccomp filter, not the kernel, answers `bpf()`: a `bpf()` with an unknown
/// command needs no capability and gets the kernel's `EINVAL`; anything else came from the
/// filter.
pub fn bpf_is_filtered() -> bool {
    // SAFETY: bpf(2) with an unknown command, a null attribute pointer and size 0: the kernel
    // reads nothing and returns EINVAL.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            libc::c_int::MAX,
            std::ptr::null::<libc::c_void>(),
            0 as libc::c_uint,
        )
    };
    r == -1 && io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL)
}

/// `perf_event_open` of tracepoint `id` (from tracefs `events/<category>/<name>/id`) for
/// every process, on CPU 0: the event a tracepoint program is attached through (the program
/// then runs on every CPU).
pub fn perf_event_open_tracepoint(id: u64) -> io::Result<OwnedFd> {
    // SAFETY: `perf_event_attr` is integer-only: all-zero is a valid value.
    let mut attr: perf_event_attr = unsafe { std::mem::zeroed() };
    attr.type_ = perf_type_id::PERF_TYPE_TRACEPOINT as u32;
    attr.size = std::mem::size_of::<perf_event_attr>() as u32;
    attr.config = id;
    attr.__bindgen_anon_2.wakeup_events = 1;
    // SAFETY: a fully initialised attribute of the size it says; pid -1 (every process), CPU 0,
    // no group.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &raw const attr,
            -1 as libc::pid_t,
            0 as libc::c_int,
            -1 as libc::c_int,
            aya_obj::generated::PERF_FLAG_FD_CLOEXEC as libc::c_ulong,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Attaches program `prog` to the perf event `perf` with the perf ioctls (kernels without BPF
/// perf links, before 5.15) and enables it: the program runs until `perf` is closed. Such an
/// attachment cannot be pinned.
pub fn perf_attach_legacy(perf: BorrowedFd<'_>, prog: BorrowedFd<'_>) -> io::Result<()> {
    use aya_obj::generated::{PERF_EVENT_IOC_ENABLE, PERF_EVENT_IOC_SET_BPF};
    // SAFETY: ioctls on a perf event fd with an int argument (the program fd) and none.
    unsafe {
        if libc::ioctl(
            perf.as_raw_fd(),
            PERF_EVENT_IOC_SET_BPF as _,
            prog.as_raw_fd(),
        ) != 0
        {
            return Err(io::Error::last_os_error());
        }
        if libc::ioctl(perf.as_raw_fd(), PERF_EVENT_IOC_ENABLE as _, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_command_is_not_filtered_here() {
        // The test suite runs without a seccomp filter on bpf(): the kernel answers.
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        if status.lines().any(|l| l == "Seccomp:\t0") {
            assert!(!bpf_is_filtered());
        }
    }

    #[test]
    fn a_bad_fd_is_an_error_not_a_crash() {
        // SAFETY: an fd number no process here has open; the kernel refuses it with EBADF.
        let bad = unsafe { BorrowedFd::borrow_raw(1 << 20) };
        assert!(raw_tracepoint_open(bad, None).is_err());
        assert!(obj_pin(bad, Path::new("/nonexistent/x")).is_err());
    }
}
