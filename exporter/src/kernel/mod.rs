//! What bufscope needs to know about the running kernel: struct layouts and drop reasons (from
//! BTF), tracefs, sysctls, capabilities. Resolved once at start-up into [`KernelInfo`], which
//! every probe and signal module receives.

pub mod btf;
pub mod caps;
pub mod compat;
pub mod netlink;
pub mod reasons;
pub mod sock_diag;
pub mod wg_netlink;

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use bufscope_common::{Config, REASON_WORDS};

pub use btf::{BtfError, KernelBtf};
pub use reasons::DropReasons;

/// Everything resolved from the running kernel at start-up.
pub struct KernelInfo {
    /// `uname -r`.
    pub release: String,
    /// The kernel's BTF.
    pub btf: KernelBtf,
    /// Drop reasons by number and name.
    pub reasons: DropReasons,
    /// Reasons being counted (numbers).
    pub tracked_reasons: Vec<u16>,
    /// Layout and behaviour for the BPF side.
    pub config: Config,
}

impl KernelInfo {
    /// Reads BTF from `btf_path` and resolves everything the probes need.
    pub fn load(btf_path: &Path, tracked: &[String]) -> anyhow::Result<Self> {
        Self::load_from(btf_path, tracked, true)
    }

    /// [`KernelInfo::load`] for another kernel's BTF (`bufscope check --btf`): drop reasons
    /// come from that BTF only, never from this machine's tracefs.
    pub fn load_offline(btf_path: &Path, tracked: &[String]) -> anyhow::Result<Self> {
        Self::load_from(btf_path, tracked, false)
    }

    fn load_from(btf_path: &Path, tracked: &[String], running: bool) -> anyhow::Result<Self> {
        let btf = KernelBtf::open(btf_path)?;
        let reasons = DropReasons::from_btf(&btf)
            .filter(|r| !r.is_empty())
            .or_else(|| {
                running.then(tracefs_root).flatten().and_then(|t| {
                    DropReasons::from_tracepoint_format(&t.join("events/skb/kfree_skb/format"))
                })
            })
            .filter(|r| !r.is_empty())
            .unwrap_or_else(DropReasons::without_kernel_reasons);
        let mut tracked_reasons = Vec::new();
        for name in tracked {
            match reasons.value(name) {
                Some(v) => tracked_reasons.push(v),
                None => tracing::warn!(
                    reason = %name,
                    "this kernel has no drop reason {name}; it will not be counted"
                ),
            }
        }
        let config = build_config(&btf, &reasons, &tracked_reasons)
            .context("resolving kernel struct offsets from BTF")?;
        Ok(Self {
            release: kernel_release(),
            btf,
            reasons,
            tracked_reasons,
            config,
        })
    }
}

/// Fills [`Config`] from BTF.
pub fn build_config(
    btf: &KernelBtf,
    reasons: &DropReasons,
    tracked: &[u16],
) -> Result<Config, BtfError> {
    let l = Layout { btf };
    let mut c = Config::zeroed();
    files_layout(&mut c, &l)?;
    sock_layout(&mut c, &l)?;
    tcp_net_layout(&mut c, &l)?;
    skb_dev_layout(&mut c, &l)?;
    task_cgroup_layout(&mut c, &l)?;
    c.reason_mask = [0; REASON_WORDS];
    for r in tracked {
        if (*r as usize) < REASON_WORDS * 64 {
            c.reason_mask[*r as usize / 64] |= 1u64 << (r % 64);
        }
    }
    c.reason_full_ring = reasons
        .value("FULL_RING")
        .map(u32::from)
        .unwrap_or(u32::MAX);
    Ok(c)
}

/// Member offsets and fields read from the kernel's BTF.
struct Layout<'a> {
    btf: &'a KernelBtf,
}

impl Layout<'_> {
    fn off(&self, s: &str, m: &str) -> Result<u32, BtfError> {
        self.btf.offset(s, m)
    }

    fn field(&self, s: &str, m: &str) -> Result<bufscope_common::Field, BtfError> {
        self.btf.member(s, m).map(|i| i.field())
    }
}

