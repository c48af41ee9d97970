//! bufscope: per-process socket-buffer telemetry for tunnels and VPN gateways.
//!
//! Probes (`bufscope-ebpf`) → maps and events → [`signals`] (decoding) with [`attribution`]
//! (socket → process → container) → [`store`] (bounded per-process counters) → [`metrics`]
//! (Prometheus text) served by [`server`].

pub mod advice;
pub mod attribution;
pub mod check;
pub mod cli;
pub mod collector;
pub mod config;
pub mod explain;
pub mod kernel;
pub mod metrics;
pub mod probes;
pub mod serve;
pub mod server;
pub mod signals;
pub mod store;
pub mod web;
