//! The Reliable Datagram service. An RD QP hands its SQ head WQE to the local EEC the WR
//! names (WR-SEND-6); the EEC's Send Logic carries one message at a time, with PSNs, ACKs,
//! timeouts and retries of its own, and the QP starts its next WQE only once that message has
//! completed (ORD-SQ-5). The EEC's Receive Logic checks each request against the channel's
//! ePSN and executes it for the QP the BTH names, with that QP's Q_Key, RDD, enables, PD and
//! receive queue. A Send binds the QP's RQ head to the channel at its first packet and the RQ
//! head advances at once (ORD-RD-1), so two channels fill two WQEs of one QP concurrently and
//! complete them in the order their messages end (ORD-RD-2, ORD-RD-3).
//!
//! After a fatal NAK, or when the QP of a message in flight is flushed, the requester EEC
//! sends a Resync: the responder, which discards requests after a fatal NAK, takes the
//! Resync's PSN as its new ePSN and aborts any message in progress (Remote Aborted Error).
//! When retries run out the EEC moves straight to Error (QPS-RD-6).
//!
//! Locks: a QP before an EEC. Everything the EEC sends is emitted under the EEC's lock alone;
//! starting and completing a WQE happen under both, in the QP's turn or on a response.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::verbs::device::DeviceInner;
use crate::verbs::eec::{EecAttrs, EecCore, EecInner};
use crate::verbs::mr::{check_access, MemRef};
use crate::verbs::qp::{wc_opcode_of, QpCore, QpInner};
use crate::verbs::types::{Access, Gid, QpState, QpType, Wc, WcFlags, WcOpcode, WcStatus};
use crate::verbs::wr::{SendFlags, SendWqe, WrOpcode};
use crate::wire::aeth::{rnr_timer_us, NakCode, Syndrome};
use crate::wire::opcode::{Operation, Position};
use crate::wire::psn::{Psn, PsnClass};
use crate::wire::roce::RoceDatagram;
use crate::wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, ImmDtRepr, Opcode, PacketRepr, RdethRepr, RethRepr,
};

use super::completer::{scatter, Response};
use super::engine::{emit, gather, ip_for, pkey_match, send_opcode, RESPONSE_BURST};
use super::requester::{ack_timeout_ns, check_local, ACK_EVERY, WINDOW};
use super::responder::{length_ok, Request, RespJob};

/// An RD QP's side of the service, kept in its `QpCore`.
#[derive(Debug, Default, Clone)]
pub(crate) struct RdQp {
    /// The EEC carrying the SQ head WQE, while one does.
    pub active: Option<u32>,
    /// RQ WQEs bound to a channel's inbound message: (EECN, bind token, WR ID), in bind order.
    pub held: Vec<(u32, u64, u64)>,
    pub next_token: u64,
}

/// The message an EEC's Send Logic is carrying.
struct RdTx {
    /// The QP whose SQ head this is and its `rd_epoch` at the start; `None` for a Resync.
    owner: Option<(Arc<QpInner>, u64)>,
    wqe: SendWqe,
    src_qp: u32,
    q_key: u32,
    first_psn: u32,
    /// PSNs the message uses: its request packets, or its response packets for a Read.
    npkts: u32,
    /// The packet to transmit next, as an index into the message; `npkts` when all are out.
    next: u32,
    /// Packets acknowledged (Send, Write) or responses received (Read).
    done: u32,
    status: Option<WcStatus>,
    /// At least one packet has left: aborting the message needs a Resync.
    sent: bool,
    /// A fatal NAK ended the message: a Resync follows it.
    resync_after: bool,
}

/// The message an EEC's Receive Logic is receiving.
#[derive(Debug)]
enum RxMsg {
    /// A Send into an RQ WQE of `qpn` the channel holds under `token`.
    Send {
        token: u64,
        wr_id: u64,
        scatter: Vec<MemRef>,
        offset: u64,
    },
    Write {
        mem: Option<MemRef>,
        offset: u64,
        len: u64,
    },
}

#[derive(Debug)]
struct RdRx {
    qpn: u32,
    src_qp: u32,
    msg: RxMsg,
}

/// The last RDMA Read or Atomic the Receive Logic executed, replayed to a duplicate.
#[derive(Debug, Clone, Copy)]
enum Executed {
    Read { psn: u32, qpn: u32, va: u64, rkey: u32, len: u64, npkts: u32 },
    Atomic { psn: u32, orig: u64 },
}

/// A response waiting to leave: from QP `from` to QP `to`.
#[derive(Debug)]
struct Out {
    from: u32,
    to: u32,
    job: RespJob,
}

/// An EEC's Send Logic and Receive Logic.
#[derive(Default)]
pub(crate) struct EecEngine {
    psn: u32,
    tx: Option<RdTx>,
    retry_left: u8,
    rnr_left: u8,
    ack_deadline: Option<u64>,
    rnr_deadline: Option<u64>,
    /// Went back to this packet and waits for it to be answered: later responses still in
    /// flight from before must not count as new NAKs.
    recovering: Option<u32>,
    epsn: u32,
    msn: u32,
    nak_sent: bool,
    /// A fatal NAK went out: requests are discarded until the requester's Resync.
    want_resync: bool,
    rx: Option<RdRx>,
    last: Option<Executed>,
    out: VecDeque<Out>,
    /// Responses sent in a row (see `engine::RESPONSE_BURST`).
    resp_streak: u8,
}

impl EecEngine {
    /// Applies a state change made by Modify EEC.
    pub fn on_modify(&mut self, _eec: &EecInner, from: QpState, a: &EecAttrs) {
        match (from, a.state) {
            (_, QpState::Reset) => *self = EecEngine::default(),
            (_, QpState::Error) => {
                self.ack_deadline = None;
                self.rnr_deadline = None;
                self.out.clear();
            }
            (QpState::Init, QpState::Rtr) => {
                self.epsn = a.rq_psn;
                self.msn = 0;
            }
            (QpState::Rtr, QpState::Rts) => {
                self.psn = a.sq_psn;
                self.retry_left = a.retry_cnt;
                self.rnr_left = a.rnr_retry;
            }
            _ => {}
        }
    }

    fn owner_is(&self, q: &QpInner) -> bool {
        matches!(&self.tx, Some(RdTx { owner: Some((o, _)), .. }) if o.qpn == q.qpn && std::ptr::eq(&**o, q))
    }
}

fn arm(dev: &DeviceInner, slot: &mut Option<u64>, at: Option<u64>) {
    *slot = at;
    if let Some(t) = at {
        dev.timer_hint.fetch_min(t, Ordering::AcqRel);
    }
}

fn find_eec(dev: &DeviceInner, eecn: u32) -> Option<Arc<EecInner>> {
    dev.eecs.read().unwrap_or_else(|e| e.into_inner()).get(&eecn).cloned()
}

fn mtu_of(a: &EecAttrs) -> u64 {
    a.av.map_or(1024, |av| av.path_mtu.bytes() as u64)
}

