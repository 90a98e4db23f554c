//! The connection manager (IBA ch. 12) against MADs a peer crafts: the wrong class, version,
//! method or attribute, short buffers, messages for connections it does not have, random
//! bytes, and a flood of REQs nobody answers. Each is dropped or answered as IBA and Linux's
//! CM do, counted, and never makes the CM panic, keep state or grow without bound. Deterministic:
//! a virtual clock, fixed seeds (proptest's included).

use proptest::prelude::*;
use proptest::test_runner::RngSeed;
use softhca::transport::cm::*;
use softhca::wire::mad::*;

const A: Peer = [1; 16];
const B: Peer = [2; 16];
const C: Peer = [3; 16];
const SERVICE: u64 = 0x0000_0000_0106_1c06;

fn params() -> ConnectParams {
    ConnectParams {
        service_id: SERVICE,
        local_qpn: 0x11,
        starting_psn: 0xABC,
        response_timeout: 14,
        max_cm_retries: 3,
        responder_resources: 1,
        initiator_depth: 1,
        local_gid: A,
    }
}

/// A whole MAD of CM message `m`, transaction `tid`.
fn mad(m: CmMessage, tid: u64) -> Vec<u8> {
    let mut out = vec![0; MAD_LEN];
    m.emit(&MadHeaderRepr::cm(m.attribute_id(), tid), &mut out).unwrap();
    out
}

/// One message of each kind the CM defines, naming communication IDs `local` and `remote`.
fn every_kind(local: u32, remote: u32) -> Vec<CmMessage> {
    vec![
        CmMessage::Req(Box::new(CmReq {
            local_comm_id: local,
            service_id: SERVICE,
            local_qpn: 0x33,
            ..Default::default()
        })),
        CmMessage::Mra(Box::new(CmMra { local_comm_id: local, remote_comm_id: remote, ..Default::default() })),
        CmMessage::Rej(Box::new(CmRej {
            local_comm_id: local,
            remote_comm_id: remote,
            reason: 28,
            ..Default::default()
        })),
        CmMessage::Rep(Box::new(CmRep {
            local_comm_id: local,
            remote_comm_id: remote,
            local_qpn: 0x44,
            ..Default::default()
        })),
        CmMessage::Rtu(Box::new(CmRtu { local_comm_id: local, remote_comm_id: remote, ..Default::default() })),
        CmMessage::Dreq(Box::new(CmDreq { local_comm_id: local, remote_comm_id: remote, ..Default::default() })),
        CmMessage::Drep(Box::new(CmDrep { local_comm_id: local, remote_comm_id: remote, ..Default::default() })),
        CmMessage::SidrReq(Box::new(CmSidrReq { request_id: local, service_id: SERVICE, ..Default::default() })),
        CmMessage::SidrRep(Box::new(CmSidrRep { request_id: remote, ..Default::default() })),
    ]
}

/// A CM listening to SERVICE.
fn listener() -> Cm {
    let mut cm = Cm::new(0xB0B);
    cm.listen(SERVICE);
    cm
}

/// Everything `cm` queued to send and tell.
fn drain(cm: &mut Cm) -> (Vec<(Peer, Vec<u8>)>, Vec<CmEvent>) {
    let out = std::iter::from_fn(|| cm.poll_transmit()).map(|(p, m)| (p, m.to_vec())).collect();
    (out, std::iter::from_fn(|| cm.poll_event()).collect())
}

/// Asserts `cm` did nothing visible since the last drain.
fn quiet(cm: &mut Cm, what: &str) {
    let (out, ev) = drain(cm);
    assert!(out.is_empty() && ev.is_empty(), "{what}: sent {} MADs, events {ev:?}", out.len());
}

/// Delivers what a and b send to each other, at once and losslessly, until neither sends,
/// with `now` fixed; b's consumer accepts every REQ. Returns both sides' events.
fn pump(a: &mut Cm, b: &mut Cm, now: u64) -> (Vec<CmEvent>, Vec<CmEvent>) {
    let (mut ea, mut eb) = (Vec::new(), Vec::new());
    loop {
        let mut busy = false;
        while let Some((to, m)) = a.poll_transmit() {
            assert_eq!(to, B);
            busy = true;
            b.handle_mad(now, A, &m[..]);
        }
        while let Some((to, m)) = b.poll_transmit() {
            assert_eq!(to, A);
            busy = true;
            a.handle_mad(now, B, &m[..]);
        }
        // b accepts every request; each side answers the peer's DREQ with its disconnect (the
        // DREP), as a program calls rdma_disconnect on DISCONNECTED.
        while let Some(e) = b.poll_event() {
            busy = true;
            match e {
                CmEvent::ConnectRequest { id, .. } => assert!(b.accept(now, id, 0x22, 0xDEF)),
                CmEvent::Disconnected { id, .. } => _ = b.disconnect(now, id),
                _ => {}
            }
            eb.push(e);
        }
        while let Some(e) = a.poll_event() {
            if let CmEvent::Disconnected { id, .. } = e {
                busy |= a.disconnect(now, id);
            }
            ea.push(e);
        }
        if !busy {
            return (ea, eb);
        }
    }
}

