//! The completer: takes the responses of an RC QP (ACK, NAK, RDMA Read responses, Atomic
//! ACKs), marks WQEs done, and retires them from the SQ head in post order with their CQEs.

use crate::transport::qp::{wc_opcode_of, QpCore, QpInner};
use crate::transport::wqe::WrOpcode;
use crate::types::{Wc, WcFlags, WcStatus};
use crate::wire::aeth::{NakCode, Syndrome};
use crate::wire::opcode::{Operation, Position};
use crate::wire::psn::Psn;

use super::channel::{ack_timeout_ns, nak_status, take_atomic_ack, take_read_response};
use super::engine::TimerOwner;
use super::requester::{fail_oldest, go_back, pmtu, recheck_local, resume_after_probe, retry_or_fail};

/// An inbound response, reduced to what the completer needs.
pub(crate) struct Response<'a> {
    pub psn: Psn,
    pub operation: Operation,
    pub position: Position,
    pub syndrome: Option<Syndrome>,
    /// The AETH's MSN (with an ACK syndrome, its credits count from it).
    pub msn: Option<u32>,
    pub atomic_orig: Option<u64>,
    pub payload: &'a [u8],
}

impl<'a> Response<'a> {
    /// The response a packet with opcode `info` carries.
    pub fn of(p: &crate::wire::PacketRepr<'a>, info: &crate::wire::opcode::OpcodeInfo) -> Self {
        Response {
            psn: p.bth.psn,
            operation: info.operation,
            position: info.position,
            syndrome: p.aeth.map(|a| a.syndrome),
            msn: p.aeth.map(|a| a.msn),
            atomic_orig: p.atomic_ack_eth.map(|a| a.orig_remote_data),
            payload: p.payload,
        }
    }
}

/// The index of the started WQE whose PSNs hold `psn`.
fn wqe_of(core: &QpCore, psn: Psn) -> Option<usize> {
    (0..core.req.started).find(|&i| core.sq.get(i).is_some_and(|w| w.tx.npkts > 0 && w.tx.contains(psn)))
}