/// An RD QP's turn in the engine: completes receive WQEs whose channel went away, completes
/// or fails the SQ head's message, or hands the SQ head to its EEC and sends the first packet.
pub(crate) fn qp_turn(q: &Arc<QpInner>, core: &mut QpCore, now: u64, buf: &mut [u8]) -> Option<usize> {
    reap_held(q, core);
    let state = core.attrs.qp_state;
    if !matches!(state, QpState::Rts | QpState::Sqd) {
        return None;
    }
    loop {
        let head = core.sq.get(0)?;
        if let Some(eecn) = core.rd.active {
            let Some(eec) = find_eec(&q.dev, eecn) else {
                fail_head(q, core, WcStatus::InvEecStateErr);
                return None;
            };
            let mut ec = eec.lock();
            if !ec.engine.owner_is(q) {
                drop(ec);
                fail_head(q, core, WcStatus::InvEecStateErr);
                return None;
            }
            if ec.destroyed || !matches!(ec.attrs.state, QpState::Rts | QpState::Sqd) {
                // QPS-RD-4, QPS-RD-5: the EEC went to Error under the message.
                let status = ec.engine.tx.as_ref().and_then(|t| t.status).unwrap_or(WcStatus::InvEecStateErr);
                ec.engine.tx = None;
                drop(ec);
                fail_head(q, core, status);
                return None;
            }
            if let Some(status) = ec.engine.tx.as_ref().and_then(|t| t.status) {
                finish(q, core, &mut ec, status);
                continue;
            }
            return None; // in flight: the EEC's own turn sends the rest
        }
        // A new message: QPS-SQD-3 keeps SQD from starting one.
        if state == QpState::Sqd {
            return None;
        }
        if let Some(b) = &head.bind {
            // A bind is local: it takes effect and completes in order, with no packet.
            let status = match crate::verbs::mw::bind(&q.dev, q.pd.inner.handle, b) {
                Ok(()) => WcStatus::Success,
                Err(s) => s,
            };
            retire_head(q, core, status);
            if status != WcStatus::Success {
                return None;
            }
            continue;
        }
        let eecn = head.eecn;
        let Some(eec) = find_eec(&q.dev, eecn) else {
            fail_head(q, core, WcStatus::InvEecnErr);
            return None;
        };
        if q.rdd.as_ref() != Some(&eec.rdd) {
            fail_head(q, core, WcStatus::LocRddViolErr);
            return None;
        }
        let mut ec = eec.lock();
        match ec.attrs.state {
            _ if ec.destroyed => {
                drop(ec);
                fail_head(q, core, WcStatus::InvEecnErr);
                return None;
            }
            QpState::Rts => {}
            QpState::Sqd => return None, // QPS-RD-3: held while the EEC stays in SQD
            _ => {
                // QPS-RD-1, QPS-RD-2, QPS-RD-4, QPS-RD-5
                drop(ec);
                fail_head(q, core, WcStatus::InvEecStateErr);
                return None;
            }
        }
        if ec.engine.tx.is_some() {
            return None; // the channel carries another QP's message: wait
        }
        let mut w = head.clone();
        if let Err(status) = check_local(q, core, &mut w) {
            drop(ec);
            fail_head(q, core, status);
            return None;
        }
        let mtu = mtu_of(&ec.attrs);
        let npkts = match w.opcode {
            WrOpcode::AtomicCmpSwp | WrOpcode::AtomicFetchAdd => 1,
            _ => w.length.div_ceil(mtu).max(1) as u32,
        };
        if (w.opcode == WrOpcode::RdmaRead || w.opcode.is_atomic()) && ec.attrs.max_rd_atomic == 0 {
            drop(ec);
            fail_head(q, core, WcStatus::LocQpOpErr); // an outbound depth of 0 allows none
            return None;
        }
        // WR-SEND-4, WR-SEND-5: a Q_Key with its msb set means "use the QP's own".
        let q_key = if w.remote_qkey & 0x8000_0000 != 0 { core.attrs.qkey } else { w.remote_qkey };
        let e = &mut ec.engine;
        let first_psn = e.psn;
        e.psn = Psn::new(e.psn).add(npkts).value();
        e.tx = Some(RdTx {
            owner: Some((q.clone(), q.rd_epoch.load(Ordering::Acquire))),
            wqe: w,
            src_qp: q.qpn,
            q_key,
            first_psn,
            npkts,
            next: 0,
            done: 0,
            status: None,
            sent: false,
            resync_after: false,
        });
        e.recovering = None;
        core.rd.active = Some(eecn);
        core.req.started = 1;
        return emit_request(&eec, &mut ec, now, buf);
    }
}

/// Completes, with Flush Error, the receive WQEs held by a channel that can no longer
/// finish them: its EEC is gone, or in Reset, Init or Error.
fn reap_held(q: &QpInner, core: &mut QpCore) {
    if core.rd.held.is_empty() {
        return;
    }
    let mut i = 0;
    while i < core.rd.held.len() {
        let (eecn, token, wr_id) = core.rd.held[i];
        let alive = find_eec(&q.dev, eecn).is_some_and(|eec| {
            let ec = eec.lock();
            !ec.destroyed
                && matches!(ec.attrs.state, QpState::Rtr | QpState::Rts | QpState::Sqd)
                && matches!(&ec.engine.rx, Some(RdRx { qpn, msg: RxMsg::Send { token: t, .. }, .. }) if *qpn == q.qpn && *t == token)
        });
        if alive {
            i += 1;
            continue;
        }
        core.rd.held.remove(i);
        let wc =
            Wc { wr_id, status: WcStatus::WrFlushErr, opcode: WcOpcode::Recv, qp_num: q.qpn, ..Default::default() };
        let _ = q.recv_cq.push(wc, true);
    }
}

/// Retires the SQ head with `status`: a CQE when signaled or unsuccessful (WR-COM-2..4).
fn retire_head(q: &QpInner, core: &mut QpCore, status: WcStatus) {
    let Some(w) = core.sq.get(0) else { return };
    let wc = Wc {
        wr_id: w.wr_id,
        status,
        opcode: wc_opcode_of(w.opcode),
        byte_len: if w.opcode.is_atomic() { 8 } else { w.length as u32 },
        qp_num: q.qpn,
        ..Default::default()
    };
    let report = status != WcStatus::Success || w.signaled;
    core.sq.pop();
    core.rd.active = None;
    core.req.started = 0;
    if report && q.send_cq.push(wc, status != WcStatus::Success).is_err() {
        q.enter_error(core, false); // CQ-OVF-2
        return;
    }
    if status != WcStatus::Success {
        q.enter_sqe(core); // ERR-SQ-1, QPT-AUTO-1, QPT-AUTO-2
        return;
    }
    q.check_drained(core);
}

/// Fails the SQ head before or after its EEC took it.
fn fail_head(q: &QpInner, core: &mut QpCore, status: WcStatus) {
    retire_head(q, core, status);
}

/// The EEC's message is over: the WQE retires and the channel is free, or carries the Resync
/// a fatal NAK calls for.
fn finish(q: &QpInner, core: &mut QpCore, ec: &mut EecCore, status: WcStatus) {
    let Some(tx) = ec.engine.tx.take() else { return };
    ec.engine.ack_deadline = None;
    ec.engine.rnr_deadline = None;
    ec.engine.recovering = None;
    if tx.resync_after {
        start_resync(&mut ec.engine, &tx);
    }
    retire_head(q, core, status);
}

