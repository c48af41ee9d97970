//! SIGINT, SIGTERM and SIGHUP during `cargo xtask bench tunnel`: the run stops and leaves
//! nothing behind, as `netlab up` does.
//!
//! The signals are blocked in every thread and collected by a thread of their own. On the
//! first one it records the signal and kills what runs in the run's namespaces (tunnels,
//! iperf3, ping), so that the measurement under way fails at once; the main thread sees the
//! signal between steps, unwinds (each lab, tunnel and process is removed on drop), removes
//! its work directory and exits with 128 + the signal. Should the main thread not get there
//! within [`GRACE`] (or on a second signal), the signal thread removes every namespace,
//! process and wireguard-go socket of this run itself and exits.

use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use bufscope_netlab::{Netns, TerminationSignals};

/// The first signal received (0: none).
static SIGNAL: AtomicI32 = AtomicI32::new(0);

/// How long the main thread has to unwind before the signal thread cleans up by itself.
const GRACE: Duration = Duration::from_secs(20);

/// Blocks the termination signals and starts the thread that collects them. Call it before
/// any other thread exists.
pub(super) fn install() -> anyhow::Result<()> {
    let signals = TerminationSignals::block()?;
    signals.watch(|sig| {
        let prefix = run_prefix();
        if SIGNAL
            .compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            eprintln!("bench tunnel: second signal {sig}: removing everything now");
            force_cleanup_and_exit(&prefix, sig);
        }
        eprintln!(
            "bench tunnel: signal {sig}: stopping; the tunnels, iperf3 and the lab's namespaces are being removed"
        );
        kill_in_namespaces(&prefix);
        std::thread::spawn(move || {
            std::thread::sleep(GRACE);
            eprintln!(
                "bench tunnel: still running {GRACE:?} after signal {sig}: removing everything now"
            );
            force_cleanup_and_exit(&prefix, sig);
        });
        true
    })?;
    Ok(())
}

/// The signal that stopped the run, if one did.
pub(super) fn signal() -> Option<i32> {
    match SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// Ends the process after a signal (the run has cleaned up).
pub(super) fn exit(sig: i32) -> ! {
    eprintln!("bench tunnel: stopped by signal {sig}; nothing left behind");
    std::process::exit(128 + sig)
}

/// The name prefix of everything this run creates: namespaces and interfaces are named by
/// `bufscope_netlab::unique_name`, which embeds the pid.
pub(super) fn run_prefix() -> String {
    format!("{}{:x}x", bufscope_netlab::PREFIX, std::process::id())
}

/// Kills the processes of this run's namespaces (and leaves the namespaces to their owners).
fn kill_in_namespaces(prefix: &str) {
    let Ok(names) = Netns::list() else { return };
    for name in names.iter().filter(|n| n.starts_with(prefix)) {
        if let Ok(ns) = Netns::attach(name.as_str()) {
            let _ = ns.kill_all(Duration::from_millis(1000));
        }
    }
}

/// Removes every namespace (with its processes) and wireguard-go socket of this run, and
/// exits.
fn force_cleanup_and_exit(prefix: &str, sig: i32) -> ! {
    match bufscope_netlab::cleanup(prefix, true) {
        Ok(r) => eprintln!(
            "bench tunnel: removed {} namespaces, {} wireguard-go sockets",
            r.namespaces.len(),
            r.sockets.len()
        ),
        Err(e) => eprintln!("bench tunnel: cleaning up after signal {sig}: {e}"),
    }
    let _ = std::fs::remove_dir_all(
        std::env::temp_dir().join(format!("bsl-bench-{}", std::process::id())),
    );
    std::process::exit(128 + sig)
}
