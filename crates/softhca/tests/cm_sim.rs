//! The connection manager end to end on the simulated fabric: two devices' CM agents on their
//! GSIs (QP1) connect an RC QP pair with REQ / REP / RTU over a lossy, duplicating, reordering
//! link, the QPs carry an RDMA Write and a Send, and DREQ / DREP disconnect them. The QP
//! numbers and PSNs each side uses are the ones the other side's CM messages carried.

use softhca::link::sim::{SimConfig, SimFabric};
use std::cell::RefCell;

use softhca::transport::cm::{cm_timeout_ns, reason, CmEvent, CommId, ConnectParams};
use softhca::*;

const SERVICE: u64 = 0x0000_0000_0106_4e21;
const ALL: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE).union(Access::REMOTE_READ);

struct End {
    ctx: Context,
    pd: Pd,
    cq: Cq,
    gid: Gid,
    agent: CmAgent,
    qp: Option<Qp>,
    /// The other end's GID.
    peer: Gid,
}

fn end(fab: &mut SimFabric, name: &str, seed: u32) -> End {
    let ctx = fab.add_device(name).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let gid = ctx.query_gid(1, 0).unwrap();
    let agent = CmAgent::new(&ctx, &pd, seed).unwrap();
    End { ctx, pd, cq, gid, agent, qp: None, peer: Gid::default() }
}

fn rc(e: &End) -> Qp {
    let qp = e.pd.create_qp(&QpInitAttr::rc(&e.cq, &e.cq).max_send_wr(16).max_recv_wr(16)).unwrap();
    qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(ALL)).unwrap();
    qp
}

fn to_rtr(qp: &Qp, peer: Gid, dest_qpn: u32, rq_psn: u32) {
    let av = AddressVector::new(AhAttr::roce(peer, 0), Mtu::Mtu1024);
    qp.modify(&QpAttr::to_rtr(av, dest_qpn).rq_psn(rq_psn).max_dest_rd_atomic(1)).unwrap();
}

fn to_rts(qp: &Qp, sq_psn: u32) {
    qp.modify(&QpAttr::to_rts().sq_psn(sq_psn).timeout(14).retry_cnt(7).rnr_retry(7).max_rd_atomic(1)).unwrap();
}

/// Steps the fabric 1 ms at a time, running both agents, until `done` or 30 s of virtual time.
fn drive(
    fab: &mut SimFabric,
    a: &mut End,
    b: &mut End,
    on: impl FnMut(bool, &mut End, CmEvent, u64),
    done: impl FnMut(&End, &End) -> bool,
) {
    drive_live(fab, a, b, (true, true), on, done)
}

/// As [`drive`], running only the agents `live` says: a host whose agent does not run has
/// vanished (its device still takes packets, nobody reads them).
fn drive_live(
    fab: &mut SimFabric,
    a: &mut End,
    b: &mut End,
    live: (bool, bool),
    mut on: impl FnMut(bool, &mut End, CmEvent, u64),
    mut done: impl FnMut(&End, &End) -> bool,
) {
    let until = fab.now() + 30_000_000_000;
    while fab.now() < until {
        fab.run_for(1_000_000);
        for (is_a, e) in [(true, &mut *a), (false, &mut *b)] {
            if !(if is_a { live.0 } else { live.1 }) {
                continue;
            }
            e.agent.progress(fab.now()).unwrap();
            while let Some(ev) = e.agent.cm().poll_event() {
                on(is_a, e, ev, fab.now());
                e.agent.progress(fab.now()).unwrap();
            }
        }
        if done(a, b) {
            return;
        }
    }
    panic!("not done after 30 s of virtual time");
}

