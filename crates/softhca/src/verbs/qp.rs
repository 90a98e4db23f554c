//! Queue Pairs: Create, Query, Modify (through the tables of `transport::state`), Destroy, and
//! Post Send / Post Receive with the posting rules of each state (QPS).
//!
//! What the transport engine works on (`transport::qp`: the attributes, the requester and the
//! responder, the consumer ends of the SQ and the RQ) is behind one per-QP lock, `core`, and
//! nothing device-wide is taken per QP. Posting does not take `core`: the SQ and the RQ are
//! rings (`transport::wq`) whose producer ends have a lock of their own that the engine never
//! takes, and posters read the QP state from an atomic mirror of `attrs.qp_state`. Locks are
//! always taken in this order: `core`, the SQ's producer lock, the RQ's producer lock, a CQ's;
//! an XRC target's engine also looks up its messages' SRQs under `core` (the device's SRQ
//! table, read, then the SRQ's own lock), which nothing takes in the other order.
//!
//! # Posting without `core`
//!
//! A post to a queue in a state where WRs queue (RTS, SQD, SQE for the SQ; Init through SQE for
//! the RQ) holds only the ring's producer lock. The state changes a poster must not straddle
//! (Modify QP, which may Reset or resize, and Destroy QP) hold `core` and the producer locks
//! together, so none of them can happen in the middle of a post. The engine holds only `core`
//! when it moves a QP to Error (or SQE), though, and a WQE published just after its flush read
//! the producer index would never complete. So a poster publishes (a SeqCst store of the
//! producer index) and then loads the state (SeqCst), while the engine stores the state
//! (SeqCst) and then loads the producer index (SeqCst) to flush. In the single total order of
//! SeqCst operations one of the two loads follows the other side's store: either the flush sees
//! the WQE, or the poster sees Error and, under `core`, flushes what is left (a flush is
//! idempotent). A WQE that misses an entry to SQE waits in the SQ for SQE→RTS like one posted a
//! moment later. Posting in Error takes `core`: it flushes each WR at once, in post order, after
//! anything a racing poster left (QPS-ERR-3, QPS-ERR-4).

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::ah::validate_ah_attr;
use super::cq::Cq;
use super::device::{give, take, Context, DeviceInner};
use super::error::{PostError, Result, VerbsError};
use super::pd::Pd;
use super::types::{Access, AddressVector, Gid, MigState, QpState, QpType, SpecialQp, GSI_QKEY, GSI_QPN};
use super::wr::{prepare_recv, prepare_send, RecvWr, SendWr, MAX_MSG_SIZE};
use crate::transport::qp::{flush_cqe, wc_opcode_of, QpCore, QpInner};
pub use crate::transport::qp::{AltPath, QpAttrs, QpCap};
use crate::transport::state::check_modify;
use crate::transport::wq::{Producer, Ring};
use crate::transport::wqe::{push_sges, sge_total, wr_allowed, BindRequest, RecvWqe, SendFlags, SendWqe, WrOpcode};
use crate::types::AttrMask;

/// Create QP input (`ibv_qp_init_attr`).
#[derive(Debug, Clone)]
pub struct QpInitAttr {
    pub qp_type: QpType,
    pub send_cq: Cq,
    pub recv_cq: Cq,
    pub cap: QpCap,
    /// Signal every SQ WR (true) or only those that ask (false).
    pub sq_sig_all: bool,
    /// Take receive WQEs from this SRQ instead of an RQ of the QP's own.
    pub srq: Option<super::srq::Srq>,
    /// The reliable datagram domain of an RD QP (CRT-QP-2).
    pub rdd: Option<super::eec::Rdd>,
}

impl QpInitAttr {
    /// A QP of `qp_type` with modest default queues: 128 WRs, 4 SGEs each way, 64 inline bytes.
    pub fn new(qp_type: QpType, send_cq: &Cq, recv_cq: &Cq) -> Self {
        QpInitAttr {
            qp_type,
            send_cq: send_cq.clone(),
            recv_cq: recv_cq.clone(),
            cap: QpCap { max_send_wr: 128, max_recv_wr: 128, max_send_sge: 4, max_recv_sge: 4, max_inline_data: 64 },
            sq_sig_all: false,
            srq: None,
            rdd: None,
        }
    }

    /// An RD QP in `rdd`.
    pub fn rd(send_cq: &Cq, recv_cq: &Cq, rdd: &super::eec::Rdd) -> Self {
        QpInitAttr { rdd: Some(rdd.clone()), ..Self::new(QpType::Rd, send_cq, recv_cq) }
    }

    pub fn srq(mut self, srq: &super::srq::Srq) -> Self {
        self.srq = Some(srq.clone());
        self
    }

    pub fn rc(send_cq: &Cq, recv_cq: &Cq) -> Self {
        Self::new(QpType::Rc, send_cq, recv_cq)
    }

    pub fn uc(send_cq: &Cq, recv_cq: &Cq) -> Self {
        Self::new(QpType::Uc, send_cq, recv_cq)
    }

    pub fn ud(send_cq: &Cq, recv_cq: &Cq) -> Self {
        Self::new(QpType::Ud, send_cq, recv_cq)
    }

    pub fn max_send_wr(mut self, n: u32) -> Self {
        self.cap.max_send_wr = n;
        self
    }

    pub fn max_recv_wr(mut self, n: u32) -> Self {
        self.cap.max_recv_wr = n;
        self
    }

    pub fn max_send_sge(mut self, n: u32) -> Self {
        self.cap.max_send_sge = n;
        self
    }

    pub fn max_recv_sge(mut self, n: u32) -> Self {
        self.cap.max_recv_sge = n;
        self
    }

    pub fn max_inline_data(mut self, n: u32) -> Self {
        self.cap.max_inline_data = n;
        self
    }

    pub fn sq_sig_all(mut self, all: bool) -> Self {
        self.sq_sig_all = all;
        self
    }
}

/// New SQ / RQ sizes for Modify QP (MOD-GEN-8, MOD-GEN-10).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WqSizes {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
}

/// A Modify QP request: the next state plus the parameters supplied. Every `None` is a
/// parameter not supplied; which ones a transition requires or accepts is in
/// `transport::state`.
#[derive(Debug, Clone, Default)]
pub struct QpAttr {
    pub qp_state: QpState,
    /// Inbound RDMA Read / RDMA Write / Atomic enables, as libibverbs' `qp_access_flags`. The
    /// enables it supplies depend on the service type: all three for RC and RD, the Write
    /// enable for UC (Read or Atomic bits there are refused), and the Write enable for UD,
    /// where no enable exists, so UD refuses it.
    pub access: Option<Access>,
    /// Individual enables, for supplying exactly one of them.
    pub remote_read: Option<bool>,
    pub remote_write: Option<bool>,
    pub remote_atomic: Option<bool>,
    pub pkey_index: Option<u16>,
    pub qkey: Option<u32>,
    pub port_num: Option<u8>,
    pub rq_psn: Option<u32>,
    pub max_dest_rd_atomic: Option<u8>,
    pub av: Option<AddressVector>,
    pub dest_qp_num: Option<u32>,
    pub alt_path: Option<AltPath>,
    pub cap: Option<WqSizes>,
    pub min_rnr_timer: Option<u8>,
    pub timeout: Option<u8>,
    pub sq_psn: Option<u32>,
    pub retry_cnt: Option<u8>,
    pub rnr_retry: Option<u8>,
    pub max_rd_atomic: Option<u8>,
    pub path_mig_state: Option<MigState>,
    pub en_sqd_async_notify: Option<bool>,
}

macro_rules! setters {
    ($($name:ident: $ty:ty),* $(,)?) => {
        $(
            pub fn $name(mut self, v: $ty) -> Self {
                self.$name = Some(v);
                self
            }
        )*
    };
}

impl QpAttr {
    pub fn new(qp_state: QpState) -> Self {
        QpAttr { qp_state, ..Default::default() }
    }

    pub fn to_init() -> Self {
        Self::new(QpState::Init)
    }

    /// Init → RTR for a connected QP: the remote address and QPN.
    pub fn to_rtr(av: AddressVector, dest_qp_num: u32) -> Self {
        QpAttr { qp_state: QpState::Rtr, av: Some(av), dest_qp_num: Some(dest_qp_num), ..Default::default() }
    }

