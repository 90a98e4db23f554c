//! Create QP results (CRT-QP) and the resource verbs around it: device, PD, AH.

mod common;

use common::*;
use softhca::*;

/// Rule CRT-QP-2, CRT-QP-3, CRT-QP-4, QPS-RESET-1
#[test]
fn create_returns_a_reset_qp_with_a_fresh_qpn_and_at_least_the_asked_caps() {
    let f = fixture();
    let mut qpns = std::collections::HashSet::new();
    for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
        for _ in 0..50 {
            let init = QpInitAttr::new(t, &f.cq, &f.cq).max_send_wr(33).max_recv_wr(17).max_send_sge(3).max_recv_sge(5);
            let qp = f.pd.create_qp(&init).unwrap();
            assert!(qpns.insert(qp.qp_num()), "QPN reused while alive");
            assert!(qp.qp_num() <= 0xFF_FFFF);
            let a = qp.query().unwrap();
            assert_eq!(a.qp_state, QpState::Reset);
            assert!(a.cap.max_send_wr >= 33 && a.cap.max_recv_wr >= 17);
            assert!(a.cap.max_send_sge >= 3 && a.cap.max_recv_sge >= 5);
        }
    }
}

/// Rule CRT-QP-5, CRT-QP-13
#[test]
fn insufficient_resources_and_failed_create_creates_nothing() {
    let mut cfg = DeviceConfig::default().seed(11);
    cfg.attr.max_qp = 2;
    let f = fixture_with(cfg);
    let a = f.qp(QpType::Rc);
    let _b = f.qp(QpType::Rc);
    let r = f.pd.create_qp(&QpInitAttr::rc(&f.cq, &f.cq));
    assert_eq!(r.unwrap_err(), VerbsError::InsufficientResources);
    // The failed calls left no CQ association behind: once the QPs are gone the CQ destroys.
    let cq2 = f.ctx.create_cq(4).unwrap();
    let too_big = QpInitAttr::rc(&cq2, &cq2).max_send_wr(1 << 30);
    assert_eq!(f.pd.create_qp(&too_big).unwrap_err(), VerbsError::MaxWrExceeded);
    cq2.destroy().unwrap();
    a.destroy().unwrap();
    f.qp(QpType::Ud);
}

/// Rule CRT-QP-6
#[test]
fn closed_device_is_an_invalid_hca_handle() {
    let f = fixture();
    f.ctx.close();
    assert_eq!(f.ctx.create_qp(&f.pd, &QpInitAttr::rc(&f.cq, &f.cq)).unwrap_err(), VerbsError::InvalidHcaHandle);
    assert_eq!(f.ctx.query_device().unwrap_err(), VerbsError::InvalidHcaHandle);
    assert_eq!(f.ctx.alloc_pd().unwrap_err(), VerbsError::InvalidHcaHandle);
}

/// Rule CRT-QP-7, CRT-QP-1
#[test]
fn invalid_cq_handles() {
    let f = fixture();
    let dead = f.ctx.create_cq(4).unwrap();
    dead.destroy().unwrap();
    let other = fixture();
    for (s, r) in [(&dead, &f.cq), (&f.cq, &dead), (&other.cq, &f.cq), (&f.cq, &other.cq)] {
        let e = f.pd.create_qp(&QpInitAttr::rc(s, r)).unwrap_err();
        assert_eq!(e, VerbsError::InvalidCqHandle);
    }
}

/// Rule CRT-QP-8, CRT-QP-9
#[test]
fn wr_and_sge_limits() {
    let f = fixture();
    let d = f.ctx.query_device().unwrap();
    let base = || QpInitAttr::rc(&f.cq, &f.cq);
    assert_eq!(f.pd.create_qp(&base().max_send_wr(d.max_qp_wr + 1)).unwrap_err(), VerbsError::MaxWrExceeded);
    assert_eq!(f.pd.create_qp(&base().max_recv_wr(d.max_qp_wr + 1)).unwrap_err(), VerbsError::MaxWrExceeded);
    assert_eq!(f.pd.create_qp(&base().max_send_sge(d.max_sge + 1)).unwrap_err(), VerbsError::MaxSgeExceeded);
    assert_eq!(f.pd.create_qp(&base().max_recv_sge(d.max_sge + 1)).unwrap_err(), VerbsError::MaxSgeExceeded);
    f.pd.create_qp(&base().max_send_wr(d.max_qp_wr).max_send_sge(d.max_sge)).unwrap();
    assert!(matches!(
        f.pd.create_qp(&base().max_inline_data(d.max_inline_data + 1)),
        Err(VerbsError::InvalidArgument(_))
    ));
}

