//! Choosing a probe's variant from the kernel's BTF, before anything is loaded: a variant is
//! *usable* when every hook it needs is there (a `btf_trace_<name>` prototype with the
//! arguments its program reads, a function that was not inlined away, a tracepoint field that
//! says what the kernel does). The loader tries the usable variants best first; a load the
//! kernel refuses (a verifier, fentry forbidden) moves on to the next. `bufscope check --btf`
//! runs the same choice offline for another kernel.
//!
//! `BUFSCOPE_REFUSE_HOOKS` (comma-separated hook kinds such as `fentry,fexit`, or exact hooks
//! such as `tp_btf/kfree_skb`) makes the loader treat those hooks as refused: the kernel-matrix
//! tests use it to prove every fallback on a kernel that would pick a better one.

use crate::kernel::KernelBtf;

use super::Hook;

/// Something a hook's program relies on that the kernel's BTF must show.
#[derive(Clone, Copy, Debug)]
pub enum BtfNeed {
    /// The tracepoint has at least this many arguments (after the context).
    Args(usize),
    /// Struct `strukt` has member `member` (e.g. a tracepoint's `trace_event_raw_<name>`
    /// record, whose fields say what the kernel reports).
    Member {
        /// Struct name.
        strukt: &'static str,
        /// Member path.
        member: &'static str,
        /// What having it means (said when it is missing).
        why: &'static str,
    },
}

/// Environment variable naming hooks to treat as refused (see the module doc).
pub const REFUSE_ENV: &str = "BUFSCOPE_REFUSE_HOOKS";

fn refused(hook: &Hook) -> bool {
    let Ok(list) = std::env::var(REFUSE_ENV) else {
        return false;
    };
    let d = hook.describe();
    let kind = d.split('/').next().unwrap_or("");
    list.split(',')
        .map(str::trim)
        .any(|r| !r.is_empty() && (r == d || r == kind))
}

/// Whether `hook` can work on the kernel described by `btf`; why not, when not. Classic
/// tracepoints and cgroup hooks are not in BTF: they are decided when attaching.
pub fn hook_usable(hook: &Hook, btf: &KernelBtf) -> Result<(), String> {
    if refused(hook) {
        return Err(format!("refused by {REFUSE_ENV}"));
    }
    match hook {
        Hook::BtfTracepoint { name, .. } => {
            if btf.has_btf_tracepoint(name) {
                Ok(())
            } else {
                Err(format!("kernel BTF has no btf_trace_{name}"))
            }
        }
        Hook::BtfTracepointWhere { name, needs, .. } => {
            let Some(args) = btf.btf_tracepoint_args(name) else {
                return Err(format!("kernel BTF has no btf_trace_{name}"));
            };
            for need in *needs {
                match need {
                    BtfNeed::Args(n) if args < *n => {
                        return Err(format!(
                            "tracepoint {name} has {args} arguments here, the program reads {n}"
                        ));
                    }
                    BtfNeed::Member {
                        strukt,
                        member,
                        why,
                    } if !btf.has_member(strukt, member) => {
                        return Err(format!("kernel BTF: {strukt} has no {member} ({why})"));
                    }
                    _ => {}
                }
            }
            Ok(())
        }
        Hook::Fentry { func, .. } | Hook::Fexit { func, .. } => {
            if btf.has_func(func) {
                Ok(())
            } else {
                Err(format!(
                    "kernel BTF has no function {func} (inlined or renamed on this kernel)"
                ))
            }
        }
        _ => Ok(()),
    }
}

/// [`hook_usable`] for every hook of a variant (the first reason it is not).
pub fn usable(hooks: &[Hook], btf: &KernelBtf) -> Result<(), String> {
    hooks.iter().try_for_each(|h| hook_usable(h, btf))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn host() -> KernelBtf {
        KernelBtf::open(std::path::Path::new("/sys/kernel/btf/vmlinux")).unwrap()
    }

    #[test]
    fn argument_counts_decide() {
        let btf = host();
        let n = btf.btf_tracepoint_args("kfree_skb").unwrap();
        let enough: &[BtfNeed] = &[BtfNeed::Args(3)];
        let h = Hook::BtfTracepointWhere {
            prog: "p",
            name: "kfree_skb",
            needs: enough,
        };
        assert!(hook_usable(&h, &btf).is_ok());
        let too_many: &[BtfNeed] = &[BtfNeed::Args(99)];
        let h = Hook::BtfTracepointWhere {
            prog: "p",
            name: "kfree_skb",
            needs: too_many,
        };
        let e = hook_usable(&h, &btf).unwrap_err();
        assert!(e.contains(&format!("has {n} arguments")), "{e}");
        let missing = Hook::Fentry {
            prog: "p",
            func: "no_such_function_here",
        };
        assert!(
            hook_usable(&missing, &btf)
                .unwrap_err()
                .contains("no function")
        );
    }
}
