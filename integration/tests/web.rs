//! The exporter's web surface beyond /metrics: findings (checked against the kernel's own
//! numbers), `bufscope explain`, TLS + basic auth (real curl), the YAML config file, and the
//! status page in a real headless Chromium (DOM + screenshot).
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use bufscope_integration::fixtures::setsockopt;
use bufscope_integration::{
    Exporter, Workload, bufscope_bin, eventually, proc_udp_drops, ss_tcp, ss_udp_rcvbuf,
};
use serde_json::Value;

fn findings(e: &Exporter) -> Vec<Value> {
    let (status, body) = e.get("/api/v1/findings");
    assert_eq!(status, 200, "{body}");
    let doc: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(doc["version"], 1, "schema version");
    doc["findings"].as_array().unwrap().clone()
}

fn find<'a>(fs: &'a [Value], kind: &str, pid: u32) -> Option<&'a Value> {
    fs.iter()
        .find(|f| f["kind"] == kind && f["process"]["pid"].as_u64() == Some(pid as u64))
}

fn sysctl(name: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/sys/{name}"))
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// The value of the first `name="…"` attribute in `html`, parsed.
fn attr<T: std::str::FromStr>(html: &str, name: &str) -> Option<T> {
    html.split(&format!("{name}=\""))
        .nth(1)
        .and_then(|s| s.split('"').next())
        .and_then(|n| n.parse().ok())
}

/// Temp dir removed on drop.
struct TempDir(PathBuf);
impl TempDir {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("bufscope-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }
    fn path(&self, f: &str) -> PathBuf {
        self.0.join(f)
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn findings_match_the_kernel_and_explain_prints_them() {
    let e = Exporter::start(&[]);
    // 1. UDP receiver with a tiny buffer, flooded.
    let r = Workload::start(&["udp-recv", "--rcvbuf", "4096"]);
    let inode: u64 = r.get("inodes").parse().unwrap();
    assert!(Workload::start(&["udp-flood", "--port", r.get("ports"), "--count", "4000"]).wait());
    // 2. A clamped request.
    let rmem_max = sysctl("net/core/rmem_max");
    let req = (rmem_max as i64 * 2).to_string();
    let c = setsockopt("udp", "SO_RCVBUF", &req);
    // 3. TCP clients locked before connect, and a control.
    let l = Workload::start(&["tcp-listen"]);
    let locked = Workload::start(&[
        "tcp-connect",
        "--port",
        l.get("port"),
        "--rcvbuf",
        "65536",
        "--count",
        "2",
    ]);
    let control = Workload::start(&["tcp-connect", "--port", l.get("port")]);

    let fs = eventually(Duration::from_secs(10), "the findings", || {
        let fs = findings(&e);
        (find(&fs, "udp_rcvbuf_drops", r.pid()).is_some()
            && find(&fs, "rcvbuf_clamped", c.pid()).is_some()
            && find(&fs, "tcp_wscale_shrunk", locked.pid()).is_some())
        .then_some(fs)
    });

    // UDP drops: totals, the effective buffer and rmem_max are the kernel's.
    let f = find(&fs, "udp_rcvbuf_drops", r.pid()).unwrap();
    let kernel_drops = proc_udp_drops(r.pid(), inode).unwrap() as f64;
    assert_eq!(f["evidence"]["drops_total"], kernel_drops);
    assert_eq!(
        f["evidence"]["rcvbuf_bytes"],
        ss_udp_rcvbuf(inode).unwrap() as f64,
        "ss rb"
    );
    assert_eq!(f["evidence"]["rmem_max_bytes"], rmem_max);
    assert_eq!(f["socket"]["inode"], inode);
    assert!(f["fix"].as_str().unwrap().contains("SO_RCVBUFFORCE"));

    // Clamp: requested value and the kernel's readback.
    let f = find(&fs, "rcvbuf_clamped", c.pid()).unwrap();
    assert_eq!(
        f["evidence"]["requested_bytes"],
        req.parse::<f64>().unwrap()
    );
    assert_eq!(
        f["evidence"]["effective_bytes"],
        c.get("rcvbuf").parse::<f64>().unwrap()
    );
    assert!(
        f["fix"]
            .as_str()
            .unwrap()
            .contains(&format!("net.core.rmem_max={req}"))
    );

    // Window scale: actual = ss's rcv scale of those connections, expected = the control's.
    let ss = ss_tcp();
    let lports: Vec<u16> = locked
        .get("lports")
        .split(',')
        .map(|p| p.parse().unwrap())
        .collect();
    let actual = ss
        .iter()
        .find(|s| lports.contains(&s.local_port))
        .unwrap()
        .rcv_wscale;
    let cport: u16 = control.get("lports").parse().unwrap();
    let expected = ss
        .iter()
        .find(|s| s.local_port == cport)
        .unwrap()
        .rcv_wscale;
    let f = find(&fs, "tcp_wscale_shrunk", locked.pid()).unwrap();
    assert_eq!(f["severity"], "critical");
    assert_eq!(f["evidence"]["wscale"], actual as f64);
    assert_eq!(f["evidence"]["wscale_expected"], expected as f64);
    assert_eq!(f["evidence"]["connections_shrunk"], 2.0);
    assert!(
        find(&fs, "tcp_wscale_shrunk", control.pid()).is_none(),
        "control is fine"
    );

    // The same findings as gauges, per program (no pid label): at least the receiver's socket.
    let m = e.scrape();
    let rp = r.pid().to_string();
    assert!(
        m.find("bufscope_finding", &[])
            .all(|s| !s.labels.contains_key("pid")),
        "bufscope_finding is per program"
    );
    assert!(
        m.sum(
            "bufscope_finding",
            &[("kind", "udp_rcvbuf_drops"), ("severity", "critical")]
        ) >= 1.0
    );

    // bufscope explain, filtered by pid.
    let out = run_ok(Command::new(bufscope_bin()).args([
        "explain",
        "--url",
        &format!("http://{}", e.addr),
        "--pid",
        &rp,
    ]));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("udp_rcvbuf_drops") && text.contains(&format!("(pid {rp})")),
        "{text}"
    );
    assert!(
        !text.contains("tcp_wscale_shrunk"),
        "filtered to one pid:\n{text}"
    );

    // The daemon's own selection: one process's findings of one kind, the costliest first.
    let lp = locked.pid().to_string();
    let (status, body) = e.get(&format!(
        "/api/v1/findings?pid={lp}&kind=tcp_wscale_shrunk&limit=1"
    ));
    assert_eq!(status, 200, "{body}");
    let doc: Value = serde_json::from_str(&body).unwrap();
    let sel = doc["findings"].as_array().unwrap();
    assert_eq!(sel.len(), 1, "{body}");
    assert_eq!(
        sel[0]["process"]["pid"].as_u64(),
        Some(u64::from(locked.pid()))
    );
    assert_eq!(sel[0]["kind"], "tcp_wscale_shrunk");
    let (status, body) = e.get("/api/v1/findings?severity=loud");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("use critical, warning or info"), "{body}");
}

/// Runs `cmd` to completion; panics with its output unless it succeeded.
fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn openssl(dir: &Path, args: &[&str]) {
    run_ok(Command::new("openssl").current_dir(dir).args(args));
}

fn curl(args: &[&str]) -> (i32, String) {
    let out = Command::new("curl")
        .args(["-s", "-o", "-", "-w", "\n%{http_code}", "--max-time", "10"])
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// A CA (`ca.crt`) and a certificate for localhost and 127.0.0.1 it signed (`server.crt`,
/// `server.key`) in `dir`.
fn make_certs(dir: &Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=bufscope-test-ca",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ],
    );
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
            "-out",
            "server.crt",
        ],
    );
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn tls_handshakes_count_against_the_connection_cap() {
    let d = TempDir::new("tls-cap");
    make_certs(&d.0);
    std::fs::write(
        d.path("web.yml"),
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n",
    )
    .unwrap();
    let web = d.path("web.yml");
    let e = Exporter::start(&["--web.config.file", web.to_str().unwrap()]);
    let ca = d.path("ca.crt");
    let ca = ca.to_str().unwrap();
    let url = format!("https://{}/healthz", e.addr);
    assert_eq!(curl(&["--cacert", ca, &url]).0, 200);
    // 2048 (the cap) clients that connect and never start their handshake.
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl);
        rl.rlim_cur = rl.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &rl);
    }
    // Paced, so that the kernel's accept queue (1024) never overflows: each one is accepted.
    let mut silent = Vec::new();
    for _ in 0..32 {
        for _ in 0..64 {
            silent.push(std::net::TcpStream::connect(&e.addr).unwrap());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // (Time for the listener to accept them; their handshakes time out after 10 s.)
    std::thread::sleep(Duration::from_secs(1));
    let (code, _) = curl(&["--cacert", ca, &url]);
    assert_eq!(
        code, 0,
        "with its share of handshakes pending (512 and 4 health-only places of the 2048) the \
         client's next connection is closed at once"
    );
    // Another client's is not: the pending handshakes count against their own client.
    let (code, _) = curl(&["--cacert", ca, "--interface", "127.0.0.3", &url]);
    assert_eq!(code, 200, "another address is served");
    drop(silent);
    eventually(Duration::from_secs(10), "served again", || {
        (curl(&["--cacert", ca, &url]).0 == 200).then_some(())
    });
    assert!(e.log().contains("connection caps reached"), "{}", e.log());
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn tls_and_basic_auth_with_a_real_client() {
    let d = TempDir::new("tls");
    make_certs(&d.0);
    let hash = bcrypt::hash("s3cret", 6).unwrap();
    std::fs::write(
        d.path("web.yml"),
        format!(
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  min_version: TLS12\n\
             http_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\n\
             basic_auth_users:\n  prom: {hash}\n"
        ),
    )
    .unwrap();
    let web = d.path("web.yml");
    let e = Exporter::start(&["--web.config.file", web.to_str().unwrap()]);
    assert!(e.log().contains("https://"), "{}", e.log());
    let url = format!("https://{}/metrics", e.addr);
    let ca = d.path("ca.crt");
    let ca = ca.to_str().unwrap();

    let (code, body) = curl(&["--cacert", ca, "-u", "prom:s3cret", &url]);
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("bufscope_build_info"));
    let (code, _) = curl(&["--cacert", ca, "-u", "prom:wrong", &url]);
    assert_eq!(code, 401, "wrong password");
    let (code, _) = curl(&["--cacert", ca, "-u", "nobody:s3cret", &url]);
    assert_eq!(code, 401, "unknown user");
    let (code, _) = curl(&["--cacert", ca, &url]);
    assert_eq!(code, 401, "no credentials");
    let hdrs = Command::new("curl")
        .args([
            "-s",
            "-D",
            "-",
            "-o",
            "/dev/null",
            "--cacert",
            ca,
            "-u",
            "prom:wrong",
            &url,
        ])
        .output()
        .unwrap();
    let hdrs = String::from_utf8_lossy(&hdrs.stdout).to_ascii_lowercase();
    assert!(hdrs.contains("www-authenticate: basic"), "{hdrs}");
    assert!(
        hdrs.contains("x-content-type-options: nosniff"),
        "configured header: {hdrs}"
    );
    let (code, _) = curl(&[&format!("http://{}/metrics", e.addr)]);
    assert_ne!(code, 200, "plain HTTP must not be served on the TLS port");
    // An untrusted CA is refused by the client (the certificate really is checked).
    let (code, _) = curl(&["-u", "prom:s3cret", &url]);
    assert_eq!(code, 0, "curl without --cacert must fail verification");

    // bufscope explain over TLS with basic auth.
    let out = run_ok(
        Command::new(bufscope_bin())
            .env("BUFSCOPE_PASSWORD", "s3cret")
            .args([
                "explain",
                "--url",
                &format!("https://localhost:{}", e.addr.rsplit(':').next().unwrap()),
            ])
            .args(["--tls.ca-file", ca, "--web.user", "prom", "--json"]),
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v.is_array());
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn config_file_sets_probes_and_flags_override_it() {
    let d = TempDir::new("cfg");
    let cfg = d.path("bufscope.yaml");
    std::fs::write(
        &cfg,
        "probes:\n  disable: [autotune, owners]\ncardinality:\n  max_processes: 50\n",
    )
    .unwrap();
    let e = Exporter::start(&[
        "--config.file",
        cfg.to_str().unwrap(),
        "--probe.disable",
        "owners",
    ]);
    let m = e.scrape();
    assert_eq!(
        m.sum("bufscope_probe_attached", &[("probe", "owners")]),
        0.0,
        "flag"
    );
    assert_eq!(
        m.sum("bufscope_probe_attached", &[("probe", "autotune")]),
        1.0,
        "the flag overrides the file's list"
    );
    drop(e);
    let e = Exporter::start(&["--config.file", cfg.to_str().unwrap()]);
    assert_eq!(
        e.scrape()
            .sum("bufscope_probe_attached", &[("probe", "autotune")]),
        0.0,
        "from the file"
    );
    drop(e);
    std::fs::write(&cfg, "cardinality:\n  max_procs: 50\n").unwrap();
    let out = Command::new(bufscope_bin())
        .args([
            "run",
            "--config.file",
            cfg.to_str().unwrap(),
            "--web.listen-address",
            "127.0.0.1:0",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("max_procs") && err.contains("--config.file"),
        "{err}"
    );
    assert!(!err.contains("panicked"));
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn status_page_renders_and_updates_in_headless_chromium() {
    let chromium = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("Debian chromium (cargo xtask setup installs it)");
    let e = Exporter::start(&[]);
    let r = Workload::start(&["udp-recv", "--rcvbuf", "4096"]);
    let port = r.get("ports").to_string();
    // Keep dropping while the page runs so the live chart has something to draw.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flooder = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = Workload::start(&["udp-flood", "--port", &port, "--count", "20000"]).wait();
            }
        })
    };
    let d = TempDir::new("chromium");
    let shot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("status-page.png");
    let url = format!("http://{}/", e.addr);
    let common = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1400,1000",
        "--virtual-time-budget=9000",
    ];
    let profile = format!("--user-data-dir={}", d.path("profile").display());
    let dom = Command::new(chromium)
        .args(common)
        .arg(&profile)
        .args(["--dump-dom", &url])
        .output()
        .unwrap();
    let html = String::from_utf8_lossy(&dom.stdout);
    assert!(
        dom.status.success() && html.contains("<table"),
        "chromium --dump-dom: {}",
        String::from_utf8_lossy(&dom.stderr)
    );
    // DOM assertions: the live table has the receiver, the finding is shown with its fix, the
    // probes are listed as attached, and the page refreshed itself several times.
    let rp = r.pid();
    assert!(
        html.contains(&format!("data-pid=\"{rp}\"")),
        "receiver row missing:\n{html}"
    );
    assert!(
        html.contains("data-kind=\"udp_rcvbuf_drops\""),
        "finding missing"
    );
    for p in bufscope_integration::default_probes() {
        assert!(
            html.contains(&format!("data-probe=\"{p}\" data-attached=\"1\"")),
            "probe {p}"
        );
    }
    let updates: u32 = attr(&html, "data-updates").unwrap_or(0);
    assert!(
        updates >= 3,
        "the page must keep updating (updates={updates})"
    );
    assert!(html.contains("● live"), "page reports itself live");
    assert!(html.contains("<polyline"), "the drop-rate chart was drawn");
    let peak: f64 = attr(&html, "data-peak").unwrap_or(0.0);
    assert!(
        peak > 0.0,
        "the chart shows the live drop rate (peak {peak}/s)"
    );
    // A chart a person can read: a y axis in drops/s with numbered gridlines, an x axis of
    // clock times, and a line of its own for the flooded receiver (one of the top five).
    let axis = |name: &str| {
        let start = html
            .find(&format!("<g data-axis=\"{name}\">"))
            .unwrap_or_else(|| panic!("no {name} axis:\n{html}"));
        let end = html[start..].find("</g>").unwrap() + start;
        html[start..end].to_string()
    };
    let labels = |g: &str| -> Vec<String> {
        g.split("<text")
            .skip(1)
            .filter_map(|t| Some(t.split_once('>')?.1.split_once("</text>")?.0.to_string()))
            .collect()
    };
    let y = labels(&axis("y"));
    assert!(y.iter().any(|l| l == "drops/s"), "y axis unit: {y:?}");
    assert!(
        y.iter().any(|l| l == "0") && y.len() >= 5,
        "y axis ticks: {y:?}"
    );
    let x = labels(&axis("x"));
    let clock = |l: &String| {
        let b = l.as_bytes();
        l.len() == 8
            && b[2] == b':'
            && b[5] == b':'
            && l.replace(':', "").bytes().all(|c| c.is_ascii_digit())
    };
    assert!(
        x.iter().filter(|l| clock(l)).count() >= 3,
        "time labels: {x:?}"
    );
    assert!(
        x.iter().any(|l| l.starts_with("time (local)")),
        "x axis title: {x:?}"
    );
    assert!(
        html.contains(&format!("data-series=\"process\" data-pid=\"{rp}\"")),
        "a line for the receiver"
    );
    assert!(html.contains("data-series=\"total\""), "the total line");
    // Screenshot while drops still happen (kept in target/tmp for humans; its size proves it
    // rendered).
    run_ok(
        Command::new(chromium)
            .args(common)
            .arg(&profile)
            .arg(format!("--screenshot={}", shot.display()))
            .arg(&url),
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = flooder.join();
    let png = std::fs::read(&shot).unwrap();
    assert_eq!(&png[1..4], b"PNG");
    assert!(
        png.len() > 20_000,
        "screenshot too small to show the page ({} bytes)",
        png.len()
    );
    eprintln!("status page screenshot: {}", shot.display());
}

