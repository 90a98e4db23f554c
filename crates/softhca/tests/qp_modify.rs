//! Modify QP against the digest's transition matrix (QPT) and attribute tables (MOD), written
//! out here independently of `transport::state` so that a wrong table entry fails a test.

mod common;

use common::*;
use softhca::transport::{check_modify, AttrMask};
use softhca::*;

const STATES: [QpState; 7] = QpState::ALL;

/// The QPT matrix of the digest, row = from, column = to, in `QpState::ALL` order.
const MATRIX: [&str; 7] = [
    "SS----S", // Reset
    "SSS---S", // Init
    "S--S--S", // RTR
    "S--SS-S", // RTS
    "S--SS-S", // SQD
    "S--S--S", // SQE
    "S-----S", // Error
];

fn allowed(from: QpState, to: QpState) -> bool {
    let i = STATES.iter().position(|s| *s == from).unwrap();
    let j = STATES.iter().position(|s| *s == to).unwrap();
    MATRIX[i].as_bytes()[j] == b'S'
}

/// The attribute tables of the digest: transition, parameter, then R / O / - for RC UC UD RD,
/// and for the XRC initiator and target, which the digest lacks: the kernel's `qp_state_table`
/// for `IB_QPT_XRC_INI` and `IB_QPT_XRC_TGT` in the digest's terms (its access flags the three
/// enables, its path MTU in the AV; neither resizes a queue it lacks).
const TABLES: &str = "
Reset>Init READ_EN R--RRR
Reset>Init WRITE_EN RR-RRR
Reset>Init ATOMIC_EN R--RRR
Reset>Init PKEY_INDEX RRR-RR
Reset>Init QKEY --RR--
Reset>Init PORT RRR-RR
Init>RTR RQ_PSN RR--RR
Init>RTR MAX_DEST_RD_ATOMIC R--R-R
Init>RTR AV RR--RR
Init>RTR DEST_QPN RR--RR
Init>RTR ALT_PATH OO--OO
Init>RTR READ_EN O--OOO
Init>RTR ATOMIC_EN O--OOO
Init>RTR WRITE_EN OO-OOO
Init>RTR PKEY_INDEX OOO-OO
Init>RTR QKEY --OO--
Init>RTR CAP OOOOO-
Init>RTR MIN_RNR_TIMER O--O-O
RTR>RTS TIMEOUT R---RR
RTR>RTS SQ_PSN RRR-RR
RTR>RTS RETRY_CNT R---R-
RTR>RTS RNR_RETRY R---R-
RTR>RTS MAX_RD_ATOMIC R--RR-
RTR>RTS READ_EN O--OOO
RTR>RTS ATOMIC_EN O--OOO
RTR>RTS WRITE_EN OO-OOO
RTR>RTS QKEY --OO--
RTR>RTS ALT_PATH OO--OO
RTR>RTS PATH_MIG_STATE OO-OOO
RTR>RTS CAP OOOOO-
RTR>RTS MIN_RNR_TIMER O--O-O
RTS>SQD SQD_EVENT OOOOOO
SQD>RTS AV OO--OO
SQD>RTS ALT_PATH OO--OO
SQD>RTS PATH_MIG_STATE OO-OOO
SQD>RTS MAX_RD_ATOMIC O--OO-
SQD>RTS MAX_DEST_RD_ATOMIC O--O-O
SQD>RTS QKEY --OO--
SQD>RTS PKEY_INDEX OOO-OO
SQD>RTS TIMEOUT O---OO
SQD>RTS RETRY_CNT O---O-
SQD>RTS RNR_RETRY O---O-
SQD>RTS CAP OOOOO-
SQD>RTS MIN_RNR_TIMER O--O-O
SQD>RTS PORT O---OO
SQD>RTS READ_EN O--OOO
SQD>RTS ATOMIC_EN O--OOO
SQD>RTS WRITE_EN OO-OOO
SQE>RTS WRITE_EN -O-O--
SQE>RTS READ_EN ---O--
SQE>RTS ATOMIC_EN ---O--
SQE>RTS QKEY --OO--
Init>Init PKEY_INDEX OOO-OO
Init>Init PORT OOO-OO
Init>Init READ_EN O--OOO
Init>Init WRITE_EN OO-OOO
Init>Init ATOMIC_EN O--OOO
Init>Init QKEY --OO--
RTS>RTS READ_EN O--OOO
RTS>RTS WRITE_EN OO-OOO
RTS>RTS ATOMIC_EN O--OOO
RTS>RTS ALT_PATH OO--OO
RTS>RTS PATH_MIG_STATE OO-OOO
RTS>RTS MIN_RNR_TIMER O--O-O
RTS>RTS QKEY --OO--
";

