//! The drawing, on a test terminal.

#![allow(clippy::unwrap_used)]
use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::Terminal;
use ratatui::backend::TestBackend;

use bufscope_api::{ProcessRef, ProcessRow, SocketRef};

use super::super::app::{Sort, Update};
use super::super::data::Snapshot;
use super::*;
use bufscope_api::{Finding, ProbeRow, Severity, StatusDocument};

fn screen(t: &Terminal<TestBackend>) -> Vec<String> {
    let b = t.backend().buffer();
    (0..b.area.height)
        .map(|y| {
            (0..b.area.width)
                .map(|x| b[(x, y)].symbol().to_string())
                .collect::<String>()
        })
        .collect()
}

fn finding(pid: u32, comm: &str, kind: &str, sev: Severity) -> Finding {
    Finding {
        process: ProcessRef {
            pid,
            comm: comm.into(),
            container: String::new(),
            ..ProcessRef::default()
        },
        kind: kind.into(),
        severity: sev,
        summary: "UDP socket dropping 862/s over the last 60s with an effective 8 KiB receive buffer".into(),
        fix: "request a 7.0 MiB receive buffer: SO_RCVBUFFORCE (with CAP_NET_ADMIN), else SO_RCVBUF with net.core.rmem_max >= 7340032 (now 212992); UDP has no autotuning".into(),
        guard: None,
        socket: Some(SocketRef {
            inode: 42,
            proto: "udp".into(),
            netns: 0,
        }),
        evidence: [("drops_total".to_string(), 2997.0)].into(),
        rule: "UDP 7 MiB rcv+snd".into(),
        ..Finding::default()
    }
}

/// 1,000 processes; process i drops 1000-i in total and i*3 per second.
fn thousand(at: f64, step: u64) -> Update {
    let processes = (0..1000u32)
        .map(|i| ProcessRow {
            pid: (10_000 + i).to_string(),
            comm: format!("proc-{i:04}-with-a-long-name"),
            container: if i % 2 == 0 {
                "0123456789abcdef0123".into()
            } else {
                String::new()
            },
            drops_total: 1_000_000 + (1000 - i as u64) + step * i as u64 * 3,
            rcvbuf_locks: i as u64 % 7,
            tcp_wscale_shrunk: i as u64 % 5,
            clamped: i as u64 % 3,
            ..ProcessRow::default()
        })
        .collect();
    let probe = |name: &str, attached: bool, error: Option<&str>| ProbeRow {
        probe: name.into(),
        attached,
        error: error.map(str::to_string),
        ..ProbeRow::default()
    };
    Update::Data(Box::new(Snapshot {
        status: StatusDocument {
            generated_at: Some(at),
            version: "0.1.0".into(),
            kernel: "6.12.0".into(),
            net_core_rmem_max: Some(212992),
            tracked_processes: 1000,
            processes,
            probes: vec![
                probe("drops", true, None),
                probe("autotune", false, Some("disabled")),
                probe("tcp_state", false, Some("EPERM")),
            ],
            ..StatusDocument::default()
        },
        findings: vec![
            finding(
                10_999,
                "proc-0999-with-a-long-name",
                "udp_rcvbuf_drops",
                Severity::Critical,
            ),
            finding(
                10_999,
                "proc-0999-with-a-long-name",
                "rcvbuf_clamped",
                Severity::Warning,
            ),
        ],
    }))
}

fn press(app: &mut App, code: KeyCode) {
    app.key(KeyEvent::new(code, KeyModifiers::NONE));
}

#[test]
fn probe_line_shows_ns_per_run_when_the_exporter_has_run_stats() {
    let s = StatusDocument {
        probes: vec![
            ProbeRow {
                probe: "drops".into(),
                attached: true,
                run_time_ns: Some(2_500_000),
                run_count: Some(10_000),
                ..ProbeRow::default()
            },
            ProbeRow {
                probe: "owners".into(),
                attached: true,
                ..ProbeRow::default()
            },
        ],
        ..StatusDocument::default()
    };
    let text: String = probe_line(&s).iter().map(|x| x.content.as_ref()).collect();
    assert_eq!(text, "probes 2/2: drops 250ns/run owners");
}

