//! A fast-registration region's key over the UDP link: valid after a Fast Register, used by
//! the peer's RDMA Write, invalidated by the peer's Send with Invalidate, refused after.

mod udp_common;

use std::net::{IpAddr, Ipv4Addr};

use softhca::link::udp::UdpConfig;
use softhca::*;
use udp_common::{connect, end, wait};

#[test]
fn a_region_key_is_registered_used_and_invalidated_over_udp() {
    let at = |last| IpAddr::V4(Ipv4Addr::new(127, 24, 0, last));
    let (a, b) = (end(UdpConfig::default().addr(at(1))), end(UdpConfig::default().addr(at(2))));
    connect(&a.qp, b.dev.gid(), b.qp.qp_num(), Mtu::Mtu1024);
    connect(&b.qp, a.dev.gid(), a.qp.qp_num(), Mtu::Mtu1024);
    let mr = b.pd.alloc_fast_reg_mr(vec![0; 4096]).unwrap();
    let byte = (mr.rkey() as u8).wrapping_add(5);
    b.qp.post_send(&[SendWr::fast_reg(1, &mr, Access::LOCAL_WRITE | Access::REMOTE_WRITE, byte).signaled()]).unwrap();
    let w = wait(&b.cq, 1, 30);
    assert_eq!((w[0].status, w[0].opcode), (WcStatus::Success, WcOpcode::FastReg));
    let rkey = mr.rkey();
    let src = a.pd.reg_mr(vec![0x3C; 512], Access::LOCAL_WRITE).unwrap();
    a.qp.post_send(&[SendWr::rdma_write(2, &[src.sge(0..512)], mr.addr(), rkey).signaled()]).unwrap();
    assert_eq!(wait(&a.cq, 1, 30)[0].status, WcStatus::Success);
    assert!(mr.to_vec().unwrap()[..512].iter().all(|x| *x == 0x3C));
    let land = b.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    b.qp.post_recv(&[RecvWr::new(3, &[land.sge(0..64)])]).unwrap();
    a.qp.post_send(&[SendWr::send_with_inv(4, &[src.sge(0..8)], rkey).signaled()]).unwrap();
    assert_eq!(wait(&a.cq, 1, 30)[0].status, WcStatus::Success);
    let got = wait(&b.cq, 1, 30);
    assert!(got[0].wc_flags.contains(WcFlags::WITH_INV) && got[0].imm_data == rkey, "{got:?}");
    a.qp.post_send(&[SendWr::rdma_write(5, &[src.sge(0..512)], mr.addr(), rkey).signaled()]).unwrap();
    assert_eq!(wait(&a.cq, 1, 30)[0].status, WcStatus::RemAccessErr);
}
