//! The narrow interface through which the transport reaches what the verbs layer above it owns
//! (DESIGN rule 1): the port's tables, the memory keys, the Bind MW executor, the asynchronous
//! event queue, and, per QP, its CQs and SRQ. The transport defines these traits and the verbs
//! layer implements them, so `transport/` imports nothing from `verbs/`.

use std::sync::Arc;

use crate::mem::{AccessError, MemRef};
use crate::types::{Access, AsyncEvent, Gid, Mtu, Wc, WcStatus};

use super::engine::Engine;
use super::wqe::{BindRequest, FastRegRequest, RecvWqe};

/// What the transport needs of the device it runs in.
pub(crate) trait Hca: Send + Sync {
    /// The transport's own state of the device: its QPs, EECs, counters and timers.
    fn engine(&self) -> &Engine;
    /// The port's active MTU.
    fn active_mtu(&self) -> Mtu;
    /// P_Key `index` of the port's table.
    fn pkey(&self, index: u16) -> Option<u16>;
    /// GID `index` of the port's table (empty slots are the zero GID).
    fn gid(&self, index: u8) -> Option<Gid>;
    /// Bumped whenever the GID table changes, so cached routes know to rebuild.
    fn gid_generation(&self) -> u64;
    /// Bumped whenever a key is invalidated, rebound or deregistered, so a grant checked
    /// earlier knows to check again.
    fn key_generation(&self) -> u64;
    /// The access check of every local (L_Key) and remote (R_Key) memory access by QP `qpn`
    /// of PD `pd`: the key must name a live region or window of that PD that holds
    /// `[addr, addr + len)` and grants `access`, and a type 2 window must be bound to that QP
    /// (DESIGN rule 5).
    #[allow(clippy::too_many_arguments)]
    fn check_access(
        &self,
        key: u32,
        pd: u32,
        qpn: u32,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<MemRef, AccessError>;
    /// Executes a Bind MW WQE of QP `qpn` of PD `pd`; a failure is the completion status.
    fn bind_mw(&self, pd: u32, qpn: u32, bind: &BindRequest) -> Result<(), WcStatus>;
    /// Executes a Fast Register WQE of a QP of PD `pd`; a failure is the completion status.
    fn fast_reg(&self, pd: u32, req: &FastRegRequest) -> Result<(), WcStatus>;
    /// Invalidates `rkey` for QP `qpn` of PD `pd`: a Local Invalidate WQE, or the R_Key of an
    /// inbound Send with Invalidate. Only a type 2 window bound to that QP, or a valid
    /// fast-registration region of the PD, can be invalidated; it is then free to be bound
    /// (registered) again. With `apply` false it only says whether it could be, changing
    /// nothing (a Send with Invalidate checks before its payload lands, invalidates after).
    fn invalidate(&self, pd: u32, qpn: u32, rkey: u32, apply: bool) -> Result<(), InvalidateError>;
    /// Queues an asynchronous event (and calls the consumer's handler once the step is over).
    fn raise(&self, event: AsyncEvent);
    /// The XRC SRQ numbered `srqn`, if there is one, live and in XRC domain `xrcd`: the SRQ
    /// an XRC request's XRCETH names at a target QP of that domain.
    fn xrc_srq(&self, srqn: u32, xrcd: u32) -> Option<Arc<dyn SharedReceiveQueue>>;
}

/// Why an invalidation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InvalidateError {
    /// No window or region of the PD has the key.
    BadKey,
    /// The key names something that cannot be invalidated: a region registered whole, a
    /// fast-registration region already Free, a type 1 window, or a type 2 window bound to
    /// another QP.
    NotInvalidatable,
}

/// The CQ already holds as many unpolled CQEs as its size (CQ-OVF-1): the CQE was not written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqOverflow;

/// A completion queue as a QP's work queues see it.
pub(crate) trait CompletionQueue: Send + Sync {
    /// Writes a CQE; `solicited` says whether it satisfies a solicited-only notification
    /// request. A full CQ refuses it (and raises its CQ Error once per overflow, CQ-OVF-2).
    fn push(&self, wc: Wc, solicited: bool) -> Result<(), CqOverflow>;
}

/// A shared receive queue as the QPs attached to it see it.
pub(crate) trait SharedReceiveQueue: Send + Sync {
    /// The handle of the SRQ's PD: the keys of its WQEs' scatter lists must belong to it.
    fn pd(&self) -> u32;
    /// Whether a WQE is waiting.
    fn has_wqe(&self) -> bool;
    /// Takes the head WQE into `slot` (reusing its allocation); false when there is none.
    fn take_into(&self, slot: &mut RecvWqe) -> bool;
    /// An XRC SRQ's number, its CQ (where the receives of the messages that take its WQEs
    /// complete) and whether it is still live; `None` for an SRQ that is not XRC's.
    fn xrc(&self) -> Option<(u32, &dyn CompletionQueue, bool)>;
}
