//! The RQ Logic (responder). For RC it checks each request in the order of PKT-VAL-12 — PSN,
//! opcode sequence, operation enabled, resources, lengths, R_Key — and the first failing
//! check decides the error class (ERR-RQ); then it executes and queues the response. UC and
//! UD requests take the same path without ACKs (PKT-UC, PKT-UD). An XRC target is RC's
//! responder with one more check after the operation's: the XRC SRQ the request names, which
//! gives the message its receive WQE, its PD and its CQ (IBA Annex A14).

use std::sync::atomic::Ordering;

use crate::mem::{AccessError, MemRef};
use std::sync::Arc;

use crate::transport::hca::{CompletionQueue, Hca, SharedReceiveQueue};
use crate::transport::qp::{QpCore, QpInner};
use crate::types::{
    Access, AsyncEvent, AsyncEventType, EventElement, NetworkHdrType, QpState, QpType, Wc, WcFlags, WcOpcode, WcStatus,
};
use crate::wire::aeth::{credit_code_for, NakCode, Syndrome};
use crate::wire::opcode::{Operation, Position};
use crate::wire::psn::Psn;
use crate::wire::{AtomicEthRepr, RethRepr};

use super::channel::{Arrival, Inbound};
use super::completer::scatter;
use super::requester::pmtu;

/// What a remote peer's R_Key was granted for a multi-packet Write or a Read: checked whole
/// when the request arrives (ERR-RQ-9), and checked again before any later packet's bytes are
/// touched if a key was revoked meanwhile, so that a region deregistered or a window rebound
/// stops the transfer rather than leaving memory open to it (DESIGN rule 5).
#[derive(Debug, Clone)]
pub(crate) struct Grant {
    rkey: u32,
    pd: u32,
    qpn: u32,
    va: u64,
    len: u64,
    access: Access,
    /// The whole range as last checked, and the device's key generation before that check.
    checked: MemRef,
    gen: u64,
}

impl Grant {
    /// `len` bytes at `va` through `rkey` with `access`, if the key allows them now.
    /// `qpn` is the QP the access arrived on (a type 2 window must be bound to it).
    #[allow(clippy::too_many_arguments)]
    pub fn new(dev: &dyn Hca, rkey: u32, pd: u32, qpn: u32, va: u64, len: u64, access: Access) -> Option<Grant> {
        // The generation is read first: a revocation racing the check shows at the next use.
        let gen = dev.key_generation();
        let checked = dev.check_access(rkey, pd, qpn, va, len, access).ok()?;
        Some(Grant { rkey, pd, qpn, va, len, access, checked, gen })
    }

    /// The memory of bytes `[at, at + n)` of the grant and their offset in it, if the key still
    /// allows the whole range.
    pub fn bytes(&mut self, dev: &dyn Hca, at: u64, n: u64) -> Option<(&MemRef, usize)> {
        if at.checked_add(n)? > self.len {
            return None;
        }
        let gen = dev.key_generation();
        if gen != self.gen {
            self.checked = dev.check_access(self.rkey, self.pd, self.qpn, self.va, self.len, self.access).ok()?;
            self.gen = gen;
        }
        Some((&self.checked, at as usize))
    }
}

/// Why a service's responder refuses an inbound RDMA operation, before the service's error
/// class decides what that means (RC: Class C with its NAK; RD: a fatal NAK on the channel;
/// UC: the message is dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Invalid Request (ERR-RQ-5, ERR-RQ-12, a missing header, a length beyond 2^31).
    Invalid,
    /// Remote Access Error (ERR-RQ-9).
    Access,
}

/// The first (or only) packet of an RDMA Write of `len` payload bytes: its RETH's length
/// against the packet's (ERR-RQ-12), and the grant of its R_Key for the whole message
/// (ERR-RQ-9; none for a zero-length Write). Returns the grant and the message length. One
/// executor for RC, UC and RD.
pub(crate) fn begin_write(
    dev: &dyn Hca,
    pd: u32,
    qpn: u32,
    r: &Request<'_>,
    len: u64,
) -> Result<(Option<Grant>, u64), Refusal> {
    let reth = r.reth.ok_or(Refusal::Invalid)?;
    let total = reth.dma_length as u64;
    if (r.position == Position::Only && len != total) || (r.position == Position::First && total <= len) {
        return Err(Refusal::Invalid); // ERR-RQ-12
    }
    let grant = match total {
        0 => None,
        _ => Some(Grant::new(dev, reth.r_key, pd, qpn, reth.va, total, Access::REMOTE_WRITE).ok_or(Refusal::Access)?),
    };
    Ok((grant, total))
}

/// An RDMA Read request as the responder executes it: its grant (none for zero length) and
/// the response packets it asks for at `mtu`.
pub(crate) struct ReadPlan {
    pub grant: Option<Grant>,
    pub va: u64,
    pub rkey: u32,
    pub len: u64,
    pub npkts: u32,
}

/// An RDMA Read request: its RETH, its length (at most 2^31) and the grant of its R_Key
/// (ERR-RQ-9, ORD-RLX-2/3). The caller has checked the inbound depth (ERR-RQ-6). One executor
/// for RC and RD.
pub(crate) fn begin_read(dev: &dyn Hca, pd: u32, qpn: u32, r: &Request<'_>, mtu: u64) -> Result<ReadPlan, Refusal> {
    let reth = r.reth.ok_or(Refusal::Invalid)?;
    let len = reth.dma_length as u64;
    if len > 1 << 31 {
        return Err(Refusal::Invalid);
    }
    let grant = match len {
        0 => None,
        _ => Some(Grant::new(dev, reth.r_key, pd, qpn, reth.va, len, Access::REMOTE_READ).ok_or(Refusal::Access)?),
    };
    let npkts = len.div_ceil(mtu).max(1) as u32;
    Ok(ReadPlan { grant, va: reth.va, rkey: reth.r_key, len, npkts })
}

