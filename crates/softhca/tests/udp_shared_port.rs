//! Many flows on the UDP link: the first `MAX_PORT_SOCKETS` QPs send from sockets of their own
//! (a source port each), the others share the device's 4791 socket, their datagrams re-sealed
//! for that port and sent together whichever QP they come from. Every message arrives, every
//! ICRC checks at the receiver, in both directions (Sends, and Writes of several packets).

mod udp_common;

use softhca::link::udp::{UdpConfig, MAX_PORT_SOCKETS};
use softhca::*;
use udp_common::*;

/// Rule PKT-ROCE-6 (a receiver accepts any UDP source port)
#[test]
fn flows_beyond_the_flow_sockets_share_port_4791() {
    let (a, b) = (end(UdpConfig::default()), end(UdpConfig::default()));
    let n = MAX_PORT_SOCKETS + 24;
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let mk = |pd: &Pd, cq: &Cq| {
        pd.create_qp(&QpInitAttr::rc(cq, cq).max_send_wr(64).max_recv_wr(64).max_send_sge(1).max_recv_sge(1)).unwrap()
    };
    let qa: Vec<Qp> = (0..n).map(|_| mk(&a.pd, &a.cq)).collect();
    let qb: Vec<Qp> = (0..n).map(|_| mk(&b.pd, &b.cq)).collect();
    for (x, y) in qa.iter().zip(&qb) {
        connect(x, b.dev.gid(), y.qp_num(), Mtu::Mtu1024);
        connect(y, a.dev.gid(), x.qp_num(), Mtu::Mtu1024);
    }
    let src = a.pd.reg_mr((0..n * 4096).map(|i| (i * 7) as u8).collect(), all).unwrap();
    let dst = b.pd.alloc_mr(n * 4096, all).unwrap();
    let rbuf = b.pd.alloc_mr(n * 64, all).unwrap();
    for (i, y) in qb.iter().enumerate() {
        y.post_recv(&[RecvWr::new(i as u64, &[rbuf.sge(i * 64..(i + 1) * 64)])]).unwrap();
    }
    // On every QP at once: a Send, and a 4 KiB Write (four 1 KiB packets).
    for (i, x) in qa.iter().enumerate() {
        let ssge = [src.sge(i * 4096..i * 4096 + 64)];
        let wsge = [src.sge(i * 4096..(i + 1) * 4096)];
        x.post_send(&[
            SendWr::send(i as u64, &ssge).signaled(),
            SendWr::rdma_write(1000 + i as u64, &wsge, dst.addr() + (i * 4096) as u64, dst.rkey()).signaled(),
        ])
        .unwrap();
    }
    let wa = wait(&a.cq, 2 * n, 30);
    assert!(wa.iter().all(|w| w.status == WcStatus::Success), "{wa:?}");
    let wb = wait(&b.cq, n, 30);
    assert!(wb.iter().all(|w| w.status == WcStatus::Success), "{wb:?}");
    assert_eq!(dst.to_vec().unwrap(), src.to_vec().unwrap());
    let (ca, cb) = (a.dev.counters(), b.dev.counters());
    // The flows beyond the first few went out from 4791 (both ways: requests and ACKs), and
    // nothing failed a check at either end.
    assert!(ca.tx_port_fallback > 0 && cb.tx_port_fallback > 0, "{ca:?} {cb:?}");
    assert_eq!((ca.drop_bad_icrc, cb.drop_bad_icrc, ca.tx_errors, cb.tx_errors), (0, 0, 0, 0), "{ca:?} {cb:?}");
    drop((qa, qb)); // the QPs go before the devices
}
