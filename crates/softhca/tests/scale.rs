//! Many QPs at once: 10,000 connected RC QP pairs between two devices, every one carrying a
//! message each way and an RDMA Write, with one CQ per device. What the engine's ready list
//! and timer queue are for (an idle QP costs a transmit or a timeout nothing); this checks the
//! behaviour at that scale, the benchmark `send_8B_x20000_beside_1000_idle_qps` its cost.

mod common;

use common::pair::{connect, Opts, Side};
use common::{exchange, poll_all};
use softhca::transport::MAX_DATAGRAM;
use softhca::*;

const QPS: usize = 10_000;

/// A device with one PD and one CQ for all its QPs, and its GID.
type Device = (Context, Pd, Cq, Gid);

fn device(n: u8) -> Device {
    let gid = Gid::from_ipv4([127, 9, 0, n].into());
    let ctx = Context::create(DeviceConfig::default().name(format!("scale{n}")).gid0(gid).seed(n as u64)).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4 * QPS as u32).unwrap();
    (ctx, pd, cq, gid)
}

/// An RC QP on `a` and one on `b`, connected to each other, each with room for `wrs` WRs on
/// each of its queues.
fn rc_pair(a: &Device, b: &Device, wrs: u32) -> (Side, Side) {
    let side = |(ctx, pd, cq, gid): &Device| {
        let qp = pd.create_qp(&QpInitAttr::rc(cq, cq).max_send_wr(wrs).max_recv_wr(wrs)).unwrap();
        Side { ctx: ctx.clone(), pd: pd.clone(), cq: cq.clone(), qp, gid: *gid }
    };
    let opts = Opts { max_rd_atomic: 1, max_dest_rd_atomic: 1, ..Opts::default() };
    let (x, y) = (side(a), side(b));
    connect(&x, &y, Mtu::Mtu1024, &opts);
    connect(&y, &x, Mtu::Mtu1024, &opts);
    (x, y)
}

