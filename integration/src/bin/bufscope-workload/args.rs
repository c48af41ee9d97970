//! The command line (`--key value`) and the protocol with the test: one `READY key=value …`
//! line, then the work; long-lived commands hold until stdin closes.

use std::io::{BufRead as _, Write as _};

/// The arguments after the command (`--key value`, flags).
pub(crate) struct Args(pub(crate) Vec<String>);

impl Args {
    pub(crate) fn flag(&self, name: &str) -> bool {
        self.0.iter().any(|a| a == name)
    }
    pub(crate) fn value(&self, name: &str) -> Option<&str> {
        let i = self.0.iter().position(|a| a == name)?;
        self.0.get(i + 1).map(String::as_str)
    }
    pub(crate) fn values(&self, name: &str) -> Vec<&str> {
        self.0
            .windows(2)
            .filter(|w| w[0] == name)
            .map(|w| w[1].as_str())
            .collect()
    }
    pub(crate) fn num<T: std::str::FromStr>(&self, name: &str, default: T) -> anyhow::Result<T> {
        match self.value(name) {
            Some(v) => v
                .parse()
                .map_err(|_| anyhow::anyhow!("bad value for {name}: {v}")),
            None => Ok(default),
        }
    }
}

pub(crate) fn ready(fields: &[(&str, String)]) {
    let line: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!("READY {}", line.join(" "));
    let _ = std::io::stdout().flush();
}

/// Blocks until stdin is closed (the parent test dropped us) or says "exit".
pub(crate) fn hold() {
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        match line {
            Ok(l) if l.trim() == "exit" => return,
            Ok(_) => {}
            Err(_) => return,
        }
    }
}