/// An empty send or receive queue (zero WRs) is taken, as Linux takes it (rxe and mlx5; the
/// digest bounds only the maximum): qperf's one-way tests create their sender with no RQ and
/// their receiver with no SQ. Query QP reports the zero, every post is refused as a full
/// queue, and Modify QP may empty a queue again.
/// Rule CRT-QP-4, CRT-QP-8, WR-COM-8
#[test]
fn an_empty_work_queue_is_taken_and_holds_nothing() {
    let f = fixture();
    let mr = f.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    for (send, recv) in [(0, 4), (4, 0), (0, 0)] {
        let qp = f.pd.create_qp(&QpInitAttr::rc(&f.cq, &f.cq).max_send_wr(send).max_recv_wr(recv)).unwrap();
        let cap = qp.query().unwrap().cap;
        assert_eq!((cap.max_send_wr, cap.max_recv_wr), (send, recv));
        drive(&qp, QpState::Rts);
        let sge = [mr.sge(0..8)];
        let sent = qp.post_send(&[SendWr::send(1, &sge)]);
        let received = qp.post_recv(&[RecvWr::new(2, &sge)]);
        assert_eq!(sent.map_err(|e| e.error), if send == 0 { Err(VerbsError::QueueFull) } else { Ok(()) });
        assert_eq!(received.map_err(|e| e.error), if recv == 0 { Err(VerbsError::QueueFull) } else { Ok(()) });
    }
    let qp = f.qp_in(QpType::Rc, QpState::Init);
    let empty =
        attr_with(QpState::Rtr, required(QpType::Rc, QpState::Rtr)).cap(WqSizes { max_send_wr: 0, max_recv_wr: 0 });
    qp.modify(&empty).unwrap();
    let cap = qp.query().unwrap().cap;
    assert_eq!((cap.max_send_wr, cap.max_recv_wr), (0, 0));
}

/// Rule CRT-QP-10
#[test]
fn invalid_pd() {
    let f = fixture();
    let pd = f.ctx.alloc_pd().unwrap();
    pd.dealloc().unwrap();
    assert_eq!(pd.create_qp(&QpInitAttr::rc(&f.cq, &f.cq)).unwrap_err(), VerbsError::InvalidPd);
    let other = fixture();
    assert_eq!(f.ctx.create_qp(&other.pd, &QpInitAttr::rc(&f.cq, &f.cq)).unwrap_err(), VerbsError::InvalidPd);
}

/// Raw is a valid IBA service type that softhca does not implement.
/// Rule CRT-QP-11
#[test]
fn unsupported_service_types() {
    let f = fixture();
    for t in [QpType::RawIpv6, QpType::RawEthertype] {
        let e = f.pd.create_qp(&QpInitAttr::new(t, &f.cq, &f.cq)).unwrap_err();
        assert!(matches!(e, VerbsError::InvalidServiceType(_)), "{e:?}");
    }
}

/// An RD QP needs a reliable datagram domain of its own device, alive.
/// Rule CRT-QP-12, CRT-QP-2
#[test]
fn rd_qp_needs_a_valid_rdd() {
    let f = fixture();
    let e = f.pd.create_qp(&QpInitAttr::new(QpType::Rd, &f.cq, &f.cq)).unwrap_err();
    assert_eq!(e, VerbsError::InvalidRdd);
    let other = fixture();
    let foreign = other.ctx.alloc_rdd().unwrap();
    assert_eq!(f.pd.create_qp(&QpInitAttr::rd(&f.cq, &f.cq, &foreign)).unwrap_err(), VerbsError::InvalidRdd);
    let dead = f.ctx.alloc_rdd().unwrap();
    dead.dealloc().unwrap();
    assert_eq!(f.pd.create_qp(&QpInitAttr::rd(&f.cq, &f.cq, &dead)).unwrap_err(), VerbsError::InvalidRdd);
    let rdd = f.ctx.alloc_rdd().unwrap();
    let qp = f.pd.create_qp(&QpInitAttr::rd(&f.cq, &f.cq, &rdd)).unwrap();
    assert_eq!(qp.qp_type(), QpType::Rd);
    assert!(matches!(rdd.dealloc(), Err(VerbsError::InUse(_))), "an RDD in use stays");
    qp.destroy().unwrap();
    rdd.dealloc().unwrap();
}

/// Rule CRT-QP-15
#[test]
fn special_qpns_are_never_assigned() {
    let f = fixture();
    for _ in 0..2000 {
        let qp = f.qp(QpType::Ud);
        assert!(!matches!(qp.qp_num(), 0 | 1 | 0xFF_FFFF));
        qp.destroy().unwrap();
    }
}

