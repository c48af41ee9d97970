//! Applying a plan to a real socket and reporting what the kernel made of it.

use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd};

use socket2::SockRef;

use crate::{
    Buffers, Direction, Plan, Platform, PolicyError, clamp_fix, has_cap_net_admin, is_clamped,
};

/// Whether to try `SO_RCVBUFFORCE`/`SO_SNDBUFFORCE` before the plain options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Force {
    /// Try FORCE when the thread has `CAP_NET_ADMIN` (effective set), fall back to the plain
    /// option when it is missing or the kernel refuses (e.g. `EPERM` in a user namespace).
    #[default]
    Auto,
    /// Only use `SO_RCVBUF`/`SO_SNDBUF`, which the kernel caps at `net.core.{r,w}mem_max`.
    Never,
}

/// What happened to one direction's buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectionOutcome {
    /// Which buffer.
    pub direction: Direction,
    /// Bytes requested, `None` when the plan left the buffer alone.
    pub requested: Option<usize>,
    /// Size read back before any change.
    pub before: usize,
    /// Size read back after the change (`getsockopt`): what the kernel actually uses.
    pub effective: usize,
    /// Whether a FORCE option was attempted.
    pub force_attempted: bool,
    /// Whether the FORCE option succeeded (so `rmem_max`/`wmem_max` did not apply).
    pub forced: bool,
    /// Whether the kernel gave less than requested ([`crate::is_clamped`]).
    pub clamped: bool,
    /// When clamped: how to fix it ([`crate::clamp_fix`]).
    pub fix: Option<String>,
}

impl fmt::Display for DirectionOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.requested {
            None => write!(
                f,
                "{} buffer left alone: {} bytes",
                self.direction, self.effective
            ),
            Some(r) => {
                write!(
                    f,
                    "{} buffer requested {r} effective {} ({})",
                    self.direction,
                    self.effective,
                    if self.forced { "forced" } else { "not forced" }
                )?;
                if let Some(fix) = &self.fix {
                    write!(f, ", CLAMPED: fix with {fix}")?;
                }
                Ok(())
            }
        }
    }
}

/// What applying a [`Plan`] did, per direction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The plan that was applied.
    pub plan: Plan,
    /// `SO_RCVBUF`.
    pub receive: DirectionOutcome,
    /// `SO_SNDBUF`.
    pub send: DirectionOutcome,
}

impl Outcome {
    /// Whether either direction was clamped.
    pub fn is_clamped(&self) -> bool {
        self.receive.clamped || self.send.clamped
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}; {}", self.receive, self.send)
    }
}

impl Plan {
    /// Applies the plan to `socket` ([`Force::Auto`]), see [`Plan::apply_with`].
    pub fn apply<S: AsFd>(&self, socket: &S) -> Result<Outcome, PolicyError> {
        self.apply_with(socket, Force::Auto)
    }

    /// Applies the plan to `socket`: for [`Buffers::Set`], each direction goes through
    /// [`set_buffer`]; for [`Buffers::LeaveAlone`] nothing is set and the current sizes are read.
    /// Call it before `connect`/`listen` for the sizes to shape the TCP handshake (macOS rule),
    /// at any time for UDP.
    pub fn apply_with<S: AsFd>(&self, socket: &S, force: Force) -> Result<Outcome, PolicyError> {
        let (receive, send) = match self.buffers {
            Buffers::LeaveAlone => (
                leave(socket, Direction::Receive)?,
                leave(socket, Direction::Send)?,
            ),
            Buffers::Set { receive, send } => (
                set_buffer(socket, Direction::Receive, receive, force)?,
                set_buffer(socket, Direction::Send, send, force)?,
            ),
        };
        Ok(Outcome {
            plan: *self,
            receive,
            send,
        })
    }
}

fn leave<S: AsFd>(socket: &S, direction: Direction) -> Result<DirectionOutcome, PolicyError> {
    let now = get(socket, direction)?;
    Ok(DirectionOutcome {
        direction,
        requested: None,
        before: now,
        effective: now,
        force_attempted: false,
        forced: false,
        clamped: false,
        fix: None,
    })
}

/// Sets one buffer of `socket` to `bytes`: with [`Force::Auto`] and `CAP_NET_ADMIN`, tries
/// `SO_RCVBUFFORCE`/`SO_SNDBUFFORCE` first; otherwise (or if that fails) the plain
/// `SO_RCVBUF`/`SO_SNDBUF`. Reads the effective size back and decides whether it was clamped.
pub fn set_buffer<S: AsFd>(
    socket: &S,
    direction: Direction,
    bytes: usize,
    force: Force,
) -> Result<DirectionOutcome, PolicyError> {
    let value =
        libc::c_int::try_from(bytes).map_err(|_| PolicyError::TooLarge { direction, bytes })?;
    let before = get(socket, direction)?;
    let force_opt = force_option(direction).filter(|_| force == Force::Auto && has_cap_net_admin());
    let force_attempted = force_opt.is_some();
    // EPERM (no capability over the socket's network namespace) and any other refusal fall
    // back to the plain option below.
    let forced = force_opt.is_some_and(|opt| setsockopt_int(socket, opt, value).is_ok());
    if !forced {
        let name = plain_option(direction);
        set_plain(socket, direction, bytes).map_err(|source| PolicyError::Set {
            option: name,
            bytes,
            source,
        })?;
    }
    let effective = get(socket, direction)?;
    let platform = Platform::current();
    let clamped = is_clamped(platform, bytes, effective);
    Ok(DirectionOutcome {
        direction,
        requested: Some(bytes),
        before,
        effective,
        force_attempted,
        forced,
        clamped,
        fix: clamped.then(|| clamp_fix(platform, direction, bytes)),
    })
}

/// Reads `(SO_RCVBUF, SO_SNDBUF)` of `socket` as `getsockopt` reports them (doubled on Linux).
pub fn read_buffers<S: AsFd>(socket: &S) -> Result<(usize, usize), PolicyError> {
    Ok((
        get(socket, Direction::Receive)?,
        get(socket, Direction::Send)?,
    ))
}

fn plain_option(direction: Direction) -> &'static str {
    match direction {
        Direction::Receive => "SO_RCVBUF",
        Direction::Send => "SO_SNDBUF",
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn force_option(direction: Direction) -> Option<libc::c_int> {
    Some(match direction {
        Direction::Receive => libc::SO_RCVBUFFORCE,
        Direction::Send => libc::SO_SNDBUFFORCE,
    })
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn force_option(_direction: Direction) -> Option<libc::c_int> {
    None
}

fn get<S: AsFd>(socket: &S, direction: Direction) -> Result<usize, PolicyError> {
    let sock = SockRef::from(socket);
    let name = plain_option(direction);
    match direction {
        Direction::Receive => sock.recv_buffer_size(),
        Direction::Send => sock.send_buffer_size(),
    }
    .map_err(|source| PolicyError::Get {
        option: name,
        source,
    })
}

fn set_plain<S: AsFd>(socket: &S, direction: Direction, bytes: usize) -> io::Result<()> {
    let sock = SockRef::from(socket);
    match direction {
        Direction::Receive => sock.set_recv_buffer_size(bytes),
        Direction::Send => sock.set_send_buffer_size(bytes),
    }
}

fn setsockopt_int<S: AsFd>(socket: &S, opt: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: passes a pointer to a c_int and its size.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
