//! The connection manager's state machine (IBA 12.9) between two ports over a virtual MAD
//! channel with a virtual clock: loss, duplication and reordering of MADs with fixed seeds.
//! Each side sees each event exactly once; retries are bounded by Max CM Retries.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use softhca::transport::cm::*;
use softhca::wire::mad::{CmDreq, CmMessage, CmMra, CmRej, CmRep, CmReq, CmRtu, MadHeaderRepr};

const A: Peer = [1; 16];
const B: Peer = [2; 16];
const SERVICE: u64 = 0x0000_0000_0106_1c06;

/// Says which MADs to drop: (to b?, MAD).
type DropFilter = Box<dyn FnMut(bool, &[u8]) -> bool>;

struct Net {
    a: Cm,
    b: Cm,
    now: u64,
    rng: StdRng,
    loss: f64,
    dup: f64,
    /// (deliver at, to b?, MAD)
    flight: Vec<(u64, bool, Vec<u8>)>,
    ev_a: Vec<CmEvent>,
    ev_b: Vec<CmEvent>,
    /// MADs each side put on the wire (before faults).
    sent: (usize, usize),
    /// Every MAD put on the wire, in order: (from a?, MAD).
    wire: Vec<(bool, Vec<u8>)>,
    /// A side that has vanished: what it sends is lost, nothing reaches it, its timers stop.
    gone: (bool, bool),
    /// Drops the MADs it returns true for: (to b?, MAD).
    drop: Option<DropFilter>,
}

impl Net {
    fn new(seed: u64, loss: f64, dup: f64) -> Net {
        let mut b = Cm::new(0xB0B);
        b.listen(SERVICE);
        Net {
            a: Cm::new(0xA11CE),
            b,
            now: 0,
            rng: StdRng::seed_from_u64(seed),
            loss,
            dup,
            flight: Vec::new(),
            ev_a: Vec::new(),
            ev_b: Vec::new(),
            sent: (0, 0),
            wire: Vec::new(),
            gone: (false, false),
            drop: None,
        }
    }

    /// Runs until nothing is in flight and no deadline falls before `until`; `b_policy`
    /// answers b's events (accept or reject a REQ).
    fn run(&mut self, until: u64, mut b_policy: impl FnMut(&mut Cm, u64, &CmEvent)) {
        loop {
            // Until neither side has anything queued: a policy's answer goes out at once.
            let mut busy = true;
            while busy {
                busy = false;
                for to_b in [true, false] {
                    let src = if to_b { &mut self.a } else { &mut self.b };
                    while let Some((peer, mad)) = src.poll_transmit() {
                        busy = true;
                        assert_eq!(peer, if to_b { B } else { A }, "addressed to the other side");
                        if to_b {
                            self.sent.0 += 1
                        } else {
                            self.sent.1 += 1
                        }
                        self.wire.push((to_b, mad.to_vec()));
                        let (from_gone, to_gone) = if to_b { self.gone } else { (self.gone.1, self.gone.0) };
                        if from_gone || to_gone || self.drop.as_mut().is_some_and(|d| d(to_b, &mad[..])) {
                            continue;
                        }
                        let copies = if self.rng.random_bool(self.dup) { 2 } else { 1 };
                        for _ in 0..copies {
                            if !self.rng.random_bool(self.loss) {
                                let at = self.now + self.rng.random_range(1_000..300_000); // reorders
                                self.flight.push((at, to_b, mad.to_vec()));
                            }
                        }
                    }
                }
                // Each consumer answers the peer's DREQ with its own disconnect (the DREP), as
                // a program calls rdma_disconnect on DISCONNECTED.
                while let Some(e) = self.a.poll_event() {
                    if let CmEvent::Disconnected { id, .. } = e {
                        busy |= self.a.disconnect(self.now, id);
                    }
                    self.ev_a.push(e);
                }
                while let Some(e) = self.b.poll_event() {
                    busy = true;
                    if let CmEvent::Disconnected { id, .. } = e {
                        self.b.disconnect(self.now, id);
                    }
                    b_policy(&mut self.b, self.now, &e);
                    self.ev_b.push(e);
                }
            }
            let next_flight = self.flight.iter().map(|f| f.0).min();
            let ta = if self.gone.0 { None } else { self.a.poll_timeout() };
            let tb = if self.gone.1 { None } else { self.b.poll_timeout() };
            let next = [next_flight, ta, tb].into_iter().flatten().min();
            match next {
                Some(t) if t <= until => self.now = self.now.max(t),
                _ => return,
            }
            self.flight.sort_by_key(|f| f.0);
            let due: Vec<_> = self.flight.iter().take_while(|f| f.0 <= self.now).cloned().collect();
            self.flight.drain(..due.len());
            for (_, to_b, mad) in due {
                if to_b && !self.gone.1 {
                    self.b.handle_mad(self.now, A, &mad)
                } else if !to_b && !self.gone.0 {
                    self.a.handle_mad(self.now, B, &mad)
                }
            }
            if !self.gone.0 {
                self.a.handle_timeout(self.now);
            }
            if !self.gone.1 {
                self.b.handle_timeout(self.now);
            }
        }
    }
}