fn start_resync(e: &mut EecEngine, old: &RdTx) {
    let first_psn = e.psn;
    e.psn = Psn::new(e.psn).next().value();
    let wqe = SendWqe { opcode: WrOpcode::Resync, remote_qpn: old.wqe.remote_qpn, ..Default::default() };
    e.tx = Some(RdTx {
        owner: None,
        wqe,
        src_qp: old.src_qp,
        q_key: old.q_key,
        first_psn,
        npkts: 1,
        next: 0,
        done: 0,
        status: None,
        sent: false,
        resync_after: false,
    });
}

/// A message whose QP was flushed or reset under it: a message that has not left is dropped,
/// one that has is followed by a Resync so that the responder's ePSN catches up.
fn abandon_if_orphaned(e: &mut EecEngine) {
    let orphaned =
        matches!(&e.tx, Some(RdTx { owner: Some((q, epoch)), .. }) if q.rd_epoch.load(Ordering::Acquire) != *epoch);
    if !orphaned {
        return;
    }
    let Some(tx) = e.tx.take() else { return };
    e.ack_deadline = None;
    e.rnr_deadline = None;
    if tx.sent {
        start_resync(e, &tx);
    } else {
        e.psn = tx.first_psn;
    }
}

/// The EECs' turn: responses first, then the next request packet of each channel's message.
pub(crate) fn transmit(dev: &DeviceInner, now: u64, buf: &mut [u8]) -> Option<usize> {
    if dev.counts.eec.load(Ordering::Relaxed) == 0 {
        return None; // no RD here: keep the EEC table's lock off the other services' path
    }
    let eecs: Vec<Arc<EecInner>> = {
        let map = dev.eecs.read().unwrap_or_else(|e| e.into_inner());
        if map.is_empty() {
            return None;
        }
        let start = dev.eec_cursor.load(Ordering::Relaxed);
        map.range(start..).chain(map.range(..start)).map(|(_, e)| e.clone()).collect()
    };
    for eec in &eecs {
        let mut ec = eec.lock();
        if ec.destroyed || matches!(ec.attrs.state, QpState::Reset | QpState::Init | QpState::Error) {
            continue;
        }
        if ec.engine.resp_streak < RESPONSE_BURST {
            if let Some(len) = emit_response(eec, &mut ec, buf) {
                ec.engine.resp_streak += 1;
                return Some(len);
            }
        }
        if ec.attrs.state != QpState::Rtr {
            abandon_if_orphaned(&mut ec.engine);
            if let Some(len) = emit_request(eec, &mut ec, now, buf) {
                ec.engine.resp_streak = 0;
                dev.eec_cursor.store(eec.eecn.wrapping_add(1), Ordering::Relaxed);
                return Some(len);
            }
        }
        if let Some(len) = emit_response(eec, &mut ec, buf) {
            ec.engine.resp_streak = 1;
            return Some(len);
        }
    }
    None
}

/// Sends the next packet of the channel's message, if the window and the RNR wait allow.
fn emit_request(eec: &EecInner, ec: &mut EecCore, now: u64, buf: &mut [u8]) -> Option<usize> {
    let dev = &eec.dev;
    let mtu = mtu_of(&ec.attrs);
    let attrs = ec.attrs.clone();
    let e = &mut ec.engine;
    if e.rnr_deadline.is_some() {
        return None;
    }
    let tx = e.tx.as_mut()?;
    if tx.status.is_some() || tx.next >= tx.npkts || tx.next.saturating_sub(tx.done) >= WINDOW {
        return None;
    }
    let w = &tx.wqe;
    let k = tx.next;
    let psn = Psn::new(tx.first_psn).add(k);
    let single = w.opcode == WrOpcode::RdmaRead || w.opcode.is_atomic() || w.opcode == WrOpcode::Resync;
    let offset = k as u64 * mtu;
    let payload = if single { 0 } else { (w.length - offset.min(w.length)).min(mtu) };
    let first = k == 0;
    let last = single || k + 1 >= tx.npkts;
    let imm = w.opcode.has_imm();
    let value = match w.opcode {
        WrOpcode::RdmaRead => 0x4C,
        WrOpcode::AtomicCmpSwp => 0x53,
        WrOpcode::AtomicFetchAdd => 0x54,
        WrOpcode::Resync => 0x55,
        WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm => send_opcode(0x46, first, last, imm),
        _ => send_opcode(0x40, first, last, imm),
    };
    let pkey = dev.pkey(attrs.pkey_index).unwrap_or(0xFFFF);
    let mut bth = BthRepr::new(Opcode::from(value), pkey, w.remote_qpn, psn); // WR-SEND-3
    let solicited_kind = matches!(w.opcode, WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm);
    bth.se = last && solicited_kind && w.flags.contains(SendFlags::SOLICITED);
    bth.ack_req = last || psn.value() % ACK_EVERY == ACK_EVERY - 1;
    let mut p = PacketRepr::new(bth);
    p.rdeth = Some(RdethRepr { ee_cnxt: attrs.dest_eecn }); // WR-SEND-6
    p.deth = Some(DethRepr { q_key: tx.q_key, src_qp: tx.src_qp });
    match w.opcode {
        WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm if first => {
            p.reth = Some(RethRepr { va: w.remote_addr, r_key: w.rkey, dma_length: w.length as u32 });
        }
        WrOpcode::RdmaRead => {
            p.reth = Some(RethRepr {
                va: w.remote_addr.wrapping_add(offset),
                r_key: w.rkey,
                dma_length: (w.length - offset.min(w.length)) as u32,
            });
        }
        WrOpcode::AtomicCmpSwp => {
            p.atomic_eth = Some(AtomicEthRepr {
                va: w.remote_addr,
                r_key: w.rkey,
                swap_add_data: w.swap,
                compare_data: w.compare_add,
            });
        }
        WrOpcode::AtomicFetchAdd => {
            p.atomic_eth =
                Some(AtomicEthRepr { va: w.remote_addr, r_key: w.rkey, swap_add_data: w.compare_add, compare_data: 0 });
        }
        _ => {}
    }
    if imm && last {
        p.immdt = Some(ImmDtRepr { imm_data: w.imm_data });
    }
    let ip = ip_for(dev, &attrs.av?.ah)?;
    let len = emit(tx.src_qp, ip, p, payload as usize, buf, |dst| {
        if !w.inline.is_empty() {
            let start = offset as usize;
            w.inline.get(start..start + dst.len()).map(|src| dst.copy_from_slice(src)).is_some()
        } else {
            gather(&w.tx.local, offset, dst)
        }
    })?;
    // A Read asks for all its remaining responses with one request.
    tx.next = if single { tx.npkts } else { k + 1 };
    tx.sent = true;
    if e.ack_deadline.is_none() {
        arm(dev, &mut e.ack_deadline, ack_timeout_ns(attrs.timeout).map(|t| now + t));
    }
    Some(len)
}

