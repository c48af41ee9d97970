//! The few kernel readings both the tests and the benchmarks take.

use std::collections::BTreeSet;

use anyhow::Context as _;

/// BPF object ids held open by `pid`: the `key` lines (`prog_id:`, `link_id:`, `map_id:`) of
/// `/proc/<pid>/fdinfo/*` (program and link fds both name their `prog_id`). An fd closed while
/// it is read is skipped.
pub fn held_bpf_ids(pid: u32, key: &str) -> anyhow::Result<BTreeSet<u32>> {
    let dir = format!("/proc/{pid}/fdinfo");
    let mut ids = BTreeSet::new();
    for e in std::fs::read_dir(&dir)
        .with_context(|| format!("reading {dir}"))?
        .flatten()
    {
        let Ok(text) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        for l in text.lines() {
            if let Some(v) = l.strip_prefix(key) {
                let id = v
                    .trim()
                    .parse()
                    .with_context(|| format!("{}: {l:?}", e.path().display()))?;
                ids.insert(id);
            }
        }
    }
    Ok(ids)
}

/// The `drops` column of socket `inode` in `/proc/<pid>/net/udp{,6}` (the kernel's per-socket
/// count, read in the socket's own network namespace through a process inside it); `None`
/// when there is no such socket.
pub fn proc_udp_drops(pid: u32, inode: u64) -> Option<u64> {
    for file in ["udp", "udp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{file}")).ok()?;
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() > 12 && f[9].parse::<u64>().ok() == Some(inode) {
                return f.last()?.parse().ok();
            }
        }
    }
    None
}

/// The effective receive buffer (`sk_rcvbuf`) in an `ss -m` line: `rb<N>` of its
/// `skmem:(r0,rb212992,…)`; `None` when the line has no `skmem:(` or no `rb`.
pub fn skmem_rb(line: &str) -> Option<u64> {
    line.split("skmem:(")
        .nth(1)?
        .split(',')
        .find_map(|f| f.strip_prefix("rb"))
        .and_then(|v| v.trim_end_matches(')').parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_rb_from_skmem() {
        let l = "\t skmem:(r0,rb212992,t0,tb212992,f0,w0,o0,bl0,d3)";
        assert_eq!(skmem_rb(l), Some(212_992));
        assert_eq!(skmem_rb("UNCONN 0 0 127.0.0.1:5000"), None);
        assert_eq!(skmem_rb("skmem:(r0,rb4608)"), Some(4608));
    }

    #[test]
    fn own_fdinfo_is_readable() -> anyhow::Result<()> {
        // This test process holds no BPF objects.
        assert!(held_bpf_ids(std::process::id(), "prog_id:")?.is_empty());
        Ok(())
    }
}
