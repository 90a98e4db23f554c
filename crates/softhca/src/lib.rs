//! softhca: a software InfiniBand Host Channel Adapter.
//!
//! Layers, bottom to top (see `DESIGN.md`); each imports only its own layer and those below it
//! (`tests/layers.rs` checks the `use` lines):
//!
//! - the ground floor, [`types`], [`attr`], [`error`] and [`mem`]: the IBA vocabulary (states, access
//!   rights, work completions, events, Modify QP masks), the verb results, and registered
//!   memory with the checked window through which every copy and atomic touches it;
//! - [`wire`]: zero-copy views and `Repr`s of the IBA headers, the opcode table, RoCEv2
//!   encapsulation and the ICRC;
//! - [`transport`]: the sans-IO engine (the QP and EEC state, the reliable channel RC and RD
//!   share, requester, responder, completer, timers) as a value, `transport::engine::Engine`;
//!   it reaches what the verbs layer owns (keys, CQs, SRQs, async events) only through the
//!   traits of `transport::hca`;
//! - [`verbs`]: the resources and the verbs a consumer calls (device, PD, MR, MW, AH, CQ, SRQ,
//!   QP, EEC) with the results of `spec/RULES.md`; what an engine step leaves for after it
//!   (wake-ups, callbacks) runs there, once the step has let go of its locks;
//! - [`link`]: the drivers, which own I/O and time and drive a device from outside (the
//!   deterministic sim fabric; real UDP sockets and shared-memory rings, both through the
//!   engine driver any OS-facing link reuses), and the taps any link takes (a pcap capture,
//!   seeded faults).

pub mod attr;
pub mod error;
pub mod link;
pub mod mem;
pub mod transport;
pub mod types;
pub mod verbs;
pub mod wire;

pub use verbs::*;