fn emit_response(eec: &EecInner, ec: &mut EecCore, buf: &mut [u8]) -> Option<usize> {
    let dev = &eec.dev;
    let ip = ip_for(dev, &ec.attrs.av?.ah)?;
    let pkey = dev.pkey(ec.attrs.pkey_index).unwrap_or(0xFFFF);
    let mtu = mtu_of(&ec.attrs);
    let dest_eecn = ec.attrs.dest_eecn;
    let e = &mut ec.engine;
    let front = e.out.front_mut()?;
    let (from, to) = (front.from, front.to);
    let aeth = |s: Syndrome, msn: u32| Some(AethRepr { syndrome: s, msn });
    let msn = e.msn;
    let (packet, payload, mem_at) = match &mut front.job {
        RespJob::Ack { psn, syndrome } => {
            let mut p = PacketRepr::new(BthRepr::new(Opcode::RdAcknowledge, pkey, to, Psn::new(*psn)));
            p.aeth = aeth(*syndrome, msn);
            e.out.pop_front();
            (p, 0, None)
        }
        RespJob::AtomicAck { psn, orig } => {
            let mut p = PacketRepr::new(BthRepr::new(Opcode::RdAtomicAcknowledge, pkey, to, Psn::new(*psn)));
            p.aeth = aeth(Syndrome::ACK_NO_CREDITS, msn);
            p.atomic_ack_eth = Some(AtomicAckEthRepr { orig_remote_data: *orig });
            e.out.pop_front();
            (p, 0, None)
        }
        RespJob::ReadResp { mem, first_psn, npkts, next, len } => {
            let (opcode, with_aeth) = match (*npkts, *next) {
                (1, _) => (Opcode::RdRdmaReadResponseOnly, true),
                (_, 0) => (Opcode::RdRdmaReadResponseFirst, true),
                (n, k) if k + 1 == n => (Opcode::RdRdmaReadResponseLast, true),
                _ => (Opcode::RdRdmaReadResponseMiddle, false),
            };
            let offset = *next as u64 * mtu;
            let payload = (*len - offset.min(*len)).min(mtu) as usize;
            let mut p = PacketRepr::new(BthRepr::new(opcode, pkey, to, Psn::new(*first_psn).add(*next)));
            if with_aeth {
                p.aeth = aeth(Syndrome::ACK_NO_CREDITS, msn);
            }
            let m = mem.clone();
            *next += 1;
            if *next >= *npkts {
                e.out.pop_front();
            }
            (p, payload, Some((m, offset)))
        }
    };
    let mut packet = packet;
    packet.rdeth = Some(RdethRepr { ee_cnxt: dest_eecn });
    emit(from, ip, packet, payload, buf, |dst| match mem_at {
        Some((Some(m), offset)) => m.read(offset as usize, dst).is_ok(),
        _ => dst.is_empty(),
    })
}

/// Header validation and dispatch of an RD packet: the EEC the RDETH names, then the QP the
/// BTH names. Returns false when the packet was dropped.
pub(crate) fn deliver(
    dev: &DeviceInner,
    qps: &std::collections::BTreeMap<u32, Arc<QpInner>>,
    now: u64,
    d: &RoceDatagram<'_>,
) -> bool {
    let p = &d.packet;
    let bth = p.bth;
    let (Some(rdeth), Some(info)) = (p.rdeth, bth.opcode.info()) else { return false };
    let Some(eec) = find_eec(dev, rdeth.ee_cnxt) else { return false };
    let is_request = info.direction == crate::wire::opcode::Direction::Request;
    let mut qp = qps.get(&bth.dest_qp).filter(|q| q.qp_type == QpType::Rd);
    let mut core = qp.map(|q| q.core.lock().unwrap_or_else(|e| e.into_inner()));
    // Destroy QP marks the QP while it holds the QP's lock: look only once we hold it.
    if qp.is_some_and(|q| q.destroyed.load(Ordering::Acquire)) {
        (qp, core) = (None, None);
    }
    let mut ec = eec.lock();
    if ec.destroyed {
        return false;
    }
    let state = ec.attrs.state;
    let accepts = if is_request {
        matches!(state, QpState::Rtr | QpState::Rts | QpState::Sqd)
    } else {
        matches!(state, QpState::Rts | QpState::Sqd)
    };
    if !accepts {
        return false;
    }
    let our_pkey = dev.pkey(ec.attrs.pkey_index).unwrap_or(0);
    if !pkey_match(bth.p_key, our_pkey) {
        dev.stats.pkey_violations.inc(); // PKT-VAL-7
        return false;
    }
    let src = Gid::from_ipv6(d.ip.src_gid());
    if ec.attrs.av.and_then(|av| av.ah.grh.dgid) != Some(src) {
        return false; // PKT-VAL-11: not from the other end of the channel
    }
    if is_request {
        let Some(deth) = p.deth else { return false };
        let req = Request {
            psn: bth.psn,
            operation: info.operation,
            position: info.position,
            reserved: false,
            se: bth.se,
            ack_req: bth.ack_req,
            imm: p.immdt.map(|i| i.imm_data),
            reth: p.reth,
            invalidate: false,
            atomic: p.atomic_eth.map(|a| (info.operation == Operation::CompareSwap, a)),
            payload: p.payload,
            src_qp: deth.src_qp,
            grh: None,
        };
        if info.operation == Operation::Resync {
            on_resync(qp.zip(core.as_deref_mut()), &eec, &mut ec, &req);
            return true;
        }
        let (Some(q), Some(core)) = (qp, core.as_deref_mut()) else { return false }; // PKT-VAL-4
        if !matches!(core.attrs.qp_state, QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe) {
            return false; // PKT-VAL-5
        }
        if deth.q_key != core.attrs.qkey {
            q.bump(|s| &s.qkey_violations); // PKT-VAL-10
            return false;
        }
        q.stats.rx_packets.inc();
        on_request(q, core, &eec, &mut ec, &req);
        true
    } else {
        let r = Response {
            psn: bth.psn,
            operation: info.operation,
            position: info.position,
            syndrome: p.aeth.map(|a| a.syndrome),
            atomic_orig: p.atomic_ack_eth.map(|a| a.orig_remote_data),
            payload: p.payload,
        };
        on_response(qp.zip(core.as_deref_mut()), &eec, &mut ec, now, &r)
    }
}

// ---------------------------------------------------------------- Receive Logic

/// Why a request failed: a NAK that leaves everything as it was (Class B), or a fatal one
/// after which the channel waits for a Resync; `status` completes the RQ WQE in use and
/// `to_error` moves the destination QP to Error (ERR-C-2, ERR-A-2).
enum Fail {
    B(Syndrome),
    Fatal { nak: NakCode, status: WcStatus, to_error: bool },
    Drop,
}

fn invalid() -> Fail {
    Fail::Fatal { nak: NakCode::InvalidRequest, status: WcStatus::RemInvReqErr, to_error: true }
}

fn access_fail() -> Fail {
    Fail::Fatal { nak: NakCode::RemoteAccessError, status: WcStatus::RemAccessErr, to_error: true }
}