/// An Atomic request, executed: an aligned word (ERR-RQ-5) its R_Key grants (ERR-RQ-9).
/// Returns the original value. The caller has checked the inbound depth (ERR-RQ-6). One
/// executor for RC and RD.
pub(crate) fn run_atomic(dev: &dyn Hca, pd: u32, qpn: u32, r: &Request<'_>) -> Result<u64, Refusal> {
    let Some((is_cas, a)) = r.atomic else { return Err(Refusal::Invalid) };
    if a.va % 8 != 0 {
        return Err(Refusal::Invalid); // ERR-RQ-5
    }
    let mem = dev.check_access(a.r_key, pd, qpn, a.va, 8, Access::REMOTE_ATOMIC).map_err(|_| Refusal::Access)?;
    // An atomic runs in place: on an on-demand region, the word must be there first.
    mem.present(true).map_err(|_| Refusal::Access)?;
    execute_atomic(&mem, is_cas, &a).ok_or(Refusal::Invalid)
}

/// An inbound Atomic Write (IBA 1.5; as rxe's `atomic_write_reply`): an RETH for exactly its
/// 8-byte payload (else Invalid Request, as a Write whose lengths disagree, ERR-RQ-12), an
/// aligned address (Invalid Request, as an Atomic's, ERR-RQ-5), and its R_Key with Remote
/// Write over the word (Remote Access Error, ERR-RQ-9). The bytes land as they came, in one
/// release store: a program polling the word sees the old value or the new one, never a
/// mix, and whatever this QP wrote before it first. One executor (RC has the only opcode).
pub(crate) fn run_atomic_write(dev: &dyn Hca, pd: u32, qpn: u32, r: &Request<'_>) -> Result<(), Refusal> {
    let (Some(reth), Ok(data)) = (r.reth, <[u8; 8]>::try_from(r.payload)) else { return Err(Refusal::Invalid) };
    if reth.dma_length != 8 || reth.va % 8 != 0 {
        return Err(Refusal::Invalid);
    }
    let mem = dev.check_access(reth.r_key, pd, qpn, reth.va, 8, Access::REMOTE_WRITE).map_err(|_| Refusal::Access)?;
    // In place, as an Atomic: on an on-demand region the word must be there first.
    mem.present(true).map_err(|_| Refusal::Access)?;
    mem.atomic_u64().ok_or(Refusal::Invalid)?.store(u64::from_ne_bytes(data), Ordering::Release);
    Ok(())
}

/// A response waiting to be transmitted, in the order it must leave (ORD-RLX-4).
#[derive(Debug, Clone)]
pub(crate) enum RespJob {
    /// An ACK or NAK carrying `psn`. An ACK's credit count is filled in when it is sent.
    Ack {
        psn: u32,
        syndrome: Syndrome,
    },
    /// The response packets of an RDMA Read, from packet `next` on.
    ReadResp {
        /// `None` for a zero-length Read.
        grant: Option<Grant>,
        first_psn: u32,
        npkts: u32,
        next: u32,
        len: u64,
        /// The path MTU the Read was segmented by: a later Modify (SQD→RTS with a new AV)
        /// must not re-cut responses already promised.
        mtu: u64,
    },
    AtomicAck {
        psn: u32,
        orig: u64,
    },
}

/// The message being received.
#[derive(Debug, Clone)]
enum InMsg {
    /// A Send into the RQ head WQE, `offset` bytes in.
    Send { offset: u64 },
    /// An RDMA Write into `mem`, `offset` bytes in, `len` in all.
    Write { grant: Option<Grant>, offset: u64, len: u64 },
}

#[derive(Debug, Default, Clone)]
pub(crate) struct RespState {
    /// UC: a loss was seen; drop until a First or Only (PKT-UC-2).
    uc_resync: bool,
    in_msg: Option<InMsg>,
    /// The checked scatter list of the RQ head WQE while a Send uses it, and the device's key
    /// generation read before it was checked (see `recheck_scatter`).
    scatter: Vec<MemRef>,
    scatter_gen: u64,
    /// Communication Established was raised (EVT-CE-1).
    pub comm_est: bool,
}

impl RespState {
    /// PKT-ACK-11: the credits an ACK reports: RQ WQEs posted and not in use.
    pub fn credit_code(&self, rq_len: usize) -> u8 {
        let in_use = matches!(self.in_msg, Some(InMsg::Send { .. })) as usize;
        credit_code_for(rq_len.saturating_sub(in_use) as u32)
    }
}

/// An inbound request, reduced to what the responder needs.
pub(crate) struct Request<'a> {
    pub psn: Psn,
    pub operation: Operation,
    pub position: Position,
    pub reserved: bool,
    pub se: bool,
    pub ack_req: bool,
    pub imm: Option<u32>,
    pub reth: Option<RethRepr>,
    /// Send with Invalidate: the R_Key its IETH names.
    pub invalidate: Option<u32>,
    pub atomic: Option<(bool, AtomicEthRepr)>,
    /// XRC: the SRQ its XRCETH names.
    pub xrc_srq: Option<u32>,
    pub payload: &'a [u8],
    /// UD: the source QPN from the DETH, and the bytes for the 40-byte GRH area.
    pub src_qp: u32,
    /// The index of the P_Key table entry the packet's BTH:P_Key matched.
    pub pkey_index: u16,
    pub grh: Option<[u8; 40]>,
}