    pub fn to_rts() -> Self {
        Self::new(QpState::Rts)
    }

    pub fn to_sqd() -> Self {
        Self::new(QpState::Sqd)
    }

    pub fn to_reset() -> Self {
        Self::new(QpState::Reset)
    }

    pub fn to_error() -> Self {
        Self::new(QpState::Error)
    }

    setters! {
        access: Access,
        remote_read: bool,
        remote_write: bool,
        remote_atomic: bool,
        pkey_index: u16,
        qkey: u32,
        port_num: u8,
        rq_psn: u32,
        max_dest_rd_atomic: u8,
        av: AddressVector,
        dest_qp_num: u32,
        alt_path: AltPath,
        cap: WqSizes,
        min_rnr_timer: u8,
        timeout: u8,
        sq_psn: u32,
        retry_cnt: u8,
        rnr_retry: u8,
        max_rd_atomic: u8,
        path_mig_state: MigState,
        en_sqd_async_notify: bool,
    }

    /// The Init → RTR alias of the sketch in DESIGN.md: `port(1)`.
    pub fn port(self, port: u8) -> Self {
        self.port_num(port)
    }

    /// The parameters this request supplies, for a QP of `qp_type`.
    pub fn mask(&self, qp_type: QpType) -> Result<AttrMask> {
        let mut m = AttrMask::empty();
        if let Some(acc) = self.access {
            m |= match qp_type {
                QpType::Rc | QpType::Rd | QpType::XrcSend | QpType::XrcRecv => {
                    AttrMask::READ_EN | AttrMask::WRITE_EN | AttrMask::ATOMIC_EN
                }
                QpType::Uc => {
                    if acc.intersects(Access::REMOTE_READ | Access::REMOTE_ATOMIC) {
                        return Err(VerbsError::InvalidAttribute(
                            AttrMask::READ_EN | AttrMask::ATOMIC_EN,
                            "a UC QP has no inbound RDMA Read or Atomic",
                        ));
                    }
                    AttrMask::WRITE_EN
                }
                _ => AttrMask::WRITE_EN,
            };
        }
        let flags = [
            (self.remote_read.is_some(), AttrMask::READ_EN),
            (self.remote_write.is_some(), AttrMask::WRITE_EN),
            (self.remote_atomic.is_some(), AttrMask::ATOMIC_EN),
            (self.pkey_index.is_some(), AttrMask::PKEY_INDEX),
            (self.qkey.is_some(), AttrMask::QKEY),
            (self.port_num.is_some(), AttrMask::PORT),
            (self.rq_psn.is_some(), AttrMask::RQ_PSN),
            (self.max_dest_rd_atomic.is_some(), AttrMask::MAX_DEST_RD_ATOMIC),
            (self.av.is_some(), AttrMask::AV),
            (self.dest_qp_num.is_some(), AttrMask::DEST_QPN),
            (self.alt_path.is_some(), AttrMask::ALT_PATH),
            (self.cap.is_some(), AttrMask::CAP),
            (self.min_rnr_timer.is_some(), AttrMask::MIN_RNR_TIMER),
            (self.timeout.is_some(), AttrMask::TIMEOUT),
            (self.sq_psn.is_some(), AttrMask::SQ_PSN),
            (self.retry_cnt.is_some(), AttrMask::RETRY_CNT),
            (self.rnr_retry.is_some(), AttrMask::RNR_RETRY),
            (self.max_rd_atomic.is_some(), AttrMask::MAX_RD_ATOMIC),
            (self.path_mig_state.is_some(), AttrMask::PATH_MIG_STATE),
            (self.en_sqd_async_notify.is_some(), AttrMask::SQD_EVENT),
        ];
        for (present, bit) in flags {
            if present {
                m |= bit;
            }
        }
        Ok(m)
    }
}

/// A queue pair (`ibv_qp`). Cloning gives another handle to the same QP.
#[derive(Clone)]
pub struct Qp {
    pub(crate) inner: Arc<QpInner>,
    res: Arc<QpResources>,
    /// Destroys the QP with its last handle (see [`super::LastHandle`]).
    _last: Arc<super::LastHandle>,
}

/// The verbs objects a QP holds (and keeps from being destroyed) while it exists; the
/// transport's `QpInner` reaches them only through its narrow interface.
struct QpResources {
    /// The QP these belong to.
    qp: Arc<QpInner>,
    dev: Arc<DeviceInner>,
    pd: Pd,
    send_cq: Cq,
    recv_cq: Cq,
    srq: Option<super::srq::Srq>,
    rdd: Option<super::eec::Rdd>,
    xrcd: Option<super::xrcd::Xrcd>,
}

impl std::fmt::Debug for Qp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qp").field("qpn", &self.inner.qpn).field("type", &self.inner.qp_type).finish()
    }
}

impl Context {
    /// Create QP (CRT-QP-*). A failed call creates nothing (CRT-QP-13).
    pub fn create_qp(&self, pd: &Pd, init: &QpInitAttr) -> Result<Qp> {
        self.create_qp_as(pd, init, false)
    }

    /// Get Special QP (IBA 10.2.5): the port's GSI, QP1, a UD QP of `pd` whose Q_Key is the
    /// well-known 0x80010000 ([`GSI_QKEY`]), which takes a packet under
    /// any P_Key of the table and reports the matching index in its receive CQEs (CQE-14),
    /// and whose CQs serve no other QP (CRT-QP-14). One per port. A RoCE port has no SMI (QP0):
    /// `NotSupported`.
    pub fn get_special_qp(&self, pd: &Pd, kind: SpecialQp, init: &QpInitAttr) -> Result<Qp> {
        if kind == SpecialQp::Smi {
            return Err(VerbsError::NotSupported("a RoCE port has no subnet management QP (QP0)"));
        }
        if init.qp_type != QpType::Ud {
            return Err(VerbsError::InvalidServiceType("the GSI is a datagram QP"));
        }
        self.create_qp_as(pd, init, true)
    }

    /// Create QP of type XRC target in `xrcd`, on the PD and CQ it lends (see `xrcd`).
    pub(crate) fn create_xrc_tgt_qp(&self, pd: &Pd, init: &QpInitAttr, xrcd: &super::xrcd::Xrcd) -> Result<Qp> {
        self.create_qp_in(pd, init, false, Some(xrcd))
    }

    fn create_qp_as(&self, pd: &Pd, init: &QpInitAttr, gsi: bool) -> Result<Qp> {
        self.create_qp_in(pd, init, gsi, None)
    }

