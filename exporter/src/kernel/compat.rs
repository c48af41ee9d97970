//! What the older-kernel programs (`ebpf/src/*/compat.rs`) need from BTF, on top of
//! [`super::build_config`]: resolved into [`CompatConfig`] (`COMPAT` in the object).

use bufscope_common::CompatConfig;

use super::{BtfError, DropReasons, KernelBtf};

/// Fills [`CompatConfig`] from BTF. The members exist on every kernel bufscope supports
/// (4.16+); reasons a kernel lacks are `u32::MAX` (never equal to a real reason).
pub fn build(btf: &KernelBtf, reasons: &DropReasons) -> Result<CompatConfig, BtfError> {
    let mut c = CompatConfig::zeroed();
    c.skb_sk = btf.offset("sk_buff", "sk")?;
    c.skb_network_header = btf.offset("sk_buff", "network_header")?;
    c.tcp_rcvq_space = btf.offset("tcp_sock", "rcvq_space.space")?;
    c.tcp_rcvq_time = btf.offset("tcp_sock", "rcvq_space.time")?;
    let reason = |n: &str| reasons.value(n).map(u32::from).unwrap_or(u32::MAX);
    c.reason_rcvbuff = reason("SOCKET_RCVBUFF");
    c.reason_proto_mem = reason("PROTO_MEM");
    Ok(c)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn resolves_on_this_kernel() {
        let btf = KernelBtf::open(std::path::Path::new("/sys/kernel/btf/vmlinux")).unwrap();
        let reasons = DropReasons::from_btf(&btf).unwrap();
        let c = build(&btf, &reasons).unwrap();
        // Cross-check against the generic member lookup the main config uses.
        assert_eq!(c.skb_sk, btf.member("sk_buff", "sk").unwrap().byte_offset());
        assert_eq!(
            c.tcp_rcvq_space + 8,
            c.tcp_rcvq_time,
            "rcvq_space {{ int space; u32 seq; u64 time; }}"
        );
        assert_eq!(
            c.reason_rcvbuff,
            u32::from(reasons.value("SOCKET_RCVBUFF").unwrap())
        );
    }
}
