//! The `bufscope` binary.

use clap::Parser as _;

use bufscope::cli::{Cli, Command, KernelArgs, LogFormat};

fn init_logging(k: &KernelArgs) {
    let filter = tracing_subscriber::EnvFilter::builder()
        .with_default_directive(k.log_level.into())
        .from_env_lossy();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let result = match k.log_format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Logfmt => builder.try_init(),
    };
    if let Err(e) = result {
        eprintln!("bufscope: logging setup failed: {e}");
    }
}

fn main() {
    let cli = Cli::parse();
    let code = match cli.cmd {
        Command::Run(args) => {
            init_logging(&args.kernel);
            let rt = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("bufscope: error: cannot start the runtime: {e}");
                    std::process::exit(1);
                }
            };
            match rt.block_on(bufscope::server::run(args)) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("bufscope: error: {e:#}");
                    1
                }
            }
        }
        Command::Check(args) => {
            init_logging(&args.kernel);
            bufscope::check::run(&args)
        }
    };
    std::process::exit(code);
}
