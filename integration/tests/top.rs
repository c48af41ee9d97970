//! `bufscope top` in a real terminal: tmux at 80×24 (`send-keys`, `capture-pane`) against a
//! real exporter and a real dropping process, the total it shows compared with the kernel's
//! drops column of the socket (`/proc/<pid>/net/udp`); and against an exporter that is not
//! there, then answers garbage, then answers: a one-line error, retries, no panic, and the
//! terminal restored after `q` (raw mode off per `stty -a`, alternate screen left per tmux).
#![allow(clippy::unwrap_used)]

use std::io::{Read as _, Write as _};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bufscope_integration::fixtures::rmem_max;
use bufscope_integration::{Exporter, Workload, bufscope_bin, eventually, proc_udp_drops};
use serde_json::Value;

/// How long the screen may take to show what a step expects (a condition, not a measurement:
/// a healthy run takes a second or two).
const SCREEN_WAIT: Duration = Duration::from_secs(30);

/// A private tmux server (its own socket, no user config, no status line) running one command
/// in an 80×24 window. Dropping it kills that server.
struct Tmux {
    socket: String,
    conf: PathBuf,
}

impl Tmux {
    fn start(command: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let socket = format!(
            "bufscope-top-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let conf = std::env::temp_dir().join(format!("{socket}.conf"));
        std::fs::write(&conf, "set -g status off\n").unwrap();
        let t = Self { socket, conf };
        t.run(&[
            "new-session",
            "-d",
            "-x",
            "80",
            "-y",
            "24",
            "-s",
            "top",
            command,
        ]);
        assert_eq!(
            t.run(&[
                "display-message",
                "-p",
                "-t",
                "top",
                "#{pane_width}x#{pane_height}"
            ])
            .trim(),
            "80x24"
        );
        t
    }

    fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .args(["-L", &self.socket, "-f"])
            .arg(&self.conf)
            .args(args)
            .output()
            .expect("tmux (Debian package tmux; cargo xtask setup installs it)");
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn screen(&self) -> Vec<String> {
        self.run(&["capture-pane", "-p", "-t", "top"])
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Keys by tmux name (`s`, `Enter`, `Escape`, `Down`).
    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "top"];
        args.extend_from_slice(keys);
        self.run(&args);
    }

    /// Literal text.
    fn type_text(&self, text: &str) {
        self.run(&["send-keys", "-t", "top", "-l", text]);
    }

