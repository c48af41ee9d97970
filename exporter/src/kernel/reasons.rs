//! Kernel drop reasons (`enum skb_drop_reason`). Their numbers change between kernels, so they
//! are resolved by name at start-up: from BTF, or from the `skb:kfree_skb` tracepoint format.

use std::collections::BTreeMap;
use std::path::Path;

use super::btf::KernelBtf;

/// Reasons bufscope counts by default: the ones that mean "a buffer or queue was full"
/// (one list, shared with the benchmarks).
pub use bufscope_common::TRACKED_DROP_REASONS as DEFAULT_TRACKED;

/// The running kernel's drop reasons, by number and by name (without `SKB_DROP_REASON_`).
#[derive(Clone, Debug, Default)]
pub struct DropReasons {
    by_value: BTreeMap<u16, String>,
}

impl DropReasons {
    /// From the BTF `enum skb_drop_reason`.
    pub fn from_btf(btf: &KernelBtf) -> Option<Self> {
        let values = btf.enum_values("skb_drop_reason").ok()?;
        let by_value = values
            .into_iter()
            .filter_map(|(n, v)| {
                let name = n.strip_prefix("SKB_DROP_REASON_")?;
                (name != "MAX" && v < 0x10000).then(|| (v as u16, name.to_string()))
            })
            .collect();
        Some(Self { by_value })
    }

    /// From the `__print_symbolic` table of a tracepoint format file
    /// (`/sys/kernel/tracing/events/skb/kfree_skb/format`).
    pub fn from_tracepoint_format(path: &Path) -> Option<Self> {
        let text = std::fs::read_to_string(path).ok()?;
        Some(Self::parse_format(&text))
    }

    /// Parses `{ 6, "SOCKET_RCVBUFF" }` pairs.
    pub fn parse_format(text: &str) -> Self {
        let mut by_value = BTreeMap::new();
        let mut rest = text;
        while let Some(start) = rest.find("{ ") {
            rest = &rest[start + 2..];
            let Some(end) = rest.find(" }") else { break };
            let pair = &rest[..end];
            if let Some((num, name)) = pair.split_once(", ") {
                let name = name.trim_matches('"');
                if let Ok(v) = num.trim().parse::<u16>()
                    && name != "MAX"
                    && name
                        .chars()
                        .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
                {
                    by_value.insert(v, name.to_string());
                }
            }
        }
        Self { by_value }
    }

    /// Every reason: (number, name).
    pub fn iter(&self) -> impl Iterator<Item = (u16, &str)> {
        self.by_value.iter().map(|(v, n)| (*v, n.as_str()))
    }

    /// Name of reason `v` (`"REASON_<v>"` when unknown).
    pub fn name(&self, v: u16) -> String {
        self.by_value
            .get(&v)
            .cloned()
            .unwrap_or_else(|| format!("REASON_{v}"))
    }

    /// Number of the reason called `name` (with or without the `SKB_DROP_REASON_` prefix).
    pub fn value(&self, name: &str) -> Option<u16> {
        let name = name.strip_prefix("SKB_DROP_REASON_").unwrap_or(name);
        self.by_value
            .iter()
            .find(|(_, n)| n.as_str() == name)
            .map(|(v, _)| *v)
    }

    /// For kernels without `enum skb_drop_reason` (before 5.17): the two reasons bufscope's
    /// UDP hooks derive from the enqueue error themselves (`-ENOMEM` → `SOCKET_RCVBUFF`,
    /// else `PROTO_MEM`, as later kernels name them), numbered here since the kernel has no
    /// numbers (no `kfree_skb` program can attach there: it has no reason argument).
    pub fn without_kernel_reasons() -> Self {
        let by_value = [(1, "SOCKET_RCVBUFF"), (2, "PROTO_MEM")]
            .into_iter()
            .map(|(v, n)| (v, n.to_string()))
            .collect();
        Self { by_value }
    }

    /// Number of known reasons.
    pub fn len(&self) -> usize {
        self.by_value.len()
    }

    /// True when no reason is known.
    pub fn is_empty(&self) -> bool {
        self.by_value.is_empty()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_print_symbolic() {
        let r = DropReasons::parse_format(
            r#"print fmt: "...", __print_symbolic(REC->reason, { 2, "NOT_SPECIFIED" }, { 6, "SOCKET_RCVBUFF" }, { 128, "MAX" })"#,
        );
        assert_eq!(r.value("SOCKET_RCVBUFF"), Some(6));
        assert_eq!(r.value("SKB_DROP_REASON_NOT_SPECIFIED"), Some(2));
        assert_eq!(r.value("MAX"), None);
        assert_eq!(r.name(6), "SOCKET_RCVBUFF");
        assert_eq!(r.name(99), "REASON_99");
    }

    /// The two independent sources the kernel offers must agree on every tracked reason.
    #[test]
    fn btf_agrees_with_tracepoint_format() {
        let btf = KernelBtf::open(Path::new("/sys/kernel/btf/vmlinux")).unwrap();
        let from_btf = DropReasons::from_btf(&btf).unwrap();
        crate::kernel::ensure_tracefs().unwrap();
        let fmt = crate::kernel::tracefs_root()
            .unwrap()
            .join("events/skb/kfree_skb/format");
        let from_tp = DropReasons::from_tracepoint_format(&fmt).unwrap();
        assert!(
            from_tp.len() > 20,
            "format file parsed to {} reasons",
            from_tp.len()
        );
        for name in DEFAULT_TRACKED {
            assert_eq!(from_btf.value(name), from_tp.value(name), "{name}");
            assert!(
                from_btf.value(name).is_some(),
                "{name} missing on this kernel"
            );
        }
    }
}
