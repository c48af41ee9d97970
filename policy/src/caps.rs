//! Does the calling thread hold `CAP_NET_ADMIN` in its effective set?

/// Capability number of `CAP_NET_ADMIN` (linux/capability.h).
pub const CAP_NET_ADMIN: u32 = 12;

/// Whether the calling thread has `CAP_NET_ADMIN` in its *effective* capability set (what the
/// kernel checks for `SO_RCVBUFFORCE`/`SO_SNDBUFFORCE`), read with `capget(2)`. Always `false`
/// off Linux.
pub fn has_cap_net_admin() -> bool {
    has_effective_cap(CAP_NET_ADMIN)
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn has_effective_cap(cap: u32) -> bool {
    // struct __user_cap_header_struct / __user_cap_data_struct, version 3 (two 32-bit words).
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    let mut header = Header {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: header and data are valid, correctly laid out and sized for version 3.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_capget,
            &mut header as *mut Header,
            data.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return false;
    }
    let word = (cap / 32) as usize;
    data.get(word)
        .is_some_and(|d| d.effective & (1 << (cap % 32)) != 0)
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn has_effective_cap(_cap: u32) -> bool {
    false
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Ground truth: the `CapEff` line of /proc/thread-self/status.
    fn cap_eff_from_proc() -> u64 {
        let s = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        let line = s.lines().find(|l| l.starts_with("CapEff:")).unwrap();
        u64::from_str_radix(line["CapEff:".len()..].trim(), 16).unwrap()
    }

    #[test]
    fn capget_agrees_with_proc_status() {
        let from_proc = cap_eff_from_proc() & (1 << CAP_NET_ADMIN) != 0;
        assert_eq!(has_cap_net_admin(), from_proc);
    }
}