#[test]
fn thousand_processes_at_80x24() {
    let mut t = Terminal::new(TestBackend::new(80, 24)).unwrap();
    let mut app = App::new("http://127.0.0.1:9477");
    app.apply(thousand(100.0, 0), 0.0);
    app.apply(thousand(101.0, 1), 0.0);
    t.draw(|f| draw(f, &mut app)).unwrap();
    let s = screen(&t);
    assert!(
        s[0].contains("rmem_max 212992 (208 KiB)") && s[0].contains("1000 procs"),
        "{}",
        s[0]
    );
    assert!(
        s[1].contains("probes 1/2: tcp_state FAILED (EPERM) drops autotune:off"),
        "{}",
        s[1]
    );
    assert!(
        s[2].contains("sort: drops/s") && s[2].contains("1000 of 1000 shown"),
        "{}",
        s[2]
    );
    let head: Vec<&str> = s[3].split_whitespace().collect();
    assert_eq!(
        head,
        [
            "PID", "COMM", "DROPS/S", "DROPS", "LOCKED", "SHRUNK", "CLAMPED", "TOP", "FINDING"
        ],
        "80 columns: everything but the container"
    );
    // The fastest dropper first: pid 10999 drops 2997/s.
    let first: Vec<&str> = s[4].split_whitespace().collect();
    assert_eq!(&first[..4], ["10999", "proc-0999-with…", "2997", "1002998"]);
    assert_eq!(&first[4..7], ["5", "4", "0"], "999 % 7, % 5, % 3");
    assert_eq!(first[7], "udp_rcvbuf_drop…", "truncated to the room left");
    assert_eq!(s.len(), 24);
    assert!(
        s[23].contains("q quit") && s[23].contains("s sort"),
        "{}",
        s[23]
    );
    // 19 process rows fit: 24 - 3 header - 1 column header - 1 key line.
    assert_eq!(app.page, 19);
    assert!(s[22].trim_start().starts_with("10981"), "{}", s[22]);

    // End shows the last (slowest) process at the bottom, selected.
    press(&mut app, KeyCode::End);
    t.draw(|f| draw(f, &mut app)).unwrap();
    let s = screen(&t);
    assert!(s[22].trim_start().starts_with("10000"), "{}", s[22]);
    assert_eq!(app.selected, 999);
    press(&mut app, KeyCode::PageUp);
    press(&mut app, KeyCode::Up);
    t.draw(|f| draw(f, &mut app)).unwrap();
    let s = screen(&t);
    assert!(s[4].trim_start().starts_with("10020"), "{}", s[4]);
    assert_eq!(app.selected_row().unwrap().proc.pid, "10020");

    // Wider terminals get the container column.
    t.backend_mut().resize(120, 24);
    t.draw(|f| draw(f, &mut app)).unwrap();
    let s = screen(&t);
    assert!(s[3].contains("CONTAINER"), "{}", s[3]);
    assert!(
        s.iter().any(|l| l.contains("0123456789ab ")),
        "12 characters of the id"
    );
}