/// Runs a and b's timers from `now` until neither has a deadline, pumping at each.
fn settle(a: &mut Cm, b: &mut Cm, mut now: u64) -> (u64, Vec<CmEvent>, Vec<CmEvent>) {
    let (mut ea, mut eb) = pump(a, b, now);
    while let Some(t) = [a.poll_timeout(), b.poll_timeout()].into_iter().flatten().min() {
        now = now.max(t);
        a.handle_timeout(now);
        b.handle_timeout(now);
        let (x, y) = pump(a, b, now);
        ea.extend(x);
        eb.extend(y);
    }
    (now, ea, eb)
}

/// An established pair: a's and b's communication IDs. Each from a QP of its own (a REQ from
/// a QP already connected is refused as stale).
fn established(a: &mut Cm, b: &mut Cm) -> (CommId, CommId) {
    static NEXT_QPN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0x100);
    let local_qpn = NEXT_QPN.fetch_add(1, std::sync::atomic::Ordering::Relaxed) & 0xFF_FFFF;
    let ia = a.connect(0, B, &ConnectParams { local_qpn, ..params() });
    let (ea, eb) = pump(a, b, 0);
    assert!(matches!(ea[..], [CmEvent::Established { .. }]), "{ea:?}");
    let Some(CmEvent::Established { id: ib, .. }) = eb.last().cloned() else { panic!("{eb:?}") };
    (ia, ib)
}

/// IBA 13.4.2 / 13.4.4 (a MAD goes to the class agent of its management class and class
/// version; the CM's messages are Sends of class 0x07, version 2, base version 1): a valid
/// REQ (for a listened service) or DREQ (which is otherwise answered even for no connection)
/// with any other management class, base version, class version or method is dropped,
/// counted as malformed, and leaves nothing.
#[test]
fn other_classes_versions_and_methods_are_dropped() {
    let good = [mad(every_kind(0x1234, 0)[0].clone(), 7), mad(every_kind(0x1234, 0x5678)[5].clone(), 8)];
    let mut cases = Vec::new();
    for class in [0x01u8, 0x03, 0x04, 0x06, 0x08, 0x09, 0x0A, 0x81, 0x87, 0xFF] {
        cases.push((1, class));
    }
    for version in [0u8, 1, 3, 4, 0x82, 0xFF] {
        cases.push((2, version));
    }
    for base in [0u8, 2, 0x80, 0xFF] {
        cases.push((0, base));
    }
    for method in [0x01u8, 0x02, 0x04, 0x06, 0x07, 0x81, 0x83, 0x86, 0xFF] {
        cases.push((3, method));
    }
    let mut cm = listener();
    let mut n = 0;
    for m in &good {
        for &(at, value) in &cases {
            let mut bad = m.clone();
            bad[at] = value;
            cm.handle_mad(0, A, &bad);
            n += 1;
            quiet(&mut cm, &format!("byte {at} = {value:#x}"));
        }
    }
    assert_eq!(cm.counters(), CmCounters { malformed: n, ..Default::default() });
    assert_eq!(cm.connections(), 0);
    // The same MADs unchanged are taken: a REQ and a DREP for the unknown DREQ.
    for m in &good {
        cm.handle_mad(0, A, m);
    }
    let (out, ev) = drain(&mut cm);
    assert_eq!((out.len(), ev.len()), (1, 1));
}

/// IBA 12.6 (the CM's attributes are 0x0010 to 0x001A): a MAD of the CM class whose attribute
/// is none the CM takes (every other 16-bit value, LAP 0x19 and APR 0x1A included, which this
/// CM does not do) is dropped, counted as malformed, and leaves nothing.
#[test]
fn unknown_attribute_ids_are_dropped() {
    let req = mad(every_kind(0x1234, 0)[0].clone(), 7);
    let mut cm = listener();
    let mut n = 0;
    for attr in (0..=u16::MAX).filter(|a| !(0x10..=0x18).contains(a)) {
        let mut bad = req.clone();
        bad[16..18].copy_from_slice(&attr.to_be_bytes());
        cm.handle_mad(0, A, &bad);
        n += 1;
    }
    quiet(&mut cm, "unknown attributes");
    assert_eq!(cm.counters(), CmCounters { malformed: n, ..Default::default() });
    assert_eq!(cm.connections(), 0);
}

