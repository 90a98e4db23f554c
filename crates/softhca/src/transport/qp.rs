//! A QP's protocol state and what the transport does to it outside a packet: the attributes,
//! the requester and responder state, the engine's ends of the work queues, the flushes and
//! the automatic transitions (to SQE and Error, SQ Drained). The verbs layer creates, modifies
//! and destroys QPs (`verbs::qp`) and posts into the rings; everything else happens here.
//!
//! Locking: the engine works on a QP under its one lock, `QpInner::core`; posters hold only a
//! ring's producer lock and read the state from the atomic mirror `QpInner::state` (see
//! `verbs::qp` for the handshake between the two).

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use crate::types::{
    Access, AddressVector, AsyncEvent, AsyncEventType, EventElement, MigState, QpState, QpType, Wc, WcOpcode, WcStatus,
};

use super::channel::Channel;
use super::engine::{Counter, Stats};
use super::hca::{CompletionQueue, Hca, SharedReceiveQueue};
use super::rd::RdQp;
use super::requester::ReqState;
use super::responder::RespState;
use super::wq::{Consumer, Ring};
use super::wqe::{RecvWqe, SendWqe, WrOpcode};

/// Queue sizes (`ibv_qp_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// Alternate path information (IBA 17.2.8, Automatic Path Migration): the address vector, P_Key
/// index, port and Local ACK Timeout the QP takes when it migrates. On a device without APM
/// supplying it is `NotSupported` (MOD-GEN-9).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AltPath {
    pub av: AddressVector,
    pub pkey_index: u16,
    pub port_num: u8,
    pub timeout: u8,
}

/// A QP's current attributes, as Query QP returns them (QPS-GEN-2).
#[derive(Debug, Clone, PartialEq, Eq)]
#[repr(C)]
pub struct QpAttrs {
    pub qp_state: QpState,
    /// Inbound enables: REMOTE_READ, REMOTE_WRITE, REMOTE_ATOMIC.
    pub qp_access_flags: Access,
    pub pkey_index: u16,
    pub qkey: u32,
    pub dest_qp_num: u32,
    pub port_num: u8,
    pub max_dest_rd_atomic: u8,
    pub max_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub path_mig_state: MigState,
    /// Path Migration Request Error was raised for the alternate path loaded now.
    pub alt_refused: bool,
    /// In SQD with messages still in progress.
    pub sq_draining: bool,
    pub en_sqd_async_notify: bool,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub av: Option<AddressVector>,
    /// The alternate path loaded (ALT_PATH), until the QP migrates to it.
    pub alt: Option<AltPath>,
    pub cap: QpCap,
}

impl QpAttrs {
    pub(crate) fn reset(cap: QpCap) -> Self {
        QpAttrs {
            qp_state: QpState::Reset,
            qp_access_flags: Access::empty(),
            pkey_index: 0,
            qkey: 0,
            port_num: 1,
            rq_psn: 0,
            sq_psn: 0,
            max_dest_rd_atomic: 0,
            max_rd_atomic: 0,
            av: None,
            dest_qp_num: 0,
            min_rnr_timer: 0,
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
            path_mig_state: MigState::Migrated,
            alt: None,
            alt_refused: false,
            sq_draining: false,
            en_sqd_async_notify: false,
            cap,
        }
    }

    /// The alternate path becomes the path (its AV, P_Key index, port and Local ACK Timeout),
    /// the migration state Migrated. False when none is loaded.
    pub(crate) fn take_alternate(&mut self) -> bool {
        let Some(alt) = self.alt.take() else { return false };
        self.av = Some(alt.av);
        self.pkey_index = alt.pkey_index;
        self.port_num = alt.port_num;
        self.timeout = alt.timeout;
        self.path_mig_state = MigState::Migrated;
        true
    }

    pub(crate) fn set_enable(&mut self, right: Access, on: bool) {
        self.qp_access_flags.set(right, on);
    }
}