/// Standard base64 (for a Basic `Authorization` header).
fn base64(bytes: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The status of `GET path` with basic-auth `user:pass` (0 when no answer within 10 s).
fn get_as(addr: &str, path: &str, user: &str, pass: &str) -> u16 {
    use std::io::{Read as _, Write as _};
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return 0;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let auth = base64(format!("{user}:{pass}").as_bytes());
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nAuthorization: Basic {auth}\r\n\r\n"
    );
    if s.write_all(req.as_bytes()).is_err() {
        return 0;
    }
    let mut head = [0u8; 12];
    if s.read_exact(&mut head).is_err() {
        return 0;
    }
    std::str::from_utf8(&head[9..12])
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// utime + stime of `pid` in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = stat.rsplit_once(')').unwrap().1;
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 of stat: the 12th and 13th after the comm.
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn wrong_passwords_cannot_starve_the_daemon() {
    let d = TempDir::new("bcrypt");
    let hash = bcrypt::hash("s3cret", 8).unwrap();
    std::fs::write(
        d.path("web.yml"),
        format!("basic_auth_users:\n  prom: {hash}\n"),
    )
    .unwrap();
    let web = d.path("web.yml");
    let e = Exporter::start(&["--web.config.file", web.to_str().unwrap()]);
    // The scraper authenticates once before the flood.
    assert_eq!(get_as(&e.addr, "/metrics", "prom", "s3cret"), 200);
    let cpu0 = cpu_seconds(e.pid());
    let t0 = std::time::Instant::now();
    let flood = Duration::from_secs(6);
    let attackers: Vec<_> = (0..16)
        .map(|t| {
            let addr = e.addr.clone();
            std::thread::spawn(move || {
                let mut codes = std::collections::BTreeMap::<u16, u32>::new();
                let start = std::time::Instant::now();
                let mut i = 0u32;
                while start.elapsed() < flood {
                    i += 1;
                    let pass = format!("wrong-{t}-{i}");
                    *codes
                        .entry(get_as(&addr, "/metrics", "prom", &pass))
                        .or_default() += 1;
                }
                codes
            })
        })
        .collect();
    // Meanwhile: kubelet's probe and the scraper that authenticated.
    let mut healthz = Vec::new();
    let mut scrapes = Vec::new();
    while t0.elapsed() < flood {
        healthz.push(e.get("/healthz").0);
        scrapes.push(get_as(&e.addr, "/metrics", "prom", "s3cret"));
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut codes = std::collections::BTreeMap::<u16, u32>::new();
    for a in attackers {
        for (c, n) in a.join().unwrap() {
            *codes.entry(c).or_default() += n;
        }
    }
    let wall = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds(e.pid()) - cpu0;
    eprintln!(
        "16 clients with wrong passwords for {wall:.1} s: answers {codes:?} (401: checked, 429: \
         over the bcrypt budget); bufscope used {cpu:.2} s of CPU ({:.0}% of a core); /healthz \
         {} of {} answered 200; the authenticated scraper {} of {}",
        100.0 * cpu / wall,
        healthz.iter().filter(|c| **c == 200).count(),
        healthz.len(),
        scrapes.iter().filter(|c| **c == 200).count(),
        scrapes.len()
    );
    assert!(
        codes.get(&401).is_some_and(|n| *n > 0),
        "wrong passwords are checked: {codes:?}"
    );
    assert!(
        codes.get(&429).is_some_and(|n| *n > 0),
        "checks beyond the budget are refused: {codes:?}"
    );
    assert!(
        codes.keys().all(|c| *c == 401 || *c == 429),
        "only 401 and 429: {codes:?}"
    );
    assert!(healthz.iter().all(|c| *c == 200), "/healthz: {healthz:?}");
    assert!(
        scrapes.iter().all(|c| *c == 200),
        "the authenticated scraper: {scrapes:?}"
    );
}