    fn create_qp_in(&self, pd: &Pd, init: &QpInitAttr, gsi: bool, xrcd: Option<&super::xrcd::Xrcd>) -> Result<Qp> {
        self.inner.check_open()?;
        if !self.same_device(&pd.inner.dev) {
            return Err(VerbsError::InvalidPd);
        }
        pd.inner.check()?;
        match init.qp_type {
            QpType::Rc | QpType::Uc | QpType::Ud => {}
            QpType::XrcSend if self.inner.attr.xrc => {}
            QpType::XrcRecv if xrcd.is_some() => {}
            QpType::XrcSend => return Err(VerbsError::InvalidServiceType("XRC")),
            QpType::XrcRecv => {
                return Err(VerbsError::InvalidServiceType("an XRC target QP is made in its XRC domain"));
            }
            QpType::Rd => match &init.rdd {
                Some(rdd) if Arc::ptr_eq(&rdd.inner.dev, &self.inner) => {}
                _ => return Err(VerbsError::InvalidRdd), // CRT-QP-12
            },
            QpType::RawIpv6 | QpType::RawEthertype => {
                let max = match init.qp_type {
                    QpType::RawIpv6 => self.inner.attr.max_raw_ipv6_qp,
                    _ => self.inner.attr.max_raw_ethy_qp,
                };
                if max == 0 {
                    return Err(VerbsError::InvalidServiceType("this device's link carries no raw packets"));
                }
            }
        }
        for cq in [&init.send_cq, &init.recv_cq] {
            if !self.same_device(&cq.inner.dev) {
                return Err(VerbsError::InvalidCqHandle);
            }
            cq.query().map_err(|_| VerbsError::InvalidCqHandle)?;
        }
        let attr = &self.inner.attr;
        let mut cap = init.cap;
        // An XRC initiator has no receive side, a target no queue at all (its messages take
        // their SRQs' WQEs): the kernel ignores their SRQ and the sizes they have no queue for.
        let srq = if init.qp_type.is_xrc() { None } else { init.srq.as_ref() };
        match init.qp_type {
            QpType::XrcSend => (cap.max_recv_wr, cap.max_recv_sge) = (0, 0),
            QpType::XrcRecv => cap = QpCap::default(),
            _ => {}
        }
        // With an SRQ the QP has no receive queue of its own: its sizes are not looked at (as
        // rxe's `rxe_qp_chk_cap` skips them), and are 0 from here on (rxe reports 0 too).
        if srq.is_some() {
            (cap.max_recv_wr, cap.max_recv_sge) = (0, 0);
        }
        if cap.max_send_wr > attr.max_qp_wr || cap.max_recv_wr > attr.max_qp_wr {
            return Err(VerbsError::MaxWrExceeded);
        }
        if cap.max_send_sge > attr.max_sge || cap.max_recv_sge > attr.max_sge {
            return Err(VerbsError::MaxSgeExceeded);
        }
        if cap.max_inline_data > attr.max_inline_data {
            return Err(VerbsError::InvalidArgument("max_inline_data above the device maximum"));
        }
        let rdd = if init.qp_type == QpType::Rd { init.rdd.clone() } else { None };
        if let Some(rdd) = &rdd {
            rdd.inner.hold()?;
        }
        if let Some(x) = xrcd {
            if let Err(e) = x.inner.hold() {
                if let Some(rdd) = &rdd {
                    rdd.inner.release();
                }
                return Err(e);
            }
        }
        let release_rdd = || {
            if let Some(rdd) = &rdd {
                rdd.inner.release();
            }
            if let Some(x) = xrcd {
                x.inner.release();
            }
        };
        if let Err(e) = take(&self.inner.counts.qp, attr.max_qp) {
            release_rdd();
            return Err(e);
        }
        let undo_count = || {
            give(&self.inner.counts.qp);
            release_rdd();
        };
        if let Err(e) = pd.inner.hold() {
            undo_count();
            return Err(e);
        }
        if let Err(e) = init.send_cq.attach(gsi) {
            pd.inner.release();
            undo_count();
            return Err(e);
        }
        if let Err(e) = init.recv_cq.attach(gsi) {
            init.send_cq.detach();
            pd.inner.release();
            undo_count();
            return Err(e);
        }
        if let Some(srq) = srq {
            let same = Arc::ptr_eq(&srq.inner.dev, &self.inner);
            if let Err(e) = if same { srq.attach() } else { Err(VerbsError::InvalidArgument("SRQ of another device")) }
            {
                init.recv_cq.detach();
                init.send_cq.detach();
                pd.inner.release();
                undo_count();
                return Err(e);
            }
        }
        let (sq_ring, sq) = Ring::with_slots(cap.max_send_wr as usize, prepare_send(&cap));
        let (rq_ring, rq) = Ring::with_slots(cap.max_recv_wr as usize, prepare_recv(cap.max_recv_sge));
        let qpn = if gsi { GSI_QPN } else { self.inner.alloc_qpn() };
        let inner = Arc::new(QpInner {
            qpn,
            qp_type: init.qp_type,
            dev: self.inner.clone(),
            pd: pd.inner.handle,
            send_cq: init.send_cq.as_completion_queue(),
            recv_cq: init.recv_cq.as_completion_queue(),
            sq_sig_all: init.sq_sig_all,
            srq: srq.map(|s| s.as_shared_receive_queue()),
            rdd: rdd.as_ref().map(|r| r.inner.handle),
            xrcd: xrcd.map(|x| x.inner.handle),
            rd_epoch: Default::default(),
            stats: Default::default(),
            max_send_sge: cap.max_send_sge,
            max_recv_sge: cap.max_recv_sge,
            max_inline_data: cap.max_inline_data,
            sq_ring,
            rq_ring,
            state: AtomicU8::new(QpState::Reset as u8),
            destroyed: AtomicBool::new(false),
            ready: AtomicBool::new(false),
            core: Mutex::new(QpCore {
                attrs: QpAttrs { qkey: if gsi { GSI_QKEY } else { 0 }, ..QpAttrs::reset(cap) },
                sq,
                rq,
                route: None,
                ack: None,
                tx_memo: Default::default(),
                req_head: None,
                srq_wqe: RecvWqe::default(),
                srq_bound: false,
                xrc_srq: None,
                req: Default::default(),
                resp: Default::default(),
                sqd_event_pending: false,
                rd: Default::default(),
                chan: Default::default(),
                flow: None,
            }),
        });
        {
            let mut qps = self.inner.engine.qps.write().unwrap_or_else(|e| e.into_inner());
            let attr = &self.inner.attr;
            let raw_max = match init.qp_type {
                QpType::RawIpv6 => Some(attr.max_raw_ipv6_qp),
                QpType::RawEthertype => Some(attr.max_raw_ethy_qp),
                _ => None,
            };
            // Only the GSI's number is not fresh: the port has one already.
            let refused = if qps.contains_key(qpn) {
                Some(VerbsError::InUse("the port's GSI exists"))
            } else {
                raw_max
                    .filter(|&max| {
                        let listen = |t, on| self.inner.raw_listen(t, on);
                        !self.inner.engine.add_raw(qpn, init.qp_type, max as usize, listen)
                    })
                    .map(|_| VerbsError::InsufficientResources)
            };
            if let Some(e) = refused {
                drop(qps);
                srq.inspect(|s| s.detach());
                init.recv_cq.detach();
                init.send_cq.detach();
                pd.inner.release();
                undo_count();
                return Err(e);
            }
            qps.insert(inner.clone());
            self.inner.engine.count_ud(init.qp_type, qpn, true);
        }
        tracing::debug!(device = %self.inner.name, qpn, qp_type = ?init.qp_type, "QP created");
        let res = QpResources {
            qp: inner.clone(),
            dev: self.inner.clone(),
            pd: pd.clone(),
            send_cq: init.send_cq.clone(),
            recv_cq: init.recv_cq.clone(),
            srq: srq.cloned(),
            rdd,
            xrcd: xrcd.cloned(),
        };
        let res = Arc::new(res);
        let held = res.clone();
        let _last = super::LastHandle::new(move || {
            let _ = held.release();
        });
        Ok(Qp { inner, res, _last })
    }
}

impl Pd {
    /// Create QP in this PD (see [`Context::create_qp`]).
    pub fn create_qp(&self, init: &QpInitAttr) -> Result<Qp> {
        self.context().create_qp(self, init)
    }
}

/// Tags an error of a post with the index of the WR it concerns.
fn at(index: usize) -> impl Fn(VerbsError) -> PostError {
    move |error| PostError { index, error }
}

