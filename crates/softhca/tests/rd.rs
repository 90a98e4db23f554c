//! The Reliable Datagram service on the sim fabric: EECs, RD QPs, one message at a time per
//! QP, receive WQEs bound per channel and completed out of post order, the EEC states seen
//! from a posting QP, retry exhaustion, RDD and Q_Key checks, and a lossy mixed workload.

use std::cell::RefCell;
use std::rc::Rc;

use softhca::link::sim::rewrite;
use softhca::link::{DeviceId, FilterCtx, SimConfig, SimFabric, Verdict};
use softhca::wire::{roce, Opcode};
use softhca::*;

const QKEY: u32 = 0x1111_2222;
const MR_LEN: usize = 1 << 20;

struct Node {
    ctx: Context,
    pd: Pd,
    cq: Cq,
    rdd: Rdd,
    mr: Mr,
    gid: Gid,
}

fn node(fabric: &mut SimFabric, name: &str) -> Node {
    let ctx = fabric.add_device(name).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4096).unwrap();
    let rdd = ctx.alloc_rdd().unwrap();
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let mr = pd.alloc_mr(MR_LEN, access).unwrap();
    let gid = ctx.query_gid(1, 0).unwrap();
    Node { ctx, pd, cq, rdd, mr, gid }
}

/// An RD QP of `n`'s RDD completing on `cq`, in RTR, or in RTS with that outbound depth.
fn rd_qp_on(n: &Node, cq: &Cq, rts_depth: Option<u8>) -> Qp {
    let qp = n.pd.create_qp(&QpInitAttr::rd(cq, cq, &n.rdd)).unwrap();
    let all = Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    qp.modify(&QpAttr::to_init().access(all).qkey(QKEY)).unwrap();
    qp.modify(&QpAttr::new(QpState::Rtr).max_dest_rd_atomic(4).min_rnr_timer(1)).unwrap();
    if let Some(depth) = rts_depth {
        qp.modify(&QpAttr::to_rts().max_rd_atomic(depth)).unwrap();
    }
    qp
}

fn rd_qp(n: &Node, rdd: &Rdd) -> Qp {
    let qp = n.pd.create_qp(&QpInitAttr::rd(&n.cq, &n.cq, rdd).max_send_wr(256).max_recv_wr(256)).unwrap();
    let all = Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    qp.modify(&QpAttr::to_init().access(all).qkey(QKEY)).unwrap();
    qp.modify(&QpAttr::new(QpState::Rtr).max_dest_rd_atomic(4).min_rnr_timer(1)).unwrap();
    qp.modify(&QpAttr::to_rts().max_rd_atomic(4)).unwrap();
    qp
}

fn eec_to(e: &Eec, state: QpState, remote: Gid, dest_eecn: u32, mtu: Mtu, retry_cnt: u8) {
    let at = |s| e.query().unwrap().state == s;
    if state == QpState::Reset || at(state) {
        return;
    }
    if at(QpState::Reset) {
        e.modify(&EecAttr::new(QpState::Init).pkey_index(0).port_num(1)).unwrap();
    }
    if state == QpState::Init {
        return;
    }
    if at(QpState::Init) {
        let av = AddressVector::new(AhAttr::roce(remote, 0), mtu);
        e.modify(&EecAttr::new(QpState::Rtr).av(av).dest_eecn(dest_eecn).rq_psn(0x100).max_dest_rd_atomic(4)).unwrap();
    }
    if state == QpState::Rtr {
        return;
    }
    e.modify(&EecAttr::new(QpState::Rts).sq_psn(0x100).timeout(8).retry_cnt(retry_cnt).rnr_retry(7).max_rd_atomic(4))
        .unwrap();
}

/// A Reliable Datagram Channel: an EEC on each node, each aimed at the other.
fn channel(a: &Node, b: &Node, mtu: Mtu, retry_cnt: u8) -> (Eec, Eec) {
    let (ea, eb) = (a.ctx.create_eec(&a.rdd).unwrap(), b.ctx.create_eec(&b.rdd).unwrap());
    eec_to(&ea, QpState::Rts, b.gid, eb.eecn(), mtu, retry_cnt);
    eec_to(&eb, QpState::Rts, a.gid, ea.eecn(), mtu, retry_cnt);
    (ea, eb)
}

fn fabric(config: SimConfig) -> SimFabric {
    SimFabric::new(config.latency_ns(2_000).bandwidth_bps(10_000_000_000))
}

/// Polls `cq` into `got` until `n` completions have arrived.
fn wait_for(fabric: &mut SimFabric, cq: &Cq, got: &mut Vec<Wc>, n: usize) {
    let mut wcs = [Wc::default(); 32];
    let ok = fabric.run_until_within(5_000_000_000, |_| {
        let k = cq.poll(&mut wcs).unwrap();
        got.extend_from_slice(&wcs[..k]);
        got.len() >= n
    });
    assert!(ok, "{} of {n} completions: {got:?}", got.len());
}

fn poll_all(cq: &Cq) -> Vec<Wc> {
    let mut out = Vec::new();
    let mut wcs = [Wc::default(); 32];
    loop {
        let k = cq.poll(&mut wcs).unwrap();
        if k == 0 {
            return out;
        }
        out.extend_from_slice(&wcs[..k]);
    }
}

/// What the filter saw of each RD packet, in send order.
#[derive(Debug, Clone, Copy)]
struct Seen {
    from: usize,
    opcode: u8,
    dest_qp: u32,
    psn: u32,
    ee_cnxt: Option<u32>,
    q_key: Option<u32>,
    src_qp: Option<u32>,
}

fn record(fabric: &mut SimFabric) -> Rc<RefCell<Vec<Seen>>> {
    let log = Rc::new(RefCell::new(Vec::new()));
    let l = log.clone();
    fabric.set_filter(move |ctx: &FilterCtx, d: &mut Vec<u8>| {
        if let Ok(p) = roce::parse_ip(d) {
            let pk = p.packet;
            l.borrow_mut().push(Seen {
                from: ctx.from.map_or(usize::MAX, |id| id.0),
                opcode: u8::from(pk.bth.opcode),
                dest_qp: pk.bth.dest_qp,
                psn: pk.bth.psn.value(),
                ee_cnxt: pk.rdeth.map(|r| r.ee_cnxt),
                q_key: pk.deth.map(|d| d.q_key),
                src_qp: pk.deth.map(|d| d.src_qp),
            });
        }
        Verdict::Pass
    });
    log
}

/// Send, Send with Immediate, RDMA Write, RDMA Read and both Atomics across one channel; the
/// packets carry RDETH with the remote EECN and DETH with the Q_Key and source QP, and the
/// receive CQE names the source QP and the local EEC.
/// Rule WR-SEND-6, WR-SEND-3, WR-SEND-4, WR-SEND-5, CQE-10, CQE-11, WR-SQ-1, WR-SQ-2, WR-SQ-3,
/// WR-SQ-4, QPS-RTS-3
#[test]
fn every_rd_operation_over_one_channel() {
    let mut f = fabric(SimConfig::default().seed(11));
    let log = record(&mut f);
    let (a, b) = (node(&mut f, "rd-a"), node(&mut f, "rd-b"));
    let (ea, eb) = channel(&a, &b, Mtu::Mtu1024, 7);
    let (qa, qb) = (rd_qp(&a, &a.rdd), rd_qp(&b, &b.rdd));

    a.mr.write(0, &(0..5000u32).map(|i| i as u8).collect::<Vec<_>>()).unwrap();
    b.mr.write(100_000, &[0xAB; 3000]).unwrap();
    b.mr.write(200_000, &7u64.to_ne_bytes()).unwrap();
    qb.post_recv(&[RecvWr::new(1, &[b.mr.sge(0..8192)]), RecvWr::new(2, &[b.mr.sge(8192..16384)])]).unwrap();
    let rva = b.mr.addr();
    let rkey = b.mr.rkey();
    let s1 = [a.mr.sge(0..5000)];
    let s2 = [a.mr.sge(0..10)];
    let s3 = [a.mr.sge(0..4000)];
    let s4 = [a.mr.sge(300_000..303_000)];
    let s5 = [a.mr.sge(400_000..400_008)];
    let s6 = [a.mr.sge(400_008..400_016)];
    let wrs = [
        SendWr::send(1, &s1).rd(&ea, qb.qp_num(), QKEY).signaled(),
        // msb set: the QP's own Q_Key goes out instead (WR-SEND-5).
        SendWr::send(2, &s2).imm(0x0102_0304).rd(&ea, qb.qp_num(), 0x8000_0000).signaled(),
        SendWr::rdma_write(3, &s3, rva + 50_000, rkey).rd(&ea, qb.qp_num(), QKEY).signaled(),
        SendWr::rdma_read(4, &s4, rva + 100_000, rkey).rd(&ea, qb.qp_num(), QKEY).signaled(),
        SendWr::atomic_fetch_add(5, &s5, rva + 200_000, rkey, 5).rd(&ea, qb.qp_num(), QKEY).signaled(),
        SendWr::atomic_cmp_swp(6, &s6, rva + 200_000, rkey, 12, 99).rd(&ea, qb.qp_num(), QKEY).signaled(),
    ];
    qa.post_send(&wrs).unwrap();
    let mut sent = Vec::new();
    wait_for(&mut f, &a.cq, &mut sent, 6);
    let ids: Vec<u64> = sent.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, [1, 2, 3, 4, 5, 6]);
    assert!(sent.iter().all(|w| w.status == WcStatus::Success), "{sent:?}");
    let recv = poll_all(&b.cq);
    assert_eq!(recv.len(), 2, "{recv:?}");
    for (wc, (id, len)) in recv.iter().zip([(1u64, 5000u32), (2, 10)]) {
        assert_eq!((wc.wr_id, wc.byte_len, wc.opcode), (id, len, WcOpcode::Recv));
        assert_eq!(wc.src_qp, qa.qp_num(), "CQE-10");
        assert_eq!(wc.eecn, eb.eecn(), "CQE-11");
    }
    assert_eq!(recv[1].imm(), Some(0x0102_0304));
    let mut got = vec![0u8; 5000];
    b.mr.read(0, &mut got).unwrap();
    assert_eq!(got, (0..5000u32).map(|i| i as u8).collect::<Vec<_>>());
    b.mr.read(50_000, &mut got[..4000]).unwrap();
    assert_eq!(&got[..4000], &(0..4000u32).map(|i| i as u8).collect::<Vec<_>>()[..]);
    a.mr.read(300_000, &mut got[..3000]).unwrap();
    assert!(got[..3000].iter().all(|&x| x == 0xAB));
    let mut word = [0u8; 8];
    a.mr.read(400_000, &mut word).unwrap();
    assert_eq!(u64::from_ne_bytes(word), 7, "fetch-add returns the old value");
    a.mr.read(400_008, &mut word).unwrap();
    assert_eq!(u64::from_ne_bytes(word), 12, "compare-swap returns the old value");
    b.mr.read(200_000, &mut word).unwrap();
    assert_eq!(u64::from_ne_bytes(word), 99);

    let log = log.borrow();
    let requests: Vec<&Seen> = log.iter().filter(|s| s.from == 0).collect();
    assert!(!requests.is_empty());
    for s in &requests {
        assert!((0x40..=0x55).contains(&s.opcode), "{s:?}");
        assert_eq!(s.ee_cnxt, Some(eb.eecn()), "WR-SEND-6: {s:?}");
        assert_eq!(s.dest_qp, qb.qp_num(), "WR-SEND-3");
        assert_eq!(s.src_qp, Some(qa.qp_num()));
        assert_eq!(s.q_key, Some(QKEY), "WR-SEND-4, WR-SEND-5");
    }
    for s in log.iter().filter(|s| s.from == 1) {
        assert_eq!(s.ee_cnxt, Some(ea.eecn()), "responses go to the requester's EEC: {s:?}");
        assert_eq!(s.dest_qp, qa.qp_num());
    }
}

