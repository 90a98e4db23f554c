//! softhca: a software InfiniBand Host Channel Adapter.
//!
//! Layers, top to bottom (see `DESIGN.md`): [`verbs`] (resources and the verbs a
//! consumer calls), [`transport`] (the sans-IO QP state machine and engines),
//! [`wire`] (IBA headers, RoCEv2 and ICRC) and [`link`] (sim, udp, pcap).

pub mod error;
pub mod link;
pub mod mem;
pub mod transport;
pub mod types;
pub mod verbs;
pub mod wire;

pub use verbs::*;
