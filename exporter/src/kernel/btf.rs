//! Struct layouts and enum values of the running kernel, read from its BTF
//! (`/sys/kernel/btf/vmlinux`). Rust BPF programs get no CO-RE relocations, so every offset
//! the probes use is resolved here at start-up and handed to them in `CONFIG`.
//!
//! Only what is asked is parsed: the BTF stays as its bytes (memory-mapped; a sysfs file that
//! cannot be mapped is copied once into an anonymous memory file), a type is decoded when a
//! lookup reaches it, and names are found through a compact index built in one pass over the
//! type headers ([`names`]). Parsing every type up front (btf-rs's cached backend) held
//! tens of MiB of small allocations for the few dozen types bufscope reads.

mod names;

use std::collections::HashMap;
use std::path::Path;

use btf_rs::{Backend, Btf, Type};
use bufscope_common::Field;

use names::NameIndex;

/// Errors while reading the kernel's BTF.
#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    /// The BTF file could not be read or parsed.
    #[error(
        "cannot read kernel BTF from {path} (bufscope needs a kernel built with \
         CONFIG_DEBUG_INFO_BTF=y, or a BTF file for this kernel passed with --kernel.btf-path)"
    )]
    Open {
        /// The file.
        path: String,
        /// Why.
        source: btf_rs::Error,
    },
    /// A struct the probes need is not in the BTF.
    #[error("kernel BTF has no struct {0}")]
    NoStruct(String),
    /// A member the probes need is not in the struct.
    #[error("kernel BTF: struct {strukt} has no member {path}")]
    NoMember {
        /// The struct searched.
        strukt: String,
        /// The dotted member path.
        path: String,
    },
    /// A BTF type could not be resolved.
    #[error("kernel BTF is inconsistent: {0}")]
    Broken(#[from] btf_rs::Error),
}

/// Where a member is and what it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberInfo {
    /// Offset from the start of the outer struct, in bits.
    pub bit_offset: u32,
    /// Width in bits: the bitfield width, or 8 × the member type's size.
    pub bits: u32,
    /// True for bitfields.
    pub bitfield: bool,
    /// True when the member (after typedefs/qualifiers) is a pointer.
    pub is_pointer: bool,
}

impl MemberInfo {
    /// Byte offset (members that are not bitfields are byte-aligned).
    pub fn byte_offset(&self) -> u32 {
        self.bit_offset / 8
    }

    /// The [`Field`] descriptor the BPF side reads with `kread_field`.
    pub fn field(&self) -> Field {
        Field {
            off: self.bit_offset / 8,
            shift: (self.bit_offset % 8) as u16,
            bits: self.bits.min(32) as u16,
        }
    }
}

/// The kernel's BTF with the lookups bufscope needs.
pub struct KernelBtf {
    btf: Btf,
    /// Type ids by name (None: the bytes were not native-endian BTF the index understands;
    /// btf-rs then searches).
    names: Option<NameIndex>,
    /// Cache of struct name → type id (the first complete definition).
    structs: std::cell::RefCell<HashMap<String, u32>>,
}

impl KernelBtf {
    /// Reads BTF from `path` (normally `/sys/kernel/btf/vmlinux`): mapped where the file
    /// allows it, else from a copy in an anonymous memory file; parsed only as far as the
    /// lookups go.
    pub fn open(path: &Path) -> Result<Self, BtfError> {
        let open_err = |source| BtfError::Open {
            path: path.display().to_string(),
            source,
        };
        let bytes = std::fs::read(path).map_err(|e| open_err(btf_rs::Error::IO(e)))?;
        let names = NameIndex::build(&bytes);
        let btf = match Btf::from_file_with_backend(path, Backend::Mmap) {
            Ok(btf) => btf,
            // sysfs files can be mapped only on recent kernels.
            Err(_) => match names::anonymous_copy(&bytes) {
                Some(copy) => Btf::from_file_with_backend(copy.path(), Backend::Mmap)
                    .or_else(|_| Btf::from_bytes(&bytes))
                    .map_err(open_err)?,
                None => Btf::from_bytes(&bytes).map_err(open_err)?,
            },
        };
        Ok(Self {
            btf,
            names,
            structs: Default::default(),
        })
    }

