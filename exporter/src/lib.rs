//! bufscope: per-process socket-buffer telemetry for tunnels and VPN gateways.
//!
//! Probes (`bufscope-ebpf`, loaded by [`bpf`]) → maps and events → one room per signal in
//! [`signals`] (its probe, flags, decoding, per-socket state, per-process counters, metric
//! families, advice inputs; registered once in the list there) with the shared
//! [`attribution`] (socket → process → container) → [`store`] (bounded per-process counters)
//! → [`exposition`] (Prometheus and OpenMetrics text) and [`advice`] (findings), driven by the
//! [`collector`] loop and served by [`http`]. Subcommands: [`run`], [`check`], [`cleanup`];
//! `explain` and `top` are clients of the HTTP API (`bufscope-client`, reading the documents
//! of `bufscope-api`). See docs/architecture.md.

pub mod advice;
pub mod attribution;
pub mod bpf;
pub mod check;
pub mod cleanup;
pub mod cli;
pub mod collector;
pub mod config;
pub mod exposition;
pub mod http;
pub mod kernel;
pub mod labels;
pub mod run;
pub mod signals;
pub mod store;
pub mod totals;
pub mod values;