/// (required, optional) of the digest for one transition and service type.
fn expected_rule(qp_type: QpType, from: QpState, to: QpState) -> (AttrMask, AttrMask) {
    let col = QpType::TABLE.iter().position(|t| *t == qp_type).unwrap();
    // SQD→SQD takes "the SQD → RTS set".
    let key = if (from, to) == (QpState::Sqd, QpState::Sqd) { "SQD>RTS".to_string() } else { format!("{from}>{to}") };
    let (mut req, mut opt) = (AttrMask::empty(), AttrMask::empty());
    for line in TABLES.lines().filter(|l| !l.is_empty()) {
        let mut f = line.split_whitespace();
        let (t, p, cols) = (f.next().unwrap(), f.next().unwrap(), f.next().unwrap());
        if t != key {
            continue;
        }
        let bit = AttrMask::from_name(p).unwrap_or_else(|| panic!("unknown parameter {p}"));
        match cols.as_bytes()[col] {
            b'R' => req |= bit,
            b'O' => opt |= bit,
            _ => {}
        }
    }
    (req, opt)
}

#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Ok,
    InvalidTransition,
    Missing,
    Invalid,
}

fn expect(qp_type: QpType, from: QpState, to: QpState, supplied: AttrMask) -> Outcome {
    let rc_in_sqe = qp_type.is_reliable_connected() && from == QpState::Sqe;
    if !allowed(from, to) || rc_in_sqe {
        return Outcome::InvalidTransition;
    }
    let (req, opt) = expected_rule(qp_type, from, to);
    if !(req - supplied).is_empty() {
        Outcome::Missing
    } else if !(supplied - req - opt).is_empty() {
        Outcome::Invalid
    } else {
        Outcome::Ok
    }
}

fn classify(r: Result<()>) -> Outcome {
    match r {
        Ok(()) => Outcome::Ok,
        Err(VerbsError::InvalidTransition) => Outcome::InvalidTransition,
        Err(VerbsError::MissingAttribute(_)) => Outcome::Missing,
        Err(VerbsError::InvalidAttribute(..)) => Outcome::Invalid,
        Err(e) => panic!("unexpected {e:?}"),
    }
}

