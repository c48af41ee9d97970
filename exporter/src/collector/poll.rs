//! The poll loop's own state: when the last poll started, how long each room's read took,
//! and the sysctl limits a poll reads first.

use std::time::{Duration, Instant};

use crate::kernel::BufferLimits;
use crate::signals::{PollCx, Signal};

/// What one poll of the rooms keeps between polls.
#[derive(Default)]
pub struct PollLoop {
    /// When the last poll started.
    started: Option<Instant>,
    /// The limits were found unreadable (logged once).
    warned_limits: bool,
    /// How long each room's last poll took.
    durations: Vec<(&'static str, Duration)>,
}

impl PollLoop {
    /// A poll starts now.
    pub fn start(&mut self) {
        self.started = Some(Instant::now());
    }

    /// When the last poll started.
    pub fn started(&self) -> Option<Instant> {
        self.started
    }

    /// How long each room's last poll took.
    pub fn durations(&self) -> &[(&'static str, Duration)] {
        &self.durations
    }

    /// `read` (the sysctls, normally [`BufferLimits::read`]), warning once when this network
    /// namespace hides them.
    pub fn limits(&mut self, read: BufferLimits) -> BufferLimits {
        if read.rmem_max.is_none() && !self.warned_limits {
            self.warned_limits = true;
            tracing::warn!(
                "cannot read net.core.rmem_max/wmem_max from this network namespace (kernels before \
                 6.11 hide them in containers): clamp advice will say \"unknown\"; run with \
                 hostNetwork to see them"
            );
        }
        read
    }

    /// Reads every room's maps (timing each); returns whether something the advice rules
    /// read may have changed.
    pub fn rooms(&mut self, rooms: &mut [Box<dyn Signal>], cx: &mut PollCx<'_>) -> bool {
        self.durations.clear();
        let mut changed = false;
        for s in rooms.iter_mut() {
            let started = Instant::now();
            changed |= s.poll(cx);
            self.durations.push((s.name(), started.elapsed()));
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpf::fake::FakeTable;
    use crate::signals::autotune::Autotune;
    use crate::signals::tcp_state::TcpState;
    use crate::signals::testkit::{Bench, gone_inode};
    use bufscope_common::AutotuneVal;

    #[test]
    fn every_room_is_polled_and_timed() {
        let mut b = Bench::new();
        let kernel = FakeTable::new(8);
        let mut rooms: Vec<Box<dyn Signal>> = vec![
            Box::new(TcpState::new()),
            Box::new(Autotune::new(kernel.boxed(), 8)),
        ];
        let mut p = PollLoop::default();
        p.start();
        assert!(p.rooms(&mut rooms, &mut b.poll()), "autotune read its map");
        let names: Vec<&str> = p.durations().iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["tcp_state", "autotune"]);
        kernel.set(gone_inode(40), vec![AutotuneVal::default()]);
        b.bump(bufscope_common::stat::AUTOTUNE_SEEN);
        assert!(p.rooms(&mut rooms, &mut b.poll()));
        assert!(p.started().is_some());
    }

    #[test]
    fn hidden_limits_warn_once() {
        let mut p = PollLoop::default();
        assert_eq!(p.limits(BufferLimits::default()), BufferLimits::default());
        assert!(p.warned_limits);
    }
}
