//! The store's bounds: folding, retention, reused pids, placeholders, exec.

#![allow(clippy::unwrap_used)]
use super::*;

/// A part with one counter and series by key (kept at 0 across an exec).
#[derive(Clone, Debug, Default)]
struct T {
    n: u64,
    by: BTreeMap<&'static str, u64>,
}

impl T {
    fn add(&mut self, k: &'static str, v: u64) {
        *self.by.entry(k).or_default() += v;
    }

    fn sum(&self) -> u64 {
        self.n + self.by.values().sum::<u64>()
    }
}

impl Parts for T {
    fn absorb(&mut self, o: &Self) {
        self.n += o.n;
        for (k, v) in &o.by {
            *self.by.entry(k).or_default() += v;
        }
    }

    fn has_counts(&self) -> bool {
        self.n > 0 || !self.by.is_empty()
    }

    fn after_exec(&self) -> Self {
        Self {
            n: 0,
            by: self.by.keys().map(|k| (*k, 0)).collect(),
        }
    }
}

type Store = super::Store<T>;

fn p(t: u32) -> Who {
    Who::Proc(ProcRef {
        tgid: t,
        start_ticks: 1,
    })
}

fn meta(c: &str) -> impl FnOnce() -> ProcMeta + '_ {
    move || ProcMeta {
        comm: c.into(),
        container: String::new(),
        ..ProcMeta::default()
    }
}

#[test]
fn folds_least_active_into_other_keeping_sums() {
    let mut s = Store::new(2, Duration::from_secs(60));
    s.proc_mut(p(1), meta("a")).parts.n += 5;
    std::thread::sleep(Duration::from_millis(2));
    s.proc_mut(p(2), meta("b")).parts.n += 7;
    std::thread::sleep(Duration::from_millis(2));
    s.proc_mut(p(3), meta("c")).parts.n += 1;
    assert_eq!(s.len(), 2);
    let all: Vec<_> = s
        .iter()
        .map(|(pid, st)| (pid, st.meta.comm.clone(), st.parts.n))
        .collect();
    assert!(
        all.contains(&(String::new(), OTHER_COMM.into(), 5)),
        "{all:?}"
    );
    assert_eq!(all.iter().map(|x| x.2).sum::<u64>(), 13);
    assert_eq!(s.folded, 1);
}

#[test]
fn a_process_seen_alive_again_is_not_exited() {
    let mut s = Store::new(10, Duration::from_millis(20));
    s.proc_mut(p(1), meta("a")).parts.n += 1;
    s.expire(|_| false);
    assert_eq!(s.tracked().len(), 1, "looked at again by the next GC");
    s.expire(|_| true);
    std::thread::sleep(Duration::from_millis(30));
    s.expire(|_| true);
    assert_eq!(s.len(), 1, "alive: kept past the retention window");
    assert!(s.procs().all(|(_, st)| st.exited.is_none()));
}

#[test]
fn exited_processes_leave_after_retention() {
    let mut s = Store::new(10, Duration::from_millis(20));
    s.proc_mut(p(1), meta("a")).parts.n += 1;
    s.expire(|_| false);
    assert_eq!(s.len(), 1, "kept during retention");
    std::thread::sleep(Duration::from_millis(30));
    s.expire(|_| false);
    assert!(s.is_empty());
}

#[test]
fn a_reused_pid_never_duplicates_series() {
    let mut s = Store::new(10, Duration::from_secs(600));
    s.proc_mut(p(7), meta("a")).parts.n += 2;
    s.expire(|_| false); // exited, kept for retention
    let reused = Who::Proc(ProcRef {
        tgid: 7,
        start_ticks: 99,
    });
    s.proc_mut(reused, meta("a")).parts.n += 1;
    let pids: Vec<String> = s.iter().map(|(pid, _)| pid).collect();
    assert_eq!(pids.iter().filter(|x| *x == "7").count(), 1, "{pids:?}");
    let total: u64 = s.iter().map(|(_, st)| st.parts.n).sum();
    assert_eq!(total, 3, "the old process's counts moved to _other");
}