/// A task's files, fds and the socket behind an fd.
fn files_layout(c: &mut Config, l: &Layout<'_>) -> Result<(), BtfError> {
    c.task_files = l.off("task_struct", "files")?;
    c.task_group_leader = l.off("task_struct", "group_leader")?;
    c.task_start_boottime = l
        .off("task_struct", "start_boottime")
        .or_else(|_| l.off("task_struct", "real_start_time"))?;
    c.files_fdt = l.off("files_struct", "fdt")?;
    c.fdt_max_fds = l.off("fdtable", "max_fds")?;
    c.fdt_fd = l.off("fdtable", "fd")?;
    c.file_private_data = l.off("file", "private_data")?;
    c.file_inode = l.off("file", "f_inode")?;
    c.inode_ino = l.off("inode", "i_ino")?;
    c.socket_sk = l.off("socket", "sk")?;
    c.socket_ino = l.off("socket_alloc", "vfs_inode")? + c.inode_ino;
    Ok(())
}

/// `struct sock`: its socket, namespace, buffers and lock bits.
fn sock_layout(c: &mut Config, l: &Layout<'_>) -> Result<(), BtfError> {
    c.sk_socket = l.off("sock", "sk_socket")?;
    c.sk_net = l.off("sock", "__sk_common.skc_net")?;
    c.sk_family = l.off("sock", "__sk_common.skc_family")?;
    c.sk_num = l.off("sock", "__sk_common.skc_num")?;
    c.sk_state = l.off("sock", "__sk_common.skc_state")?;
    c.sk_rcvbuf = l.off("sock", "sk_rcvbuf")?;
    c.sk_sndbuf = l.off("sock", "sk_sndbuf")?;
    c.sk_rmem_alloc = l.off("sock", "sk_backlog.rmem_alloc")?;
    c.sk_userlocks = l.field("sock", "sk_userlocks")?;
    c.sk_protocol = l.field("sock", "sk_protocol")?;
    c.sk_type = l.field("sock", "sk_type")?;
    Ok(())
}

/// `struct tcp_sock` (window scale, RTT, receive space) and the per-netns sysctls.
fn tcp_net_layout(c: &mut Config, l: &Layout<'_>) -> Result<(), BtfError> {
    c.tcp_rcv_wscale = l.field("tcp_sock", "rx_opt.rcv_wscale")?;
    c.tcp_snd_wscale = l.field("tcp_sock", "rx_opt.snd_wscale")?;
    c.tcp_wscale_ok = l.field("tcp_sock", "rx_opt.wscale_ok")?;
    c.tcp_window_clamp = l.off("tcp_sock", "window_clamp")?;
    c.tcp_rcv_rtt_us = l.off("tcp_sock", "rcv_rtt_est.rtt_us")?;
    c.tcp_srtt_us = l.off("tcp_sock", "srtt_us")?;
    c.tcp_copied_seq = l.off("tcp_sock", "copied_seq")?;
    c.tcp_rcvq_space_seq = l.off("tcp_sock", "rcvq_space.seq")?;

    c.net_inum = l.off("net", "ns.inum")?;
    c.net_tcp_rmem_max = l.off("net", "ipv4.sysctl_tcp_rmem")? + 8;
    c.net_tcp_wmem_max = l.off("net", "ipv4.sysctl_tcp_wmem")? + 8;
    // Per-netns since ≈4.15; absent (bits = 0) means "not per netns": treat as on.
    c.net_tcp_moderate_rcvbuf = l
        .field("net", "ipv4.sysctl_tcp_moderate_rcvbuf")
        .unwrap_or_default();
    c.net_tcp_window_scaling = l
        .field("net", "ipv4.sysctl_tcp_window_scaling")
        .unwrap_or_default();
    Ok(())
}

