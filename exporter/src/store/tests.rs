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

/// Every shown identity's value by comm (all admitted), overflow as `"_other!"`.
fn shown(s: &mut Store) -> BTreeMap<String, u64> {
    s.admit(|r| usize::from(r.stats.has_counts()));
    s.rows()
        .into_iter()
        .map(|r| {
            let name = match r.overflow {
                true => format!("{}!", r.stats.meta.comm),
                false => r.stats.meta.comm.clone(),
            };
            (name, r.stats.parts.sum())
        })
        .collect()
}

/// A process that leaves the per-process detail for room keeps its counts on its
/// identity's series: no series takes over what another showed, nothing goes down.
#[test]
fn folding_out_of_the_detail_moves_no_count_between_series() {
    let mut s = Store::new(2, Duration::from_secs(60));
    s.proc_mut(p(1), meta("a")).parts.n += 5;
    assert_eq!(shown(&mut s)["a"], 5);
    std::thread::sleep(Duration::from_millis(2));
    s.proc_mut(p(2), meta("b")).parts.n += 7;
    std::thread::sleep(Duration::from_millis(2));
    s.proc_mut(p(3), meta("c")).parts.n += 1;
    assert_eq!(s.len(), 2);
    assert_eq!(s.folded, 1);
    let after = shown(&mut s);
    assert_eq!(
        after["a"], 5,
        "a's series goes on with a's counts: {after:?}"
    );
    assert!(
        !after.contains_key("_other!"),
        "nothing went to the overflow"
    );
    // a counts again: a new entry of the same identity, the series goes on from 5.
    s.proc_mut(p(1), meta("a")).parts.n += 2;
    assert_eq!(shown(&mut s)["a"], 7);
}

/// Processes of one program and place share one identity: a new pid adds no series; the
/// sum over time is every process's count, exited ones included.
#[test]
fn short_lived_processes_of_one_program_share_its_series() {
    let mut s = Store::new(10, Duration::from_millis(20));
    for i in 0..300 {
        s.proc_mut(p(100 + i), meta("resolver")).parts.n += 1;
        if i % 50 == 0 {
            s.expire(|_| false);
            std::thread::sleep(Duration::from_millis(25));
            s.proc_mut(p(1), meta("wg")).parts.n += 1;
        }
        let seen = shown(&mut s);
        assert_eq!(
            seen["resolver"],
            u64::from(i) + 1,
            "monotone, every count once"
        );
    }
    assert_eq!(s.own_identities(), 2);
    assert!(s.len() <= 10);
}

/// The budget: identities are admitted while their series fit; the next one, before it
/// was ever shown, goes to the overflow identity, its processes with it. Its later counts
/// go there too, and the overflow series only ever grows.
#[test]
fn identities_beyond_the_budget_count_on_the_overflow_series() {
    let mut s = Store::new(100, Duration::from_secs(60)).with_series_budget(3);
    assert_eq!((s.counter_budget(), s.info_budget()), (3, 0));
    for (i, c) in ["a", "b", "c", "d", "e"].into_iter().enumerate() {
        s.proc_mut(p(i as u32 + 1), meta(c)).parts.n += 10;
    }
    let seen = shown(&mut s);
    assert_eq!(
        seen,
        BTreeMap::from([
            ("a".into(), 10),
            ("b".into(), 10),
            ("c".into(), 10),
            ("_other!".into(), 20)
        ])
    );
    assert_eq!(s.overflowed, 2);
    s.series_used = 3;
    s.proc_mut(p(4), meta("d")).parts.n += 1;
    s.proc_mut(p(9), meta("e")).parts.n += 1;
    let seen = shown(&mut s);
    assert_eq!(
        seen["_other!"], 22,
        "d's later counts, and e's new process's"
    );
    assert_eq!(seen.values().sum::<u64>(), 52);
    assert_eq!(s.own_identities(), 3);
}

/// Pid reuse: an exited process kept for the retention and a new one with its pid are two
/// processes of their identities; nothing moves.
#[test]
fn a_reused_pid_moves_nothing() {
    let mut s = Store::new(10, Duration::from_secs(600));
    s.proc_mut(p(7), meta("a")).parts.n += 2;
    assert_eq!(shown(&mut s)["a"], 2);
    s.expire(|_| false);
    let reused = Who::Proc(ProcRef {
        tgid: 7,
        start_ticks: 99,
    });
    s.proc_mut(reused, meta("b")).parts.n += 1;
    let seen = shown(&mut s);
    assert_eq!((seen["a"], seen["b"]), (2, 1));
    assert!(!seen.contains_key("_other!"));
}

