//! Where a per-socket finding can be fixed — the application (a configuration key when
//! bufscope knows the program: bufscope-policy's program table), inside the pod (a
//! capability, a per-namespace sysctl where the kernel has one), or only on the host (a
//! sysctl, the guard) — and the memory each fix lets the sockets it touches use.

use bufscope_api::Fix;
use bufscope_policy::{Direction, Program, Sizing};

use super::sockets::{Candidate, Scene};
use super::*;

/// What a UDP buffer fix asks for: the policy's size, or the program's own larger request.
fn wanted(requested: Option<i64>) -> u64 {
    let (policy_size, _) = policy::recommended_udp_buffer(None);
    requested.unwrap_or(0).max(policy_size as i64).max(0) as u64
}

fn names(dir: Direction) -> (&'static str, &'static str, &'static str) {
    match dir {
        Direction::Receive => ("SO_RCVBUF", "SO_RCVBUFFORCE", "net.core.rmem_max"),
        Direction::Send => ("SO_SNDBUF", "SO_SNDBUFFORCE", "net.core.wmem_max"),
    }
}

/// The fixes for one per-socket finding, application first.
pub(super) fn fixes(
    scene: &Scene,
    c: &Candidate,
    kind: &'static str,
    calls: &[&CallRec],
    requested: Option<i64>,
) -> Vec<Fix<&'static str>> {
    let program = policy::program(&scene.process.comm);
    if kind == kind::TCP_RCVBUF_LOCK || kind == kind::TCP_SNDBUF_LOCK {
        return tcp_lock_fixes(scene, c, program, calls);
    }
    let ns = scene.ns;
    let want = wanted(requested);
    let n = scene.sockets_like;
    let memory = n.saturating_mul(2 * want);
    let (plain, force, sysctl) = names(c.dir);
    let bytes = c.bytes();
    // The program's largest request is what the socket has (the kernel doubles it): neither a
    // higher ceiling nor CAP_NET_ADMIN gives it more, only a larger request does.
    let granted = requested.filter(|&r| r > 0 && bytes >= 2 * r);
    let tried_force = calls
        .iter()
        .any(|x| matches!(x.option, BufOption::RcvbufForce | BufOption::SndbufForce))
        || program.is_some_and(|p| match p.sizing {
            Sizing::Plain => false,
            // FORCE comes only when the plain call's readback is short.
            Sizing::PlainThenForce => granted.is_none(),
            Sizing::ForceThenPlain | Sizing::ForceOnly => true,
        });
    let refused = calls.iter().any(|x| x.ret == -libc::EPERM);
    let in_container = ns.is_some_and(|n| n.scope != LimitScope::Host);
    let user_ns = ns.is_some_and(|n| n.user_ns);
    let mut out = Vec::new();

    // The buffer is already large and it still drops: the reader, not the buffer.
    if kind == kind::UDP_RCVBUF_DROPS && bytes as u64 >= 2 * want {
        out.push(Fix {
            scope: "application",
            possible: true,
            how: format!(
                "the {} buffer is already large: the reader is too slow for the arrival rate \
                 (read in batches with recvmmsg/GRO, more reader threads or SO_REUSEPORT)",
                kib(bytes as f64)
            ),
            config_key: None,
            memory_bytes: None,
        });
        return out;
    }

    // The application.
    out.push(match program {
        // A key for another kind of socket (strongSwan's sizes its netlink socket) is none.
        Some(p) => match p.knob(c.dir).filter(|k| k.sizes(c.proto.as_str())) {
            Some(k) => Fix {
                scope: "application",
                possible: true,
                how: format!(
                    "{}: set `{}` in {}{}",
                    p.name,
                    k.with(want),
                    k.file,
                    match p.sizing {
                        Sizing::Plain => format!(
                            " (it uses {plain}: the kernel caps it at {sysctl}, so raise that on \
                             the host too)"
                        ),
                        Sizing::ForceOnly => format!(
                            " (it uses {force}: it needs CAP_NET_ADMIN, else nothing changes)"
                        ),
                        _ => format!(
                            " (it tries {force}, then {plain}: with CAP_NET_ADMIN it gets it \
                             whatever {sysctl} says)"
                        ),
                    }
                ),
                config_key: Some(k.key.to_string()),
                memory_bytes: Some(memory),
            },
            None => Fix {
                scope: "application",
                possible: false,
                how: format!("{} has no setting for it: {}", p.name, p.note),
                config_key: None,
                memory_bytes: None,
            },
        },
        None => Fix {
            scope: "application",
            possible: true,
            how: format!(
                "request {} with {force} (needs CAP_NET_ADMIN), else {plain} (capped at {sysctl}); \
                 {}",
                kib(want as f64),
                if c.proto == Proto::Udp {
                    "UDP has no autotuning"
                } else {
                    "this socket is not TCP or UDP"
                }
            ),
            config_key: None,
            memory_bytes: Some(memory),
        },
    });

    // Inside the pod: the capability (when the program tries FORCE), or the sysctl (when the
    // kernel gives the namespace its own).
    if in_container {
        let scope = ns.map_or(LimitScope::Absent, |n| n.scope);
        let cap = if let Some(r) = granted {
            format!(
                "CAP_NET_ADMIN does not help: the program asked for {} and got it in full ({} \
                 after the kernel's doubling), so nothing is capped",
                kib(r as f64),
                kib(bytes as f64)
            )
        } else if !tried_force {
            format!("CAP_NET_ADMIN does not help: the program never tries {force}")
        } else if user_ns {
            format!(
                "CAP_NET_ADMIN inside the pod's user namespace does not pass the kernel's check \
                 for {force} (it wants it in the initial one)"
            )
        } else {
            format!(
                "add NET_ADMIN to the container's capabilities (securityContext.capabilities.add) \
                 so its {force}{} bypasses {sysctl}",
                if refused {
                    ", now refused with EPERM,"
                } else {
                    ""
                }
            )
        };
        let cap_ok = tried_force && !user_ns && granted.is_none();
        let sysctl_text = match scope {
            LimitScope::Writable => format!(
                "raise {sysctl} to {want} inside the pod (this kernel gives each namespace its own)"
            ),
            LimitScope::ReadOnly => format!(
                "{sysctl} is read-only in the pod's network namespace on this kernel (it shows the host's value): it cannot be raised there"
            ),
            LimitScope::Absent => format!(
                "{sysctl} does not exist in the pod's network namespace on this kernel: only the host sets it"
            ),
            LimitScope::Unknown => format!(
                "{sysctl} in the pod's network namespace is {}; no kernel up to 6.18 lets a \
                 namespace raise it, so count on the host",
                ns.and_then(|n| n.unreadable_text())
                    .unwrap_or_else(|| "not readable from bufscope".to_string())
            ),
            LimitScope::Host => String::new(),
        };
        out.push(Fix {
            scope: "pod",
            possible: cap_ok || scope == LimitScope::Writable,
            how: format!("{cap}; {sysctl_text}"),
            config_key: None,
            memory_bytes: (cap_ok || scope == LimitScope::Writable).then_some(memory),
        });
    }

    // The host.
    let asks = requested.is_some_and(|r| r > 0);
    let host = if let Some(r) = granted {
        format!(
            "its request ({}) was granted in full, so a higher {sysctl} alone changes nothing: \
             bufscope's guard (--guard.mode enforce, udp-floor) rewrites this program's smaller \
             UDP requests to the floor ({} by default; the floor is capped at {sysctl}, which \
             --guard.raise-sysctl raises to it), at most {} for its {n} socket(s)",
            kib(r as f64),
            kib(want as f64),
            kib(memory as f64)
        )
    } else if asks {
        format!(
            "sysctl -w {sysctl}={want}: raises only the ceiling, so only sockets that ask get \
             more ({n} socket(s) of this process: at most {} in all); no other socket on the node \
             changes",
            kib(memory as f64)
        )
    } else {
        let default = match c.dir {
            Direction::Receive => "net.core.rmem_default",
            Direction::Send => "net.core.wmem_default",
        };
        let every = scene
            .host
            .udp_sockets
            // None in the host's namespace (the sockets are in others') says nothing useful.
            .filter(|&u| u > 0)
            .map(|u| {
                format!(
                    " ({u} UDP sockets in the host's namespace now: up to {} if every one filled)",
                    kib(u as f64 * 2.0 * want as f64)
                )
            })
            .unwrap_or_default();
        format!(
            "the program never asks for a size, so {sysctl} alone does nothing: bufscope's guard \
             (--guard.mode enforce, udp-floor) raises this program's UDP buffers at bind, or \
             {default}={want} raises every new socket's on the node{every}"
        )
    };
    out.push(Fix {
        scope: "host",
        possible: true,
        how: host,
        config_key: None,
        memory_bytes: Some(memory),
    });
    out
}