/// Every (from, to, service type) of the tables, with the required set and with each single
/// parameter added to or removed from it, decided by `check_modify` exactly as the digest says.
/// Rule QPT-INV-1, QPT-INV-2, QPT-INV-3, QPT-INV-4, QPT-INV-5, QPT-INV-6, QPT-INV-7
/// Rule QPT-SW-11, QPT-SW-9, QPT-SW-10, MOD-GEN-3, MOD-GEN-4, MOD-GEN-12, MOD-SELF-1
/// Rule MOD-RTS-SQD-2, MOD-SQE-RTS-1
#[test]
fn tables_match_the_digest_for_every_transition_type_and_parameter() {
    let mut checked = 0;
    for qp_type in QpType::TABLE {
        for from in STATES {
            for to in STATES {
                let (req, _) = expected_rule(qp_type, from, to);
                let mut cases = vec![req];
                for bit in AttrMask::all().iter() {
                    cases.push(req ^ bit);
                }
                for supplied in cases {
                    let want = expect(qp_type, from, to, supplied);
                    let got = classify(check_modify(qp_type, from, to, supplied));
                    assert_eq!(got, want, "{qp_type:?} {from}→{to} with {supplied:?}");
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, 6 * 49 * 21);
}

/// The same exhaustive check on live RC, UC and UD QPs, from every state reachable without
/// traffic. A refused Modify leaves state and attributes exactly as they were; alternate path
/// information, optional where the tables list it, is `NotSupported` because softhca has no
/// APM.
/// Rule QPT-SW-1, QPT-SW-2, QPT-SW-3, QPT-SW-4, QPT-SW-5, QPT-SW-7, QPT-SW-8
/// Rule MOD-GEN-5, MOD-GEN-6, MOD-GEN-9, MOD-RESET-INIT-1, MOD-INIT-RTR-1, MOD-RTR-RTS-1
/// Rule MOD-RTS-SQD-1, MOD-SQD-RTS-1, MOD-INIT-RTR-UD-1
#[test]
fn live_qps_accept_exactly_what_the_tables_say() {
    let f = fixture();
    for qp_type in [QpType::Rc, QpType::Uc, QpType::Ud] {
        for from in [QpState::Reset, QpState::Init, QpState::Rtr, QpState::Rts, QpState::Sqd, QpState::Error] {
            for to in STATES {
                let (req, _) = expected_rule(qp_type, from, to);
                let mut cases = vec![req];
                cases.extend(AttrMask::all().iter().map(|b| req ^ b));
                for supplied in cases {
                    let qp = f.qp_in(qp_type, from);
                    let before = qp.query().unwrap();
                    let mut want = expect(qp_type, from, to, supplied);
                    let r = qp.modify(&attr_with(to, supplied));
                    if want == Outcome::Ok && supplied.contains(AttrMask::ALT_PATH) {
                        assert!(matches!(r, Err(VerbsError::NotSupported(_))), "{r:?}");
                        want = Outcome::Invalid; // for the unchanged-state check below
                    } else {
                        assert_eq!(classify(r), want, "{qp_type:?} {from}→{to} with {supplied:?}");
                    }
                    let after = qp.query().unwrap();
                    if want == Outcome::Ok {
                        assert_eq!(after.qp_state, to);
                    } else {
                        assert_eq!(after, before, "a failed Modify changed the QP");
                    }
                    qp.destroy().unwrap();
                }
            }
        }
    }
}

/// Rule MOD-RESET-INIT-RC-1, MOD-RESET-INIT-RC-2, MOD-RESET-INIT-RC-3
#[test]
fn rc_reset_to_init_needs_each_enable_pkey_and_port() {
    let f = fixture();
    let full = required(QpType::Rc, QpState::Init);
    for bit in [AttrMask::READ_EN, AttrMask::WRITE_EN, AttrMask::ATOMIC_EN, AttrMask::PKEY_INDEX, AttrMask::PORT] {
        let qp = f.qp(QpType::Rc);
        assert_eq!(qp.modify(&attr_with(QpState::Init, full - bit)), Err(VerbsError::MissingAttribute(bit)));
        assert_eq!(qp.state().unwrap(), QpState::Reset);
    }
    // The libibverbs-style access flags supply all three enables at once.
    let qp = f.qp(QpType::Rc);
    qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(Access::REMOTE_WRITE)).unwrap();
    assert_eq!(qp.query().unwrap().qp_access_flags, Access::REMOTE_WRITE);
}

/// Rule MOD-RESET-INIT-UC-1, MOD-RESET-INIT-UC-2, MOD-RESET-INIT-UC-3
#[test]
fn uc_reset_to_init_needs_write_enable_pkey_and_port() {
    let f = fixture();
    let full = required(QpType::Uc, QpState::Init);
    for bit in [AttrMask::WRITE_EN, AttrMask::PKEY_INDEX, AttrMask::PORT] {
        let qp = f.qp(QpType::Uc);
        assert_eq!(qp.modify(&attr_with(QpState::Init, full - bit)), Err(VerbsError::MissingAttribute(bit)));
    }
    // A UC QP has no inbound Read or Atomic to enable.
    let qp = f.qp(QpType::Uc);
    let r = qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(Access::REMOTE_WRITE | Access::REMOTE_READ));
    assert!(matches!(r, Err(VerbsError::InvalidAttribute(..))));
    qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(Access::REMOTE_WRITE)).unwrap();
}

/// Rule MOD-RESET-INIT-UD-1, MOD-RESET-INIT-UD-2, MOD-RESET-INIT-UD-3
#[test]
fn ud_reset_to_init_needs_pkey_qkey_and_port_and_refuses_enables() {
    let f = fixture();
    let full = required(QpType::Ud, QpState::Init);
    for bit in [AttrMask::PKEY_INDEX, AttrMask::QKEY, AttrMask::PORT] {
        let qp = f.qp(QpType::Ud);
        assert_eq!(qp.modify(&attr_with(QpState::Init, full - bit)), Err(VerbsError::MissingAttribute(bit)));
    }
    let qp = f.qp(QpType::Ud);
    let r = qp.modify(&attr_with(QpState::Init, full).access(Access::empty()));
    assert!(matches!(r, Err(VerbsError::InvalidAttribute(m, _)) if m == AttrMask::WRITE_EN), "{r:?}");
    qp.modify(&attr_with(QpState::Init, full)).unwrap();
    assert_eq!(qp.query().unwrap().qkey, 0x1111_1111);
}

