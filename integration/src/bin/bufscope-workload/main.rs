//! Workloads for bufscope's integration tests and benchmarks, each in its own process so that
//! attribution is tested across process boundaries (the receiver, the flooder and bufscope are
//! three different pids).
//!
//! Every command prints one `READY key=value …` line on stdout when its sockets are set up,
//! then does its work; long-lived ones wait until stdin closes (the test drops the child).

mod args;
mod bench;
mod netlink;
mod process;
mod sys;
mod tcp;
mod udp;

use args::Args;

const USAGE: &str = "usage: bufscope-workload <command> [--key value …]
  udp-recv   [--v6] [--rcvbuf N] [--new-netns] [--comm NAME] [--count N]   (stdin: close | exit)
             N receiving sockets (never read) on loopback
  udp-flood  --port P [--port P …] [--v6] [--count N] [--size B] [--netns-of PID]
             send N datagrams to each port, then exit
  tcp-listen [--rcvbuf N]     listener (SO_RCVBUF before listen() when given); accepts and holds
  tcp-connect --port P [--rcvbuf N] [--count K]   K clients (SO_RCVBUF before connect() when given)
  tcp-bulk-recv [--rcvbuf-after N] [--bytes B]   accept one connection and read B bytes
  tcp-bulk-send --port P [--bytes B]
  setsockopt --proto udp|tcp --opt NAME --value V   one call; prints ret/errno and readbacks
  hold-comm  --comm BYTES     set comm (\\xNN escapes allowed), open a UDP socket with SO_RCVBUF, hold
  netlink-listen [--protocol P] [--groups G] [--rcvbuf N] [--read]   a netlink socket bound to
             multicast groups G (hex with 0x) with SO_RCVBUF N; never reads unless --read

Benchmark and reliability workloads:
  udp-sink   [--bind IP] [--rcvbuf N | --rcvbuf-force N] [--no-read]   one UDP socket read with
             recvmmsg (unless --no-read); stdin \"count\" prints COUNT <datagrams>
  udp-blast  --dest IP:PORT --seconds S [--size B] [--mmsg N] [--bind-any]   sendto() (or sendmmsg() of N
             addressed datagrams) as fast as possible for S seconds on one unconnected socket;
             prints SENT <datagrams> <errors> <secs>
  udp-fresh  --dest IP:PORT [--count N] [--bind-any]   N times: a new UDP socket sends one datagram, closes;
             prints DONE <n> <secs>
  udp-spray  --ports-file F --pps R --seconds S [--size B]   round-robin over every port in F
             (loopback) at about R datagrams/s; prints SENT <n>
  tcp-sink   [--bind IP]   accepts connections one after the other and reads each to EOF;
             prints RECEIVED <bytes> <secs> per connection
  tcp-blast  --dest IP:PORT --seconds S   one connection, writes for S seconds; prints SENT <bytes>
  setsockopt-loop --count N   N buffer setsockopt calls (SO_RCVBUF/SO_SNDBUF alternating) on a
             UDP socket; prints DONE
  tcp-connect-loop --count N   N loopback connections (connect, accept, close); prints DONE
  tcp-bulk-loop --conns N [--bytes B] [--lock-every K]   N loopback bulk transfers of B bytes, every
             K-th receiver locked with SO_RCVBUF=64K after accept; prints DONE
  many-procs --procs N --socks K --ports-file F [--rcvbuf R] [--activity-file A] [--every-ms M]
             N child processes holding K UDP sockets each (ports written to F); while A exists,
             each child makes one SO_RCVBUF call every M ms
  churn      --procs N [--parallel P] [--sends K] [--rcvbuf R] [--comm NAME] [--new-netns]   N short-lived
             children, each: UDP socket, SO_RCVBUF, K datagrams to itself (drops), read its own
             drops column, close, exit; prints DONE procs=N drops=<sum of the drops columns>
  socket-churn [--proto tcp|udp]   socket() + close() as fast as possible until stdin closes;
             stdin \"count\" prints COUNT <sockets> <secs>; prints DONE <sockets> <secs> at the end
  tcp-accept-hold --bind IP [--port P]   accepts every connection (backlog 4096) and holds it
  tcp-open   --dest IP:PORT --count N [--rate R]   N non-blocking connects started at R/s, all in
             flight at once; prints OPENED ok=<n> failed=<n> secs=<s> p50_ms=<ms> p99_ms=<ms>, holds
  in-cgroup  --root DIR --chain A/B/… -- COMMAND ARGS…   join the cgroup DIR/A/B/… (walked one
             level at a time: the path may exceed PATH_MAX), then exec COMMAND";

fn main() {
    let mut argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.is_empty() {
        eprintln!("{USAGE}");
        std::process::exit(2);
    }
    let cmd = argv.remove(0);
    // bufscope's series are keyed by program and place: a name of its own per test child
    // (`wl<pid>`) keeps each one's series apart (children it forks share it). Commands
    // that name themselves later override it.
    if std::env::var_os("BUFSCOPE_WORKLOAD_KEEP_COMM").is_none()
        && let Err(e) = sys::set_comm(format!("wl{}", std::process::id()).as_bytes())
    {
        eprintln!("bufscope-workload: {e:#}");
    }
    let a = Args(argv);
    let r = match cmd.as_str() {
        "udp-recv" => udp::udp_recv(&a),
        "udp-flood" => udp::udp_flood(&a),
        "tcp-listen" => tcp::tcp_listen(&a),
        "tcp-connect" => tcp::tcp_connect(&a),
        "tcp-bulk-recv" => tcp::tcp_bulk_recv(&a),
        "tcp-bulk-send" => tcp::tcp_bulk_send(&a),
        "setsockopt" => process::one_setsockopt(&a),
        "hold-comm" => process::hold_comm(&a),
        "netlink-listen" => netlink::netlink_listen(&a),
        "udp-sink" => bench::udp_sink(&a),
        "udp-blast" => bench::udp_blast(&a),
        "udp-fresh" => bench::udp_fresh(&a),
        "udp-spray" => bench::udp_spray(&a),
        "tcp-sink" => bench::tcp_sink(&a),
        "tcp-blast" => bench::tcp_blast(&a),
        "setsockopt-loop" => bench::setsockopt_loop(&a),
        "tcp-connect-loop" => bench::tcp_connect_loop(&a),
        "tcp-bulk-loop" => bench::tcp_bulk_loop(&a),
        "many-procs" => bench::many_procs(&a),
        "churn" => bench::churn(&a),
        "in-cgroup" => bench::in_cgroup(&a),
        "socket-churn" => bench::socket_churn(&a),
        "tcp-accept-hold" => bench::tcp_accept_hold(&a),
        "tcp-open" => bench::tcp_open(&a),
        _ => {
            eprintln!("unknown command {cmd}\n{USAGE}");
            std::process::exit(2);
        }
    };
    if let Err(e) = r {
        eprintln!("bufscope-workload {cmd}: {e:#}");
        std::process::exit(1);
    }
}