/// IBA 13.4.2 (a MAD is 256 bytes): a buffer shorter than a MAD, of every length from 0 to
/// 255, cut from a valid message of every kind, is dropped and counted, and leaves nothing,
/// both on a fresh CM and on one whose connection the messages name.
#[test]
fn short_buffers_of_every_length_are_dropped() {
    let (mut a, mut b) = (Cm::new(0xA11CE), listener());
    let (ia, ib) = established(&mut a, &mut b);
    let mut fresh = listener();
    let mut n = 0;
    for m in every_kind(ia, ib) {
        let full = mad(m, 9);
        for len in 0..MAD_LEN {
            fresh.handle_mad(0, A, &full[..len]);
            b.handle_mad(0, A, &full[..len]);
            n += 1;
        }
    }
    quiet(&mut fresh, "fresh");
    quiet(&mut b, "established");
    assert_eq!(fresh.counters(), CmCounters { malformed: n, ..Default::default() });
    assert_eq!(b.counters().malformed, n);
    assert_eq!((fresh.connections(), b.connections(), b.pending()), (0, 1, 0));
    // b's connection is untouched: a disconnects it cleanly.
    assert!(a.disconnect(0, ia));
    let (ea, eb) = pump(&mut a, &mut b, 0);
    assert_eq!(
        (ea, eb),
        (
            vec![CmEvent::Disconnected { id: ia, timed_out: false }],
            vec![CmEvent::Disconnected { id: ib, timed_out: false }]
        )
    );
}

/// IBA 12.9 (a message is taken only by the connection it names, in a state that expects it;
/// Linux's cm_acquire_id matches both communication IDs): a REP, RTU, DREP, REJ or MRA for a
/// communication ID the CM does not have, with the wrong remote ID, or from another peer than
/// the connection's, is dropped, counted as unmatched, and changes nothing; a DREQ for no
/// connection gets a DREP (Linux's cm_issue_drep) and no state.
#[test]
fn messages_for_unknown_connections_are_dropped() {
    let (mut a, mut b) = (Cm::new(0xA11CE), listener());
    let (ia, ib) = established(&mut a, &mut b);
    // A third connection, still waiting for its REP, and a pending REQ at b.
    let waiting = a.connect(0, B, &ConnectParams { local_qpn: 0x12, ..params() });
    let (waiting_req, _) = drain(&mut a);
    let before = (a.counters(), b.counters());
    let kinds = |l, r| every_kind(l, r).into_iter().filter(|m| matches!(m.attribute_id(), 0x11..=0x14 | 0x16));
    let mut n = 0;
    // At a (requester of ia, waiting): unknown IDs, wrong remote ID, right IDs but wrong peer.
    for (peer, l, r) in [(B, 0x5555, 0x6666), (B, 0x7777, ia), (C, ib, ia), (C, 0, waiting), (B, ib ^ 1, ia)] {
        for m in kinds(l, r) {
            a.handle_mad(1, peer, &mad(m, 3));
            n += 1;
            quiet(&mut a, &format!("a from {peer:?}: {l:#x} -> {r:#x}"));
        }
    }
    assert_eq!(a.counters().unmatched - before.0.unmatched, n);
    // At b (responder of ib): the same.
    let mut n = 0;
    for (peer, l, r) in [(A, 0x5555, 0x6666), (A, 0x7777, ib), (C, ia, ib), (A, ia ^ 1, ib), (A, ia, ib ^ 1)] {
        for m in kinds(l, r) {
            b.handle_mad(1, peer, &mad(m, 3));
            n += 1;
            quiet(&mut b, &format!("b from {peer:?}: {l:#x} -> {r:#x}"));
        }
    }
    assert_eq!(b.counters().unmatched - before.1.unmatched, n);
    assert_eq!((a.connections(), b.connections(), b.remote_ids()), (2, 1, 1));
    assert_eq!((a.counters().duplicates, b.counters().duplicates), (before.0.duplicates, before.1.duplicates));
    // A DREQ for no connection: one DREP back to its sender, naming the DREQ's IDs, no state.
    b.handle_mad(1, C, &mad(every_kind(0x5555, 0x6666)[5].clone(), 4));
    let (out, ev) = drain(&mut b);
    assert!(ev.is_empty());
    let [(to, drep)] = &out[..] else { panic!("{} MADs", out.len()) };
    let Ok((h, CmMessage::Drep(drep))) = CmMessage::parse(drep) else { panic!("not a DREP") };
    assert_eq!((*to, h.transaction_id, drep.local_comm_id, drep.remote_comm_id), (C, 4, 0x6666, 0x5555));
    assert_eq!(b.connections(), 1);
    // Everything still works: the waiting REQ connects, ia disconnects.
    for (_, m) in waiting_req {
        b.handle_mad(2, A, &m);
    }
    assert!(a.disconnect(2, ia));
    let (ea, eb) = pump(&mut a, &mut b, 2);
    assert!(
        ea.contains(&CmEvent::Disconnected { id: ia, timed_out: false })
            && eb.contains(&CmEvent::Disconnected { id: ib, timed_out: false })
    );
    assert!(ea.iter().any(|e| matches!(e, CmEvent::Established { id, .. } if *id == waiting)), "{ea:?}");
}