/// The RD rows of the tables, checked directly (tests/rd.rs walks live RD QPs through them).
/// Rule MOD-RESET-INIT-RD-1, MOD-RESET-INIT-RD-2, MOD-INIT-RTR-RD-1, MOD-RTR-RTS-RD-1
#[test]
fn rd_table_entries() {
    let rd = QpType::Rd;
    let init = AttrMask::READ_EN | AttrMask::WRITE_EN | AttrMask::ATOMIC_EN | AttrMask::QKEY;
    assert_eq!(check_modify(rd, QpState::Reset, QpState::Init, init), Ok(()));
    for bit in init.iter() {
        assert_eq!(check_modify(rd, QpState::Reset, QpState::Init, init - bit), Err(VerbsError::MissingAttribute(bit)));
    }
    assert_eq!(
        check_modify(rd, QpState::Init, QpState::Rtr, AttrMask::empty()),
        Err(VerbsError::MissingAttribute(AttrMask::MAX_DEST_RD_ATOMIC))
    );
    assert_eq!(
        check_modify(rd, QpState::Rtr, QpState::Rts, AttrMask::empty()),
        Err(VerbsError::MissingAttribute(AttrMask::MAX_RD_ATOMIC))
    );
    assert!(check_modify(rd, QpState::Rtr, QpState::Rts, AttrMask::MAX_RD_ATOMIC | AttrMask::SQ_PSN).is_err());
}

/// Rule MOD-INIT-RTR-RC-1, MOD-INIT-RTR-RC-2, MOD-INIT-RTR-RC-3, MOD-INIT-RTR-RC-4
#[test]
fn rc_init_to_rtr_requirements_and_epsn() {
    let f = fixture();
    let full = required(QpType::Rc, QpState::Rtr);
    for bit in full.iter() {
        let qp = f.qp_in(QpType::Rc, QpState::Init);
        assert_eq!(qp.modify(&attr_with(QpState::Rtr, full - bit)), Err(VerbsError::MissingAttribute(bit)));
    }
    let qp = f.qp_in(QpType::Rc, QpState::Init);
    qp.modify(&QpAttr::to_rtr(remote_av(), 0x77).rq_psn(0xABCDEF).max_dest_rd_atomic(16)).unwrap();
    let a = qp.query().unwrap();
    assert_eq!((a.rq_psn, a.dest_qp_num, a.max_dest_rd_atomic), (0xABCDEF, 0x77, 16));
    assert_eq!(a.av, Some(remote_av()));
}

/// Rule MOD-INIT-RTR-RC-5
#[test]
fn incomplete_grh_is_a_missing_attribute() {
    let f = fixture();
    let mut av = remote_av();
    type Clear = fn(&mut GlobalRoute);
    let clears: [Clear; 5] = [
        |g| g.traffic_class = None,
        |g| g.flow_label = None,
        |g| g.hop_limit = None,
        |g| g.sgid_index = None,
        |g| g.dgid = None,
    ];
    for clear in clears {
        let qp = f.qp_in(QpType::Rc, QpState::Init);
        av.ah.grh = remote_av().ah.grh;
        clear(&mut av.ah.grh);
        let r = qp.modify(&QpAttr::to_rtr(av, 1).rq_psn(0).max_dest_rd_atomic(1));
        assert_eq!(r, Err(VerbsError::MissingAttribute(AttrMask::AV)));
        assert_eq!(qp.state().unwrap(), QpState::Init);
    }
}

/// Rule MOD-INIT-RTR-RC-6
#[test]
fn rc_av_retry_fields_are_optional_and_take_effect() {
    let f = fixture();
    let qp = f.qp_in(QpType::Rc, QpState::Init);
    let mut av = remote_av();
    av.timeout = Some(9);
    av.retry_cnt = Some(3);
    av.rnr_retry = Some(5);
    qp.modify(&QpAttr::to_rtr(av, 1).rq_psn(0).max_dest_rd_atomic(1)).unwrap();
    let a = qp.query().unwrap();
    assert_eq!((a.timeout, a.retry_cnt, a.rnr_retry), (9, 3, 5));
    // RTR→RTS still requires them, and its values win.
    let r = qp.modify(&QpAttr::to_rts().sq_psn(0).max_rd_atomic(1));
    assert_eq!(r, Err(VerbsError::MissingAttribute(AttrMask::TIMEOUT | AttrMask::RETRY_CNT | AttrMask::RNR_RETRY)));
    qp.modify(&QpAttr::to_rts().sq_psn(0).max_rd_atomic(1).timeout(14).retry_cnt(7).rnr_retry(6)).unwrap();
    let a = qp.query().unwrap();
    assert_eq!((a.timeout, a.retry_cnt, a.rnr_retry), (14, 7, 6));
}