impl<'a> Request<'a> {
    /// The request a packet carries. A reserved opcode (no `info`) is kept as such, as a
    /// Send Only, so that the responder can answer it per its class (PKT-OP-5).
    pub fn of(
        p: &crate::wire::PacketRepr<'a>,
        info: Option<&crate::wire::opcode::OpcodeInfo>,
        grh: Option<[u8; 40]>,
    ) -> Self {
        let (operation, position) = info.map_or((Operation::Send, Position::Only), |i| (i.operation, i.position));
        Request {
            psn: p.bth.psn,
            operation,
            position,
            reserved: info.is_none(),
            se: p.bth.se,
            ack_req: p.bth.ack_req,
            imm: p.immdt.map(|i| i.imm_data),
            reth: p.reth,
            invalidate: p.ieth.map(|i| i.r_key),
            atomic: p.atomic_eth.map(|a| (operation == Operation::CompareSwap, a)),
            xrc_srq: p.xrceth.map(|x| x.xrc_srq),
            payload: p.payload,
            src_qp: p.deth.map_or(0, |d| d.src_qp),
            pkey_index: 0,
            grh,
        }
    }
}

/// Why a request failed, and how (ERR classes).
enum Fail {
    /// Class B: NAK, nothing else.
    B(Syndrome),
    /// Class C: NAK, QP to Error; the WQE in use (if any) gets `status`.
    C { nak: NakCode, status: WcStatus, access: bool },
    /// Class A: Remote Operational Error; the WQE in use completes with Local QP Operation
    /// Error.
    A,
    /// Class D: drop silently.
    D,
}

fn rc_fail_invalid() -> Fail {
    Fail::C { nak: NakCode::InvalidRequest, status: WcStatus::RemInvReqErr, access: false }
}

/// RC's error class for a refusal: Class C.
fn rc_refused(why: Refusal) -> Fail {
    match why {
        Refusal::Invalid => rc_fail_invalid(),
        Refusal::Access => access_fail(),
    }
}

/// A valid inbound packet reached `q`: in RTR, the first raises Communication Established
/// (EVT-CE-1: RTR stays RTR). Every service's receive path calls it, RD's included.
pub(crate) fn note_arrival(q: &QpInner, core: &mut QpCore) {
    if core.attrs.qp_state == QpState::Rtr && !core.resp.comm_est {
        core.resp.comm_est = true;
        q.dev.raise(AsyncEvent { event_type: AsyncEventType::CommEst, element: EventElement::Qp(q.qpn) });
    }
}

/// Handles one request packet addressed to `q`, already past header validation.
pub(crate) fn on_request(q: &QpInner, core: &mut QpCore, r: &Request<'_>) {
    note_arrival(q, core);
    let result = match q.qp_type {
        QpType::Rc | QpType::XrcRecv => rc_request(q, core, r),
        QpType::XrcSend => Ok(()), // an XRC initiator has no responder
        QpType::Uc => {
            uc_request(q, core, r);
            Ok(())
        }
        _ => {
            ud_request(q, core, r);
            Ok(())
        }
    };
    if let Err(f) = result {
        fail(q, core, r, f);
    }
}

fn fail(q: &QpInner, core: &mut QpCore, r: &Request<'_>, f: Fail) {
    let psn = r.psn.value();
    match f {
        Fail::D => {}
        Fail::B(syndrome) => {
            match syndrome {
                Syndrome::RnrNak { .. } => q.bump(|s| &s.rnr_naks_sent),
                _ => q.bump(|s| &s.seq_naks_sent),
            }
            let at = if matches!(syndrome, Syndrome::Nak(NakCode::PsnSeqErr)) { core.chan.recv.epsn } else { psn };
            core.chan.out.push((), RespJob::Ack { psn: at, syndrome });
        }
        Fail::A => {
            core.chan.out.push((), RespJob::Ack { psn, syndrome: Syndrome::Nak(NakCode::RemoteOperationalError) });
            complete_wqe_in_use(q, core, WcStatus::LocQpOpErr);
            q.enter_error(core, true);
        }
        Fail::C { nak, status, access } => {
            core.chan.out.push((), RespJob::Ack { psn, syndrome: Syndrome::Nak(nak) });
            // A Write with Immediate's last packet uses a receive WQE: on an SRQ one is taken
            // now (the message would have taken it), to be retired in error.
            let had_wqe = matches!(core.resp.in_msg, Some(InMsg::Send { .. }))
                || (r.imm.is_some() && matches!(r.position, Position::Last | Position::Only) && bind_wqe(q, core));
            if had_wqe {
                complete_wqe_in_use(q, core, status); // ERR-C-3
            } else {
                // ERR-C-5, ERR-C-6
                let event_type = if access { AsyncEventType::QpAccessErr } else { AsyncEventType::QpReqErr };
                q.dev.raise(AsyncEvent { event_type, element: EventElement::Qp(q.qpn) });
            }
            q.enter_error(core, true);
        }
    }
}

/// The SRQ the inbound message takes its WQE from: the QP's, or an XRC target's message's
/// (`QpCore::xrc_srq`, passed alone so that the rest of the core stays free to change).
fn srq_of<'a>(
    q: &'a QpInner,
    xrc_srq: &'a Option<Arc<dyn SharedReceiveQueue>>,
) -> Option<&'a Arc<dyn SharedReceiveQueue>> {
    q.srq.as_ref().or(xrc_srq.as_ref())
}

