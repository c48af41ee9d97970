//! The status page (`/`, self-contained: no external assets) and its data
//! (`/api/v1/status`, a [`StatusDocument`] of `bufscope-api`): a row per process, each
//! signal's room filling its columns, plus probe health.

use std::time::SystemTime;

use bufscope_api::{ProbeRow, ProcessRow, StatusDocument};

use crate::collector::Collector;
use crate::probes::ProbeStatus;

/// The page.
pub const PAGE: &str = include_str!("status.html");

/// The `/api/v1/status` document.
pub fn document(c: &Collector, probes: &[ProbeStatus]) -> StatusDocument {
    let processes = c
        .store
        .iter()
        .map(|(pid, s)| {
            let mut row = ProcessRow {
                pid,
                comm: s.meta.comm.clone(),
                container: s.meta.container.clone(),
                ..ProcessRow::default()
            };
            crate::signals::status_row(s, &mut row);
            row
        })
        .collect();
    let probes = probes
        .iter()
        .map(|p| ProbeRow {
            probe: p.spec.name.to_string(),
            hooks: p.hooks(),
            what: p.spec.what.to_string(),
            attached: p.attached,
            error: p.error.clone(),
        })
        .collect();
    StatusDocument {
        version: c.health.version.clone(),
        kernel: c.health.kernel.clone(),
        generated_at: Some(
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0),
        ),
        net_core_rmem_max: c.limits.rmem_max,
        net_core_wmem_max: c.limits.wmem_max,
        processes,
        probes,
        attribution_unknown: c
            .store
            .attribution_unknown
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect(),
        bpf_events_lost: c
            .health
            .bpf_lost
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect(),
        tracked_processes: c.store.len() as u64,
    }
}
