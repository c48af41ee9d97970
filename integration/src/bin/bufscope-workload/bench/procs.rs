//! Process populations: many long-lived holders of sockets, churn of short-lived ones, a
//! process moved into a cgroup.

use std::io::{Read as _, Write as _};
use std::net::SocketAddr;
use std::os::fd::AsRawFd as _;
use std::time::Duration;

use anyhow::{Context as _, bail};
use socket2::SockAddr;

use crate::args::{Args, ready};
use crate::sys::{inode_of, new_netns, set_comm, setsockopt_int};

use super::*;

/// `many-procs`: `--procs` children, each holding `--socks` UDP sockets (SO_RCVBUF set, never
/// read) bound to loopback; their ports go to `--ports-file`. While `--activity-file`
/// exists, each child makes one SO_RCVBUF call every `--every-ms`.
pub(crate) fn many_procs(a: &Args) -> anyhow::Result<()> {
    let procs: usize = a.num("--procs", 1000)?;
    let socks: usize = a.num("--socks", 10)?;
    let rcvbuf: i32 = a.num("--rcvbuf", 4096)?;
    let every = Duration::from_millis(a.num("--every-ms", 1000)?);
    let ports_file = a
        .value("--ports-file")
        .context("--ports-file is required")?
        .to_string();
    let activity = a.value("--activity-file").map(str::to_string);
    let mut fds = [0i32; 2];
    // SAFETY: fds is a valid 2-int array.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        bail!("pipe: {}", std::io::Error::last_os_error());
    }
    let (rd, wr) = (fds[0], fds[1]);
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    let mut children = Vec::with_capacity(procs);
    for _ in 0..procs {
        let activity = activity.clone();
        let pid = fork_child(move || {
            // SAFETY: prctl/close/getppid/write on our own fds; no memory is shared.
            unsafe {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                libc::close(rd);
                if libc::getppid() != parent {
                    return 1;
                }
            }
            let lo = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
            let mut held = Vec::with_capacity(socks);
            let mut line = String::new();
            for _ in 0..socks {
                let Ok(s) = udp(lo) else { return 1 };
                if s.set_recv_buffer_size(rcvbuf as usize).is_err()
                    || s.bind(&SockAddr::from(SocketAddr::new(lo, 0))).is_err()
                {
                    return 1;
                }
                line.push_str(&format!("{} ", port_of(&s)));
                held.push(s);
            }
            line.push('\n');
            // SAFETY: wr is the pipe's write end; the line is live. Lines are far below
            // PIPE_BUF, so concurrent children's writes do not interleave.
            unsafe { libc::write(wr, line.as_ptr().cast(), line.len()) };
            // SAFETY: closing our copy of the write end.
            unsafe { libc::close(wr) };
            let mut i = 0usize;
            loop {
                std::thread::sleep(every);
                // SAFETY: getppid has no preconditions.
                if unsafe { libc::getppid() } != parent {
                    return 0;
                }
                if activity
                    .as_deref()
                    .is_some_and(|f| std::path::Path::new(f).exists())
                {
                    let s = &held[i % held.len()];
                    let _ = s.set_recv_buffer_size(rcvbuf as usize);
                    i += 1;
                }
            }
        })?;
        children.push(pid);
    }
    // SAFETY: closing the parent's copy of the write end (EOF once every child closed it).
    unsafe { libc::close(wr) };
    // SAFETY: rd is the pipe's read end, owned from here on by the File.
    let mut reader = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(rd) };
    let mut text = String::new();
    reader.read_to_string(&mut text)?;
    let lines = text.lines().count();
    if lines != procs {
        bail!("only {lines} of {procs} children set up their sockets");
    }
    std::fs::write(
        &ports_file,
        text.split_whitespace().collect::<Vec<_>>().join("\n"),
    )?;
    ready(&[
        ("pid", std::process::id().to_string()),
        ("procs", procs.to_string()),
        ("sockets", (procs * socks).to_string()),
    ]);
    serve_stdin(|_| {});
    for pid in children {
        // SAFETY: signalling and reaping our own children.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
    }
    Ok(())
}

/// The `drops` column of `inode` in `/proc/self/net/udp`.
pub(super) fn own_udp_drops(inode: u64) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/net/udp").ok()?;
    text.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() > 12 && f[9].parse::<u64>().ok() == Some(inode))
            .then(|| f.last().and_then(|d| d.parse().ok()))
            .flatten()
    })
}

