//! Node state a test depends on, set up by the test itself: a mount namespace of its own in
//! which `/sys/fs/bpf` is what the test needs — the plain sysfs directory of a fresh node, or
//! a new, empty bpffs — and tracefs where a test reads it. Nothing propagates back to the
//! node (every mount is made private first), and what was mounted or pinned there goes with
//! the namespace, so a run on a used machine proves what a run on a fresh one would.

use std::ffi::CString;
use std::path::Path;

/// What `/sys/fs/bpf` is in [`in_mount_namespace`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bpffs {
    /// Nothing mounted there: the directory of sysfs a fresh node has.
    Absent,
    /// A new, empty bpffs (mode 0700, as systemd mounts the node's).
    Mounted,
}

/// `statfs(2)`'s `f_type` of a bpffs.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// `statfs(2)`'s `f_type` of tracefs.
const TRACEFS_MAGIC: i64 = 0x7472_6163;

fn fs_type(path: &str) -> Option<i64> {
    let c = CString::new(path).ok()?;
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid NUL-terminated path and a statfs buffer of the right size.
    (unsafe { libc::statfs(c.as_ptr(), &mut st) } == 0).then_some(st.f_type as i64)
}

/// `mount(2)`, panicking with the call on failure.
fn mount(source: &str, target: &str, fstype: Option<&str>, flags: libc::c_ulong, data: &str) {
    let c = |s: &str| CString::new(s).expect("no NUL in a mount argument");
    let (src, tgt, data_c) = (c(source), c(target), c(data));
    let fs = fstype.map(c);
    // SAFETY: valid NUL-terminated strings (or NULL for the type); mount(2) has no other
    // preconditions.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            tgt.as_ptr(),
            fs.as_ref().map_or(std::ptr::null(), |f| f.as_ptr()),
            flags,
            data_c.as_ptr().cast(),
        )
    };
    assert_eq!(
        rc,
        0,
        "mount({source:?}, {target:?}, {fstype:?}, {flags:#x}, {data:?}): {}",
        std::io::Error::last_os_error()
    );
}

/// Unmounts every mount stacked at `path` whose type is `magic`: only ever in a mount
/// namespace of the test's own (checked), never the node's.
fn umount_all(path: &str, magic: i64) {
    let ns = |p: &str| std::fs::read_link(p).ok();
    assert_ne!(
        ns("/proc/thread-self/ns/mnt"),
        ns("/proc/1/ns/mnt"),
        "refusing to unmount {path} in the node's mount namespace"
    );
    let c = CString::new(path).expect("no NUL in a path");
    while fs_type(path) == Some(magic) {
        // SAFETY: a valid NUL-terminated path.
        let rc = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        assert_eq!(rc, 0, "umount {path}: {}", std::io::Error::last_os_error());
    }
}

/// Runs `f` on a thread of its own in a new mount namespace (`unshare(CLONE_NEWNS)`, every
/// mount made private first, as `unshare -m --propagation private` does) where
/// `/sys/fs/bpf` is as `bpffs` says. Every process `f` starts inherits the namespace; the
/// rest of the test process does not. A panic in `f` is the caller's.
pub fn in_mount_namespace<T: Send>(bpffs: Bpffs, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        let t = s.spawn(|| {
            private_mount_namespace();
            umount_all("/sys/fs/bpf", BPF_FS_MAGIC);
            if bpffs == Bpffs::Mounted {
                mount("bpf", "/sys/fs/bpf", Some("bpf"), 0, "mode=0700");
                assert_eq!(fs_type("/sys/fs/bpf"), Some(BPF_FS_MAGIC));
            }
            f()
        });
        t.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// This thread into a new mount namespace whose mounts are all private.
fn private_mount_namespace() {
    crate::require_root();
    // SAFETY: unshare(2) with flags only; CLONE_NEWNS also unshares this thread's fs_struct
    // (root, cwd), which no other thread then shares.
    let rc = unsafe { libc::unshare(libc::CLONE_NEWNS) };
    assert_eq!(
        rc,
        0,
        "unshare(CLONE_NEWNS): {}",
        std::io::Error::last_os_error()
    );
    mount("none", "/", None, libc::MS_REC | libc::MS_PRIVATE, "");
}

/// The text of a tracefs file (`events/udp/udp_fail_queue_rcv_skb/format`), read where the
/// node has tracefs mounted; on a node without it (a fresh one may have none), from a tracefs
/// mounted for the read in a mount namespace of its own. `None` when the kernel has no such
/// file.
pub fn tracefs_file(rel: &str) -> Option<String> {
    let read = |root: &str| std::fs::read_to_string(Path::new(root).join(rel)).ok();
    for root in ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"] {
        if fs_type(root) == Some(TRACEFS_MAGIC) {
            return read(root);
        }
    }
    std::thread::scope(|s| {
        s.spawn(|| {
            private_mount_namespace();
            mount("tracefs", "/sys/kernel/tracing", Some("tracefs"), 0, "");
            read("/sys/kernel/tracing")
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// Whether a bpffs is mounted at `/sys/fs/bpf` (in the calling thread's mount namespace).
pub fn bpffs_mounted() -> bool {
    fs_type("/sys/fs/bpf") == Some(BPF_FS_MAGIC)
}

/// Mounts tracefs at `/sys/kernel/tracing` unless it is mounted there — only inside
/// [`in_mount_namespace`] — for a test whose observer (bpftrace) needs it.
pub fn ensure_tracefs() {
    if !tracefs_mounted() {
        mount("tracefs", "/sys/kernel/tracing", Some("tracefs"), 0, "");
    }
}

/// Whether tracefs is mounted at the path bufscope looks at first.
pub fn tracefs_mounted() -> bool {
    fs_type("/sys/kernel/tracing") == Some(TRACEFS_MAGIC)
}

/// Unmounts tracefs (and a debugfs that would hold it) in the calling thread's mount
/// namespace — only ever inside [`in_mount_namespace`] — so it looks as a node without
/// tracefs does.
pub fn without_tracefs() {
    umount_all("/sys/kernel/tracing", TRACEFS_MAGIC);
    let debug_tracing = "/sys/kernel/debug/tracing";
    umount_all(debug_tracing, TRACEFS_MAGIC);
    assert!(!tracefs_mounted(), "tracefs still mounted");
}
