//! The configuration globals userspace patches before load (in `.rodata`, so the verifier
//! treats every field as a constant and prunes the branches this kernel does not take), and
//! the macros that read them.
//!
//! Struct offsets are not compiled in: userspace resolves them from the running kernel's BTF.

use bufscope_common::{CompatConfig, Config};

/// Kernel layout + behaviour, patched by userspace before load (see [`Config`]).
#[unsafe(no_mangle)]
pub(crate) static CONFIG: Config = Config::zeroed();

/// Offsets and reason numbers only the older kernels' programs need (`drops::compat`,
/// `autotune::compat`), patched by userspace before load.
#[unsafe(no_mangle)]
pub(crate) static COMPAT: CompatConfig = CompatConfig::zeroed();

/// Reads one `CONFIG` field without letting the compiler fold it to the compiled-in zero.
macro_rules! cfg {
    ($($f:tt)+) => {
        unsafe { core::ptr::read_volatile(&raw const $crate::config::CONFIG.$($f)+) }
    };
}

/// Reads one `COMPAT` field (as [`cfg!`]).
macro_rules! compat {
    ($f:ident) => {
        unsafe { core::ptr::read_volatile(&raw const $crate::config::COMPAT.$f) }
    };
}
