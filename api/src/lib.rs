//! The documents of bufscope's HTTP API, as types: the daemon (`bufscope run`) builds and
//! serves them, its clients (`bufscope explain`, `bufscope top`) parse them, so both sides
//! compile against one definition.
//!
//! | path | document | schema |
//! |---|---|---|
//! | `/api/v1/findings` | [`Report`] of [`Finding`]s | versioned ([`SCHEMA_VERSION`]), docs/findings.md |
//! | `/api/v1/status` | [`StatusDocument`]: a [`ProcessRow`] per process, a [`ProbeRow`] per probe | the status page's data (`/`) |
//!
//! Reading is forward compatible: unknown fields are ignored, and a severity this version does
//! not know reads as the mildest ([`Severity::Info`]), as docs/findings.md asks of consumers.
//! Only serde is needed to use them.

pub mod findings;
pub mod status;

pub use findings::{
    Call, Finding, Fix, Limit, ProcessRef, Report, Resolution, SCHEMA_VERSION, Severity, Snapshot,
    SocketRef, Story, Verdict,
};
pub use status::{ProbeRow, ProcessRow, StatusDocument};
