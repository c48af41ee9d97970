//! The Prometheus text format, as bufscope emits it.

use std::collections::BTreeMap;

/// One sample of the exposition.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Metric name.
    pub name: String,
    /// Labels (unescaped values).
    pub labels: BTreeMap<String, String>,
    /// Value.
    pub value: f64,
}

/// A parsed scrape.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    /// Every sample.
    pub samples: Vec<Sample>,
}

impl Metrics {
    /// Parses the Prometheus text format (what bufscope emits: no timestamps).
    pub fn parse(text: &str) -> Self {
        let mut samples = Vec::new();
        for line in text.lines() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let (name, rest) = match line.find('{') {
                Some(i) => (&line[..i], &line[i..]),
                None => match line.split_once(' ') {
                    Some((n, v)) => {
                        samples.push(Sample {
                            name: n.to_string(),
                            labels: BTreeMap::new(),
                            value: v.trim().parse().unwrap_or(f64::NAN),
                        });
                        continue;
                    }
                    None => continue,
                },
            };
            let (labels, after) = parse_labels(rest);
            samples.push(Sample {
                name: name.to_string(),
                labels,
                value: after.trim().parse().unwrap_or(f64::NAN),
            });
        }
        Self { samples }
    }

    /// Samples of `name` whose labels include all of `want`. bufscope's series are keyed by
    /// identity (program and place), not pid: a `("pid", N)` in `want` selects the identity
    /// of process N — its `comm` (read from `/proc/N/comm` while it runs, remembered after),
    /// which the test children make unique (`bufscope-workload` names itself `wl<pid>`) —
    /// unless `want` names a `comm` itself. `bufscope_process_info` keeps its `pid`.
    pub fn find<'a>(
        &'a self,
        name: &'a str,
        want: &'a [(&str, &str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        let has_comm = want.iter().any(|(k, _)| *k == "comm");
        let want: Vec<(String, String)> = want
            .iter()
            .filter_map(|(k, v)| match *k {
                "pid" if name == "bufscope_process_info" => Some((k.to_string(), v.to_string())),
                "pid" if has_comm => None,
                "pid" => Some((
                    "comm".to_string(),
                    comm_of(v).unwrap_or_else(|| format!("<no comm for pid {v}>")),
                )),
                _ => Some((k.to_string(), v.to_string())),
            })
            .collect();
        self.samples.iter().filter(move |s| {
            s.name == name
                && want
                    .iter()
                    .all(|(k, v)| s.labels.get(k.as_str()) == Some(v))
        })
    }

    /// Sum of matching samples (0 when none).
    pub fn sum(&self, name: &str, want: &[(&str, &str)]) -> f64 {
        self.find(name, want).map(|s| s.value).sum()
    }
}

/// The `comm` of process `pid` (what its series are labelled with): read while it runs and
/// remembered for after it exits.
pub fn comm_of(pid: &str) -> Option<String> {
    use std::sync::Mutex;
    static SEEN: Mutex<BTreeMap<String, String>> = Mutex::new(BTreeMap::new());
    let now = std::fs::read(format!("/proc/{pid}/comm"))
        .ok()
        .map(|b| String::from_utf8_lossy(b.strip_suffix(b"\n").unwrap_or(&b)).into_owned());
    let mut seen = SEEN.lock().ok()?;
    match now {
        Some(c) => {
            seen.insert(pid.to_string(), c.clone());
            Some(c)
        }
        None => seen.get(pid).cloned(),
    }
}

/// Parses `{a="x",b="y\"z"}` and returns the labels and the text after `}`.
fn parse_labels(s: &str) -> (BTreeMap<String, String>, &str) {
    let mut labels = BTreeMap::new();
    let b = s.as_bytes();
    let mut i = 1; // after '{'
    loop {
        while i < b.len() && (b[i] == b',' || b[i] == b' ') {
            i += 1;
        }
        if i >= b.len() || b[i] == b'}' {
            return (labels, s.get(i + 1..).unwrap_or(""));
        }
        let eq = s[i..].find('=').map(|x| x + i).unwrap_or(b.len());
        let key = s[i..eq].to_string();
        i = eq + 2; // skip ="
        let mut val = Vec::new();
        while i < b.len() && b[i] != b'"' {
            if b[i] == b'\\' && i + 1 < b.len() {
                val.push(match b[i + 1] {
                    b'n' => b'\n',
                    c => c,
                });
                i += 2;
            } else {
                val.push(b[i]);
                i += 1;
            }
        }
        i += 1; // closing quote
        labels.insert(key, String::from_utf8_lossy(&val).into_owned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_escaped_labels() {
        let m = Metrics::parse("# HELP x y\nx_total{comm=\"a\\\"b\\\\c\\nd\",pid=\"1\"} 5\nup 1\n");
        assert_eq!(m.samples.len(), 2);
        assert_eq!(m.samples[0].labels["comm"], "a\"b\\c\nd");
        assert_eq!(m.sum("x_total", &[("comm", "a\"b\\c\nd")]), 5.0);
        assert_eq!(m.sum("up", &[]), 1.0);
    }

    /// A pid selects its process's identity (its comm).
    #[test]
    fn a_pid_selects_the_identity_of_its_process() {
        let me = std::process::id().to_string();
        let comm = comm_of(&me).expect("our own comm");
        let text = format!(
            "x_total{{comm=\"{comm}\"}} 2\nx_total{{comm=\"other\"}} 3\nbufscope_process_info{{comm=\"{comm}\",pid=\"{me}\"}} 1\n"
        );
        let m = Metrics::parse(&text);
        assert_eq!(m.sum("x_total", &[("pid", &me)]), 2.0);
        assert_eq!(m.sum("bufscope_process_info", &[("pid", &me)]), 1.0);
        assert_eq!(
            m.sum("x_total", &[("pid", "4194305")]),
            0.0,
            "no such process"
        );
    }

    #[test]
    fn sums_match_labels_and_whole_names() {
        let m =
            Metrics::parse("# HELP x y\nx{map=\"DROPS\"} 3\nx{map=\"AUTOTUNE\"} 4\nx_total 9\n");
        assert_eq!(m.sum("x", &[("map", "DROPS")]), 3.0);
        assert_eq!(m.sum("x", &[]), 7.0);
        assert_eq!(m.sum("y", &[]), 0.0);
    }
}
