//! Rebuild the BPF object whenever `bpf-linker` changes (it is an undeclared build tool).
use which::which;

fn main() {
    match which("bpf-linker") {
        Ok(path) => println!("cargo:rerun-if-changed={}", path.display()),
        Err(_) => println!(
            "cargo:warning=bpf-linker not found in PATH: run `cargo xtask setup` (see README)"
        ),
    }
}