fn on_request(q: &QpInner, core: &mut QpCore, eec: &EecInner, ec: &mut EecCore, r: &Request<'_>) {
    if ec.engine.want_resync {
        return;
    }
    let mtu = mtu_of(&ec.attrs);
    match receive(q, core, eec, ec, r, mtu) {
        Ok(()) => {}
        Err(Fail::Drop) => {}
        Err(Fail::B(syndrome)) => {
            let e = &mut ec.engine;
            let psn = if matches!(syndrome, Syndrome::Nak(NakCode::PsnSeqErr)) { e.epsn } else { r.psn.value() };
            match syndrome {
                Syndrome::RnrNak { .. } => q.bump(|s| &s.rnr_naks_sent),
                _ => q.bump(|s| &s.seq_naks_sent),
            }
            e.out.push_back(Out { from: q.qpn, to: r.src_qp, job: RespJob::Ack { psn, syndrome } });
        }
        Err(Fail::Fatal { nak, status, to_error }) => {
            let e = &mut ec.engine;
            e.out.push_back(Out {
                from: q.qpn,
                to: r.src_qp,
                job: RespJob::Ack { psn: r.psn.value(), syndrome: Syndrome::Nak(nak) },
            });
            e.want_resync = true;
            e.nak_sent = false;
            if let Some(rx) = e.rx.take() {
                if let RxMsg::Send { token, wr_id, .. } = rx.msg {
                    if rx.qpn == q.qpn {
                        complete_held(q, core, eec.eecn, token, wr_id, status, 0, None, r, false);
                    }
                }
            }
            if to_error {
                q.enter_error(core, true);
            }
        }
    }
}

/// The checks of PKT-VAL-12 in order — PSN, opcode sequence, RDD, operation enabled,
/// resources, lengths, keys — then the execution.
fn receive(
    q: &QpInner,
    core: &mut QpCore,
    eec: &EecInner,
    ec: &mut EecCore,
    r: &Request<'_>,
    mtu: u64,
) -> Result<(), Fail> {
    let e = &mut ec.engine;
    match r.psn.classify(Psn::new(e.epsn)) {
        PsnClass::OutOfSequence => {
            if e.nak_sent {
                return Err(Fail::Drop); // PKT-PSN-6
            }
            e.nak_sent = true;
            return Err(Fail::B(Syndrome::Nak(NakCode::PsnSeqErr)));
        }
        PsnClass::Duplicate => return duplicate(q, eec, ec, r, mtu),
        PsnClass::Expected => e.nak_sent = false,
    }
    let continuing = matches!(r.position, Position::Middle | Position::Last);
    match (&e.rx, continuing) {
        (Some(_), false) | (None, true) => return Err(invalid()),
        (Some(rx), true) if rx.qpn != q.qpn || rx.src_qp != r.src_qp => return Err(invalid()),
        (Some(RdRx { msg: RxMsg::Send { .. }, .. }), true) if r.operation != Operation::Send => return Err(invalid()),
        (Some(RdRx { msg: RxMsg::Write { .. }, .. }), true) if r.operation != Operation::RdmaWrite => {
            return Err(invalid())
        }
        _ => {}
    }
    if q.rdd.as_ref() != Some(&eec.rdd) {
        // The QP is not in the channel's domain: Invalid RD Request, nothing else changes.
        return Err(Fail::Fatal { nak: NakCode::InvalidRdRequest, status: WcStatus::RemInvRdReqErr, to_error: false });
    }
    let acc = core.attrs.qp_access_flags;
    let enabled = match r.operation {
        Operation::Send => true,
        Operation::RdmaWrite => acc.contains(Access::REMOTE_WRITE),
        Operation::RdmaReadRequest => acc.contains(Access::REMOTE_READ),
        Operation::CompareSwap | Operation::FetchAdd => acc.contains(Access::REMOTE_ATOMIC),
        _ => false,
    };
    if !enabled {
        return Err(invalid()); // MOD-ACC-1..3
    }
    match r.operation {
        Operation::Send => rd_send(q, core, eec, ec, r, mtu),
        Operation::RdmaWrite => rd_write(q, core, eec, ec, r, mtu),
        Operation::RdmaReadRequest => rd_read(q, core, ec, r, mtu),
        _ => rd_atomic(q, core, ec, r),
    }
}

/// Binds the QP's next receive WQE to the channel: the RQ head (or an SRQ WQE) is copied
/// into the channel and the RQ head advances at once (ORD-RD-1).
fn bind(q: &QpInner, core: &mut QpCore, eecn: u32) -> Option<(u64, u64, Vec<crate::verbs::types::Sge>)> {
    let (wr_id, sges) = match &q.srq {
        None => {
            let w = core.sq_rq_head()?;
            (w.wr_id, w.sges.clone())
        }
        Some(srq) => {
            let mut slot = crate::verbs::wr::RecvWqe::default();
            if !srq.take_into(&mut slot) {
                return None;
            }
            (slot.wr_id, slot.sges)
        }
    };
    let token = core.rd.next_token;
    core.rd.next_token += 1;
    core.rd.held.push((eecn, token, wr_id));
    Some((token, wr_id, sges))
}

impl QpCore {
    /// Pops the RQ head for a channel.
    fn sq_rq_head(&mut self) -> Option<crate::verbs::wr::RecvWqe> {
        let w = self.rq.get(0)?.clone();
        self.rq.pop();
        Some(w)
    }
}

/// Checks a bound WQE's scatter list with local write access against the PD it was posted in.
fn check_scatter(q: &QpInner, sges: &[crate::verbs::types::Sge]) -> Option<Vec<MemRef>> {
    let pd = q.srq.as_ref().map_or(q.pd.inner.handle, |s| s.inner.pd.inner.handle);
    sges.iter()
        .filter(|s| s.length > 0)
        .map(|s| check_access(&q.dev, s.lkey, pd, s.addr, s.length as u64, Access::LOCAL_WRITE).ok())
        .collect()
}

/// The packet is executed: ePSN moves on and an ACK is owed if asked.
fn accept(q: &QpInner, e: &mut EecEngine, r: &Request<'_>) {
    e.epsn = r.psn.next().value();
    if r.ack_req {
        if let Some(Out { job: RespJob::Ack { psn, syndrome }, to, .. }) = e.out.back_mut() {
            if syndrome.is_ack() && *to == r.src_qp {
                *psn = r.psn.value();
                return;
            }
        }
        e.out.push_back(Out {
            from: q.qpn,
            to: r.src_qp,
            job: RespJob::Ack { psn: r.psn.value(), syndrome: Syndrome::ACK_NO_CREDITS },
        });
    }
}

