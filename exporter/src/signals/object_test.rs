//! Every program a probe variant names (and the reader hook's) exists in the embedded BPF
//! object, with the program type its hook attaches: the loader finds programs by name, so a
//! renamed or moved BPF function would otherwise show only as a probe that never attaches.

#![allow(clippy::unwrap_used)]

use aya_obj::programs::{CgroupSockAddrAttachType, CgroupSockAttachType, CgroupSockoptAttachType};
use aya_obj::{Object, ProgramSection};

use super::{PROBES, drops};
use crate::bpf::{Hook, OBJECT};

/// Whether the object's program section is the kind `h` attaches.
fn kind_matches(h: &Hook, s: &ProgramSection) -> bool {
    match (h, s) {
        (Hook::Tracepoint { .. }, ProgramSection::TracePoint) => true,
        (
            Hook::BtfTracepoint { .. } | Hook::BtfTracepointWhere { .. },
            ProgramSection::BtfTracePoint,
        ) => true,
        (Hook::Fentry { .. }, ProgramSection::FEntry { .. }) => true,
        (Hook::Fexit { .. }, ProgramSection::FExit { .. }) => true,
        (
            Hook::CgroupSetsockopt { .. },
            ProgramSection::CgroupSockopt {
                attach_type: CgroupSockoptAttachType::Set,
            },
        ) => true,
        (
            Hook::CgroupGetsockopt { .. },
            ProgramSection::CgroupSockopt {
                attach_type: CgroupSockoptAttachType::Get,
            },
        ) => true,
        (
            Hook::CgroupSockCreate { .. },
            ProgramSection::CgroupSock {
                attach_type: CgroupSockAttachType::SockCreate,
            },
        ) => true,
        (
            Hook::CgroupSockRelease { .. },
            ProgramSection::CgroupSock {
                attach_type: CgroupSockAttachType::SockRelease,
            },
        ) => true,
        (Hook::CgroupSockAddr { attach, .. }, ProgramSection::CgroupSockAddr { attach_type }) => {
            use CgroupSockAddrAttachType as A;
            matches!(
                (*attach, attach_type),
                ("bind4", A::Bind4)
                    | ("bind6", A::Bind6)
                    | ("connect4", A::Connect4)
                    | ("connect6", A::Connect6)
                    | ("sendmsg4", A::UDPSendMsg4)
                    | ("sendmsg6", A::UDPSendMsg6)
                    | ("recvmsg4", A::UDPRecvMsg4)
                    | ("recvmsg6", A::UDPRecvMsg6)
            )
        }
        _ => false,
    }
}

#[test]
fn every_probe_program_is_in_the_object_with_its_hook_type() {
    let obj = Object::parse(OBJECT).unwrap();
    let mut hooks: Vec<(&str, Hook)> = PROBES
        .iter()
        .flat_map(|p| {
            p.variants
                .iter()
                .flat_map(move |v| v.iter().map(move |h| (p.name, *h)))
        })
        // procfs hooks have no program.
        .filter(|(_, h)| !matches!(h, Hook::Procfs { .. }))
        .collect();
    hooks.push(("drops (reader hook)", drops::READER_HOOK));
    assert!(hooks.len() > PROBES.len(), "no hooks listed");
    let mut problems = Vec::new();
    for (probe, h) in &hooks {
        let name = h.prog();
        match obj.programs.get(name) {
            None => problems.push(format!(
                "{probe}: {} names program {name}, which the object does not have",
                h.describe()
            )),
            Some(p) if !kind_matches(h, &p.section) => problems.push(format!(
                "{probe}: {} needs program {name} of its kind, the object's is {:?}",
                h.describe(),
                p.section
            )),
            Some(_) => {}
        }
    }
    assert!(
        problems.is_empty(),
        "probe specs and the BPF object disagree:\n{}\nobject's programs: {:?}",
        problems.join("\n"),
        {
            let mut names: Vec<&String> = obj.programs.keys().collect();
            names.sort();
            names
        }
    );
}

/// Every map of the object is defined once, in `bufscope_common::maps`: its name and default
/// size there are the object's (the BPF side sizes its `#[map]` from them; userspace takes the
/// maps by these names and defaults its size flags to these sizes).
#[test]
fn every_map_of_the_object_has_its_spec_with_the_objects_size() {
    use bufscope_common::maps;
    let obj = Object::parse(OBJECT).unwrap();
    let mut problems = Vec::new();
    let mut checked = 0;
    for (name, map) in &obj.maps {
        // Globals (.rodata, .data, .bss) and aya-log's buffer are not bufscope's maps.
        if name.starts_with('.') || name == "AYA_LOGS" {
            continue;
        }
        // A map in `.maps` (BTF-defined: sk storage) is sized by the kernel, not by us.
        if map.max_entries() == 0 {
            continue;
        }
        match maps::ALL.iter().find(|s| s.name == name) {
            None => problems.push(format!(
                "map {name} has no MapSpec in bufscope_common::maps"
            )),
            Some(s) if s.default_entries != map.max_entries() => problems.push(format!(
                "map {name}: MapSpec says {} entries, the object {}",
                s.default_entries,
                map.max_entries()
            )),
            Some(_) => checked += 1,
        }
    }
    for s in maps::ALL {
        if !obj.maps.contains_key(s.name) {
            problems.push(format!("MapSpec {} names no map of the object", s.name));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert_eq!(checked, maps::ALL.len(), "each spec compared once");
}