/// The PD of the keys a request uses remotely: the QP's, or an XRC target's message's SRQ's
/// (only an XRC target has `xrc_srq`).
fn request_pd(q: &QpInner, core: &QpCore) -> u32 {
    core.xrc_srq.as_ref().map_or(q.pd, |s| s.pd())
}

/// Where the QP's receives complete: its receive CQ, or an XRC target's message's SRQ's.
pub(crate) fn recv_cq<'a>(q: &'a QpInner, core: &'a QpCore) -> &'a dyn CompletionQueue {
    match core.xrc_srq.as_ref().and_then(|s| s.xrc()) {
        Some((_, cq, _)) => cq,
        None => &*q.recv_cq,
    }
}

/// XRC target: takes the SRQ the request's XRCETH names (IBA Annex A14). It must be a live XRC
/// SRQ of the QP's XRC domain and, within a message, the one the message started with;
/// otherwise the request is a Remote Access Error (Class C), as rxe's XRC responder and
/// qedr's XRC domain and XRCETH errors report it (the digest has no XRC rule).
fn take_xrc_srq(q: &QpInner, core: &mut QpCore, r: &Request<'_>) -> Result<(), Fail> {
    let named = r.xrc_srq.zip(q.xrcd);
    let cached = core.xrc_srq.as_ref().and_then(|s| s.xrc());
    if let (Some((srqn, _)), Some((n, _, live))) = (named, cached) {
        if n == srqn && live {
            return Ok(());
        }
    }
    if core.srq_bound || core.resp.in_msg.is_some() {
        return Err(access_fail());
    }
    // A new message: the named SRQ, or none, so that a refusal takes no WQE of the SRQ the
    // last message named (a Class C failure with Immediate Data binds one).
    core.xrc_srq = named.and_then(|(srqn, xrcd)| q.dev.xrc_srq(srqn, xrcd));
    if core.xrc_srq.is_none() {
        return Err(access_fail());
    }
    Ok(())
}

/// The PD a duplicate of an XRC target re-executes under (a Read is read again): that of the
/// SRQ it names, looked up without disturbing the message in progress; none (handle 0, which
/// no PD has) if that SRQ is gone.
fn duplicate_pd(q: &QpInner, r: &Request<'_>) -> u32 {
    r.xrc_srq.zip(q.xrcd).and_then(|(srqn, xrcd)| q.dev.xrc_srq(srqn, xrcd)).map_or(0, |s| s.pd())
}

/// Associates a receive WQE with the inbound message: the RQ head stays where it is; an SRQ
/// WQE moves to the QP. False when there is none.
fn bind_wqe(q: &QpInner, core: &mut QpCore) -> bool {
    match srq_of(q, &core.xrc_srq) {
        None => !core.rq.is_empty(),
        Some(srq) => {
            if !core.srq_bound {
                core.srq_bound = srq.take_into(&mut core.srq_wqe);
            }
            core.srq_bound
        }
    }
}

fn bound_wqe<'c>(q: &'c QpInner, core: &'c QpCore) -> Option<&'c crate::transport::wqe::RecvWqe> {
    if srq_of(q, &core.xrc_srq).is_some() {
        core.srq_bound.then_some(&core.srq_wqe)
    } else {
        core.rq.get(0)
    }
}

/// Retires the bound WQE and gives its WR ID.
fn retire_wqe(q: &QpInner, core: &mut QpCore) -> Option<u64> {
    if srq_of(q, &core.xrc_srq).is_some() {
        std::mem::take(&mut core.srq_bound).then_some(core.srq_wqe.wr_id)
    } else {
        let wr_id = core.rq.get(0).map(|w| w.wr_id);
        core.rq.pop();
        wr_id
    }
}

/// Retires the RQ head WQE in error (ERR-A-3, ERR-C-3); the flush that follows handles the
/// rest in order.
fn complete_wqe_in_use(q: &QpInner, core: &mut QpCore, status: WcStatus) {
    core.resp.in_msg = None;
    if let Some(wr_id) = retire_wqe(q, core) {
        let wc = Wc { wr_id, status, opcode: WcOpcode::Recv, qp_num: q.qpn, ..Default::default() };
        let _ = recv_cq(q, core).push(wc, true);
    }
}

/// ERR-RQ-13: the payload size each position allows.
pub(crate) fn length_ok(position: Position, len: u64, mtu: u64) -> bool {
    match position {
        Position::Only => len <= mtu,
        Position::First | Position::Middle => len == mtu,
        Position::Last => len >= 1 && len <= mtu,
    }
}

