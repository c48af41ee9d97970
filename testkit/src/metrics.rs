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

    /// The cumulative buckets (`le` bound → count) of histogram `name` (the base name, without
    /// `_bucket`) summed over every series matching `want`, minus those of `earlier` (an
    /// earlier scrape: the observations in between).
    pub fn buckets_since(
        &self,
        earlier: Option<&Metrics>,
        name: &str,
        want: &[(&str, &str)],
    ) -> Vec<(f64, f64)> {
        let bucket = format!("{name}_bucket");
        let of = |m: &Metrics| {
            let mut by_le: BTreeMap<String, (f64, f64)> = BTreeMap::new();
            for s in m.find(&bucket, want) {
                let Some(le) = s.labels.get("le") else {
                    continue;
                };
                let bound = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap_or(f64::NAN)
                };
                by_le.entry(le.clone()).or_insert((bound, 0.0)).1 += s.value;
            }
            by_le
        };
        let now = of(self);
        let before = earlier.map(of).unwrap_or_default();
        let mut out: Vec<(f64, f64)> = now
            .iter()
            .map(|(le, (bound, n))| (*bound, n - before.get(le).map_or(0.0, |b| b.1)))
            .collect();
        out.sort_by(|a, b| a.0.total_cmp(&b.0));
        out
    }

    /// The `q` quantile (0..1) of histogram `name` over the observations since `earlier`, as
    /// Prometheus's `histogram_quantile` estimates it (linear within the bucket; the highest
    /// finite bound when it falls in `+Inf`); None without observations.
    pub fn histogram_quantile(
        &self,
        earlier: Option<&Metrics>,
        name: &str,
        want: &[(&str, &str)],
        q: f64,
    ) -> Option<f64> {
        let b = self.buckets_since(earlier, name, want);
        let total = b.last()?.1;
        if total <= 0.0 {
            return None;
        }
        let rank = q * total;
        let (mut lo, mut below) = (0.0, 0.0);
        for (bound, n) in &b {
            if *n >= rank {
                if bound.is_infinite() {
                    return Some(lo);
                }
                let inside = n - below;
                let frac = if inside > 0.0 {
                    (rank - below) / inside
                } else {
                    1.0
                };
                return Some(lo + (bound - lo) * frac);
            }
            lo = *bound;
            below = *n;
        }
        Some(lo)
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
    fn histogram_quantile_since_an_earlier_scrape() {
        let h = |a: u32, b: u32, c: u32| {
            Metrics::parse(&format!(
                "h_bucket{{x=\"1\",le=\"0.01\"}} {a}\nh_bucket{{x=\"1\",le=\"0.02\"}} {b}\n\
                 h_bucket{{x=\"1\",le=\"+Inf\"}} {c}\nh_bucket{{x=\"2\",le=\"0.01\"}} 0\n\
                 h_bucket{{x=\"2\",le=\"0.02\"}} 0\nh_bucket{{x=\"2\",le=\"+Inf\"}} 0\n"
            ))
        };
        let before = h(10, 10, 10);
        let after = h(60, 110, 110);
        // 100 new observations: 50 up to 10 ms, 50 in (10, 20] ms.
        let p50 = after
            .histogram_quantile(Some(&before), "h", &[], 0.5)
            .expect("observations");
        assert!((p50 - 0.01).abs() < 1e-9, "{p50}");
        let p99 = after
            .histogram_quantile(Some(&before), "h", &[], 0.99)
            .expect("observations");
        assert!((p99 - 0.0198).abs() < 1e-9, "{p99}");
        // In +Inf: the highest finite bound.
        let over = h(60, 110, 210);
        assert_eq!(
            over.histogram_quantile(Some(&before), "h", &[], 0.99),
            Some(0.02)
        );
        assert_eq!(
            before.histogram_quantile(Some(&before), "h", &[], 0.99),
            None
        );
    }

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
