//! What bufscope's privileged integration tests (`bufscope-integration`) and its benchmarks
//! (`cargo xtask bench`) both need, in one place: start the real `bufscope run` and wait until
//! it serves ([`Exporter`]), run a child whose stdout lines arrive on a channel ([`LineChild`]),
//! stop children ([`terminate`]), run commands ([`cmd_output`], [`output_with_input`]), a
//! minimal HTTP GET ([`http_get`], [`http_get_with`]), a real Prometheus server
//! ([`Prometheus`]), the Prometheus text format
//! ([`Metrics`]) and the few `/proc` readings both take ([`held_bpf_ids`], [`proc_udp_drops`],
//! [`skmem_rb`]).
//!
//! Everything that can fail returns [`anyhow::Result`]; the test library wraps these in
//! functions that panic with the message, the benchmarks propagate them.

#![warn(missing_docs)]

mod cgroup;
mod cmd;
mod exporter;
mod http;
mod metrics;
mod process;
mod procfs;
mod prometheus;

pub use cgroup::{cgroup2_mounts, without_cgroup2};
pub use cmd::{cmd_output, output_with_input};
pub use exporter::Exporter;
pub use http::{Headers, http_get, http_get_with};
pub use metrics::{Metrics, Sample};
pub use process::{
    LineChild, ready_fields, signal, terminate, terminate_with, wait_exit, wait_until,
};
pub use procfs::{held_bpf_ids, proc_udp_drops, skmem_rb};
pub use prometheus::{Prometheus, urlencode};