/// Handles one response. Returns false when it was dropped as outside the outstanding range
/// (PKT-ACK-8).
pub(crate) fn on_response(q: &QpInner, core: &mut QpCore, now: u64, r: &Response<'_>) -> bool {
    let una = Psn::new(core.req.una);
    let sent = Psn::new(core.req.sent_high);
    // Only PSNs in [una, sent_high) answer something that was sent (PKT-ACK-8): PSNs of a
    // message whose later packets have not left yet are not acknowledged by anyone. A NAK may
    // name una itself.
    if !core.outstanding() || una == sent || !r.psn.in_range(una, sent.sub(1)) {
        return false;
    }
    let Some(idx) = wqe_of(core, r.psn) else { return false };
    // Any answer ends a timeout's probe: the path carries again (channel::Probe).
    let probed = core.chan.send.answered();
    if let (Some(Syndrome::Ack { credit_code }), Some(msn)) = (r.syndrome, r.msn) {
        core.req.take_credits(credit_code, msn); // IBA 9.7.7.2
    }
    match r.operation {
        Operation::Acknowledge => match r.syndrome {
            Some(Syndrome::Ack { .. }) => {
                ack_through(q, core, now, r.psn);
            }
            Some(Syndrome::Nak(NakCode::PsnSeqErr)) => {
                q.bump(|s| &s.seq_naks_received);
                if ack_through(q, core, now, r.psn.sub(1)) {
                    // What it acknowledges reloads the counts first; then it costs a retry
                    // (PKT-RTY-5, PKT-RTY-3), and the ACK timer restarts for the resent packets.
                    progress(q, core, now);
                    if retry_or_fail(q, core, r.psn, false) {
                        // PKT-NAK-1
                        let at = ack_timeout_ns(core.attrs.timeout).map(|t| now + t);
                        core.chan.send.arm_ack(&*q.dev, TimerOwner::Qp(q.qpn), at);
                    }
                }
            }
            Some(Syndrome::RnrNak { timer_code }) => {
                q.bump(|s| &s.rnr_naks_received);
                if ack_through(q, core, now, r.psn.sub(1)) {
                    progress(q, core, now); // PKT-RNR-8, before this NAK's own count
                    on_rnr_nak(q, core, now, r.psn, timer_code);
                }
            }
            Some(Syndrome::Nak(code)) => {
                if ack_through(q, core, now, r.psn.sub(1)) {
                    fail_oldest(core, r.psn, nak_status(code)); // PKT-NAK-2, ERR-SQ-6..9
                }
            }
            _ => return false,
        },
        Operation::RdmaReadResponse => on_read_response(q, core, now, idx, r),
        Operation::AtomicAcknowledge => {
            let Some(w) = core.sq.get(idx) else { return false };
            if !w.opcode.is_atomic() || Psn::new(w.tx.first_psn) != r.psn {
                fail_oldest(core, r.psn, WcStatus::BadRespErr); // ERR-SQ-12
            } else if ack_through(q, core, now, r.psn.sub(1)) {
                // Nothing retires before the end of on_response, so idx still names the WQE.
                let Some(w) = core.sq.get_mut(idx) else { return false };
                let landed = recheck_local(q, w).map(|()| take_atomic_ack(&w.tx.local, r.atomic_orig.unwrap_or(0)));
                w.tx.status = Some(landed.unwrap_or_else(|status| status));
                core.req.rd_atomic = core.req.rd_atomic.saturating_sub(1);
                acknowledge(core, r.psn);
            }
        }
        _ => return false,
    }
    progress(q, core, now);
    if probed {
        resume_after_probe(core);
    }
    // The oldest unacknowledged PSN never passes a response still missing.
    debug_assert!(missing_response(core, Psn::new(core.chan.send.psn).sub(1))
        .is_none_or(|m| Psn::new(core.req.una).psn_cmp(m).is_le()));
    retire(q, core);
    true
}

/// The first missing response PSN of an unfinished Read, Atomic or Atomic Write at or before
/// `psn`, if any: a response past it means it was lost (PKT-ACK-7).
fn missing_response(core: &QpCore, psn: Psn) -> Option<Psn> {
    for i in 0..core.req.started {
        let w = core.sq.get(i)?;
        let first = Psn::new(w.tx.first_psn);
        if first.psn_cmp(psn).is_gt() {
            break;
        }
        if w.tx.status.is_none() && w.opcode.awaits_response() {
            return Some(first.add(w.tx.resp_received));
        }
    }
    None
}

/// Acknowledges every request packet up to and including `n` (PKT-ACK-4, PKT-NAK-3): Sends,
/// Writes and Binds whose last packet is at most `n` are done. An unfinished Read or Atomic
/// inside that range is an implied NAK (PKT-ACK-7), handled as a PSN Sequence Error from its
/// first missing response (once per recovery); then only what precedes that response is
/// acknowledged and false is returned, so that the caller's own handling is skipped.
fn ack_through(q: &QpInner, core: &mut QpCore, now: u64, n: Psn) -> bool {
    if n.psn_cmp(Psn::new(core.req.una)).is_lt() {
        return true; // nothing new below n
    }
    match missing_response(core, n) {
        Some(missing) if missing.psn_cmp(n).is_le() => {
            implied_nak(q, core, now, missing);
            false
        }
        _ => {
            acknowledge(core, n);
            true
        }
    }
}

/// A response past `missing` arrived while `missing` was not answered: everything before it is
/// acknowledged and the requester goes back to it. As for a PSN Sequence Error NAK, what it
/// acknowledges reloads the counts before the go-back costs its retry (PKT-ACK-7, PKT-RTY-5).
fn implied_nak(q: &QpInner, core: &mut QpCore, now: u64, missing: Psn) {
    acknowledge(core, missing.sub(1));
    progress(q, core, now);
    if core.chan.send.recovering != Some(missing.value()) {
        q.bump(|s| &s.implied_naks);
        retry_or_fail(q, core, missing, false);
    }
}