/// Retires a held receive WQE with a CQE (CQE-10, CQE-11); a full CQ is Class G.
#[allow(clippy::too_many_arguments)]
fn complete_held(
    q: &QpInner,
    core: &mut QpCore,
    eecn: u32,
    token: u64,
    wr_id: u64,
    status: WcStatus,
    byte_len: u64,
    opcode: Option<WcOpcode>,
    r: &Request<'_>,
    success: bool,
) {
    let Some(i) = core.rd.held.iter().position(|&(n, t, _)| n == eecn && t == token) else { return };
    core.rd.held.remove(i);
    let mut wc = Wc { wr_id, status, opcode: opcode.unwrap_or(WcOpcode::Recv), qp_num: q.qpn, ..Default::default() };
    if success {
        wc.byte_len = byte_len as u32;
        wc.src_qp = r.src_qp;
        wc.eecn = eecn;
        wc.wc_flags |= WcFlags::GRH;
        if let Some(imm) = r.imm {
            wc.imm_data = imm;
            wc.wc_flags |= WcFlags::WITH_IMM;
        }
    }
    if q.recv_cq.push(wc, !success || r.se).is_err() {
        q.enter_error(core, false);
    }
}

fn rd_send(
    q: &QpInner,
    core: &mut QpCore,
    eec: &EecInner,
    ec: &mut EecCore,
    r: &Request<'_>,
    mtu: u64,
) -> Result<(), Fail> {
    let e = &mut ec.engine;
    if e.rx.is_none() {
        let Some((token, wr_id, sges)) = bind(q, core, eec.eecn) else {
            return Err(Fail::B(Syndrome::RnrNak { timer_code: core.attrs.min_rnr_timer }));
            // ERR-RQ-3
        };
        let Some(list) = check_scatter(q, &sges) else {
            complete_held(q, core, eec.eecn, token, wr_id, WcStatus::LocQpOpErr, 0, None, r, false);
            return Err(Fail::Fatal {
                nak: NakCode::RemoteOperationalError,
                status: WcStatus::LocQpOpErr,
                to_error: true,
            });
        };
        e.rx = Some(RdRx { qpn: q.qpn, src_qp: r.src_qp, msg: RxMsg::Send { token, wr_id, scatter: list, offset: 0 } });
    }
    if !length_ok(r.position, r.payload.len() as u64, mtu) {
        return Err(invalid());
    }
    let Some(RdRx { msg: RxMsg::Send { token, wr_id, scatter: list, offset }, .. }) = &mut e.rx else {
        return Err(invalid());
    };
    let (token, wr_id) = (*token, *wr_id);
    if !core.rd.held.iter().any(|&(n, t, _)| n == eec.eecn && t == token) {
        e.rx = None; // the QP was flushed under the message
        return Err(Fail::Drop);
    }
    let capacity: u64 = list.iter().map(|m| m.len() as u64).sum();
    if *offset + r.payload.len() as u64 > capacity {
        return Err(invalid()); // ERR-RQ-11
    }
    if scatter(list, *offset, r.payload).is_err() {
        return Err(Fail::Fatal { nak: NakCode::RemoteOperationalError, status: WcStatus::LocQpOpErr, to_error: true });
    }
    *offset += r.payload.len() as u64;
    let total = *offset;
    accept(q, e, r);
    if matches!(r.position, Position::Last | Position::Only) {
        e.rx = None;
        e.msn = Psn::new(e.msn).next().value();
        complete_held(q, core, eec.eecn, token, wr_id, WcStatus::Success, total, Some(WcOpcode::Recv), r, true);
    }
    Ok(())
}

fn rd_write(
    q: &QpInner,
    core: &mut QpCore,
    eec: &EecInner,
    ec: &mut EecCore,
    r: &Request<'_>,
    mtu: u64,
) -> Result<(), Fail> {
    let len = r.payload.len() as u64;
    if !length_ok(r.position, len, mtu) {
        return Err(invalid());
    }
    let completes = matches!(r.position, Position::Last | Position::Only);
    let e = &mut ec.engine;
    if completes && r.imm.is_some() && q.srq.is_none() && core.rq.is_empty() {
        return Err(Fail::B(Syndrome::RnrNak { timer_code: core.attrs.min_rnr_timer }));
    }
    if e.rx.is_none() {
        let reth = r.reth.ok_or_else(invalid)?;
        let total = reth.dma_length as u64;
        if (r.position == Position::Only && len != total) || (r.position == Position::First && total <= len) {
            return Err(invalid()); // ERR-RQ-12
        }
        let mem = if total == 0 {
            None
        } else {
            Some(
                check_access(&q.dev, reth.r_key, q.pd.inner.handle, reth.va, total, Access::REMOTE_WRITE)
                    .map_err(|_| access_fail())?,
            )
        };
        e.rx = Some(RdRx { qpn: q.qpn, src_qp: r.src_qp, msg: RxMsg::Write { mem, offset: 0, len: total } });
    }
    let Some(RdRx { msg: RxMsg::Write { mem, offset, len: total }, .. }) = &mut e.rx else { return Err(invalid()) };
    let end = *offset + len;
    if end > *total || (completes && end != *total) {
        return Err(invalid()); // ERR-RQ-12
    }
    if let Some(m) = mem {
        m.write(*offset as usize, r.payload).map_err(|_| invalid())?;
    }
    *offset = end;
    let total = *total;
    if completes && r.imm.is_some() {
        let Some((token, wr_id, _)) = bind(q, core, eec.eecn) else {
            return Err(Fail::B(Syndrome::RnrNak { timer_code: core.attrs.min_rnr_timer }));
        };
        accept(q, e, r);
        e.rx = None;
        e.msn = Psn::new(e.msn).next().value();
        complete_held(
            q,
            core,
            eec.eecn,
            token,
            wr_id,
            WcStatus::Success,
            total,
            Some(WcOpcode::RecvRdmaWithImm),
            r,
            true,
        );
        return Ok(());
    }
    accept(q, e, r);
    if completes {
        e.rx = None;
        e.msn = Psn::new(e.msn).next().value();
    }
    Ok(())
}

fn rd_read(q: &QpInner, core: &mut QpCore, ec: &mut EecCore, r: &Request<'_>, mtu: u64) -> Result<(), Fail> {
    if core.attrs.max_dest_rd_atomic == 0 || ec.attrs.max_dest_rd_atomic == 0 {
        return Err(invalid()); // ERR-RQ-6: no inbound Read/Atomic resources
    }
    let reth = r.reth.ok_or_else(invalid)?;
    let len = reth.dma_length as u64;
    if len > 1 << 31 {
        return Err(invalid());
    }
    let mem = if len == 0 {
        None
    } else {
        Some(
            check_access(&q.dev, reth.r_key, q.pd.inner.handle, reth.va, len, Access::REMOTE_READ)
                .map_err(|_| access_fail())?,
        )
    };
    let npkts = len.div_ceil(mtu).max(1) as u32;
    let psn = r.psn.value();
    let e = &mut ec.engine;
    e.last = Some(Executed::Read { psn, qpn: q.qpn, va: reth.va, rkey: reth.r_key, len, npkts });
    e.epsn = r.psn.add(npkts).value();
    e.msn = Psn::new(e.msn).next().value();
    e.out.push_back(Out {
        from: q.qpn,
        to: r.src_qp,
        job: RespJob::ReadResp { mem, first_psn: psn, npkts, next: 0, len },
    });
    Ok(())
}

