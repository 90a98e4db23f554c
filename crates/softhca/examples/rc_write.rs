//! The smallest complete RC program: two devices on the simulated fabric, one QP each, an
//! RDMA Write and a Send with Immediate, with the completions printed. Read it top to bottom;
//! every call is a verb.

use softhca::link::sim::{SimConfig, SimFabric};
use softhca::*;

fn main() -> Result<()> {
    // Two HCAs on a fabric that loses 1% of packets; the transport recovers.
    let mut fabric = SimFabric::new(SimConfig::default().seed(7).loss(0.01));
    let (a, b) = (fabric.add_device("softhca0")?, fabric.add_device("softhca1")?);
    let (pd_a, pd_b) = (a.alloc_pd()?, b.alloc_pd()?);
    let (cq_a, cq_b) = (a.create_cq(64)?, b.create_cq(64)?);
    let qp_a = pd_a.create_qp(&QpInitAttr::rc(&cq_a, &cq_a))?;
    let qp_b = pd_b.create_qp(&QpInitAttr::rc(&cq_b, &cq_b))?;

    let src = pd_a.reg_mr(b"hello, remote memory".to_vec(), Access::LOCAL_WRITE)?;
    let dst = pd_b.alloc_mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;

    // Connect: Reset → Init → RTR → RTS on both sides, each pointing at the other.
    for (qp, peer, gid) in [(&qp_a, &qp_b, b.query_gid(1, 0)?), (&qp_b, &qp_a, a.query_gid(1, 0)?)] {
        let av = AddressVector::new(AhAttr::roce(gid, 0), Mtu::Mtu1024);
        qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(Access::REMOTE_WRITE))?;
        qp.modify(&QpAttr::to_rtr(av, peer.qp_num()).rq_psn(0).max_dest_rd_atomic(1).min_rnr_timer(12))?;
        qp.modify(&QpAttr::to_rts().sq_psn(0).timeout(14).retry_cnt(7).rnr_retry(7).max_rd_atomic(1))?;
    }

    // The receiver posts a receive for the immediate data; the sender writes, then notifies.
    qp_b.post_recv(&[RecvWr::new(100, &[])])?;
    let sge = [src.sge(0..src.len())];
    qp_a.post_send(&[
        SendWr::rdma_write(1, &sge, dst.addr(), dst.rkey()).signaled(),
        SendWr::send(2, &[]).imm(0xC0FFEE).signaled(),
    ])?;

    // Run the fabric until both completions are in.
    let (ca, cb) = (cq_a.clone(), cq_b.clone());
    assert!(fabric.run_until(|_| ca.len().unwrap_or(0) == 2 && cb.len().unwrap_or(0) == 1));
    let mut wcs = [Wc::default(); 4];
    let n = cq_a.poll(&mut wcs)?;
    for wc in &wcs[..n] {
        println!("sender:   wr_id {} {:?} {}", wc.wr_id, wc.opcode, wc.status);
    }
    let n = cq_b.poll(&mut wcs)?;
    for wc in &wcs[..n] {
        println!("receiver: wr_id {} {:?} {} imm {:#x}", wc.wr_id, wc.opcode, wc.status, wc.imm_data);
    }
    println!("remote memory now holds {:?}", String::from_utf8_lossy(&dst.to_vec()?[..src.len()]));
    println!("retransmissions: {}", a.counters().retransmits);
    Ok(())
}
