//! The General Services Interface (QP1), the special QP the connection manager's datagrams
//! travel on: Get Special QP, its CQs kept to itself, the well-known Q_Key, and a P_Key check
//! against the whole table whose matching index the receive CQE reports.

mod common;

use common::{exchange, poll_all};
use softhca::*;

struct Dev {
    ctx: Context,
    pd: Pd,
    gid: Gid,
}

fn dev(n: u8) -> Dev {
    let gid = Gid::from_ipv4([127, 7, 0, n].into());
    let mut cfg = DeviceConfig::default().name(format!("gsi{n}")).gid0(gid).seed(n as u64);
    cfg.pkeys = vec![0xFFFF, 0x8123];
    let ctx = Context::create(cfg).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    Dev { ctx, pd, gid }
}

fn gsi(d: &Dev, cq: &Cq, pkey_index: u16) -> Qp {
    let qp =
        d.ctx.get_special_qp(&d.pd, SpecialQp::Gsi, &QpInitAttr::ud(cq, cq).max_send_wr(8).max_recv_wr(8)).unwrap();
    qp.modify(&QpAttr::to_init().port(1).pkey_index(pkey_index).qkey(GSI_QKEY)).unwrap();
    qp.modify(&QpAttr::new(QpState::Rtr)).unwrap();
    qp.modify(&QpAttr::to_rts().sq_psn(0)).unwrap();
    qp
}

/// Get Special QP gives QP1; its CQ serves no other QP and it takes no CQ another QP uses
/// (InvalidCqHandle); one GSI per port; no SMI on a RoCE port; once the GSI is gone its CQ is
/// an ordinary CQ again.
/// Rule CRT-QP-14, CRT-QP-15
#[test]
fn the_gsi_is_qp1_and_keeps_its_cq() {
    let d = dev(1);
    let (gcq, other) = (d.ctx.create_cq(16).unwrap(), d.ctx.create_cq(16).unwrap());
    let qp1 = gsi(&d, &gcq, 0);
    assert_eq!((qp1.qp_num(), qp1.qp_type()), (GSI_QPN, QpType::Ud));
    let err = d.pd.create_qp(&QpInitAttr::rc(&gcq, &other)).unwrap_err();
    assert_eq!(err, VerbsError::InvalidCqHandle, "the GSI's CQ for another QP");
    let plain = d.pd.create_qp(&QpInitAttr::ud(&other, &other)).unwrap();
    assert_ne!(plain.qp_num(), GSI_QPN);
    let spare = d.ctx.create_cq(16).unwrap();
    let init = QpInitAttr::ud(&spare, &other);
    assert_eq!(d.ctx.get_special_qp(&d.pd, SpecialQp::Gsi, &init).unwrap_err(), VerbsError::InvalidCqHandle);
    let init = QpInitAttr::ud(&spare, &spare);
    assert!(matches!(d.ctx.get_special_qp(&d.pd, SpecialQp::Gsi, &init), Err(VerbsError::InUse(_))));
    assert!(matches!(d.ctx.get_special_qp(&d.pd, SpecialQp::Smi, &init), Err(VerbsError::NotSupported(_))));
    let rc = QpInitAttr::rc(&spare, &spare);
    assert!(matches!(d.ctx.get_special_qp(&d.pd, SpecialQp::Gsi, &rc), Err(VerbsError::InvalidServiceType(_))));
    // The failed attempts left `spare` free for anyone.
    d.pd.create_qp(&QpInitAttr::rc(&spare, &spare)).unwrap();
    qp1.destroy().unwrap();
    d.pd.create_qp(&QpInitAttr::rc(&gcq, &gcq)).unwrap();
}