/// `struct sk_buff`, its shared info, the receiving device, and the credentials the guard reads.
fn skb_dev_layout(c: &mut Config, l: &Layout<'_>) -> Result<(), BtfError> {
    c.skb_head = l.off("sk_buff", "head")?;
    let end = l.btf.member("sk_buff", "end")?;
    c.skb_end = end.byte_offset();
    // sk_buff_data_t is an `unsigned int` offset on 64-bit kernels, a pointer on 32-bit ones.
    c.skb_end_is_offset = u32::from(!end.is_pointer);
    c.skb_dev = l.off("sk_buff", "dev")?;
    c.skb_data = l.off("sk_buff", "data")?;
    c.skb_len = l.off("sk_buff", "len")?;
    c.skb_cb = l.off("sk_buff", "cb")?;
    c.skb_transport_header = l.off("sk_buff", "transport_header")?;
    c.shinfo_gso_segs = l.off("skb_shared_info", "gso_segs")?;
    c.dev_ifindex = l.off("net_device", "ifindex")?;
    c.dev_name = l.off("net_device", "name")?;
    c.dev_net = l.off("net_device", "nd_net")?;
    c.task_cred = l.off("task_struct", "cred")?;
    c.cred_cap_effective = l.off("cred", "cap_effective")?;
    c.cred_user_ns = l.off("cred", "user_ns")?;
    c.user_ns_level = l.off("user_namespace", "level")?;
    Ok(())
}

/// The current task (pid, comm) and its cgroup.
fn task_cgroup_layout(c: &mut Config, l: &Layout<'_>) -> Result<(), BtfError> {
    c.current_task_btf = u32::from(has_helper(l.btf, "get_current_task_btf"));
    c.task_pid = l.off("task_struct", "pid")?;
    c.task_tgid = l.off("task_struct", "tgid")?;
    c.task_comm = l.off("task_struct", "comm")?;
    c.task_cgroups = l.off("task_struct", "cgroups")?;
    c.css_set_dfl_cgrp = l.off("css_set", "dfl_cgrp")?;
    c.cgroup_level = l.off("cgroup", "level")?;
    (c.cgroup_ancestors, c.cgroup_ancestor_ids) = match l.off("cgroup", "ancestors") {
        Ok(o) => (o, 0),
        Err(_) => (l.off("cgroup", "ancestor_ids")?, 1),
    };
    c.cgroup_kn = l.off("cgroup", "kn")?;
    c.kn_id = l.off("kernfs_node", "id")?;
    Ok(())
}

/// Whether the kernel has BPF helper `bpf_<name>`: its BTF's `enum bpf_func_id` has
/// `BPF_FUNC_<name>` (a helper's number exists exactly where the kernel implements it).
pub fn has_helper(btf: &KernelBtf, name: &str) -> bool {
    let want = format!("BPF_FUNC_{name}");
    btf.enum_values("bpf_func_id")
        .is_ok_and(|v| v.iter().any(|(n, _)| *n == want))
}

/// How tracing programs read `current` on this kernel, for `bufscope check`.
pub fn task_access(c: &Config) -> &'static str {
    if c.current_task_btf != 0 {
        "current task BTF-typed (bpf_get_current_task_btf)"
    } else {
        "current task via bpf_get_current_task + probe reads (no bpf_get_current_task_btf)"
    }
}

/// A text file of `/proc` or `/sys` read as bytes and decoded lossily: process names,
/// cgroup paths, interface names and mount points are bytes any local user may choose, and
/// one that is not UTF-8 must not make the whole file unreadable.
pub fn read_lossy(path: impl AsRef<Path>) -> Option<String> {
    let b = std::fs::read(path).ok()?;
    Some(match String::from_utf8(b) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    })
}

/// `uname -r`.
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// Where tracefs is mounted, if it is.
pub fn tracefs_root() -> Option<PathBuf> {
    ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.join("events").is_dir())
}

