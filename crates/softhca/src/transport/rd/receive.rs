//! The EEC's Receive Logic: requests checked against the channel's ePSN and executed for the
//! QP the BTH names, receive WQEs bound per channel, duplicates, the Resync, and the responses.

use std::sync::Arc;

use crate::mem::MemRef;
use crate::transport::qp::{QpCore, QpInner};
use crate::transport::rd::eec::{EecCore, EecInner};
use crate::types::{Access, QpState, Wc, WcFlags, WcOpcode, WcStatus};
use crate::wire::aeth::{NakCode, Syndrome};
use crate::wire::opcode::ServiceType;
use crate::wire::opcode::{Operation, Position};
use crate::wire::psn::{Psn, PsnClass};
use crate::wire::{BthRepr, Opcode, PacketRepr, RdethRepr};

use crate::transport::channel::{Arrival, Inbound, Sent};
use crate::transport::completer::scatter;
use crate::transport::engine::{emit, ip_for, Payload};
use crate::transport::responder::{begin_write, enabled, length_ok, Refusal, Request, RespJob};

use super::*;

/// Completes, with Flush Error, the receive WQEs held by a channel that can no longer
/// finish them: its EEC is gone, or in Reset, Init or Error.
pub(super) fn reap_held(q: &QpInner, core: &mut QpCore) {
    if core.rd.held.is_empty() {
        return;
    }
    let mut i = 0;
    while i < core.rd.held.len() {
        let (eecn, token, wr_id) = core.rd.held[i];
        let alive = find_eec(&*q.dev, eecn).is_some_and(|eec| {
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
        if !q.flush_recv_cqe(core, wr_id, 0) {
            // The receive CQ overflowed: Class G, as for any receive completion (ERR-RQ-15).
            q.enter_error(core, false);
            return;
        }
    }
}

/// The ACKs and NAKs an EEC still owes, built now (Destroy EEC hands them to the device, as
/// Destroy QP does for a QP's, PKT-ACK-13).
pub(crate) fn owed_acks(eec: &EecInner, ec: &mut EecCore) -> Vec<Vec<u8>> {
    crate::transport::engine::owed_datagrams(ec, |c| c.engine.chan.out.ack_next(), |c, buf| emit_response(eec, c, buf))
}

pub(super) fn emit_response(eec: &EecInner, ec: &mut EecCore, buf: &mut [u8]) -> Option<usize> {
    let dev = &*eec.dev;
    if ec.engine.chan.out.is_empty() {
        return None;
    }
    let ip = ip_for(dev, &ec.attrs.av?.ah)?;
    let pkey = dev.pkey(ec.attrs.pkey_index).unwrap_or(0xFFFF);
    let dest_eecn = ec.attrs.dest_eecn;
    let e = &mut ec.engine;
    let bth = |op: Opcode, (_, to): Route, psn: Psn| BthRepr::new(op, pkey, to, psn);
    // RD ACKs carry no credits (IBA 9.7.7.2 counts them per QP, and RD QPs have none here).
    let ack = Syndrome::ACK_NO_CREDITS;
    let emit = |(from, _): Route, mut p: PacketRepr<'static>, n: usize, fill: &dyn Fn(&mut Payload<'_>) -> bool| {
        p.rdeth = Some(RdethRepr { ee_cnxt: dest_eecn });
        emit(from, ip, p, n, buf, None, fill)
    };
    match e.chan.out.send_next(ServiceType::Rd, dev, bth, ack, e.chan.recv.msn, emit)? {
        Sent::Packet(len) => len,
        Sent::AccessLost { len, psn, to: (from, to) } => {
            // The key no longer covers the Read's bytes: Remote Access Error, and the channel
            // waits for the requester's Resync as after any fatal NAK.
            e.want_resync = true;
            e.fatal_nak = Some((psn, Syndrome::Nak(NakCode::RemoteAccessError), from, to));
            len
        }
    }
}

/// Why a request failed: a NAK that leaves everything as it was (Class B), or a fatal one
/// after which the channel waits for a Resync; `status` completes the RQ WQE in use and
/// `to_error` moves the destination QP to Error (ERR-C-2, ERR-A-2).
pub(super) enum Fail {
    B(Syndrome),
    Fatal { nak: NakCode, status: WcStatus, to_error: bool },
    Drop,
}

pub(super) fn invalid() -> Fail {
    Fail::Fatal { nak: NakCode::InvalidRequest, status: WcStatus::RemInvReqErr, to_error: true }
}

pub(super) fn access_fail() -> Fail {
    Fail::Fatal { nak: NakCode::RemoteAccessError, status: WcStatus::RemAccessErr, to_error: true }
}

/// RD's error class for a refusal: a fatal NAK on the channel.
fn refused(why: Refusal) -> Fail {
    match why {
        Refusal::Invalid => invalid(),
        Refusal::Access => access_fail(),
    }
}

pub(super) fn on_request(q: &QpInner, core: &mut QpCore, eec: &EecInner, ec: &mut EecCore, r: &Request<'_>) {
    let mtu = mtu_of(&ec.attrs);
    match receive(q, core, eec, ec, r, mtu) {
        Ok(()) => {}
        Err(Fail::Drop) => {}
        Err(Fail::B(syndrome)) => {
            let e = &mut ec.engine;
            let psn =
                if matches!(syndrome, Syndrome::Nak(NakCode::PsnSeqErr)) { e.chan.recv.epsn } else { r.psn.value() };
            match syndrome {
                Syndrome::RnrNak { .. } => q.bump(|s| &s.rnr_naks_sent),
                _ => q.bump(|s| &s.seq_naks_sent),
            }
            e.chan.out.push((q.qpn, r.src_qp), RespJob::Ack { psn, syndrome });
        }
        Err(Fail::Fatal { nak, status, to_error }) => {
            let e = &mut ec.engine;
            let (psn, syndrome) = (r.psn.value(), Syndrome::Nak(nak));
            e.chan.out.push((q.qpn, r.src_qp), RespJob::Ack { psn, syndrome });
            e.fatal_nak = Some((psn, syndrome, q.qpn, r.src_qp));
            e.want_resync = true;
            e.chan.recv.forget_nak();
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

/// While the channel waits for a Resync: the NAKed packet, retransmitted because the NAK was
/// lost, gets the NAK again; a duplicate of a packet before it (the requester going back to
/// a packet it had no ACK for) gets an ACK of everything before the NAKed one (PKT-DUP-1), so
/// that the requester comes to the NAKed packet and hears its NAK; anything else is dropped.
/// `to_qp` is the packet's destination QP. The channel answers these whatever became of the
/// QPs they name (no PKT-VAL-4 or Q_Key check, as for the repeated NAK): the answer is the
/// channel's, and carries nothing of any QP's. Returns whether the packet was taken.
pub(super) fn repeat_fatal_nak(e: &mut EecEngine, r: &Request<'_>, to_qp: u32) -> bool {
    match e.fatal_nak {
        Some((psn, syndrome, from, to)) if psn == r.psn.value() && to == r.src_qp => {
            e.chan.out.push((from, to), RespJob::Ack { psn, syndrome });
            true
        }
        Some(_) if r.psn.classify(Psn::new(e.chan.recv.epsn)) == PsnClass::Duplicate => {
            let last = Psn::new(e.chan.recv.epsn).sub(1).value();
            e.chan.out.push_ack((to_qp, r.src_qp), last, Syndrome::ACK_NO_CREDITS);
            true
        }
        _ => false,
    }
}

/// A duplicate first (it changes nothing, PKT-DUP-6: a late copy of a request refused for
/// its RDD must not refuse it again, which would leave the channel waiting for a Resync its
/// requester has no reason to send); then the RDD (a QP outside the channel's domain is
/// answered before anything else about the packet is believed), then the checks of
/// PKT-VAL-12 in order — PSN, opcode sequence, operation enabled, resources, lengths, keys —
/// then the execution.
pub(super) fn receive(
    q: &QpInner,
    core: &mut QpCore,
    eec: &EecInner,
    ec: &mut EecCore,
    r: &Request<'_>,
    mtu: u64,
) -> Result<(), Fail> {
    if r.psn.classify(Psn::new(ec.engine.chan.recv.epsn)) == PsnClass::Duplicate {
        return duplicate(q, core, ec, r);
    }
    if q.rdd != Some(eec.rdd) {
        // The QP is not in the channel's domain: Invalid RD Request, and nothing changes on
        // that QP whatever else is wrong with the packet (DESIGN rule 5).
        return Err(Fail::Fatal { nak: NakCode::InvalidRdRequest, status: WcStatus::RemInvRdReqErr, to_error: false });
    }
    let e = &mut ec.engine;
    match e.chan.recv.arrival(r.psn) {
        Arrival::Ignore => return Err(Fail::Drop), // PKT-PSN-6
        Arrival::SequenceError => return Err(Fail::B(Syndrome::Nak(NakCode::PsnSeqErr))),
        Arrival::Duplicate => return duplicate(q, core, ec, r), // answered above already
        Arrival::Expected => {}
    }
    // An opcode out of sequence is the channel's fault: it moves to Error only a QP whose
    // message it breaks, never one it merely names (ERR-RQ-7, ERR-RQ-8).
    let continuing = matches!(r.position, Position::Middle | Position::Last);
    let out_of_sequence = match (&e.rx, continuing) {
        (None, true) => Some(false),
        (Some(rx), false) => Some(rx.qpn == q.qpn),
        (Some(rx), true) if rx.qpn != q.qpn || rx.src_qp != r.src_qp => Some(false),
        (Some(RdRx { msg: RxMsg::Send { .. }, .. }), true) if r.operation != Operation::Send => Some(true),
        (Some(RdRx { msg: RxMsg::Write { .. }, .. }), true) if r.operation != Operation::RdmaWrite => Some(true),
        _ => None,
    };
    if let Some(to_error) = out_of_sequence {
        return Err(Fail::Fatal { nak: NakCode::InvalidRequest, status: WcStatus::RemInvReqErr, to_error });
    }
    if !enabled(core.attrs.qp_access_flags, r.operation) {
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
pub(super) fn bind(q: &QpInner, core: &mut QpCore, eecn: u32) -> Option<(u64, u64, crate::transport::wqe::SgeList)> {
    let (wr_id, sges) = match &q.srq {
        None => {
            let w = core.take_rq_head()?;
            (w.wr_id, w.sges.clone())
        }
        Some(srq) => {
            let mut slot = crate::transport::wqe::RecvWqe::default();
            if !srq.take_into(&mut slot) {
                return None;
            }
            (slot.wr_id, slot.sges)
        }
    };
    let token = core.rd.next_token;
    core.rd.next_token += 1;
    core.rd.held.push((eecn, token, wr_id));
    core.rd.freed += 1;
    Some((token, wr_id, sges))
}

impl QpCore {
    /// Pops the RQ head for a channel.
    fn take_rq_head(&mut self) -> Option<crate::transport::wqe::RecvWqe> {
        let w = self.rq.get(0)?.clone();
        self.rq.pop();
        Some(w)
    }
}

/// Checks a bound WQE's scatter list with local write access against the PD it was posted in.
pub(super) fn check_scatter(q: &QpInner, sges: &[crate::types::Sge]) -> Option<Vec<MemRef>> {
    let pd = q.srq.as_ref().map_or(q.pd, |s| s.pd());
    sges.iter()
        .filter(|s| s.length > 0)
        .map(|s| q.dev.check_access(s.lkey, pd, q.qpn, s.addr, s.length as u64, Access::LOCAL_WRITE).ok())
        .collect()
}

/// The packet is executed: ePSN moves on and an ACK is owed if asked.
pub(super) fn accept(q: &QpInner, e: &mut EecEngine, r: &Request<'_>) {
    e.chan.recv.epsn = r.psn.next().value();
    if r.ack_req {
        // Coalesced only with an ACK between the same two QPs (it leaves from this QP's port).
        e.chan.out.push_ack((q.qpn, r.src_qp), r.psn.value(), Syndrome::ACK_NO_CREDITS);
    }
}

/// Retires a held receive WQE with a CQE (CQE-10, CQE-11); a full CQ is Class G.
#[allow(clippy::too_many_arguments)]
pub(super) fn complete_held(
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
    let freed = std::mem::take(&mut core.rd.freed); // CQE-15
    let mut wc =
        Wc { wr_id, status, opcode: opcode.unwrap_or(WcOpcode::Recv), qp_num: q.qpn, freed, ..Default::default() };
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

pub(super) fn rd_send(
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
        let gen = q.dev.key_generation();
        let Some(list) = check_scatter(q, &sges) else {
            complete_held(q, core, eec.eecn, token, wr_id, WcStatus::LocQpOpErr, 0, None, r, false);
            return Err(Fail::Fatal {
                nak: NakCode::RemoteOperationalError,
                status: WcStatus::LocQpOpErr,
                to_error: true,
            });
        };
        let msg = RxMsg::Send { token, wr_id, sges, scatter: list, gen, offset: 0 };
        e.rx = Some(RdRx { qpn: q.qpn, src_qp: r.src_qp, msg });
    }
    if !length_ok(r.position, r.payload.len() as u64, mtu) {
        return Err(invalid());
    }
    let Some(RdRx { msg: RxMsg::Send { token, wr_id, sges, scatter: list, gen, offset }, .. }) = &mut e.rx else {
        return Err(invalid());
    };
    let (token, wr_id) = (*token, *wr_id);
    if !core.rd.held.iter().any(|&(n, t, _)| n == eec.eecn && t == token) {
        e.rx = None; // the QP was flushed under the message
        return Err(Fail::Drop);
    }
    // The scatter list unusable: the WQE fails, the QP with it.
    let unusable =
        || Fail::Fatal { nak: NakCode::RemoteOperationalError, status: WcStatus::LocQpOpErr, to_error: true };
    let now_gen = q.dev.key_generation();
    if *gen != now_gen {
        // A key was revoked since the list was checked (see `responder::recheck_scatter`).
        *gen = now_gen;
        *list = check_scatter(q, sges).ok_or_else(unusable)?;
    }
    let capacity: u64 = list.iter().map(|m| m.len() as u64).sum();
    if *offset + r.payload.len() as u64 > capacity {
        return Err(invalid()); // ERR-RQ-11
    }
    if scatter(list, *offset, r.payload).is_err() {
        return Err(unusable());
    }
    *offset += r.payload.len() as u64;
    let total = *offset;
    accept(q, e, r);
    if matches!(r.position, Position::Last | Position::Only) {
        e.rx = None;
        e.chan.recv.message_done();
        complete_held(q, core, eec.eecn, token, wr_id, WcStatus::Success, total, Some(WcOpcode::Recv), r, true);
    }
    Ok(())
}

pub(super) fn rd_write(
    q: &QpInner,
    core: &mut QpCore,
    eec: &EecInner,
    ec: &mut EecCore,
    r: &Request<'_>,
    mtu: u64,
) -> Result<(), Fail> {
    let len = r.payload.len() as u64;
    let completes = matches!(r.position, Position::Last | Position::Only);
    let wqe_ready = match &q.srq {
        None => !core.rq.is_empty(),
        Some(srq) => srq.has_wqe(),
    };
    if completes && r.imm.is_some() && !wqe_ready {
        // Resources before lengths (PKT-VAL-12).
        return Err(Fail::B(Syndrome::RnrNak { timer_code: core.attrs.min_rnr_timer }));
    }
    if !length_ok(r.position, len, mtu) {
        return Err(invalid());
    }
    let e = &mut ec.engine;
    // Everything is checked before anything changes, so that an RNR NAK leaves no trace and
    // the retransmitted packet is taken as new (ERR-B-4).
    let (mut grant, offset, total) = match &e.rx {
        None => {
            let (grant, total) = begin_write(&*q.dev, q.pd, q.qpn, r, len).map_err(refused)?;
            (grant, 0, total)
        }
        Some(RdRx { msg: RxMsg::Write { grant, offset, len }, .. }) => (grant.clone(), *offset, *len),
        Some(_) => return Err(invalid()),
    };
    let end = offset + len;
    if end > total || (completes && end != total) {
        return Err(invalid()); // ERR-RQ-12
    }
    // Write with Immediate needs a receive WQE for its last packet (ERR-RQ-3).
    let held = match completes && r.imm.is_some() {
        true => {
            Some(bind(q, core, eec.eecn).ok_or(Fail::B(Syndrome::RnrNak { timer_code: core.attrs.min_rnr_timer }))?)
        }
        false => None,
    };
    if let Some(g) = &mut grant {
        // Through a grant that checks its key again if one was revoked since (see `Grant`).
        let written = g.bytes(&*q.dev, offset, len).is_some_and(|(m, at)| m.write(at, r.payload).is_ok());
        if !written {
            if let Some((token, wr_id, _)) = held {
                complete_held(q, core, eec.eecn, token, wr_id, WcStatus::RemAccessErr, 0, None, r, false);
            }
            return Err(access_fail());
        }
    }
    accept(q, e, r);
    if !completes {
        e.rx = Some(RdRx { qpn: q.qpn, src_qp: r.src_qp, msg: RxMsg::Write { grant, offset: end, len: total } });
        return Ok(());
    }
    e.rx = None;
    e.chan.recv.message_done();
    if let Some((token, wr_id, _)) = held {
        let opcode = Some(WcOpcode::RecvRdmaWithImm); // WR-WRITE-3, CQE-6
        complete_held(q, core, eec.eecn, token, wr_id, WcStatus::Success, total, opcode, r, true);
    }
    Ok(())
}

/// An inbound request for QP `q` over the channel, as the channel's executors take it: the
/// inbound depth is the EEC's and the QP's, the smaller (ERR-RQ-6).
fn inbound<'q>(q: &'q QpInner, core: &QpCore, ec: &EecCore, r: &Request<'_>) -> Inbound<'q, Route> {
    let depth = ec.attrs.max_dest_rd_atomic.min(core.attrs.max_dest_rd_atomic);
    Inbound { to: (q.qpn, r.src_qp), dev: &*q.dev, pd: q.pd, qpn: q.qpn, depth }
}

pub(super) fn rd_read(q: &QpInner, core: &mut QpCore, ec: &mut EecCore, r: &Request<'_>, mtu: u64) -> Result<(), Fail> {
    let t = inbound(q, core, ec, r);
    let chan = &mut ec.engine.chan;
    if !chan.out.has_room(t.depth) {
        return Err(invalid()); // ERR-RQ-6
    }
    let npkts = chan.out.read(&t, r, mtu).map_err(refused)?;
    chan.recv.epsn = r.psn.add(npkts).value(); // PKT-PSN-3
    chan.recv.message_done();
    Ok(())
}

pub(super) fn rd_atomic(q: &QpInner, core: &mut QpCore, ec: &mut EecCore, r: &Request<'_>) -> Result<(), Fail> {
    let t = inbound(q, core, ec, r);
    let chan = &mut ec.engine.chan;
    if !chan.out.has_room(t.depth) {
        return Err(invalid()); // ERR-RQ-6
    }
    chan.out.atomic(&t, r).map_err(refused)?;
    chan.recv.epsn = r.psn.next().value();
    chan.recv.message_done();
    Ok(())
}

/// Duplicates are never executed again (see `Outbox::duplicate`, the same for RC).
pub(super) fn duplicate(q: &QpInner, core: &QpCore, ec: &mut EecCore, r: &Request<'_>) -> Result<(), Fail> {
    let t = inbound(q, core, ec, r);
    let chan = &mut ec.engine.chan;
    let last = Psn::new(chan.recv.epsn).sub(1).value();
    match chan.out.duplicate(&t, r, last) {
        true => Ok(()),
        false => Err(Fail::Drop),
    }
}

/// A Resync takes its PSN as the channel's new ePSN and aborts the message in progress; a
/// duplicate Resync is acknowledged again.
pub(super) fn on_resync(qp: Option<(&Arc<QpInner>, &mut QpCore)>, eec: &EecInner, ec: &mut EecCore, r: &Request<'_>) {
    let e = &mut ec.engine;
    let duplicate = !e.want_resync && r.psn.classify(Psn::new(e.chan.recv.epsn)) == PsnClass::Duplicate;
    let from = qp.as_ref().map_or(r.src_qp, |(q, _)| q.qpn);
    if !duplicate {
        if let Some(rx) = e.rx.take() {
            if let (RxMsg::Send { token, wr_id, .. }, Some((q, core))) = (rx.msg, qp) {
                if rx.qpn == q.qpn {
                    complete_held(q, core, eec.eecn, token, wr_id, WcStatus::RemAbortErr, 0, None, r, false);
                }
            }
        }
        e.chan.recv.resync(r.psn.next().value());
        e.want_resync = false;
        e.fatal_nak = None;
    }
    e.chan.out.push((from, r.src_qp), RespJob::Ack { psn: r.psn.value(), syndrome: Syndrome::ACK_NO_CREDITS });
}
