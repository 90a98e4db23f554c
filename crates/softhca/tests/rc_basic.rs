//! RC operations end to end over a lossless in-process link.

mod common;

use common::pair::*;
use common::poll_all;
use softhca::*;

/// Rule QPS-RTS-2, WR-ATOM-4, WR-ATOM-5, WR-ATOM-6
#[test]
fn send_write_read_atomic() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let src = p.a.pd.reg_mr((0..10_000u32).map(|i| i as u8).collect(), Access::LOCAL_WRITE).unwrap();
    let dst =
        p.b.pd
            .alloc_mr(10_000, Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC)
            .unwrap();
    // Send 3000 bytes into a posted receive.
    p.b.qp.post_recv(&[RecvWr::new(7, &[dst.sge(0..4000)])]).unwrap();
    p.a.qp.post_send(&[SendWr::send(1, &[src.sge(0..3000)]).signaled().imm(0xabcd)]).unwrap();
    p.run(1_000_000_000);
    let wa = poll_all(&p.a.cq);
    let wb = poll_all(&p.b.cq);
    assert_eq!(wa.len(), 1, "{wa:?}");
    assert_eq!(wa[0].status, WcStatus::Success);
    assert_eq!(wb.len(), 1, "{wb:?}");
    assert_eq!((wb[0].status, wb[0].byte_len, wb[0].imm()), (WcStatus::Success, 3000, Some(0xabcd)));
    assert_eq!(&dst.to_vec().unwrap()[..3000], &src.to_vec().unwrap()[..3000]);

    // RDMA Write 5000 bytes at offset 5000.
    p.a.qp.post_send(&[SendWr::rdma_write(2, &[src.sge(0..5000)], dst.addr() + 5000, dst.rkey()).signaled()]).unwrap();
    p.run(1_000_000_000);
    assert_eq!(poll_all(&p.a.cq)[0].status, WcStatus::Success);
    assert_eq!(&dst.to_vec().unwrap()[5000..], &src.to_vec().unwrap()[..5000]);

    // RDMA Read it back.
    let back = p.a.pd.alloc_mr(5000, Access::LOCAL_WRITE).unwrap();
    p.a.qp.post_send(&[SendWr::rdma_read(3, &[back.sge(0..5000)], dst.addr() + 5000, dst.rkey()).signaled()]).unwrap();
    p.run(1_000_000_000);
    let w = poll_all(&p.a.cq);
    assert_eq!((w[0].status, w[0].opcode, w[0].byte_len), (WcStatus::Success, WcOpcode::RdmaRead, 5000));
    assert_eq!(back.to_vec().unwrap(), src.to_vec().unwrap()[..5000]);

    // Atomics on dst[8..16].
    dst.write(8, &40u64.to_ne_bytes()).unwrap();
    let res = p.a.pd.alloc_mr(16, Access::LOCAL_WRITE).unwrap();
    p.a.qp
        .post_send(&[
            SendWr::atomic_fetch_add(4, &[res.sge(0..8)], dst.addr() + 8, dst.rkey(), 2).signaled(),
            SendWr::atomic_cmp_swp(5, &[res.sge(8..16)], dst.addr() + 8, dst.rkey(), 42, 7).signaled(),
        ])
        .unwrap();
    p.run(1_000_000_000);
    let w = poll_all(&p.a.cq);
    assert!(w.iter().all(|w| w.status == WcStatus::Success), "{w:?}");
    let mut b = [0u8; 16];
    res.read(0, &mut b).unwrap();
    assert_eq!(u64::from_ne_bytes(b[..8].try_into().unwrap()), 40);
    assert_eq!(u64::from_ne_bytes(b[8..].try_into().unwrap()), 42);
    let mut v = [0u8; 8];
    dst.read(8, &mut v).unwrap();
    assert_eq!(u64::from_ne_bytes(v), 7);
}

/// On a link that asks for it (UDP: `Context::acks_after_requests`), a QP's ACK lets up to 16
/// of the QP's own request packets go first, so that the answer it rides with reaches the peer
/// before it; on other links, and after 16 packets, it goes first. Either way it is sent in
/// the same flush as the packet that earned it is answered, waiting for nothing not yet
/// received, and both messages complete.
/// Rule PKT-ACK-3, PKT-ACK-13
#[test]
fn an_ack_waits_behind_its_qps_own_requests_only_where_the_link_asks() {
    use softhca::transport::MAX_DATAGRAM;
    use softhca::wire::Opcode;
    for asks in [false, true] {
        let mut p = Pair::new(QpType::Rc, Mtu::Mtu256);
        if asks {
            p.b.ctx.acks_after_requests();
        }
        let land_b = p.b.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
        let land_a = p.a.pd.alloc_mr(20 * 256, Access::LOCAL_WRITE).unwrap();
        p.b.qp.post_recv(&[RecvWr::new(1, &[land_b.sge(0..64)])]).unwrap();
        p.a.qp.post_recv(&[RecvWr::new(2, &[land_a.sge(0..20 * 256)])]).unwrap();
        let ask = p.a.pd.reg_mr(vec![7u8; 8], Access::LOCAL_WRITE).unwrap();
        let answer = p.b.pd.reg_mr(vec![9u8; 20 * 256], Access::LOCAL_WRITE).unwrap();
        // a's one-packet Send reaches b, which owes it an ACK; b answers with a 20-packet Send.
        p.a.qp.post_send(&[SendWr::send(3, &[ask.sge(0..8)]).signaled()]).unwrap();
        let mut buf = vec![0u8; MAX_DATAGRAM];
        let n = p.a.ctx.transmit(p.now, &mut buf).unwrap();
        p.b.ctx.receive(p.now, &buf[..n]);
        assert_eq!(poll_all(&p.b.cq).len(), 1);
        p.b.qp.post_send(&[SendWr::send(4, &[answer.sge(0..20 * 256)]).signaled()]).unwrap();
        let mut order = Vec::new();
        while let Some(n) = p.b.ctx.transmit(p.now, &mut buf) {
            order.push(Pkt::parse(&buf[..n]).opcode);
            p.a.ctx.receive(p.now, &buf[..n]);
        }
        let ack_at = order.iter().position(|&op| op == Opcode::RcAcknowledge);
        assert_eq!(ack_at, Some(if asks { 16 } else { 0 }), "asks {asks}: {order:?}");
        assert_eq!(order.len(), 21, "{order:?}");
        p.run(1_000_000_000);
        let (wa, wb) = (poll_all(&p.a.cq), poll_all(&p.b.cq));
        let ok = |w: &[Wc], ids: &[u64]| {
            let mut got: Vec<u64> = w.iter().filter(|c| c.status == WcStatus::Success).map(|c| c.wr_id).collect();
            got.sort();
            got == ids
        };
        assert!(ok(&wa, &[2, 3]), "asks {asks}: {wa:?}");
        assert!(ok(&wb, &[4]), "asks {asks}: {wb:?}");
    }
}