fn rd_atomic(q: &QpInner, core: &mut QpCore, ec: &mut EecCore, r: &Request<'_>) -> Result<(), Fail> {
    let Some((is_cas, a)) = r.atomic else { return Err(invalid()) };
    if a.va % 8 != 0 {
        return Err(invalid()); // ERR-RQ-5
    }
    if core.attrs.max_dest_rd_atomic == 0 || ec.attrs.max_dest_rd_atomic == 0 {
        return Err(invalid());
    }
    let mem =
        check_access(&q.dev, a.r_key, q.pd.inner.handle, a.va, 8, Access::REMOTE_ATOMIC).map_err(|_| access_fail())?;
    let word = mem.atomic_u64().ok_or_else(invalid)?;
    let orig = if is_cas {
        match word.compare_exchange(a.compare_data, a.swap_add_data, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(v) | Err(v) => v,
        }
    } else {
        word.fetch_add(a.swap_add_data, Ordering::SeqCst)
    };
    let psn = r.psn.value();
    let e = &mut ec.engine;
    e.last = Some(Executed::Atomic { psn, orig });
    e.epsn = r.psn.next().value();
    e.msn = Psn::new(e.msn).next().value();
    e.out.push_back(Out { from: q.qpn, to: r.src_qp, job: RespJob::AtomicAck { psn, orig } });
    Ok(())
}

/// Duplicates are never executed again: Sends and Writes are re-ACKed, the last Read is
/// replayed from the requested PSN and the last Atomic's result is sent again.
fn duplicate(q: &QpInner, eec: &EecInner, ec: &mut EecCore, r: &Request<'_>, mtu: u64) -> Result<(), Fail> {
    let e = &mut ec.engine;
    let to = r.src_qp;
    match (r.operation, e.last) {
        (Operation::Send | Operation::RdmaWrite, _) => {
            if r.ack_req {
                let psn = Psn::new(e.epsn).sub(1).value();
                e.out.push_back(Out { from: q.qpn, to, job: RespJob::Ack { psn, syndrome: Syndrome::ACK_NO_CREDITS } });
            }
            Ok(())
        }
        (Operation::RdmaReadRequest, Some(Executed::Read { psn, qpn, va, rkey, len, npkts })) if qpn == q.qpn => {
            let reth = r.reth.ok_or(Fail::Drop)?;
            let first = Psn::new(psn);
            if !r.psn.in_range(first, first.add(npkts - 1)) {
                return Err(Fail::Drop);
            }
            let k = r.psn.distance_from(first) as u64;
            if reth.r_key != rkey || reth.va != va.wrapping_add(k * mtu) || reth.dma_length as u64 != len - k * mtu {
                return Err(Fail::Drop);
            }
            let mem = if len == 0 {
                None
            } else {
                Some(
                    check_access(&eec.dev, rkey, q.pd.inner.handle, va, len, Access::REMOTE_READ)
                        .map_err(|_| Fail::Drop)?,
                )
            };
            e.out.push_back(Out {
                from: q.qpn,
                to,
                job: RespJob::ReadResp { mem, first_psn: psn, npkts, next: k as u32, len },
            });
            Ok(())
        }
        (Operation::CompareSwap | Operation::FetchAdd, Some(Executed::Atomic { psn, orig }))
            if psn == r.psn.value() =>
        {
            e.out.push_back(Out { from: q.qpn, to, job: RespJob::AtomicAck { psn, orig } });
            Ok(())
        }
        _ => Err(Fail::Drop),
    }
}

/// A Resync takes its PSN as the channel's new ePSN and aborts the message in progress; a
/// duplicate Resync is acknowledged again.
fn on_resync(qp: Option<(&Arc<QpInner>, &mut QpCore)>, eec: &EecInner, ec: &mut EecCore, r: &Request<'_>) {
    let e = &mut ec.engine;
    let duplicate = !e.want_resync && r.psn.classify(Psn::new(e.epsn)) == PsnClass::Duplicate;
    let from = qp.as_ref().map_or(r.src_qp, |(q, _)| q.qpn);
    if !duplicate {
        if let Some(rx) = e.rx.take() {
            if let (RxMsg::Send { token, wr_id, .. }, Some((q, core))) = (rx.msg, qp) {
                if rx.qpn == q.qpn {
                    complete_held(q, core, eec.eecn, token, wr_id, WcStatus::RemAbortErr, 0, None, r, false);
                }
            }
        }
        e.epsn = r.psn.next().value();
        e.want_resync = false;
        e.nak_sent = false;
    }
    e.out.push_back(Out {
        from,
        to: r.src_qp,
        job: RespJob::Ack { psn: r.psn.value(), syndrome: Syndrome::ACK_NO_CREDITS },
    });
}

// ---------------------------------------------------------------- Send Logic: responses