/// Rule MOD-INIT-RTR-UC-1, MOD-INIT-RTR-UC-2, MOD-INIT-RTR-UC-3
#[test]
fn uc_init_to_rtr_requirements_and_epsn() {
    let f = fixture();
    let full = required(QpType::Uc, QpState::Rtr);
    for bit in full.iter() {
        let qp = f.qp_in(QpType::Uc, QpState::Init);
        assert_eq!(qp.modify(&attr_with(QpState::Rtr, full - bit)), Err(VerbsError::MissingAttribute(bit)));
    }
    let qp = f.qp_in(QpType::Uc, QpState::Init);
    qp.modify(&QpAttr::to_rtr(remote_av(), 5).rq_psn(0x42)).unwrap();
    assert_eq!(qp.query().unwrap().rq_psn, 0x42);
}

/// Rule MOD-RTR-RTS-RC-1, MOD-RTR-RTS-RC-2, MOD-RTR-RTS-RC-3, MOD-RTR-RTS-RC-4, MOD-RTR-RTS-RC-5
/// Rule MOD-RTR-RTS-UC-1, MOD-RTR-RTS-UD-1
#[test]
fn rtr_to_rts_requirements() {
    let f = fixture();
    for qp_type in [QpType::Rc, QpType::Uc, QpType::Ud] {
        let full = required(qp_type, QpState::Rts);
        for bit in full.iter() {
            let qp = f.qp_in(qp_type, QpState::Rtr);
            assert_eq!(qp.modify(&attr_with(QpState::Rts, full - bit)), Err(VerbsError::MissingAttribute(bit)));
        }
        let qp = f.qp_in(qp_type, QpState::Rtr);
        qp.modify(&attr_with(QpState::Rts, full)).unwrap();
        assert_eq!(qp.query().unwrap().sq_psn, 0x20);
    }
}

/// Rule MOD-RTS-SQD-1, MOD-RTS-SQD-2, QPS-SQD-8
#[test]
fn rts_to_sqd_takes_only_the_drained_event_request() {
    let f = fixture();
    let qp = f.qp_in(QpType::Rc, QpState::Rts);
    let r = qp.modify(&QpAttr::to_sqd().timeout(3));
    assert!(matches!(r, Err(VerbsError::InvalidAttribute(m, _)) if m == AttrMask::TIMEOUT));
    qp.modify(&QpAttr::to_sqd()).unwrap();
    let a = qp.query().unwrap();
    assert_eq!(a.qp_state, QpState::Sqd);
    assert!(!a.sq_draining, "nothing in progress: drained at once, still SQD");
}

/// Rule MOD-SQD-RTS-1, MOD-SQD-RTS-2, QPS-SQD-9
#[test]
fn sqd_to_rts_with_and_without_retuning() {
    let f = fixture();
    let qp = f.qp_in(QpType::Rc, QpState::Sqd);
    qp.modify(&QpAttr::to_rts()).unwrap();
    qp.modify(&QpAttr::to_sqd()).unwrap();
    // Every SQD→RTS parameter is optional; retuning is accepted once drained.
    qp.modify(&QpAttr::to_rts().timeout(20).retry_cnt(2).rnr_retry(1).max_dest_rd_atomic(8).min_rnr_timer(3)).unwrap();
    let a = qp.query().unwrap();
    assert_eq!((a.qp_state, a.timeout, a.retry_cnt, a.rnr_retry, a.max_dest_rd_atomic), (QpState::Rts, 20, 2, 1, 8));
}

/// A port change at SQD→RTS: softhca has one port, so the same port is accepted and another is
/// refused; a device configured without port change support says `NotSupported`.
/// Rule MOD-SQD-RTS-RC-1, MOD-GEN-11
#[test]
fn sqd_to_rts_port_change() {
    let f = fixture();
    let qp = f.qp_in(QpType::Rc, QpState::Sqd);
    assert!(matches!(qp.modify(&QpAttr::to_rts().port_num(2)), Err(VerbsError::InvalidAttribute(..))));
    qp.modify(&QpAttr::to_rts().port_num(1)).unwrap();

    let mut cfg = DeviceConfig::default().seed(3);
    cfg.attr.phys_port_cnt = 2;
    let f2 = fixture_with(cfg);
    let qp = f2.qp_in(QpType::Rc, QpState::Sqd);
    assert!(matches!(qp.modify(&QpAttr::to_rts().port_num(2)), Err(VerbsError::NotSupported(_))));
    assert_eq!(qp.query().unwrap().port_num, 1);
}

