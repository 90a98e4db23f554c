//! The connection manager's state machine (IBA 12.9) between two ports over a virtual MAD
//! channel with a virtual clock: loss, duplication and reordering of MADs with fixed seeds.
//! Each side sees each event exactly once; retries are bounded by Max CM Retries.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use softhca::transport::cm::*;

const A: Peer = [1; 16];
const B: Peer = [2; 16];
const SERVICE: u64 = 0x0000_0000_0106_1c06;

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
                        let copies = if self.rng.random_bool(self.dup) { 2 } else { 1 };
                        for _ in 0..copies {
                            if !self.rng.random_bool(self.loss) {
                                let at = self.now + self.rng.random_range(1_000..300_000); // reorders
                                self.flight.push((at, to_b, mad.to_vec()));
                            }
                        }
                    }
                }
                while let Some(e) = self.a.poll_event() {
                    self.ev_a.push(e);
                }
                while let Some(e) = self.b.poll_event() {
                    busy = true;
                    b_policy(&mut self.b, self.now, &e);
                    self.ev_b.push(e);
                }
            }
            let next_flight = self.flight.iter().map(|f| f.0).min();
            let next = [next_flight, self.a.poll_timeout(), self.b.poll_timeout()].into_iter().flatten().min();
            match next {
                Some(t) if t <= until => self.now = self.now.max(t),
                _ => return,
            }
            self.flight.sort_by_key(|f| f.0);
            let due: Vec<_> = self.flight.iter().take_while(|f| f.0 <= self.now).cloned().collect();
            self.flight.drain(..due.len());
            for (_, to_b, mad) in due {
                if to_b {
                    self.b.handle_mad(self.now, A, &mad)
                } else {
                    self.a.handle_mad(self.now, B, &mad)
                }
            }
            self.a.handle_timeout(self.now);
            self.b.handle_timeout(self.now);
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