/// An RD QP sends no packet of its next message before the current one has been
/// acknowledged; an RC QP on the same fabric streams its messages back to back.
/// Rule ORD-SQ-5, ORD-SQ-4, ORD-SQ-1, ORD-SQ-3
#[test]
fn rd_qp_works_on_one_wqe_at_a_time() {
    let mut f = fabric(SimConfig::default().seed(12).latency_ns(20_000));
    let log = record(&mut f);
    let (a, b) = (node(&mut f, "rd1-a"), node(&mut f, "rd1-b"));
    let (ea, _eb) = channel(&a, &b, Mtu::Mtu1024, 7);
    let (qa, qb) = (rd_qp(&a, &a.rdd), rd_qp(&b, &b.rdd));
    for i in 0..4 {
        qb.post_recv(&[RecvWr::new(i, &[b.mr.sge(i as usize * 4096..(i as usize + 1) * 4096)])]).unwrap();
    }
    let sges: Vec<[Sge; 1]> = (0..4).map(|i| [a.mr.sge(i * 4096..(i + 1) * 4096)]).collect();
    let wrs: Vec<SendWr> =
        sges.iter().enumerate().map(|(i, s)| SendWr::send(i as u64, s).rd(&ea, qb.qp_num(), QKEY).signaled()).collect();
    qa.post_send(&wrs).unwrap();
    let mut done = Vec::new();
    wait_for(&mut f, &a.cq, &mut done, 4);
    assert_eq!(done.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [0, 1, 2, 3]);
    let log = log.borrow();
    // Each message is 4 packets; its first PSN is 4 past the previous one's.
    let ack_of = |last_psn: u32| log.iter().position(|s| s.from == 1 && s.opcode == 0x51 && s.psn == last_psn);
    let first_of = |psn: u32| log.iter().position(|s| s.from == 0 && s.psn == psn && (s.opcode == 0x40));
    for m in 1..4u32 {
        let prev_last = 0x100 + 4 * m - 1;
        let ack = ack_of(prev_last).expect("the previous message was acknowledged");
        let first = first_of(0x100 + 4 * m).expect("the message was sent");
        assert!(ack < first, "message {m} started before message {} was acknowledged", m - 1);
    }

    // The contrast (ORD-SQ-4): RC sends message 2 before message 1's ACK can have come back.
    let rc = |n: &Node| n.pd.create_qp(&QpInitAttr::rc(&n.cq, &n.cq)).unwrap();
    let (ra, rb) = (rc(&a), rc(&b));
    for (q, remote, rq) in [(&ra, b.gid, rb.qp_num()), (&rb, a.gid, ra.qp_num())] {
        q.modify(&QpAttr::to_init().port(1).pkey_index(0).access(Access::REMOTE_WRITE)).unwrap();
        let av = AddressVector::new(AhAttr::roce(remote, 0), Mtu::Mtu1024);
        q.modify(&QpAttr::to_rtr(av, rq).rq_psn(0).max_dest_rd_atomic(4)).unwrap();
        q.modify(&QpAttr::to_rts().sq_psn(0).timeout(8).retry_cnt(7).rnr_retry(7).max_rd_atomic(4)).unwrap();
    }
    drop(log);
    let before = record(&mut f);
    let w: Vec<SendWr> = sges
        .iter()
        .take(2)
        .enumerate()
        .map(|(i, s)| SendWr::rdma_write(10 + i as u64, s, b.mr.addr(), b.mr.rkey()).signaled())
        .collect();
    ra.post_send(&w).unwrap();
    let mut rc_done = Vec::new();
    wait_for(&mut f, &a.cq, &mut rc_done, 2);
    let log = before.borrow();
    let second_first = log.iter().position(|s| s.from == 0 && s.psn == 4).expect("second RC message");
    let first_ack = log.iter().position(|s| s.from == 1).expect("an ACK");
    assert!(second_first < first_ack, "RC pipelines its messages");
}

/// The worked example of ORD-RD-3: target QP T has W1 then W2; a 100-packet Send reaches T
/// through channel 1 and, once its first packet is in, a 25-packet Send through channel 2.
/// Both messages progress at once, W1 holds the first and W2 the second, and W2's CQE comes
/// first.
/// Rule ORD-RD-1, ORD-RD-2, ORD-RD-3, ORD-RQ-1, CQE-15
#[test]
fn two_channels_fill_two_wqes_and_complete_out_of_post_order() {
    let mut f = SimFabric::new(SimConfig::default().seed(13).latency_ns(1_000).bandwidth_bps(1_000_000_000));
    let (s1, s2, t) = (node(&mut f, "rd3-s1"), node(&mut f, "rd3-s2"), node(&mut f, "rd3-t"));
    let (e1, t1) = channel(&s1, &t, Mtu::Mtu256, 7);
    let (e2, t2) = channel(&s2, &t, Mtu::Mtu256, 7);
    let (q1, q2, qt) = (rd_qp(&s1, &s1.rdd), rd_qp(&s2, &s2.rdd), rd_qp(&t, &t.rdd));
    qt.post_recv(&[RecvWr::new(1, &[t.mr.sge(0..100 * 256)]), RecvWr::new(2, &[t.mr.sge(100 * 256..200 * 256)])])
        .unwrap();
    s1.mr.write(0, &[1u8; 100 * 256]).unwrap();
    s2.mr.write(0, &[2u8; 25 * 256]).unwrap();
    let big = [s1.mr.sge(0..100 * 256)];
    q1.post_send(&[SendWr::send(10, &big).rd(&e1, qt.qp_num(), QKEY).signaled()]).unwrap();
    let tctx = t.ctx.clone();
    assert!(f.run_until_within(1_000_000_000, |_| tctx.counters().rx_packets >= 1), "first packet of message 1");
    let small = [s2.mr.sge(0..25 * 256)];
    q2.post_send(&[SendWr::send(20, &small).rd(&e2, qt.qp_num(), QKEY).signaled()]).unwrap();
    let mut got = Vec::new();
    wait_for(&mut f, &t.cq, &mut got, 1);
    // Message 2 completed while message 1 was still arriving into W1.
    let arrived = t.ctx.counters().rx_packets;
    assert!(arrived < 125, "{arrived} packets in when W2 completed");
    wait_for(&mut f, &t.cq, &mut got, 2);
    assert_eq!(got.len(), 2, "{got:?}");
    let (first, second) = (got[0], got[1]);
    assert_eq!((first.wr_id, first.byte_len, first.src_qp, first.eecn), (2, 25 * 256, q2.qp_num(), t2.eecn()));
    assert_eq!((second.wr_id, second.byte_len, second.src_qp, second.eecn), (1, 100 * 256, q1.qp_num(), t1.eecn()));
    assert!(got.iter().all(|w| w.status == WcStatus::Success));
    // CQE-15: both slots were free by W2's CQE; W1's frees none more.
    assert_eq!((first.freed, second.freed), (2, 0));
    let mut buf = vec![0u8; 200 * 256];
    t.mr.read(0, &mut buf).unwrap();
    assert!(buf[..100 * 256].iter().all(|&x| x == 1) && buf[100 * 256..125 * 256].iter().all(|&x| x == 2));
}

/// A WR naming an EEC in Init, RTR or Error completes with Invalid EE Context State and
/// moves the RD QP to SQE; one naming an EEC in SQD waits until the EEC is back in RTS.
/// Rule QPS-RD-1, QPS-RD-2, QPS-RD-3, QPS-RD-4, QPS-RD-5, ERR-SQ-1, QPT-AUTO-1, MOD-SQE-RTS-1
#[test]
fn the_eec_state_decides_what_a_posted_wr_does() {
    let mut f = fabric(SimConfig::default().seed(14));
    let (a, b) = (node(&mut f, "rd4-a"), node(&mut f, "rd4-b"));
    let (ea, eb) = (a.ctx.create_eec(&a.rdd).unwrap(), b.ctx.create_eec(&b.rdd).unwrap());
    eec_to(&eb, QpState::Rts, a.gid, ea.eecn(), Mtu::Mtu1024, 7);
    let (qa, qb) = (rd_qp(&a, &a.rdd), rd_qp(&b, &b.rdd));
    for i in 0..8 {
        qb.post_recv(&[RecvWr::new(i, &[b.mr.sge(0..64)])]).unwrap();
    }
    let sge = [a.mr.sge(0..64)];
    let mut id = 0;
    let mut post = |qa: &Qp| {
        id += 1;
        qa.post_send(&[SendWr::send(id, &sge).rd(&ea, qb.qp_num(), QKEY).signaled()]).unwrap();
        id
    };
    for state in [QpState::Init, QpState::Rtr] {
        eec_to(&ea, state, b.gid, eb.eecn(), Mtu::Mtu1024, 7);
        let wr = post(&qa);
        let mut got = Vec::new();
        wait_for(&mut f, &a.cq, &mut got, 1);
        assert_eq!((got[0].wr_id, got[0].status), (wr, WcStatus::InvEecStateErr), "EEC in {state}");
        assert_eq!(qa.query().unwrap().qp_state, QpState::Sqe);
        qa.modify(&QpAttr::to_rts()).unwrap();
    }
    eec_to(&ea, QpState::Rts, b.gid, eb.eecn(), Mtu::Mtu1024, 7);
    ea.modify(&EecAttr::new(QpState::Sqd)).unwrap();
    let held = post(&qa);
    f.run_for(50_000_000);
    assert!(poll_all(&a.cq).is_empty() && poll_all(&b.cq).is_empty(), "held while the EEC is in SQD");
    ea.modify(&EecAttr::new(QpState::Rts)).unwrap();
    let mut got = Vec::new();
    wait_for(&mut f, &a.cq, &mut got, 1);
    assert_eq!((got[0].wr_id, got[0].status), (held, WcStatus::Success));
    ea.modify(&EecAttr::new(QpState::Error)).unwrap();
    let wr = post(&qa);
    let mut got = Vec::new();
    wait_for(&mut f, &a.cq, &mut got, 1);
    assert_eq!((got[0].wr_id, got[0].status), (wr, WcStatus::InvEecStateErr));
    assert_eq!(qa.query().unwrap().qp_state, QpState::Sqe);
    assert_eq!(ea.query().unwrap().state, QpState::Error);
}

/// With every packet lost, the EEC's retries run out: the message completes with Transport
/// Retry Counter Exceeded, the QP moves to SQE and the EEC from RTS straight to Error.
/// Rule QPS-RD-6, PKT-RTY-4, ERR-SQ-10
#[test]
fn retries_exhausted_move_the_eec_to_error() {
    let mut f = fabric(SimConfig::default().seed(15));
    let (a, b) = (node(&mut f, "rd5-a"), node(&mut f, "rd5-b"));
    let (ea, _eb) = channel(&a, &b, Mtu::Mtu1024, 2);
    let (qa, qb) = (rd_qp(&a, &a.rdd), rd_qp(&b, &b.rdd));
    f.set_filter(|_, _| Verdict::Drop);
    let sge = [a.mr.sge(0..64)];
    qa.post_send(&[SendWr::send(1, &sge).rd(&ea, qb.qp_num(), QKEY).signaled()]).unwrap();
    let mut got = Vec::new();
    wait_for(&mut f, &a.cq, &mut got, 1);
    assert_eq!(got[0].status, WcStatus::RetryExcErr);
    assert_eq!(ea.query().unwrap().state, QpState::Error, "no SQE for an EEC");
    assert_eq!(qa.query().unwrap().qp_state, QpState::Sqe);
    assert!(EecAttr::new(QpState::Sqe).state == QpState::Sqe && ea.modify(&EecAttr::new(QpState::Sqe)).is_err());
}

