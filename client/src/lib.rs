//! Clients of a running bufscope (`bufscope run`) over its HTTP API: [`explain`] prints the
//! findings, [`top`] is a live terminal view. Both read the documents of `bufscope-api` with
//! one [`Client`] (HTTP or HTTPS with a CA file, basic auth).
//!
//! The terminal UI (ratatui, crossterm) is the `tui` feature, so that a daemon built without
//! it (the container image) compiles neither; [`top::run`] then fails with a one-line error
//! that says which build has it.

pub mod explain;
pub mod http;
pub mod top;

pub use http::{Client, ConnectArgs};
