//! OS termination signals (Ctrl-C / SIGTERM / SIGHUP), waited for without a signal handler.

use crate::Error;

/// SIGINT, SIGTERM and SIGHUP blocked in the calling thread (and in every thread it spawns
/// afterwards), to be collected synchronously with [`TerminationSignals::wait`]. Create it at
/// the start of `main`, before any thread exists, so that no thread dies of the signal.
#[derive(Debug)]
pub struct TerminationSignals {
    set: libc::sigset_t,
}

impl TerminationSignals {
    /// Blocks SIGINT, SIGTERM and SIGHUP in the calling thread.
    pub fn block() -> Result<TerminationSignals, Error> {
        // SAFETY: the sigset is initialised by sigemptyset before use; pthread_sigmask only
        // reads it.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::sigaddset(&mut set, s);
            }
            let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            if rc != 0 {
                return Err(Error::io(
                    "blocking SIGINT/SIGTERM",
                    std::io::Error::from_raw_os_error(rc),
                ));
            }
            Ok(TerminationSignals { set })
        }
    }

    /// Runs `f` with each signal that arrives, on a thread of its own (started now, with the
    /// signals blocked as everywhere else), until `f` returns `false`.
    pub fn watch(self, f: impl FnMut(i32) -> bool + Send + 'static) -> Result<(), Error> {
        let mut f = f;
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                while let Ok(sig) = self.wait() {
                    if !f(sig) {
                        return;
                    }
                }
            })
            .map(drop)
            .map_err(|e| Error::io("starting the signal thread", e))
    }

    /// Waits until one of the signals arrives and returns its number.
    pub fn wait(&self) -> Result<i32, Error> {
        let mut sig: libc::c_int = 0;
        // SAFETY: both pointers are valid for the duration of the call.
        let rc = unsafe { libc::sigwait(&self.set, &mut sig) };
        if rc != 0 {
            return Err(Error::io("sigwait", std::io::Error::from_raw_os_error(rc)));
        }
        Ok(sig)
    }
}

/// Makes a child start with SIGINT, SIGTERM and SIGHUP unblocked, whatever the parent has
/// blocked ([`TerminationSignals`]): a signal mask survives `exec`, and a child that inherited
/// it would ignore the SIGTERM meant to stop it.
pub fn unblock_in_child(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt as _;
    // SAFETY: the closure runs between fork and exec and only calls async-signal-safe
    // functions (sigemptyset, sigaddset, pthread_sigmask) on a local set.
    unsafe {
        cmd.pre_exec(|| {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::sigaddset(&mut set, s);
            }
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            Ok(())
        });
    }
}
