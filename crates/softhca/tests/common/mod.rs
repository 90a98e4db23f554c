//! Shared fixtures for the verbs conformance tests.
#![allow(dead_code)]

pub mod pair;

use softhca::transport::AttrMask;
use softhca::*;

pub struct Fixture {
    pub ctx: Context,
    pub pd: Pd,
    pub cq: Cq,
}

pub fn fixture() -> Fixture {
    fixture_with(DeviceConfig::default().seed(1))
}

pub fn fixture_with(config: DeviceConfig) -> Fixture {
    let ctx = Context::create(config).expect("device");
    let pd = ctx.alloc_pd().expect("pd");
    let cq = ctx.create_cq(256).expect("cq");
    Fixture { ctx, pd, cq }
}

impl Fixture {
    pub fn qp(&self, qp_type: QpType) -> Qp {
        self.pd.create_qp(&QpInitAttr::new(qp_type, &self.cq, &self.cq)).expect("qp")
    }

    /// A QP of `qp_type` in `state`, reached through Modify QP with exactly the required
    /// attributes of each step. SQE cannot be reached without traffic.
    pub fn qp_in(&self, qp_type: QpType, state: QpState) -> Qp {
        let qp = self.qp(qp_type);
        drive(&qp, state);
        qp
    }
}

pub fn remote_av() -> AddressVector {
    AddressVector::new(AhAttr::roce(Gid::from_ipv4("127.0.0.2".parse().unwrap()), 0), Mtu::Mtu1024)
}

/// A valid value for every parameter in `mask`, and nothing else.
pub fn attr_with(state: QpState, mask: AttrMask) -> QpAttr {
    let mut a = QpAttr::new(state);
    let set = |bit: AttrMask| mask.contains(bit);
    if set(AttrMask::READ_EN) {
        a.remote_read = Some(true);
    }
    if set(AttrMask::WRITE_EN) {
        a.remote_write = Some(true);
    }
    if set(AttrMask::ATOMIC_EN) {
        a.remote_atomic = Some(true);
    }
    if set(AttrMask::PKEY_INDEX) {
        a.pkey_index = Some(0);
    }
    if set(AttrMask::QKEY) {
        a.qkey = Some(0x1111_1111);
    }
    if set(AttrMask::PORT) {
        a.port_num = Some(1);
    }
    if set(AttrMask::RQ_PSN) {
        a.rq_psn = Some(0x10);
    }
    if set(AttrMask::MAX_DEST_RD_ATOMIC) {
        a.max_dest_rd_atomic = Some(4);
    }
    if set(AttrMask::AV) {
        a.av = Some(remote_av());
    }
    if set(AttrMask::DEST_QPN) {
        a.dest_qp_num = Some(0x123);
    }
    if set(AttrMask::ALT_PATH) {
        a.alt_path = Some(AltPath { av: remote_av(), pkey_index: 0, port_num: 1, timeout: 14 });
    }
    if set(AttrMask::CAP) {
        a.cap = Some(WqSizes { max_send_wr: 200, max_recv_wr: 200 });
    }
    if set(AttrMask::MIN_RNR_TIMER) {
        a.min_rnr_timer = Some(12);
    }
    if set(AttrMask::TIMEOUT) {
        a.timeout = Some(14);
    }
    if set(AttrMask::SQ_PSN) {
        a.sq_psn = Some(0x20);
    }
    if set(AttrMask::RETRY_CNT) {
        a.retry_cnt = Some(7);
    }
    if set(AttrMask::RNR_RETRY) {
        a.rnr_retry = Some(7);
    }
    if set(AttrMask::MAX_RD_ATOMIC) {
        a.max_rd_atomic = Some(4);
    }
    if set(AttrMask::PATH_MIG_STATE) {
        a.path_mig_state = Some(MigState::Migrated);
    }
    if set(AttrMask::SQD_EVENT) {
        a.en_sqd_async_notify = Some(true);
    }
    a
}

/// The required parameters of each step, written out from the digest's tables.
pub fn required(qp_type: QpType, to: QpState) -> AttrMask {
    use AttrMask as M;
    match (qp_type, to) {
        (QpType::Rc, QpState::Init) => M::READ_EN | M::WRITE_EN | M::ATOMIC_EN | M::PKEY_INDEX | M::PORT,
        (QpType::Uc, QpState::Init) => M::WRITE_EN | M::PKEY_INDEX | M::PORT,
        (QpType::Ud, QpState::Init) => M::PKEY_INDEX | M::QKEY | M::PORT,
        (QpType::Rc, QpState::Rtr) => M::RQ_PSN | M::MAX_DEST_RD_ATOMIC | M::AV | M::DEST_QPN,
        (QpType::Uc, QpState::Rtr) => M::RQ_PSN | M::AV | M::DEST_QPN,
        (QpType::Ud, QpState::Rtr) => M::empty(),
        (QpType::Rc, QpState::Rts) => M::TIMEOUT | M::SQ_PSN | M::RETRY_CNT | M::RNR_RETRY | M::MAX_RD_ATOMIC,
        (QpType::Uc | QpType::Ud, QpState::Rts) => M::SQ_PSN,
        _ => M::empty(),
    }
}

/// Walks `qp` from Reset to `state` along Reset → Init → RTR → RTS → SQD, or to Error.
pub fn drive(qp: &Qp, state: QpState) {
    let t = qp.qp_type();
    let path: &[QpState] = match state {
        QpState::Reset => &[],
        QpState::Init => &[QpState::Init],
        QpState::Rtr => &[QpState::Init, QpState::Rtr],
        QpState::Rts => &[QpState::Init, QpState::Rtr, QpState::Rts],
        QpState::Sqd => &[QpState::Init, QpState::Rtr, QpState::Rts, QpState::Sqd],
        QpState::Error => &[QpState::Error],
        QpState::Sqe => panic!("SQE is entered only automatically"),
    };
    for &s in path {
        qp.modify(&attr_with(s, required(t, s))).unwrap_or_else(|e| panic!("{t:?} → {s}: {e}"));
    }
    assert_eq!(qp.state().unwrap(), state);
}

pub fn poll_all(cq: &Cq) -> Vec<Wc> {
    let mut out = Vec::new();
    let mut wcs = [Wc::default(); 16];
    loop {
        let n = cq.poll(&mut wcs).unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&wcs[..n]);
    }
}

/// Moves datagrams between two devices at time 0 until neither has one to send (a lossless
/// link with no timers due: for tests whose exchanges complete at once).
pub fn exchange(a: &Context, b: &Context) {
    let mut buf = vec![0u8; softhca::transport::MAX_DATAGRAM];
    loop {
        let mut moved = false;
        for (src, dst) in [(a, b), (b, a)] {
            while let Some(n) = src.transmit(0, &mut buf) {
                dst.receive(0, &buf[..n]);
                moved = true;
            }
        }
        if !moved {
            return;
        }
    }
}