/// Mounts tracefs at `/sys/kernel/tracing` when it is not mounted anywhere (classic
/// tracepoints need it to resolve their ids).
pub fn ensure_tracefs() -> anyhow::Result<PathBuf> {
    if let Some(p) = tracefs_root() {
        return Ok(p);
    }
    let target = c"/sys/kernel/tracing";
    // SAFETY: valid NUL-terminated strings; mount(2) has no other preconditions.
    let rc = unsafe {
        libc::mount(
            c"tracefs".as_ptr(),
            target.as_ptr(),
            c"tracefs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        anyhow::bail!(
            "tracefs is not mounted and mounting it at /sys/kernel/tracing failed ({err}): \
             mount it (`mount -t tracefs tracefs /sys/kernel/tracing`) or grant CAP_SYS_ADMIN"
        );
    }
    tracing::info!("mounted tracefs at /sys/kernel/tracing");
    tracefs_root().context("tracefs mounted but /sys/kernel/tracing/events is missing")
}

/// Where the cgroup2 (unified) hierarchy is mounted, from `/proc/self/mountinfo` (it may be
/// anywhere: `/sys/fs/cgroup` on pure v2 hosts, `/sys/fs/cgroup/unified` in hybrid mode).
/// None when no cgroup2 is mounted.
pub fn cgroup2_root() -> Option<PathBuf> {
    if let Some(p) = CGROUP2_ROOT.get() {
        return Some(p.clone());
    }
    let text = read_lossy("/proc/self/mountinfo")?;
    cgroup2_in_mountinfo(&text)
}

/// `--path.cgroup2`, once validated.
static CGROUP2_ROOT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// `CGROUP2_SUPER_MAGIC`.
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

/// Whether `dir` is on a cgroup2 file system.
pub fn is_cgroup2(dir: &Path) -> std::io::Result<bool> {
    Ok(fs_magic(dir)? == CGROUP2_SUPER_MAGIC)
}

/// `BPF_FS_MAGIC`: the `statfs` type of bpffs.
pub const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
/// `PROC_SUPER_MAGIC`: the `statfs` type of procfs.
pub const PROC_SUPER_MAGIC: i64 = 0x9fa0;

/// The `statfs(2)` type (`f_type`, the file system's magic number) of the file system `path`
/// is on.
pub fn fs_magic(path: &Path) -> std::io::Result<i64> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: statfs with a NUL-terminated path and a zeroed struct it fills.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st.f_type as i64)
}

/// Uses `dir` as the cgroup2 root (`--path.cgroup2`) after checking that it is one; on hosts
/// in hybrid mode (cgroup v1 at `dir`, v2 at `dir/unified`) the `unified` mount is used.
pub fn set_cgroup2_root(dir: &Path) -> anyhow::Result<()> {
    let hybrid = dir.join("unified");
    let root = match is_cgroup2(dir) {
        Ok(true) => dir.to_path_buf(),
        Ok(false) if is_cgroup2(&hybrid).unwrap_or(false) => hybrid,
        Ok(false) => anyhow::bail!(
            "--path.cgroup2 {}: not a cgroup2 mount (nor is {}): mount the host's cgroup2 \
             there, e.g. a hostPath volume of /sys/fs/cgroup",
            dir.display(),
            hybrid.display()
        ),
        Err(e) => anyhow::bail!("--path.cgroup2 {}: {e}", dir.display()),
    };
    let _ = CGROUP2_ROOT.set(root);
    Ok(())
}

/// The first cgroup2 mount point in a mountinfo text (the field after ` - ` is the type;
/// the fifth field is the mount point, with octal escapes such as `\040` for a space).
fn cgroup2_in_mountinfo(text: &str) -> Option<PathBuf> {
    text.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        if post.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let mnt = pre.split_whitespace().nth(4)?;
        Some(PathBuf::from(unescape_octal(mnt)))
    })
}