/// Rule QPS-RTS-1
#[test]
fn rc_qps_connect_through_the_cm_on_qp1_over_a_lossy_fabric() {
    for seed in [1u64, 2, 3] {
        let cfg = SimConfig::default().seed(seed).latency_ns(5_000).loss(0.05).dup(0.02).reorder(0.05);
        let mut fab = SimFabric::new(cfg);
        let (mut a, mut b) = (end(&mut fab, "cm-a", 0xA), end(&mut fab, "cm-b", 0xB));
        (a.peer, b.peer) = (b.gid, a.gid);
        b.agent.cm().listen(SERVICE);
        let qa = rc(&a);
        let qa_num = qa.qp_num();
        let params = ConnectParams {
            service_id: SERVICE,
            local_qpn: qa.qp_num(),
            starting_psn: 0x100,
            response_timeout: 14,
            max_cm_retries: 15,
            responder_resources: 1,
            initiator_depth: 1,
            local_gid: a.gid.0,
        };
        let id = a.agent.cm().connect(fab.now(), b.gid.0, &params);
        a.qp = Some(qa.clone());
        let (ea, eb) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
        drive(
            &mut fab,
            &mut a,
            &mut b,
            |is_a, e, ev, now| match ev {
                CmEvent::ConnectRequest { id, peer, req } => {
                    // The responder: a QP in RTR toward the requester's, then the REP.
                    let qb = rc(e);
                    to_rtr(&qb, Gid(peer), req.local_qpn, req.starting_psn);
                    assert_eq!(Gid(peer), e.peer, "the REQ came from a's GID");
                    assert!(e.agent.cm().accept(now, id, qb.qp_num(), 0x200));
                    e.qp = Some(qb);
                }
                CmEvent::Established { remote_qpn, remote_psn, .. } => {
                    let qp = e.qp.as_ref().unwrap();
                    if is_a {
                        ea.set(ea.get() + 1);
                        assert_eq!(remote_psn, 0x200);
                        to_rtr(qp, e.peer, remote_qpn, remote_psn);
                        to_rts(qp, 0x100);
                    } else {
                        eb.set(eb.get() + 1);
                        assert_eq!((remote_qpn, remote_psn), (qa_num, 0x100));
                        to_rts(qp, 0x200);
                    }
                }
                other => panic!("unexpected {other:?}"),
            },
            |_, _| (ea.get(), eb.get()) == (1, 1),
        );
        let (qa, qb) = (a.qp.clone().unwrap(), b.qp.clone().unwrap());
        assert_eq!(qa.query().unwrap().dest_qp_num, qb.qp_num());
        assert_eq!(qb.query().unwrap().dest_qp_num, qa.qp_num());

        // Traffic on the connected pair.
        let src = a.pd.reg_mr(vec![0x5C; 4096], Access::LOCAL_WRITE).unwrap();
        let dst = b.pd.alloc_mr(8192, ALL).unwrap();
        qb.post_recv(&[RecvWr::new(1, &[dst.sge(4096..8192)])]).unwrap();
        let s4k = [src.sge(0..4096)];
        qa.post_send(&[
            SendWr::rdma_write(1, &s4k, dst.addr(), dst.rkey()).signaled(),
            SendWr::send(2, &s4k).signaled(),
        ])
        .unwrap();
        let (acq, bcq) = (a.cq.clone(), b.cq.clone());
        let mut got = (Vec::new(), Vec::new());
        fab.run_until(|_| {
            got.0.extend(std::iter::from_fn(|| acq.poll_one().unwrap()));
            got.1.extend(std::iter::from_fn(|| bcq.poll_one().unwrap()));
            got.0.len() == 2 && got.1.len() == 1
        });
        assert!(got.0.iter().chain(&got.1).all(|w| w.status == WcStatus::Success), "seed {seed}: {got:?}");
        assert!(dst.to_vec().unwrap().iter().all(|x| *x == 0x5C), "seed {seed}");

        // And apart.
        assert!(a.agent.cm().disconnect(fab.now(), id));
        let (ga, gb) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
        drive(
            &mut fab,
            &mut a,
            &mut b,
            |is_a, e, ev, now| match ev {
                // The side the DREQ reached answers with its disconnect (rdma_disconnect).
                CmEvent::Disconnected { id, .. } => {
                    let n = if is_a { &ga } else { &gb };
                    n.set(n.get() + 1);
                    e.agent.cm().disconnect(now, id);
                }
                CmEvent::TimewaitExit { .. } => {}
                other => panic!("unexpected {other:?}"),
            },
            |_, _| (ga.get(), gb.get()) == (1, 1),
        );
        assert_eq!(a.agent.dropped + b.agent.dropped, 0);
        let c = a.ctx.counters() + b.ctx.counters();
        assert_eq!((c.qkey_violations, c.pkey_violations), (0, 0), "every MAD met the GSI's keys");
    }
}

fn params(e: &End, qp: &Qp, retries: u8) -> ConnectParams {
    ConnectParams {
        service_id: SERVICE,
        local_qpn: qp.qp_num(),
        starting_psn: 0x100,
        response_timeout: 14, // 67 ms
        max_cm_retries: retries,
        responder_resources: 1,
        initiator_depth: 1,
        local_gid: e.gid.0,
    }
}

/// What each side's CM told its consumer.
#[derive(Default)]
struct Seen {
    requests: usize,
    established: usize,
    disconnected: usize,
    rejected: Vec<u16>,
    /// The responder's communication ID, from its ConnectRequest.
    b_id: Option<CommId>,
}