/// IBA 12.9.8 (connection request flood; the CM's resources are finite): 100,000 REQs with
/// distinct communication IDs for a listened service whose consumer never answers. At most
/// `max_pending` (1024) wait; every REQ beyond is answered with REJ No Resources (3), Message
/// REJected REQ, and counted; repeats of waiting REQs are recognised and do not count; once
/// the consumer answers one, the next REQ is taken again.
#[test]
fn a_req_flood_is_bounded_by_max_pending() {
    let mut b = listener();
    assert_eq!(b.max_pending(), DEFAULT_MAX_PENDING);
    let total = 100_000u32;
    let (mut pending_events, mut backlog_rejs) = (0usize, 0usize);
    for i in 0..total {
        let peer = [(i % 7) as u8 + 10; 16];
        let req = CmReq { local_comm_id: i + 1, service_id: SERVICE, local_qpn: i & 0xFF_FFFF, ..Default::default() };
        b.handle_mad(u64::from(i), peer, &mad(CmMessage::Req(Box::new(req)), u64::from(i)));
        if i % 1000 == 999 {
            let (out, ev) = drain(&mut b);
            pending_events += ev.iter().filter(|e| matches!(e, CmEvent::ConnectRequest { .. })).count();
            for (_, m) in out {
                let Ok((_, CmMessage::Rej(rej))) = CmMessage::parse(&m) else { panic!("not a REJ") };
                assert_eq!((rej.reason, rej.message_rejected), (reason::NO_RESOURCES, 0));
                backlog_rejs += 1;
            }
        }
    }
    let max = DEFAULT_MAX_PENDING;
    assert_eq!((pending_events, backlog_rejs), (max, total as usize - max));
    assert_eq!((b.pending(), b.connections(), b.remote_ids()), (max, max, max));
    assert_eq!(b.counters().rejected_backlog, u64::from(total) - max as u64);
    // A repeat of a waiting REQ (the first) is a duplicate, not a new one nor a rejection:
    // its answer is an MRA (the consumer needs longer), no event.
    let first = CmReq { local_comm_id: 1, service_id: SERVICE, ..Default::default() };
    b.handle_mad(0, [10; 16], &mad(CmMessage::Req(Box::new(first)), 0));
    let (out, ev) = drain(&mut b);
    assert!(ev.is_empty(), "{ev:?}");
    assert!(
        matches!(&out[..], [(_, m)] if matches!(CmMessage::parse(&m[..]), Ok((_, CmMessage::Mra(_))))),
        "{} MADs",
        out.len()
    );
    assert_eq!(b.counters().duplicates, 1);
    assert_eq!(b.counters().rejected_backlog, u64::from(total) - max as u64);
    // The consumer rejects one: room for exactly one more.
    let mut b2 = listener();
    b2.set_max_pending(2);
    let reqs: Vec<_> = (1..=3u32)
        .map(|i| {
            let req = CmReq { local_comm_id: i, service_id: SERVICE, local_qpn: i, ..Default::default() };
            mad(CmMessage::Req(Box::new(req)), 0)
        })
        .collect();
    for m in &reqs {
        b2.handle_mad(0, A, m);
    }
    let (out, ev) = drain(&mut b2);
    assert_eq!((out.len(), ev.len(), b2.pending()), (1, 2, 2));
    let CmEvent::ConnectRequest { id, .. } = ev[0] else { panic!() };
    assert!(b2.reject(id, reason::CONSUMER_REJECT));
    assert_eq!(b2.pending(), 1);
    b2.handle_mad(0, A, &reqs[2]);
    let (_, ev) = drain(&mut b2);
    assert!(matches!(ev[..], [CmEvent::ConnectRequest { .. }]), "{ev:?}");
    assert_eq!((b2.pending(), b2.remote_ids()), (2, 2));
}