fn params() -> ConnectParams {
    ConnectParams {
        service_id: SERVICE,
        local_qpn: 0x11,
        starting_psn: 0xABC,
        response_timeout: 16, // 268 ms
        max_cm_retries: 15,
        responder_resources: 1,
        initiator_depth: 1,
        local_gid: A,
    }
}

fn accept(cm: &mut Cm, now: u64, e: &CmEvent) {
    if let CmEvent::ConnectRequest { id, .. } = e {
        assert!(cm.accept(now, *id, 0x22, 0xDEF));
    }
}

fn count(evs: &[CmEvent], f: impl Fn(&CmEvent) -> bool) -> usize {
    evs.iter().filter(|e| f(e)).count()
}

/// REQ, REP, RTU and DREQ, DREP across a channel that loses 30%, duplicates 20% and reorders
/// MADs: every exchange completes, each side sees one ConnectRequest / Established /
/// Disconnected each, with the other side's QPN and PSN, whatever was repeated.
#[test]
fn connect_and_disconnect_survive_loss_duplication_and_reordering() {
    let mut resent = 0;
    for seed in 1..=40 {
        let mut n = Net::new(seed, 0.3, 0.2);
        let id = n.a.connect(0, B, &params());
        n.run(60_000_000_000, accept);
        let est = |e: &CmEvent| matches!(e, CmEvent::Established { .. });
        assert_eq!(count(&n.ev_a, est), 1, "seed {seed}: a {:?}", n.ev_a);
        assert_eq!(count(&n.ev_b, est), 1, "seed {seed}: b {:?}", n.ev_b);
        assert_eq!(count(&n.ev_b, |e| matches!(e, CmEvent::ConnectRequest { .. })), 1, "seed {seed}");
        assert!(n.ev_a.contains(&CmEvent::Established { id, remote_qpn: 0x22, remote_psn: 0xDEF }), "seed {seed}");
        let CmEvent::ConnectRequest { req, peer, .. } = &n.ev_b[0] else { panic!("seed {seed}: {:?}", n.ev_b) };
        assert_eq!((*peer, req.local_qpn, req.starting_psn, req.service_id), (A, 0x11, 0xABC, SERVICE));
        assert!(n.ev_b.iter().any(|e| matches!(e, CmEvent::Established { remote_qpn: 0x11, remote_psn: 0xABC, .. })));

        assert!(n.a.disconnect(n.now, id));
        n.run(n.now + 60_000_000_000, accept);
        let disc = |e: &CmEvent| matches!(e, CmEvent::Disconnected { .. });
        assert_eq!((count(&n.ev_a, disc), count(&n.ev_b, disc)), (1, 1), "seed {seed}: {:?} {:?}", n.ev_a, n.ev_b);
        assert!(!n.ev_a.iter().chain(&n.ev_b).any(|e| matches!(e, CmEvent::Rejected { .. })), "seed {seed}");
        assert_eq!(n.a.poll_timeout(), None, "seed {seed}: time-wait ended");
        // Without faults: REQ, RTU, DREQ from a; REP, DREP from b.
        resent += n.sent.0 + n.sent.1 - 5;
    }
    assert!(resent > 40, "the faults made the CM send again ({resent} MADs more)");
}

/// A REQ for a service nobody listens to is rejected with Invalid Service ID (8); one the
/// consumer turns down with Consumer Reject (28).
#[test]
fn rejections_carry_their_reasons() {
    let mut n = Net::new(7, 0.0, 0.0);
    let p = ConnectParams { service_id: 99, ..params() };
    let id = n.a.connect(0, B, &p);
    n.run(10_000_000_000, accept);
    assert_eq!(n.ev_a, vec![CmEvent::Rejected { id, reason: reason::INVALID_SERVICE_ID, private_data: vec![0; 148] }]);
    assert!(n.ev_b.is_empty());

    let mut n = Net::new(8, 0.0, 0.0);
    let id = n.a.connect(0, B, &params());
    n.run(10_000_000_000, |cm, _, e| {
        if let CmEvent::ConnectRequest { id, .. } = e {
            assert!(cm.reject(*id, reason::CONSUMER_REJECT));
        }
    });
    assert_eq!(n.ev_a, vec![CmEvent::Rejected { id, reason: reason::CONSUMER_REJECT, private_data: vec![0; 148] }]);
    assert_eq!(n.a.poll_timeout(), None);
}