fn rc_request(q: &QpInner, core: &mut QpCore, r: &Request<'_>) -> Result<(), Fail> {
    let mtu = pmtu(core);
    // 1. PSN (PKT-PSN-4).
    match core.chan.recv.arrival(r.psn) {
        Arrival::Ignore => return Err(Fail::D), // PKT-PSN-6
        Arrival::SequenceError => return Err(Fail::B(Syndrome::Nak(NakCode::PsnSeqErr))), // ERR-RQ-1
        Arrival::Duplicate => return duplicate(q, core, r),
        Arrival::Expected => {}
    }
    // 2. Opcode sequence (ERR-RQ-7, ERR-RQ-8).
    let continuing = matches!(r.position, Position::Middle | Position::Last);
    match (&core.resp.in_msg, continuing) {
        (Some(_), false) | (None, true) => return Err(rc_fail_invalid()),
        (Some(InMsg::Send { .. }), true) if r.operation != Operation::Send => return Err(rc_fail_invalid()),
        (Some(InMsg::Write { .. }), true) if r.operation != Operation::RdmaWrite => return Err(rc_fail_invalid()),
        _ => {}
    }
    // 3. Supported and enabled (ERR-RQ-4, MOD-ACC-1..3, PKT-OP-3).
    if r.reserved || !enabled(core.attrs.qp_access_flags, r.operation) {
        return Err(rc_fail_invalid());
    }
    // 3b. XRC: the SRQ the request names (IBA Annex A14).
    if q.qp_type == QpType::XrcRecv {
        take_xrc_srq(q, core, r)?;
    }
    match r.operation {
        Operation::Send => rc_send(q, core, r, mtu),
        Operation::RdmaWrite => rc_write(q, core, r, mtu),
        Operation::RdmaReadRequest => rc_read(q, core, r, mtu),
        Operation::AtomicWrite => rc_atomic_write(q, core, r),
        _ => rc_atomic(q, core, r),
    }
}

/// 4..7 for a Send: an RQ WQE (or RNR NAK), lengths, then the copy.
fn rc_send(q: &QpInner, core: &mut QpCore, r: &Request<'_>, mtu: u64) -> Result<(), Fail> {
    if core.resp.in_msg.is_none() {
        if !bind_wqe(q, core) {
            // ERR-RQ-3: no WQE: RNR NAK with our Minimum RNR NAK Timer (PKT-RNR-1).
            return Err(Fail::B(Syndrome::RnrNak { timer_code: core.attrs.min_rnr_timer }));
        }
        // The head WQE is in use from here on: a later failure completes it in error.
        core.resp.in_msg = Some(InMsg::Send { offset: 0 });
        take_scatter(q, core).map_err(|_| Fail::A)?; // ERR-RQ-2
    }
    if !length_ok(r.position, r.payload.len() as u64, mtu) {
        return Err(rc_fail_invalid()); // ERR-RQ-13
    }
    let Some(InMsg::Send { offset }) = core.resp.in_msg else { return Err(rc_fail_invalid()) };
    recheck_scatter(q, core).map_err(|_| Fail::A)?; // ERR-RQ-2, as at the first packet
    let capacity: u64 = core.resp.scatter.iter().map(|m| m.len() as u64).sum();
    if offset + r.payload.len() as u64 > capacity {
        return Err(rc_fail_invalid()); // ERR-RQ-11
    }
    let last = matches!(r.position, Position::Last | Position::Only);
    let invalidate = r.invalidate.filter(|_| last);
    // Send with Invalidate: an R_Key this QP cannot invalidate (not a type 2 window bound to
    // it) is an Invalid Request: the receive WQE fails and the QP moves to Error (Class C),
    // the packet's payload unwritten (ERR-C-7). Checked before the payload lands; done after.
    let pd = request_pd(q, core);
    if invalidate.is_some_and(|rkey| q.dev.invalidate(pd, q.qpn, rkey, false).is_err()) {
        return Err(rc_fail_invalid());
    }
    scatter(&core.resp.scatter, offset, r.payload).map_err(|_| Fail::A)?;
    // The R_Key is invalid before the CQE says so (IBA 10.6.7.2); a bind or invalidation
    // between the check and here makes it an Invalid Request after all.
    if invalidate.is_some_and(|rkey| q.dev.invalidate(pd, q.qpn, rkey, true).is_err()) {
        return Err(rc_fail_invalid());
    }
    let offset = offset + r.payload.len() as u64;
    core.resp.in_msg = Some(InMsg::Send { offset });
    accept(core, r);
    if last {
        core.resp.in_msg = None;
        core.chan.recv.message_done();
        complete_recv(q, core, WcOpcode::Recv, offset, r)?;
    }
    Ok(())
}

/// The scatter list a Send is filling, checked again before its next packet lands if any key
/// was revoked since (the device's key generation moved: one atomic load), as the requester
/// checks its own buffers again (`requester::recheck_local`): a region deregistered or
/// invalidated under the message is not written (a C program may have freed it).
fn recheck_scatter(q: &QpInner, core: &mut QpCore) -> Result<(), AccessError> {
    if q.dev.key_generation() == core.resp.scatter_gen {
        return Ok(());
    }
    take_scatter(q, core)
}

/// Checks the RQ head WQE's scatter list with local write access (ERR-RQ-2 when unusable).
fn take_scatter(q: &QpInner, core: &mut QpCore) -> Result<(), AccessError> {
    core.resp.scatter_gen = q.dev.key_generation();
    // SRQ WQEs are checked against the SRQ's PD.
    let pd = srq_of(q, &core.xrc_srq).map_or(q.pd, |s| s.pd());
    let mut list = std::mem::take(&mut core.resp.scatter);
    list.clear();
    let Some(w) = bound_wqe(q, core) else {
        core.resp.scatter = list;
        return Err(AccessError::BadKey);
    };
    for sge in &w.sges {
        if sge.length == 0 {
            continue;
        }
        match q.dev.check_access(sge.lkey, pd, q.qpn, sge.addr, sge.length as u64, Access::LOCAL_WRITE) {
            Ok(m) => list.push(m),
            Err(e) => {
                core.resp.scatter = list;
                return Err(e);
            }
        }
    }
    core.resp.scatter = list;
    Ok(())
}

/// The packet is executed: ePSN moves on (PKT-PSN-3) and an ACK is owed if asked
/// (PKT-ACK-3).
fn accept(core: &mut QpCore, r: &Request<'_>) {
    core.chan.recv.epsn = r.psn.next().value();
    if r.ack_req {
        core.chan.out.push_ack((), r.psn.value(), Syndrome::ACK_NO_CREDITS);
    }
}

