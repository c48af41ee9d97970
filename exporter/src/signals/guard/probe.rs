//! The guard's probe: its hooks and the variant each mode and setting keeps.

use crate::bpf::{Hook, ProbeSpec};

/// The probe (the setsockopt decisions ride on the setsockopt room's `cgroup/setsockopt`).
/// UDP sockets that never ask are decided at their first bind or connect, one storage lookup
/// per later call; nothing runs per send. Sockets that send before any bind or connect (bound
/// by the kernel at their first `sendto`) are raised only with `--guard.udp-unbound-senders`:
/// `cgroup/sendmsg{4,6}` then run on every unconnected UDP send on the node, and the kernel
/// takes the socket lock around them (measured 0.92 of the guard-off `sendto` rate on 6.18).
/// Raising sockets at creation instead would need `bpf_setsockopt` in `cgroup/sock_create`,
/// which neither 6.1 nor 6.18 gives that program type.
///
/// Only `enforce` attaches `cgroup/getsockopt` (the readback of skipped requests, which runs
/// on every getsockopt on the node) and `cgroup/sock_release` (the budget's releases):
/// `observe` changes nothing and pays for neither. Each mode's variants are the ones its
/// setting leaves ([`crate::bpf::LoadPlan::pass_over`]).
pub const PROBE: ProbeSpec = ProbeSpec {
    name: "guard",
    what: "applies the buffer policy in the kernel: TCP buffer requests that would lock less than autotuning reaches skipped, larger ones honoured; UDP buffers raised to the floor within a budget",
    // The first has every program: what `bufscope check` (online and offline, `--btf`) loads.
    variants: &[ENFORCE_SENDMSG, ENFORCE, OBSERVE_SENDMSG, OBSERVE],
    is_drop_probe: false,
    attributed: false,
};

/// `cgroup/bind*`, `cgroup/connect*`: a UDP socket decided at its first bind or connect.
const BIND_CONNECT: [Hook; 4] = [
    Hook::CgroupSockAddr {
        prog: "guard_bind4",
        attach: "bind4",
    },
    Hook::CgroupSockAddr {
        prog: "guard_bind6",
        attach: "bind6",
    },
    Hook::CgroupSockAddr {
        prog: "guard_connect4",
        attach: "connect4",
    },
    Hook::CgroupSockAddr {
        prog: "guard_connect6",
        attach: "connect6",
    },
];
/// `--guard.udp-unbound-senders`: also at the first unconnected send of a socket never bound.
const SENDMSG: [Hook; 2] = [
    Hook::CgroupSockAddr {
        prog: "guard_sendmsg4",
        attach: "sendmsg4",
    },
    Hook::CgroupSockAddr {
        prog: "guard_sendmsg6",
        attach: "sendmsg6",
    },
];
/// What only `enforce` needs: the readback of skipped TCP requests, the budget's releases.
const ENFORCE_ONLY: [Hook; 2] = [
    Hook::CgroupGetsockopt {
        prog: "guard_getsockopt",
    },
    Hook::CgroupSockRelease {
        prog: "guard_sock_release",
    },
];
const fn join<const A: usize, const B: usize, const N: usize>(
    a: [Hook; A],
    b: [Hook; B],
) -> [Hook; N] {
    let mut out = [a[0]; N];
    let mut i = 0;
    while i < A {
        out[i] = a[i];
        i += 1;
    }
    while i < N {
        out[i] = b[i - A];
        i += 1;
    }
    out
}
const ENFORCE: &[Hook] = &join::<2, 4, 6>(ENFORCE_ONLY, BIND_CONNECT);
const ENFORCE_SENDMSG: &[Hook] =
    &join::<6, 2, 8>(join::<2, 4, 6>(ENFORCE_ONLY, BIND_CONNECT), SENDMSG);
const OBSERVE: &[Hook] = &BIND_CONNECT;
const OBSERVE_SENDMSG: &[Hook] = &join::<4, 2, 6>(BIND_CONNECT, SENDMSG);

/// The variants (indexes in [`PROBE`]) a mode and `--guard.udp-unbound-senders` leave, and
/// why the others are passed over.
pub(super) fn passed_over(enforce: bool, unbound: bool) -> Vec<(usize, &'static str)> {
    let keep = match (enforce, unbound) {
        (true, true) => 0,
        (true, false) => 1,
        (false, true) => 2,
        (false, false) => 3,
    };
    (0..PROBE.variants.len())
        .filter(|i| *i != keep)
        .map(|i| {
            // Variants 0 and 2 have the sendmsg hooks; 0 and 1 are enforce's.
            let why = match (i < 2, i % 2 == 0) {
                (true, _) if !enforce => {
                    "observe attaches no cgroup/getsockopt or cgroup/sock_release (enforce only)"
                }
                (false, _) if enforce => "enforce needs cgroup/getsockopt and cgroup/sock_release",
                (_, true) => "cgroup/sendmsg{4,6} only with --guard.udp-unbound-senders",
                (_, false) => "--guard.udp-unbound-senders needs cgroup/sendmsg{4,6}",
            };
            (i, why)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_setting_keeps_the_variant_with_exactly_its_hooks() {
        for enforce in [false, true] {
            for unbound in [false, true] {
                let passed: Vec<usize> = passed_over(enforce, unbound)
                    .into_iter()
                    .map(|(i, _)| i)
                    .collect();
                let kept: Vec<usize> = (0..PROBE.variants.len())
                    .filter(|i| !passed.contains(i))
                    .collect();
                assert_eq!(kept.len(), 1, "{enforce} {unbound}: {kept:?}");
                let hooks: Vec<String> = PROBE.variants[kept[0]]
                    .iter()
                    .map(|h| h.describe())
                    .collect();
                let has = |h: &str| hooks.iter().any(|x| x == h);
                assert_eq!(has("cgroup/getsockopt"), enforce, "{hooks:?}");
                assert_eq!(has("cgroup/sock_release"), enforce, "{hooks:?}");
                assert_eq!(has("cgroup/sendmsg4"), unbound, "{hooks:?}");
                assert!(has("cgroup/bind4") && has("cgroup/connect6"), "{hooks:?}");
            }
        }
        // bufscope check (nothing passed over) loads the variant with every program.
        assert_eq!(PROBE.variants[0].len(), 8);
    }
}