    /// Ids of the types called `name`, in id order.
    fn ids_by_name(&self, name: &str) -> Vec<u32> {
        match &self.names {
            Some(index) => index
                .candidates(name)
                .filter(|id| {
                    self.btf
                        .resolve_type_by_id(*id)
                        .ok()
                        .and_then(|t| self.btf.resolve_name(t.as_btf_type()?).ok())
                        .is_some_and(|n| n == name)
                })
                .collect(),
            None => self.btf.resolve_ids_by_name(name).unwrap_or_default(),
        }
    }

    /// The types called `name`, in id order.
    fn types_by_name(&self, name: &str) -> Vec<Type> {
        self.ids_by_name(name)
            .into_iter()
            .filter_map(|id| self.btf.resolve_type_by_id(id).ok())
            .collect()
    }

    /// Strips typedefs, const, volatile, restrict and type tags.
    fn strip(&self, mut t: Type) -> Result<Type, BtfError> {
        loop {
            t = match &t {
                Type::Typedef(x) => self.btf.resolve_chained_type(x)?,
                Type::Const(x) => self.btf.resolve_chained_type(x)?,
                Type::Volatile(x) => self.btf.resolve_chained_type(x)?,
                Type::Restrict(x) => self.btf.resolve_chained_type(x)?,
                Type::TypeTag(x) => self.btf.resolve_chained_type(x)?,
                _ => return Ok(t),
            };
        }
    }

    /// Size in bytes of a (stripped) type.
    fn size_of(&self, t: &Type) -> Result<u32, BtfError> {
        Ok(match self.strip(t.clone())? {
            Type::Int(i) => i.size() as u32,
            Type::Ptr(_) => 8,
            Type::Struct(s) | Type::Union(s) => s.size() as u32,
            Type::Enum(e) => e.size() as u32,
            Type::Enum64(e) => e.size() as u32,
            Type::Float(f) => f.size() as u32,
            Type::Array(a) => {
                let elem = self.btf.resolve_chained_type(&a)?;
                a.len() as u32 * self.size_of(&elem)?
            }
            _ => 0,
        })
    }

    /// The complete struct (or union) called `name`.
    fn find_struct(&self, name: &str) -> Result<btf_rs::Struct, BtfError> {
        if let Some(id) = self.structs.borrow().get(name)
            && let Type::Struct(s) | Type::Union(s) = self.btf.resolve_type_by_id(*id)?
        {
            return Ok(s);
        }
        for id in self.ids_by_name(name) {
            if let Type::Struct(s) | Type::Union(s) = self.btf.resolve_type_by_id(id)?
                && !s.members.is_empty()
            {
                self.structs.borrow_mut().insert(name.to_string(), id);
                return Ok(s);
            }
        }
        Err(BtfError::NoStruct(name.to_string()))
    }

    /// Finds `name` among `s`'s members, looking through anonymous structs/unions.
    /// Returns (bit offset from `s`, member).
    fn find_member(
        &self,
        s: &btf_rs::Struct,
        name: &str,
    ) -> Result<Option<(u32, btf_rs::Member)>, BtfError> {
        for m in &s.members {
            let mname = self.btf.resolve_name(m).unwrap_or_default();
            if mname == name {
                return Ok(Some((m.bit_offset(), m.clone())));
            }
            if mname.is_empty() {
                let inner = self.strip(self.btf.resolve_chained_type(m)?)?;
                if let Type::Struct(inner) | Type::Union(inner) = inner
                    && let Some((off, found)) = self.find_member(&inner, name)?
                {
                    return Ok(Some((m.bit_offset() + off, found)));
                }
            }
        }
        Ok(None)
    }