/// The consumer both connect tests use: the responder makes an RC QP in RTR for a REQ and
/// accepts; each side moves its QP to RTS on Established, with the QPN and PSN the other
/// side's CM message carried.
fn consumer<'s>(seen: &'s RefCell<(Seen, Seen)>, qa_num: u32) -> impl FnMut(bool, &mut End, CmEvent, u64) + 's {
    move |is_a, e, ev, now| {
        let mut s = seen.borrow_mut();
        let s = if is_a { &mut s.0 } else { &mut s.1 };
        match ev {
            CmEvent::ConnectRequest { id, peer, req } => {
                s.requests += 1;
                s.b_id = Some(id);
                let qb = rc(e);
                to_rtr(&qb, Gid(peer), req.local_qpn, req.starting_psn);
                assert!(e.agent.cm().accept(now, id, qb.qp_num(), 0x200));
                e.qp = Some(qb);
            }
            CmEvent::Established { remote_qpn, remote_psn, .. } => {
                s.established += 1;
                let qp = e.qp.as_ref().unwrap();
                if is_a {
                    assert_eq!(remote_psn, 0x200);
                    to_rtr(qp, e.peer, remote_qpn, remote_psn);
                    to_rts(qp, 0x100);
                } else {
                    assert_eq!((remote_qpn, remote_psn), (qa_num, 0x100));
                    to_rts(qp, 0x200);
                }
            }
            CmEvent::Disconnected { id, .. } => {
                s.disconnected += 1;
                e.agent.cm().disconnect(now, id); // the DREP, when the peer's DREQ came
            }
            CmEvent::TimewaitExit { .. } => {}
            CmEvent::Rejected { reason, .. } => s.rejected.push(reason),
            CmEvent::SidrRequest { .. } | CmEvent::SidrReply { .. } => panic!("no SIDR here: {ev:?}"),
        }
    }
}

/// IBA 12.9.5 / 12.9.6 through the CM agents on QP1 (issue 14: connection setup under 10% MAD
/// loss): two devices' agents connect an RC QP pair over a sim link that loses 10%,
/// duplicates 10% and reorders 10% of all packets, for 20 seeds; each side sees one
/// ConnectRequest / Established, the QPs carry a Send, and a DREQ from either side (a on even
/// seeds, b on odd) reaches the other as one Disconnected each.
#[test]
fn rc_qps_connect_through_the_agents_at_ten_percent_loss_over_20_seeds() {
    let mut resent = 0;
    for seed in 100..120u64 {
        let cfg = SimConfig::default().seed(seed).latency_ns(5_000).loss(0.1).dup(0.1).reorder(0.1);
        let mut fab = SimFabric::new(cfg);
        let (mut a, mut b) = (end(&mut fab, "cm-a", seed as u32), end(&mut fab, "cm-b", !(seed as u32)));
        (a.peer, b.peer) = (b.gid, a.gid);
        b.agent.cm().listen(SERVICE);
        let qa = rc(&a);
        let p = params(&a, &qa, 15);
        let id = a.agent.cm().connect(fab.now(), b.gid.0, &p);
        a.qp = Some(qa.clone());
        let seen = RefCell::new((Seen::default(), Seen::default()));
        drive(&mut fab, &mut a, &mut b, consumer(&seen, qa.qp_num()), |_, _| {
            let s = seen.borrow();
            (s.0.established, s.1.established) == (1, 1)
        });
        let qb = b.qp.clone().unwrap();
        assert_eq!((qa.query().unwrap().dest_qp_num, qb.query().unwrap().dest_qp_num), (qb.qp_num(), qa.qp_num()));

        let src = a.pd.reg_mr(vec![0x5C; 256], Access::LOCAL_WRITE).unwrap();
        let dst = b.pd.alloc_mr(256, ALL).unwrap();
        qb.post_recv(&[RecvWr::new(1, &[dst.sge(0..256)])]).unwrap();
        qa.post_send(&[SendWr::send(2, &[src.sge(0..256)]).signaled()]).unwrap();
        let (acq, bcq) = (a.cq.clone(), b.cq.clone());
        let mut got = (Vec::new(), Vec::new());
        fab.run_until(|_| {
            got.0.extend(std::iter::from_fn(|| acq.poll_one().unwrap()));
            got.1.extend(std::iter::from_fn(|| bcq.poll_one().unwrap()));
            got.0.len() == 1 && got.1.len() == 1
        });
        assert!(got.0.iter().chain(&got.1).all(|w| w.status == WcStatus::Success), "seed {seed}: {got:?}");
        assert!(dst.to_vec().unwrap().iter().all(|x| *x == 0x5C), "seed {seed}");

        let b_id = seen.borrow().1.b_id.unwrap();
        if seed % 2 == 0 {
            assert!(a.agent.cm().disconnect(fab.now(), id));
        } else {
            assert!(b.agent.cm().disconnect(fab.now(), b_id));
        }
        drive(&mut fab, &mut a, &mut b, consumer(&seen, qa.qp_num()), |_, _| {
            let s = seen.borrow();
            (s.0.disconnected, s.1.disconnected) == (1, 1)
        });
        let s = seen.borrow();
        assert_eq!((s.0.requests, s.1.requests, s.0.established, s.1.established), (0, 1, 1, 1), "seed {seed}");
        assert!(s.0.rejected.is_empty() && s.1.rejected.is_empty(), "seed {seed}");
        assert_eq!(a.agent.dropped + b.agent.dropped, 0);
        let (ca, cb) = (a.agent.cm().counters(), b.agent.cm().counters());
        assert_eq!((ca.malformed, cb.malformed, ca.timeouts, cb.timeouts), (0, 0, 0, 0), "seed {seed}");
        resent += ca.resent + cb.resent;
    }
    assert!(resent >= 10, "the losses made the CMs send again ({resent} times)");
}