/// The part of a QP behind its lock (`QpInner::core`); field order as `QpInner`'s.
#[repr(C)]
pub(crate) struct QpCore {
    /// The engine's ends of the rings `QpInner::sq_ring` and `QpInner::rq_ring`.
    pub sq: Consumer<SendWqe>,
    pub rq: Consumer<RecvWqe>,
    pub srq_bound: bool,
    /// The SQ Drained event was requested at RTS→SQD and not yet raised (EVT-SQD-5).
    pub sqd_event_pending: bool,
    /// The SQ Logic; its `started` count is the in-progress messages SQD drains.
    pub req: ReqState,
    /// The QP's end of its channel: the PSNs, retries, timers and responses RC shares with RD
    /// (UC and UD use its sequence numbers).
    pub chan: Channel<()>,
    /// The RQ Logic.
    pub resp: RespState,
    pub attrs: QpAttrs,
    /// The IP header toward the connected peer, with the GID generation it was built for:
    /// every packet of an RC or UC QP needs it, and the GID table's lock is not free. Cleared
    /// whenever the address vector may change ([`QpCore::set_attrs`], a path migration), so
    /// that a packet compares one number, not the whole address (3% of the sender's time
    /// on `ib_write_bw` over shm).
    pub route: Option<(u64, crate::wire::IpRepr)>,
    /// The ACK datagram of an RC responder, for the route, P_Key, destination QP and MigReq
    /// it was made with (`engine::emit_ack`).
    pub ack: Option<crate::wire::AckTemplate>,
    /// The ICRC's CRC over the first headers of this QP's recent requests (`engine::emit`).
    pub tx_memo: crate::wire::icrc::HeadMemo,
    /// The headers of this QP's last request packet that was a BTH and a payload alone, for
    /// the next of that shape (`engine::emit_request`).
    pub req_head: Option<crate::wire::RequestHead>,
    /// The SRQ WQE an inbound message of this QP is using, when `srq_bound`; the slot is
    /// reused so that taking SRQ WQEs does not allocate.
    pub srq_wqe: RecvWqe,
    /// XRC target: the XRC SRQ the last request named (its XRCETH), kept while requests name
    /// it: the message's WQE, PD and CQ are its.
    pub xrc_srq: Option<Arc<dyn SharedReceiveQueue>>,
    /// RD: the message an EEC carries for this QP and the receive WQEs channels hold.
    pub rd: RdQp,
    /// The flow announced to the link at Init → RTR, closed when the QP is reset or
    /// destroyed (`Engine::close_flow`).
    pub flow: Option<crate::transport::Flow>,
}

impl QpCore {
    /// The attributes a Modify QP (or a reset) leaves: the cached route goes with the old ones.
    pub fn set_attrs(&mut self, attrs: QpAttrs) {
        self.attrs = attrs;
        self.route = None;
    }

    /// At RTR→RTS (MOD-RTR-RTS-2), or again after SQE: the requester starts at `sq_psn`.
    pub fn start_sending(&mut self, sq_psn: u32) {
        self.req.start(sq_psn);
        self.chan.send.start(sq_psn, self.attrs.retry_cnt, self.attrs.rnr_retry);
    }

    /// At Init→RTR (MOD-INIT-RTR-RC-1): the responder starts at `rq_psn` with nothing owed.
    pub fn start_receiving(&mut self, rq_psn: u32) {
        self.resp = RespState::default();
        self.xrc_srq = None;
        self.chan.recv.start(rq_psn);
        self.chan.out.reset();
    }

    /// Something was sent and is not yet acknowledged.
    pub fn outstanding(&self) -> bool {
        self.req.una != self.chan.send.psn
    }

    /// The QP went to Error: its timers stop and the responses it owed are dropped.
    pub fn stop_channel(&mut self) {
        self.chan.send.stop_timers();
        self.chan.out.clear();
    }
}