/// Rule MOD-GEN-8, MOD-GEN-10
#[test]
fn new_work_queue_sizes() {
    let f = fixture();
    let qp = f.qp_in(QpType::Rc, QpState::Init);
    let sges = [];
    let wrs: Vec<RecvWr> = (0..10).map(|i| RecvWr::new(i, &sges)).collect();
    qp.post_recv(&wrs).unwrap();
    let base = required(QpType::Rc, QpState::Rtr);
    let small = attr_with(QpState::Rtr, base).cap(WqSizes { max_send_wr: 4, max_recv_wr: 9 });
    assert!(matches!(qp.modify(&small), Err(VerbsError::InvalidAttribute(m, _)) if m == AttrMask::CAP));
    assert_eq!(qp.state().unwrap(), QpState::Init);
    let ok = attr_with(QpState::Rtr, base).cap(WqSizes { max_send_wr: 4, max_recv_wr: 10 });
    qp.modify(&ok).unwrap();
    let cap = qp.query().unwrap().cap;
    assert_eq!((cap.max_send_wr, cap.max_recv_wr), (4, 10));
    assert_eq!(qp.post_recv(&[RecvWr::new(99, &sges)]).unwrap_err().error, VerbsError::QueueFull);
    assert_eq!(qp.outstanding().unwrap(), (0, 10), "queued WQEs survive the resize in place");

    let mut cfg = DeviceConfig::default().seed(4);
    cfg.attr.resize_wq = false;
    let f2 = fixture_with(cfg);
    let qp = f2.qp_in(QpType::Rc, QpState::Init);
    assert!(matches!(qp.modify(&ok), Err(VerbsError::NotSupported(_))));
    assert_eq!(qp.state().unwrap(), QpState::Init);
}

/// Each out-of-range value is refused with `InvalidAttribute` and changes nothing.
/// Rule MOD-GEN-11, MOD-GEN-13, MOD-GEN-5, PKT-ROCE-4
#[test]
fn out_of_range_values_are_invalid_attributes() {
    let f = fixture();
    let rtr = || QpAttr::to_rtr(remote_av(), 1).rq_psn(0).max_dest_rd_atomic(1);
    let rts = || QpAttr::to_rts().sq_psn(0).max_rd_atomic(1).timeout(14).retry_cnt(7).rnr_retry(7);
    let mut av_big_mtu = remote_av();
    av_big_mtu.path_mtu = Mtu::Mtu4096;
    let mut cfg = DeviceConfig::default().seed(5);
    cfg.port.active_mtu = Mtu::Mtu1024;
    let f_small = fixture_with(cfg);
    let mut no_grh = remote_av();
    no_grh.ah.is_global = false;
    let mut bad_sgid = remote_av();
    bad_sgid.ah.grh.sgid_index = Some(9);
    let mut bad_retry_in_av = remote_av();
    bad_retry_in_av.retry_cnt = Some(8);

    let init_cases: Vec<QpAttr> = vec![
        QpAttr::to_init().port(1).pkey_index(1).access(Access::empty()),
        QpAttr::to_init().port(2).pkey_index(0).access(Access::empty()),
        QpAttr::to_init().port(0).pkey_index(0).access(Access::empty()),
    ];
    for a in init_cases {
        let qp = f.qp(QpType::Rc);
        assert!(matches!(qp.modify(&a), Err(VerbsError::InvalidAttribute(..))), "{a:?}");
        assert_eq!(qp.state().unwrap(), QpState::Reset);
    }
    let rtr_cases: Vec<QpAttr> = vec![
        rtr().rq_psn(1 << 24),
        rtr().dest_qp_num(1 << 24),
        rtr().max_dest_rd_atomic(200),
        rtr().min_rnr_timer(32),
        rtr().av(no_grh),
        rtr().av(bad_sgid),
        rtr().av(bad_retry_in_av),
    ];
    for a in rtr_cases {
        let qp = f.qp_in(QpType::Rc, QpState::Init);
        assert!(matches!(qp.modify(&a), Err(VerbsError::InvalidAttribute(..))), "{a:?}");
        assert_eq!(qp.state().unwrap(), QpState::Init);
    }
    let qp = f_small.qp_in(QpType::Rc, QpState::Init);
    assert!(matches!(qp.modify(&rtr().av(av_big_mtu)), Err(VerbsError::InvalidAttribute(..))));
    let rts_cases: Vec<QpAttr> = vec![
        rts().retry_cnt(8),
        rts().rnr_retry(8),
        rts().timeout(32),
        rts().sq_psn(0x100_0000),
        rts().max_rd_atomic(129),
    ];
    for a in rts_cases {
        let qp = f.qp_in(QpType::Rc, QpState::Rtr);
        let before = qp.query().unwrap();
        assert!(matches!(qp.modify(&a), Err(VerbsError::InvalidAttribute(..))), "{a:?}");
        assert_eq!(qp.query().unwrap(), before);
    }
    assert!(matches!(Mtu::from_bytes(1500), Err(VerbsError::InvalidAttribute(..))));
    assert!(matches!(Mtu::from_code(6), Err(VerbsError::InvalidAttribute(..))));
    assert!(matches!(Mtu::from_code(0), Err(VerbsError::InvalidAttribute(..))));
    assert_eq!(Mtu::from_bytes(4096).unwrap(), Mtu::Mtu4096);
    assert_eq!(Mtu::from_code(1).unwrap().bytes(), 256);
}

