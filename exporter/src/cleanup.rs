//! `bufscope cleanup --bpf.pin-path DIR`: detaches and removes what `bufscope run
//! --bpf.pin-path DIR` pinned (links first: a link whose pin was its last reference detaches;
//! then the maps, META and the directory).

use crate::bpf::pins::dir;
use crate::cli::CleanupArgs;

/// Runs the command; returns the exit code.
pub fn run(args: &CleanupArgs) -> i32 {
    match dir::cleanup(&args.pin_path, args.force) {
        Ok(r) if r.links == 0 && r.maps == 0 => {
            println!("nothing pinned in {}", args.pin_path.display());
            0
        }
        Ok(r) => {
            println!(
                "removed {} links (detached) and {} maps from {}",
                r.links,
                r.maps,
                args.pin_path.display()
            );
            0
        }
        Err(e) => {
            eprintln!("bufscope: error: {e:#}");
            1
        }
    }
}