/// A peer that never answers: the REQ goes out once and then once per CM response timeout,
/// Max CM Retries times, and the connection fails with REJ Timeout (4), no sooner.
#[test]
fn an_unanswered_req_is_retried_then_times_out() {
    let mut n = Net::new(9, 1.0, 0.0);
    let p = ConnectParams { max_cm_retries: 3, response_timeout: 10, ..params() }; // 4.2 ms
    let id = n.a.connect(0, B, &p);
    n.run(60_000_000_000, accept);
    assert_eq!(n.ev_a, vec![CmEvent::Rejected { id, reason: reason::TIMEOUT, private_data: vec![] }]);
    // 4 REQs and the final REJ.
    assert_eq!(n.sent.0, 4 + 1);
    assert_eq!(n.now, 4 * cm_timeout_ns(10), "given up at the fourth deadline");
}

/// The attribute ID of a MAD (REQ 0x10, MRA 0x11, REJ 0x12, REP 0x13, RTU 0x14, DREQ 0x15,
/// DREP 0x16).
fn attr(mad: &[u8]) -> u16 {
    u16::from_be_bytes([mad[16], mad[17]])
}

/// How many MADs of `attribute` side a (`from_a`) or b put on the wire.
fn sent(n: &Net, from_a: bool, attribute: u16) -> usize {
    n.wire.iter().filter(|(to_b, m)| *to_b == from_a && attr(m) == attribute).count()
}

/// The REJs side a (`from_a`) or b put on the wire.
fn rejs(n: &Net, from_a: bool) -> Vec<CmRej> {
    n.wire
        .iter()
        .filter(|(to_b, m)| *to_b == from_a && attr(m) == CmRej::ATTRIBUTE_ID)
        .map(|(_, m)| match CmMessage::parse(m) {
            Ok((_, CmMessage::Rej(r))) => *r,
            other => panic!("not a REJ: {other:?}"),
        })
        .collect()
}

fn no_state_left(n: &Net) {
    for (side, cm) in [("a", &n.a), ("b", &n.b)] {
        assert_eq!((cm.connections(), cm.remote_ids(), cm.pending()), (0, 0, 0), "{side} forgot everything");
    }
}

/// IBA 12.9.5 (and the 10% target): REQ / REP / RTU complete under 10% MAD loss with
/// 10% duplication and reordering, over 40 seeds, each side seeing one Established; then a
/// DREQ from either side (a on even seeds, b on odd) reaches the other as one Disconnected
/// each (IBA 12.9.6); and once time-wait has passed neither side holds anything.
#[test]
fn ten_percent_loss_connects_and_either_side_disconnects() {
    for seed in 1..=40u64 {
        let mut n = Net::new(1000 + seed, 0.1, 0.1);
        n.a.set_time_wait_ns(2_000_000_000);
        let id = n.a.connect(0, B, &params());
        n.run(60_000_000_000, accept);
        let est = |e: &CmEvent| matches!(e, CmEvent::Established { .. });
        assert_eq!((count(&n.ev_a, est), count(&n.ev_b, est)), (1, 1), "seed {seed}: {:?} {:?}", n.ev_a, n.ev_b);
        let Some(CmEvent::Established { id: id_b, .. }) = n.ev_b.iter().find(|e| est(e)).cloned() else {
            unreachable!()
        };
        if seed % 2 == 0 {
            assert!(n.a.disconnect(n.now, id));
        } else {
            assert!(n.b.disconnect(n.now, id_b));
        }
        n.run(n.now + 60_000_000_000, accept);
        assert!(n.ev_a.contains(&CmEvent::Disconnected { id, timed_out: false }), "seed {seed}: {:?}", n.ev_a);
        assert!(n.ev_b.contains(&CmEvent::Disconnected { id: id_b, timed_out: false }), "seed {seed}: {:?}", n.ev_b);
        let disc = |e: &CmEvent| matches!(e, CmEvent::Disconnected { .. });
        assert_eq!((count(&n.ev_a, disc), count(&n.ev_b, disc)), (1, 1), "seed {seed}");
        assert!(!n.ev_a.iter().chain(&n.ev_b).any(|e| matches!(e, CmEvent::Rejected { .. })), "seed {seed}");
        // run() returns once no deadline is left: time-wait ran out on both sides.
        no_state_left(&n);
    }
}

