//! The EEC's Send Logic: an RD QP's turn (starting and completing the SQ head's message), the
//! request packets, the responses to them, retries, timeouts and the Resync.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::transport::hca::Hca;
use crate::transport::qp::{QpCore, QpInner};
use crate::transport::rd::eec::{EecCore, EecInner};
use crate::transport::wqe::{SendFlags, SendWqe, WrOpcode};
use crate::types::{QpState, WcStatus};
use crate::wire::aeth::{NakCode, Syndrome};
use crate::wire::opcode::{Operation, ServiceType};
use crate::wire::psn::Psn;
use crate::wire::{BthRepr, DethRepr, PacketRepr, RdethRepr};

use crate::transport::channel::{ack_timeout_ns, nak_status, take_atomic_ack, take_read_response, Retry};
use crate::transport::completer::{self, Response};
use crate::transport::engine::{add_request_headers, emit, ip_for, request_opcode, TimerOwner};
use crate::transport::requester::{check_local, recheck_local, run_local, ACK_EVERY, WINDOW};

use super::receive::reap_held;
use super::*;

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
            let Some(eec) = find_eec(&*q.dev, eecn) else {
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
        if let Some(status) = run_local(q, head) {
            // A bind or a Local Invalidate is local: it takes effect and completes in order,
            // with no packet.
            retire_head(q, core, status);
            if status != WcStatus::Success {
                return None;
            }
            continue;
        }
        let eecn = head.eecn;
        let Some(eec) = find_eec(&*q.dev, eecn) else {
            fail_head(q, core, WcStatus::InvEecnErr);
            return None;
        };
        if q.rdd != Some(eec.rdd) {
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
        if let Err(status) = check_local(q, u64::MAX, &mut w) {
            drop(ec);
            fail_head(q, core, status);
            return None;
        }
        let mtu = mtu_of(&ec.attrs);
        let npkts = match w.opcode {
            WrOpcode::AtomicCmpSwp | WrOpcode::AtomicFetchAdd => 1,
            _ => w.length.div_ceil(mtu).max(1) as u32,
        };
        // The outbound depth is the EEC's and the QP's both (the QP's is required at its
        // RTR→RTS): 0 in either allows none, as the inbound depth is the smaller of the two.
        let depth = ec.attrs.max_rd_atomic.min(core.attrs.max_rd_atomic);
        if (w.opcode == WrOpcode::RdmaRead || w.opcode.is_atomic()) && depth == 0 {
            drop(ec);
            fail_head(q, core, WcStatus::LocQpOpErr); // an outbound depth of 0 allows none
            return None;
        }
        // WR-SEND-4, WR-SEND-5: a Q_Key with its msb set means "use the QP's own".
        let q_key = if w.remote_qkey & 0x8000_0000 != 0 { core.attrs.qkey } else { w.remote_qkey };
        let e = &mut ec.engine;
        let first_psn = e.chan.send.psn;
        e.chan.send.psn = Psn::new(first_psn).add(npkts).value();
        e.tx = Some(RdTx {
            owner: Some((q.clone(), q.rd_epoch.load(Ordering::Acquire))),
            wqe: w,
            src_qp: q.qpn,
            q_key,
            first_psn,
            npkts,
            next: 0,
            high: 0,
            done: 0,
            status: None,
            resync_after: false,
        });
        e.chan.send.recovering = None;
        core.rd.active = Some(eecn);
        core.req.started = 1;
        return emit_request(&eec, &mut ec, now, buf);
    }
}

/// Retires the SQ head with `status` (see `completer::retire_head`); the QP's channel is free.
pub(super) fn retire_head(q: &QpInner, core: &mut QpCore, status: WcStatus) {
    let carries_on = completer::retire_head(q, core, status, |core| {
        core.rd.active = None;
        core.req.started = 0;
    });
    if carries_on {
        q.check_drained(core);
    }
}

/// Fails the SQ head before or after its EEC took it.
pub(super) fn fail_head(q: &QpInner, core: &mut QpCore, status: WcStatus) {
    retire_head(q, core, status);
}

/// The EEC's message is over: the WQE retires and the channel is free, or carries the Resync
/// a fatal NAK calls for.
pub(super) fn finish(q: &QpInner, core: &mut QpCore, ec: &mut EecCore, status: WcStatus) {
    let Some(tx) = ec.engine.tx.take() else { return };
    ec.engine.chan.send.stop_timers();
    ec.engine.chan.send.recovering = None;
    if tx.resync_after {
        start_resync(&mut ec.engine, &tx);
    }
    retire_head(q, core, status);
}

