//! The `bufscope` binary.

use clap::{CommandFactory as _, FromArgMatches as _};

use bufscope::cli::{Cli, Command, ExplainArgs, KernelArgs, LogFormat, RunArgs};

/// Whether log lines get ANSI colours: only when they go to a terminal, and never when
/// `NO_COLOR` is set to anything but the empty string (<https://no-color.org>). A file or a
/// pipe (`bufscope run > log`, journald, kubectl logs) gets plain text.
fn log_colour(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

fn init_logging(k: &KernelArgs) {
    use std::io::IsTerminal as _;
    let filter = tracing_subscriber::EnvFilter::builder()
        .with_default_directive(k.log_level.into())
        .from_env_lossy();
    let colour = log_colour(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    let result = match k.log_format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Logfmt => builder.try_init(),
    };
    if let Err(e) = result {
        eprintln!("bufscope: logging setup failed: {e}");
    }
}

/// Prints `bufscope: error: {msg}` and exits 1.
fn fail(msg: &str) -> ! {
    eprintln!("bufscope: error: {msg}");
    std::process::exit(1)
}

/// Restores the default SIGPIPE action (Rust ignores it): a one-shot command whose output is
/// piped into a reader that quits early (`bufscope check | head`) then ends quietly like any
/// other tool, instead of panicking on the failed write. Never for `run`, whose sockets must
/// not kill it.
fn default_sigpipe() {
    // SAFETY: signal(2) with a valid signal number and SIG_DFL; no handler is involved.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// In the daemon a panic on any thread ends the process (after the usual message): a thread
/// that died holding the collector's lock would leave a daemon that answers 500 forever and
/// looks healthy, while a dead one is restarted by its supervisor (kubelet, systemd). Pinned
/// probes keep counting meanwhile; unpinned ones detach with the process.
fn die_on_panic() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        eprintln!("bufscope: error: the daemon hit a bug (the panic above) and exits");
        std::process::abort();
    }));
}

/// `bufscope run`: every check before anything is loaded, bound or logged, then the daemon.
/// glibc's malloc raises its mmap threshold each time a large block is freed (up to 32 MiB),
/// after which the findings' per-evaluation tables and vectors (MiBs at 10,000 sockets) come
/// from the heap, which it does not give back: the daemon's RSS stayed at its high-water mark.
/// A fixed threshold keeps blocks of 256 KiB and more in their own mappings, returned on free.
/// And the findings are evaluated on whichever blocking-pool thread is free, each of which
/// got an arena of its own (up to 8 per core), each keeping what it once held: two arenas.
/// At 10,000 dropping sockets (`cargo xtask bench overhead --sections exporter`, with the
/// history's findings boxed): RSS at the end 194 -> 168 MiB, peak 317 -> 213 MiB (355 and
/// 357 before either). (musl's allocator maps large blocks itself and has no arenas.)
fn return_large_blocks_to_the_kernel() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; called before any other thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 * 1024);
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

fn run(args: RunArgs, origins: &bufscope::config::Origins) -> i32 {
    let addrs = match args.validate() {
        Ok(a) => a,
        Err(e) => fail(&origins.explain(&e)),
    };
    return_large_blocks_to_the_kernel();
    init_logging(&args.kernel);
    origins.warn_deprecated();
    die_on_panic();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => fail(&format!("cannot start the runtime: {e}")),
    };
    report(rt.block_on(bufscope::run::run(args, addrs)))
}

/// `bufscope explain`: the findings of a running bufscope.
fn explain(a: ExplainArgs) -> i32 {
    let selection = bufscope_client::explain::Selection {
        pid: a.pid,
        comm: a.comm,
        since: a.since.map(|d| d.as_secs()),
    };
    report(
        bufscope_client::Client::from_args(&a.connect)
            .and_then(|c| bufscope_client::explain::run(&c, &selection, a.json)),
    )
}

/// Exit code 0, or 1 after printing the error.
fn report(done: anyhow::Result<()>) -> i32 {
    match done {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("bufscope: error: {e:#}");
            1
        }
    }
}

fn main() {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let cmd = Cli::command();
    // Usage errors (unknown flag, malformed value) exit 2 with clap's message.
    let matches = cmd.clone().get_matches_from(&argv);
    let (matches, origins) = match bufscope::config::apply(&cmd, &argv, matches) {
        Ok(m) => m,
        Err(e) => fail(&format!("{e:#}")),
    };
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    let code = match cli.cmd {
        Command::Run(args) => run(*args, &origins),
        Command::Check(mut args) => {
            default_sigpipe();
            if args.kernel.log_level == tracing::Level::INFO {
                // The table is the output; only warnings belong next to it.
                args.kernel.log_level = tracing::Level::WARN;
            }
            init_logging(&args.kernel);
            origins.warn_deprecated();
            bufscope::check::run(&args)
        }
        Command::Cleanup(args) => {
            default_sigpipe();
            bufscope::cleanup::run(&args)
        }
        Command::Explain(a) => {
            default_sigpipe();
            explain(a)
        }
        Command::Top(a) => report(bufscope_client::top::run(
            &a.connect.url,
            a.connect.ca_file.as_deref(),
            a.connect.user.as_deref(),
            a.interval,
        )),
    };
    std::process::exit(code);
}

#[cfg(test)]
mod tests {
    use super::log_colour;
    use std::ffi::OsStr;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(log_colour(true, None));
        assert!(
            log_colour(true, Some(OsStr::new(""))),
            "empty NO_COLOR is unset"
        );
        assert!(!log_colour(true, Some(OsStr::new("1"))));
        assert!(!log_colour(false, None), "a file or a pipe");
        assert!(!log_colour(false, Some(OsStr::new("1"))));
    }
}
