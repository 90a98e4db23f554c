//! Two UDP devices in one process on 127.0.0.x: RC Send/Receive, RDMA Write, RDMA Read and
//! both atomics over real sockets, in blocking and busy-poll mode.

mod udp_common;

use softhca::link::udp::{RxMode, UdpConfig};
use softhca::*;
use udp_common::*;

fn round_trip(cfg: impl Fn() -> UdpConfig, mtu: Mtu) {
    let a = end(cfg());
    let b = end(cfg());
    assert_ne!(a.dev.addr(), b.dev.addr());
    assert_eq!(a.dev.context().query_gid(1, 0).unwrap(), a.dev.gid());
    connect(&a.qp, b.dev.gid(), b.qp.qp_num(), mtu);
    connect(&b.qp, a.dev.gid(), a.qp.qp_num(), mtu);

    let n = 100_000usize;
    let src = a.pd.reg_mr((0..n).map(|i| (i * 7) as u8).collect(), Access::LOCAL_WRITE).unwrap();
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let dst = b.pd.alloc_mr(n, all).unwrap();

    // Send with immediate into a posted receive.
    b.qp.post_recv(&[RecvWr::new(7, &[dst.sge(0..n)])]).unwrap();
    a.qp.post_send(&[SendWr::send(1, &[src.sge(0..30_000)]).signaled().imm(0xabcd)]).unwrap();
    let wa = wait(&a.cq, 1, 10);
    let wb = wait(&b.cq, 1, 10);
    assert_eq!(wa[0].status, WcStatus::Success, "{wa:?}");
    assert_eq!((wb[0].status, wb[0].byte_len, wb[0].imm()), (WcStatus::Success, 30_000, Some(0xabcd)));
    assert_eq!(dst.to_vec().unwrap()[..30_000], src.to_vec().unwrap()[..30_000]);

    // RDMA Write the whole buffer, then read it back.
    a.qp.post_send(&[SendWr::rdma_write(2, &[src.sge(0..n)], dst.addr(), dst.rkey()).signaled()]).unwrap();
    assert_eq!(wait(&a.cq, 1, 10)[0].status, WcStatus::Success);
    assert_eq!(dst.to_vec().unwrap(), src.to_vec().unwrap());
    let back = a.pd.alloc_mr(n, Access::LOCAL_WRITE).unwrap();
    a.qp.post_send(&[SendWr::rdma_read(3, &[back.sge(0..n)], dst.addr(), dst.rkey()).signaled()]).unwrap();
    let w = wait(&a.cq, 1, 10);
    assert_eq!((w[0].status, w[0].opcode, w[0].byte_len), (WcStatus::Success, WcOpcode::RdmaRead, n as u32));
    assert_eq!(back.to_vec().unwrap(), src.to_vec().unwrap());

    // Atomics on dst[8..16].
    dst.write(8, &40u64.to_ne_bytes()).unwrap();
    let res = a.pd.alloc_mr(16, Access::LOCAL_WRITE).unwrap();
    a.qp.post_send(&[
        SendWr::atomic_fetch_add(4, &[res.sge(0..8)], dst.addr() + 8, dst.rkey(), 2).signaled(),
        SendWr::atomic_cmp_swp(5, &[res.sge(8..16)], dst.addr() + 8, dst.rkey(), 42, 7).signaled(),
    ])
    .unwrap();
    let w = wait(&a.cq, 2, 10);
    assert!(w.iter().all(|w| w.status == WcStatus::Success), "{w:?}");
    let mut r = [0u8; 16];
    res.read(0, &mut r).unwrap();
    assert_eq!(u64::from_ne_bytes(r[..8].try_into().unwrap()), 40);
    assert_eq!(u64::from_ne_bytes(r[8..].try_into().unwrap()), 42);
    let mut v = [0u8; 8];
    dst.read(8, &mut v).unwrap();
    assert_eq!(u64::from_ne_bytes(v), 7);

    // Nothing was dropped on the way.
    for d in [&a.dev, &b.dev] {
        let c = d.counters();
        assert_eq!((c.drop_bad_icrc, c.drop_malformed, c.tx_errors), (0, 0, 0), "{c:?}");
        assert!(c.rx_datagrams > 0 && c.tx_datagrams > 0, "{c:?}");
        assert_eq!(d.context().counters().rx_bad_icrc, 0);
    }
}

#[test]
fn rc_round_trip_blocking() {
    round_trip(UdpConfig::default, Mtu::Mtu4096);
}

#[test]
fn rc_round_trip_busy_poll_mtu1024() {
    round_trip(|| UdpConfig::default().busy_poll(true), Mtu::Mtu1024);
}

#[test]
fn rc_round_trip_without_offloads() {
    round_trip(|| UdpConfig::default().gso(false).gro(false), Mtu::Mtu4096);
}

/// The privileged receive path (raw socket, exact IPv4 ICRC). Skips when raw sockets are
/// refused (not root / no CAP_NET_RAW).
#[test]
fn rc_round_trip_raw_rx() {
    if let Err(e) = softhca::link::udp::UdpDevice::open(UdpConfig::default().rx_mode(RxMode::Raw)) {
        eprintln!("SKIP rc_round_trip_raw_rx: raw sockets refused here ({e})");
        return;
    }
    round_trip(|| UdpConfig::default().rx_mode(RxMode::Raw), Mtu::Mtu4096);
}