pub(super) fn start_resync(e: &mut EecEngine, old: &RdTx) {
    let first_psn = e.chan.send.psn;
    e.chan.send.psn = Psn::new(first_psn).next().value();
    let wqe = SendWqe { opcode: WrOpcode::Resync, remote_qpn: old.wqe.remote_qpn, rare: true, ..Default::default() };
    e.tx = Some(RdTx {
        owner: None,
        wqe,
        src_qp: old.src_qp,
        q_key: old.q_key,
        first_psn,
        npkts: 1,
        next: 0,
        high: 0,
        done: 0,
        status: None,
        resync_after: false,
    });
}

/// A message whose QP was flushed or reset under it: a message that has not left is dropped,
/// one that has is followed by a Resync so that the responder's ePSN catches up.
pub(super) fn abandon_if_orphaned(e: &mut EecEngine) {
    let orphaned =
        matches!(&e.tx, Some(RdTx { owner: Some((q, epoch)), .. }) if q.rd_epoch.load(Ordering::Acquire) != *epoch);
    if !orphaned {
        return;
    }
    let Some(tx) = e.tx.take() else { return };
    e.chan.send.stop_timers();
    if tx.high > 0 {
        start_resync(e, &tx); // a packet has left
    } else {
        e.chan.send.psn = tx.first_psn;
    }
}

impl RdTx {
    /// The carried WQE's local buffers, checked again if a key was revoked since, as on the
    /// owner QP's own SQ (`requester::recheck_local`). A Resync (no owner) has none.
    fn recheck_local(&mut self) -> Result<(), WcStatus> {
        match &self.owner {
            Some((q, _)) => recheck_local(q, &mut self.wqe),
            None => Ok(()),
        }
    }
}