/// IBA 12.9.6: both sides sending a DREQ at once (they cross) still end with one Disconnected
/// each, whichever of the DREQ and the DREP arrives first.
#[test]
fn crossing_dreqs_disconnect_each_side_once() {
    for seed in 1..=20u64 {
        let mut n = Net::new(2000 + seed, 0.1, 0.1);
        let id = n.a.connect(0, B, &params());
        n.run(60_000_000_000, accept);
        let Some(CmEvent::Established { id: id_b, .. }) =
            n.ev_b.iter().find(|e| matches!(e, CmEvent::Established { .. })).cloned()
        else {
            panic!("seed {seed}: {:?}", n.ev_b)
        };
        assert!(n.a.disconnect(n.now, id) && n.b.disconnect(n.now, id_b));
        n.run(n.now + 60_000_000_000, accept);
        let disc = |e: &CmEvent| matches!(e, CmEvent::Disconnected { .. });
        assert_eq!((count(&n.ev_a, disc), count(&n.ev_b, disc)), (1, 1), "seed {seed}: {:?} {:?}", n.ev_a, n.ev_b);
        no_state_left(&n);
    }
}

/// IBA 12.6.7 / Table 109 and Linux's cm_req_handler -> cm_issue_rej: a REQ for a service
/// nobody listens to is answered with a REJ of reason 8 (Invalid Service ID), Message
/// REJected 0 (REQ), the REQ's transaction ID and its Local Communication ID as the Remote
/// one; the requester sees Rejected with reason 8; the responder keeps nothing.
#[test]
fn a_req_for_no_listener_gets_rej_invalid_service_id() {
    let mut n = Net::new(11, 0.0, 0.0);
    let id = n.a.connect(0, B, &ConnectParams { service_id: 0xDEAD, ..params() });
    n.run(10_000_000_000, accept);
    assert_eq!(n.ev_a, vec![CmEvent::Rejected { id, reason: reason::INVALID_SERVICE_ID, private_data: vec![0; 148] }]);
    assert!(n.ev_b.is_empty());
    let rej = rejs(&n, false);
    assert_eq!(rej.len(), 1);
    assert_eq!((rej[0].reason, rej[0].message_rejected, rej[0].remote_comm_id), (8, 0, id));
    let req_tid =
        n.wire.iter().find(|(from_a, m)| *from_a && attr(m) == CmReq::ATTRIBUTE_ID).unwrap().1[8..16].to_vec();
    let rej_tid =
        n.wire.iter().find(|(from_a, m)| !*from_a && attr(m) == CmRej::ATTRIBUTE_ID).unwrap().1[8..16].to_vec();
    assert_eq!(req_tid, rej_tid, "the REJ answers the REQ's transaction");
    assert_eq!(n.b.counters().rejected_no_listener, 1);
    no_state_left(&n);
}

/// A REQ that comes before the listen of a service its consumer has bound (`Cm::reserve`, what
/// the drop-in's rdma_bind_addr does) waits for the listen and then connects, where Linux's
/// CM rejects it at once (qperf 0.4.11 hands its client the port before it listens); one whose
/// listen never comes is rejected with Invalid Service ID after `REQ_HOLD_NS`, and at once
/// when the reservation ends (the bound id destroyed).
#[test]
fn a_req_before_its_reserved_service_listens_waits_for_the_listen() {
    let sid = 0xBEEF;
    let rejected = |id| vec![CmEvent::Rejected { id, reason: reason::INVALID_SERVICE_ID, private_data: vec![0; 148] }];
    // Listened 600 ms after the REQ, whose retries (every 268 ms) came meanwhile: taken once.
    let mut n = Net::new(13, 0.0, 0.0);
    n.b.reserve(sid);
    let id = n.a.connect(0, B, &ConnectParams { service_id: sid, ..params() });
    n.run(600_000_000, accept);
    assert!(n.ev_a.is_empty() && n.ev_b.is_empty(), "{:?} {:?}", n.ev_a, n.ev_b);
    assert_eq!(n.b.counters().held_for_listen, 1);
    n.b.listen(sid);
    n.run(n.now + 10_000_000_000, accept);
    assert!(n.ev_a.contains(&CmEvent::Established { id, remote_qpn: 0x22, remote_psn: 0xDEF }), "{:?}", n.ev_a);
    assert_eq!(count(&n.ev_b, |e| matches!(e, CmEvent::ConnectRequest { .. })), 1);
    assert!(rejs(&n, false).is_empty());

    // Never listened: rejected once the hold is over, not before.
    let mut n = Net::new(14, 0.0, 0.0);
    n.b.reserve(sid);
    let id = n.a.connect(0, B, &ConnectParams { service_id: sid, ..params() });
    n.run(REQ_HOLD_NS - 1_000_000, accept);
    assert!(n.ev_a.is_empty(), "{:?}", n.ev_a);
    n.run(n.now + 10_000_000_000, accept);
    assert_eq!(n.ev_a, rejected(id));
    assert_eq!(n.b.counters().rejected_no_listener, 1);
    no_state_left(&n);

    // The reservation ends: rejected at once.
    let mut n = Net::new(15, 0.0, 0.0);
    n.b.reserve(sid);
    let id = n.a.connect(0, B, &ConnectParams { service_id: sid, ..params() });
    n.run(1_000_000, accept);
    n.b.unreserve(sid);
    n.run(n.now + 1_000_000, accept);
    assert_eq!(n.ev_a, rejected(id));
    no_state_left(&n);
}