    /// Resolves a dotted member path (`"__sk_common.skc_net"`) inside struct `strukt`.
    pub fn member(&self, strukt: &str, path: &str) -> Result<MemberInfo, BtfError> {
        let missing = || BtfError::NoMember {
            strukt: strukt.to_string(),
            path: path.to_string(),
        };
        let mut current = self.find_struct(strukt)?;
        let mut offset = 0u32;
        let parts: Vec<&str> = path.split('.').collect();
        for (i, part) in parts.iter().enumerate() {
            let (off, m) = self.find_member(&current, part)?.ok_or_else(missing)?;
            offset += off;
            let mtype = self.strip(self.btf.resolve_chained_type(&m)?)?;
            if i + 1 == parts.len() {
                let bitfield = m.bitfield_size().unwrap_or(0);
                let is_pointer = matches!(mtype, Type::Ptr(_));
                let bits = if bitfield != 0 {
                    bitfield
                } else {
                    self.size_of(&mtype)? * 8
                };
                return Ok(MemberInfo {
                    bit_offset: offset,
                    bits,
                    bitfield: bitfield != 0,
                    is_pointer,
                });
            }
            current = match mtype {
                Type::Struct(s) | Type::Union(s) => s,
                _ => return Err(missing()),
            };
        }
        Err(missing())
    }

    /// Byte offset of a member path (must not be a bitfield).
    pub fn offset(&self, strukt: &str, path: &str) -> Result<u32, BtfError> {
        Ok(self.member(strukt, path)?.byte_offset())
    }

    /// Size of a struct in bytes.
    pub fn struct_size(&self, strukt: &str) -> Result<u32, BtfError> {
        Ok(self.find_struct(strukt)?.size() as u32)
    }

    /// All `name → value` pairs of an enum (e.g. `skb_drop_reason`).
    pub fn enum_values(&self, name: &str) -> Result<Vec<(String, u64)>, BtfError> {
        for id in self.ids_by_name(name) {
            match self.btf.resolve_type_by_id(id)? {
                Type::Enum(e) if !e.members.is_empty() => {
                    return e
                        .members
                        .iter()
                        .map(|m| Ok((self.btf.resolve_name(m)?, m.val() as u64)))
                        .collect();
                }
                Type::Enum64(e) if !e.members.is_empty() => {
                    return e
                        .members
                        .iter()
                        .map(|m| Ok((self.btf.resolve_name(m)?, m.val())))
                        .collect();
                }
                _ => {}
            }
        }
        Err(BtfError::NoStruct(format!("enum {name}")))
    }

    /// True when the kernel has a BTF tracepoint type for `tp` (`btf_trace_<tp>`), i.e. a
    /// `tp_btf/<tp>` program can load.
    pub fn has_btf_tracepoint(&self, tp: &str) -> bool {
        !self.ids_by_name(&format!("btf_trace_{tp}")).is_empty()
    }

    /// Number of arguments of tracepoint `tp` as a `tp_btf` program sees them (the
    /// `btf_trace_<tp>` prototype less its leading context pointer), e.g. 4 for `kfree_skb` on
    /// 6.11+ (`skb, location, reason, rx_sk`), 3 on 5.17–6.10. None without such a tracepoint.
    pub fn btf_tracepoint_args(&self, tp: &str) -> Option<usize> {
        let name = format!("btf_trace_{tp}");
        for t in self.types_by_name(&name) {
            let Type::Typedef(td) = t else { continue };
            let Ok(Type::Ptr(ptr)) = self.btf.resolve_chained_type(&td) else {
                continue;
            };
            if let Ok(Type::FuncProto(fp)) = self.btf.resolve_chained_type(&ptr) {
                return Some(fp.parameters.len().saturating_sub(1));
            }
        }
        None
    }

    /// True when the kernel's BTF has a function `name` (`BTF_KIND_FUNC`): a function that
    /// was not inlined away, so fentry/fexit can attach to it where the kernel allows them.
    pub fn has_func(&self, name: &str) -> bool {
        self.types_by_name(name)
            .iter()
            .any(|t| matches!(t, Type::Func(_)))
    }