/// Sends the next packet of the channel's message, if the window and the RNR wait allow.
pub(super) fn emit_request(eec: &EecInner, ec: &mut EecCore, now: u64, buf: &mut [u8]) -> Option<usize> {
    let dev = &*eec.dev;
    let mtu = mtu_of(&ec.attrs);
    let attrs = ec.attrs.clone();
    let e = &mut ec.engine;
    if e.chan.send.rnr_deadline.is_some() || !e.chan.send.may_send() {
        return None; // an RNR wait, or a timeout's probe waiting for its answer
    }
    let tx = e.tx.as_mut()?;
    if tx.status.is_some() || tx.next >= tx.npkts || tx.next.saturating_sub(tx.done) >= WINDOW {
        return None;
    }
    if let Err(status) = tx.recheck_local() {
        // The channel stays in step as when a message is abandoned (`abandon_if_orphaned`):
        // a Resync once a packet has left, else its PSNs are not used.
        tx.status = Some(status);
        if tx.high > 0 {
            tx.resync_after = true;
        } else {
            e.chan.send.psn = tx.first_psn;
        }
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
    let opcode = request_opcode(ServiceType::Rd, w.opcode, first, last)?;
    let pkey = dev.pkey(attrs.pkey_index).unwrap_or(0xFFFF);
    let mut bth = BthRepr::new(opcode, pkey, w.remote_qpn, psn); // WR-SEND-3
    let solicited_kind = matches!(w.opcode, WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm);
    bth.se = last && solicited_kind && w.flags.contains(SendFlags::SOLICITED);
    bth.ack_req = last || psn.value() % ACK_EVERY == ACK_EVERY - 1 || e.chan.send.probe_due();
    let mut p = PacketRepr::new(bth);
    p.rdeth = Some(RdethRepr { ee_cnxt: attrs.dest_eecn }); // WR-SEND-6
    p.deth = Some(DethRepr { q_key: tx.q_key, src_qp: tx.src_qp });
    add_request_headers(&mut p, w, offset, first, last);
    let ip = ip_for(dev, &attrs.av?.ah)?;
    let len = emit(tx.src_qp, ip, p, payload as usize, buf, None, |out| out.wqe(w, offset))?;
    // A Read asks for all its remaining responses with one request.
    tx.next = if single { tx.npkts } else { k + 1 };
    tx.high = tx.high.max(tx.next);
    e.chan.send.sent(dev, TimerOwner::Eec(eec.eecn), now, attrs.timeout);
    Some(len)
}

pub(super) fn on_response(
    qp: Option<(&Arc<QpInner>, &mut QpCore)>,
    eec: &EecInner,
    ec: &mut EecCore,
    now: u64,
    r: &Response<'_>,
) -> bool {
    let dev = &*eec.dev;
    let timeout = ec.attrs.timeout;
    let rnr_retry = ec.attrs.rnr_retry;
    let retry_cnt = ec.attrs.retry_cnt;
    let mtu = mtu_of(&ec.attrs);
    let e = &mut ec.engine;
    // A message whose QP was flushed meanwhile turns into its Resync first, so that a fatal
    // NAK for it cannot end it without one.
    abandon_if_orphaned(e);
    let Some(tx) = e.tx.as_mut() else { return false };
    let first = Psn::new(tx.first_psn);
    if tx.status.is_some() || !r.psn.in_range(first, first.add(tx.npkts - 1)) || tx.high == 0 {
        return false; // PKT-ACK-8
    }
    // Responses of a QP's message reach that QP; those of a Resync reach the QP it was for.
    if let Some((o, _)) = &tx.owner {
        if !qp.as_ref().is_some_and(|(q, _)| Arc::ptr_eq(q, o)) {
            return false;
        }
    }
    let k = r.psn.distance_from(first);
    if k >= tx.high {
        return false; // nothing this far was sent
    }
    // Any answer ends a timeout's probe (channel::Probe); the go-back then resumes past what
    // the answer acknowledged (below).
    let probed = e.chan.send.answered();
    let before = tx.done;
    let op = tx.wqe.opcode;
    let owner = TimerOwner::Eec(eec.eecn);
    let (mut exhausted, mut reloaded) = (false, false);
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
            if op != WrOpcode::RdmaRead && k > tx.done {
                // What it acknowledges reloads the counts first; then the go-back costs its
                // retry (PKT-RTY-5, PKT-RTY-3), not refunded below.
                tx.done = k;
                e.chan.send.progressed(retry_cnt, rnr_retry);
                reloaded = true;
            }
            exhausted = go_back_or_fail(e, dev, k, false);
        }
        (Operation::Acknowledge, Some(Syndrome::RnrNak { timer_code })) => {
            q_bump(&qp, |s| &s.rnr_naks_received);
            if op != WrOpcode::RdmaRead && k > tx.done {
                // It acknowledges the packets before it: progress reloads both counts (PKT-RNR-8).
                e.chan.send.progressed(retry_cnt, rnr_retry);
            }
            if !e.chan.send.rnr_wait(dev, owner, now, (k, timer_code), rnr_retry) {
                if let Some(tx) = e.tx.as_mut() {
                    tx.status = Some(WcStatus::RnrRetryExcErr);
                }
                e.chan.send.ack_deadline = None;
                to_error_after(ec, qp, eec);
                return true;
            }
            if let Some(tx) = e.tx.as_mut() {
                if op == WrOpcode::RdmaRead {
                    // `done` counts responses received: ask again from the first one missing.
                    tx.next = tx.done;
                } else {
                    tx.done = tx.done.max(k);
                    tx.next = k;
                }
            }
            return true;
        }
        (Operation::Acknowledge, Some(Syndrome::Nak(code))) => {
            tx.status = Some(nak_status(code)); // PKT-NAK-2, ERR-SQ-9: no retransmission
            tx.resync_after = true;
        }
        (Operation::RdmaReadResponse, _) if op == WrOpcode::RdmaRead => {
            if k < tx.done {
                return true; // a duplicate response
            }
            if k > tx.done {
                let missing = tx.done;
                if go_back_or_fail(e, dev, missing, false) {
                    to_error_after(ec, qp, eec); // an implied NAK with no retry left
                }
                return true;
            }
            let n = tx.npkts;
            let landed = tx
                .recheck_local()
                .and_then(|()| take_read_response(&tx.wqe.tx.local, tx.wqe.length, n, k, mtu, r.position, r.payload));
            tx.status = match landed {
                Err(status) => Some(status),
                Ok(()) => {
                    tx.done = k + 1;
                    (tx.done == n).then_some(WcStatus::Success)
                }
            };
        }
        (Operation::AtomicAcknowledge, _) if op.is_atomic() => {
            tx.done = 1;
            let landed = tx.recheck_local().map(|()| take_atomic_ack(&tx.wqe.tx.local, r.atomic_orig.unwrap_or(0)));
            tx.status = Some(landed.unwrap_or_else(|status| status));
        }
        _ => {
            tx.status = Some(WcStatus::BadRespErr); // ERR-SQ-12
            tx.resync_after = true;
        }
    }
    if exhausted {
        to_error_after(ec, qp, eec); // QPS-RD-6
        return true;
    }
    let Some(tx) = e.tx.as_mut() else { return true };
    if probed && tx.status.is_none() {
        tx.next = tx.next.max(tx.done);
    }
    e.chan.send.end_recovery(|k| tx.done > k);
    if tx.done != before && !reloaded {
        e.chan.send.progressed(retry_cnt, rnr_retry);
    }
    let at = if tx.status.is_none() { ack_timeout_ns(timeout).map(|t| now + t) } else { None };
    if tx.done != before || tx.status.is_some() {
        e.chan.send.arm_ack(dev, owner, at);
    }
    if let Some(status) = tx.status {
        match qp {
            Some((q, core)) if tx.owner.is_some() => {
                if core.rd.active == Some(eec.eecn) {
                    finish(q, core, ec, status);
                } else if let Some(tx) = ec.engine.tx.take() {
                    if tx.resync_after {
                        start_resync(&mut ec.engine, &tx);
                    }
                }
            }
            _ if tx.resync_after => {
                // A Resync refused: the channel cannot be brought back in step (QPS-RD-6).
                to_error_after(ec, None, eec);
                ec.engine.tx = None;
            }
            _ => {
                // The Resync is acknowledged: the channel is in step again.
                ec.engine.tx = None;
                ec.engine.chan.send.ack_deadline = None;
            }
        }
    }
    true
}

