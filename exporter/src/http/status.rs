//! The status page (`/`, self-contained: no external assets) and its data
//! (`/api/v1/status`): a row per process, each signal's room adding its columns, plus probe
//! health.

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde_json::json;

use crate::bpf::ProbeStatus;
use crate::collector::Collector;

/// The page.
pub const PAGE: &str = include_str!("status.html");

/// The `/api/v1/status` document.
pub fn document(c: &Collector, probes: &[ProbeStatus]) -> serde_json::Value {
    let rows: Vec<serde_json::Value> = c
        .store
        .iter()
        .map(|(pid, s)| {
            let mut row = serde_json::Map::new();
            row.insert("pid".into(), pid.into());
            row.insert("comm".into(), s.meta.comm.clone().into());
            row.insert("container".into(), s.meta.container.clone().into());
            s.parts.status(&mut row);
            row.into()
        })
        .collect();
    let probes: Vec<_> = probes
        .iter()
        .map(|p| {
            json!({
                "probe": p.spec.name,
                "hooks": p.hooks(),
                "what": p.spec.what,
                "attached": p.attached,
                "error": p.error,
            })
        })
        .collect();
    json!({
        "version": c.health.version,
        "kernel": c.health.kernel,
        "generated_at": SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0),
        "net_core_rmem_max": c.limits.rmem_max,
        "net_core_wmem_max": c.limits.wmem_max,
        "processes": rows,
        "probes": probes,
        "attribution_unknown": c.store.attribution_unknown,
        "bpf_events_lost": c.health.bpf_lost.iter().map(|(k, v)| (k.to_string(), *v)).collect::<BTreeMap<_, _>>(),
        "tracked_processes": c.store.len(),
    })
}
