//! The SQ Logic (requester): starts WQEs in post order, segments them into request packets by
//! path MTU, assigns PSNs, and goes back N on a NAK or a timeout (a timeout's go-back starts
//! with one probe packet and goes on when it is answered: `channel::Probe`). Which packet goes
//! out next is a cursor over the SQ: `(cursor, cursor_off)`; going back moves the cursor, and
//! retransmitted packets keep their PSNs (PKT-RTY-6).

use crate::transport::channel::Retry;
use crate::transport::qp::{QpCore, QpInner};
use crate::transport::wqe::{SendWqe, WrOpcode};
use crate::types::{Access, QpState, QpType, WcStatus};
use crate::wire::psn::Psn;

/// Requester state of one QP beyond its channel's sequencing (`channel::SendSeq`: the next
/// PSN, the retry budgets and timers, the recovery mark).
#[derive(Debug, Default, Clone)]
pub(crate) struct ReqState {
    /// The WQE (index from the SQ head) whose packets go out next, and how far into it.
    pub cursor: usize,
    pub cursor_off: u64,
    /// WQEs `0..started` have had their first packet transmitted and are not retired: the
    /// in-progress messages of QPS-SQD.
    pub started: usize,
    /// The oldest request PSN not yet acknowledged.
    pub una: u32,
    /// `una` when the retry counts last started again: progress is `una` moving past it
    /// (see `completer::progress`).
    pub una_counted: u32,
    /// One past the highest request PSN sent so far: a packet below it is a retransmission.
    pub sent_high: u32,
    /// RDMA Reads and Atomics started and not yet answered (WR-READ-3).
    pub rd_atomic: u32,
    /// A WQE failed before transmission; nothing after it starts.
    pub halted: bool,
    /// End-to-end credits (IBA 9.7.7.2, RC): the SSN the next new message gets (the first is
    /// 1, as the responder's MSN after it), and the Limit Sequence Number, the MSN plus the
    /// credits of the latest ACK: a message that takes a receive WQE may start while its SSN
    /// is at most one past it (the one beyond is the probe a requester without credits may
    /// send, which the responder answers with fresh credits or an RNR NAK). No limit before
    /// the first ACK says how many (the digest is silent on the initial credits; softhca
    /// starts a connection at full speed, and the responder's RNR NAK covers a receive queue
    /// posted late).
    pub ssn: u32,
    pub lsn: Option<u32>,
    /// An ACK said "no credit information" (code 31: the responder does not count, e.g. on an
    /// SRQ): no limit from then on.
    pub unlimited_credit: bool,
}

impl ReqState {
    /// At RTR→RTS: nothing is outstanding before the SQ Start PSN (MOD-RTR-RTS-2).
    pub fn start(&mut self, sq_psn: u32) {
        *self = ReqState { una: sq_psn, una_counted: sq_psn, sent_high: sq_psn, ssn: 1, ..Default::default() };
    }

    /// Takes the credits of an ACK (any AETH with the ACK syndrome: also a Read response's
    /// and an Atomic ACK's): the LSN only moves forward.
    pub fn take_credits(&mut self, credit_code: u8, msn: u32) {
        match crate::wire::aeth::credits(credit_code) {
            None => self.unlimited_credit = true,
            Some(n) if !self.unlimited_credit => {
                let lsn = Psn::new(msn).add(n);
                if self.lsn.is_none_or(|old| lsn.psn_cmp(Psn::new(old)).is_gt()) {
                    self.lsn = Some(lsn.value());
                }
            }
            Some(_) => {}
        }
    }

    /// Whether a new message that takes a receive WQE may start now.
    pub fn has_credit(&self) -> bool {
        match self.lsn {
            Some(lsn) if !self.unlimited_credit => Psn::new(self.ssn).psn_cmp(Psn::new(lsn).next()).is_le(),
            _ => true,
        }
    }
}

/// The most request PSNs an RC requester has outstanding (sent, not acknowledged). IBA sets no
/// window, but a go-back-N requester without one resends everything in flight after each loss;
/// real RNICs bound it too. A Read counts by its first PSN, so any Read can start.
pub(crate) const WINDOW: u32 = 256;

/// AckReq goes on every this-many-th packet of a long Send or Write as well as on its last, so
/// that the window keeps moving (PKT-ACK-2 asks for the last; any packet may ask).
pub(crate) const ACK_EVERY: u32 = 64;

