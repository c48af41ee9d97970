//! Renamed flags: a flag's clap aliases are its old names (bufscope declares aliases only for
//! renamed flags); they keep working, on the command line and as config keys, and each use is
//! reported once as deprecated.

use std::ffi::OsString;

use clap::Command;

/// A deprecated name that was used: a flag's or a key's old name, and the new one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Deprecated {
    /// `--old.name` on the command line, or `old.key` in the file.
    pub old: String,
    /// What replaces it.
    pub new: String,
}

impl std::fmt::Display for Deprecated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} is deprecated and will be removed: use {} (same meaning, same values)",
            self.old, self.new
        )
    }
}

/// The renamed flags of `sub` (a subcommand): each clap alias of a flag is the flag's old
/// name (bufscope declares aliases only for renamed flags), as (old, new) long names.
pub fn renamed_flags(sub: &Command) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for arg in sub.get_arguments() {
        let (Some(long), Some(aliases)) = (arg.get_long(), arg.get_all_aliases()) else {
            continue;
        };
        out.extend(
            aliases
                .into_iter()
                .map(|a| (a.to_string(), long.to_string())),
        );
    }
    out
}

/// The old flag names `argv` uses for the subcommand it names (each once, in order).
pub fn deprecated_flags(cmd: &Command, argv: &[OsString]) -> Vec<Deprecated> {
    let mut out: Vec<Deprecated> = Vec::new();
    let words: Vec<&str> = argv.iter().skip(1).filter_map(|a| a.to_str()).collect();
    let Some((at, sub)) = words
        .iter()
        .enumerate()
        .find_map(|(i, w)| Some((i, cmd.find_subcommand(w)?)))
    else {
        return out;
    };
    let renamed = renamed_flags(sub);
    for w in words.iter().skip(at + 1).take_while(|w| **w != "--") {
        let Some(name) = w.strip_prefix("--") else {
            continue;
        };
        let name = name.split_once('=').map_or(name, |(n, _)| n);
        if let Some((old, new)) = renamed.iter().find(|(old, _)| old == name)
            && !out.iter().any(|d| d.old == format!("--{old}"))
        {
            out.push(Deprecated {
                old: format!("--{old}"),
                new: format!("--{new}"),
            });
        }
    }
    out
}