/// An identity whose processes all left goes `--retention` after the last one; a process
/// of it before then continues its series.
#[test]
fn identities_leave_the_retention_after_their_last_process() {
    let mut s = Store::new(10, Duration::from_millis(30));
    s.proc_mut(p(1), meta("a")).parts.n += 4;
    shown(&mut s);
    s.expire(|_| false);
    std::thread::sleep(Duration::from_millis(35));
    s.expire(|_| false);
    assert!(s.is_empty());
    assert_eq!(
        shown(&mut s)["a"],
        4,
        "the process left, its identity waits"
    );
    s.proc_mut(p(2), meta("a")).parts.n += 1;
    assert_eq!(shown(&mut s)["a"], 5);
    s.expire(|_| false);
    std::thread::sleep(Duration::from_millis(35));
    s.expire(|_| false);
    std::thread::sleep(Duration::from_millis(35));
    s.expire(|_| false);
    assert!(!shown(&mut s).contains_key("a"));
    assert_eq!(s.own_identities(), 0);
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
    // A process with counts takes a placeholder's room; nothing is folded.
    s.proc_mut(p(5), meta("new")).parts.n += 2;
    assert_eq!((s.len(), s.folded, s.placeholders()), (3, 0, 1));
    // A placeholder that counts becomes a process like any other.
    s.proc_mut(p(3), meta("udp-b")).parts.n += 1;
    assert_eq!(s.placeholders(), 0);
    // Then the least active counted process leaves the detail as before.
    s.proc_mut(p(6), meta("newer")).parts.n += 1;
    assert_eq!(s.folded, 1);
    // The zero series of a placeholder's identity is shown at 0.
    let seen = shown(&mut s);
    assert_eq!(seen.values().sum::<u64>(), 5);
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
fn an_exec_counts_on_the_new_identity_and_leaves_the_old_counts() {
    let mut s = Store::new(10, Duration::from_millis(20));
    let r = proc_ref(4);
    s.proc_mut(p(4), meta("launcher")).parts.add("udp", 5);
    assert_eq!(shown(&mut s)["launcher"], 5);
    s.relabel(r, meta("worker")());
    s.proc_mut(p(4), meta("unused")).parts.add("udp", 2);
    let seen = shown(&mut s);
    assert_eq!((seen["launcher"], seen["worker"]), (5, 2));
    // Back to an earlier name: that series continues.
    s.relabel(r, meta("launcher")());
    s.proc_mut(p(4), meta("unused")).parts.add("udp", 1);
    let seen = shown(&mut s);
    assert_eq!((seen["launcher"], seen["worker"]), (6, 2));
    // The old identity leaves the retention window after its process left it.
    std::thread::sleep(Duration::from_millis(30));
    s.expire(|_| true);
    let seen = shown(&mut s);
    assert_eq!(seen.get("worker"), None);
    assert_eq!(seen["launcher"], 6);
}

#[test]
fn unknown_is_separate() {
    let mut s = Store::new(1, Duration::from_secs(1));
    s.proc_mut(Who::Unknown, meta("x")).parts.add("udp", 3);
    assert_eq!(shown(&mut s)[UNKNOWN_COMM], 3);
    assert_eq!(s.len(), 0);
}

/// A stable hash: the same labels give the same key in every run and version.
#[test]
fn identity_hashes_are_stable() {
    let m = ProcMeta {
        comm: "wireguard-go".into(),
        cgroup: "system.slice/wg.service".into(),
        ..ProcMeta::default()
    };
    assert_eq!(identity_hash(&m), identity_hash(&m.clone()));
    assert_ne!(
        identity_hash(&m),
        identity_hash(&ProcMeta {
            comm: "wireguard-g".into(),
            cgroup: "o/system.slice/wg.service".into(),
            ..ProcMeta::default()
        })
    );
    assert_eq!(
        identity_hash(&ProcMeta::default()),
        15_556_837_164_214_743_357
    );
}

/// With the detail full, a UDP holder's zero series still exists, on its identity.
#[test]
fn zero_series_exist_even_with_the_detail_full() {
    let mut s = Store::new(1, Duration::from_secs(600));
    s.proc_mut(p(1), meta("busy")).parts.n += 1;
    s.zero_series(proc_ref(2), meta("quiet"), |parts| parts.add("udp", 0));
    assert_eq!(s.len(), 1, "no room: no entry, nothing folded");
    let rows = {
        s.admit(|r| r.stats.parts.by.len() + usize::from(r.stats.parts.n > 0));
        s.rows()
    };
    let quiet = rows.iter().find(|r| r.stats.meta.comm == "quiet").unwrap();
    assert_eq!(quiet.stats.parts.by.get("udp"), Some(&0));
    // Its first drops continue that series.
    s.proc_mut(p(2), meta("quiet")).parts.add("udp", 9);
    let rows = s.rows();
    let quiet = rows.iter().find(|r| r.stats.meta.comm == "quiet").unwrap();
    assert_eq!(quiet.stats.parts.by.get("udp"), Some(&9));
}