/// IBA 12.9.5 (REQ Sent, timer expiry) through the agent: the responder's host has vanished
/// (its agent never runs). The requester's agent puts the REQ on the wire once plus exactly
/// Max CM Retries times, a CM response timeout apart, then a REJ Timeout, and reports
/// Rejected { reason: 4 }.
#[test]
fn a_vanished_responder_times_the_req_out_through_the_agent() {
    let mut fab = SimFabric::new(SimConfig::default().seed(7).latency_ns(5_000));
    let (mut a, mut b) = (end(&mut fab, "cm-a", 1), end(&mut fab, "cm-b", 2));
    (a.peer, b.peer) = (b.gid, a.gid);
    let qa = rc(&a);
    let p = params(&a, &qa, 3);
    a.agent.cm().connect(fab.now(), b.gid.0, &p);
    a.qp = Some(qa.clone());
    let seen = RefCell::new((Seen::default(), Seen::default()));
    drive_live(&mut fab, &mut a, &mut b, (true, false), consumer(&seen, qa.qp_num()), |_, _| {
        !seen.borrow().0.rejected.is_empty()
    });
    assert_eq!(seen.borrow().0.rejected, [4]);
    let c = a.agent.cm().counters();
    assert_eq!((c.resent, c.timeouts), (3, 1));
    let t = 4 * cm_timeout_ns(14);
    // Each deadline is met at the next 1 ms step, and the next one counts from there.
    assert!((t..=t + 4 * 1_000_000).contains(&fab.now()), "given up at {} ns, not at {t}", fab.now());
    fab.run_for(1_000_000); // the REJ, posted, leaves
    assert_eq!(fab.counters().sent, 4 + 1, "4 REQs and the REJ, nothing else on the wire");
    assert_eq!(a.agent.cm().connections(), 0);
}

/// IBA 12.9.6 (DREQ Sent, timer expiry) through the agent: the peer vanishes once connected;
/// the DREQ goes out once plus exactly Max CM Retries times and the connection is
/// Disconnected all the same.
#[test]
fn a_vanished_peer_times_the_dreq_out_through_the_agent() {
    let mut fab = SimFabric::new(SimConfig::default().seed(8).latency_ns(5_000));
    let (mut a, mut b) = (end(&mut fab, "cm-a", 1), end(&mut fab, "cm-b", 2));
    (a.peer, b.peer) = (b.gid, a.gid);
    b.agent.cm().listen(SERVICE);
    let qa = rc(&a);
    let p = params(&a, &qa, 5);
    let id = a.agent.cm().connect(fab.now(), b.gid.0, &p);
    a.qp = Some(qa.clone());
    let seen = RefCell::new((Seen::default(), Seen::default()));
    drive(&mut fab, &mut a, &mut b, consumer(&seen, qa.qp_num()), |_, _| {
        let s = seen.borrow();
        (s.0.established, s.1.established) == (1, 1)
    });
    let sent = fab.counters().sent;
    assert!(a.agent.cm().disconnect(fab.now(), id));
    drive_live(&mut fab, &mut a, &mut b, (true, false), consumer(&seen, qa.qp_num()), |_, _| {
        seen.borrow().0.disconnected == 1
    });
    let c = a.agent.cm().counters();
    assert_eq!((c.resent, c.timeouts), (5, 1));
    fab.run_for(1_000_000);
    assert_eq!(fab.counters().sent - sent, 6, "6 DREQs, nothing else on the wire");
    assert_eq!(seen.borrow().1.disconnected, 0);
}