/// Retires the RQ head WQE successfully (ORD-RQ-4). A CQ that cannot take the CQE is Class G:
/// the QP moves to Error with no CQE at all (ERR-G-1..4).
fn complete_recv(q: &QpInner, core: &mut QpCore, opcode: WcOpcode, byte_len: u64, r: &Request<'_>) -> Result<(), Fail> {
    if !bind_wqe(q, core) {
        return Ok(());
    }
    let Some(wr_id) = retire_wqe(q, core) else { return Ok(()) };
    let mut wc = Wc { wr_id, status: WcStatus::Success, opcode, qp_num: q.qpn, ..Default::default() };
    wc.byte_len = byte_len as u32;
    if let Some(imm) = r.imm {
        wc.imm_data = imm;
        wc.wc_flags |= WcFlags::WITH_IMM;
    }
    if let Some(rkey) = r.invalidate {
        wc.imm_data = rkey;
        wc.wc_flags |= WcFlags::WITH_INV;
    }
    // PKT-ROCE-11: every RoCEv2 packet has network headers, so the GRH present flag is set
    // for UD (CQE-13) and, where the digest leaves it undefined (RC, UC), as Linux's rxe and
    // ConnectX's RoCE set it there too.
    wc.wc_flags |= WcFlags::GRH;
    if q.qp_type == QpType::Ud {
        wc.src_qp = r.src_qp;
        wc.network_hdr_type = match r.grh {
            Some(g) if crate::wire::roce::ud_grh_is_ipv6(&g) => NetworkHdrType::Ipv6,
            Some(_) => NetworkHdrType::Ipv4,
            None => NetworkHdrType::Ib,
        };
        wc.pkey_index = r.pkey_index; // CQE-14: for the GSI, the entry the P_Key matched
    }
    if recv_cq(q, core).push(wc, r.se).is_err() {
        q.enter_error(core, false);
    }
    Ok(())
}

fn rc_write(q: &QpInner, core: &mut QpCore, r: &Request<'_>, mtu: u64) -> Result<(), Fail> {
    let len = r.payload.len() as u64;
    // Write with Immediate needs an RQ WQE for its last packet: resources come before lengths
    // (PKT-VAL-12), so that a packet with both faults is RNR NAKed.
    let completes = matches!(r.position, Position::Last | Position::Only);
    if completes && r.imm.is_some() && !bind_wqe(q, core) {
        return Err(Fail::B(Syndrome::RnrNak { timer_code: core.attrs.min_rnr_timer }));
    }
    if !length_ok(r.position, len, mtu) {
        return Err(rc_fail_invalid()); // ERR-RQ-13
    }
    if core.resp.in_msg.is_none() {
        let (grant, total) = begin_write(&*q.dev, request_pd(q, core), q.qpn, r, len).map_err(rc_refused)?;
        core.resp.in_msg = Some(InMsg::Write { grant, offset: 0, len: total });
    }
    let Some(InMsg::Write { mut grant, offset, len: total }) = core.resp.in_msg.take() else {
        return Err(rc_fail_invalid());
    };
    let end = offset + len;
    if end > total || (completes && end != total) {
        return Err(rc_fail_invalid()); // ERR-RQ-12
    }
    if let Some(g) = &mut grant {
        let (m, at) = g.bytes(&*q.dev, offset, len).ok_or(access_fail())?;
        // A page an on-demand region lacks is the R_Key's failure (an HCA's unserved page
        // fault); anything else here is the packet's.
        m.write(at, r.payload).map_err(|e| match e {
            AccessError::PageFault => access_fail(),
            _ => rc_fail_invalid(),
        })?;
    }
    accept(core, r);
    if completes {
        core.chan.recv.message_done();
        if r.imm.is_some() {
            complete_recv(q, core, WcOpcode::RecvRdmaWithImm, total, r)?; // WR-WRITE-3, CQE-6
        }
    } else {
        core.resp.in_msg = Some(InMsg::Write { grant, offset: end, len: total });
    }
    Ok(())
}

/// A Read's key stopped covering its bytes between the request and a response: the QP moves
/// to Error with the affiliated Local Access Violation error (ERR-C-2, ERR-C-5, ERR-C-6).
pub(crate) fn access_lost(q: &QpInner, core: &mut QpCore) {
    q.dev.raise(AsyncEvent { event_type: AsyncEventType::QpAccessErr, element: EventElement::Qp(q.qpn) });
    q.enter_error(core, true);
}

fn access_fail() -> Fail {
    Fail::C { nak: NakCode::RemoteAccessError, status: WcStatus::RemAccessErr, access: true }
}

/// An inbound request for this RC QP, as the channel's executors take it.
fn inbound<'q>(q: &'q QpInner, core: &QpCore) -> Inbound<'q, ()> {
    Inbound { to: (), dev: &*q.dev, pd: request_pd(q, core), qpn: q.qpn, depth: core.attrs.max_dest_rd_atomic }
}

fn rc_read(q: &QpInner, core: &mut QpCore, r: &Request<'_>, mtu: u64) -> Result<(), Fail> {
    let t = inbound(q, core);
    if !core.chan.out.has_room(t.depth) {
        return Err(rc_fail_invalid()); // ERR-RQ-6
    }
    let npkts = core.chan.out.read(&t, r, mtu).map_err(rc_refused)?;
    core.chan.recv.epsn = r.psn.add(npkts).value(); // PKT-PSN-3
    core.chan.recv.message_done(); // PKT-ACK-14
    Ok(())
}

