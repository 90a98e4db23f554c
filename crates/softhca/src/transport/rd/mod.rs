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

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::mem::MemRef;
use crate::transport::channel::Channel;
use crate::transport::hca::Hca;
use crate::transport::qp::{QpCore, QpInner};
use crate::transport::rd::eec::{EecAttrs, EecInner};
use crate::transport::wqe::SendWqe;
use crate::types::{Gid, QpState, QpType, WcStatus};
use crate::wire::aeth::Syndrome;
use crate::wire::opcode::Operation;
use crate::wire::roce::RoceDatagram;

use super::completer::Response;
use super::engine::pkey_match;
use super::responder::Request;

pub(crate) mod eec;
mod receive;
mod send;

pub(crate) use receive::owed_acks;
use receive::{emit_response, on_request, on_resync, repeat_fatal_nak};
use send::{abandon_if_orphaned, emit_request, on_response};
pub(crate) use send::{on_timer, qp_turn};

/// An RD QP's side of the service, kept in its `QpCore`.
#[derive(Debug, Default, Clone)]
pub(crate) struct RdQp {
    /// The EEC carrying the SQ head WQE, while one does.
    pub active: Option<u32>,
    /// RQ WQEs bound to a channel's inbound message: (EECN, bind token, WR ID), in bind order.
    pub held: Vec<(u32, u64, u64)>,
    /// RQ slots freed since the last receive CQE: the freed resource count the next one reports.
    pub freed: u32,
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
    /// One past the highest packet index sent: a response beyond it answers nothing sent
    /// (PKT-ACK-8), one below it may answer a packet sent before a go-back. Nonzero once a
    /// packet has left: aborting the message then needs a Resync.
    high: u32,
    /// Packets acknowledged (Send, Write) or responses received (Read).
    done: u32,
    status: Option<WcStatus>,
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
        /// The WQE's scatter list as posted and as last checked, with the device's key
        /// generation read before that check (checked again when it moves, as on RC).
        sges: crate::transport::wqe::SgeList,
        scatter: Vec<MemRef>,
        gen: u64,
        offset: u64,
    },
    Write {
        grant: Option<crate::transport::responder::Grant>,
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

/// A response's address on the channel: from QP `.0` (ours) to QP `.1` (the peer's).
pub(crate) type Route = (u32, u32);

/// An EEC's Send Logic and Receive Logic: the channel's sequencing, timers, responses and
/// Read/Atomic resources (`channel::Channel`, as an RC QP's), and the one message each way.
#[derive(Default)]
pub(crate) struct EecEngine {
    chan: Channel<Route>,
    tx: Option<RdTx>,
    /// A fatal NAK went out: requests are discarded until the requester's Resync, except a
    /// retransmission of the NAKed packet, which gets the NAK again (it may have been lost).
    want_resync: bool,
    /// That NAK: (PSN, syndrome, from QP, to QP).
    fatal_nak: Option<(u32, Syndrome, u32, u32)>,
    rx: Option<RdRx>,
}

impl EecEngine {
    /// Applies a state change made by Modify EEC; `counts_set` when it gave a Retry Count or
    /// an RNR Retry Count.
    pub fn on_modify(&mut self, from: QpState, a: &EecAttrs, counts_set: bool) {
        match (from, a.state) {
            (_, QpState::Reset) => *self = EecEngine::default(),
            (_, QpState::Error) => {
                self.chan.send.stop_timers();
                self.chan.out.clear();
            }
            (QpState::Init, QpState::Rtr) => self.chan.recv.start(a.rq_psn),
            (QpState::Rtr, QpState::Rts) => self.chan.send.start(a.sq_psn, a.retry_cnt, a.rnr_retry),
            // New counts out of SQD hold from the next request packet on (MOD-SQD-RTS-2), as
            // for a QP's.
            (QpState::Sqd, _) if counts_set => self.chan.send.progressed(a.retry_cnt, a.rnr_retry),
            _ => {}
        }
    }

    fn owner_is(&self, q: &QpInner) -> bool {
        matches!(&self.tx, Some(RdTx { owner: Some((o, _)), .. }) if o.qpn == q.qpn && std::ptr::eq(&**o, q))
    }
}

fn find_eec(dev: &dyn Hca, eecn: u32) -> Option<Arc<EecInner>> {
    dev.engine().eecs.read().unwrap_or_else(|e| e.into_inner()).get(&eecn).cloned()
}

fn mtu_of(a: &EecAttrs) -> u64 {
    a.av.map_or(1024, |av| av.path_mtu.bytes() as u64)
}

/// The EECs' turn: responses first, then the next request packet of each channel's message.
pub(crate) fn transmit(dev: &dyn Hca, now: u64, buf: &mut [u8]) -> Option<usize> {
    if !dev.engine().has_eecs() {
        return None; // no RD here: keep the EEC table's lock off the other services' path
    }
    // The table stays read-locked while the channels take their turn (no copy of it per call):
    // nothing takes the table's write lock while holding an EEC's lock.
    let map = dev.engine().eecs.read().unwrap_or_else(|e| e.into_inner());
    let start = dev.engine().eec_cursor.load(Ordering::Relaxed);
    for eec in map.range(start..).chain(map.range(..start)).map(|(_, e)| e) {
        let mut ec = eec.lock();
        if ec.destroyed || matches!(ec.attrs.state, QpState::Reset | QpState::Init | QpState::Error) {
            continue;
        }
        // One packet per channel per turn: the next turn starts at the next channel.
        let next = || dev.engine().eec_cursor.store(eec.eecn.wrapping_add(1), Ordering::Relaxed);
        if ec.engine.chan.out.response_first() {
            if let Some(len) = emit_response(eec, &mut ec, buf) {
                ec.engine.chan.out.took_turn(true, false);
                next();
                return Some(len);
            }
        }
        if ec.attrs.state != QpState::Rtr {
            abandon_if_orphaned(&mut ec.engine);
            if let Some(len) = emit_request(eec, &mut ec, now, buf) {
                ec.engine.chan.out.took_turn(false, false);
                next();
                return Some(len);
            }
        }
        if let Some(len) = emit_response(eec, &mut ec, buf) {
            ec.engine.chan.out.took_turn(true, true);
            next();
            return Some(len);
        }
    }
    None
}

/// Header validation and dispatch of an RD packet: the EEC the RDETH names, then the QP the
/// BTH names. Returns false when the packet was dropped.
pub(crate) fn deliver(dev: &dyn Hca, qps: &super::qp::QpTable, now: u64, d: &RoceDatagram<'_>) -> bool {
    let p = &d.packet;
    let bth = p.bth;
    let (Some(rdeth), Some(info)) = (p.rdeth, bth.opcode.info()) else { return false };
    let Some(eec) = find_eec(dev, rdeth.ee_cnxt) else { return false };
    let is_request = info.direction == crate::wire::opcode::Direction::Request;
    let mut qp = qps.get(bth.dest_qp).filter(|q| q.qp_type == QpType::Rd);
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
        dev.engine().stats.pkey_violations.inc(); // PKT-VAL-7
        return false;
    }
    let src = Gid::from_ipv6(d.ip.src_gid());
    if ec.attrs.av.and_then(|av| av.ah.grh.dgid) != Some(src) {
        return false; // PKT-VAL-11: not from the other end of the channel
    }
    if is_request {
        let Some(deth) = p.deth else { return false };
        let req = Request::of(p, Some(info), None);
        if info.operation == Operation::Resync {
            on_resync(qp.zip(core.as_deref_mut()), &eec, &mut ec, &req);
            return true;
        }
        if ec.engine.want_resync {
            // Whatever became of the QP since, the channel answers for the NAK it sent.
            return repeat_fatal_nak(&mut ec.engine, &req, p.bth.dest_qp);
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
        crate::transport::responder::note_arrival(q, core);
        on_request(q, core, &eec, &mut ec, &req);
        true
    } else {
        let r = Response::of(p, info);
        on_response(qp.zip(core.as_deref_mut()), &eec, &mut ec, now, &r)
    }
}

/// An RD QP's message in flight and the receive WQEs channels hold for it stop counting
/// when the QP is flushed or reset; the channels notice through its epoch.
pub(crate) fn release(q: &QpInner, core: &mut QpCore, flush: bool) {
    if core.rd.active.take().is_some() {
        q.rd_epoch.fetch_add(1, Ordering::AcqRel);
    }
    let held = std::mem::take(&mut core.rd.held);
    for (_, _, wr_id) in held {
        if flush {
            q.flush_recv_cqe(core, wr_id, 0);
        }
    }
    if !flush {
        // Discarded without CQEs (Reset, Destroy): no later CQE reports these slots (CQE-15).
        core.rd.freed = 0;
    }
}