/// A QP as the transport holds it. Laid out in declaration order (`repr(C)`, as `QpCore` and
/// `QpAttrs`), in the order a packet touches the fields: with thousands of QPs each line of
/// a QP's state a message reads is a cache miss (the many-QP rows of `scripts/bench`).
#[repr(C)]
pub(crate) struct QpInner {
    pub qpn: u32,
    /// The handle of the QP's PD, which every key it uses must belong to.
    pub pd: u32,
    /// Fixed at creation (Modify QP resizes only the queues), so posters check WRs against
    /// them without `core`.
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
    pub qp_type: QpType,
    pub sq_sig_all: bool,
    /// `core.attrs.qp_state` as a `QpState` discriminant, for posters; stored only with `core`
    /// held, right after the state changes.
    pub(crate) state: AtomicU8,
    /// Set by Destroy QP, with `core` and both producer locks held.
    pub destroyed: AtomicBool,
    /// On the engine's ready list (`engine::Engine::wake`).
    pub ready: AtomicBool,
    /// The device above, through the transport's narrow interface.
    pub dev: Arc<dyn Hca>,
    pub core: Mutex<QpCore>,
    /// The posting ends of the SQ and the RQ.
    pub sq_ring: Arc<Ring<SendWqe>>,
    pub rq_ring: Arc<Ring<RecvWqe>>,
    pub send_cq: Arc<dyn CompletionQueue>,
    pub recv_cq: Arc<dyn CompletionQueue>,
    pub stats: Stats,
    pub srq: Option<Arc<dyn SharedReceiveQueue>>,
    /// RD: the handle of the QP's Reliable Datagram Domain.
    pub rdd: Option<u32>,
    /// XRC target: the handle of the QP's XRC domain, which the SRQs its messages name must
    /// belong to.
    pub xrcd: Option<u32>,
    /// RD: bumped whenever the QP drops the message an EEC carries for it (flush, Reset,
    /// Destroy), so that the EEC, which must not take the QP's lock, sees it is orphaned.
    pub rd_epoch: std::sync::atomic::AtomicU64,
}

/// Posts one CQE for a WQE that did not execute. Error CQEs are solicited events (EVT-SOL-2,
/// EVT-SOL-5). False when the CQ was full: it has raised its CQ Error, and the caller moves
/// the QP to Error unless it is there already (CQ-OVF-2).
pub(crate) fn flush_cqe(cq: &dyn CompletionQueue, qpn: u32, wr_id: u64, opcode: WcOpcode) -> bool {
    let wc = Wc { wr_id, status: WcStatus::WrFlushErr, opcode, qp_num: qpn, ..Default::default() };
    cq.push(wc, true).is_ok()
}

pub(crate) fn wc_opcode_of(op: WrOpcode) -> WcOpcode {
    match op {
        WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv | WrOpcode::Resync => WcOpcode::Send,
        WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm => WcOpcode::RdmaWrite,
        WrOpcode::RdmaRead => WcOpcode::RdmaRead,
        WrOpcode::AtomicCmpSwp => WcOpcode::CompSwap,
        WrOpcode::AtomicFetchAdd => WcOpcode::FetchAdd,
        WrOpcode::AtomicWrite => WcOpcode::AtomicWrite,
        WrOpcode::BindMw => WcOpcode::BindMw,
        WrOpcode::LocalInv => WcOpcode::LocalInv,
        WrOpcode::FastReg => WcOpcode::FastReg,
    }
}

/// A device's QPs by number (see `qp_table`).
pub(crate) type QpTable = super::qp_table::NumberTable<QpInner>;

impl super::qp_table::Numbered for QpInner {
    fn number(&self) -> u32 {
        self.qpn
    }
}

impl QpInner {
    /// Whether the QP takes its receive WQEs from an SRQ: its own, or (an XRC target) those
    /// its messages name.
    pub fn on_srq(&self) -> bool {
        self.srq.is_some() || self.qp_type == QpType::XrcRecv
    }

    /// Counts an event on this QP and on its device.
    pub fn bump(&self, counter: impl Fn(&Stats) -> &Counter) {
        counter(&self.dev.engine().stats).inc();
        counter(&self.stats).inc();
    }