#[test]
fn detail_shows_findings_and_fixes_wrapped() {
    let mut t = Terminal::new(TestBackend::new(80, 24)).unwrap();
    let mut app = App::new("http://127.0.0.1:9477");
    app.apply(thousand(100.0, 0), 0.0);
    app.apply(thousand(101.0, 1), 0.0);
    press(&mut app, KeyCode::Enter);
    t.draw(|f| draw(f, &mut app)).unwrap();
    let s = screen(&t);
    let body = s[3..23].join("\n");
    assert!(
        s[3].contains("proc-0999-with-a-long-name (pid 10999)"),
        "{body}"
    );
    assert!(
        body.contains("CRITICAL  udp_rcvbuf_drops  socket inode 42 (udp)"),
        "{body}"
    );
    assert!(body.contains("WARNING  rcvbuf_clamped"), "{body}");
    let flat = body.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(flat.contains("fix: request a 7.0 MiB receive buffer: SO_RCVBUFFORCE (with CAP_NET_ADMIN), else SO_RCVBUF with net.core.rmem_max >= 7340032 (now 212992); UDP has no autotuning"), "{body}");
    assert!(s[23].contains("Esc back"), "{}", s[23]);
    // Scrolling to the end and back.
    press(&mut app, KeyCode::End);
    t.draw(|f| draw(f, &mut app)).unwrap();
    let end = screen(&t);
    assert!(
        end[3..23].join("\n").contains("why:"),
        "the last lines are on screen"
    );
    press(&mut app, KeyCode::Home);
    press(&mut app, KeyCode::Esc);
    t.draw(|f| draw(f, &mut app)).unwrap();
    assert!(screen(&t)[3].contains("DROPS/S"));
}

#[test]
fn errors_and_small_terminals() {
    let mut t = Terminal::new(TestBackend::new(80, 24)).unwrap();
    let mut app = App::new("http://127.0.0.1:1");
    t.draw(|f| draw(f, &mut app)).unwrap();
    assert!(screen(&t)[2].contains("connecting to http://127.0.0.1:1"));
    app.apply(
        Update::Error("connecting to http://127.0.0.1:1 (is `bufscope run` running there?): Connection refused (os error 111)".into()),
        0.0,
    );
    t.draw(|f| draw(f, &mut app)).unwrap();
    let s = screen(&t);
    assert!(
        s[2].starts_with("error: connecting to http://127.0.0.1:1"),
        "{}",
        s[2]
    );
    assert!(s[2].trim_end().ends_with('…'), "one line, cut: {}", s[2]);
    // Tiny terminals draw without panicking; sorting by every key works.
    app.apply(thousand(1.0, 0), 0.0);
    for (w, h) in [(20, 5), (1, 1), (40, 10), (200, 60)] {
        t.backend_mut().resize(w, h);
        for _ in 0..Sort::ALL.len() {
            press(&mut app, KeyCode::Char('s'));
            t.draw(|f| draw(f, &mut app)).unwrap();
        }
    }
}

#[test]
fn every_severity_has_its_label() {
    let text = |sev| {
        finding_lines(&finding(1, "p", "tcp_rcvbuf_lock", sev), 80)[0]
            .spans
            .iter()
            .map(|s| s.content.to_string())
            .collect::<String>()
    };
    assert!(text(Severity::Critical).starts_with("CRITICAL  tcp_rcvbuf_lock"));
    assert!(text(Severity::Warning).starts_with("WARNING  tcp_rcvbuf_lock"));
    assert!(
        text(Severity::Info).starts_with("INFO  tcp_rcvbuf_lock  socket inode 42 (udp)"),
        "{}",
        text(Severity::Info)
    );
}

#[test]
fn columns_and_numbers() {
    let names = |w| columns(w).into_iter().map(|(c, _)| c).collect::<Vec<_>>();
    assert!(!names(80).contains(&Col::Container));
    assert!(names(80).contains(&Col::Clamped));
    assert_eq!(columns(80).iter().map(|(_, w)| w + 1).sum::<u16>(), 81);
    assert_eq!(
        names(50),
        [Col::Pid, Col::Comm, Col::Rate, Col::Total, Col::Finding]
    );
    assert!(names(120).contains(&Col::Container));
    assert_eq!(count(123_456_789, 9), "123456789");
    assert_eq!(count(12_345_678_901, 9), "12.3G");
    assert_eq!(rate(Some(2.25)), "2.2");
    assert_eq!(rate(Some(862.4)), "862");
    assert_eq!(rate(Some(1_234_567.0)), "1.2M");
    assert_eq!(rate(None), "-");
    assert_eq!(fit("wireguard-go-long", 8), "wiregua…");
    assert_eq!(fit("abc", 3), "abc");
}