/// A management datagram to QP1 under the P_Key of table entry 1 reaches the peer's GSI,
/// whose P_Key index is 0 (QP1 takes any entry), and its receive CQE reports index 1; sent to
/// QP1 with another Q_Key than the well-known one, it is dropped.
/// Rule CQE-14, PKT-VAL-7, PKT-VAL-10
#[test]
fn a_mad_reaches_the_peer_gsi_under_any_table_pkey() {
    let (a, b) = (dev(2), dev(3));
    let (acq, bcq) = (a.ctx.create_cq(16).unwrap(), b.ctx.create_cq(16).unwrap());
    let (qa, qb) = (gsi(&a, &acq, 1), gsi(&b, &bcq, 0));
    let land = b.pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    qb.post_recv(&[RecvWr::new(1, &[land.sge(0..296)]), RecvWr::new(2, &[land.sge(296..592)])]).unwrap();
    let mad = a.pd.reg_mr((0..=255u8).collect(), Access::LOCAL_WRITE).unwrap();
    let ah = a.pd.create_ah(&AhAttr::roce(b.gid, 0)).unwrap();
    let g = [mad.sge(0..256)];
    qa.post_send(&[
        SendWr::send(10, &g).ud(&ah, GSI_QPN, GSI_QKEY).signaled(),
        SendWr::send(11, &g).ud(&ah, GSI_QPN, 0x1111).signaled(),
    ])
    .unwrap();
    exchange(&a.ctx, &b.ctx);
    assert_eq!(poll_all(&acq).iter().map(|w| w.status).collect::<Vec<_>>(), vec![WcStatus::Success; 2]);
    let got = poll_all(&bcq);
    assert_eq!(got.len(), 1, "the datagram with a wrong Q_Key is dropped: {got:?}");
    let w = got[0];
    assert_eq!((w.wr_id, w.status, w.opcode, w.byte_len), (1, WcStatus::Success, WcOpcode::Recv, 40 + 256));
    assert_eq!((w.src_qp, w.pkey_index), (GSI_QPN, 1), "from QP1, under table entry 1");
    assert_eq!(land.to_vec().unwrap()[40..296], (0..=255u8).collect::<Vec<_>>()[..]);
    assert_eq!(b.ctx.counters().qkey_violations, 1);
}

/// CQ-ASSOC-2 lets QP0 and QP1 share a CQ; a RoCE port has no QP0 (no subnet management on
/// Ethernet: the RoCE annex leaves the SMI out), and the digest does not say what a RoCE CA
/// answers, so this pins softhca's answer: Get Special QP for the SMI is `NotSupported` even
/// when offered the GSI's own CQ (what refuses it is the port, not the sharing), and a
/// datagram addressed to QP0 is dropped and counted, never delivered to QP1 or anyone.
/// Rule CQ-ASSOC-2
#[test]
fn a_roce_port_has_no_qp0_to_share_the_gsi_cq_with() {
    let (a, b) = (dev(4), dev(5));
    let (acq, bcq) = (a.ctx.create_cq(16).unwrap(), b.ctx.create_cq(16).unwrap());
    let (qa, qb) = (gsi(&a, &acq, 0), gsi(&b, &bcq, 0));
    let shared = QpInitAttr::ud(&bcq, &bcq).max_send_wr(8).max_recv_wr(8);
    assert!(matches!(b.ctx.get_special_qp(&b.pd, SpecialQp::Smi, &shared), Err(VerbsError::NotSupported(_))));
    let land = b.pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    qb.post_recv(&[RecvWr::new(1, &[land.sge(0..296)])]).unwrap();
    let smp = a.pd.reg_mr(vec![0x81; 256], Access::LOCAL_WRITE).unwrap();
    let ah = a.pd.create_ah(&AhAttr::roce(b.gid, 0)).unwrap();
    let dropped = b.ctx.counters().rx_dropped;
    qa.post_send(&[SendWr::send(10, &[smp.sge(0..256)]).ud(&ah, 0, GSI_QKEY).signaled()]).unwrap();
    exchange(&a.ctx, &b.ctx);
    assert_eq!(poll_all(&acq).iter().map(|w| w.status).collect::<Vec<_>>(), vec![WcStatus::Success]);
    assert!(poll_all(&bcq).is_empty(), "nothing reached QP1");
    assert_eq!(b.ctx.counters().rx_dropped, dropped + 1);
}