fn tcp_lock_fixes(
    scene: &Scene,
    c: &Candidate,
    program: Option<&Program>,
    calls: &[&CallRec],
) -> Vec<Fix<&'static str>> {
    let (plain, _, _) = names(c.dir);
    let (ceiling_name, ceiling) = match c.dir {
        Direction::Receive => ("net.ipv4.tcp_rmem[2]", scene.host.tcp_rmem_max),
        Direction::Send => ("net.ipv4.tcp_wmem[2]", scene.host.tcp_wmem_max),
    };
    let n = scene.sockets_like;
    let memory = n.saturating_mul(ceiling.max(0) as u64);
    let before_connect = calls.iter().any(|x| x.state == 7 || x.state == 10);
    let scale = if c.dir == Direction::Receive && before_connect {
        " (set before connect()/listen() it also shrank the window scale: only a new connection \
         without it gets the full scale)"
    } else if c.dir == Direction::Send {
        " (a send lock does not change the window scale, which the handshake negotiated)"
    } else {
        " (set after the handshake it did not change the window scale)"
    };
    let app = match program.and_then(|p| {
        p.knob(c.dir)
            .filter(|k| k.sizes(c.proto.as_str()))
            .map(|k| (p, k))
    }) {
        Some((p, k)) => Fix {
            scope: "application",
            possible: true,
            how: format!(
                "{}: remove `{}` from {} so autotuning sizes the buffer up to {ceiling_name}={}{scale}",
                p.name, k.key, k.file, ceiling
            ),
            config_key: Some(k.key.to_string()),
            memory_bytes: Some(memory),
        },
        None => Fix {
            scope: "application",
            possible: true,
            how: format!(
                "remove setsockopt({plain}) on this TCP socket so autotuning sizes it up to \
                 {ceiling_name}={ceiling} (or clear the lock with SO_BUF_LOCK=0 after a library set \
                 it){scale}"
            ),
            config_key: None,
            memory_bytes: Some(memory),
        },
    };
    vec![
        app,
        Fix {
            scope: "pod",
            possible: false,
            how: format!(
                "a lock belongs to the socket: no capability or sysctl of the pod undoes it \
                 ({ceiling_name} is per namespace, but a locked socket ignores it)"
            ),
            config_key: None,
            memory_bytes: None,
        },
        Fix {
            scope: "host",
            possible: true,
            how: "bufscope's guard (--guard.mode enforce, tcp-autotune) skips TCP buffer \
                  requests of the programs it covers, so their sockets stay autotuned (new \
                  sockets only)"
                .to_string(),
            config_key: None,
            memory_bytes: Some(memory),
        },
    ]
}

/// The fixes in one line, for `fix` (the possible ones, application first).
pub(super) fn one_line(fixes: &[Fix<&'static str>]) -> String {
    let possible: Vec<String> = fixes
        .iter()
        .filter(|f| f.possible)
        .map(|f| format!("{}: {}", f.scope, f.how))
        .collect();
    if possible.is_empty() {
        fixes
            .iter()
            .map(|f| format!("{}: {}", f.scope, f.how))
            .collect::<Vec<_>>()
            .join(" | ")
    } else {
        possible.join(" | ")
    }
}