/// `in-cgroup`: moves this process into a cgroup whose path may be longer than PATH_MAX
/// (each component is opened relative to the previous one), then execs the command after
/// `--`.
pub(crate) fn in_cgroup(a: &Args) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt as _;
    let root = a.value("--root").context("--root DIR is required")?;
    let chain = a.value("--chain").unwrap_or("");
    let sep =
        a.0.iter()
            .position(|x| x == "--")
            .context("in-cgroup needs -- COMMAND")?;
    let cmd = a.0.get(sep + 1..).unwrap_or(&[]);
    let (prog, args) = cmd.split_first().context("no command after --")?;
    let open = |dir: Option<&std::fs::File>, name: &str, flags: i32| {
        let c = std::ffi::CString::new(name)?;
        // SAFETY: c is NUL-terminated; dir (when given) is an open directory.
        let fd = unsafe {
            match dir {
                Some(d) => libc::openat(d.as_raw_fd(), c.as_ptr(), flags),
                None => libc::open(c.as_ptr(), flags),
            }
        };
        if fd < 0 {
            bail!("opening {name}: {}", std::io::Error::last_os_error());
        }
        // SAFETY: fd was just opened and is owned by nobody else.
        Ok(unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) })
    };
    let mut dir = open(None, root, libc::O_DIRECTORY | libc::O_RDONLY)?;
    for comp in chain.split('/').filter(|c| !c.is_empty()) {
        dir = open(Some(&dir), comp, libc::O_DIRECTORY | libc::O_RDONLY)?;
    }
    let mut procs = open(Some(&dir), "cgroup.procs", libc::O_WRONLY)?;
    procs
        .write_all(std::process::id().to_string().as_bytes())
        .context("writing cgroup.procs")?;
    drop((procs, dir));
    let err = std::process::Command::new(prog).args(args).exec();
    bail!("exec {prog}: {err}")
}

/// One churn child: socket, SO_RCVBUF, bind, `sends` datagrams to itself, read its own
/// drops column, close. Returns the drops, or the step that failed (1-6).
pub(super) fn churn_one(rcvbuf: i32, sends: usize) -> Result<u64, i32> {
    let lo = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
    let s = udp(lo).map_err(|_| 1)?;
    setsockopt_int(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, rcvbuf).map_err(|_| 2)?;
    s.bind(&SockAddr::from(SocketAddr::new(lo, 0)))
        .map_err(|_| 3)?;
    let me = s.local_addr().map_err(|_| 3)?;
    let buf = [0x77u8; 1000];
    for _ in 0..sends {
        s.send_to(&buf, &me).map_err(|_| 4)?;
    }
    let inode = inode_of(s.as_raw_fd()).map_err(|_| 5)?;
    // /proc/net/udp is walked hash slot by hash slot while other children bind and close
    // sockets in the same table: a read can miss a line. Read again until ours shows up.
    let mut drops = None;
    for _ in 0..50 {
        drops = own_udp_drops(inode);
        if drops.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let drops = drops.ok_or(6)?;
    drop(s);
    Ok(drops)
}

/// `churn`: `--procs` short-lived children, at most `--parallel` at a time. Each reports its
/// socket's own drops column (read just before close) through a pipe; the parent prints the
/// sum, then holds (so its network namespace stays readable).
pub(crate) fn churn(a: &Args) -> anyhow::Result<()> {
    let procs: usize = a.num("--procs", 5000)?;
    let parallel: usize = a.num("--parallel", 8)?;
    let sends: usize = a.num("--sends", 20)?;
    let rcvbuf: i32 = a.num("--rcvbuf", 1)?;
    let comm = a.value("--comm").map(|c| c.as_bytes().to_vec());
    if a.flag("--new-netns") {
        new_netns()?;
    }
    let mut fds = [0i32; 2];
    // SAFETY: fds is a valid 2-int array.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        bail!("pipe: {}", std::io::Error::last_os_error());
    }
    let (rd, wr) = (fds[0], fds[1]);
    ready(&[("pid", std::process::id().to_string())]);
    let (mut running, mut started, mut failed) = (0usize, 0usize, 0usize);
    let mut why: std::collections::BTreeMap<i32, usize> = Default::default();
    let mut reap = |failed: &mut usize| {
        let mut status = 0;
        // SAFETY: waiting for any of our children.
        let pid = unsafe { libc::waitpid(-1, &mut status, 0) };
        if pid > 0 && !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
            *failed += 1;
            let code = if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                -libc::WTERMSIG(status)
            };
            *why.entry(code).or_default() += 1;
        }
        pid > 0
    };
    while started < procs {
        if running >= parallel.max(1) {
            if reap(&mut failed) {
                running -= 1;
            }
            continue;
        }
        let comm = comm.clone();
        fork_child(move || {
            // SAFETY: closing the child's copy of the read end.
            unsafe { libc::close(rd) };
            if let Some(c) = &comm
                && set_comm(c).is_err()
            {
                return 9;
            }
            match churn_one(rcvbuf, sends) {
                Ok(d) => {
                    let b = d.to_ne_bytes();
                    // SAFETY: 8-byte write (< PIPE_BUF: atomic) from a live buffer.
                    unsafe { libc::write(wr, b.as_ptr().cast(), b.len()) };
                    0
                }
                Err(step) => 10 + step,
            }
        })?;
        started += 1;
        running += 1;
    }
    while running > 0 && reap(&mut failed) {
        running -= 1;
    }
    // SAFETY: closing the parent's write end: EOF after the last child's record.
    unsafe { libc::close(wr) };
    // SAFETY: rd is the read end, owned by the File from here on.
    let mut reader = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(rd) };
    let mut raw = Vec::new();
    reader.read_to_end(&mut raw)?;
    let drops: u64 = raw
        .chunks_exact(8)
        .map(|c| u64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
        .sum();
    let why: Vec<String> = why.iter().map(|(c, n)| format!("{c}:{n}")).collect();
    say(format!(
        "DONE procs={procs} reported={} failed={failed} drops={drops} exit_codes={}",
        raw.len() / 8,
        why.join(",")
    ));
    serve_stdin(|_| {});
    Ok(())
}
