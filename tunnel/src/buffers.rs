//! Applies `--buffer-policy` to the outer socket and logs what the kernel made of it.

use anyhow::{Context, Result};
use bufscope_policy::{Direction, Force, Plan, Target, Transport, read_buffers, set_buffer};
use socket2::Socket;

use crate::config::BufferPolicy;

/// Applies `policy` to `socket` (call it before bind/connect/listen: for `fixed` that is the
/// point of the anti-pattern) and logs the effective sizes.
pub fn apply(
    socket: &Socket,
    policy: BufferPolicy,
    transport: Transport,
    target: Option<Target>,
    what: &str,
) -> Result<()> {
    match policy {
        BufferPolicy::Recommended => {
            let plan = Plan::for_current(transport, target);
            let o = plan
                .apply(socket)
                .with_context(|| format!("applying the recommended buffer policy to the {what}"))?;
            tracing::info!(
                policy = %policy,
                rcvbuf = o.receive.effective,
                sndbuf = o.send.effective,
                rcvbuf_requested = o.receive.requested,
                sndbuf_requested = o.send.requested,
                forced = o.receive.forced && o.send.forced,
                rule = ?plan.rule,
                "{what} buffers: {o}"
            );
            for d in [&o.receive, &o.send] {
                if let Some(fix) = &d.fix {
                    tracing::warn!(
                        "{what} {} buffer clamped to {} bytes; fix: {fix}",
                        d.direction,
                        d.effective
                    );
                }
            }
        }
        BufferPolicy::Fixed(bytes) => {
            let r = set_buffer(socket, Direction::Receive, bytes, Force::Never)
                .with_context(|| format!("setting SO_RCVBUF={bytes} on the {what}"))?;
            let s = set_buffer(socket, Direction::Send, bytes, Force::Never)
                .with_context(|| format!("setting SO_SNDBUF={bytes} on the {what}"))?;
            tracing::info!(
                policy = %policy,
                rcvbuf = r.effective,
                sndbuf = s.effective,
                "{what} buffers fixed before bind/connect (anti-pattern on purpose): {r}; {s}"
            );
        }
        BufferPolicy::OsDefault => log_effective(socket, policy, what),
    }
    Ok(())
}

/// Logs the socket's effective buffer sizes (e.g. of an accepted or connected TCP socket).
pub fn log_effective(socket: &Socket, policy: BufferPolicy, what: &str) {
    match read_buffers(socket) {
        Ok((rcv, snd)) => {
            tracing::info!(policy = %policy, rcvbuf = rcv, sndbuf = snd, "{what} buffers: rcvbuf {rcv} sndbuf {snd}")
        }
        Err(e) => tracing::warn!("cannot read the {what}'s buffer sizes: {e}"),
    }
}