/// Rule QPS-RTS-1, CRT-QP-4
#[test]
fn ten_thousand_rc_qp_pairs_each_carry_their_messages() {
    let (a, b) = (device(1), device(2));
    let ((actx, apd, acq, _), (bctx, bpd, bcq, _)) = (&a, &b);
    let mut pairs = Vec::with_capacity(QPS);
    for _ in 0..QPS {
        let (x, y) = rc_pair(&a, &b, 2);
        pairs.push((x.qp, y.qp));
    }
    for side in [0, 1] {
        let qpns: std::collections::HashSet<u32> =
            pairs.iter().map(|(x, y)| if side == 0 { x.qp_num() } else { y.qp_num() }).collect();
        assert_eq!(qpns.len(), QPS, "every QPN of a device is its own");
    }

    let amem = apd.alloc_mr(8 * QPS, Access::LOCAL_WRITE).unwrap();
    let bmem = bpd.alloc_mr(16 * QPS, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    for (i, (x, y)) in pairs.iter().enumerate() {
        let (sa, sb) = (amem.sge(8 * i..8 * i + 8), bmem.sge(16 * i..16 * i + 8));
        y.post_recv(&[RecvWr::new(i as u64, &[sb])]).unwrap();
        x.post_recv(&[RecvWr::new(i as u64, &[sa])]).unwrap();
        amem.write(8 * i, &(i as u64).to_le_bytes()).unwrap();
        x.post_send(&[SendWr::send(i as u64, &[sa]).signaled()]).unwrap();
    }
    exchange(actx, bctx);
    let (sent, got) = (poll_all(acq), poll_all(bcq));
    assert_eq!(sent.len(), QPS);
    assert_eq!(got.len(), QPS);
    assert!(sent.iter().chain(&got).all(|w| w.status == WcStatus::Success));
    let data = bmem.to_vec().unwrap();
    for i in 0..QPS {
        assert_eq!(data[16 * i..16 * i + 8], (i as u64).to_le_bytes(), "message of pair {i}");
    }

    // Back the other way, and an RDMA Write from a into the second half of each slot.
    for (i, (x, y)) in pairs.iter().enumerate() {
        y.post_send(&[SendWr::send(i as u64, &[bmem.sge(16 * i..16 * i + 8)]).signaled()]).unwrap();
        let sg = [amem.sge(8 * i..8 * i + 8)];
        let w = SendWr::rdma_write(i as u64, &sg, bmem.addr() + 16 * i as u64 + 8, bmem.rkey());
        x.post_send(&[w.signaled()]).unwrap();
    }
    exchange(actx, bctx);
    let (a_done, b_done) = (poll_all(acq), poll_all(bcq));
    assert_eq!(a_done.len(), 2 * QPS, "a: the receives and the writes");
    assert_eq!(b_done.len(), QPS, "b: the sends");
    assert!(a_done.iter().chain(&b_done).all(|w| w.status == WcStatus::Success));
    let data = bmem.to_vec().unwrap();
    for i in 0..QPS {
        assert_eq!(data[16 * i + 8..16 * i + 16], (i as u64).to_le_bytes(), "write of pair {i}");
    }
    // Timer entries left from disarmed timers fire and find nothing: no retransmission, no
    // completion, and then no timer at all.
    for ctx in [actx, bctx] {
        for _ in 0..4 {
            if let Some(t) = ctx.poll_timeout() {
                ctx.handle_timeout(t);
            }
        }
        assert_eq!(ctx.poll_timeout(), None, "no timer left armed once everything is acknowledged");
    }
    let mut buf = vec![0u8; MAX_DATAGRAM];
    assert_eq!((actx.transmit(0, &mut buf), bctx.transmit(0, &mut buf)), (None, None));
    assert!(poll_all(acq).is_empty() && poll_all(bcq).is_empty());
    assert_eq!(actx.counters().retransmits + bctx.counters().retransmits, 0);
}

/// Rule ORD-SQ-1, ORD-SQ-4: the ready list's turns. A QP with several messages to send sends
/// up to eight packets in a row, its messages in post order without waiting for their ACKs,
/// before the next ready QP's turn, and every ready QP gets its turns (in the order they
/// became ready). Seen on the wire as the sequence of destination QPs and each QP's PSNs.
#[test]
fn a_transmit_turn_is_a_run_of_a_qps_packets() {
    let (a, b) = (device(3), device(4));
    let mem = a.1.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
    let sink = b.1.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
    let mut targets = Vec::new();
    let mut keep = Vec::new();
    for _ in 0..3 {
        let (x, y) = rc_pair(&a, &b, 16);
        for i in 0..10 {
            y.qp.post_recv(&[RecvWr::new(i, &[sink.sge(0..8)])]).unwrap();
        }
        targets.push(y.qp.qp_num());
        keep.push((x, y));
    }
    // Ten one-packet Sends on each QP, posted before anything is sent.
    for (x, _) in &keep {
        for i in 0..10 {
            x.qp.post_send(&[SendWr::send(i, &[mem.sge(0..8)])]).unwrap();
        }
    }
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let (mut wire, mut psns) = (Vec::new(), vec![Vec::new(); 3]);
    while let Some(n) = a.0.transmit(0, &mut buf) {
        let p = softhca::wire::roce::parse_ip(&buf[..n]).unwrap();
        let q = targets.iter().position(|&t| t == p.packet.bth.dest_qp).unwrap();
        wire.push(q);
        psns[q].push(p.packet.bth.psn.value());
    }
    for (q, got) in psns.iter().enumerate() {
        let first = got[0];
        assert_eq!(*got, (first..first + 10).collect::<Vec<u32>>(), "QP {q}'s Sends, in post order");
    }
    let runs = |q: usize, n: usize| std::iter::repeat_n(q, n);
    let want: Vec<usize> =
        runs(0, 8).chain(runs(1, 8)).chain(runs(2, 8)).chain(runs(0, 2)).chain(runs(1, 2)).chain(runs(2, 2)).collect();
    assert_eq!(wire, want);
}