fn rc_atomic(q: &QpInner, core: &mut QpCore, r: &Request<'_>) -> Result<(), Fail> {
    let t = inbound(q, core);
    if !core.chan.out.has_room(t.depth) {
        return Err(rc_fail_invalid()); // ERR-RQ-6
    }
    core.chan.out.atomic(&t, r).map_err(rc_refused)?;
    core.chan.recv.epsn = r.psn.next().value();
    core.chan.recv.message_done();
    Ok(())
}

fn rc_atomic_write(q: &QpInner, core: &mut QpCore, r: &Request<'_>) -> Result<(), Fail> {
    let t = inbound(q, core);
    if !core.chan.out.has_room(t.depth) {
        return Err(rc_fail_invalid()); // ERR-RQ-6: it takes a resource, as an Atomic
    }
    core.chan.out.atomic_write(&t, r).map_err(rc_refused)?;
    core.chan.recv.epsn = r.psn.next().value();
    core.chan.recv.message_done();
    Ok(())
}

/// Whether the QP's (or for RD, the destination QP's) enables allow an inbound `operation`
/// (MOD-ACC-1..3; a Send needs none; an Atomic Write needs Remote Write, as rxe asks).
pub(crate) fn enabled(acc: Access, operation: Operation) -> bool {
    match operation {
        Operation::Send => true,
        Operation::RdmaWrite | Operation::AtomicWrite => acc.contains(Access::REMOTE_WRITE),
        Operation::RdmaReadRequest => acc.contains(Access::REMOTE_READ),
        Operation::CompareSwap | Operation::FetchAdd => acc.contains(Access::REMOTE_ATOMIC),
        _ => false,
    }
}

/// Executes an Atomic on the 8 bytes `mem` covers and returns the original value; `None` when
/// they are not an aligned word. WR-ATOM-4, WR-ATOM-5, WR-ATOM-7: real 64-bit atomics on host
/// memory, atomic against the application too. The operands are big-endian on the wire and the
/// word is in host order in memory.
pub(crate) fn execute_atomic(mem: &MemRef, is_cas: bool, a: &AtomicEthRepr) -> Option<u64> {
    let word = mem.atomic_u64()?;
    Some(if is_cas {
        match word.compare_exchange(a.compare_data, a.swap_add_data, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(v) | Err(v) => v,
        }
    } else {
        word.fetch_add(a.swap_add_data, Ordering::SeqCst)
    })
}

/// Whether a duplicate Read request asks for the rest of a saved Read from its response `k`:
/// the VA and length `k` packets of `mtu` in (PKT-DUP-3). The peer chose every number here.
pub(crate) fn read_rest_matches(va: u64, len: u64, mtu: u64, k: u64, req_va: u64, req_len: u32) -> bool {
    let Some(skip) = k.checked_mul(mtu).filter(|&s| s <= len) else { return false };
    req_va == va.wrapping_add(skip) && req_len as u64 == len - skip
}

/// Duplicates are never executed again and never change ePSN (PKT-DUP-1..6); see
/// `Outbox::duplicate`. One that nothing holds is dropped (PKT-DUP-3, ERR-RQ-14).
fn duplicate(q: &QpInner, core: &mut QpCore, r: &Request<'_>) -> Result<(), Fail> {
    let last = Psn::new(core.chan.recv.epsn).sub(1).value();
    let mut t = inbound(q, core);
    if q.qp_type == QpType::XrcRecv {
        t.pd = duplicate_pd(q, r);
    }
    match core.chan.out.duplicate(&t, r, last) {
        true => Ok(()),
        false => Err(Fail::D),
    }
}