    /// The state as a poster sees it, without `core`.
    pub(crate) fn posted_state(&self) -> QpState {
        // SeqCst: the poster's half of the handshake in the module doc.
        let s = self.state.load(Ordering::SeqCst);
        QpState::ALL.get(s as usize).copied().unwrap_or(QpState::Error)
    }

    /// Makes `core.attrs.qp_state` visible to posters. It must come before any flush that
    /// follows the change: the engine's half of the handshake in the module doc.
    pub(crate) fn mirror_state(&self, core: &QpCore) {
        self.state.store(core.attrs.qp_state as u8, Ordering::SeqCst);
    }

    /// Flushes every outstanding WQE of both queues, each queue in post order (ERR-FLUSH-1,
    /// ERR-FLUSH-3, ERR-FLUSH-5, ERR-FLUSH-6).
    pub fn flush_all(&self, core: &mut QpCore) {
        self.flush_sq(core);
        // WQEs held by RD channels were bound before those still on the RQ.
        super::rd::release(self, core, true);
        core.req.started = 0;
        core.req.cursor = 0;
        core.req.cursor_off = 0;
        self.flush_rq(core);
        if std::mem::take(&mut core.srq_bound) {
            flush_cqe(super::responder::recv_cq(self, core), self.qpn, core.srq_wqe.wr_id, WcOpcode::Recv);
        }
        core.xrc_srq = None;
        self.last_wqe_reached();
    }

    /// Flushes every SQ WQE, in post order.
    pub(crate) fn flush_sq(&self, core: &mut QpCore) {
        self.flush_sq_first(core, usize::MAX);
    }