fn proc_ref(t: u32) -> ProcRef {
    ProcRef {
        tgid: t,
        start_ticks: 1,
    }
}

#[test]
fn placeholders_use_only_free_room_and_go_first() {
    let mut s = Store::new(3, Duration::from_secs(600));
    s.proc_mut(p(1), meta("counted")).parts.n += 1;
    s.placeholder(proc_ref(2), meta("udp-a"))
        .unwrap()
        .parts
        .add("udp", 0);
    s.placeholder(proc_ref(3), meta("udp-b")).unwrap();
    assert_eq!(s.len(), 3);
    assert_eq!(s.placeholders(), 2);
    // Full: a fourth placeholder is refused, nothing is folded for it.
    assert!(s.placeholder(proc_ref(4), meta("udp-c")).is_none());
    assert_eq!((s.len(), s.folded), (3, 0));
    // An existing entry is handed back as it is (a counted one stays counted).
    assert!(!s.placeholder(proc_ref(1), meta("x")).unwrap().placeholder);
    // A process with counts takes a placeholder's room; nothing is folded into _other.
    s.proc_mut(p(5), meta("new")).parts.n += 2;
    assert_eq!((s.len(), s.folded, s.placeholders()), (3, 0, 1));
    assert!(s.iter().all(|(_, st)| st.meta.comm != OTHER_COMM));
    // A placeholder that counts becomes a process like any other.
    s.proc_mut(p(3), meta("udp-b")).parts.n += 1;
    assert_eq!(s.placeholders(), 0);
    // Then the least active counted process is folded as before.
    s.proc_mut(p(6), meta("newer")).parts.n += 1;
    assert_eq!(s.folded, 1);
}

#[test]
fn exited_placeholders_leave_at_once() {
    let mut s = Store::new(10, Duration::from_secs(600));
    s.placeholder(proc_ref(1), meta("udp")).unwrap();
    s.proc_mut(p(2), meta("counted")).parts.n += 1;
    s.expire(|_| false);
    let left: Vec<String> = s.iter().map(|(_, st)| st.meta.comm.clone()).collect();
    assert_eq!(
        left,
        vec!["counted".to_string()],
        "kept for retention: counted only"
    );
}

#[test]
fn an_exec_starts_new_series_and_keeps_the_old_ones() {
    let mut s = Store::new(10, Duration::from_millis(20));
    let r = proc_ref(4);
    s.proc_mut(p(4), meta("launcher")).parts.add("udp", 5);
    s.relabel(r, meta("worker")());
    s.proc_mut(p(4), meta("unused")).parts.add("udp", 2);
    let by_comm = |s: &Store| -> Vec<(String, String, u64)> {
        let mut v: Vec<_> = s
            .iter()
            .map(|(pid, st)| (pid, st.meta.comm.clone(), st.parts.sum()))
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        by_comm(&s),
        vec![
            ("4".into(), "launcher".into(), 5),
            ("4".into(), "worker".into(), 2)
        ]
    );
    // Back to an earlier name: that series continues (no duplicate labels).
    s.relabel(r, meta("launcher")());
    s.proc_mut(p(4), meta("unused")).parts.add("udp", 1);
    assert_eq!(
        by_comm(&s),
        vec![
            ("4".into(), "launcher".into(), 6),
            ("4".into(), "worker".into(), 2)
        ]
    );
    // The old labels leave after the retention window.
    std::thread::sleep(Duration::from_millis(30));
    s.expire(|_| true);
    assert_eq!(by_comm(&s), vec![("4".into(), "launcher".into(), 6)]);
}

#[test]
fn unknown_is_separate() {
    let mut s = Store::new(1, Duration::from_secs(1));
    s.proc_mut(Who::Unknown, meta("x")).parts.add("udp", 3);
    let unknown: Vec<_> = s
        .iter()
        .filter(|(_, st)| st.meta.comm == UNKNOWN_COMM)
        .collect();
    assert_eq!(unknown.len(), 1);
    assert_eq!(s.len(), 0);
}