/// A request for a QP outside the channel's RDD is NAKed Invalid RD Request: the requester
/// completes the WQE with Remote Invalid RD Request, resynchronizes the channel, and the next
/// message on it succeeds; a late copy of the refused request, a duplicate by then, does not
/// refuse it again.
/// Rule ERR-SQ-9, PKT-NAK-2, WR-SQ-7, PKT-DUP-6
#[test]
fn rdd_violation_nak_then_resync() {
    let mut f = fabric(SimConfig::default().seed(16));
    let log: Captured = Rc::default();
    let l = log.clone();
    f.set_filter(move |_: &FilterCtx, d: &mut Vec<u8>| {
        if let Some(op) = opcode_of(d) {
            l.borrow_mut().push((op, d.clone()));
        }
        Verdict::Pass
    });
    let (a, b) = (node(&mut f, "rd6-a"), node(&mut f, "rd6-b"));
    let (ea, _eb) = channel(&a, &b, Mtu::Mtu1024, 7);
    let qa = rd_qp(&a, &a.rdd);
    let other = b.ctx.alloc_rdd().unwrap();
    let (stranger, qb) = (rd_qp(&b, &other), rd_qp(&b, &b.rdd));
    stranger.post_recv(&[RecvWr::new(1, &[b.mr.sge(0..64)])]).unwrap();
    qb.post_recv(&[RecvWr::new(2, &[b.mr.sge(64..128)])]).unwrap();
    let sge = [a.mr.sge(0..64)];
    qa.post_send(&[SendWr::send(1, &sge).rd(&ea, stranger.qp_num(), QKEY).signaled()]).unwrap();
    let mut got = Vec::new();
    wait_for(&mut f, &a.cq, &mut got, 1);
    assert_eq!(got[0].status, WcStatus::RemInvRdReqErr);
    assert_eq!(qa.query().unwrap().qp_state, QpState::Sqe);
    assert!(poll_all(&b.cq).is_empty(), "the stranger's WQE was not touched");
    qa.modify(&QpAttr::to_rts()).unwrap();
    qa.post_send(&[SendWr::send(2, &sge).rd(&ea, qb.qp_num(), QKEY).signaled()]).unwrap();
    let mut got = Vec::new();
    wait_for(&mut f, &a.cq, &mut got, 1);
    assert_eq!((got[0].wr_id, got[0].status), (2, WcStatus::Success));
    assert!(log.borrow().iter().any(|(op, _)| *op == 0x55), "a Resync went out");
    assert_eq!(poll_all(&b.cq).iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(), [(2, WcStatus::Success)]);
    // A late copy of the refused request is a duplicate now: it changes nothing (PKT-DUP-6),
    // and the channel carries the next message.
    let first = log.borrow().iter().find(|(op, _)| *op == 0x44).map(|(_, d)| d.clone()).expect("the first Send");
    f.inject_to(DeviceId(1), first);
    qb.post_recv(&[RecvWr::new(3, &[b.mr.sge(128..192)])]).unwrap();
    qa.post_send(&[SendWr::send(3, &sge).rd(&ea, qb.qp_num(), QKEY).signaled()]).unwrap();
    let mut got = Vec::new();
    wait_for(&mut f, &a.cq, &mut got, 1);
    assert_eq!((got[0].wr_id, got[0].status), (3, WcStatus::Success));
    assert_eq!(ea.query().unwrap().state, QpState::Rts);
}

/// A request whose DETH:Q_Key is not the destination QP's is dropped and counted; nothing is
/// delivered and the sender, never answered, runs out of retries.
/// Rule PKT-VAL-10
#[test]
fn wrong_q_key_is_dropped_silently() {
    let mut f = fabric(SimConfig::default().seed(17));
    let (a, b) = (node(&mut f, "rd7-a"), node(&mut f, "rd7-b"));
    let (ea, _eb) = channel(&a, &b, Mtu::Mtu1024, 1);
    let (qa, qb) = (rd_qp(&a, &a.rdd), rd_qp(&b, &b.rdd));
    qb.post_recv(&[RecvWr::new(1, &[b.mr.sge(0..64)])]).unwrap();
    let sge = [a.mr.sge(0..64)];
    qa.post_send(&[SendWr::send(1, &sge).rd(&ea, qb.qp_num(), QKEY ^ 1).signaled()]).unwrap();
    let mut got = Vec::new();
    wait_for(&mut f, &a.cq, &mut got, 1);
    assert_eq!(got[0].status, WcStatus::RetryExcErr);
    assert!(qb.counters().qkey_violations >= 1);
    assert!(poll_all(&b.cq).is_empty());
}

/// No receive WQE: RNR NAK with the QP's timer, retried until one is posted.
/// Rule ERR-RQ-3, PKT-RNR-1, ORD-RQ-4
#[test]
fn rnr_until_a_receive_is_posted() {
    let mut f = fabric(SimConfig::default().seed(18));
    let (a, b) = (node(&mut f, "rd8-a"), node(&mut f, "rd8-b"));
    let (ea, _eb) = channel(&a, &b, Mtu::Mtu1024, 7);
    let (qa, qb) = (rd_qp(&a, &a.rdd), rd_qp(&b, &b.rdd));
    a.mr.write(0, &[9u8; 3000]).unwrap();
    let sge = [a.mr.sge(0..3000)];
    qa.post_send(&[SendWr::send(1, &sge).rd(&ea, qb.qp_num(), QKEY).signaled()]).unwrap();
    let bctx = b.ctx.clone();
    assert!(f.run_until_within(1_000_000_000, |_| bctx.counters().rnr_naks_sent >= 3));
    assert!(poll_all(&a.cq).is_empty(), "rnr_retry 7 waits for ever");
    qb.post_recv(&[RecvWr::new(5, &[b.mr.sge(0..4096)])]).unwrap();
    let mut got = Vec::new();
    wait_for(&mut f, &a.cq, &mut got, 1);
    assert_eq!(got[0].status, WcStatus::Success);
    let r = poll_all(&b.cq);
    assert_eq!((r[0].wr_id, r[0].byte_len, r[0].status), (5, 3000, WcStatus::Success));
    let mut buf = [0u8; 3000];
    b.mr.read(0, &mut buf).unwrap();
    assert!(buf.iter().all(|&x| x == 9));
}

/// An RD QP moved to SQD while its message is in flight lets it finish; when it fails the QP
/// moves from SQD to SQE.
/// Rule QPT-AUTO-2, QPS-SQD-5
#[test]
fn rd_qp_in_sqd_moves_to_sqe_on_an_error() {
    let mut f = fabric(SimConfig::default().seed(19));
    let (a, b) = (node(&mut f, "rd9-a"), node(&mut f, "rd9-b"));
    let (ea, _eb) = channel(&a, &b, Mtu::Mtu1024, 7);
    let (qa, qb) = (rd_qp(&a, &a.rdd), rd_qp(&b, &b.rdd));
    let sge = [a.mr.sge(0..8192)];
    qa.post_send(&[SendWr::rdma_write(1, &sge, b.mr.addr(), b.mr.rkey() ^ 0x100).rd(&ea, qb.qp_num(), QKEY)]).unwrap();
    let actx = a.ctx.clone();
    assert!(f.run_until_within(1_000_000, |_| actx.counters().tx_packets >= 1));
    qa.modify(&QpAttr::to_sqd()).unwrap();
    let mut got = Vec::new();
    wait_for(&mut f, &a.cq, &mut got, 1);
    assert_eq!(got[0].status, WcStatus::RemAccessErr);
    assert_eq!(qa.query().unwrap().qp_state, QpState::Sqe);
    assert_eq!(qb.query().unwrap().qp_state, QpState::Error, "ERR-C-2 on the responder");
}