    /// True when struct `strukt` exists and has member path `path`.
    pub fn has_member(&self, strukt: &str, path: &str) -> bool {
        self.member(strukt, path).is_ok()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn kernel() -> Option<KernelBtf> {
        KernelBtf::open(Path::new("/sys/kernel/btf/vmlinux")).ok()
    }

    /// Cross-checks against `bpftool btf dump` on the same kernel (ground truth), so this
    /// holds on any kernel, not just the one it was first measured on.
    #[test]
    fn offsets_match_bpftool() {
        let Some(k) = kernel() else {
            panic!("/sys/kernel/btf/vmlinux is required for this test");
        };
        let raw = bufscope_testkit::btf_dump("raw").unwrap_or_else(|e| panic!("{e:#}"));
        // Find "STRUCT 'sock' size=…" then its member "'sk_rcvbuf' type_id=… bits_offset=N".
        let bits = |strukt: &str, member: &str| -> Option<u32> {
            let mut lines = raw.lines();
            let header = format!("STRUCT '{strukt}' size=");
            while let Some(l) = lines.next() {
                if l.contains(&header) && !l.contains("vlen=0") {
                    for m in lines.by_ref() {
                        if !m.starts_with('\t') {
                            break;
                        }
                        if m.contains(&format!("'{member}' type_id=")) {
                            let b = m.split("bits_offset=").nth(1)?;
                            return b.split_whitespace().next()?.parse().ok();
                        }
                    }
                }
            }
            None
        };
        for (s, m) in [
            ("sock", "sk_rcvbuf"),
            ("sock", "sk_sndbuf"),
            ("sock", "sk_socket"),
            ("tcp_sock", "window_clamp"),
            ("file", "f_inode"),
            ("sk_buff", "head"),
        ] {
            let want = bits(s, m).unwrap();
            assert_eq!(k.member(s, m).unwrap().bit_offset, want, "{s}.{m}");
        }
    }

    #[test]
    fn nested_and_anonymous_members() {
        let k = kernel().unwrap();
        // skc_num sits in an anonymous struct inside an anonymous union of sock_common.
        let num = k.member("sock", "__sk_common.skc_num").unwrap();
        let common = k.member("sock", "__sk_common").unwrap();
        let inner = k.member("sock_common", "skc_num").unwrap();
        assert_eq!(num.bit_offset, common.bit_offset + inner.bit_offset);
        assert_eq!(num.bits, 16);
        let ws = k.member("tcp_sock", "rx_opt.rcv_wscale").unwrap();
        assert!(ws.bitfield);
        assert_eq!(ws.bits, 4);
        assert!(k.member("sock", "sk_socket").unwrap().is_pointer);
        assert!(matches!(
            k.member("sock", "no_such_member"),
            Err(BtfError::NoMember { .. })
        ));
    }

    #[test]
    fn tracepoint_arguments_and_functions() {
        let k = kernel().unwrap();
        // Ground truth: the same prototypes as bpftool prints them (`format c`).
        let c = bufscope_testkit::btf_dump("c").unwrap_or_else(|e| panic!("{e:#}"));
        for tp in ["kfree_skb", "udp_fail_queue_rcv_skb", "inet_sock_set_state"] {
            let want = bufscope_testkit::btf_tracepoint_args(&c, tp);
            assert!(want.is_some(), "bpftool shows no btf_trace_{tp}");
            assert_eq!(k.btf_tracepoint_args(tp), want, "{tp}");
        }
        assert_eq!(k.btf_tracepoint_args("no_such_tracepoint"), None);
        assert!(k.has_func("tcp_rcv_space_adjust"));
        assert!(!k.has_func("sock")); // a struct, not a function
        assert!(k.has_member("sock", "sk_rcvbuf"));
    }

    #[test]
    fn drop_reasons_resolve_by_name() {
        let k = kernel().unwrap();
        let reasons = k.enum_values("skb_drop_reason").unwrap();
        assert!(
            reasons
                .iter()
                .any(|(n, _)| n == "SKB_DROP_REASON_SOCKET_RCVBUFF")
        );
    }
}
