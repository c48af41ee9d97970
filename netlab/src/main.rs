//! `netlab`: open a shell-ready WAN lab, list or clean up leftovers of killed runs.

use anyhow::Context as _;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "netlab",
    about = "Two network namespaces joined by an emulated WAN link (no netem needed)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Build a lab, print how to enter each side, wait for Ctrl-C, tear it down.
    Up(bufscope_netlab::cli::UpArgs),
    /// Delete namespaces, links and wireguard-go sockets left behind by killed runs.
    Cleanup {
        /// Name prefix to look for.
        #[arg(long, default_value = bufscope_netlab::PREFIX)]
        prefix: String,
        /// Also remove what belongs to runs that are still alive.
        #[arg(long)]
        all: bool,
    },
    /// List namespaces with the prefix, leftovers and in-use ones.
    List {
        /// Name prefix to look for.
        #[arg(long, default_value = bufscope_netlab::PREFIX)]
        prefix: String,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Up(a) => bufscope_netlab::cli::up(&a).context("netlab up"),
        Cmd::Cleanup { prefix, all } => {
            let r = bufscope_netlab::cleanup(&prefix, all).context("netlab cleanup")?;
            for ns in &r.namespaces {
                println!("deleted netns {ns}");
            }
            for l in &r.links {
                println!("deleted link {l}");
            }
            for s in &r.sockets {
                println!("removed /run/wireguard/{s}");
            }
            for ns in &r.in_use {
                println!("kept netns {ns} (its run is still alive; --all removes it)");
            }
            if r.namespaces.is_empty() && r.links.is_empty() && r.sockets.is_empty() {
                println!("nothing to clean up");
            }
            Ok(())
        }
        Cmd::List { prefix } => {
            let (dead, live) = bufscope_netlab::leftovers(&prefix).context("netlab list")?;
            for ns in live {
                println!("{ns}\tin use");
            }
            for ns in dead {
                println!("{ns}\tleftover");
            }
            Ok(())
        }
    }
}
