//! The sans-IO transport (DESIGN rule 1): the QP state machine and, per QP, the requester,
//! responder and completer; RD's End-to-End Contexts (`rd`). It takes packets, doorbells and
//! `now`, and returns packets and deadlines; it never reads a clock or touches a socket.
//!
//! One end of a reliable channel — PSNs, retry budgets, the ACK and RNR timers, go-back-N,
//! the response queue and the inbound Read/Atomic resources — is one type, `channel::Channel`,
//! that an RC QP and an RD EEC both own; what differs is only what the PSNs belong to (an RC
//! requester's SQ, an EEC's one message at a time).
//!
//! It owns the protocol state of every QP and EEC (`qp`, `rd::eec`), the table that finds a
//! QP by number (`qp_table`), the work queue entries and rings (`wqe`, `wq`) and the
//! device-wide `engine::Engine`. It imports the ground floor
//! and `wire` only; what the verbs layer above owns (memory keys, CQs, SRQs, async events, the
//! port's tables) it reaches through the traits of `hca`, which that layer implements.

pub(crate) mod channel;
pub mod cm;
pub(crate) mod completer;
pub(crate) mod hca;
pub(crate) mod mcast;
pub(crate) mod qp;
pub(crate) mod qp_table;
pub(crate) mod rd;
pub(crate) mod requester;
pub(crate) mod responder;
pub mod state;
pub(crate) mod wq;
pub mod wqe;

pub use crate::types::AttrMask;
pub use state::{attr_rule, check_modify, transition_allowed, AttrRule};
pub mod engine;

pub use engine::{pkey_match, DeviceCounters, Flow, FlowChange, MAX_DATAGRAM};