/// IBA 12.9.5 (REQ Sent, timer expiry): a requester whose peer never answers sends the REQ once
/// and then exactly Max CM Retries times more, one CM response timeout apart, then gives up:
/// REJ Timeout (4) on the wire and Rejected { reason: 4 } to the consumer, nothing kept.
#[test]
fn vanished_responder_req_is_retried_max_cm_retries_times_then_rejected_timeout() {
    for retries in [0u8, 1, 5, 15] {
        let mut n = Net::new(12, 0.0, 0.0);
        n.gone.1 = true;
        let p = ConnectParams { max_cm_retries: retries, response_timeout: 12, ..params() };
        let id = n.a.connect(0, B, &p);
        n.run(600_000_000_000, accept);
        assert_eq!(n.ev_a, vec![CmEvent::Rejected { id, reason: reason::TIMEOUT, private_data: vec![] }]);
        assert_eq!(sent(&n, true, CmReq::ATTRIBUTE_ID), 1 + retries as usize, "{retries} retries");
        assert_eq!(n.a.counters().resent, u64::from(retries));
        assert_eq!(n.a.counters().timeouts, 1);
        assert_eq!(n.now, (1 + u64::from(retries)) * cm_timeout_ns(12), "given up at the last deadline");
        let rej = rejs(&n, true);
        assert_eq!((rej.len(), rej[0].reason, rej[0].local_comm_id), (1, reason::TIMEOUT, id));
        assert_eq!(n.a.connections(), 0);
    }
}

/// IBA 12.9.5 (REP Sent, timer expiry): the responder accepted and sent its REP, then the
/// requester vanished: the REP goes out once plus exactly Max CM Retries times, each after the
/// requester's Local CM Response Timeout, then REJ Timeout and Rejected { reason: 4 } on the
/// responder's side, and its repeated-REQ index is empty again.
#[test]
fn vanished_requester_rep_is_retried_max_cm_retries_times_then_rejected_timeout() {
    let mut n = Net::new(13, 0.0, 0.0);
    let p = ConnectParams { max_cm_retries: 6, response_timeout: 13, ..params() };
    let a_id = n.a.connect(0, B, &p);
    n.run(1_000_000, |_, _, _| {}); // the REQ arrives; b does not answer yet
    let Some(CmEvent::ConnectRequest { id, .. }) = n.ev_b.first().cloned() else { panic!("{:?}", n.ev_b) };
    n.gone.0 = true;
    let t0 = n.now;
    assert!(n.b.accept(t0, id, 0x22, 0xDEF));
    n.run(600_000_000_000, accept);
    assert_eq!(n.ev_b[1..], [CmEvent::Rejected { id, reason: reason::TIMEOUT, private_data: vec![] }]);
    assert_eq!(sent(&n, false, CmRep::ATTRIBUTE_ID), 1 + 6);
    assert_eq!(n.b.counters().resent, 6);
    assert_eq!(n.now, t0 + 7 * cm_timeout_ns(13));
    let rej = rejs(&n, false);
    assert_eq!(rej.len(), 1);
    assert_eq!((rej[0].reason, rej[0].local_comm_id, rej[0].remote_comm_id), (reason::TIMEOUT, id, a_id));
    assert_eq!((n.b.connections(), n.b.remote_ids()), (0, 0));
}

/// IBA 12.9.6 (DREQ Sent, timer expiry): a DREQ the peer never answers goes out once plus
/// exactly Max CM Retries times, then the connection is Disconnected all the same; from
/// either side.
#[test]
fn vanished_peer_dreq_is_retried_max_cm_retries_times_then_disconnected() {
    for a_disconnects in [true, false] {
        let mut n = Net::new(14, 0.0, 0.0);
        let p = ConnectParams { max_cm_retries: 4, response_timeout: 11, ..params() };
        let id = n.a.connect(0, B, &p);
        n.run(60_000_000_000, accept);
        let Some(CmEvent::Established { id: id_b, .. }) = n.ev_b.last().cloned() else { panic!("{:?}", n.ev_b) };
        let t0 = n.now;
        if a_disconnects {
            n.gone.1 = true;
            assert!(n.a.disconnect(t0, id));
        } else {
            n.gone.0 = true;
            assert!(n.b.disconnect(t0, id_b));
        }
        n.run(t0 + 600_000_000_000, accept);
        let (cm, evs, id) = if a_disconnects { (&n.a, &n.ev_a, id) } else { (&n.b, &n.ev_b, id_b) };
        // Disconnected (timed out) when the retries ran out, then the time wait (1 s), as
        // Linux's DREQ_ERROR and TIMEWAIT_EXIT.
        assert_eq!(evs[evs.len() - 2..], [CmEvent::Disconnected { id, timed_out: true }, CmEvent::TimewaitExit { id }]);
        assert_eq!(sent(&n, a_disconnects, CmDreq::ATTRIBUTE_ID), 1 + 4, "a disconnects: {a_disconnects}");
        assert_eq!((cm.counters().resent, cm.counters().timeouts), (4, 1));
        assert_eq!(n.now, t0 + 5 * cm_timeout_ns(11) + 1_000_000_000);
        assert_eq!((cm.connections(), cm.remote_ids()), (0, 0));
    }
}