/// Marks done the Sends, Writes and Binds whose packets all lie at or before `n`, and moves
/// the oldest unacknowledged PSN past `n`.
fn acknowledge(core: &mut QpCore, n: Psn) {
    for i in 0..core.req.started {
        let Some(w) = core.sq.get_mut(i) else { break };
        if w.tx.npkts == 0 {
            continue;
        }
        if w.tx.last_psn().psn_cmp(n).is_gt() {
            break;
        }
        if w.tx.status.is_none() && !w.opcode.awaits_response() {
            w.tx.status = Some(WcStatus::Success); // PKT-ACK-5
        }
    }
    advance_una(core, n.next());
}

fn advance_una(core: &mut QpCore, to: Psn) {
    if to.psn_cmp(Psn::new(core.req.una)).is_gt() && to.psn_cmp(Psn::new(core.chan.send.psn)).is_le() {
        core.req.una = to.value();
    }
}

/// PKT-RNR-2..5: wait the NAK's timer, then go back to the NAKed request. An RNR Retry Count
/// of 7 never runs out.
fn on_rnr_nak(q: &QpInner, core: &mut QpCore, now: u64, psn: Psn, timer_code: u8) {
    let nak = (psn.value(), timer_code);
    if !core.chan.send.rnr_wait(&*q.dev, TimerOwner::Qp(q.qpn), now, nak, core.attrs.rnr_retry) {
        fail_oldest(core, psn, WcStatus::RnrRetryExcErr); // ERR-SQ-11
        return;
    }
    q.bump(|s| &s.retransmits);
    go_back(core, psn);
}

fn on_read_response(q: &QpInner, core: &mut QpCore, now: u64, idx: usize, r: &Response<'_>) {
    let mtu = pmtu(core);
    let Some(w) = core.sq.get(idx) else { return };
    if !matches!(w.opcode, WrOpcode::RdmaRead | WrOpcode::AtomicWrite) {
        fail_oldest(core, r.psn, WcStatus::BadRespErr); // ERR-SQ-12
        return;
    }
    let expected = Psn::new(w.tx.first_psn).add(w.tx.resp_received);
    match r.psn.psn_cmp(expected) {
        std::cmp::Ordering::Less => return, // a duplicate response
        std::cmp::Ordering::Greater => {
            // A missing response packet: from the first response missing on any Read or
            // Atomic up to here.
            let missing = missing_response(core, r.psn).unwrap_or(expected);
            implied_nak(q, core, now, missing);
            return;
        }
        std::cmp::Ordering::Equal => {}
    }
    if !ack_through(q, core, now, r.psn.sub(1)) {
        return;
    }
    let Some(w) = core.sq.get_mut(idx) else { return };
    let (k, n) = (w.tx.resp_received, w.tx.npkts);
    let landed = match w.opcode {
        // An Atomic Write is answered by one Read response with no payload: nothing lands.
        WrOpcode::AtomicWrite => take_read_response(&[], 0, 1, 0, mtu, r.position, r.payload),
        _ => recheck_local(q, w)
            .and_then(|()| take_read_response(&w.tx.local, w.length, n, k, mtu, r.position, r.payload)),
    };
    if let Err(status) = landed {
        w.tx.status = Some(status);
        core.req.halted = true;
        return;
    }
    w.tx.resp_received += 1;
    if w.tx.resp_received == n {
        w.tx.status = Some(WcStatus::Success); // PKT-ACK-6
        core.req.rd_atomic = core.req.rd_atomic.saturating_sub(1);
    }
    acknowledge(core, r.psn);
}

/// Writes `data` at byte `offset` of a scatter list, in list order (WR-READ-2).
pub(crate) fn scatter(list: &[crate::mem::MemRef], mut offset: u64, mut data: &[u8]) -> Result<(), ()> {
    for m in list {
        if data.is_empty() {
            return Ok(());
        }
        let len = m.len() as u64;
        if offset >= len {
            offset -= len;
            continue;
        }
        let n = ((len - offset) as usize).min(data.len());
        m.write(offset as usize, &data[..n]).map_err(|_| ())?;
        data = &data[n..];
        offset = 0;
    }
    if data.is_empty() {
        Ok(())
    } else {
        Err(())
    }
}