fn on_response(
    qp: Option<(&Arc<QpInner>, &mut QpCore)>,
    eec: &EecInner,
    ec: &mut EecCore,
    now: u64,
    r: &Response<'_>,
) -> bool {
    let dev = &eec.dev;
    let timeout = ec.attrs.timeout;
    let rnr_retry = ec.attrs.rnr_retry;
    let retry_cnt = ec.attrs.retry_cnt;
    let mtu = mtu_of(&ec.attrs);
    let e = &mut ec.engine;
    let Some(tx) = e.tx.as_mut() else { return false };
    let first = Psn::new(tx.first_psn);
    if tx.status.is_some() || !r.psn.in_range(first, first.add(tx.npkts - 1)) || tx.next == 0 {
        return false; // PKT-ACK-8
    }
    // Responses of a QP's message reach that QP; those of a Resync reach the QP it was for.
    if let Some((o, _)) = &tx.owner {
        if !qp.as_ref().is_some_and(|(q, _)| Arc::ptr_eq(q, o)) {
            return false;
        }
    }
    let k = r.psn.distance_from(first);
    if k >= tx.next {
        return false; // nothing this far was sent
    }
    let before = tx.done;
    let op = tx.wqe.opcode;
    match (r.operation, r.syndrome) {
        (Operation::Acknowledge, Some(Syndrome::Ack { .. })) => {
            if op == WrOpcode::RdmaRead || op.is_atomic() {
                return false;
            }
            tx.done = tx.done.max(k + 1);
            if tx.done >= tx.npkts {
                tx.status = Some(WcStatus::Success);
            }
        }
        (Operation::Acknowledge, Some(Syndrome::Nak(NakCode::PsnSeqErr))) => {
            q_bump(&qp, |s| &s.seq_naks_received);
            if op != WrOpcode::RdmaRead {
                tx.done = tx.done.max(k);
            }
            go_back_or_fail(e, dev, k, false);
        }
        (Operation::Acknowledge, Some(Syndrome::RnrNak { timer_code })) => {
            q_bump(&qp, |s| &s.rnr_naks_received);
            if rnr_retry != 7 {
                if e.rnr_left == 0 {
                    if let Some(tx) = e.tx.as_mut() {
                        tx.status = Some(WcStatus::RnrRetryExcErr);
                    }
                    e.ack_deadline = None;
                    to_error_after(ec, qp, eec);
                    return true;
                }
                e.rnr_left -= 1;
            }
            if let Some(tx) = e.tx.as_mut() {
                tx.done = tx.done.max(k);
                tx.next = k;
            }
            e.ack_deadline = None;
            arm(dev, &mut e.rnr_deadline, Some(now + rnr_timer_us(timer_code) as u64 * 1000));
            return true;
        }
        (Operation::Acknowledge, Some(Syndrome::Nak(code))) => {
            let status = match code {
                NakCode::InvalidRequest => WcStatus::RemInvReqErr,
                NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                NakCode::RemoteOperationalError => WcStatus::RemOpErr,
                NakCode::InvalidRdRequest => WcStatus::RemInvRdReqErr, // ERR-SQ-9
                NakCode::PsnSeqErr => WcStatus::RetryExcErr,
            };
            tx.status = Some(status); // PKT-NAK-2: no retransmission
            tx.resync_after = true;
        }
        (Operation::RdmaReadResponse, _) if op == WrOpcode::RdmaRead => {
            if k < tx.done {
                return true; // a duplicate response
            }
            if k > tx.done {
                let missing = tx.done;
                go_back_or_fail(e, dev, missing, false); // an implied NAK
                return true;
            }
            let n = tx.npkts;
            let want = match (n, k) {
                (1, _) => Position::Only,
                (_, 0) => Position::First,
                (_, k) if k == n - 1 => Position::Last,
                _ => Position::Middle,
            };
            let offset = k as u64 * mtu;
            let want_len = (tx.wqe.length - offset.min(tx.wqe.length)).min(mtu);
            tx.status = if r.position != want {
                Some(WcStatus::BadRespErr)
            } else if r.payload.len() as u64 != want_len {
                Some(WcStatus::LocLenErr)
            } else if scatter(&tx.wqe.tx.local, offset, r.payload).is_err() {
                Some(WcStatus::LocProtErr)
            } else {
                tx.done = k + 1;
                (tx.done == n).then_some(WcStatus::Success)
            };
        }
        (Operation::AtomicAcknowledge, _) if op.is_atomic() => {
            let orig = r.atomic_orig.unwrap_or(0);
            tx.done = 1;
            tx.status = Some(match tx.wqe.tx.local.first() {
                Some(m) => m.write(0, &orig.to_ne_bytes()).map_or(WcStatus::LocProtErr, |_| WcStatus::Success),
                None => WcStatus::LocProtErr,
            });
        }
        _ => {
            tx.status = Some(WcStatus::BadRespErr); // ERR-SQ-12
            tx.resync_after = true;
        }
    }
    let Some(tx) = e.tx.as_ref() else { return true };
    if e.recovering.is_some_and(|k| tx.done > k) {
        e.recovering = None;
    }
    if tx.done != before {
        e.retry_left = retry_cnt;
        e.rnr_left = rnr_retry;
    }
    let at = if tx.status.is_none() { ack_timeout_ns(timeout).map(|t| now + t) } else { None };
    if tx.done != before || tx.status.is_some() {
        arm(dev, &mut e.ack_deadline, at);
    }
    if let Some(status) = tx.status {
        match qp {
            Some((q, core)) if tx.owner.is_some() => {
                if core.rd.active == Some(eec.eecn) {
                    finish(q, core, ec, status);
                } else {
                    ec.engine.tx = None;
                }
            }
            _ => {
                // The Resync is acknowledged: the channel is in step again.
                ec.engine.tx = None;
                ec.engine.ack_deadline = None;
            }
        }
    }
    true
}

fn q_bump(
    qp: &Option<(&Arc<QpInner>, &mut QpCore)>,
    counter: impl Fn(&super::engine::Stats) -> &super::engine::Counter,
) {
    if let Some((q, _)) = qp {
        q.bump(counter);
    }
}

/// Go-back-N inside the message, from packet `k`, counting a retry: once per recovery for a
/// NAK, every time for a timeout.
fn go_back_or_fail(e: &mut EecEngine, dev: &DeviceInner, k: u32, timeout: bool) {
    let Some(tx) = e.tx.as_mut() else { return };
    if !timeout && e.recovering == Some(k) {
        return;
    }
    e.recovering = Some(k);
    if e.retry_left == 0 {
        tx.status = Some(WcStatus::RetryExcErr);
        return;
    }
    e.retry_left -= 1;
    tx.next = k;
    dev.stats.retransmits.inc();
}

/// Retries ran out: the EEC moves straight to Error (QPS-RD-6); the message completes in
/// error at once if its QP is at hand, else at the QP's next turn.
fn to_error_after(ec: &mut EecCore, qp: Option<(&Arc<QpInner>, &mut QpCore)>, eec: &EecInner) {
    ec.attrs.state = QpState::Error;
    ec.engine.rnr_deadline = None;
    ec.engine.ack_deadline = None;
    ec.engine.out.clear();
    tracing::debug!(eecn = eec.eecn, "EEC → Error");
    let status = ec.engine.tx.as_ref().and_then(|t| t.status).unwrap_or(WcStatus::RetryExcErr);
    if let Some((q, core)) = qp {
        if core.rd.active == Some(eec.eecn) && ec.engine.owner_is(q) {
            ec.engine.tx = None;
            fail_head(q, core, status);
        }
    }
}

/// The EECs' timers: an RNR wait ends, or the ACK timer retries from the first
/// unacknowledged packet, or, out of retries, moves the EEC to Error. Returns the earliest
/// timer still armed.
pub(crate) fn handle_timeout(dev: &DeviceInner, now: u64) -> u64 {
    if dev.counts.eec.load(Ordering::Relaxed) == 0 {
        return u64::MAX;
    }
    let eecs: Vec<Arc<EecInner>> = dev.eecs.read().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
    let mut earliest = u64::MAX;
    for eec in eecs {
        let mut ec = eec.lock();
        let e = &mut ec.engine;
        if e.rnr_deadline.is_some_and(|t| t <= now) {
            e.rnr_deadline = None;
        }
        if e.ack_deadline.is_some_and(|t| t <= now) {
            e.ack_deadline = None;
            if let Some(tx) = e.tx.as_mut() {
                if tx.status.is_none() {
                    let from = tx.done;
                    go_back_or_fail(e, dev, from, true);
                    if e.tx.as_ref().is_some_and(|t| t.status == Some(WcStatus::RetryExcErr)) {
                        to_error_after(&mut ec, None, &eec);
                    }
                }
            }
        }
        let e = &ec.engine;
        for t in [e.ack_deadline, e.rnr_deadline].into_iter().flatten() {
            earliest = earliest.min(t);
        }
    }
    earliest
}

/// An RD QP's message in flight and the receive WQEs channels hold for it stop counting
/// when the QP is flushed or reset; the channels notice through its epoch.
pub(crate) fn release(q: &QpInner, core: &mut QpCore, flush: bool) {
    if core.rd.active.take().is_some() {
        q.rd_epoch.fetch_add(1, Ordering::AcqRel);
    }
    for (_, _, wr_id) in core.rd.held.drain(..) {
        if flush {
            let wc =
                Wc { wr_id, status: WcStatus::WrFlushErr, opcode: WcOpcode::Recv, qp_num: q.qpn, ..Default::default() };
            let _ = q.recv_cq.push(wc, true);
        }
    }
}