    /// Waits until `ok` accepts the screen; panics with `what` and the last screen.
    fn wait(&self, what: &str, mut ok: impl FnMut(&[String]) -> bool) -> Vec<String> {
        let deadline = Instant::now() + SCREEN_WAIT;
        loop {
            let s = self.screen();
            if ok(&s) {
                return s;
            }
            if Instant::now() > deadline {
                panic!("screen never showed {what}; last screen:\n{}", s.join("\n"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn format(&self, f: &str) -> String {
        self.run(&["display-message", "-p", "-t", "top", f])
            .trim()
            .to_string()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .output();
        let _ = std::fs::remove_file(&self.conf);
    }
}

/// The shell command tmux runs: `bufscope top`, then its exit code and the terminal settings
/// it left behind, then a sleep that keeps the pane open for reading.
fn top_command(url: &str) -> String {
    top_command_with(url, "")
}

/// [`top_command`] with more arguments.
fn top_command_with(url: &str, extra: &str) -> String {
    format!(
        "'{}' top --url {url} {extra}; echo \"top-exit=$?\"; stty -a; exec sleep 3600",
        bufscope_bin().display()
    )
}

/// Process rows: the lines between the column header and the key line, as words.
fn rows(screen: &[String]) -> Vec<Vec<String>> {
    let Some(head) = screen.iter().position(|l| l.contains("PID COMM")) else {
        return Vec::new();
    };
    screen[head + 1..]
        .iter()
        .take_while(|l| !l.starts_with("q quit"))
        .map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .filter(|w| !w.is_empty())
        .collect()
}

/// `DROPS/S` as a number (`0`, `2.5`, `862`, `123.4k`, `1.2M`).
fn rate(s: &str) -> f64 {
    let (num, mult) = match s.chars().last() {
        Some('k') => (&s[..s.len() - 1], 1e3),
        Some('M') => (&s[..s.len() - 1], 1e6),
        Some('G') => (&s[..s.len() - 1], 1e9),
        _ => (s, 1.0),
    };
    num.parse::<f64>().map(|n| n * mult).unwrap_or(0.0)
}

/// The exporter's `/api/v1/status` row for `pid`.
fn status_row(e: &Exporter, pid: u32) -> Option<Value> {
    let (code, body) = e.get("/api/v1/status");
    assert_eq!(code, 200, "{body}");
    let doc: Value = serde_json::from_str(&body).unwrap();
    let want = pid.to_string();
    doc["processes"]
        .as_array()?
        .iter()
        .find(|r| r["pid"].as_str() == Some(want.as_str()))
        .cloned()
}

/// After `q`: exit code 0, raw mode off, alternate screen left, cursor shown.
fn assert_exited_and_restored(t: &Tmux) {
    let s = t.wait("top-exit= and the terminal settings", |s| {
        s.iter().any(|l| l.contains("top-exit=")) && s.iter().any(|l| l.contains("icanon"))
    });
    let all = s.join("\n");
    assert!(all.contains("top-exit=0"), "exit code:\n{all}");
    assert!(!all.contains("panicked"), "{all}");
    let words: Vec<&str> = all.split_whitespace().collect();
    for flag in ["icanon", "echo", "isig", "icrnl", "opost"] {
        assert!(
            words.contains(&flag) && !words.contains(&format!("-{flag}").as_str()),
            "terminal not restored: stty shows -{flag}:\n{all}"
        );
    }
    assert_eq!(
        t.format("#{alternate_on}"),
        "0",
        "still on the alternate screen"
    );
    assert_eq!(t.format("#{cursor_flag}"), "1", "cursor hidden");
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn top_shows_the_dropping_process_with_the_kernels_count() {
    let rmem = rmem_max();
    let exporter = Exporter::start(&[]);
    let dropper = Workload::start(&["udp-recv", "--rcvbuf", "4096", "--comm", "bstop-z-drop"]);
    let idle = Workload::start(&["hold-comm", "--comm", "bstop-a-idle"]);
    let (dpid, ipid) = (dropper.pid(), idle.pid());
    let inode: u64 = dropper.get("inodes").parse().unwrap();
    let port = dropper.get("ports").to_string();

    let t = Tmux::start(&top_command(&format!("http://{}", exporter.addr)));
    // Header: rmem_max and probe health as the exporter reports them.
    let (_, body) = exporter.get("/api/v1/status");
    let doc: Value = serde_json::from_str(&body).unwrap();
    let probes = doc["probes"].as_array().unwrap();
    let up = probes.iter().filter(|p| p["attached"] == true).count();
    let s = t.wait("the header", |s| {
        s[0].contains(&format!("rmem_max {rmem} ")) && s[1].starts_with("probes ")
    });
    assert!(
        s[1].starts_with(&format!("probes {up}/")),
        "{up} attached: {}",
        s[1]
    );
    // Failed probes first, switched-off ones last: on these 80 columns the line may end
    // before the last switched-off ones (the count above includes them).
    let full = s[1].trim_end().chars().count() >= 79;
    for p in probes {
        let name = p["probe"].as_str().unwrap();
        let line = format!("{} ", s[1]);
        let off_and_cut = p["attached"] != true
            && p["error"]
                .as_str()
                .is_some_and(|e| e == "disabled" || e.starts_with("off "))
            && full;
        if off_and_cut && !line.contains(&format!(" {name}:off ")) {
            continue;
        }
        let shown = if p["attached"] == true {
            line.contains(&format!(" {name} "))
        } else {
            // Switched off (guard with --guard.mode off) or failed.
            line.contains(&format!(" {name}:off ")) || line.contains(&format!(" {name} FAILED"))
        };
        assert!(
            shown,
            "probe {p} not shown as the exporter reports it: {}",
            s[1]
        );
    }
    assert!(
        s[3].contains("PID COMM") && s[3].contains("DROPS/S"),
        "{}",
        s[3]
    );

    // While the receiver drops as fast as a sender can make it, it is the top row, with a rate.
    let blast = Workload::start(&[
        "udp-blast",
        "--dest",
        &format!("127.0.0.1:{port}"),
        "--seconds",
        "600",
    ]);
    let s = t.wait("the dropper as the top row with a drop rate", |s| {
        rows(s).first().is_some_and(|r| {
            r[0] == dpid.to_string() && r[1] == "bstop-z-drop" && rate(&r[2]) > 0.0
        })
    });
    eprintln!("while dropping:\n{}", s.join("\n"));
    // SAFETY: kill(2) on the blaster's pid, a child of this test that is not reaped yet.
    unsafe { libc::kill(blast.pid() as i32, libc::SIGKILL) };
    let _ = blast.wait();

    // Once it stopped: the total shown is the kernel's drops column of the socket.
    let kernel = proc_udp_drops(dpid, inode).expect("receiver socket in /proc/<pid>/net/udp");
    assert!(
        kernel > 1000,
        "the blast should overflow the buffer: {kernel}"
    );
    eventually(
        SCREEN_WAIT,
        "the exporter to reach the kernel's count",
        || status_row(&exporter, dpid).filter(|r| r["drops_total"] == kernel),
    );
    let s = t.wait("the kernel's total on the dropper's row", |s| {
        rows(s)
            .iter()
            .any(|r| r[0] == dpid.to_string() && r[3] == kernel.to_string())
    });
    eprintln!("kernel drops column {kernel}; top:\n{}", s.join("\n"));
    let row = rows(&s)
        .into_iter()
        .find(|r| r[0] == dpid.to_string())
        .unwrap();
    assert_eq!(row[3], kernel.to_string(), "top's total vs the kernel's");
    assert!(
        row.last().is_some_and(|f| f.starts_with("udp_rcvbuf_drop")),
        "top finding: {row:?}"
    );

    // `s` cycles the sort; `/` filters by comm.
    t.keys(&["s"]);
    t.wait("the next sort", |s| s[2].contains("sort: total drops"));
    for _ in 0..10 {
        if t.screen()[2].contains("sort: comm") {
            break;
        }
        t.keys(&["s"]);
        std::thread::sleep(Duration::from_millis(200));
    }
    t.wait("sort by comm", |s| s[2].contains("sort: comm"));
    t.keys(&["/"]);
    t.type_text("bstop-");
    t.keys(&["Enter"]);
    let s = t.wait("only the two bstop- processes, A to Z", |s| {
        let r = rows(s);
        s[2].contains("filter: bstop-")
            && r.len() == 2
            && r[0][0] == ipid.to_string()
            && r[0][1] == "bstop-a-idle"
            && r[1][0] == dpid.to_string()
    });
    eprintln!("filtered, by comm:\n{}", s.join("\n"));
    assert!(s[2].contains("2 of "), "{}", s[2]);
    let idle_row = &rows(&s)[0];
    let idle_status = status_row(&exporter, ipid).expect("the idle process's status row");
    assert_eq!(idle_row[3], "0", "no drops: {idle_row:?}");
    assert_eq!(
        idle_row[4],
        idle_status["rcvbuf_locks"].to_string(),
        "locked sockets as the exporter counts them"
    );

    // Enter on the dropper: its finding with the fix the exporter gives.
    let (_, body) = exporter.get("/api/v1/findings");
    let doc: Value = serde_json::from_str(&body).unwrap();
    let finding = doc["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "udp_rcvbuf_drops" && f["process"]["pid"] == dpid)
        .expect("the exporter's udp_rcvbuf_drops finding for the dropper")
        .clone();
    // The first fix the exporter gives, as the detail view labels it by where it goes
    // (`app:`, `pod:`, `host:`), else the finding's one-line fix.
    let expected = match finding["fixes"].as_array().and_then(|f| f.first()) {
        Some(x) => {
            let label = match x["scope"].as_str() {
                Some("application") => "app:",
                Some("pod") => "pod:",
                _ => "host:",
            };
            let not = if x["possible"] == false {
                "(not from here) "
            } else {
                ""
            };
            format!("{label} {not}{}", x["how"].as_str().unwrap())
        }
        None => format!("fix: {}", finding["fix"].as_str().unwrap()),
    };
    let fix_words = expected.split_whitespace().collect::<Vec<_>>().join(" ");
    t.keys(&["Down", "Enter"]);
    let s = t.wait("the dropper's findings with the fix", |s| {
        let flat = s.join(" ").split_whitespace().collect::<Vec<_>>().join(" ");
        s[3].contains(&format!("bstop-z-drop (pid {dpid})"))
            && flat.contains("CRITICAL udp_rcvbuf_drops")
            && flat.contains(&fix_words)
    });
    eprintln!("findings:\n{}", s.join("\n"));
    t.keys(&["Escape"]);
    t.wait("the table again", |s| s[3].contains("PID COMM"));

    t.keys(&["q"]);
    assert_exited_and_restored(&t);
}

/// A stand-in exporter on `listener`: answers a truncated document while `mode` is 1, valid
/// documents with one process after.
fn fake_exporter(listener: TcpListener, mode: Arc<AtomicU8>) {
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut c) = conn else { continue };
            let mut req = [0u8; 2048];
            let n = c.read(&mut req).unwrap_or(0);
            let req = String::from_utf8_lossy(&req[..n]);
            let body = match (
                mode.load(Ordering::SeqCst),
                req.contains("/api/v1/findings"),
            ) {
                (1, _) => "{\"processes\": [1, 2".to_string(),
                (_, false) => serde_json::json!({
                    "version": "fake", "kernel": "none", "net_core_rmem_max": 4242,
                    "processes": [{"pid": "4242", "comm": "fake-proc", "drops_total": 77}],
                    "probes": [{"probe": "drops", "attached": true}],
                })
                .to_string(),
                (_, true) => "{\"version\": 1, \"findings\": []}".to_string(),
            };
            let _ = write!(
                c,
                "HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{body}"
            );
        }
    });
}

#[test]
#[ignore = "needs tmux: run via cargo xtask test"]
fn top_retries_an_unreachable_exporter_and_survives_malformed_json() {
    // A port nobody listens on (yet).
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let t = Tmux::start(&top_command(&url));
    let s = t.wait("a connection error", |s| {
        s[2].starts_with("error: /api/v1/status: Connection refused")
    });
    eprintln!("unreachable:\n{}", s.join("\n"));
    // Keys still work while it cannot connect.
    t.keys(&["s", "/"]);
    t.type_text("x");
    // Filter "x", End, Enter (no row: stays), Esc (clears the filter), PageUp.
    t.keys(&["Enter", "End", "Enter", "Escape", "PageUp"]);

    let mode = Arc::new(AtomicU8::new(1));
    fake_exporter(
        TcpListener::bind(("127.0.0.1", port)).unwrap(),
        mode.clone(),
    );
    let s = t.wait("the JSON error", |s| {
        // serde_json's message for the truncated document, cause first.
        s[2].starts_with("error: /api/v1/status: EOF while parsing")
    });
    eprintln!("garbage:\n{}", s.join("\n"));
    assert!(
        s.iter().all(|l| !l.contains("panicked")),
        "{}",
        s.join("\n")
    );

    mode.store(2, Ordering::SeqCst);
    let s = t.wait("the fake process once the documents are valid", |s| {
        !s[2].starts_with("error:")
            && s[0].contains("rmem_max 4242 ")
            && rows(s)
                .iter()
                .any(|r| r[0] == "4242" && r[1] == "fake-proc" && r[3] == "77")
    });
    eprintln!("recovered:\n{}", s.join("\n"));
    t.keys(&["q"]);
    assert_exited_and_restored(&t);
}

/// A CA, a `localhost` certificate it signed and a web config with TLS and basic auth (user
/// `prom`, password `s3cret`) in `dir`; returns (web config, CA certificate).
fn tls_and_auth_config(dir: &std::path::Path) -> (PathBuf, PathBuf) {
    let script = "set -e
        openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=bufscope-top-ca \
            -keyout ca.key -out ca.crt 2>/dev/null
        openssl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout server.key \
            -out server.csr 2>/dev/null
        echo subjectAltName=DNS:localhost,IP:127.0.0.1 > ext.cnf
        openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
            -extfile ext.cnf -out server.crt 2>/dev/null";
    let out = Command::new("sh")
        .args(["-c", script])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openssl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let hash = bcrypt::hash("s3cret", 6).unwrap();
    let web = dir.join("web.yml");
    std::fs::write(
        &web,
        format!(
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n\
             basic_auth_users:\n  prom: {hash}\n"
        ),
    )
    .unwrap();
    (web, dir.join("ca.crt"))
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn top_reads_an_exporter_over_tls_with_basic_auth() {
    let dir = std::env::temp_dir().join(format!("bufscope-top-tls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (web, ca) = tls_and_auth_config(&dir);
    let exporter = Exporter::start(&["--web.config.file", web.to_str().unwrap()]);
    let port = exporter.addr.rsplit(':').next().unwrap().to_string();
    let url = format!("https://localhost:{port}");
    let tls_args = format!("--tls.ca-file '{}' --web.user prom", ca.display());
    let rmem = rmem_max();

    // The right password: data.
    let t = Tmux::start(&format!(
        "BUFSCOPE_PASSWORD=s3cret {}",
        top_command_with(&url, &tls_args)
    ));
    t.wait("data over TLS with basic auth", |s| {
        s[0].contains(&format!("rmem_max {rmem} ")) && !s[2].starts_with("error:")
    });
    t.keys(&["q"]);
    assert_exited_and_restored(&t);
    drop(t);

    // A wrong one: the exporter's 401 as a one-line error naming the fix.
    let t = Tmux::start(&format!(
        "BUFSCOPE_PASSWORD=wrong {}",
        top_command_with(&url, &tls_args)
    ));
    let s = t.wait("the basic-auth error", |s| {
        s[2].starts_with(&format!("error: /api/v1/status: {url} wants basic auth"))
    });
    eprintln!("wrong password:\n{}", s.join("\n"));
    t.keys(&["q"]);
    assert_exited_and_restored(&t);
    drop(exporter);
    let _ = std::fs::remove_dir_all(&dir);
}
