//! The connection manager end to end on the simulated fabric: two devices' CM agents on their
//! GSIs (QP1) connect an RC QP pair with REQ / REP / RTU over a lossy, duplicating, reordering
//! link, the QPs carry an RDMA Write and a Send, and DREQ / DREP disconnect them. The QP
//! numbers and PSNs each side uses are the ones the other side's CM messages carried.

use softhca::link::sim::{SimConfig, SimFabric};
use softhca::transport::cm::{CmEvent, ConnectParams};
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
    mut on: impl FnMut(bool, &mut End, CmEvent, u64),
    mut done: impl FnMut(&End, &End) -> bool,
) {
    let until = fab.now() + 30_000_000_000;
    while fab.now() < until {
        fab.run_for(1_000_000);
        for (is_a, e) in [(true, &mut *a), (false, &mut *b)] {
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
            |is_a, _, ev, _| match ev {
                CmEvent::Disconnected { .. } if is_a => ga.set(ga.get() + 1),
                CmEvent::Disconnected { .. } => gb.set(gb.get() + 1),
                other => panic!("unexpected {other:?}"),
            },
            |_, _| (ga.get(), gb.get()) == (1, 1),
        );
        assert_eq!(a.agent.dropped + b.agent.dropped, 0);
        let c = a.ctx.counters() + b.ctx.counters();
        assert_eq!((c.qkey_violations, c.pkey_violations), (0, 0), "every MAD met the GSI's keys");
    }
}