/// Executes a local SQ operation at once and returns its status: Bind MW (WR-BIND) and Local
/// Invalidate (a type 2 window bound to this QP only, IBA 10.6.7.2; anything else is a Local
/// QP Operation Error, as rxe reports it). `None` for an operation that sends packets.
pub(crate) fn run_local(q: &QpInner, w: &SendWqe) -> Option<WcStatus> {
    let result = match w.opcode {
        WrOpcode::BindMw => match &w.bind {
            Some(b) => q.dev.bind_mw(q.pd, q.qpn, b),
            None => Err(WcStatus::MwBindErr),
        },
        WrOpcode::LocalInv => q.dev.invalidate(q.pd, q.qpn, w.invalidate_rkey, true).map_err(|_| WcStatus::LocQpOpErr),
        WrOpcode::FastReg => match &w.fast_reg {
            Some(req) => q.dev.fast_reg(q.pd, req),
            None => Err(WcStatus::LocQpOpErr),
        },
        _ => return None,
    };
    Some(result.err().unwrap_or(WcStatus::Success))
}

pub(crate) fn pmtu(core: &QpCore) -> u64 {
    core.attrs.av.map_or(1024, |av| av.path_mtu.bytes() as u64)
}

fn packets_for(len: u64, mtu: u64) -> u32 {
    len.div_ceil(mtu).max(1) as u32
}

/// The most a UD message may carry: the AV's path MTU, at most the port's (WR-SEND-9).
pub(crate) fn ud_mtu(q: &QpInner, core: &QpCore) -> u64 {
    let mtu = core.attrs.av.map_or(q.dev.active_mtu().bytes(), |av| av.path_mtu.bytes());
    mtu.min(q.dev.active_mtu().bytes()) as u64
}

/// A Raw message is one packet with its own header: an Ethernet frame has its 14-byte header
/// (destination MAC, source MAC, EtherType), an IPv6 datagram its 40-byte one; neither may
/// exceed the link's largest packet.
fn raw_length_ok(qp_type: QpType, len: u64) -> bool {
    let header = if qp_type == QpType::RawIpv6 { 40 } else { 14 };
    (header..=crate::transport::engine::MAX_DATAGRAM as u64).contains(&len)
}

/// Interface checks made before any packet of a WQE is sent (ERR-SQ-3): every local buffer
/// must pass the key check (WR-COM-9), and a UD message must fit `ud_mtu` (WR-SEND-9).
pub(crate) fn check_local(q: &QpInner, ud_mtu: u64, w: &mut SendWqe) -> Result<(), WcStatus> {
    check_keys(q, w)?;
    if q.qp_type == QpType::Ud && w.length > ud_mtu {
        return Err(WcStatus::LocLenErr);
    }
    if q.qp_type.is_raw() && !raw_length_ok(q.qp_type, w.length) {
        return Err(WcStatus::LocLenErr);
    }
    Ok(())
}

/// Every local buffer's key check (WR-COM-9), keeping the memory checked and the device's key
/// generation read before the checks (a revocation racing them shows at the next recheck).
fn check_keys(q: &QpInner, w: &mut SendWqe) -> Result<(), WcStatus> {
    w.tx.local_gen = q.dev.key_generation();
    w.tx.local.clear();
    let need = match w.opcode {
        WrOpcode::RdmaRead | WrOpcode::AtomicCmpSwp | WrOpcode::AtomicFetchAdd => Access::LOCAL_WRITE,
        _ => Access::empty(),
    };
    if w.inline.is_empty() || !w.opcode.gathers() {
        for sge in &w.sges {
            if sge.length == 0 {
                continue;
            }
            let m = q
                .dev
                .check_access(sge.lkey, q.pd, q.qpn, sge.addr, sge.length as u64, need)
                .map_err(|_| WcStatus::LocProtErr)?;
            w.tx.local.push(m);
        }
    }
    Ok(())
}

/// A started WQE's local buffers, checked again before they are touched again if any key was
/// revoked since their last check (the device's key generation moved: one atomic load), as
/// a responder checks a remote grant again (`responder::Grant::bytes`). A region deregistered
/// or invalidated under a message in progress (a later packet, a retransmission, a Read
/// response or Atomic result to land) is then Local Protection Error, and its memory, which
/// a C program may have freed by now, is left alone.
pub(crate) fn recheck_local(q: &QpInner, w: &mut SendWqe) -> Result<(), WcStatus> {
    if q.dev.key_generation() == w.tx.local_gen {
        return Ok(());
    }
    check_keys(q, w)
}

/// What the next request packet is: the WQE index, the byte offset into its message and the
/// payload length. `None` when the requester has nothing to send now.
pub(crate) struct NextPacket {
    pub idx: usize,
    pub offset: u64,
    pub payload: u64,
    pub psn: u32,
}