/// Rule QPT-SW-9, QPT-SW-10, QPS-GEN-1, QPS-GEN-2
#[test]
fn self_transitions_modify_attributes_only() {
    let f = fixture();
    let qp = f.qp(QpType::Rc);
    qp.modify(&QpAttr::to_reset()).unwrap();
    assert_eq!(qp.state().unwrap(), QpState::Reset);
    drive(&qp, QpState::Init);
    qp.modify(&QpAttr::to_init().remote_read(true)).unwrap();
    let a = qp.query().unwrap();
    assert_eq!(a.qp_state, QpState::Init);
    assert!(a.qp_access_flags.contains(Access::REMOTE_READ));
    drive_more(&qp);
    qp.modify(&QpAttr::to_rts().min_rnr_timer(20)).unwrap();
    assert_eq!(qp.query().unwrap().min_rnr_timer, 20);
    qp.modify(&QpAttr::to_sqd()).unwrap();
    qp.modify(&QpAttr::new(QpState::Sqd).retry_cnt(1)).unwrap();
    assert_eq!(qp.query().unwrap().retry_cnt, 1);
    qp.modify(&QpAttr::to_error()).unwrap();
    qp.modify(&QpAttr::to_error()).unwrap();
    assert_eq!(qp.state().unwrap(), QpState::Error);
}

fn drive_more(qp: &Qp) {
    qp.modify(&attr_with(QpState::Rtr, required(QpType::Rc, QpState::Rtr))).unwrap();
    qp.modify(&attr_with(QpState::Rts, required(QpType::Rc, QpState::Rts))).unwrap();
}

/// Reset clears the attributes; Error and Reset take no parameter.
/// Rule QPT-SW-7, QPT-SW-8, MOD-GEN-12, QPS-RESET-1
#[test]
fn reset_and_error_take_no_parameters_and_reset_clears() {
    let f = fixture();
    for s in [QpState::Init, QpState::Rtr, QpState::Rts, QpState::Sqd] {
        let qp = f.qp_in(QpType::Rc, s);
        let r = qp.modify(&QpAttr::to_error().qkey(1));
        assert!(matches!(r, Err(VerbsError::InvalidAttribute(..))));
        let r = qp.modify(&QpAttr::to_reset().port_num(1));
        assert!(matches!(r, Err(VerbsError::InvalidAttribute(..))));
        qp.modify(&QpAttr::to_error()).unwrap();
        qp.modify(&QpAttr::to_reset()).unwrap();
        let a = qp.query().unwrap();
        assert_eq!(a.qp_state, QpState::Reset);
        assert_eq!((a.dest_qp_num, a.av, a.qp_access_flags), (0, None, Access::empty()));
    }
    // Reset → Error is accepted too (Appendix B: Linux refuses it).
    let qp = f.qp(QpType::Ud);
    qp.modify(&QpAttr::to_error()).unwrap();
    assert_eq!(qp.state().unwrap(), QpState::Error);
}