impl Qp {
    pub(crate) fn lock(&self) -> Result<MutexGuard<'_, QpCore>> {
        self.res.dev.check_open()?;
        live_core(&self.inner)
    }

    /// `core` and both producer locks, in the one order (module doc): for the verbs that change
    /// what a post may do.
    fn exclusive(&self) -> Result<Exclusive<'_>> {
        self.res.dev.check_open()?;
        exclusive(&self.inner)
    }

    /// The end of a post that published through `producer`: the engine may have moved the QP
    /// to Error since the poster read the state, and its flush may have missed what was just
    /// published (module doc), so `flush` (under `core`) takes whatever is left. Nothing to do
    /// if a Reset or a Destroy discarded it first.
    fn finish_post<T>(&self, producer: Producer<'_, T>, flush: impl FnOnce(&QpInner, &mut QpCore)) {
        let raced = self.inner.posted_state() == QpState::Error;
        drop(producer);
        if !raced {
            return;
        }
        let Ok(mut core) = self.lock() else { return };
        if core.attrs.qp_state == QpState::Error {
            flush(&self.inner, &mut core);
        }
    }

    /// Checks every value a Modify QP request supplies against the device and the QP
    /// (MOD-GEN-8..11, MOD-GEN-13 via the `Mtu` type, MOD-SQD-RTS-RC-1).
    fn check_values(&self, core: &QpCore, attr: &QpAttr, supplied: AttrMask) -> Result<()> {
        let dev = &self.res.dev;
        let bad = |bit: AttrMask, why: &'static str| Err(VerbsError::InvalidAttribute(bit, why));
        if supplied.contains(AttrMask::ALT_PATH) && !dev.attr.auto_path_mig {
            return Err(VerbsError::NotSupported("automatic path migration"));
        }
        if let Some(state) = attr.path_mig_state {
            if state != MigState::Migrated && !dev.attr.auto_path_mig {
                return Err(VerbsError::NotSupported("automatic path migration"));
            }
        }
        if let Some(sizes) = attr.cap {
            if !dev.attr.resize_wq {
                return Err(VerbsError::NotSupported("resizing work queues"));
            }
            let recv_wr = self.recv_wr(sizes);
            if sizes.max_send_wr > dev.attr.max_qp_wr || recv_wr > dev.attr.max_qp_wr {
                return bad(AttrMask::CAP, "above max_qp_wr");
            }
            if (sizes.max_send_wr as usize) < core.sq.len() || (recv_wr as usize) < core.rq.len() {
                return bad(AttrMask::CAP, "smaller than the WQEs outstanding");
            }
        }
        if let Some(port) = attr.port_num {
            if port == 0 || port > dev.attr.phys_port_cnt {
                return bad(AttrMask::PORT, "no such port");
            }
            if core.attrs.qp_state == QpState::Sqd && port != core.attrs.port_num && !dev.attr.port_change {
                return Err(VerbsError::NotSupported("changing the port of a QP"));
            }
        }
        if let Some(i) = attr.pkey_index {
            if dev.pkey(i).is_none() {
                return bad(AttrMask::PKEY_INDEX, "P_Key index beyond the P_Key table");
            }
        }
        for (v, bit, what) in [
            (attr.retry_cnt, AttrMask::RETRY_CNT, "retry count above 7"),
            (attr.rnr_retry, AttrMask::RNR_RETRY, "RNR retry count above 7"),
            (attr.av.and_then(|a| a.retry_cnt), AttrMask::AV, "retry count above 7"),
            (attr.av.and_then(|a| a.rnr_retry), AttrMask::AV, "RNR retry count above 7"),
        ] {
            if v.is_some_and(|v| v > 7) {
                return bad(bit, what);
            }
        }
        for (v, bit, what) in [
            (attr.timeout, AttrMask::TIMEOUT, "local ACK timeout above 31"),
            (attr.av.and_then(|a| a.timeout), AttrMask::AV, "local ACK timeout above 31"),
            (attr.min_rnr_timer, AttrMask::MIN_RNR_TIMER, "minimum RNR NAK timer above 31"),
        ] {
            if v.is_some_and(|v| v > 31) {
                return bad(bit, what);
            }
        }
        for (v, bit, what) in [
            (attr.rq_psn, AttrMask::RQ_PSN, "PSN above 2^24-1"),
            (attr.sq_psn, AttrMask::SQ_PSN, "PSN above 2^24-1"),
            (attr.dest_qp_num, AttrMask::DEST_QPN, "QPN above 2^24-1"),
        ] {
            if v.is_some_and(|v| v > 0xFF_FFFF) {
                return bad(bit, what);
            }
        }
        if attr.max_rd_atomic.is_some_and(|v| v as u32 > dev.attr.max_qp_init_rd_atom) {
            return bad(AttrMask::MAX_RD_ATOMIC, "outbound depth above the HCA maximum");
        }
        if attr.max_dest_rd_atomic.is_some_and(|v| v as u32 > dev.attr.max_qp_rd_atom) {
            return bad(AttrMask::MAX_DEST_RD_ATOMIC, "inbound depth above the HCA maximum");
        }
        if let Some(av) = &attr.av {
            validate_ah_attr(dev, &av.ah, AttrMask::AV)?;
            if av.path_mtu > dev.port.active_mtu {
                return bad(AttrMask::AV, "path MTU above the port MTU");
            }
        }
        if let Some(alt) = &attr.alt_path {
            validate_ah_attr(dev, &alt.av.ah, AttrMask::ALT_PATH)?;
            if alt.av.path_mtu > dev.port.active_mtu {
                return bad(AttrMask::ALT_PATH, "path MTU above the port MTU");
            }
            if alt.port_num != 1 || dev.pkey(alt.pkey_index).is_none() || alt.timeout > 31 {
                return bad(AttrMask::ALT_PATH, "alternate port, P_Key index or timeout out of range");
            }
        }
        // IBA 17.2.8, as rdmavt checks it: the consumer arms with Rearm (which needs an
        // alternate path, loaded now or before, and a QP not armed already) and migrates
        // with Migrated; Armed is the HCA's to reach.
        match attr.path_mig_state {
            Some(MigState::Rearm) if core.attrs.path_mig_state == MigState::Armed => {
                return bad(AttrMask::PATH_MIG_STATE, "Rearm while armed");
            }
            Some(MigState::Rearm) if attr.alt_path.is_none() && core.attrs.alt.is_none() => {
                return bad(AttrMask::PATH_MIG_STATE, "Rearm without an alternate path");
            }
            Some(MigState::Armed) => return bad(AttrMask::PATH_MIG_STATE, "Armed is reached by the HCA"),
            _ => {}
        }
        Ok(())
    }

    /// Applies a validated request's values to the attributes.
    fn apply(&self, a: &mut QpAttrs, attr: &QpAttr, supplied: AttrMask) {
        if let Some(acc) = attr.access {
            for (bit, right) in [
                (AttrMask::READ_EN, Access::REMOTE_READ),
                (AttrMask::WRITE_EN, Access::REMOTE_WRITE),
                (AttrMask::ATOMIC_EN, Access::REMOTE_ATOMIC),
            ] {
                if supplied.contains(bit) {
                    a.set_enable(right, acc.contains(right));
                }
            }
        }
        if let Some(v) = attr.remote_read {
            a.set_enable(Access::REMOTE_READ, v);
        }
        if let Some(v) = attr.remote_write {
            a.set_enable(Access::REMOTE_WRITE, v);
        }
        if let Some(v) = attr.remote_atomic {
            a.set_enable(Access::REMOTE_ATOMIC, v);
        }
        if let Some(av) = attr.av {
            a.av = Some(av);
            // values in the AV take effect now; RTR→RTS supplies them again and wins.
            if let Some(v) = av.timeout {
                a.timeout = v;
            }
            if let Some(v) = av.retry_cnt {
                a.retry_cnt = v;
            }
            if let Some(v) = av.rnr_retry {
                a.rnr_retry = v;
            }
        }
        macro_rules! copy {
            ($($f:ident),*) => { $( if let Some(v) = attr.$f { a.$f = v; } )* };
        }
        copy!(
            pkey_index,
            qkey,
            port_num,
            rq_psn,
            sq_psn,
            max_dest_rd_atomic,
            max_rd_atomic,
            dest_qp_num,
            min_rnr_timer,
            timeout,
            retry_cnt,
            rnr_retry,
            en_sqd_async_notify
        );
        if let Some(alt) = attr.alt_path {
            a.alt = Some(alt);
            a.alt_refused = false;
        }
        match attr.path_mig_state {
            // softhca arms at once: there is no path to probe before (IBA leaves it to the CA).
            Some(MigState::Rearm) => a.path_mig_state = MigState::Armed,
            Some(MigState::Migrated) if a.path_mig_state == MigState::Armed => {
                // The consumer migrates: no Path Migrated event (EVT-PM-1 is for automatic
                // migrations).
                a.take_alternate();
            }
            _ => {}
        }
        if let Some(sizes) = attr.cap {
            a.cap.max_send_wr = sizes.max_send_wr;
            a.cap.max_recv_wr = self.recv_wr(sizes);
        }
    }

    /// The receive queue size a Modify QP asks for: none on an SRQ, which the QP's receives
    /// come from (Create QP made it 0 too).
    fn recv_wr(&self, sizes: WqSizes) -> u32 {
        if self.inner.on_srq() || self.inner.qp_type == QpType::XrcSend {
            0
        } else {
            sizes.max_recv_wr
        }
    }

    /// The 24-bit QP number.
    pub fn qp_num(&self) -> u32 {
        self.inner.qpn
    }

    pub fn qp_type(&self) -> QpType {
        self.inner.qp_type
    }

    pub fn pd(&self) -> &Pd {
        &self.res.pd
    }

    pub fn send_cq(&self) -> &Cq {
        &self.res.send_cq
    }

    pub fn recv_cq(&self) -> &Cq {
        &self.res.recv_cq
    }

    /// Attach QP to Multicast Group (`ibv_attach_mcast`): UD packets addressed to `mgid` with
    /// DestQP 0xFFFFFF reach this QP too, its own included (IBA 10.5). Only a UD QP may join
    /// (Linux's `ib_attach_mcast`: EINVAL otherwise), and only a multicast GID; `lid` is
    /// ignored, as on any RoCE port (the RoCE annex; Linux's `is_valid_mcast_lid`). Attaching
    /// a member again succeeds and changes nothing. Past the device's `max_mcast_grp`,
    /// `max_mcast_qp_attach` or `max_total_mcast_qp_attach`: insufficient resources (ENOMEM, as
    /// rxe); on a link that carries no multicast: not supported.
    pub fn attach_mcast(&self, mgid: Gid, lid: u16) -> Result<()> {
        let _ = lid;
        let dev = &self.res.dev;
        self.check_mcast(mgid)?;
        let a = &dev.attr;
        let limits = crate::transport::mcast::Limits {
            groups: a.max_mcast_grp as usize,
            per_group: a.max_mcast_qp_attach as usize,
            total: a.max_total_mcast_qp_attach as usize,
        };
        let mut groups = dev.engine.groups.write().unwrap_or_else(|e| e.into_inner());
        // Under the table's lock: Destroy QP sets the flag before it detaches under that lock,
        // so a QP being destroyed is never left a member.
        if self.inner.destroyed.load(Ordering::Acquire) {
            return Err(VerbsError::InvalidQpHandle);
        }
        groups.attach(mgid, self.inner.qpn, limits, || dev.group_listen(mgid, true)).map_err(|r| match r {
            crate::transport::mcast::Refusal::Full => VerbsError::InsufficientResources,
            crate::transport::mcast::Refusal::Link => VerbsError::NotSupported("the link cannot join this group"),
        })
    }

    /// Detach QP from Multicast Group (`ibv_detach_mcast`); the checks of
    /// [`Qp::attach_mcast`], and EINVAL when the QP is not attached to `mgid`.
    pub fn detach_mcast(&self, mgid: Gid, lid: u16) -> Result<()> {
        let _ = lid;
        let dev = &self.res.dev;
        self.check_mcast(mgid)?;
        let mut groups = dev.engine.groups.write().unwrap_or_else(|e| e.into_inner());
        if groups.detach(mgid, self.inner.qpn, || {
            dev.group_listen(mgid, false);
        }) {
            Ok(())
        } else {
            Err(VerbsError::InvalidArgument("the QP is not attached to this group"))
        }
    }

    /// Whether work posted to this QP has yet to leave the device: the QP is on the engine's
    /// list of QPs with something to send, or a UC or UD send waits for its datagram to leave
    /// (its completion goes with it). Linux's rxe sends a user QP's work in the
    /// `ibv_post_send` system call, so that what a program posts and then destroys at once is
    /// on the wire (Debian's mckey sends unsignaled datagrams and then leaves and exits); the
    /// drop-in lets the engine finish before it destroys a QP.
    pub fn unsent(&self) -> bool {
        let q = &self.inner;
        if q.ready.load(Ordering::Acquire) {
            return true;
        }
        if !matches!(q.qp_type, QpType::Uc | QpType::Ud) {
            return false;
        }
        let core = q.core.lock().unwrap_or_else(|e| e.into_inner());
        (0..core.sq.len()).filter_map(|i| core.sq.get(i)).any(|w| w.tx.awaiting_wire)
    }

    /// The multicast groups the QP is attached to.
    pub fn mcast_groups(&self) -> Vec<Gid> {
        self.res.dev.engine.groups.read().unwrap_or_else(|e| e.into_inner()).of(self.inner.qpn)
    }

    fn check_mcast(&self, mgid: Gid) -> Result<()> {
        self.res.dev.check_open()?;
        drop(live_core(&self.inner)?);
        if self.res.dev.attr.max_mcast_grp == 0 {
            return Err(VerbsError::NotSupported("multicast on this link"));
        }
        if !mgid.is_multicast() {
            return Err(VerbsError::InvalidArgument("not a multicast GID"));
        }
        if self.inner.qp_type != QpType::Ud {
            return Err(VerbsError::InvalidArgument("only UD QPs join multicast groups"));
        }
        Ok(())
    }

    /// The current state.
    pub fn state(&self) -> Result<QpState> {
        Ok(self.lock()?.attrs.qp_state)
    }

    /// Query QP: the current state and attributes (QPS-GEN-2).
    pub fn query(&self) -> Result<QpAttrs> {
        Ok(self.lock()?.attrs.clone())
    }

    /// Modify QP. Either everything the request asks happens, or (on error) nothing at all
    /// (MOD-GEN-5).
    pub fn modify(&self, attr: &QpAttr) -> Result<()> {
        super::effects::scope(|| self.modify_locked(attr))
    }

    fn modify_locked(&self, attr: &QpAttr) -> Result<()> {
        let q = &self.inner;
        // Posters wait until the change is complete: none may publish into a queue that a
        // Reset is discarding or a resize is moving, nor post in a state that no longer holds.
        let (mut core, mut sq, mut rq) = self.exclusive()?;
        let from = core.attrs.qp_state;
        let to = attr.qp_state;
        let supplied = attr.mask(q.qp_type)?;
        check_modify(q.qp_type, from, to, supplied)?;
        // MOD-SQD-RTS-4: no retuning while the SQ is still draining.
        if from == QpState::Sqd
            && matches!(to, QpState::Rts | QpState::Sqd)
            && !supplied.is_empty()
            && core.req.started > 0
        {
            return Err(VerbsError::InvalidQpState);
        }
        self.check_values(&core, attr, supplied)?;

        let mut next = core.attrs.clone();
        self.apply(&mut next, attr, supplied);
        next.qp_state = to;
        // ACKs the QP owes for requests it executed, built before a move to Error drops its
        // responses (see below).
        let mut owed = Vec::new();
        match to {
            QpState::Reset => {
                // QPS-RESET-5..7: discard both queues without CQEs and take this QP's CQEs
                // off its CQs; the attributes return to their Reset values.
                crate::transport::rd::release(q, &mut core, false);
                core.sq.discard();
                core.rq.discard();
                core.srq_bound = false;
                core.req = Default::default();
                core.resp = Default::default();
                core.chan = Default::default();
                core.sqd_event_pending = false;
                // Nothing is owed after a reset (the responder's state went above).
                self.res.dev.engine.close_flow(core.flow.take());
                self.res.send_cq.purge_qp(q.qpn);
                self.res.recv_cq.purge_qp(q.qpn);
                let cap = core.attrs.cap;
                core.set_attrs(QpAttrs::reset(cap));
                q.mirror_state(&core);
            }
            // QPT-SW-9: Error → Error changes nothing (no second flush, no second Last WQE
            // Reached, no response dropped).
            QpState::Error if from == QpState::Error => {}
            QpState::Error => {
                next.sq_draining = false;
                core.set_attrs(next);
                q.mirror_state(&core);
                core.sqd_event_pending = false;
                // The ACKs already owed still leave (PKT-ACK-13): the application may have
                // seen the completions they acknowledge, and a peer that never gets them
                // would flush or fail a Send that was delivered (as Destroy QP, below). Read
                // responses and Atomic ACKs not yet sent are dropped with the QP's resources.
                owed = crate::transport::engine::owed_acks(q, &mut core);
                core.stop_channel();
                q.flush_all(&mut core);
            }
            _ => {
                if let Some(sizes) = attr.cap {
                    let cap = core.attrs.cap;
                    core.sq.resize(&mut sq, sizes.max_send_wr as usize, prepare_send(&cap));
                    core.rq.resize(&mut rq, self.recv_wr(sizes) as usize, prepare_recv(cap.max_recv_sge));
                }
                if from == QpState::Rts && to == QpState::Sqd {
                    next.sq_draining = core.req.started > 0;
                    // Asked by this transition, not remembered from an earlier one (EVT-SQD-2).
                    core.sqd_event_pending = attr.en_sqd_async_notify.unwrap_or(false);
                }
                if to != QpState::Sqd {
                    next.sq_draining = false;
                }
                let (rq_psn, sq_psn) = (next.rq_psn, next.sq_psn);
                core.set_attrs(next);
                match (from, to) {
                    (QpState::Init, QpState::Rtr) => {
                        core.start_receiving(rq_psn);
                        // The link prepares the flow now, before its first packet (the
                        // `kick` below lets it turn).
                        self.res.dev.engine.announce_flow(q, &mut core);
                    }
                    (QpState::Rtr, QpState::Rts) => core.start_sending(sq_psn),
                    (QpState::Sqe, QpState::Rts) => core.req.halted = false,
                    _ => {}
                }
                // New counts out of SQD hold from the next request packet on (MOD-SQD-RTS-2):
                // the budgets start again from them, not from the ones they replace.
                if from == QpState::Sqd && (attr.retry_cnt.is_some() || attr.rnr_retry.is_some()) {
                    let (retry_cnt, rnr_retry) = (core.attrs.retry_cnt, core.attrs.rnr_retry);
                    core.chan.send.progressed(retry_cnt, rnr_retry);
                }
                q.mirror_state(&core);
                q.check_drained(&mut core);
            }
        }
        tracing::debug!(qpn = q.qpn, %from, %to, ?supplied, "modify QP");
        drop((rq, sq, core));
        if !owed.is_empty() {
            self.res.dev.orphan(owed);
        }
        self.kick();
        Ok(())
    }

    /// Tells the engine the QP may have something to send, and its driver to run.
    fn kick(&self) {
        self.res.dev.engine.wake(&self.inner);
        self.res.dev.ring();
    }

    /// Post Send: validates every WR first and queues all or none (an immediate error queues
    /// nothing). In Error each WR is flushed at once, in post order (QPS-ERR-3).
    pub fn post_send(&self, wrs: &[SendWr<'_>]) -> std::result::Result<(), PostError> {
        super::effects::scope(|| self.post_send_locked(wrs))
    }

    fn post_send_locked(&self, wrs: &[SendWr<'_>]) -> std::result::Result<(), PostError> {
        let q = &self.inner;
        self.res.dev.check_open().map_err(at(0))?;
        let mut sq = q.sq_ring.producer();
        if q.destroyed.load(Ordering::Acquire) {
            return Err(at(0)(VerbsError::InvalidQpHandle));
        }
        let state = q.posted_state();
        if state == QpState::Error {
            drop(sq);
            return self.post_send_with_core(wrs);
        }
        self.queue_send(state, &mut sq, wrs)?;
        self.finish_post(sq, |q, core| q.flush_sq(core));
        self.kick();
        Ok(())
    }

    /// Post Send holding `core`, where the state cannot change under it: for posting in Error.
    fn post_send_with_core(&self, wrs: &[SendWr<'_>]) -> std::result::Result<(), PostError> {
        let q = &self.inner;
        let mut core = self.lock().map_err(at(0))?;
        let mut sq = q.sq_ring.producer();
        let state = core.attrs.qp_state;
        if state == QpState::Error {
            self.check_sends(wrs, None)?;
            q.flush_sq(&mut core);
            for wr in wrs {
                flush_cqe(&*q.send_cq, q.qpn, wr.wr_id, wc_opcode_of(wr.opcode));
            }
        } else {
            // Out of Error again (a Reset and back) since the state was first read.
            self.queue_send(state, &mut sq, wrs)?;
        }
        drop((sq, core));
        self.kick();
        Ok(())
    }

    /// Checks every WR, then fills and publishes them all, in a state other than Error.
    fn queue_send(
        &self,
        state: QpState,
        sq: &mut Producer<'_, SendWqe>,
        wrs: &[SendWr<'_>],
    ) -> std::result::Result<(), PostError> {
        if matches!(state, QpState::Reset | QpState::Init | QpState::Rtr) {
            return Err(at(0)(VerbsError::InvalidQpState)); // QPS-RESET-2, QPS-INIT-3, QPS-RTR-4
        }
        self.check_sends(wrs, Some(sq.free()))?;
        for wr in wrs {
            let Some(slot) = sq.next_slot() else {
                break;
            };
            fill_send_wqe(&self.inner, slot, wr);
            sq.commit();
        }
        sq.publish();
        Ok(())
    }

    /// Checks each WR in turn, and that it fits when `free` slots are left (none are needed
    /// in Error): the first failure names its WR.
    fn check_sends(&self, wrs: &[SendWr<'_>], free: Option<usize>) -> std::result::Result<(), PostError> {
        for (i, wr) in wrs.iter().enumerate() {
            self.check_send_wr(wr).map_err(at(i))?;
            if free.is_some_and(|free| i >= free) {
                return Err(at(i)(VerbsError::QueueFull));
            }
        }
        Ok(())
    }

    fn check_send_wr(&self, wr: &SendWr<'_>) -> Result<()> {
        let q = &self.inner;
        if !wr_allowed(q.qp_type, wr.opcode) {
            return Err(VerbsError::InvalidWrType);
        }
        if wr.opcode == WrOpcode::FastReg && wr.fast_reg.is_none() {
            return Err(VerbsError::InvalidWr("a Fast Register work request needs its region"));
        }
        if wr.opcode == WrOpcode::BindMw && wr.bind.is_none() {
            return Err(VerbsError::InvalidWr("a Bind MW work request needs its window and region"));
        }
        let inline = wr.send_flags.contains(SendFlags::INLINE) && wr.opcode.gathers();
        if inline_bytes(wr).is_none() && wr.sg_list.len() > q.max_send_sge as usize {
            return Err(VerbsError::MaxSgeExceeded);
        }
        // An Atomic Write's 8 bytes ride in its WQE as an Atomic's operands do, whatever
        // `max_inline_data` (libibverbs' `ibv_wr_atomic_write` hands them over as a value).
        if inline && wr.opcode != WrOpcode::AtomicWrite && wr_length(wr) > q.max_inline_data as u64 {
            return Err(VerbsError::InvalidWr("inline data above max_inline_data"));
        }
        let length = wr_length(wr);
        if length > MAX_MSG_SIZE {
            return Err(VerbsError::InvalidWr("message longer than 2^31 bytes"));
        }
        if wr.opcode.is_atomic() && (wr.sg_list.len() != 1 || wr.sg_list[0].length != 8) {
            return Err(VerbsError::InvalidWr("an atomic takes exactly one 8-byte scatter entry"));
        }
        if wr.opcode == WrOpcode::AtomicWrite && length != 8 {
            return Err(VerbsError::InvalidWr("an atomic write carries exactly 8 bytes"));
        }
        if q.qp_type == QpType::Ud {
            let ah = wr.ah.ok_or(VerbsError::InvalidWr("a UD send needs an address handle"))?;
            ah.check()?;
            if !Arc::ptr_eq(&ah.inner.pd, &self.res.pd.inner) {
                return Err(VerbsError::InvalidWr("address handle of another protection domain"));
            }
            if wr.remote_qpn > 0xFF_FFFF {
                return Err(VerbsError::InvalidWr("remote QPN above 2^24-1"));
            }
        }
        if q.qp_type == QpType::Rd && (wr.remote_qpn > 0xFF_FFFF || wr.eecn > 0xFF_FFFF) {
            return Err(VerbsError::InvalidWr("remote QPN and EECN are 24-bit"));
        }
        if q.qp_type == QpType::XrcSend && wr.xrc_srqn > 0xFF_FFFF {
            return Err(VerbsError::InvalidWr("an XRC SRQ number is 24-bit"));
        }
        Ok(())
    }

    /// Post Receive: all or none, like [`Qp::post_send`]. Refused only in Reset (QPS-RESET-3);
    /// held in Init, flushed at once in Error (QPS-ERR-4).
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError> {
        super::effects::scope(|| self.post_recv_locked(wrs))
    }

    fn post_recv_locked(&self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError> {
        let q = &self.inner;
        self.res.dev.check_open().map_err(at(0))?;
        let mut rq = q.rq_ring.producer();
        if q.destroyed.load(Ordering::Acquire) {
            return Err(at(0)(VerbsError::InvalidQpHandle));
        }
        let state = q.posted_state();
        if state == QpState::Error {
            drop(rq);
            return self.post_recv_with_core(wrs);
        }
        self.queue_recv(state, &mut rq, wrs)?;
        self.finish_post(rq, |q, core| q.flush_rq(core));
        // No doorbell: the RQ Logic is passive. It takes a WQE when a request arrives, and a
        // requester held off by an RNR NAK retries on its own timer (PKT-RNR-2).
        Ok(())
    }

    /// Post Receive holding `core`: for posting in Error.
    fn post_recv_with_core(&self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError> {
        let q = &self.inner;
        let mut core = self.lock().map_err(at(0))?;
        let mut rq = q.rq_ring.producer();
        let state = core.attrs.qp_state;
        if state == QpState::Error {
            self.check_recvs(wrs, None)?;
            q.flush_rq(&mut core);
            for wr in wrs {
                q.flush_recv_cqe(&mut core, wr.wr_id, 1);
            }
        } else {
            self.queue_recv(state, &mut rq, wrs)?;
        }
        drop((rq, core));
        Ok(())
    }

    /// Like [`Qp::check_sends`], for receives; a QP on an SRQ takes none.
    fn check_recvs(&self, wrs: &[RecvWr<'_>], free: Option<usize>) -> std::result::Result<(), PostError> {
        if self.inner.on_srq() {
            return Err(at(0)(VerbsError::InvalidWr("the QP receives through an SRQ")));
        }
        if self.inner.qp_type == QpType::XrcSend {
            return Err(at(0)(VerbsError::InvalidWr("an XRC initiator has no receive queue")));
        }
        for (i, wr) in wrs.iter().enumerate() {
            wr.check(self.inner.max_recv_sge).map_err(at(i))?;
            if free.is_some_and(|free| i >= free) {
                return Err(at(i)(VerbsError::QueueFull));
            }
        }
        Ok(())
    }

    /// Checks every WR, then fills and publishes them all, in a state other than Error.
    fn queue_recv(
        &self,
        state: QpState,
        rq: &mut Producer<'_, RecvWqe>,
        wrs: &[RecvWr<'_>],
    ) -> std::result::Result<(), PostError> {
        if state == QpState::Reset {
            return Err(at(0)(VerbsError::InvalidQpState));
        }
        self.check_recvs(wrs, Some(rq.free()))?;
        for wr in wrs {
            let Some(slot) = rq.next_slot() else { break };
            slot.fill(wr.wr_id, wr.sg_list);
            rq.commit();
        }
        rq.publish();
        Ok(())
    }

    /// The transport's internal state, for diagnostics.
    #[doc(hidden)]
    pub fn debug_transport(&self) -> String {
        let core = self.inner.core.lock().unwrap_or_else(|e| e.into_inner());
        let head: Vec<String> = (0..core.sq.len().min(4))
            .filter_map(|i| core.sq.get(i))
            .map(|w| {
                format!(
                    "{:?} psn {:#x}+{} st {:?} rx {}",
                    w.opcode, w.tx.first_psn, w.tx.npkts, w.tx.status, w.tx.resp_received
                )
            })
            .collect();
        format!(
            "{:?} req {:?} {:?} resp epsn {:#x} out {} sq {} rq {} head {:?}",
            core.attrs.qp_state,
            core.req,
            core.chan.send,
            core.chan.recv.epsn,
            core.chan.out.len(),
            core.sq.len(),
            core.rq.len(),
            head
        )
    }

    /// This QP's counters: packets, retransmissions, NAKs, timeouts, header violations.
    pub fn counters(&self) -> crate::transport::DeviceCounters {
        self.inner.stats.snapshot()
    }

    /// WQEs outstanding on the SQ and the RQ.
    pub fn outstanding(&self) -> Result<(usize, usize)> {
        let core = self.lock()?;
        Ok((core.sq.len(), core.rq.len()))
    }

    /// Destroy QP: accepted in every state (QPT-SW-12). Outstanding WQEs are discarded; CQEs
    /// already on the CQs stay there to be polled.
    pub fn destroy(&self) -> Result<()> {
        super::effects::scope(|| self.destroy_locked())
    }

    fn destroy_locked(&self) -> Result<()> {
        self.res.dev.check_open()?;
        self.res.release()
    }
}

/// A QP's core and both producer locks.
type Exclusive<'a> = (MutexGuard<'a, QpCore>, Producer<'a, SendWqe>, Producer<'a, RecvWqe>);

/// The QP's core, locked; `InvalidQpHandle` once the QP is destroyed.
fn live_core(q: &QpInner) -> Result<MutexGuard<'_, QpCore>> {
    let core = q.core.lock().unwrap_or_else(|e| e.into_inner());
    if q.destroyed.load(Ordering::Acquire) {
        return Err(VerbsError::InvalidQpHandle);
    }
    Ok(core)
}

/// [`live_core`] and then both producer locks, in the one order (module doc).
fn exclusive(q: &QpInner) -> Result<Exclusive<'_>> {
    let core = live_core(q)?;
    Ok((core, q.sq_ring.producer(), q.rq_ring.producer()))
}

impl QpResources {
    /// Destroy QP (see [`Qp::destroy`]) on an open device, or with the last handle on any.
    fn release(&self) -> Result<()> {
        let q = &self.qp;
        let (mut core, sq, rq) = exclusive(q)?;
        // The ACKs this QP owes outlive it: the application may have seen the completions they
        // acknowledge, and a peer waiting for them would retry into a missing QP. Built now,
        // sent by the next transmit (the doorbell below asks for it).
        let owed = crate::transport::engine::owed_acks(q, &mut core);
        q.destroyed.store(true, Ordering::Release);
        let flow = core.flow.take();
        crate::transport::rd::release(q, &mut core, false);
        core.sq.discard();
        core.rq.discard();
        drop((rq, sq, core));
        self.dev.engine.qps.write().unwrap_or_else(|e| e.into_inner()).remove(q.qpn);
        self.dev.engine.count_ud(q.qp_type, q.qpn, false);
        self.dev.engine.remove_raw(q.qpn, |t, on| self.dev.raw_listen(t, on));
        let mut groups = self.dev.engine.groups.write().unwrap_or_else(|e| e.into_inner());
        groups.detach_all(q.qpn, |mgid| {
            self.dev.group_listen(mgid, false);
        });
        drop(groups);
        self.send_cq.detach();
        self.recv_cq.detach();
        if let Some(srq) = &self.srq {
            srq.detach();
        }
        self.pd.inner.release();
        if let Some(rdd) = &self.rdd {
            rdd.inner.release();
        }
        if let Some(x) = &self.xrcd {
            x.inner.release();
        }
        // Its unread asynchronous events name a QP that no longer exists: dropped, as the
        // kernel drops them.
        self.dev.purge_async_events(super::types::EventElement::Qp(q.qpn));
        give(&self.dev.counts.qp);
        self.dev.orphan(owed);
        // After the owed ACKs: the link sends them through the flow's socket before closing it.
        self.dev.engine.close_flow(flow);
        tracing::debug!(qpn = q.qpn, "QP destroyed");
        Ok(())
    }
}

/// Inline data given as bytes (`inline_data`); an INLINE WR without them takes its bytes from
/// its gather list at post time, as libibverbs does.
fn inline_bytes<'a>(wr: &SendWr<'a>) -> Option<&'a [u8]> {
    let inline = wr.send_flags.contains(SendFlags::INLINE) && wr.opcode.gathers();
    (inline && (!wr.inline_data.is_empty() || wr.sg_list.is_empty())).then_some(wr.inline_data)
}

fn wr_length(wr: &SendWr<'_>) -> u64 {
    match inline_bytes(wr) {
        Some(data) => data.len() as u64,
        None => sge_total(wr.sg_list),
    }
}

/// Copies an INLINE WR's gather list into `out`, each piece checked against its L_Key, as
/// one access (a Deregister of a key it uses waits for it).
fn inline_from_sges(q: &QpInner, sges: &[crate::types::Sge], out: &mut Vec<u8>) -> bool {
    super::effects::access(|| {
        for s in sges {
            let Ok(m) = q.dev.check_access(s.lkey, q.pd, q.qpn, s.addr, s.length as u64, Access::empty()) else {
                return false;
            };
            let at = out.len();
            out.resize(at + s.length as usize, 0);
            if m.read(0, &mut out[at..]).is_err() {
                return false;
            }
        }
        true
    })
}

fn fill_send_wqe(q: &QpInner, slot: &mut SendWqe, wr: &SendWr<'_>) {
    let inline = wr.send_flags.contains(SendFlags::INLINE) && wr.opcode.gathers();
    slot.wr_id = wr.wr_id;
    slot.opcode = wr.opcode;
    slot.flags = wr.send_flags;
    slot.signaled = q.sq_sig_all || wr.send_flags.contains(SendFlags::SIGNALED);
    slot.sges.clear();
    slot.inline.clear();
    match inline_bytes(wr) {
        Some(data) => slot.inline.extend_from_slice(data),
        // A key that does not cover its SGE leaves the WR to the requester's checks, which
        // complete it with Local Protection Error (WR-COM-9).
        None if inline && inline_from_sges(q, wr.sg_list, &mut slot.inline) => {}
        None => {
            slot.inline.clear();
            push_sges(&mut slot.sges, wr.sg_list);
        }
    }
    slot.length = wr_length(wr);
    slot.imm_data = wr.imm_data;
    slot.remote_addr = wr.remote_addr;
    slot.rkey = wr.rkey;
    // The rarer fields, only when this WR or the slot's last one has them (see `SendWqe`).
    let rare = wr.compare_add != 0
        || wr.swap != 0
        || wr.ah.is_some()
        || wr.remote_qpn != 0
        || wr.remote_qkey != 0
        || wr.xrc_srqn != 0
        || wr.eecn != 0
        || wr.invalidate_rkey != 0
        || wr.bind.is_some()
        || wr.fast_reg.is_some()
        || wr.raw.is_some();
    if !(rare || slot.rare) {
        return;
    }
    slot.rare = rare;
    slot.compare_add = wr.compare_add;
    slot.swap = wr.swap;
    slot.ah = wr.ah.map(|a| a.attr());
    slot.remote_qpn = wr.remote_qpn;
    slot.remote_qkey = wr.remote_qkey;
    slot.xrc_srqn = wr.xrc_srqn;
    slot.eecn = wr.eecn;
    slot.invalidate_rkey = wr.invalidate_rkey;
    slot.raw_ethertype = wr.raw.and_then(|r| r.ethertype);
    slot.fast_reg = wr.fast_reg.map(|f| crate::transport::wqe::FastRegRequest {
        key: f.mr.lkey(),
        new_key: f.new_key,
        access: f.access,
    });
    slot.bind = wr.bind.map(|b| BindRequest {
        mw: b.mw.inner.clone(),
        rkey: b.rkey,
        mr_key: b.mr_key,
        addr: b.addr,
        length: b.length,
        access: b.access,
        new_key: b.new_key,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{AhAttr, Gid, Mtu, WcOpcode, WcStatus};
    use crate::verbs::device::DeviceConfig;

    /// An RC QP in RTS (connected to itself; nothing is sent) and its one CQ.
    fn rts_qp(n: u8) -> (Qp, Cq) {
        let gid = Gid::from_ipv4([127, 1, 8, n].into());
        let ctx = Context::create(DeviceConfig::default().name(format!("qp-unit{n}")).gid0(gid).seed(1)).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16).unwrap();
        let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
        let av = AddressVector::new(AhAttr::roce(gid, 0), Mtu::Mtu1024);
        qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(Access::REMOTE_WRITE)).unwrap();
        qp.modify(&QpAttr::to_rtr(av, qp.qp_num()).rq_psn(0).max_dest_rd_atomic(1).min_rnr_timer(1)).unwrap();
        qp.modify(&QpAttr::to_rts().sq_psn(0).timeout(10).retry_cnt(7).rnr_retry(7).max_rd_atomic(1)).unwrap();
        (qp, cq)
    }

    /// The two interleavings of the handshake in the module doc, made one step at a time with
    /// the functions a post runs: the engine moves the QP to Error (holding only `core`) either
    /// between the poster's load of the state and its publish, so that its flush misses the
    /// WQE, or after the publish, so that it flushes the WQE itself. Either way the WQE
    /// completes, flushed, exactly once, on the SQ and on the RQ alike.
    /// Rule QPS-ERR-3, QPS-ERR-4, ERR-FLUSH-1
    #[test]
    fn a_wqe_published_as_the_engine_enters_error_is_flushed_once() {
        for (n, engine_first) in [(1, true), (2, false)] {
            let (qp, cq) = rts_qp(n);
            let q = &qp.inner;
            // The engine's step. Taking `core` while a producer lock is held breaks the lock
            // order, which is harmless here: nothing runs on another thread.
            let enter_error = || q.enter_error(&mut qp.lock().unwrap(), true);

            let mut sq = q.sq_ring.producer();
            let state = q.posted_state();
            assert_eq!(state, QpState::Rts);
            if engine_first {
                enter_error();
            }
            qp.queue_send(state, &mut sq, &[SendWr::send_inline(7, b"x")]).unwrap();
            if !engine_first {
                enter_error();
            }
            qp.finish_post(sq, |q, core| q.flush_sq(core));
            let wc = cq.poll_one().unwrap().unwrap();
            assert_eq!((wc.wr_id, wc.status, wc.opcode), (7, WcStatus::WrFlushErr, WcOpcode::Send));
            assert_eq!(cq.poll_one().unwrap(), None);

            // Again on the RQ, of a QP already in Error: back to RTS first.
            for to in [QpAttr::to_reset(), QpAttr::to_init().port(1).pkey_index(0).access(Access::REMOTE_WRITE)] {
                qp.modify(&to).unwrap();
            }
            let mut rq = q.rq_ring.producer();
            let state = q.posted_state();
            assert_eq!(state, QpState::Init);
            if engine_first {
                enter_error();
            }
            qp.queue_recv(state, &mut rq, &[RecvWr::new(8, &[])]).unwrap();
            if !engine_first {
                enter_error();
            }
            qp.finish_post(rq, |q, core| q.flush_rq(core));
            let wc = cq.poll_one().unwrap().unwrap();
            assert_eq!((wc.wr_id, wc.status, wc.opcode), (8, WcStatus::WrFlushErr, WcOpcode::Recv));
            assert_eq!(cq.poll_one().unwrap(), None);
            assert_eq!(qp.outstanding().unwrap(), (0, 0));
        }
    }

    /// A reused SQ slot carries only what its new WR gives: the operands an Atomic or a Send
    /// with Invalidate left in it are cleared by the next WR without them (which a post
    /// writes only then, see `SendWqe`), and a slot whose last WRs had none is left alone.
    /// Rule WR-ATOM-2, WR-SEND-3
    #[test]
    fn a_reused_send_slot_carries_only_its_own_wr() {
        let (qp, _cq) = rts_qp(3);
        let sge = [crate::types::Sge { addr: 0x1000, length: 8, lkey: 1 }];
        let mut slot = SendWqe::default();
        fill_send_wqe(&qp.inner, &mut slot, &SendWr::atomic_cmp_swp(1, &sge, 0x2000, 5, 7, 9));
        assert_eq!((slot.compare_add, slot.swap, slot.rare), (7, 9, true));
        fill_send_wqe(&qp.inner, &mut slot, &SendWr::send_with_inv(2, &sge, 0x77));
        assert_eq!((slot.compare_add, slot.swap, slot.invalidate_rkey, slot.rare), (0, 0, 0x77, true));
        fill_send_wqe(&qp.inner, &mut slot, &SendWr::send(3, &sge));
        assert_eq!((slot.compare_add, slot.swap, slot.invalidate_rkey, slot.rare), (0, 0, 0, false));
        assert!(slot.ah.is_none() && slot.bind.is_none() && slot.fast_reg.is_none());
        fill_send_wqe(&qp.inner, &mut slot, &SendWr::atomic_fetch_add(4, &sge, 0x2000, 5, 3));
        assert_eq!((slot.wr_id, slot.opcode, slot.compare_add, slot.swap), (4, WrOpcode::AtomicFetchAdd, 3, 0));
    }
}