    /// Flushes the `n` oldest SQ WQEs (or as many as there are), in post order.
    /// False when a flush CQE did not fit in the CQ.
    pub(crate) fn flush_sq_first(&self, core: &mut QpCore, n: usize) -> bool {
        if core.rd.active.take().is_some() {
            self.rd_epoch.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
        let mut fitted = true;
        for _ in 0..n {
            let Some(w) = core.sq.get(0) else { break };
            let (wr_id, opcode) = (w.wr_id, wc_opcode_of(w.opcode));
            core.sq.pop();
            fitted &= flush_cqe(&*self.send_cq, self.qpn, wr_id, opcode);
        }
        fitted
    }

    /// Flushes every RQ WQE, in post order.
    pub(crate) fn flush_rq(&self, core: &mut QpCore) {
        while let Some(w) = core.rq.get(0) {
            let wr_id = w.wr_id;
            core.rq.pop();
            self.flush_recv_cqe(core, wr_id, 1);
        }
    }

    /// Flushes one receive WQE. An RD QP's CQE carries the freed resource count (CQE-15): the
    /// `slots` this WQE frees now (1 from the RQ, 0 when a channel held it) plus those channels
    /// freed at bind since the last receive CQE.
    pub(crate) fn flush_recv_cqe(&self, core: &mut QpCore, wr_id: u64, slots: u32) -> bool {
        let freed = if self.qp_type == QpType::Rd { slots + std::mem::take(&mut core.rd.freed) } else { 0 };
        let wc = Wc {
            wr_id,
            status: WcStatus::WrFlushErr,
            opcode: WcOpcode::Recv,
            qp_num: self.qpn,
            freed,
            ..Default::default()
        };
        self.recv_cq.push(wc, true).is_ok()
    }

    /// Moves the QP to Error outside Modify QP (QPT-AUTO-3, QPT-AUTO-4, QPT-AUTO-6). With
    /// `flush` every outstanding WQE is flushed (ERR-FLUSH-1); without it (Class G, ERR-G-2)
    /// they are discarded with no CQE. Responses already queued (the NAK of the error) still
    /// go out.
    pub fn enter_error(&self, core: &mut QpCore, flush: bool) {
        if core.attrs.qp_state != QpState::Error {
            tracing::debug!(qpn = self.qpn, from = %core.attrs.qp_state, "QP → Error");
        }
        core.attrs.qp_state = QpState::Error;
        self.mirror_state(core);
        core.attrs.sq_draining = false;
        core.sqd_event_pending = false;
        core.chan.send.stop_timers();
        if flush {
            self.flush_all(core);
        } else {
            core.sq.discard();
            core.rq.discard();
            core.srq_bound = false;
            core.req.started = 0;
            core.req.cursor = 0;
            super::rd::release(self, core, false);
            self.last_wqe_reached();
        }
    }

    /// Automatic Path Migration (IBA 17.2.8): the alternate path becomes the path (its AV,
    /// P_Key index, port and Local ACK Timeout), the state Migrated; `event` raises Path
    /// Migrated (EVT-PM-1: the automatic migrations, not one the consumer asks for). False
    /// when no alternate path is loaded.
    pub(crate) fn migrate(&self, core: &mut QpCore, event: bool) -> bool {
        if !core.attrs.take_alternate() {
            return false;
        }
        core.route = None;
        if event {
            self.dev.raise(AsyncEvent { event_type: AsyncEventType::PathMig, element: EventElement::Qp(self.qpn) });
        }
        true
    }

    /// A migration request (a MigReq packet over the alternate path) this QP cannot follow,
    /// its alternate path loaded but not armed: Path Migration Request Error (EVT-AE-1), once
    /// per alternate path loaded.
    pub(crate) fn refuse_migration(&self, core: &mut QpCore) {
        self.bump(|s| &s.migrations_refused);
        if !std::mem::replace(&mut core.attrs.alt_refused, true) {
            self.dev.raise(AsyncEvent { event_type: AsyncEventType::PathMigErr, element: EventElement::Qp(self.qpn) });
        }
    }

    /// EVT-LWR-1: a QP on an SRQ that enters Error reports Last WQE Reached once its last
    /// SRQ WQE has its CQE; here that CQE (if any) was just written by the flush.
    pub(crate) fn last_wqe_reached(&self) {
        if self.srq.is_some() {
            self.dev.raise(AsyncEvent {
                event_type: AsyncEventType::QpLastWqeReached,
                element: EventElement::Qp(self.qpn),
            });
        }
    }

    /// A UC, UD or RD SQ WQE completed in error: the QP moves to SQE and the WQEs queued
    /// behind it are flushed (ERR-SQ-1, ERR-SQE-1, QPT-AUTO-1, QPT-AUTO-2); WRs posted from now
    /// on wait for SQE→RTS. This is the first half, done before the error CQE is written: from
    /// here on a
    /// poster sees SQE and its WR waits for SQE→RTS. Returns how many WQEs were published
    /// before (SeqCst, against the poster's publish-then-look): those, and only those, are
    /// flushed by [`QpInner::finish_sqe`]. An application that polled the error CQE and then
    /// posted must find its WR held, not flushed (QPS-SQE, ERR-SQ-1).
    pub fn begin_sqe(&self, core: &mut QpCore) -> usize {
        tracing::debug!(qpn = self.qpn, from = %core.attrs.qp_state, "QP → SQE");
        core.attrs.qp_state = QpState::Sqe;
        self.mirror_state(core);
        core.attrs.sq_draining = false;
        core.sqd_event_pending = false;
        core.sq.len()
    }

    /// The second half: flushes the `queued` WQEs that preceded the move to SQE.
    pub fn finish_sqe(&self, core: &mut QpCore, queued: usize) {
        if !self.flush_sq_first(core, queued) {
            self.enter_error(core, false); // CQ-OVF-2: a flush CQE did not fit
            return;
        }
        let psn = core.chan.send.psn;
        core.start_sending(psn);
    }

    /// Raises SQ Drained once the drain a RTS→SQD asked about is over (EVT-SQD-1, -3, -4, -5).
    pub fn check_drained(&self, core: &mut QpCore) {
        if core.attrs.qp_state == QpState::Sqd && core.req.started == 0 {
            core.attrs.sq_draining = false;
            if core.sqd_event_pending {
                core.sqd_event_pending = false;
                self.dev
                    .raise(AsyncEvent { event_type: AsyncEventType::SqDrained, element: EventElement::Qp(self.qpn) });
            }
        }
    }
}
