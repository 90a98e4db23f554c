//! The RD service over real UDP sockets: two devices in one process, an EEC each, Send,
//! RDMA Write, RDMA Read and Fetch & Add through the channel, blocking and busy-poll. The link
//! knows nothing of RD: RDETH and DETH are just more transport headers under the ICRC.

mod udp_common;

use softhca::link::udp::{UdpConfig, UdpDevice};
use softhca::*;
use udp_common::wait;

const QKEY: u32 = 0x0bad_cafe;

struct RdEnd {
    pd: Pd,
    cq: Cq,
    rdd: Rdd,
    qp: Qp,
    eec: Eec,
    dev: UdpDevice,
}

fn rd_end(cfg: UdpConfig) -> RdEnd {
    let dev = UdpDevice::open(cfg).expect("open udp device");
    let ctx = dev.context().clone();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(1024).unwrap();
    let rdd = ctx.alloc_rdd().unwrap();
    let qp = pd.create_qp(&QpInitAttr::rd(&cq, &cq, &rdd)).unwrap();
    let all = Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    qp.modify(&QpAttr::to_init().access(all).qkey(QKEY)).unwrap();
    qp.modify(&QpAttr::new(QpState::Rtr).max_dest_rd_atomic(4).min_rnr_timer(1)).unwrap();
    qp.modify(&QpAttr::to_rts().max_rd_atomic(4)).unwrap();
    let eec = ctx.create_eec(&rdd).unwrap();
    RdEnd { pd, cq, rdd, qp, eec, dev }
}

fn link(e: &RdEnd, remote: &RdEnd) {
    e.eec.modify(&EecAttr::new(QpState::Init).pkey_index(0).port_num(1)).unwrap();
    let av = AddressVector::new(AhAttr::roce(remote.dev.gid(), 0), Mtu::Mtu1024);
    e.eec
        .modify(&EecAttr::new(QpState::Rtr).av(av).dest_eecn(remote.eec.eecn()).rq_psn(7).max_dest_rd_atomic(4))
        .unwrap();
    e.eec.modify(&EecAttr::new(QpState::Rts).sq_psn(7).timeout(14).retry_cnt(7).rnr_retry(7).max_rd_atomic(4)).unwrap();
}

fn rd_round_trip(cfg: impl Fn() -> UdpConfig) {
    let (a, b) = (rd_end(cfg()), rd_end(cfg()));
    link(&a, &b);
    link(&b, &a);
    let n = 50_000usize;
    let src = a.pd.reg_mr((0..n).map(|i| (i * 3) as u8).collect(), Access::LOCAL_WRITE).unwrap();
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let dst = b.pd.alloc_mr(2 * n, all).unwrap();
    let back = a.pd.alloc_mr(n + 8, Access::LOCAL_WRITE).unwrap();
    b.qp.post_recv(&[RecvWr::new(9, &[dst.sge(0..n)])]).unwrap();
    let sg = [src.sge(0..n)];
    let rd = [back.sge(0..n)];
    let fa = [back.sge(n..n + 8)];
    let (eec, qpn) = (&a.eec, b.qp.qp_num());
    a.qp.post_send(&[
        SendWr::send(1, &sg).imm(0x55).rd(eec, qpn, QKEY).signaled(),
        SendWr::rdma_write(2, &sg, dst.addr() + n as u64, dst.rkey()).rd(eec, qpn, QKEY).signaled(),
        SendWr::rdma_read(3, &rd, dst.addr() + n as u64, dst.rkey()).rd(eec, qpn, QKEY).signaled(),
        SendWr::atomic_fetch_add(4, &fa, dst.addr(), dst.rkey(), 1).rd(eec, qpn, QKEY).signaled(),
    ])
    .unwrap();
    let wa = wait(&a.cq, 4, 20);
    assert_eq!(
        wa.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        (1..=4).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
    let wb = wait(&b.cq, 1, 20);
    assert_eq!((wb[0].wr_id, wb[0].byte_len, wb[0].imm(), wb[0].src_qp), (9, n as u32, Some(0x55), a.qp.qp_num()));
    assert_eq!(wb[0].eecn, b.eec.eecn());
    let d = dst.to_vec().unwrap();
    let s = src.to_vec().unwrap();
    assert_eq!(d[n..], s[..]);
    assert_eq!(back.to_vec().unwrap()[..n], s[..]);
    let first8 = u64::from_ne_bytes(s[..8].try_into().unwrap());
    assert_eq!(u64::from_ne_bytes(back.to_vec().unwrap()[n..].try_into().unwrap()), first8, "fetch-add's old value");
    for e in [&a, &b] {
        let c = e.dev.counters();
        assert_eq!((c.drop_bad_icrc, c.drop_malformed, c.tx_errors), (0, 0, 0), "{c:?}");
        let _ = (&e.rdd, &e.eec);
    }
}

/// Rule WR-SEND-6
#[test]
fn rd_round_trip_blocking() {
    rd_round_trip(UdpConfig::default);
}

#[test]
fn rd_round_trip_busy_poll() {
    rd_round_trip(|| UdpConfig::default().busy_poll(true));
}