/// After a response that acknowledged something new since the counts last reloaded, they
/// reload (PKT-RTY-5, PKT-RNR-8) and the ACK timer restarts, or stops with nothing
/// outstanding. Called where a NAK's own retry is about to be charged, so that the reload
/// comes first, and once at the end of each response.
fn progress(q: &QpInner, core: &mut QpCore, now: u64) {
    let una = Psn::new(core.req.una);
    core.chan.send.end_recovery(|x| una.psn_cmp(Psn::new(x)).is_gt());
    if core.req.una != core.req.una_counted {
        core.req.una_counted = core.req.una;
        core.chan.send.progressed(core.attrs.retry_cnt, core.attrs.rnr_retry);
        let at = if core.outstanding() && core.chan.send.rnr_deadline.is_none() {
            ack_timeout_ns(core.attrs.timeout).map(|t| now + t)
        } else {
            None
        };
        core.chan.send.arm_ack(&*q.dev, TimerOwner::Qp(q.qpn), at);
    }
}

/// Retires done WQEs from the SQ head in post order (ORD-SQ-3, ORD-SQ-6); see `retire_head`.
pub(crate) fn retire(q: &QpInner, core: &mut QpCore) {
    while core.req.started > 0 {
        let Some(status) = core.sq.get(0).and_then(|w| w.tx.status) else { break };
        let carries_on = retire_head(q, core, status, |core| {
            core.req.started -= 1;
            if core.req.cursor > 0 {
                core.req.cursor -= 1;
            } else {
                core.req.cursor_off = 0;
            }
        });
        if !carries_on {
            return;
        }
    }
    if core.req.started == 0 {
        core.req.halted = false;
    }
    q.check_drained(core);
}

/// Takes the SQ head off with its completion `status`, `popped` doing the service's
/// bookkeeping once it is off: a CQE when signaled or unsuccessful (WR-COM-2..4). An
/// unsuccessful one moves a UC, UD or RD QP to SQE before its error CQE can be seen, and the
/// WQEs behind it are flushed (ERR-SQ-1, QPT-AUTO-1, QPT-AUTO-2; see `QpInner::begin_sqe`), and
/// an RC QP to Error with everything flushed (ERR-SQ-2); a CQE that does not fit moves the QP to Error
/// (CQ-OVF-2). True when the QP carries on as it was. One place for RC, UC, UD and RD.
pub(crate) fn retire_head(q: &QpInner, core: &mut QpCore, status: WcStatus, popped: impl FnOnce(&mut QpCore)) -> bool {
    let Some(w) = core.sq.get(0) else { return true };
    // A request with immediate data says so in its own completion too (outside the digest's
    // fields, CQE-9 being the receiver's): Linux's rxe and ConnectX do.
    let with_imm = matches!(w.opcode, WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm);
    let wc = Wc {
        wr_id: w.wr_id,
        status,
        opcode: wc_opcode_of(w.opcode),
        byte_len: if w.opcode.is_atomic() { 8 } else { w.length as u32 },
        qp_num: q.qpn,
        wc_flags: if with_imm && status == WcStatus::Success { WcFlags::WITH_IMM } else { WcFlags::empty() },
        ..Default::default()
    };
    let failed = status != WcStatus::Success;
    let report = failed || w.signaled;
    core.sq.pop();
    popped(core);
    let sqe = (failed && !q.qp_type.is_reliable_connected()).then(|| q.begin_sqe(core));
    if report && q.send_cq.push(wc, failed).is_err() {
        q.enter_error(core, false);
        return false;
    }
    if failed {
        match sqe {
            Some(queued) => q.finish_sqe(core, queued),
            None => q.enter_error(core, true),
        }
        return false;
    }
    true
}
