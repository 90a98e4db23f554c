//! Fixtures for the UDP link tests: one RC endpoint on a real [`UdpDevice`].
#![allow(dead_code)]

use std::time::{Duration, Instant};

use softhca::link::udp::{UdpConfig, UdpDevice};
use softhca::*;

pub struct End {
    pub pd: Pd,
    pub cq: Cq,
    pub qp: Qp,
    // Last: the device (and its engine) goes after the QP and CQ that use it.
    pub dev: UdpDevice,
}

pub fn end(cfg: UdpConfig) -> End {
    let dev = UdpDevice::open(cfg).expect("open udp device");
    let ctx = dev.context().clone();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4096).unwrap();
    let qp = pd
        .create_qp(&QpInitAttr::rc(&cq, &cq).max_send_wr(1024).max_recv_wr(1024).max_send_sge(4).max_recv_sge(4))
        .unwrap();
    End { pd, cq, qp, dev }
}

/// Brings `qp` to RTS toward (`gid`, `qpn`).
pub fn connect(qp: &Qp, gid: Gid, qpn: u32, mtu: Mtu) {
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let av = AddressVector::new(AhAttr::roce(gid, 0), mtu);
    qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(all)).unwrap();
    qp.modify(&QpAttr::to_rtr(av, qpn).rq_psn(0).max_dest_rd_atomic(16).min_rnr_timer(1)).unwrap();
    qp.modify(&QpAttr::to_rts().sq_psn(0).timeout(14).retry_cnt(7).rnr_retry(7).max_rd_atomic(16)).unwrap();
}

/// Polls `cq` until `n` completions arrived; panics after `secs` seconds.
pub fn wait(cq: &Cq, n: usize, secs: u64) -> Vec<Wc> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut out = Vec::new();
    let mut wcs = [Wc::default(); 64];
    while out.len() < n {
        let k = cq.poll(&mut wcs).unwrap();
        out.extend_from_slice(&wcs[..k]);
        if k == 0 {
            assert!(Instant::now() < deadline, "timed out waiting for {n} completions, got {out:?}");
            std::thread::yield_now();
        }
    }
    out
}
/// Singles and GSO runs both ways on one RC QP pair: Sends, a Write and a Read of 200 KB
/// (GSO on the requester's flow, then on the responder's), atomics.
pub fn traffic(a: &End, b: &End) {
    connect(&a.qp, b.dev.gid(), b.qp.qp_num(), Mtu::Mtu4096);
    connect(&b.qp, a.dev.gid(), a.qp.qp_num(), Mtu::Mtu4096);
    traffic_connected(a, b);
}

/// [`traffic`] on a pair already connected to each other.
pub fn traffic_connected(a: &End, b: &End) {
    let n = 200_000usize;
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let src = a.pd.reg_mr((0..n).map(|i| (i * 13) as u8).collect(), all).unwrap();
    let dst = b.pd.alloc_mr(n, all).unwrap();
    let (rsge, ssge) = ([dst.sge(0..64)], [src.sge(0..8)]);
    for round in 0..3u64 {
        b.qp.post_recv(&(0..20).map(|i| RecvWr::new(i, &rsge)).collect::<Vec<_>>()).unwrap();
        a.qp.post_send(&(0..20).map(|i| SendWr::send(i, &ssge).signaled()).collect::<Vec<_>>()).unwrap();
        wait(&a.cq, 20, 10);
        wait(&b.cq, 20, 10);
        a.qp.post_send(&[SendWr::rdma_write(100 + round, &[src.sge(0..n)], dst.addr(), dst.rkey()).signaled()])
            .unwrap();
        wait(&a.cq, 1, 10);
        let back = a.pd.alloc_mr(n, Access::LOCAL_WRITE).unwrap();
        a.qp.post_send(&[SendWr::rdma_read(200 + round, &[back.sge(0..n)], dst.addr(), dst.rkey()).signaled()])
            .unwrap();
        let w = wait(&a.cq, 1, 10);
        assert_eq!(w[0].status, WcStatus::Success, "{w:?}");
        assert_eq!(back.to_vec().unwrap(), src.to_vec().unwrap());
        a.qp.post_send(&[
            SendWr::atomic_fetch_add(300 + round, &[back.sge(0..8)], dst.addr(), dst.rkey(), 1).signaled()
        ])
        .unwrap();
        assert_eq!(wait(&a.cq, 1, 10)[0].status, WcStatus::Success);
    }
}

/// One UC endpoint on a real [`UdpDevice`] (the device last, as in [`End`]).
pub struct UcEnd {
    pub pd: Pd,
    pub cq: Cq,
    pub qp: Qp,
    pub dev: UdpDevice,
}

pub fn uc_end(cfg: UdpConfig) -> UcEnd {
    let dev = UdpDevice::open(cfg).expect("open udp device");
    let ctx = dev.context().clone();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4096).unwrap();
    let qp = pd.create_qp(&QpInitAttr::uc(&cq, &cq).max_send_wr(64).max_recv_wr(64)).unwrap();
    UcEnd { pd, cq, qp, dev }
}

/// Brings a UC `qp` (from any state, through Reset) to RTS toward (`gid`, `qpn`).
pub fn uc_connect(qp: &Qp, gid: Gid, qpn: u32) {
    qp.modify(&QpAttr::to_reset()).unwrap();
    let av = AddressVector::new(AhAttr::roce(gid, 0), Mtu::Mtu1024);
    qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(Access::LOCAL_WRITE | Access::REMOTE_WRITE)).unwrap();
    qp.modify(&QpAttr::to_rtr(av, qpn).rq_psn(0)).unwrap();
    qp.modify(&QpAttr::to_rts().sq_psn(0)).unwrap();
}

/// Connects `a` to `b` as a requester with a short ACK timeout and one retry (a lost ACK
/// fails its Send within about half a second) and `b` back to `a`, and posts one Receive on
/// `b`. Short, not shortest: timeout 12 (16.8 ms, two tries in 34 ms) was within what a
/// loaded 2-core machine can take from a thread between a completion and the ACK's send;
/// 16 (268 ms) is not, and still fails a lost ACK well inside the tests' waits.
pub fn impatient_pair(a: &End, b: &End) -> Mr {
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let av = AddressVector::new(AhAttr::roce(b.dev.gid(), 0), Mtu::Mtu1024);
    a.qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(all)).unwrap();
    a.qp.modify(&QpAttr::to_rtr(av, b.qp.qp_num()).rq_psn(0).max_dest_rd_atomic(1)).unwrap();
    a.qp.modify(&QpAttr::to_rts().sq_psn(0).timeout(16).retry_cnt(1).rnr_retry(0).max_rd_atomic(1)).unwrap();
    connect(&b.qp, a.dev.gid(), a.qp.qp_num(), Mtu::Mtu1024);
    let rmr = b.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    b.qp.post_recv(&[RecvWr::new(1, &[rmr.sge(0..64)])]).unwrap();
    rmr
}

pub mod netns;
pub mod plain;
pub mod procs;