/// Destroy QP works in every state, and the handle is dead afterwards.
/// Rule QPT-SW-12, MOD-GEN-2, MOD-GEN-1
#[test]
fn destroy_in_every_state_and_dead_handles() {
    let f = fixture();
    for s in [QpState::Reset, QpState::Init, QpState::Rtr, QpState::Rts, QpState::Sqd, QpState::Error] {
        let qp = f.qp_in(QpType::Rc, s);
        qp.destroy().unwrap();
        assert_eq!(qp.modify(&QpAttr::to_reset()), Err(VerbsError::InvalidQpHandle));
        assert_eq!(qp.query().unwrap_err(), VerbsError::InvalidQpHandle);
        assert_eq!(qp.destroy(), Err(VerbsError::InvalidQpHandle));
    }
    let qp = f.qp(QpType::Rc);
    f.ctx.close();
    assert_eq!(qp.modify(&QpAttr::to_error()), Err(VerbsError::InvalidHcaHandle));
}

/// Rule QPT-AUTO-7
#[test]
fn reset_and_init_are_never_left_without_modify() {
    let f = fixture();
    let qp = f.qp_in(QpType::Rc, QpState::Init);
    let sges = [];
    for i in 0..5 {
        qp.post_recv(&[RecvWr::new(i, &sges)]).unwrap();
        assert!(qp.post_send(&[SendWr::send(i, &sges)]).is_err());
    }
    assert_eq!(qp.state().unwrap(), QpState::Init);
    let qp = f.qp(QpType::Rc);
    assert!(qp.post_recv(&[RecvWr::new(0, &sges)]).is_err());
    assert_eq!(qp.state().unwrap(), QpState::Reset);
}

/// Appendix B: where the digest accepts more than Linux, the Rust API follows the digest.
/// Rule B-1
#[test]
fn rust_api_follows_the_digest_where_linux_differs() {
    let f = fixture();
    // Reset → Error.
    let qp = f.qp(QpType::Rc);
    qp.modify(&QpAttr::to_error()).unwrap();
    // Init → RTR without the Minimum RNR NAK Timer, and with the RC retry values in the AV.
    let qp = f.qp_in(QpType::Rc, QpState::Init);
    let mut av = remote_av();
    av.timeout = Some(10);
    av.retry_cnt = Some(5);
    av.rnr_retry = Some(6);
    qp.modify(&QpAttr::to_rtr(av, 5).rq_psn(0).max_dest_rd_atomic(1)).unwrap();
    // New work queue sizes through Modify QP (Linux refuses IBV_QP_CAP there).
    qp.modify(
        &QpAttr::to_rts()
            .sq_psn(0)
            .timeout(14)
            .retry_cnt(7)
            .rnr_retry(7)
            .max_rd_atomic(1)
            .cap(WqSizes { max_send_wr: 64, max_recv_wr: 64 }),
    )
    .unwrap();
    // SQD → RTS with attributes Linux only takes at SQD → SQD.
    qp.modify(&QpAttr::to_sqd()).unwrap();
    qp.modify(&QpAttr::to_rts().max_dest_rd_atomic(4).min_rnr_timer(3).pkey_index(0).av(remote_av())).unwrap();
    assert_eq!(qp.query().unwrap().qp_state, QpState::Rts);
}

/// The Raw QPs' table entry, checked directly (`tests/raw.rs` takes real ones through it):
/// only the port at Reset → Init, nothing anywhere else.
/// Rule MOD-RAW-1
#[test]
fn raw_table_entries() {
    for t in [QpType::RawIpv6, QpType::RawEthertype] {
        assert_eq!(check_modify(t, QpState::Reset, QpState::Init, AttrMask::PORT), Ok(()));
        assert_eq!(
            check_modify(t, QpState::Reset, QpState::Init, AttrMask::empty()),
            Err(VerbsError::MissingAttribute(AttrMask::PORT))
        );
        assert!(matches!(
            check_modify(t, QpState::Reset, QpState::Init, AttrMask::PORT | AttrMask::PKEY_INDEX),
            Err(VerbsError::InvalidAttribute(..))
        ));
        assert_eq!(check_modify(t, QpState::Init, QpState::Rtr, AttrMask::empty()), Ok(()));
        assert!(matches!(
            check_modify(t, QpState::Rtr, QpState::Rts, AttrMask::SQ_PSN),
            Err(VerbsError::InvalidAttribute(..))
        ));
    }
}