/// Rule QPS-GEN-2
#[test]
fn device_port_and_gid_queries() {
    let gid = Gid::from_ipv4("127.0.0.9".parse().unwrap());
    let f = fixture_with(DeviceConfig::default().name("softhca-q").gid0(gid).seed(8));
    let d = f.ctx.query_device().unwrap();
    assert_eq!(d.phys_port_cnt, 1);
    assert_eq!(d.atomic_cap, AtomicCap::Glob);
    assert!(d.max_qp_wr >= 1024 && d.max_sge >= 16 && d.max_cqe >= 65536);
    let p = f.ctx.query_port(1).unwrap();
    assert_eq!(p.state, PortState::Active);
    assert!(p.link_layer_ethernet);
    assert_eq!(f.ctx.query_gid(1, 0).unwrap(), gid);
    assert_eq!(gid.to_string(), "0000:0000:0000:0000:0000:ffff:7f00:0009");
    assert_eq!(gid.to_ipv4(), Some("127.0.0.9".parse().unwrap()));
    assert_eq!(f.ctx.query_pkey(1, 0).unwrap(), 0xFFFF);
    assert!(f.ctx.query_port(2).is_err());
    assert!(f.ctx.query_gid(1, 5).is_err());
    assert!(device_list().iter().any(|d| d.name == "softhca-q"));
    let again = open_device("softhca-q").unwrap();
    assert_eq!(again.query_gid(1, 0).unwrap(), gid);
    assert_eq!(open_device("no-such-device").unwrap_err(), VerbsError::InvalidHcaHandle);
}

#[test]
fn pd_dealloc_refused_while_used() {
    let f = fixture();
    let mr = f.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    assert!(matches!(f.pd.dealloc(), Err(VerbsError::InUse(_))));
    mr.dereg().unwrap();
    let qp = f.qp(QpType::Rc);
    assert!(matches!(f.pd.dealloc(), Err(VerbsError::InUse(_))));
    qp.destroy().unwrap();
    let ah = f.pd.create_ah(&remote_av().ah).unwrap();
    assert!(matches!(f.pd.dealloc(), Err(VerbsError::InUse(_))));
    ah.destroy().unwrap();
    f.pd.dealloc().unwrap();
    assert_eq!(f.pd.dealloc(), Err(VerbsError::InvalidPd));
    assert_eq!(f.pd.alloc_mr(8, Access::empty()).unwrap_err(), VerbsError::InvalidPd);
}

/// Rule PKT-ROCE-4
#[test]
fn address_handles() {
    let f = fixture();
    let ah = f.pd.create_ah(&remote_av().ah).unwrap();
    assert_eq!(ah.attr(), remote_av().ah);
    let mut no_grh = remote_av().ah;
    no_grh.is_global = false;
    assert!(matches!(f.pd.create_ah(&no_grh), Err(VerbsError::InvalidAttribute(..))));
    let mut partial = remote_av().ah;
    partial.grh.hop_limit = None;
    assert!(matches!(f.pd.create_ah(&partial), Err(VerbsError::MissingAttribute(_))));
    let mut bad_port = remote_av().ah;
    bad_port.port_num = 3;
    assert!(matches!(f.pd.create_ah(&bad_port), Err(VerbsError::InvalidAttribute(..))));
    ah.destroy().unwrap();
    assert_eq!(ah.destroy(), Err(VerbsError::InvalidAhHandle));
}

/// A port's GID table has `gid_tbl_len` slots: GID 0 is the device's, the rest are empty
/// (zero) until the link layer fills them; an index past the table is refused in Query GID and
/// in an address vector.
/// Rule PKT-ROCE-3
#[test]
fn gid_table_slots_and_empty_source_gids() {
    let mut config = DeviceConfig::default().seed(1).gid0(Gid::from_ipv4("127.0.0.1".parse().unwrap()));
    config.port.gid_tbl_len = 4;
    let f = fixture_with(config);
    assert_eq!(f.ctx.query_port(1).unwrap().gid_tbl_len, 4);
    assert!(!f.ctx.query_gid(1, 0).unwrap().is_zero());
    assert!(f.ctx.query_gid(1, 3).unwrap().is_zero());
    assert!(matches!(f.ctx.query_gid(1, 4), Err(VerbsError::InvalidArgument(_))));
    let mut av = remote_av().ah;
    av.grh.sgid_index = Some(4);
    assert!(matches!(f.pd.create_ah(&av), Err(VerbsError::InvalidAttribute(..))));
    // The link layer fills a slot; then it can be a source.
    f.ctx.set_gid(3, Gid::from_ipv4("127.0.0.9".parse().unwrap())).unwrap();
    assert_eq!(f.ctx.query_gid(1, 3).unwrap(), Gid::from_ipv4("127.0.0.9".parse().unwrap()));
    av.grh.sgid_index = Some(3);
    f.pd.create_ah(&av).unwrap().destroy().unwrap();
}
