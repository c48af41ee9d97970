//! The `bufscope` binary.

use clap::{CommandFactory as _, FromArgMatches as _};

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
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    let code = match cli.cmd {
        Command::Run(mut args) => {
            if let Some(path) = args.config_file.clone() {
                let applied = bufscope::config::load(&path).and_then(|file| {
                    let sub = matches
                        .subcommand_matches("run")
                        .ok_or_else(|| anyhow::anyhow!("internal: no run matches"))?;
                    bufscope::config::apply(file, &mut args, sub)
                });
                if let Err(e) = applied {
                    eprintln!("bufscope: error: {e:#}");
                    std::process::exit(1);
                }
            }
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
            match rt.block_on(bufscope::run::run(*args)) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("bufscope: error: {e:#}");
                    1
                }
            }
        }
        Command::Check(mut args) => {
            if args.kernel.log_level == tracing::Level::INFO {
                // The table is the output; only warnings belong next to it.
                args.kernel.log_level = tracing::Level::WARN;
            }
            init_logging(&args.kernel);
            bufscope::check::run(&args)
        }
        Command::Explain(args) => match bufscope::explain::run(&args) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("bufscope: error: {e:#}");
                1
            }
        },
    };
    std::process::exit(code);
}