/// IBA 12.9.5 / Linux's cm_rej_handler (ESTABLISHED enters TimeWait and reports the REJ): the
/// requester got the REP and thinks itself connected, but every RTU is lost; the responder
/// gives up after its retries and sends REJ Timeout. The requester must hear of it (Rejected,
/// reason 4) rather than stay connected to a peer that is not.
#[test]
fn rej_timeout_reaches_a_requester_whose_rtus_were_lost() {
    let mut n = Net::new(15, 0.0, 0.0);
    n.drop = Some(Box::new(|to_b, m| to_b && attr(m) == CmRtu::ATTRIBUTE_ID));
    let p = ConnectParams { max_cm_retries: 3, response_timeout: 12, ..params() };
    let id = n.a.connect(0, B, &p);
    n.run(600_000_000_000, accept);
    let est = CmEvent::Established { id, remote_qpn: 0x22, remote_psn: 0xDEF };
    let rej = CmEvent::Rejected { id, reason: reason::TIMEOUT, private_data: vec![0; 148] };
    // The REJ of an established connection enters the time wait, as Linux's.
    assert_eq!(n.ev_a, vec![est, rej, CmEvent::TimewaitExit { id }]);
    assert!(
        matches!(n.ev_b[..], [CmEvent::ConnectRequest { .. }, CmEvent::Rejected { reason: 4, .. }]),
        "{:?}",
        n.ev_b
    );
    // a answered each of b's 4 REPs with an RTU.
    assert_eq!(sent(&n, true, CmRtu::ATTRIBUTE_ID), 4);
    no_state_left(&n);
}

/// IBA 12.9.6 / Linux's cm_dreq_handler (REP_SENT takes a DREQ): the requester connects and
/// disconnects while its RTU is lost; the responder, still in REP Sent, must see the
/// connection end (Disconnected) rather than keep a connection its consumer accepted and
/// never hears of again; the requester gets its DREP.
#[test]
fn a_dreq_reaches_a_responder_still_waiting_for_the_rtu() {
    let mut n = Net::new(16, 0.0, 0.0);
    n.drop = Some(Box::new(|to_b, m| to_b && attr(m) == CmRtu::ATTRIBUTE_ID));
    let id = n.a.connect(0, B, &params());
    n.run(1_000_000, accept);
    assert!(matches!(n.ev_a[..], [CmEvent::Established { .. }]), "{:?}", n.ev_a);
    assert!(n.a.disconnect(n.now, id));
    n.run(600_000_000_000, accept);
    assert_eq!(n.ev_a[1..], [CmEvent::Disconnected { id, timed_out: false }, CmEvent::TimewaitExit { id }]);
    assert!(
        matches!(
            n.ev_b[..],
            [CmEvent::ConnectRequest { .. }, CmEvent::Disconnected { .. }, CmEvent::TimewaitExit { .. }]
        ),
        "{:?}",
        n.ev_b
    );
    assert_eq!(sent(&n, false, CmRep::ATTRIBUTE_ID), 1, "the DREQ stopped b's REP retries");
    no_state_left(&n);
}

/// IBA 12.9.5 / Linux's cm_acquire_rejected_id (a REJ Timeout is looked up by the sender's
/// communication ID): the requester gives up while the responder's consumer is still deciding;
/// its REJ Timeout, which cannot name the responder's ID, must still end the responder's
/// pending connection (Rejected, reason 4) so the backlog does not keep it.
#[test]
fn a_requester_giving_up_ends_the_responders_pending_req() {
    let mut n = Net::new(17, 0.0, 0.0);
    let p = ConnectParams { max_cm_retries: 2, response_timeout: 10, ..params() };
    n.a.connect(0, B, &p);
    n.run(600_000_000_000, |_, _, _| {}); // b's consumer never answers
    assert!(matches!(n.ev_a[..], [CmEvent::Rejected { reason: 4, .. }]), "{:?}", n.ev_a);
    assert!(
        matches!(n.ev_b[..], [CmEvent::ConnectRequest { .. }, CmEvent::Rejected { reason: 4, .. }]),
        "{:?}",
        n.ev_b
    );
    assert_eq!(n.b.counters().duplicates, 2, "the two repeated REQs were recognised");
    no_state_left(&n);
}