/// UC: no ACKs; a loss abandons the message and waits for the next First or Only
/// (PKT-UC-1, PKT-UC-2, PKT-UC-4); a message with no RQ WQE is dropped (PKT-RNR-7).
fn uc_request(q: &QpInner, core: &mut QpCore, r: &Request<'_>) {
    let mtu = pmtu(core);
    let starts = matches!(r.position, Position::First | Position::Only);
    let expected = r.psn == Psn::new(core.chan.recv.epsn);
    if !expected || (core.resp.in_msg.is_none() && !starts) || (core.resp.in_msg.is_some() && starts) {
        if core.resp.in_msg.take().is_some() || !expected {
            core.resp.uc_resync = true;
        }
        if !starts {
            return;
        }
    }
    if core.resp.uc_resync && !starts {
        return;
    }
    core.resp.uc_resync = false;
    core.chan.recv.epsn = r.psn.next().value();
    let drop_message = |core: &mut QpCore| {
        core.resp.in_msg = None;
        core.resp.uc_resync = true;
    };
    if !length_ok(r.position, r.payload.len() as u64, mtu) || r.reserved {
        drop_message(core);
        return;
    }
    match r.operation {
        Operation::Send => {
            if starts {
                if !bind_wqe(q, core) {
                    drop_message(core); // PKT-RNR-7
                    return;
                }
                core.resp.in_msg = Some(InMsg::Send { offset: 0 });
            }
            let Some(InMsg::Send { offset }) = core.resp.in_msg else { return drop_message(core) };
            // The WQE's scatter list, checked at the first packet and again at a later one
            // if a key was revoked since. Unusable: Class A, as for RC (ERR-RQ-2, ERR-A-2,
            // ERR-A-3) without the NAK: the WQE completes in error and the QP moves to Error,
            // rather than sitting at the head and swallowing every later message.
            let usable = if starts { take_scatter(q, core) } else { recheck_scatter(q, core) };
            if usable.is_err() {
                complete_wqe_in_use(q, core, WcStatus::LocQpOpErr);
                q.enter_error(core, true);
                return;
            }
            if scatter(&core.resp.scatter, offset, r.payload).is_err() {
                drop_message(core);
                return;
            }
            let offset = offset + r.payload.len() as u64;
            core.resp.in_msg = Some(InMsg::Send { offset });
            if matches!(r.position, Position::Last | Position::Only) {
                core.resp.in_msg = None;
                let _ = complete_recv(q, core, WcOpcode::Recv, offset, r);
            }
        }
        Operation::RdmaWrite => {
            if !core.attrs.qp_access_flags.contains(Access::REMOTE_WRITE) {
                drop_message(core); // MOD-ACC-4
                return;
            }
            if starts {
                let Ok((grant, total)) = begin_write(&*q.dev, q.pd, q.qpn, r, r.payload.len() as u64) else {
                    return drop_message(core);
                };
                core.resp.in_msg = Some(InMsg::Write { grant, offset: 0, len: total });
            }
            let Some(InMsg::Write { mut grant, offset, len }) = core.resp.in_msg.take() else {
                return drop_message(core);
            };
            let end = offset + r.payload.len() as u64;
            let completes = matches!(r.position, Position::Last | Position::Only);
            if end > len || (completes && end != len) {
                return drop_message(core);
            }
            // With Immediate and no RQ WQE the packet is dropped before it touches memory
            // (PKT-RNR-7: silently dropped), as RC checks the WQE first (PKT-VAL-12).
            if completes && r.imm.is_some() && !bind_wqe(q, core) {
                return drop_message(core);
            }
            if let Some(g) = &mut grant {
                match g.bytes(&*q.dev, offset, r.payload.len() as u64) {
                    Some((m, at)) if m.write(at, r.payload).is_ok() => {}
                    _ => return drop_message(core),
                }
            }
            if completes {
                if r.imm.is_some() {
                    let _ = complete_recv(q, core, WcOpcode::RecvRdmaWithImm, len, r);
                }
            } else {
                core.resp.in_msg = Some(InMsg::Write { grant, offset: end, len });
            }
        }
        _ => drop_message(core),
    }
}

/// A raw packet for a Raw QP (IBA's Raw datagram service): no transport header to check; the
/// whole packet (Ethernet frame or IPv6 datagram) lands in the next receive WQE, whose CQE
/// gives its length. Taken in RTR and after (PKT-VAL-5, as any request); with no receive WQE
/// it is dropped (unreliable, as UD's, PKT-RNR-7). False when this QP did not take it.
pub(crate) fn on_raw(q: &QpInner, core: &mut QpCore, packet: &[u8]) -> bool {
    if !matches!(core.attrs.qp_state, QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe) {
        return false;
    }
    if !bind_wqe(q, core) {
        return false;
    }
    if take_scatter(q, core).is_err() {
        complete_wqe_in_use(q, core, WcStatus::LocProtErr);
        q.enter_error(core, true);
        return true;
    }
    let capacity: u64 = core.resp.scatter.iter().map(|m| m.len() as u64).sum();
    if packet.len() as u64 > capacity {
        complete_wqe_in_use(q, core, WcStatus::LocLenErr);
        q.enter_error(core, true);
        return true;
    }
    if scatter(&core.resp.scatter, 0, packet).is_err() {
        complete_wqe_in_use(q, core, WcStatus::LocProtErr);
        q.enter_error(core, true);
        return true;
    }
    let Some(wr_id) = retire_wqe(q, core) else { return true };
    let wc = Wc {
        wr_id,
        status: WcStatus::Success,
        opcode: WcOpcode::Recv,
        qp_num: q.qpn,
        byte_len: packet.len() as u32,
        ..Default::default()
    };
    if q.recv_cq.push(wc, false).is_err() {
        q.enter_error(core, false);
    }
    true
}

/// UD: no PSN check (PKT-UD-1); the first 40 bytes of the receive buffers take the GRH area
/// and the data starts at byte 40 (WR-RQ-7, WR-RQ-8, CQE-7).
fn ud_request(q: &QpInner, core: &mut QpCore, r: &Request<'_>) {
    if r.operation != Operation::Send || r.position != Position::Only {
        return;
    }
    // A UD message is one packet of at most the MTU (PKT-LEN-1): the port's, since UD has no
    // path of its own. Anything longer is dropped before it takes a receive WQE.
    if r.payload.len() > q.dev.active_mtu().bytes() as usize {
        return;
    }
    if !bind_wqe(q, core) {
        return; // PKT-RNR-7
    }
    if take_scatter(q, core).is_err() {
        complete_wqe_in_use(q, core, WcStatus::LocProtErr);
        q.enter_error(core, true);
        return;
    }
    let capacity: u64 = core.resp.scatter.iter().map(|m| m.len() as u64).sum();
    let total = 40 + r.payload.len() as u64;
    if total > capacity {
        complete_wqe_in_use(q, core, WcStatus::LocLenErr);
        q.enter_error(core, true);
        return;
    }
    let grh = r.grh.unwrap_or([0; 40]);
    if scatter(&core.resp.scatter, 0, &grh).is_err() || scatter(&core.resp.scatter, 40, r.payload).is_err() {
        complete_wqe_in_use(q, core, WcStatus::LocProtErr);
        q.enter_error(core, true);
        return;
    }
    let _ = complete_recv(q, core, WcOpcode::Recv, total, r);
}
