//! The Reliable Datagram service on the sim fabric: EECs, RD QPs, one message at a time per
//! QP, receive WQEs bound per channel and completed out of post order, the EEC states seen
//! from a posting QP, retry exhaustion, RDD and Q_Key checks, and a lossy mixed workload.

use std::cell::RefCell;
use std::rc::Rc;

use softhca::link::{FilterCtx, LinkConfig, SimConfig, SimFabric, Verdict};
use softhca::wire::roce;
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
    let w: Vec<SendWr> = sges.iter().take(2).enumerate().map(|(i, s)| SendWr::rdma_write(10 + i as u64, s, b.mr.addr(), b.mr.rkey()).signaled()).collect();
    ra.post_send(&w).unwrap();
    let mut rc_done = Vec::new();
    wait_for(&mut f, &a.cq, &mut rc_done, 2);
    let log = before.borrow();
    let second_first = log.iter().position(|s| s.from == 0 && s.psn == 4).expect("second RC message");
    let first_ack = log.iter().position(|s| s.from == 1).expect("an ACK");
    assert!(second_first < first_ack, "RC pipelines its messages");
}