/// A QP flushed while its EEC carries its message: the EEC resynchronizes the channel, the
/// receive WQE bound to the aborted message completes with Remote Aborted Error, and the
/// channel then carries another QP's message.
/// Rule ERR-FLUSH-1
#[test]
fn flushing_a_qp_under_its_message_resyncs_the_channel() {
    let mut f = SimFabric::new(SimConfig::default().seed(20).latency_ns(1_000).bandwidth_bps(1_000_000_000));
    let (a, b) = (node(&mut f, "rd10-a"), node(&mut f, "rd10-b"));
    let (ea, _eb) = channel(&a, &b, Mtu::Mtu1024, 7);
    let (qa, qa2, qb) = (rd_qp(&a, &a.rdd), rd_qp(&a, &a.rdd), rd_qp(&b, &b.rdd));
    qb.post_recv(&[RecvWr::new(1, &[b.mr.sge(0..65536)]), RecvWr::new(2, &[b.mr.sge(65536..65600)])]).unwrap();
    // Only the first four packets of the message get through.
    let cut = Rc::new(std::cell::Cell::new(true));
    let c = cut.clone();
    f.set_filter(move |ctx: &FilterCtx, _| {
        if c.get() && ctx.from.is_some_and(|id| id.0 == 0) && ctx.index >= 4 {
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    });
    let big = [a.mr.sge(0..65536)];
    qa.post_send(&[SendWr::send(1, &big).rd(&ea, qb.qp_num(), QKEY).signaled()]).unwrap();
    let bctx = b.ctx.clone();
    assert!(f.run_until_within(1_000_000_000, |_| bctx.counters().rx_packets >= 4));
    qa.modify(&QpAttr::to_error()).unwrap();
    cut.set(false);
    let flushed = poll_all(&a.cq);
    assert_eq!(flushed.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(), [(1, WcStatus::WrFlushErr)]);
    let small = [a.mr.sge(0..64)];
    qa2.post_send(&[SendWr::send(7, &small).rd(&ea, qb.qp_num(), QKEY).signaled()]).unwrap();
    let mut got = Vec::new();
    wait_for(&mut f, &a.cq, &mut got, 1);
    assert_eq!((got[0].wr_id, got[0].status), (7, WcStatus::Success));
    let r: Vec<(u64, WcStatus)> = poll_all(&b.cq).iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(r, [(1, WcStatus::RemAbortErr), (2, WcStatus::Success)]);
}

/// The freed resource counts of an RD QP's receive CQEs, whatever their status, add up to
/// the receive WQEs retired: completed, aborted, flushed while held, flushed from the RQ and
/// flushed at post in Error.
/// Rule CQE-15, CQE-16
#[test]
fn freed_resource_counts_add_up() {
    let mut f = fabric(SimConfig::default().seed(27));
    let (a, b) = (node(&mut f, "rd16-a"), node(&mut f, "rd16-b"));
    let (ea, _eb) = channel(&a, &b, Mtu::Mtu1024, 7);
    let (qa, qb) = (rd_qp(&a, &a.rdd), rd_qp(&b, &b.rdd));
    let sges: Vec<[Sge; 1]> = (0..6).map(|i| [b.mr.sge(i * 8192..(i + 1) * 8192)]).collect();
    let recvs: Vec<RecvWr> = sges.iter().enumerate().map(|(i, s)| RecvWr::new(i as u64, s)).collect();
    qb.post_recv(&recvs).unwrap();
    let s = [a.mr.sge(0..3000)];
    qa.post_send(&[
        SendWr::send(1, &s).rd(&ea, qb.qp_num(), QKEY).signaled(),
        SendWr::send(2, &s).rd(&ea, qb.qp_num(), QKEY).signaled(),
    ])
    .unwrap();
    let mut sent = Vec::new();
    wait_for(&mut f, &a.cq, &mut sent, 2);
    qb.modify(&QpAttr::to_error()).unwrap();
    qb.post_recv(&[RecvWr::new(9, &[b.mr.sge(0..64)])]).unwrap();
    let all = poll_all(&b.cq);
    assert_eq!(all.len(), 7, "two received, four flushed from the RQ, one flushed at post: {all:?}");
    assert_eq!(all.iter().filter(|w| w.status == WcStatus::Success).count(), 2);
    assert_eq!(all.iter().map(|w| w.freed).sum::<u32>(), 7);
}

/// Four RD QP pairs over two channels, 1000 random Sends, Writes, Reads and Fetch & Adds each,
/// on a link that loses 5%, duplicates 2%, reorders 2% and corrupts 1% of the packets: every
/// WQE completes once, in post order, successfully; every byte arrives; the atomics agree with
/// a sequential model.
/// Rule ORD-SQ-3, PKT-RTY-1, PKT-DUP-1, PKT-DUP-3, PKT-DUP-4
#[test]
fn lossy_mixed_workload_over_two_channels() {
    use rand::{Rng, SeedableRng};
    const N: usize = 1000;
    const SLOT: usize = 2048;
    const AREA: usize = N * SLOT;
    const QPS: usize = 4;
    let config = SimConfig::default().seed(21).loss(0.05).dup(0.02).reorder(0.02).corrupt(0.01);
    let mut f = SimFabric::new(config.latency_ns(2_000).bandwidth_bps(10_000_000_000));
    let mk = |f: &mut SimFabric, name: &str| {
        let ctx = f.add_device(name).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(1 << 14).unwrap();
        let rdd = ctx.alloc_rdd().unwrap();
        let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
        let mr = pd.alloc_mr(3 * QPS * AREA + 4096, access).unwrap();
        let gid = ctx.query_gid(1, 0).unwrap();
        Node { ctx, pd, cq, rdd, mr, gid }
    };
    let (a, b) = (mk(&mut f, "rd-soak-a"), mk(&mut f, "rd-soak-b"));
    let chans = [channel(&a, &b, Mtu::Mtu256, 7), channel(&a, &b, Mtu::Mtu256, 7)];
    let qp = |n: &Node| {
        let q = n.pd.create_qp(&QpInitAttr::rd(&n.cq, &n.cq, &n.rdd).max_send_wr(1024).max_recv_wr(1024)).unwrap();
        let all = Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
        q.modify(&QpAttr::to_init().access(all).qkey(QKEY)).unwrap();
        q.modify(&QpAttr::new(QpState::Rtr).max_dest_rd_atomic(4).min_rnr_timer(1)).unwrap();
        q.modify(&QpAttr::to_rts().max_rd_atomic(4)).unwrap();
        q
    };
    let qa: Vec<Qp> = (0..QPS).map(|_| qp(&a)).collect();
    let qb: Vec<Qp> = (0..QPS).map(|_| qp(&b)).collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(99);
    let pattern =
        |i: usize, k: usize, len: usize| -> Vec<u8> { (0..len).map(|x| (x * 7 + i * 31 + k * 13) as u8).collect() };
    // (kind, len) per op; kind 0 Send, 1 Write, 2 Read, 3 Fetch & Add.
    let plan: Vec<Vec<(u8, usize)>> =
        (0..QPS).map(|_| (0..N).map(|_| (rng.random_range(0..4u8), rng.random_range(0..=SLOT))).collect()).collect();
    let counters = 3 * QPS * AREA;
    let recv_area = 2 * QPS * AREA;
    for (i, ops) in plan.iter().enumerate() {
        let mut recv_slot = 0;
        for (k, &(kind, len)) in ops.iter().enumerate() {
            let at = i * AREA + k * SLOT;
            match kind {
                0 | 1 => a.mr.write(at, &pattern(i, k, len)).unwrap(),
                2 => b.mr.write(QPS * AREA + at, &pattern(i, k, len)).unwrap(),
                _ => {}
            }
            if kind == 0 {
                let s = recv_area + i * AREA + recv_slot * SLOT;
                qb[i].post_recv(&[RecvWr::new(k as u64, &[b.mr.sge(s..s + SLOT)])]).unwrap();
                recv_slot += 1;
            }
        }
    }
    let (rva, rkey) = (b.mr.addr(), b.mr.rkey());
    for (i, ops) in plan.iter().enumerate() {
        let eec = &chans[i % 2].0;
        let sges: Vec<[Sge; 1]> = ops
            .iter()
            .enumerate()
            .map(|(k, &(kind, len))| {
                let at = i * AREA + k * SLOT;
                match kind {
                    0 | 1 => [a.mr.sge(at..at + len)],
                    2 => [a.mr.sge(QPS * AREA + at..QPS * AREA + at + len)],
                    _ => [a.mr.sge(QPS * AREA + at..QPS * AREA + at + 8)],
                }
            })
            .collect();
        let wrs: Vec<SendWr> = ops
            .iter()
            .enumerate()
            .map(|(k, &(kind, len))| {
                let at = (i * AREA + k * SLOT) as u64;
                let wr = match kind {
                    0 => SendWr::send(k as u64, &sges[k]),
                    1 => SendWr::rdma_write(k as u64, &sges[k], rva + at, rkey),
                    2 => SendWr::rdma_read(k as u64, &sges[k], rva + (QPS * AREA) as u64 + at, rkey),
                    _ => SendWr::atomic_fetch_add(
                        k as u64,
                        &sges[k],
                        rva + (counters + 8 * i) as u64,
                        rkey,
                        k as u64 + 1,
                    ),
                };
                let _ = len;
                wr.rd(eec, qb[i].qp_num(), QKEY).signaled()
            })
            .collect();
        qa[i].post_send(&wrs).unwrap();
    }
    let mut sent = Vec::new();
    wait_for(&mut f, &a.cq, &mut sent, QPS * N);
    assert!(f.counters().lost > 0 && f.counters().corrupted > 0, "{:?}", f.counters());
    for (i, q) in qa.iter().enumerate() {
        let ids: Vec<u64> = sent.iter().filter(|w| w.qp_num == q.qp_num()).map(|w| w.wr_id).collect();
        assert_eq!(ids, (0..N as u64).collect::<Vec<_>>(), "QP {i}: once each, in order");
    }
    assert!(
        sent.iter().all(|w| w.status == WcStatus::Success),
        "{:?}",
        sent.iter().find(|w| w.status != WcStatus::Success)
    );
    let received = poll_all(&b.cq);
    for (i, ops) in plan.iter().enumerate() {
        let mut recv_slot = 0;
        let mut sum = 0u64;
        let mine: Vec<&Wc> = received.iter().filter(|w| w.qp_num == qb[i].qp_num()).collect();
        for (k, &(kind, len)) in ops.iter().enumerate() {
            let at = i * AREA + k * SLOT;
            let mut got = vec![0u8; len];
            match kind {
                0 => {
                    let wc = mine[recv_slot];
                    assert_eq!((wc.wr_id, wc.byte_len as usize, wc.status), (k as u64, len, WcStatus::Success));
                    b.mr.read(recv_area + i * AREA + recv_slot * SLOT, &mut got).unwrap();
                    recv_slot += 1;
                }
                1 => b.mr.read(at, &mut got).unwrap(),
                2 => a.mr.read(QPS * AREA + at, &mut got).unwrap(),
                _ => {
                    let mut w = [0u8; 8];
                    a.mr.read(QPS * AREA + at, &mut w).unwrap();
                    assert_eq!(u64::from_ne_bytes(w), sum, "QP {i} op {k}: fetch-add result");
                    sum += k as u64 + 1;
                    continue;
                }
            }
            assert!(got == pattern(i, k, len), "QP {i} op {k} kind {kind}: data");
        }
        assert_eq!(mine.len(), recv_slot, "QP {i}: one receive CQE per Send");
        let mut w = [0u8; 8];
        b.mr.read(counters + 8 * i, &mut w).unwrap();
        assert_eq!(u64::from_ne_bytes(w), sum);
    }
}

/// Bind MW on an RD QP is local and completes in order; a remote RD Write then lands through
/// the window's R_Key.
/// Rule WR-SQ-5
#[test]
fn bind_mw_on_an_rd_qp() {
    let mut f = fabric(SimConfig::default().seed(22));
    let (a, b) = (node(&mut f, "rd11-a"), node(&mut f, "rd11-b"));
    let (ea, _eb) = channel(&a, &b, Mtu::Mtu1024, 7);
    let (qa, qb) = (rd_qp(&a, &a.rdd), rd_qp(&b, &b.rdd));
    let region = b.pd.alloc_mr(8192, Access::LOCAL_WRITE | Access::MW_BIND).unwrap();
    let mw = b.pd.alloc_mw().unwrap();
    qb.post_send(&[SendWr::bind_mw(1, &mw, &region, region.addr(), 4096, Access::REMOTE_WRITE).signaled()]).unwrap();
    let mut got = Vec::new();
    wait_for(&mut f, &b.cq, &mut got, 1);
    assert_eq!((got[0].wr_id, got[0].status, got[0].opcode), (1, WcStatus::Success, WcOpcode::BindMw));
    a.mr.write(0, &[0x3C; 1000]).unwrap();
    let sge = [a.mr.sge(0..1000)];
    qa.post_send(&[SendWr::rdma_write(2, &sge, region.addr() + 100, mw.rkey()).rd(&ea, qb.qp_num(), QKEY).signaled()])
        .unwrap();
    let mut got = Vec::new();
    wait_for(&mut f, &a.cq, &mut got, 1);
    assert_eq!(got[0].status, WcStatus::Success);
    let mut buf = [0u8; 1000];
    region.read(100, &mut buf).unwrap();
    assert!(buf.iter().all(|&x| x == 0x3C));
}

/// RD packets from a peer are untrusted: thousands of real RD requests and responses with
/// one to four bytes scrambled (ICRC made right again) hit two devices whose channels are in
/// the middle of messages; nothing panics and every QP and EEC stays queryable.
/// Rule PKT-VAL-1, PKT-VAL-4
#[test]
fn mutated_rd_packets_never_panic() {
    use rand::{Rng, SeedableRng};
    let mut f = SimFabric::new(SimConfig::default().seed(23).latency_ns(1_000).bandwidth_bps(1_000_000_000));
    let corpus = Rc::new(RefCell::new(Vec::new()));
    let c = corpus.clone();
    f.set_filter(move |_, d: &mut Vec<u8>| {
        c.borrow_mut().push(d.clone());
        Verdict::Pass
    });
    let (a, b) = (node(&mut f, "rd12-a"), node(&mut f, "rd12-b"));
    let (ea, eb) = channel(&a, &b, Mtu::Mtu256, 7);
    let (qa, qb) = (rd_qp(&a, &a.rdd), rd_qp(&b, &b.rdd));
    let post_round = |k: u64| {
        qb.post_recv(&[RecvWr::new(k, &[b.mr.sge(0..8192)])]).unwrap();
        let s = [a.mr.sge(0..4000)];
        let r = [a.mr.sge(8192..10_000)];
        let w = [a.mr.sge(20_000..20_008)];
        let (va, rkey) = (b.mr.addr(), b.mr.rkey());
        let wrs = [
            SendWr::send(k, &s).rd(&ea, qb.qp_num(), QKEY),
            SendWr::rdma_write(k, &s, va + 10_000, rkey).rd(&ea, qb.qp_num(), QKEY),
            SendWr::rdma_read(k, &r, va, rkey).rd(&ea, qb.qp_num(), QKEY),
            SendWr::atomic_fetch_add(k, &w, va + 30_000, rkey, 1).rd(&ea, qb.qp_num(), QKEY),
        ];
        let _ = qa.post_send(&wrs);
    };
    post_round(0);
    f.run_until_idle();
    f.clear_filter();
    let corpus = corpus.borrow().clone();
    assert!(corpus.len() > 20);
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let ids: Vec<_> = f.devices().map(|(id, _)| id).collect();
    for case in 0..3000u64 {
        if case % 500 == 0 {
            post_round(case);
        }
        let mut d = corpus[rng.random_range(0..corpus.len())].clone();
        for _ in 0..rng.random_range(1..5) {
            let i = rng.random_range(20..d.len() - 4);
            d[i] = rng.random();
        }
        let _ = softhca::link::sim::reseal(&mut d);
        f.inject_to(ids[rng.random_range(0..ids.len())], d);
        f.run_for(20_000);
    }
    f.run_for(100_000_000);
    for q in [&qa, &qb] {
        assert!(QpState::ALL.contains(&q.query().unwrap().qp_state));
    }
    for e in [&ea, &eb] {
        assert!(e.query().is_ok());
    }
}

/// Modify EEC walks Reset → Init → RTR → RTS ⇄ SQD with exactly the parameters each step
/// takes; a missing or an extra one is refused and changes nothing, there is no SQE, and
/// Query EEC reports what was set. An RDD with an EEC in it cannot be deallocated.
/// Rule QPS-RD-6
#[test]
fn modify_and_query_eec() {
    let mut f = fabric(SimConfig::default().seed(24));
    let (a, b) = (node(&mut f, "rd13-a"), node(&mut f, "rd13-b"));
    let e = a.ctx.create_eec(&a.rdd).unwrap();
    assert_eq!(e.query().unwrap().state, QpState::Reset);
    assert!(e.modify(&EecAttr::new(QpState::Rtr)).is_err(), "Reset → RTR does not exist");
    assert!(e.modify(&EecAttr::new(QpState::Init).pkey_index(0)).is_err(), "the port is required");
    assert!(e.modify(&EecAttr::new(QpState::Init).pkey_index(0).port_num(1).sq_psn(1)).is_err(), "extra");
    assert_eq!(e.query().unwrap().state, QpState::Reset);
    e.modify(&EecAttr::new(QpState::Init).pkey_index(0).port_num(1)).unwrap();
    let av = AddressVector::new(AhAttr::roce(b.gid, 0), Mtu::Mtu2048);
    let rtr = EecAttr::new(QpState::Rtr).av(av).dest_eecn(0x1234).rq_psn(0x55);
    assert!(e.modify(&rtr).is_err(), "the inbound depth is required");
    e.modify(&rtr.clone().max_dest_rd_atomic(3)).unwrap();
    let rts = EecAttr::new(QpState::Rts).sq_psn(0x66).timeout(12).retry_cnt(5).rnr_retry(6);
    assert!(e.modify(&rts).is_err(), "the outbound depth is required");
    e.modify(&rts.max_rd_atomic(2)).unwrap();
    let q = e.query().unwrap();
    assert_eq!(
        (q.state, q.dest_eecn, q.rq_psn, q.sq_psn, q.max_dest_rd_atomic, q.max_rd_atomic),
        (QpState::Rts, 0x1234, 0x55, 0x66, 3, 2)
    );
    assert_eq!((q.timeout, q.retry_cnt, q.rnr_retry, q.av.unwrap().path_mtu), (12, 5, 6, Mtu::Mtu2048));
    assert!(e.modify(&EecAttr::new(QpState::Sqe)).is_err(), "no SQE");
    e.modify(&EecAttr::new(QpState::Sqd)).unwrap();
    e.modify(&EecAttr::new(QpState::Rts).timeout(14)).unwrap();
    assert!(matches!(a.rdd.dealloc(), Err(VerbsError::InUse(_))));
    e.modify(&EecAttr::new(QpState::Error)).unwrap();
    e.modify(&EecAttr::new(QpState::Reset)).unwrap();
    assert_eq!(e.query().unwrap(), EecAttrs::default());
    e.destroy().unwrap();
    assert!(e.query().is_err());
}

/// A receive WQE bound to a channel whose EEC goes to Error mid-message completes with Flush
/// Error at its QP's next turn, and the QP's later receives still work through another channel.
/// Rule ERR-FLUSH-1, ORD-RD-1
#[test]
fn a_held_receive_is_flushed_when_its_channel_fails() {
    let mut f = SimFabric::new(SimConfig::default().seed(25).latency_ns(1_000).bandwidth_bps(1_000_000_000));
    let (a, b) = (node(&mut f, "rd14-a"), node(&mut f, "rd14-b"));
    let (ea, eb) = channel(&a, &b, Mtu::Mtu1024, 7);
    let (ea2, _eb2) = channel(&a, &b, Mtu::Mtu1024, 7);
    let (qa, qb) = (rd_qp(&a, &a.rdd), rd_qp(&b, &b.rdd));
    qb.post_recv(&[RecvWr::new(1, &[b.mr.sge(0..65536)]), RecvWr::new(2, &[b.mr.sge(65536..65600)])]).unwrap();
    let big = [a.mr.sge(0..65536)];
    qa.post_send(&[SendWr::send(1, &big).rd(&ea, qb.qp_num(), QKEY).signaled()]).unwrap();
    let bctx = b.ctx.clone();
    assert!(f.run_until_within(1_000_000_000, |_| bctx.counters().rx_packets >= 4));
    eb.modify(&EecAttr::new(QpState::Error)).unwrap();
    f.run_for(10_000_000);
    let r: Vec<(u64, WcStatus)> = poll_all(&b.cq).iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(r, [(1, WcStatus::WrFlushErr)], "the held WQE, and only it");
    assert_eq!(qb.query().unwrap().qp_state, QpState::Rts, "the QP itself is fine");
    let small = [a.mr.sge(0..64)];
    let q2 = rd_qp(&a, &a.rdd);
    q2.post_send(&[SendWr::send(5, &small).rd(&ea2, qb.qp_num(), QKEY).signaled()]).unwrap();
    let mut got = Vec::new();
    wait_for(&mut f, &b.cq, &mut got, 1);
    assert_eq!((got[0].wr_id, got[0].status, got[0].byte_len), (2, WcStatus::Success, 64));
}

/// An RD QP may take its receives from an SRQ; each channel binds the SRQ's next WQE.
/// Rule ORD-RD-1, CQE-11
#[test]
fn rd_qp_on_an_srq() {
    let mut f = fabric(SimConfig::default().seed(26));
    let (a, b) = (node(&mut f, "rd15-a"), node(&mut f, "rd15-b"));
    let (ea, eb) = channel(&a, &b, Mtu::Mtu1024, 7);
    let qa = rd_qp(&a, &a.rdd);
    let srq = b.pd.create_srq(&SrqInitAttr::default()).unwrap();
    let qb = b.pd.create_qp(&QpInitAttr::rd(&b.cq, &b.cq, &b.rdd).srq(&srq)).unwrap();
    let all = Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    qb.modify(&QpAttr::to_init().access(all).qkey(QKEY)).unwrap();
    qb.modify(&QpAttr::new(QpState::Rtr).max_dest_rd_atomic(4)).unwrap();
    qb.modify(&QpAttr::to_rts().max_rd_atomic(4)).unwrap();
    srq.post_recv(&[RecvWr::new(70, &[b.mr.sge(0..2048)]), RecvWr::new(71, &[b.mr.sge(2048..4096)])]).unwrap();
    a.mr.write(0, &[4u8; 1500]).unwrap();
    let s = [a.mr.sge(0..1500)];
    qa.post_send(&[
        SendWr::send(1, &s).rd(&ea, qb.qp_num(), QKEY).signaled(),
        SendWr::send(2, &s).rd(&ea, qb.qp_num(), QKEY).signaled(),
    ])
    .unwrap();
    let mut got = Vec::new();
    wait_for(&mut f, &b.cq, &mut got, 2);
    let r: Vec<(u64, u32, u32)> = got.iter().map(|w| (w.wr_id, w.byte_len, w.eecn)).collect();
    assert_eq!(r, [(70, 1500, eb.eecn()), (71, 1500, eb.eecn())]);
    let mut buf = [0u8; 1500];
    b.mr.read(2048, &mut buf).unwrap();
    assert!(buf.iter().all(|&x| x == 4));
}

/// Packets kept by a filter: (BTH opcode, datagram).
type Captured = Rc<RefCell<Vec<(u8, Vec<u8>)>>>;

/// Keeps a copy of every packet device `from` sends with BTH opcode `opcode`.
fn capture(f: &mut SimFabric, from: usize, opcode: u8) -> Rc<RefCell<Vec<Vec<u8>>>> {
    let got: Rc<RefCell<Vec<Vec<u8>>>> = Rc::default();
    let c = got.clone();
    f.set_filter(move |ctx: &FilterCtx, d: &mut Vec<u8>| {
        if ctx.from == Some(DeviceId(from)) && opcode_of(d) == Some(opcode) {
            c.borrow_mut().push(d.clone());
        }
        Verdict::Pass
    });
    got
}

fn opcode_of(d: &[u8]) -> Option<u8> {
    roce::parse_ip(d).ok().map(|p| u8::from(p.packet.bth.opcode))
}

/// An RDMA Write with Immediate to an RD QP whose SRQ is empty is RNR NAKed with nothing
/// changed, so the retransmission after a receive is posted succeeds.
/// Rule ERR-RQ-3, PKT-RNR-3
#[test]
fn write_with_imm_to_an_srq_qp_survives_an_rnr_nak() {
    let mut f = fabric(SimConfig::default().seed(101));
    let (a, b) = (node(&mut f, "rv1-a"), node(&mut f, "rv1-b"));
    let (ea, _eb) = channel(&a, &b, Mtu::Mtu1024, 7);
    let qa = rd_qp(&a, &a.rdd);
    let srq = b.pd.create_srq(&SrqInitAttr::default()).unwrap();
    let qb = b.pd.create_qp(&QpInitAttr::rd(&b.cq, &b.cq, &b.rdd).srq(&srq)).unwrap();
    let all = Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    qb.modify(&QpAttr::to_init().access(all).qkey(QKEY)).unwrap();
    qb.modify(&QpAttr::new(QpState::Rtr).max_dest_rd_atomic(4).min_rnr_timer(1)).unwrap();
    qb.modify(&QpAttr::to_rts().max_rd_atomic(4)).unwrap();
    let s = [a.mr.sge(0..1000)];
    qa.post_send(&[SendWr::rdma_write(1, &s, b.mr.addr(), b.mr.rkey()).imm(7).rd(&ea, qb.qp_num(), QKEY).signaled()])
        .unwrap();
    let bctx = b.ctx.clone();
    assert!(f.run_until_within(1_000_000_000, |_| bctx.counters().rnr_naks_sent >= 1), "an RNR NAK");
    srq.post_recv(&[RecvWr::new(70, &[])]).unwrap();
    let mut got = Vec::new();
    wait_for(&mut f, &a.cq, &mut got, 1);
    assert_eq!(got[0].status, WcStatus::Success, "requester: {got:?}");
    assert_eq!(qb.query().unwrap().qp_state, QpState::Rts);
}

/// A PSN Sequence Error NAK with no retry left fails the WQE and moves the EEC to Error
/// (QPS-RD-6), rather than leaving it in RTS with its PSNs out of step with the responder's:
/// the next message on the channel does not vanish.
/// Rule QPS-RD-6, PKT-RTY-7
#[test]
fn psn_nak_with_no_retry_left_does_not_leave_the_channel_out_of_step() {
    let mut f = fabric(SimConfig::default().seed(102));
    let (a, b) = (node(&mut f, "rv2-a"), node(&mut f, "rv2-b"));
    let (ea, _eb) = channel(&a, &b, Mtu::Mtu1024, 0);
    let (qa, qa2, qb) = (rd_qp(&a, &a.rdd), rd_qp(&a, &a.rdd), rd_qp(&b, &b.rdd));
    qb.post_recv(&[RecvWr::new(1, &[b.mr.sge(0..4096)]), RecvWr::new(2, &[b.mr.sge(4096..8192)])]).unwrap();
    // Lose the second request packet of the first message only.
    let from_a = Rc::new(std::cell::Cell::new(0u32));
    let n = from_a.clone();
    f.set_filter(move |ctx: &FilterCtx, _| {
        if ctx.from == Some(DeviceId(0)) {
            n.set(n.get() + 1);
            if n.get() == 2 {
                return Verdict::Drop;
            }
        }
        Verdict::Pass
    });
    let s = [a.mr.sge(0..3000)];
    qa.post_send(&[SendWr::send(1, &s).rd(&ea, qb.qp_num(), QKEY).signaled()]).unwrap();
    let mut got = Vec::new();
    wait_for(&mut f, &a.cq, &mut got, 1);
    assert_eq!(got[0].status, WcStatus::RetryExcErr, "PKT-RTY-7 with retry_cnt 0");
    let small = [a.mr.sge(0..64)];
    qa2.post_send(&[SendWr::send(2, &small).rd(&ea, qb.qp_num(), QKEY).signaled()]).unwrap();
    let mut got = Vec::new();
    wait_for(&mut f, &a.cq, &mut got, 1);
    let eec_state = ea.query().unwrap().state;
    assert!(
        got[0].status == WcStatus::Success || got[0].status == WcStatus::InvEecStateErr,
        "the channel was left out of step (EEC in {eec_state}): {got:?}"
    );
}

/// A fatal NAK that arrives after its QP was flushed, before the EEC's next transmit turn:
/// the message still ends with a Resync, and the channel carries the next QP's message.
/// Rule PKT-NAK-2, ERR-FLUSH-1
#[test]
fn fatal_nak_after_the_owner_was_flushed_still_resyncs() {
    let mut f = fabric(SimConfig::default().seed(103));
    let (a, b) = (node(&mut f, "rv3-a"), node(&mut f, "rv3-b"));
    let (ea, _eb) = channel(&a, &b, Mtu::Mtu1024, 7);
    // A long ACK timeout, so that no retransmission overtakes the held NAK.
    ea.modify(&EecAttr::new(QpState::Rts).timeout(20)).unwrap();
    let (qa, qa2) = (rd_qp(&a, &a.rdd), rd_qp(&a, &a.rdd));
    let (qb, qb2) = (rd_qp(&b, &b.rdd), rd_qp(&b, &b.rdd));
    let held: Rc<RefCell<Vec<Vec<u8>>>> = Rc::default();
    let hold = Rc::new(std::cell::Cell::new(true));
    let (h, c) = (hold.clone(), held.clone());
    f.set_filter(move |ctx: &FilterCtx, d: &mut Vec<u8>| {
        if h.get() && ctx.from == Some(DeviceId(1)) {
            c.borrow_mut().push(d.clone());
            return Verdict::Drop;
        }
        Verdict::Pass
    });
    let s = [a.mr.sge(0..64)];
    qa.post_send(&[SendWr::rdma_write(1, &s, b.mr.addr(), b.mr.rkey() ^ 0x100).rd(&ea, qb.qp_num(), QKEY)]).unwrap();
    let c = held.clone();
    f.run_for(100_000);
    assert!(!c.borrow().is_empty(), "the responder's NAK");
    let nak = held.borrow()[0].clone();
    assert_eq!(opcode_of(&nak), Some(0x51));
    hold.set(false);
    // The application flushes qa; the NAK is handled before the engine's next transmit pass.
    qa.modify(&QpAttr::to_error()).unwrap();
    // The message has already turned into its Resync: the NAK finds nothing left to end.
    a.ctx.receive(f.now(), &nak);
    ea.modify(&EecAttr::new(QpState::Rts).timeout(8)).unwrap();
    qb2.post_recv(&[RecvWr::new(5, &[b.mr.sge(0..64)])]).unwrap();
    qa2.post_send(&[SendWr::send(2, &s).rd(&ea, qb2.qp_num(), QKEY).signaled()]).unwrap();
    let mut got = Vec::new();
    wait_for(&mut f, &a.cq, &mut got, 2);
    let mine: Vec<&Wc> = got.iter().filter(|w| w.qp_num == qa2.qp_num()).collect();
    assert_eq!(mine.len(), 1, "{got:?}");
    assert_eq!(mine[0].status, WcStatus::Success, "the channel never resynchronized: {got:?}");
}

/// A duplicate Read request after the EEC's path MTU grew (SQD → RTS with a new AV), forged
/// to match the new MTU: the saved Read keeps the MTU it was cut by, and the peer's numbers
/// cannot make the arithmetic overflow.
/// DESIGN rule 6
#[test]
fn duplicate_read_after_an_mtu_change_does_not_panic() {
    let mut f = fabric(SimConfig::default().seed(104));
    let (a, b) = (node(&mut f, "rv4-a"), node(&mut f, "rv4-b"));
    let (ea, eb) = channel(&a, &b, Mtu::Mtu256, 7);
    let (qa, qb) = (rd_qp(&a, &a.rdd), rd_qp(&b, &b.rdd));
    let reqs = capture(&mut f, 0, 0x4C);
    let s = [a.mr.sge(0..1024)];
    qa.post_send(&[SendWr::rdma_read(1, &s, b.mr.addr(), b.mr.rkey()).rd(&ea, qb.qp_num(), QKEY).signaled()]).unwrap();
    let mut got = Vec::new();
    wait_for(&mut f, &a.cq, &mut got, 1);
    assert_eq!(got[0].status, WcStatus::Success);
    eb.modify(&EecAttr::new(QpState::Sqd)).unwrap();
    let av = AddressVector::new(AhAttr::roce(a.gid, 0), Mtu::Mtu1024);
    eb.modify(&EecAttr::new(QpState::Rts).av(av)).unwrap();
    let mut d = reqs.borrow()[0].clone();
    rewrite(&mut d, |r| {
        r.packet.bth.psn = r.packet.bth.psn.add(3);
        if let Some(reth) = r.packet.reth.as_mut() {
            reth.va = reth.va.wrapping_add(3 * 1024);
        }
    })
    .unwrap();
    f.inject_to(DeviceId(1), d);
    f.run_for(1_000_000);
    assert!(eb.query().is_ok() && qb.query().is_ok());
}

/// A request out of sequence for a QP outside the channel's RDD changes nothing on that QP:
/// the RDD check comes first (Invalid RD Request), so a peer cannot move another domain's QP
/// to Error.
/// Rule ERR-SQ-9, DESIGN rule 5
#[test]
fn a_bad_sequence_for_a_qp_of_another_rdd_leaves_that_qp_alone() {
    let mut f = fabric(SimConfig::default().seed(105));
    let (a, b) = (node(&mut f, "rv5-a"), node(&mut f, "rv5-b"));
    let (ea, _eb) = channel(&a, &b, Mtu::Mtu1024, 7);
    let qa = rd_qp(&a, &a.rdd);
    let other = b.ctx.alloc_rdd().unwrap();
    let (stranger, qb) = (rd_qp(&b, &other), rd_qp(&b, &b.rdd));
    let reqs = capture(&mut f, 0, 0x44);
    qb.post_recv(&[RecvWr::new(1, &[b.mr.sge(0..64)])]).unwrap();
    let s = [a.mr.sge(0..64)];
    qa.post_send(&[SendWr::send(1, &s).rd(&ea, qb.qp_num(), QKEY).signaled()]).unwrap();
    let mut got = Vec::new();
    wait_for(&mut f, &a.cq, &mut got, 1);
    assert_eq!(got[0].status, WcStatus::Success);
    let mut d = reqs.borrow()[0].clone();
    let stranger_qpn = stranger.qp_num();
    rewrite(&mut d, |r| {
        r.packet.bth.opcode = Opcode::RdSendMiddle;
        r.packet.bth.dest_qp = stranger_qpn;
        r.packet.bth.psn = r.packet.bth.psn.add(1);
    })
    .unwrap();
    f.inject_to(DeviceId(1), d);
    f.run_for(1_000_000);
    assert_eq!(stranger.query().unwrap().qp_state, QpState::Rts, "a QP of another RDD was moved to Error");
}

/// Five Reads arriving before any response leaves, with an inbound depth of 4: the fifth is
/// refused with an Invalid Request NAK and not executed, so a peer cannot queue Reads
/// without bound.
/// Rule ERR-RQ-6, WR-RQ-6
#[test]
fn reads_beyond_the_inbound_depth_are_refused() {
    let mut f = fabric(SimConfig::default().seed(106));
    let (a, b) = (node(&mut f, "rv6-a"), node(&mut f, "rv6-b"));
    let (ea, _eb) = channel(&a, &b, Mtu::Mtu256, 7);
    let (qa, qb) = (rd_qp(&a, &a.rdd), rd_qp(&b, &b.rdd));
    let reqs = capture(&mut f, 0, 0x4C);
    let s = [a.mr.sge(0..1024)];
    qa.post_send(&[SendWr::rdma_read(1, &s, b.mr.addr(), b.mr.rkey()).rd(&ea, qb.qp_num(), QKEY).signaled()]).unwrap();
    let mut got = Vec::new();
    wait_for(&mut f, &a.cq, &mut got, 1);
    assert_eq!(got[0].status, WcStatus::Success);
    // (opcode, PSN, AETH syndrome) of every packet the responder sends.
    type Sent = Vec<(u8, u32, Option<u8>)>;
    let from_b: Rc<RefCell<Sent>> = Rc::default();
    let c = from_b.clone();
    f.set_filter(move |ctx: &FilterCtx, d: &mut Vec<u8>| {
        if ctx.from == Some(DeviceId(1)) {
            if let Ok(p) = roce::parse_ip(d) {
                let syn = p.packet.aeth.map(|a| u8::from(a.syndrome));
                c.borrow_mut().push((u8::from(p.packet.bth.opcode), p.packet.bth.psn.value(), syn));
            }
        }
        Verdict::Pass
    });
    let original = reqs.borrow()[0].clone();
    for i in 1..=5u32 {
        let mut d = original.clone();
        rewrite(&mut d, |r| r.packet.bth.psn = r.packet.bth.psn.add(4 * i)).unwrap();
        b.ctx.receive(f.now(), &d);
    }
    f.run_for(10_000_000);
    let log = from_b.borrow();
    let responses = log.iter().filter(|(op, _, _)| (0x4D..=0x50).contains(op)).count();
    assert!(responses <= 16, "{responses} Read response packets for 5 Reads of 4 packets with an inbound depth of 4");
    assert!(log.iter().any(|&(op, _, syn)| op == 0x51 && syn == Some(0x61)), "no Invalid Request NAK: {log:?}");
}

/// A device with two channels: one streams the responses of a large RDMA Read its peer asked
/// for, the other carries a 16-packet Send of a local QP. The channels take turns packet by
/// packet, so the Send does not wait behind the whole Read (a 2 GiB Read would otherwise hold
/// it for seconds, long enough for its ACK timer, and its peer's, to run out of retries).
#[test]
fn an_eec_streaming_read_responses_does_not_starve_another_eec() {
    let mut f = fabric(SimConfig::default().seed(201));
    let (a, b) = (node(&mut f, "r2s-a"), node(&mut f, "r2s-b"));
    let (ea1, _eb1) = channel(&a, &b, Mtu::Mtu256, 7);
    let (_ea2, eb2) = channel(&a, &b, Mtu::Mtu256, 7);
    let (qa_read, qa_recv) = (rd_qp(&a, &a.rdd), rd_qp(&a, &a.rdd));
    let (qb_target, qb_send) = (rd_qp(&b, &b.rdd), rd_qp(&b, &b.rdd));
    // Opcodes device b sends, in order.
    let from_b: Rc<RefCell<Vec<u8>>> = Rc::default();
    let c = from_b.clone();
    f.set_filter(move |ctx: &FilterCtx, d: &mut Vec<u8>| {
        if ctx.from == Some(DeviceId(1)) {
            if let Some(op) = opcode_of(d) {
                c.borrow_mut().push(op);
            }
        }
        Verdict::Pass
    });
    let is_read_resp = |op: u8| (0x4D..=0x50).contains(&op);
    let is_send = |op: u8| (0x40..=0x45).contains(&op);
    // A 512 KiB Read: 2048 response packets from b over channel 1.
    let local = [a.mr.sge(0..512 * 1024)];
    qa_read
        .post_send(&[SendWr::rdma_read(1, &local, b.mr.addr(), b.mr.rkey())
            .rd(&ea1, qb_target.qp_num(), QKEY)
            .signaled()])
        .unwrap();
    let c = from_b.clone();
    assert!(f.run_until_within(1_000_000_000, |_| c.borrow().iter().filter(|&&op| is_read_resp(op)).count() >= 8));
    // Now b's own QP sends 4 KiB (16 packets) over channel 2.
    qa_recv.post_recv(&[RecvWr::new(7, &[a.mr.sge(600_000..604_096)])]).unwrap();
    let s = [b.mr.sge(600_000..604_096)];
    qb_send.post_send(&[SendWr::send(2, &s).rd(&eb2, qa_recv.qp_num(), QKEY).signaled()]).unwrap();
    let mut got = Vec::new();
    wait_for(&mut f, &a.cq, &mut got, 2);
    let log = from_b.borrow();
    let first = log.iter().position(|&op| is_send(op)).expect("the Send left");
    let last = log.iter().rposition(|&op| is_send(op)).unwrap();
    let between = log[first..last].iter().filter(|&&op| is_read_resp(op)).count();
    assert!(
        between < 200,
        "{between} Read responses of channel 1 left between the first and the last packet of \
         channel 2's 16-packet Send: one EEC keeps the RD turn while it has responses"
    );
}

/// CQE-15 across a Reset: a receive WQE bound to a channel when its QP is reset is discarded
/// with the rest of the queues (QPS-RESET-5), and the first receive CQE of the QP's next life
/// counts only the slots freed in that life.
/// Rule CQE-15, QPS-RESET-5
#[test]
fn freed_count_does_not_leak_across_a_reset() {
    let mut f = fabric(SimConfig::default().seed(202));
    let (a, b) = (node(&mut f, "r2f-a"), node(&mut f, "r2f-b"));
    let (ea, _eb) = channel(&a, &b, Mtu::Mtu1024, 7);
    let (qa, qa2, qb) = (rd_qp(&a, &a.rdd), rd_qp(&a, &a.rdd), rd_qp(&b, &b.rdd));
    qb.post_recv(&[RecvWr::new(1, &[b.mr.sge(0..4096)]), RecvWr::new(2, &[b.mr.sge(4096..8192)])]).unwrap();
    // Only the first packet of qa's 3-packet Send gets through: W1 is bound and held.
    let cut = Rc::new(std::cell::Cell::new(true));
    let n = Rc::new(std::cell::Cell::new(0u32));
    let (c, k) = (cut.clone(), n.clone());
    f.set_filter(move |ctx: &FilterCtx, _| {
        if ctx.from == Some(DeviceId(0)) {
            k.set(k.get() + 1);
            if c.get() && k.get() > 1 {
                return Verdict::Drop;
            }
        }
        Verdict::Pass
    });
    let big = [a.mr.sge(0..3000)];
    qa.post_send(&[SendWr::send(1, &big).rd(&ea, qb.qp_num(), QKEY).signaled()]).unwrap();
    let bctx = b.ctx.clone();
    assert!(f.run_until_within(1_000_000_000, |_| bctx.counters().rx_packets >= 1));
    // qb starts a new life; qa gives its message up (the channel resyncs).
    qb.modify(&QpAttr::new(QpState::Reset)).unwrap();
    let all = Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    qb.modify(&QpAttr::to_init().access(all).qkey(QKEY)).unwrap();
    qb.modify(&QpAttr::new(QpState::Rtr).max_dest_rd_atomic(4).min_rnr_timer(1)).unwrap();
    qb.modify(&QpAttr::to_rts().max_rd_atomic(4)).unwrap();
    qa.modify(&QpAttr::to_error()).unwrap();
    cut.set(false);
    qb.post_recv(&[RecvWr::new(3, &[b.mr.sge(0..64)])]).unwrap();
    let small = [a.mr.sge(0..64)];
    qa2.post_send(&[SendWr::send(9, &small).rd(&ea, qb.qp_num(), QKEY).signaled()]).unwrap();
    let mut got = Vec::new();
    wait_for(&mut f, &a.cq, &mut got, 2);
    assert!(got.iter().any(|w| w.wr_id == 9 && w.status == WcStatus::Success), "{got:?}");
    let recv = poll_all(&b.cq);
    assert_eq!(recv.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(), [(3, WcStatus::Success)]);
    assert_eq!(recv[0].freed, 1, "one RQ WQE retired since the Reset, but the CQE reports {}", recv[0].freed);
}

/// A fatal NAK that is lost: the retransmission of the NAKed packet gets the same NAK again,
/// so the requester learns the real status and the channel lives on.
/// Rule ERR-SQ-7, PKT-NAK-2
#[test]
fn a_lost_fatal_nak_is_repeated_for_the_retransmission() {
    let mut f = fabric(SimConfig::default().seed(203));
    let (a, b) = (node(&mut f, "r2n-a"), node(&mut f, "r2n-b"));
    let (ea, _eb) = channel(&a, &b, Mtu::Mtu1024, 7);
    let (qa, qb) = (rd_qp(&a, &a.rdd), rd_qp(&b, &b.rdd));
    let dropped = Rc::new(std::cell::Cell::new(false));
    let d = dropped.clone();
    f.set_filter(move |ctx: &FilterCtx, p: &mut Vec<u8>| {
        if ctx.from == Some(DeviceId(1)) && opcode_of(p) == Some(0x51) && !d.get() {
            d.set(true);
            return Verdict::Drop; // the Remote Access Error NAK
        }
        Verdict::Pass
    });
    let s = [a.mr.sge(0..64)];
    qa.post_send(&[SendWr::rdma_write(1, &s, b.mr.addr(), b.mr.rkey() ^ 0x100).rd(&ea, qb.qp_num(), QKEY).signaled()])
        .unwrap();
    let mut got = Vec::new();
    wait_for(&mut f, &a.cq, &mut got, 1);
    assert!(dropped.get());
    let state = ea.query().unwrap().state;
    assert_eq!(
        (got[0].status, state),
        (WcStatus::RemAccessErr, QpState::Rts),
        "a single lost NAK failed the WQE with the wrong status and took the channel down"
    );
}

/// A fatal NAK for the last packet of a message is lost, and the requester, which had no ACK
/// for the packets before it, goes back to the message's first packet: the responder answers
/// that duplicate with an ACK of everything before the NAKed packet (PKT-DUP-1), the
/// requester sends the NAKed packet again and hears its NAK. Before, the duplicate was dropped
/// while the channel waited for its Resync, every probe went unanswered, and the Send ended in
/// Retry Counter Exceeded with the channel in Error.
/// Rule PKT-DUP-1, ERR-SQ-7, PKT-NAK-2
#[test]
fn a_lost_fatal_nak_behind_unacknowledged_packets_is_repeated() {
    let mut f = fabric(SimConfig::default().seed(204));
    let (a, b) = (node(&mut f, "r3n-a"), node(&mut f, "r3n-b"));
    let (ea, _eb) = channel(&a, &b, Mtu::Mtu1024, 7);
    let (qa, qb) = (rd_qp(&a, &a.rdd), rd_qp(&b, &b.rdd));
    qb.post_recv(&[RecvWr::new(1, &[b.mr.sge(0..2048)])]).unwrap();
    let dropped = Rc::new(std::cell::Cell::new(false));
    let d = dropped.clone();
    f.set_filter(move |ctx: &FilterCtx, p: &mut Vec<u8>| {
        if ctx.from == Some(DeviceId(1)) && opcode_of(p) == Some(0x51) && !d.get() {
            d.set(true);
            return Verdict::Drop; // the Invalid Request NAK of the third packet
        }
        Verdict::Pass
    });
    let s = [a.mr.sge(0..3000)]; // three packets, for a 2048-byte receive (ERR-RQ-11)
    qa.post_send(&[SendWr::send(1, &s).rd(&ea, qb.qp_num(), QKEY).signaled()]).unwrap();
    let mut got = Vec::new();
    wait_for(&mut f, &a.cq, &mut got, 1);
    assert!(dropped.get());
    assert_eq!((got[0].status, ea.query().unwrap().state), (WcStatus::RemInvReqErr, QpState::Rts));
}

/// The ACK an EEC owes for a Send whose completion the application has already seen survives
/// Destroy EEC (as a QP's survives Destroy QP): the requester's Send completes with Success,
/// not with a retry error against a channel that no longer exists.
/// Rule PKT-ACK-3, PKT-ACK-13
#[test]
fn destroying_an_eec_still_sends_the_ack_it_owes() {
    let mut f = fabric(SimConfig::default().seed(5));
    let (a, b) = (node(&mut f, "rd-a"), node(&mut f, "rd-b"));
    let (ea, eb) = channel(&a, &b, Mtu::Mtu1024, 1);
    let (qa, qb) = (rd_qp(&a, &a.rdd), rd_qp(&b, &b.rdd));
    qb.post_recv(&[RecvWr::new(1, &[b.mr.sge(0..64)])]).unwrap();
    let s = [a.mr.sge(0..8)];
    qa.post_send(&[SendWr::send(1, &s).rd(&ea, qb.qp_num(), QKEY).signaled()]).unwrap();
    // Run until B completes the receive, then destroy B's end of the channel at once.
    let mut got = Vec::new();
    wait_for(&mut f, &b.cq, &mut got, 1);
    assert_eq!(got[0].status, WcStatus::Success, "{got:?}");
    eb.destroy().unwrap();
    let mut sent = Vec::new();
    wait_for(&mut f, &a.cq, &mut sent, 1);
    assert_eq!((sent[0].wr_id, sent[0].status), (1, WcStatus::Success), "{sent:?}");
}

/// The responder's EEC moved to Error right after it executed a Send, before its ACK left:
/// the ACK still goes out (as for an RC QP), and the requester's Send completes with Success
/// instead of timing out into Transport Retry Counter Exceeded.
/// Rule PKT-ACK-13
#[test]
fn acks_an_eec_owes_at_a_move_to_error_still_leave() {
    let mut f = fabric(SimConfig::default().seed(5));
    let (a, b) = (node(&mut f, "rd-ack-a"), node(&mut f, "rd-ack-b"));
    let (ea, eb) = channel(&a, &b, Mtu::Mtu1024, 1);
    let (qa, qb) = (rd_qp(&a, &a.rdd), rd_qp(&b, &b.rdd));
    qb.post_recv(&[RecvWr::new(1, &[b.mr.sge(0..64)])]).unwrap();
    qa.post_send(&[SendWr::send(7, &[a.mr.sge(0..64)]).rd(&ea, qb.qp_num(), QKEY).signaled()]).unwrap();
    // Step until b's application sees the Send arrive: its ACK is queued, not yet sent.
    let mut got = Vec::new();
    while got.is_empty() {
        assert!(f.step(), "the Send never arrived");
        got = poll_all(&b.cq);
    }
    eb.modify(&EecAttr::new(QpState::Error)).unwrap();
    let mut done = Vec::new();
    wait_for(&mut f, &a.cq, &mut done, 1);
    assert_eq!((done[0].wr_id, done[0].status), (7, WcStatus::Success), "{done:?}");
}

/// After an EEC's ACK timeout the go-back starts with a probe, as on an RC QP: the message's
/// oldest unacknowledged packet alone; the responder, which had the whole message, answers the
/// duplicate with an ACK of all of it, and nothing more is resent.
/// Rule PKT-RTY-1, PKT-DUP-1
#[test]
fn an_eec_timeout_probes_before_resending_the_message() {
    let mut f = fabric(SimConfig::default().seed(21));
    let (a, b) = (node(&mut f, "rd21-a"), node(&mut f, "rd21-b"));
    let (ea, _eb) = channel(&a, &b, Mtu::Mtu1024, 7);
    let (qa, qb) = (rd_qp(&a, &a.rdd), rd_qp(&b, &b.rdd));
    let a_id = DeviceId(0);
    let from_a = Rc::new(RefCell::new(Vec::new()));
    let seen = from_a.clone();
    // Every response is lost until the requester has sent the 8 packets and one more.
    f.set_filter(move |ctx: &FilterCtx, d: &mut Vec<u8>| {
        if ctx.from == Some(a_id) {
            seen.borrow_mut().push(roce::parse_ip(d).map(|p| (p.packet.bth.psn.value(), p.packet.bth.ack_req)).ok());
            return Verdict::Pass;
        }
        if seen.borrow().len() < 9 {
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    });
    qb.post_recv(&[RecvWr::new(5, &[b.mr.sge(0..8192)])]).unwrap();
    a.mr.write(0, &[7u8; 8192]).unwrap();
    let sge = [a.mr.sge(0..8192)];
    qa.post_send(&[SendWr::send(1, &sge).rd(&ea, qb.qp_num(), QKEY).signaled()]).unwrap();
    let mut got = Vec::new();
    wait_for(&mut f, &a.cq, &mut got, 1);
    assert_eq!(got[0].status, WcStatus::Success);
    let sent = from_a.borrow().clone();
    let psns: Vec<u32> = sent.iter().map(|s| s.expect("an RD packet").0).collect();
    assert_eq!(psns, [(0x100..0x108).collect::<Vec<u32>>(), vec![0x100]].concat(), "the 8 packets, then the probe");
    assert!(sent[8].expect("the probe").1, "the probe asks for an ACK");
    let r = poll_all(&b.cq);
    assert_eq!((r[0].wr_id, r[0].byte_len, r[0].status), (5, 8192, WcStatus::Success));
}

/// An RD QP whose own outbound depth is 0 (its RTR→RTS `max_rd_atomic`) may start no RDMA
/// Read, whatever its EEC's depth: the Read fails with Local QP Operation Error before
/// anything is sent, as one on an EEC of depth 0 does. Before, only the EEC's was looked at.
/// Rule WR-READ-3, MOD-RTR-RTS-RD-1
#[test]
fn an_rd_qp_of_outbound_depth_zero_starts_no_read() {
    let mut f = fabric(SimConfig::default().seed(205));
    let (a, b) = (node(&mut f, "rdz-a"), node(&mut f, "rdz-b"));
    let (ea, _eb) = channel(&a, &b, Mtu::Mtu1024, 7);
    let qb = rd_qp(&b, &b.rdd);
    let qa = rd_qp_on(&a, &a.cq, Some(0));
    let s = [a.mr.sge(0..64)];
    qa.post_send(&[SendWr::rdma_read(1, &s, b.mr.addr(), b.mr.rkey()).rd(&ea, qb.qp_num(), QKEY).signaled()]).unwrap();
    let mut got = Vec::new();
    wait_for(&mut f, &a.cq, &mut got, 1);
    assert_eq!((got[0].wr_id, got[0].status), (1, WcStatus::LocQpOpErr));
}

/// The first valid packet reaching an RD QP in RTR raises Communication Established on it,
/// once, and the QP stays in RTR and takes the message, as an RC QP does. Before, RD's
/// receive path raised nothing.
/// Rule EVT-CE-1
#[test]
fn an_rd_qp_in_rtr_raises_communication_established() {
    let mut f = fabric(SimConfig::default().seed(206));
    let (a, b) = (node(&mut f, "rdce-a"), node(&mut f, "rdce-b"));
    let (ea, _eb) = channel(&a, &b, Mtu::Mtu1024, 7);
    let qa = rd_qp(&a, &a.rdd);
    let qb = rd_qp_on(&b, &b.cq, None);
    qb.post_recv(&[RecvWr::new(1, &[b.mr.sge(0..64)]), RecvWr::new(2, &[b.mr.sge(64..128)])]).unwrap();
    let s = [a.mr.sge(0..8)];
    let send = |id| SendWr::send(id, &s).rd(&ea, qb.qp_num(), QKEY).signaled();
    qa.post_send(&[send(1), send(2)]).unwrap();
    let mut got = Vec::new();
    wait_for(&mut f, &b.cq, &mut got, 2);
    let events: Vec<AsyncEvent> = std::iter::from_fn(|| b.ctx.get_async_event()).collect();
    let ce = AsyncEvent { event_type: AsyncEventType::CommEst, element: EventElement::Qp(qb.qp_num()) };
    assert_eq!(events, vec![ce]);
    assert_eq!(qb.query().unwrap().qp_state, QpState::Rtr);
}

/// A receive WQE an EEC held for a message it can no longer finish (the EEC moved to Error
/// midway) is flushed; when its receive CQ is full that CQE is refused, and the QP moves to
/// Error as for any receive completion that overflows its CQ. Before, the QP stayed in RTS with
/// the CQE lost.
/// Rule ERR-RQ-15, CQ-OVF-2
#[test]
fn a_held_receive_flushed_into_a_full_cq_moves_its_qp_to_error() {
    let mut f = fabric(SimConfig::default().seed(207));
    let (a, b) = (node(&mut f, "rdh-a"), node(&mut f, "rdh-b"));
    let (ea, eb) = channel(&a, &b, Mtu::Mtu1024, 7);
    let qa = rd_qp(&a, &a.rdd);
    let small = b.ctx.create_cq(1).unwrap();
    let qb = rd_qp_on(&b, &small, Some(4));
    qb.post_recv(&[RecvWr::new(1, &[b.mr.sge(0..64)]), RecvWr::new(2, &[b.mr.sge(4096..8192)])]).unwrap();
    // The first Send fills B's CQ (left unpolled).
    let one = [a.mr.sge(0..8)];
    qa.post_send(&[SendWr::send(1, &one).rd(&ea, qb.qp_num(), QKEY).signaled()]).unwrap();
    let mut got = Vec::new();
    wait_for(&mut f, &a.cq, &mut got, 1);
    // The second, three packets, stops after its first: B's EEC holds receive 2 for it.
    let firsts = Rc::new(std::cell::Cell::new(0));
    let n = firsts.clone();
    f.set_filter(move |ctx: &FilterCtx, p: &mut Vec<u8>| {
        if ctx.from == Some(DeviceId(0)) && matches!(opcode_of(p), Some(0x41 | 0x42)) {
            n.set(n.get() + 1);
            return Verdict::Drop; // the Middle and Last
        }
        Verdict::Pass
    });
    let three = [a.mr.sge(0..3000)];
    qa.post_send(&[SendWr::send(2, &three).rd(&ea, qb.qp_num(), QKEY)]).unwrap();
    f.run_until_within(1_000_000, |_| firsts.get() > 0);
    eb.modify(&EecAttr::new(QpState::Error)).unwrap();
    f.run_until_within(10_000_000, |_| qb.query().unwrap().qp_state == QpState::Error);
    assert_eq!(qb.query().unwrap().qp_state, QpState::Error);
    assert!(small.overflowed().unwrap());
}

/// A PSN Sequence Error NAK that also acknowledges packets of the message reloads the EEC's
/// Retry Count before it costs its retry, as on an RC QP: with a Retry Count of 1, a lost
/// second packet resent once and lost again ends the Send in Retry Counter Exceeded. Before,
/// the reload came after the charge and refunded it, allowing a third try.
/// Rule PKT-RTY-3, PKT-RTY-5, PKT-RTY-7, PKT-NAK-3
#[test]
fn an_rd_sequence_error_that_acknowledges_costs_its_retry() {
    let mut f = fabric(SimConfig::default().seed(208));
    let (a, b) = (node(&mut f, "rdq-a"), node(&mut f, "rdq-b"));
    let (ea, _eb) = channel(&a, &b, Mtu::Mtu1024, 1);
    let (qa, qb) = (rd_qp(&a, &a.rdd), rd_qp(&b, &b.rdd));
    qb.post_recv(&[RecvWr::new(1, &[b.mr.sge(0..4096)])]).unwrap();
    let lost = Rc::new(std::cell::Cell::new(0));
    let l = lost.clone();
    f.set_filter(move |ctx: &FilterCtx, p: &mut Vec<u8>| {
        let psn = roce::parse_ip(p).ok().map(|x| x.packet.bth.psn.value());
        if ctx.from == Some(DeviceId(0)) && psn == Some(0x101) && l.get() < 2 {
            l.set(l.get() + 1);
            return Verdict::Drop; // the second packet, twice
        }
        Verdict::Pass
    });
    let s = [a.mr.sge(0..3000)];
    qa.post_send(&[SendWr::send(1, &s).rd(&ea, qb.qp_num(), QKEY).signaled()]).unwrap();
    let mut got = Vec::new();
    wait_for(&mut f, &a.cq, &mut got, 1);
    assert_eq!(lost.get(), 2);
    assert_eq!(got[0].status, WcStatus::RetryExcErr);
}

/// Retry Count set on an EEC at SQD → RTS holds from the first request after it: one
/// retransmission where the channel came up with seven. Before, the new count held only after
/// the next acknowledgement.
/// Rule MOD-SQD-RTS-2, PKT-RTY-7
#[test]
fn an_eec_retry_count_set_out_of_sqd_takes_effect() {
    let mut f = fabric(SimConfig::default().seed(209));
    let (a, b) = (node(&mut f, "rds-a"), node(&mut f, "rds-b"));
    let (ea, _eb) = channel(&a, &b, Mtu::Mtu1024, 7);
    let (qa, qb) = (rd_qp(&a, &a.rdd), rd_qp(&b, &b.rdd));
    ea.modify(&EecAttr::new(QpState::Sqd)).unwrap();
    f.run_until_within(1_000_000, |_| false);
    ea.modify(&EecAttr::new(QpState::Rts).retry_cnt(1)).unwrap();
    let sends = Rc::new(std::cell::Cell::new(0));
    let n = sends.clone();
    f.set_filter(move |ctx: &FilterCtx, p: &mut Vec<u8>| {
        if ctx.from == Some(DeviceId(0)) {
            n.set(n.get() + usize::from(opcode_of(p) == Some(0x44)));
            return Verdict::Pass;
        }
        Verdict::Drop // b's answers are lost
    });
    qb.post_recv(&[RecvWr::new(1, &[b.mr.sge(0..64)])]).unwrap();
    let s = [a.mr.sge(0..8)];
    qa.post_send(&[SendWr::send(1, &s).rd(&ea, qb.qp_num(), QKEY).signaled()]).unwrap();
    let mut got = Vec::new();
    wait_for(&mut f, &a.cq, &mut got, 1);
    assert_eq!(got[0].status, WcStatus::RetryExcErr);
    assert_eq!(sends.get(), 2, "the Send and one retransmission");
}