/// Linux's cm_acquire_rejected_id looks a REJ Timeout up by its ARI, read as the sender's CA
/// GUID, and its Local Communication ID (cm_find_remote_id): a REJ Timeout without the GUID
/// names no connection there and is dropped, leaving the Linux side to wait out its own
/// retries (a minute and more at rdma_cm's timings). Every REJ Timeout this CM sends carries
/// the CA GUID of the REQ or REP it sent, 8 bytes big-endian, Rejected Information Length 8,
/// as Linux's cm_destroy_id sends its node GUID: the requester's REQ out of retries, the
/// requester destroying a connection whose REQ is unanswered, and the responder's REP out of
/// retries.
#[test]
fn a_rej_timeout_carries_the_senders_ca_guid_as_its_ari() {
    const GUID_A: u64 = 0x0200_0000_c612_0002;
    const GUID_B: u64 = 0x0200_0000_c612_0001;
    let req = |p: &ConnectParams| CmReq {
        service_id: p.service_id,
        local_ca_guid: GUID_A,
        local_qpn: p.local_qpn,
        starting_psn: p.starting_psn,
        remote_cm_response_timeout: p.response_timeout,
        local_cm_response_timeout: p.response_timeout,
        max_cm_retries: p.max_cm_retries,
        primary_local_gid: A,
        primary_remote_gid: B,
        ..Default::default()
    };
    let check = |rej: &CmRej, guid: u64| {
        assert_eq!((rej.reason, rej.rejected_info_length), (reason::TIMEOUT, 8));
        assert_eq!(rej.ari[..8], guid.to_be_bytes());
        assert!(rej.ari[8..].iter().all(|&b| b == 0));
        // On the wire: the ARI length in the top 7 bits of byte 9 of the message, the ARI at
        // byte 12 (IBA Table 108), after the 24-byte MAD header.
        let mut mad = [0u8; 256];
        CmMessage::Rej(Box::new(rej.clone())).emit(&MadHeaderRepr::cm(CmRej::ATTRIBUTE_ID, 1), &mut mad).unwrap();
        assert_eq!(mad[24 + 9] >> 1, 8);
        assert_eq!(mad[24 + 12..24 + 20], guid.to_be_bytes());
    };

    // The requester's REQ out of retries.
    let mut n = Net::new(18, 0.0, 0.0);
    n.gone.1 = true;
    let p = ConnectParams { max_cm_retries: 1, response_timeout: 10, ..params() };
    n.a.request(0, B, req(&p));
    n.run(600_000_000_000, accept);
    let rej = rejs(&n, true);
    assert_eq!(rej.len(), 1);
    check(&rej[0], GUID_A);

    // The requester's consumer destroys the connection while its REQ is unanswered.
    let mut n = Net::new(19, 0.0, 0.0);
    let id = n.a.request(0, B, req(&p));
    n.run(1_000_000, |_, _, _| {}); // b's consumer does not answer
    n.a.destroy(id);
    n.run(2_000_000, |_, _, _| {});
    let rej = rejs(&n, true);
    assert_eq!(rej.len(), 1);
    check(&rej[0], GUID_A);
    assert!(
        matches!(n.ev_b[..], [CmEvent::ConnectRequest { .. }, CmEvent::Rejected { reason: 4, .. }]),
        "b hears of it: {:?}",
        n.ev_b
    );

    // The responder's REP out of retries.
    let mut n = Net::new(20, 0.0, 0.0);
    n.a.request(0, B, req(&p));
    n.run(1_000_000, |_, _, _| {});
    let Some(CmEvent::ConnectRequest { id, .. }) = n.ev_b.first().cloned() else { panic!("{:?}", n.ev_b) };
    n.gone.0 = true;
    let rep = CmRep { local_qpn: 0x22, starting_psn: 0xDEF, local_ca_guid: GUID_B, ..Default::default() };
    assert!(n.b.reply_with(n.now, id, rep));
    n.run(600_000_000_000, accept);
    let rej = rejs(&n, false);
    assert_eq!(rej.len(), 1);
    check(&rej[0], GUID_B);
}

