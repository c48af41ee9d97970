//! A loaded program its room attaches and detaches at will: a hook that runs only while it
//! has work (the drops room's reader hook while sockets are watched, kernel WireGuard's while
//! the module is loaded).

use std::os::fd::{AsFd as _, OwnedFd};

use aya::programs::ProgramFd;

use super::sys;

/// Attaching a loaded program and detaching it (a fake in the rooms' tests).
pub trait Switch: Send {
    /// Attaches it (it is detached).
    fn attach(&mut self) -> std::io::Result<()>;
    /// Detaches it (it is attached).
    fn detach(&mut self);
}

/// A loaded `tp_btf` or tracing program: while attached, a raw-tracepoint link on a duplicate
/// of its fd (dropping the link detaches it).
pub struct Linked {
    prog: ProgramFd,
    link: Option<OwnedFd>,
}

impl Linked {
    /// `prog`, not attached.
    pub fn new(prog: ProgramFd) -> Self {
        Self { prog, link: None }
    }
}

impl Switch for Linked {
    fn attach(&mut self) -> std::io::Result<()> {
        self.link = Some(sys::raw_tracepoint_open(self.prog.as_fd(), None)?);
        Ok(())
    }

    fn detach(&mut self) {
        self.link = None;
    }
}
