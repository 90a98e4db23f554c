//! The UDP link's engine: work a doorbell or an inline turn leaves behind wakes the sleeping
//! engine thread (from a review).

mod udp_common;

use softhca::link::udp::{UdpConfig, UdpDevice};
use softhca::*;
use std::time::Instant;
use udp_common::*;

struct Uc {
    pd: Pd,
    cq: Cq,
    qp: Qp,
    dev: UdpDevice,
}

fn uc_end(cfg: UdpConfig) -> Uc {
    let dev = UdpDevice::open(cfg).unwrap();
    let ctx = dev.context().clone();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4096).unwrap();
    let qp = pd.create_qp(&QpInitAttr::uc(&cq, &cq).max_send_wr(64).max_recv_wr(64)).unwrap();
    Uc { pd, cq, qp, dev }
}

fn uc_connect(qp: &Qp, gid: Gid, qpn: u32) {
    let av = AddressVector::new(AhAttr::roce(gid, 0), Mtu::Mtu1024);
    qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(Access::LOCAL_WRITE | Access::REMOTE_WRITE)).unwrap();
    qp.modify(&QpAttr::to_rtr(av, qpn).rq_psn(0)).unwrap();
    qp.modify(&QpAttr::to_rts().sq_psn(0)).unwrap();
}

/// Blocking mode: a post whose message is more than one flush sends (256 datagrams), rung
/// while the engine thread sleeps in ppoll: the doorbell sends what it can and wakes the
/// engine for the rest, rather than leaving it for the 50 ms idle wake.
#[test]
fn doorbell_leaves_tx_beyond_four_batches_until_idle_wake() {
    let a = uc_end(UdpConfig::default());
    let b = uc_end(UdpConfig::default());
    uc_connect(&a.qp, b.dev.gid(), b.qp.qp_num());
    uc_connect(&b.qp, a.dev.gid(), a.qp.qp_num());
    let n = 1 << 20; // 1024 datagrams at MTU 1024
    let src = a.pd.alloc_mr(n, Access::LOCAL_WRITE).unwrap();
    let dst = b.pd.alloc_mr(n, Access::LOCAL_WRITE).unwrap();
    b.qp.post_recv(&[RecvWr::new(1, &[dst.sge(0..n)])]).unwrap();
    // Wait (a condition, not a sleep) until A's engine has just gone to sleep in ppoll.
    let s0 = a.dev.counters().sleeps;
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    while a.dev.counters().sleeps == s0 {
        assert!(Instant::now() < deadline, "the engine never slept");
        std::thread::yield_now();
    }
    let before = a.dev.counters();
    a.qp.post_send(&[SendWr::send(1, &[src.sge(0..n)]).signaled()]).unwrap();
    let after = a.dev.counters();
    let sent = after.tx_datagrams - before.tx_datagrams;
    let woke = after.doorbells - before.doorbells;
    assert!(
        sent == 1024 || woke > 0,
        "post left {} of 1024 datagrams queued with the engine asleep and no wake-up ({after:?})",
        1024 - sent
    );
    assert_eq!(wait(&b.cq, 1, 10)[0].status, WcStatus::Success);
}