/// IBA 12.9.8.3 (stale connections), as Linux's cm_req_handler: a REQ from a QP that is
/// already in a connection with this CM (same peer, same QPN, another communication ID) is
/// refused with REJ Stale Connection (10); the connection it collides with is left as it is.
#[test]
fn a_req_from_a_connected_qp_is_rejected_as_stale() {
    let mut n = Net::new(12, 0.0, 0.0);
    let first = n.a.connect(0, B, &params());
    n.run(10_000_000_000, accept);
    assert!(n.ev_a.contains(&CmEvent::Established { id: first, remote_qpn: 0x22, remote_psn: 0xDEF }));
    n.ev_a.clear();
    n.ev_b.clear();
    // The same QP (params().local_qpn) asks again under a new communication ID.
    let second = n.a.connect(n.now, B, &params());
    n.run(n.now + 10_000_000_000, accept);
    assert_eq!(
        n.ev_a,
        vec![CmEvent::Rejected { id: second, reason: reason::STALE_CONNECTION, private_data: vec![0; 148] }]
    );
    assert!(n.ev_b.is_empty(), "no ConnectRequest for a stale REQ: {:?}", n.ev_b);
    assert_eq!(n.b.counters().rejected_stale, 1);
    // The first connection is still established on both sides: it disconnects normally.
    assert!(n.a.disconnect(n.now, first));
    n.run(n.now + 10_000_000_000, accept);
    assert!(n.ev_a.contains(&CmEvent::Disconnected { id: first, timed_out: false }));
}

/// IBA 12.6.6 (MRA), as Linux's CM does for rdma_cm: a REQ repeated while the consumer has
/// not answered the first gets an MRA for the REQ (service timeout 24, about 69 s), and the
/// requester waits that much longer instead of giving up after its Max CM Retries; the
/// consumer's late accept still connects.
#[test]
fn a_slow_consumer_gets_time_from_an_mra() {
    let mut n = Net::new(13, 0.0, 0.0);
    // Response timeout 16 (268 ms) and 2 retries: without an MRA a gives up after about 0.8 s.
    let id = n.a.connect(0, B, &ConnectParams { max_cm_retries: 2, ..params() });
    n.run(2_000_000_000, |_, _, _| {}); // b's consumer does not answer
    let mras = n.wire.iter().filter(|(from_a, m)| !*from_a && attr(m) == CmMra::ATTRIBUTE_ID).count();
    assert!(mras >= 1, "b sent no MRA");
    assert!(n.ev_a.is_empty(), "a gave up: {:?}", n.ev_a);
    let Some(CmEvent::ConnectRequest { id: rid, .. }) = n.ev_b.first().cloned() else { panic!("{:?}", n.ev_b) };
    assert!(n.b.accept(n.now, rid, 0x22, 0xDEF));
    n.run(n.now + 200_000_000_000, accept);
    assert!(n.ev_a.contains(&CmEvent::Established { id, remote_qpn: 0x22, remote_psn: 0xDEF }), "{:?}", n.ev_a);
}

/// XRC (Linux's `cm_format_req`, `cm_format_rep` and `cm_rep_get_qpn`): a REQ of Transport
/// Service Type 3 and Extended Transport Type 1 is answered with a REP that names the target
/// QP in its Local EE Context Number, its Local QPN 0 and its SRQ bit set; the initiator takes
/// the target's QPN from there (its Established event, `Cm::reply`), and its DREQ names it.
/// An RC REP, beside it, keeps the QPN in the Local QPN.
#[test]
fn an_xrc_rep_names_the_target_in_its_eecn() {
    let mut n = Net::new(12, 0.0, 0.0);
    let req = CmReq {
        service_id: SERVICE,
        local_qpn: 0x11,
        starting_psn: 0xABC,
        remote_cm_response_timeout: 16,
        local_cm_response_timeout: 16,
        max_cm_retries: 15,
        transport_service_type: 3,
        extended_transport_type: 1,
        partition_key: 0xFFFF,
        path_mtu: 5,
        primary_local_gid: A,
        primary_remote_gid: B,
        primary_hop_limit: 64,
        ..Default::default()
    };
    let id = n.a.request(0, B, req);
    n.run(10_000_000_000, accept);
    let reps: Vec<CmRep> = n
        .wire
        .iter()
        .filter(|(to_b, m)| !*to_b && attr(m) == CmRep::ATTRIBUTE_ID)
        .map(|(_, m)| match CmMessage::parse(m) {
            Ok((_, CmMessage::Rep(r))) => *r,
            other => panic!("not a REP: {other:?}"),
        })
        .collect();
    assert_eq!(reps.len(), 1);
    assert_eq!((reps[0].local_qpn, reps[0].local_eecn, reps[0].srq), (0, 0x22, 1));
    assert_eq!(n.ev_a, vec![CmEvent::Established { id, remote_qpn: 0x22, remote_psn: 0xDEF }]);
    assert_eq!(n.a.reply(id).map(|r| r.local_qpn), Some(0x22));
    assert!(n.a.disconnect(n.now, id));
    n.run(20_000_000_000, accept);
    assert!(n.ev_b.iter().any(|e| matches!(e, CmEvent::Disconnected { .. })), "the target took the DREQ: {:?}", n.ev_b);
}