/// Picks the next request packet and advances the cursor past it. Starting a WQE assigns its
/// PSNs; a WQE that fails its interface checks is marked done in error instead.
pub(crate) fn next_packet(q: &QpInner, core: &mut QpCore) -> Option<NextPacket> {
    let state = core.attrs.qp_state;
    if !matches!(state, QpState::Rts | QpState::Sqd) || core.chan.send.rnr_deadline.is_some() {
        return None; // QPS-RTR-5, QPS-SQE-2, QPS-ERR-1
    }
    if !core.chan.send.may_send() {
        return None; // a timeout's probe waits for its answer (channel::Probe)
    }
    // A UD or Raw message is one packet whatever its length (an oversized one fails
    // check_local).
    let mtu = if q.qp_type.one_packet_messages() { u64::MAX } else { pmtu(core) };
    loop {
        let idx = core.req.cursor;
        if idx >= core.sq.len() {
            return None;
        }
        if idx == core.req.started {
            // A new message: QPS-SQD-3 keeps SQD from starting one.
            if state == QpState::Sqd || core.req.halted {
                return None;
            }
            let w = core.sq.get(idx)?;
            let is_rd_atomic = w.opcode.awaits_response();
            if w.flags.contains(crate::transport::wqe::SendFlags::FENCE) && core.req.rd_atomic > 0 {
                return None; // WR-COM-6
            }
            if is_rd_atomic && core.req.rd_atomic >= core.attrs.max_rd_atomic as u32 {
                return None; // WR-READ-3
            }
            if q.qp_type.is_reliable_connected()
                && Psn::new(core.chan.send.psn).distance_from(Psn::new(core.req.una)) >= WINDOW
            {
                return None; // start it only when its first packet can go
            }
            if q.qp_type.is_reliable_connected() && w.opcode.consumes_rq_wqe() && !core.req.has_credit() {
                q.bump(|s| &s.credit_waits);
                return None; // IBA 9.7.7.2: an ACK with credits (or for the probe) wakes it
            }
            let ud_mtu = ud_mtu(q, core);
            // The WQE is worked on in its slot: `req`, `chan` and `sq` are separate fields.
            let req = &mut core.req;
            let send = &mut core.chan.send;
            let w = core.sq.get_mut(idx)?;
            if let Some(status) = run_local(q, w) {
                // A bind or a Local Invalidate is a local operation: it takes effect now, for
                // every WQE after it, and completes in order with no packet.
                w.tx.first_psn = send.psn;
                w.tx.npkts = 0;
                w.tx.status = Some(status);
                req.started += 1;
                req.cursor += 1;
                req.cursor_off = 0;
                let failed = status != WcStatus::Success;
                req.halted |= failed;
                if failed {
                    return None;
                }
                continue;
            }
            let checked = check_local(q, ud_mtu, w);
            let npkts = match w.opcode {
                WrOpcode::AtomicCmpSwp | WrOpcode::AtomicFetchAdd => 1,
                _ if q.qp_type.one_packet_messages() => 1,
                _ => packets_for(w.length, mtu),
            };
            w.tx.first_psn = send.psn;
            w.tx.npkts = npkts;
            w.tx.resp_received = 0;
            w.tx.status = None;
            req.started += 1;
            req.cursor_off = 0;
            if let Err(status) = checked {
                w.tx.status = Some(status);
                w.tx.npkts = 0;
                req.halted = true;
                req.cursor += 1;
                return None;
            }
            send.psn = Psn::new(send.psn).add(npkts).value();
            req.ssn = Psn::new(req.ssn).next().value(); // every message on the wire has an SSN
            if is_rd_atomic {
                req.rd_atomic += 1;
            }
        }
        let w = core.sq.get_mut(idx)?;
        if w.tx.status.is_some() {
            // Done already (a retransmission passing it): skip.
            core.req.cursor += 1;
            core.req.cursor_off = 0;
            continue;
        }
        if let Err(status) = recheck_local(q, w) {
            // Its memory is no longer the WQE's: it fails, and the QP with it, when it retires.
            w.tx.status = Some(status);
            core.req.halted = true;
            core.req.cursor += 1;
            core.req.cursor_off = 0;
            return None;
        }
        let w = &*w;
        let offset = core.req.cursor_off;
        if q.qp_type.is_reliable_connected() {
            let psn = Psn::new(w.tx.first_psn).add((offset / mtu) as u32);
            if psn.distance_from(Psn::new(core.req.una)) >= WINDOW {
                return None;
            }
        }
        let single = matches!(w.opcode, WrOpcode::RdmaRead) || w.opcode.is_atomic();
        let payload = if single { 0 } else { (w.length - offset.min(w.length)).min(mtu) };
        let psn = Psn::new(w.tx.first_psn).add((offset / mtu) as u32).value();
        let end = offset + payload;
        if single || end >= w.length {
            core.req.cursor += 1;
            core.req.cursor_off = 0;
        } else {
            core.req.cursor_off = end;
        }
        return Some(NextPacket { idx, offset, payload, psn });
    }
}