/// IBA 12.9.6 (TimeWait lasts a while, then the connection is gone): 200 connections made and
/// taken apart, half from each side, leave no connection and no repeated-REQ index entry once
/// time-wait has passed; nor do connections that ended by a REJ or by running out of retries.
#[test]
fn time_wait_expires_and_the_remote_index_does_not_leak() {
    let (mut a, mut b) = (Cm::new(0xA11CE), listener());
    a.set_time_wait_ns(5_000_000);
    b.set_time_wait_ns(7_000_000);
    let pairs: Vec<_> = (0..200).map(|_| established(&mut a, &mut b)).collect();
    assert_eq!((a.connections(), b.connections(), b.remote_ids()), (200, 200, 200));
    for (i, (ia, ib)) in pairs.iter().enumerate() {
        if i % 2 == 0 {
            assert!(a.disconnect(0, *ia));
        } else {
            assert!(b.disconnect(0, *ib));
        }
    }
    // Each connection ends in one Disconnected and, once its time wait is over, one
    // TimewaitExit at each end (Linux's RDMA_CM_EVENT_TIMEWAIT_EXIT).
    let (_, ea, eb) = settle(&mut a, &mut b, 0);
    for ev in [&ea, &eb] {
        let disconnected = ev.iter().filter(|e| matches!(e, CmEvent::Disconnected { .. })).count();
        let exits = ev.iter().filter(|e| matches!(e, CmEvent::TimewaitExit { .. })).count();
        assert_eq!((disconnected, exits, ev.len()), (200, 200, 400));
    }
    assert_eq!((a.connections(), b.connections(), a.remote_ids(), b.remote_ids()), (0, 0, 0, 0));
    // Rejected by the consumer, and given up (b vanished after the REQ arrived).
    a.connect(0, B, &ConnectParams { local_qpn: 0x13, ..params() });
    let (_, m) = a.poll_transmit().unwrap();
    b.handle_mad(0, A, &m[..]);
    let (_, ev) = drain(&mut b);
    let CmEvent::ConnectRequest { id, .. } = ev[0] else { panic!() };
    assert!(b.reject(id, reason::CONSUMER_REJECT));
    assert_eq!((b.connections(), b.remote_ids(), b.pending()), (0, 0, 0));
    while let Some(t) = a.poll_timeout() {
        a.handle_timeout(t);
    }
    assert_eq!((a.connections(), a.remote_ids()), (0, 0));
    assert_eq!(a.counters().timeouts, 1);
}

/// IBA 12.6 (MAD fields are what a peer makes them): random byte strings of every length up to
/// 512 never make the CM panic; those that are not a whole MAD of the CM class, base version
/// 1, class version 2, method Send and a CM attribute are dropped as malformed with no effect.
#[test]
fn random_bytes_never_panic_and_never_make_state() {
    let config = ProptestConfig {
        cases: 4096,
        rng_seed: RngSeed::Fixed(0x5EED_C0DE),
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(bytes in proptest::collection::vec(any::<u8>(), 0..512))| {
        let mut cm = listener();
        cm.handle_mad(0, A, &bytes);
        let is_cm = bytes.len() >= MAD_LEN
            && bytes[..4] == [1, MGMT_CLASS_CM, CM_CLASS_VERSION, METHOD_SEND]
            && (0x10..=0x18).contains(&u16::from_be_bytes([bytes[16], bytes[17]]));
        if !is_cm {
            prop_assert_eq!(cm.counters(), CmCounters { malformed: 1, ..Default::default() });
            prop_assert!(cm.poll_transmit().is_none() && cm.poll_event().is_none());
            prop_assert_eq!(cm.connections(), 0);
        }
    });
}