/// IBA 12.6.7 / Table 109 through the agents: a REQ for a service b does not listen to comes
/// back as REJ Invalid Service ID (8), and b keeps nothing.
#[test]
fn a_req_for_no_listener_is_rejected_through_the_agent() {
    let mut fab = SimFabric::new(SimConfig::default().seed(9).latency_ns(5_000));
    let (mut a, mut b) = (end(&mut fab, "cm-a", 1), end(&mut fab, "cm-b", 2));
    (a.peer, b.peer) = (b.gid, a.gid);
    let qa = rc(&a);
    let p = params(&a, &qa, 3);
    a.agent.cm().connect(fab.now(), b.gid.0, &p);
    let seen = RefCell::new((Seen::default(), Seen::default()));
    drive(&mut fab, &mut a, &mut b, consumer(&seen, qa.qp_num()), |_, _| !seen.borrow().0.rejected.is_empty());
    assert_eq!(seen.borrow().0.rejected, [reason::INVALID_SERVICE_ID]);
    assert_eq!(seen.borrow().1.requests, 0);
    assert_eq!(b.agent.cm().counters().rejected_no_listener, 1);
    assert_eq!((a.agent.cm().connections(), b.agent.cm().connections()), (0, 0));
}

/// IBA 13.4.2 (a MAD is 256 bytes of the CM class for the CM) through the agent: a third
/// host's GSI sends b's GSI a short datagram, a MAD of another class, and a CM REP for no
/// connection; b's CM drops and counts each (malformed, malformed, unmatched) and tells its
/// consumer nothing.
#[test]
fn crafted_mads_on_the_wire_are_counted_and_dropped_by_the_agent() {
    use softhca::wire::mad::{CmMessage, CmRep, MadHeaderRepr, MAD_LEN};
    let mut fab = SimFabric::new(SimConfig::default().seed(10).latency_ns(5_000));
    let (mut a, mut b) = (end(&mut fab, "cm-a", 1), end(&mut fab, "cm-b", 2));
    (a.peer, b.peer) = (b.gid, a.gid);
    b.agent.cm().listen(SERVICE);
    let c = fab.add_device("cm-c").unwrap();
    let pd = c.alloc_pd().unwrap();
    let cq = c.create_cq(16).unwrap();
    let init = QpInitAttr::ud(&cq, &cq).max_send_wr(8).max_recv_wr(1).max_inline_data(MAD_LEN as u32);
    let gsi = c.get_special_qp(&pd, SpecialQp::Gsi, &init).unwrap();
    gsi.modify(&QpAttr::to_init().port(1).pkey_index(0).qkey(GSI_QKEY)).unwrap();
    gsi.modify(&QpAttr::new(QpState::Rtr)).unwrap();
    gsi.modify(&QpAttr::to_rts().sq_psn(0)).unwrap();
    let ah = pd.create_ah(&AhAttr::roce(b.gid, 0)).unwrap();
    let rep = CmMessage::Rep(Box::new(CmRep { local_comm_id: 5, remote_comm_id: 6, ..Default::default() }));
    let mut rep_mad = [0u8; MAD_LEN];
    rep.emit(&MadHeaderRepr::cm(rep.attribute_id(), 1), &mut rep_mad).unwrap();
    let mut other_class = rep_mad;
    other_class[1] = 0x03; // subnet administration
    for m in [&rep_mad[..100], &other_class[..], &rep_mad[..]] {
        gsi.post_send(&[SendWr::send_inline(0, m).ud(&ah, GSI_QPN, GSI_QKEY)]).unwrap();
    }
    let seen = RefCell::new((Seen::default(), Seen::default()));
    let mut steps = 0;
    drive(&mut fab, &mut a, &mut b, consumer(&seen, 0), |_, _| {
        steps += 1;
        steps == 10 // 10 ms: the three datagrams took 5 µs
    });
    let cb = b.agent.cm().counters();
    assert_eq!((cb.malformed, cb.unmatched), (2, 1));
    let s = seen.borrow();
    assert_eq!((s.1.requests, s.1.established, s.1.rejected.len()), (0, 0, 0));
    assert_eq!(b.agent.cm().connections(), 0);
}