/// Go-back-N: the next packet sent is the one with PSN `psn` (PKT-NAK-1, PKT-RTY-1); a partly
/// answered Read is re-requested from its first missing response (PKT-RTY-6).
pub(crate) fn go_back(core: &mut QpCore, psn: Psn) {
    let mtu = pmtu(core);
    for idx in 0..core.req.started {
        let Some(w) = core.sq.get(idx) else { break };
        if w.tx.status.is_none() && w.tx.npkts > 0 && w.tx.contains(psn) {
            let k = psn.distance_from(Psn::new(w.tx.first_psn)) as u64;
            core.req.cursor = idx;
            core.req.cursor_off = if w.opcode.is_atomic() { 0 } else { k * mtu };
            return;
        }
    }
    core.req.cursor = core.req.started;
    core.req.cursor_off = 0;
}

/// The Local ACK timer expired (PKT-RTY-1, PKT-RTY-3, PKT-RTY-4): the go-back starts with a
/// probe (channel::Probe).
pub(crate) fn on_ack_timeout(q: &QpInner, core: &mut QpCore) {
    if !core.outstanding() {
        return;
    }
    q.bump(|s| &s.timeouts);
    retry_or_fail(q, core, Psn::new(core.req.una), true);
}

/// A response ended a probe: a go-back whose next packet the response acknowledged resumes at
/// the oldest packet still unacknowledged (everything, when the response covered it all).
pub(crate) fn resume_after_probe(core: &mut QpCore) {
    let idx = core.req.cursor;
    if idx >= core.req.started {
        return; // at new work: nothing sent before to skip
    }
    let Some(w) = core.sq.get(idx) else { return };
    let next = Psn::new(w.tx.first_psn).add((core.req.cursor_off / pmtu(core)) as u32);
    let una = Psn::new(core.req.una);
    if una.psn_cmp(next).is_gt() {
        go_back(core, una);
    }
}

/// Goes back to `from` for a NAK, an implied NAK or a timeout, at the cost of one retry (see
/// `SendSeq::retry`), or, none left, fails the oldest unacknowledged WQE with Transport Retry
/// Counter Exceeded (PKT-RTY-7: 7 is an ordinary count). True when it went back.
pub(crate) fn retry_or_fail(q: &QpInner, core: &mut QpCore, from: Psn, timeout: bool) -> bool {
    match core.chan.send.retry(from.value(), timeout) {
        Retry::Recovering => return false,
        Retry::Back => {}
        Retry::Exhausted => {
            // IBA 17.2.8: out of retries on the primary path with an armed alternate, the QP
            // migrates and tries again there with its counts reloaded (as rdmavt's restart).
            let armed = core.attrs.path_mig_state == crate::types::MigState::Armed;
            if !(armed && q.migrate(core, true)) {
                fail_oldest(core, from, WcStatus::RetryExcErr);
                return false;
            }
            core.chan.send.progressed(core.attrs.retry_cnt, core.attrs.rnr_retry);
        }
    }
    q.bump(|s| &s.retransmits);
    go_back(core, from);
    true
}

/// Marks the WQE holding `psn` (or else the oldest unfinished one) done with `status`; nothing
/// new starts after it. WQEs before it that still wait for their ACKs keep the timers, so that
/// they are retransmitted and complete first (ORD-SQ-3); the failed one retires after them.
pub(crate) fn fail_oldest(core: &mut QpCore, psn: Psn, status: WcStatus) {
    let started = core.req.started;
    let unfinished = |core: &QpCore, i: usize| core.sq.get(i).is_some_and(|w| w.tx.status.is_none());
    let target = (0..started)
        .find(|&i| unfinished(core, i) && core.sq.get(i).is_some_and(|w| w.tx.contains(psn)))
        .or_else(|| (0..started).find(|&i| unfinished(core, i)));
    if let Some(i) = target {
        if let Some(w) = core.sq.get_mut(i) {
            w.tx.status = Some(status);
        }
    }
    core.req.halted = true;
    let earlier_waiting = target.is_some_and(|t| (0..t).any(|i| unfinished(core, i)));
    if !earlier_waiting {
        core.req.cursor = started;
        core.req.cursor_off = 0;
        core.chan.send.stop_timers();
    }
}