/// IBA 12.6 / 12.9: CM messages with valid headers and arbitrary bodies (random fields, and
/// half of them naming the real connections' IDs to reach their states), thrown at both sides
/// of a pair that has an established connection, a REQ waiting for its REP and a REQ waiting
/// for the consumer, never make either side panic and keep the bookkeeping consistent: the
/// repeated-REQ index never outgrows the connections, pending REQs stay within the bound,
/// and once the clocks run out every connection but the established ones is gone.
#[test]
fn cm_messages_with_random_bodies_never_panic() {
    let config = ProptestConfig {
        cases: 2048,
        rng_seed: RngSeed::Fixed(0xC0FF_EE11),
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let msgs = proptest::collection::vec(
        (0x10u16..=0x18, proptest::collection::vec(any::<u8>(), CM_DATA_LEN), any::<bool>(), 0u8..3, any::<bool>()),
        1..12,
    );
    proptest!(config, |(msgs in msgs)| {
        let (mut a, mut b) = (Cm::new(0xA11CE), listener());
        b.set_max_pending(4);
        let (ia, ib) = established(&mut a, &mut b);
        let waiting = a.connect(0, B, &ConnectParams { local_qpn: 0x14, ..params() });
        let _ = drain(&mut a);
        for (attr, mut body, real_ids, from, to_b) in msgs {
            if real_ids {
                // Local ID the sender's, remote ID the receiver's, in every kind's layout.
                let (l, r) = if to_b { (ia, ib) } else { (ib, if body[0] & 1 == 0 { ia } else { waiting }) };
                body[..4].copy_from_slice(&l.to_be_bytes());
                body[4..8].copy_from_slice(&r.to_be_bytes());
                if attr == CmReq::ATTRIBUTE_ID {
                    body[8..16].copy_from_slice(&SERVICE.to_be_bytes());
                }
            }
            let mut m = vec![0u8; MAD_LEN];
            MadHeaderRepr::cm(attr, 1).emit(&mut m).unwrap();
            m[MAD_HEADER_LEN..].copy_from_slice(&body);
            let peer = [A, B, C][from as usize];
            let cm = if to_b { &mut b } else { &mut a };
            cm.handle_mad(1, peer, &m);
            for cm in [&a, &b] {
                prop_assert!(cm.remote_ids() <= cm.connections());
            }
            prop_assert!(b.pending() <= 4);
            let _ = drain(&mut a);
            let _ = drain(&mut b);
        }
        // Whatever happened, the clocks end every connection that is not established.
        let mut now = 1;
        for _ in 0..10_000 {
            let Some(t) = [a.poll_timeout(), b.poll_timeout()].into_iter().flatten().min() else { break };
            now = now.max(t);
            a.handle_timeout(now);
            b.handle_timeout(now);
            let _ = drain(&mut a);
            let _ = drain(&mut b);
        }
        prop_assert_eq!(a.poll_timeout().or(b.poll_timeout()), None);
        // Left: the established connections (a's two at most, b's one) and b's REQs waiting
        // for a consumer that never answers.
        prop_assert!(a.connections() <= 2, "a keeps {}", a.connections());
        prop_assert!(b.connections() <= 1 + b.pending(), "b keeps {} ({} pending)", b.connections(), b.pending());
        prop_assert!(b.remote_ids() <= b.connections());
    });
}

/// IBA 12.9 (as above, in the states that wait for an answer): an RTU for a responder in REP
/// Sent, a DREP for a connection in DREQ Sent, an MRA for a REQ in flight, from another peer
/// or with the wrong remote ID, neither establish, disconnect nor delay anything; the real
/// answers afterwards still do.
#[test]
fn answers_from_the_wrong_peer_or_ids_do_not_move_a_waiting_connection() {
    let (mut a, mut b) = (Cm::new(0xA11CE), listener());
    let (ia, ib) = established(&mut a, &mut b);
    // b in REP Sent for a second connection (the REP held back), a in DREQ Sent for ia (the
    // DREQ held back), and a third REQ of a's in flight.
    let i2 = a.connect(0, B, &ConnectParams { local_qpn: 0x15, ..params() });
    let (req, _) = drain(&mut a);
    b.handle_mad(0, A, &req[0].1);
    let (_, ev) = drain(&mut b);
    let CmEvent::ConnectRequest { id: j2, .. } = ev[0] else { panic!("{ev:?}") };
    assert!(b.accept(0, j2, 0x55, 0x66));
    let (rep, _) = drain(&mut b);
    assert!(a.disconnect(0, ia));
    let (dreq, _) = drain(&mut a);
    let i3 = a.connect(0, B, &ConnectParams { local_qpn: 0x16, ..params() });
    let (req3, _) = drain(&mut a);
    let deadlines = (a.poll_timeout(), b.poll_timeout());
    let before = (a.counters().unmatched, b.counters().unmatched);

    let rtu =
        |l, r| mad(CmMessage::Rtu(Box::new(CmRtu { local_comm_id: l, remote_comm_id: r, ..Default::default() })), 1);
    let drep =
        |l, r| mad(CmMessage::Drep(Box::new(CmDrep { local_comm_id: l, remote_comm_id: r, ..Default::default() })), 1);
    let mra = |l, r, what| {
        let m = CmMra {
            local_comm_id: l,
            remote_comm_id: r,
            message_mraed: what,
            service_timeout: 31,
            ..Default::default()
        };
        mad(CmMessage::Mra(Box::new(m)), 1)
    };
    for (peer, m) in [(C, rtu(i2, j2)), (A, rtu(i2 ^ 1, j2)), (A, rtu(0, j2)), (C, mra(i2, j2, 1)), (A, mra(i2, j2, 0))]
    {
        b.handle_mad(1, peer, &m);
        quiet(&mut b, "b in REP Sent");
    }
    for (peer, m) in [(C, drep(ib, ia)), (B, drep(ib ^ 1, ia)), (C, mra(0, i3, 0)), (B, mra(0, i3, 1))] {
        a.handle_mad(1, peer, &m);
        quiet(&mut a, "a in DREQ Sent / REQ Sent");
    }
    assert_eq!((a.poll_timeout(), b.poll_timeout()), deadlines, "no MRA moved a deadline");
    assert_eq!((a.counters().unmatched - before.0, b.counters().unmatched - before.1), (4, 5));

    // The real messages: a takes the REP (RTU to b), b the DREQ, a the REP for i3.
    for (_, m) in rep {
        a.handle_mad(2, B, &m);
    }
    for (_, m) in dreq.into_iter().chain(req3) {
        b.handle_mad(2, A, &m);
    }
    let (ea, eb) = pump(&mut a, &mut b, 2);
    assert!(ea.contains(&CmEvent::Disconnected { id: ia, timed_out: false }), "{ea:?}");
    assert!(ea.contains(&CmEvent::Established { id: i2, remote_qpn: 0x55, remote_psn: 0x66 }), "{ea:?}");
    assert!(ea.iter().any(|e| matches!(e, CmEvent::Established { id, .. } if *id == i3)), "{ea:?}");
    assert!(eb.contains(&CmEvent::Disconnected { id: ib, timed_out: false }), "{eb:?}");
    assert!(eb.iter().any(|e| matches!(e, CmEvent::Established { id, .. } if *id == j2)), "{eb:?}");
}

/// Linux's CM (cm_dreq_handler: DREQ_RCVD; the DREP goes at ib_send_cm_drep, which
/// rdma_disconnect or the id's destruction calls), checked against Linux rxe in the guest
/// (2026-11-29: the passive side's DISCONNECTED at once, the active side's only after the
/// passive program's rdma_disconnect, then TIMEWAIT_EXIT at both): the side a DREQ reaches
/// reports Disconnected and answers nothing until its consumer disconnects; a repeated DREQ
/// meanwhile is a duplicate, unanswered; the consumer's disconnect sends the DREP, which ends
/// the requester's wait; a DREQ repeated after that gets the DREP again; each side's time
/// wait then ends in TimewaitExit. Destroying instead of disconnecting sends the DREP too.
#[test]
fn the_drep_waits_for_the_consumer_that_received_the_dreq() {
    let (mut a, mut b) = (Cm::new(0xA11CE), listener());
    a.set_time_wait_ns(5_000_000);
    b.set_time_wait_ns(7_000_000);
    let (ia, ib) = established(&mut a, &mut b);
    assert!(a.disconnect(0, ia));
    let (out, _) = drain(&mut a);
    let dreq = &out[0].1;
    b.handle_mad(0, A, dreq);
    let (out, ev) = drain(&mut b);
    assert_eq!(
        (out.len(), ev),
        (0, vec![CmEvent::Disconnected { id: ib, timed_out: false }]),
        "no DREP before the consumer"
    );
    b.handle_mad(1, A, dreq);
    quiet(&mut b, "a repeated DREQ while the consumer decides");
    assert_eq!(b.counters().duplicates, 1);
    quiet(&mut a, "a, waiting for the DREP");
    assert!(b.disconnect(2, ib), "the consumer's disconnect answers the DREQ");
    assert!(!b.disconnect(2, ib), "once");
    let (out, _) = drain(&mut b);
    assert_eq!(out.len(), 1);
    let drep = out[0].1.clone();
    a.handle_mad(3, B, &drep);
    let (_, ev) = drain(&mut a);
    assert_eq!(ev, vec![CmEvent::Disconnected { id: ia, timed_out: false }]);
    b.handle_mad(4, A, dreq);
    let (out, _) = drain(&mut b);
    assert_eq!(out.iter().map(|o| &o.1).collect::<Vec<_>>(), vec![&drep], "the DREP again in TimeWait");
    a.handle_timeout(3 + 5_000_000);
    b.handle_timeout(2 + 7_000_000);
    assert_eq!(drain(&mut a).1, vec![CmEvent::TimewaitExit { id: ia }]);
    assert_eq!(drain(&mut b).1, vec![CmEvent::TimewaitExit { id: ib }]);
    assert_eq!((a.connections(), b.connections()), (0, 0));

    // Destroyed instead: the DREP goes with it.
    let (ia, ib) = established(&mut a, &mut b);
    assert!(a.disconnect(0, ia));
    let (out, _) = drain(&mut a);
    b.handle_mad(0, A, &out[0].1);
    assert_eq!(drain(&mut b), (vec![], vec![CmEvent::Disconnected { id: ib, timed_out: false }]));
    b.destroy(ib);
    let (out, _) = drain(&mut b);
    assert_eq!(out.len(), 1);
    a.handle_mad(1, B, &out[0].1);
    assert_eq!(drain(&mut a).1, vec![CmEvent::Disconnected { id: ia, timed_out: false }]);
}

/// Linux's cm_dreq_handler in DREQ_SENT (the DREQ's resends cancelled, DREQ_RCVD, the consumer
/// told): both sides disconnect at once and the peer exits right after its DREQ (perftest's
/// server did, its exit handler sending the DREQ): this side's Disconnected comes with the
/// peer's DREQ, and its own DREQ is not resent to a peer that is gone.
#[test]
fn a_dreq_that_crosses_this_sides_dreq_ends_the_wait() {
    let (mut a, mut b) = (Cm::new(0xA11CE), listener());
    let (ia, ib) = established(&mut a, &mut b);
    assert!(a.disconnect(0, ia) && b.disconnect(0, ib));
    drain(&mut a); // a's DREQ: lost with b
    let (from_b, _) = drain(&mut b);
    // b is gone; a gets b's DREQ.
    a.handle_mad(1, B, &from_b[0].1);
    assert_eq!(drain(&mut a), (vec![], vec![CmEvent::Disconnected { id: ia, timed_out: false }]));
    assert_eq!(a.poll_timeout(), None, "no DREQ resent, no timer until the consumer answers");
    // a's consumer answers (rdma_disconnect, or destroying the id): the DREP, then TimeWait.
    assert!(a.disconnect(2, ia));
    assert_eq!(drain(&mut a).0.len(), 1);
    a.handle_timeout(a.poll_timeout().expect("the time wait"));
    assert_eq!(drain(&mut a).1, vec![CmEvent::TimewaitExit { id: ia }]);
    // Had b lived: its DREP (for a's DREQ) ends a's DREQ Rcvd as well.
    let (ia, ib) = established(&mut a, &mut b);
    assert!(a.disconnect(0, ia) && b.disconnect(0, ib));
    let (from_a, _) = drain(&mut a);
    let (from_b, _) = drain(&mut b);
    a.handle_mad(1, B, &from_b[0].1);
    b.handle_mad(1, A, &from_a[0].1);
    assert_eq!(drain(&mut b).1, vec![CmEvent::Disconnected { id: ib, timed_out: false }]);
    assert!(b.disconnect(2, ib));
    let (drep, _) = drain(&mut b);
    a.handle_mad(3, B, &drep[0].1);
    assert_eq!(drain(&mut a).1, vec![CmEvent::Disconnected { id: ia, timed_out: false }], "once");
    assert!(!a.disconnect(4, ia), "nothing left to answer: a is in TimeWait");
}

/// The CM agent keeps address handles for a bounded number of peers: one DREQ from each of
/// more addresses than the device has address handles (a DREQ naming no connection is always
/// answered with a DREP) leaves the application free to create its own. Before, every peer
/// answered kept one for good, and the 65,537th address took the last.
#[test]
fn answering_many_peers_keeps_few_address_handles() {
    use softhca::wire::roce::{RoceRepr, UdpRepr};
    use softhca::wire::{BthRepr, DethRepr, IpRepr, Ipv4Repr, Opcode, PacketRepr, Psn, UdpChecksum};
    use softhca::{AhAttr, CmAgent, Context, DeviceConfig, Gid};
    let me = std::net::Ipv4Addr::new(10, 9, 0, 1);
    let ctx = Context::create(DeviceConfig::default().name("cm-ahs").gid0(Gid::from_ipv4(me))).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let mut agent = CmAgent::new(&ctx, &pd, 1).unwrap();
    let max_ah = ctx.query_device().unwrap().max_ah;
    let dreq = mad(CmMessage::Dreq(Box::new(CmDreq { local_comm_id: 1, remote_comm_id: 2, ..Default::default() })), 7);
    let (mut buf, mut out) = (vec![0u8; 4096], vec![0u8; 4096]);
    for n in 0..max_ah + 16 {
        let from = std::net::Ipv4Addr::from(0x0a80_0000 + n);
        let bth = BthRepr::new(Opcode::UdSendOnly, 0xffff, 1, Psn::new(n & 0xff_ffff));
        let packet = PacketRepr {
            deth: Some(DethRepr { q_key: 0x8001_0000, src_qp: 1 }),
            payload: &dreq,
            ..PacketRepr::new(bth)
        };
        let udp = UdpRepr::for_qp(1, UdpChecksum::Zero);
        let len = RoceRepr { ip: IpRepr::V4(Ipv4Repr::new(from, me)), udp, packet }.emit(&mut buf).unwrap();
        ctx.receive(0, &buf[..len]);
        agent.receive(0).unwrap();
        agent.transmit();
        while ctx.transmit(0, &mut out).is_some() {}
    }
    assert_eq!(agent.dropped, 0, "every DREP had its address handle");
    let peer = Gid::from_ipv4(std::net::Ipv4Addr::new(10, 9, 0, 2));
    pd.create_ah(&AhAttr::roce(peer, 0)).expect("an address handle left for the application");
}