fn unescape_octal(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Reads an integer sysctl (`net/core/rmem_max` → `/proc/sys/net/core/rmem_max`).
pub fn sysctl_i64(name: &str) -> Option<i64> {
    sysctl_field(name, 0)
}

/// Reads field `n` (from 0) of a sysctl holding several integers (`net/ipv4/tcp_rmem`).
pub fn sysctl_field(name: &str, n: usize) -> Option<i64> {
    std::fs::read_to_string(Path::new("/proc/sys").join(name))
        .ok()?
        .split_whitespace()
        .nth(n)?
        .parse()
        .ok()
}

/// The global socket buffer ceilings that `SO_RCVBUF`/`SO_SNDBUF` are clamped to. `None` when
/// this process cannot read them (kernels before ≈6.11 hide them inside a container's own
/// network namespace): bufscope then says "unknown" rather than guess.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BufferLimits {
    /// `net.core.rmem_max`.
    pub rmem_max: Option<i64>,
    /// `net.core.wmem_max`.
    pub wmem_max: Option<i64>,
    /// `net.ipv4.tcp_rmem[2]` of this network namespace (autotuning's ceiling).
    pub tcp_rmem_max: Option<i64>,
    /// `net.ipv4.tcp_wmem[2]` of this network namespace (send autotuning's ceiling).
    pub tcp_wmem_max: Option<i64>,
}

impl BufferLimits {
    /// Reads them now (they can change at run time).
    pub fn read() -> Self {
        Self {
            rmem_max: sysctl_i64("net/core/rmem_max"),
            wmem_max: sysctl_i64("net/core/wmem_max"),
            tcp_rmem_max: sysctl_field("net/ipv4/tcp_rmem", 2),
            tcp_wmem_max: sysctl_field("net/ipv4/tcp_wmem", 2),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn cgroup2_mount_point_from_mountinfo() {
        let hybrid = "25 30 0:23 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n\
                      26 25 0:24 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup2_in_mountinfo(hybrid),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        let spaced = "26 25 0:24 / /mnt/my\\040cg rw - cgroup2 none rw\n";
        assert_eq!(
            cgroup2_in_mountinfo(spaced),
            Some(PathBuf::from("/mnt/my cg"))
        );
        assert_eq!(
            cgroup2_in_mountinfo("1 0 0:1 / / rw - ext4 /dev/sda rw\n"),
            None
        );
    }

    #[test]
    fn config_resolves_on_this_kernel() {
        let btf = KernelBtf::open(Path::new("/sys/kernel/btf/vmlinux")).unwrap();
        let reasons = DropReasons::from_btf(&btf).unwrap();
        let rcv = reasons.value("SOCKET_RCVBUFF").unwrap();
        let c = build_config(&btf, &reasons, &[rcv]).unwrap();
        assert_ne!(c.sk_rcvbuf, 0);
        assert_ne!(c.socket_ino, 0);
        assert!(c.sk_userlocks.present() && c.sk_protocol.present());
        assert_eq!(c.reason_mask[rcv as usize / 64], 1u64 << (rcv % 64));
        assert_eq!(
            c.skb_end_is_offset, 1,
            "x86_64 kernels keep skb->end as an offset"
        );
        assert!(c.task_pid != 0 && c.task_comm != 0 && c.kn_id != 0);
    }

    #[test]
    fn helper_presence_agrees_with_bpftool() {
        let btf = KernelBtf::open(Path::new("/sys/kernel/btf/vmlinux")).unwrap();
        let c = bufscope_testkit::btf_dump("c").unwrap();
        for helper in [
            "get_current_task_btf",
            "probe_read_kernel",
            "no_such_helper",
        ] {
            let listed = c.contains(&format!("BPF_FUNC_{helper} = "));
            assert_eq!(has_helper(&btf, helper), listed, "{helper}");
        }
        assert!(has_helper(&btf, "probe_read_kernel"));
        let reasons = DropReasons::from_btf(&btf).unwrap();
        let cfg = build_config(&btf, &reasons, &[]).unwrap();
        assert_eq!(
            cfg.current_task_btf != 0,
            has_helper(&btf, "get_current_task_btf")
        );
        // The cgroup ancestors are pointers since 6.0, ids before; one of them is resolved.
        let ids = btf.has_member("cgroup", "ancestor_ids");
        assert_eq!(cfg.cgroup_ancestor_ids != 0, ids);
    }
}
