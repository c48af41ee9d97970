//! One module per signal. Each owns the decoding of its probe's map or events and the
//! counters it adds to the [`crate::store::Store`]; attribution is the shared
//! [`crate::attribution::Attributor`].
//!
//! | module | probe | metric families |
//! |---|---|---|
//! | [`drops`] | `drops` (`tp_btf/kfree_skb` → `DROPS`) | `bufscope_socket_drops_total` |
//! | [`sockopt`] | `setsockopt` (ring buffer) | `bufscope_setsockopt{,_clamped,_failed}_total`, `bufscope_rcvbuf_locks_total` |
//! | [`tcp`] | `tcp_state` (ring buffer) | `bufscope_tcp_established_total`, `bufscope_tcp_wscale_shrunk_total` |
//! | [`autotune`] | `autotune` (`AUTOTUNE`) | `bufscope_tcp_autotune_suppressed_total` |

pub mod autotune;
pub mod batch;
pub mod drops;
pub mod sockopt;
pub mod tcp;