pub(super) fn q_bump(
    qp: &Option<(&Arc<QpInner>, &mut QpCore)>,
    counter: impl Fn(&crate::transport::engine::Stats) -> &crate::transport::engine::Counter,
) {
    if let Some((q, _)) = qp {
        q.bump(counter);
    }
}

/// Go-back-N inside the message, from packet `k`, counting a retry: once per recovery for a
/// NAK, every time for a timeout. True when no retry was left: the message has failed with
/// Transport Retry Counter Exceeded and the caller moves the EEC to Error (QPS-RD-6).
pub(super) fn go_back_or_fail(e: &mut EecEngine, dev: &dyn Hca, k: u32, timeout: bool) -> bool {
    let Some(tx) = e.tx.as_mut() else { return false };
    match e.chan.send.retry(k, timeout) {
        Retry::Recovering => false,
        Retry::Exhausted => {
            tx.status = Some(WcStatus::RetryExcErr);
            true
        }
        Retry::Back => {
            tx.next = k;
            dev.engine().stats.retransmits.inc();
            false
        }
    }
}

/// Retries ran out: the EEC moves straight to Error (QPS-RD-6); the message completes in
/// error at once if its QP is at hand, else at the QP's next turn.
pub(super) fn to_error_after(ec: &mut EecCore, qp: Option<(&Arc<QpInner>, &mut QpCore)>, eec: &EecInner) {
    ec.attrs.state = QpState::Error;
    ec.engine.chan.send.stop_timers();
    ec.engine.chan.out.clear();
    tracing::debug!(eecn = eec.eecn, "EEC → Error");
    let status = ec.engine.tx.as_ref().and_then(|t| t.status).unwrap_or(WcStatus::RetryExcErr);
    if let Some((q, core)) = qp {
        if core.rd.active == Some(eec.eecn) && ec.engine.owner_is(q) {
            ec.engine.tx = None;
            fail_head(q, core, status);
        }
    }
}

/// An EEC's timer entry `t` is due at `now`: an RNR wait ends, or the ACK timer retries from
/// the first unacknowledged packet, or, out of retries, moves the EEC to Error. A stale entry
/// (the EEC queued an earlier one since, or is gone) does nothing.
pub(crate) fn on_timer(dev: &dyn Hca, eecn: u32, t: u64, now: u64) {
    let Some(eec) = find_eec(dev, eecn) else { return };
    let mut ec = eec.lock();
    let Some(ack_expired) = ec.engine.chan.send.due(t, now) else { return };
    let e = &mut ec.engine;
    if ack_expired {
        if let Some(tx) = e.tx.as_mut() {
            if tx.status.is_none() {
                let from = tx.done;
                if go_back_or_fail(e, dev, from, true) {
                    to_error_after(&mut ec, None, &eec);
                }
            }
        }
    }
    // What is still armed goes back in the queue (a re-arm above may have put it there).
    ec.engine.chan.send.requeue(dev, TimerOwner::Eec(eecn));
}
