//! Queue Pairs: Create, Query, Modify (through the tables of `transport::state`), Destroy, and
//! Post Send / Post Receive with the posting rules of each state (QPS).
//!
//! What the transport engine works on (the attributes, the requester and the responder, the
//! consumer ends of the SQ and the RQ) is behind one per-QP lock, `core`, and nothing
//! device-wide is taken per QP. Posting does not take `core`: the SQ and the RQ are rings
//! (`verbs::wq`) whose producer ends have a lock of their own that the engine never takes, and
//! posters read the QP state from an atomic mirror of `attrs.qp_state`. Locks are always taken
//! in this order: `core`, the SQ's producer lock, the RQ's producer lock, a CQ's.
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
use super::types::{
    Access, AddressVector, AsyncEvent, AsyncEventType, EventElement, MigState, QpState, QpType, Wc, WcOpcode, WcStatus,
};
use super::wr::{RecvWr, SendWr};
use crate::transport::state::check_modify;
use crate::transport::wq::{Consumer, Producer, Ring};
use crate::transport::wqe::{sge_total, wr_allowed, BindRequest, RecvWqe, SendFlags, SendWqe, WrOpcode};
use crate::types::AttrMask;

/// Largest message: 2^31 bytes (WR-WRITE-4).
pub const MAX_MSG_SIZE: u64 = 1 << 31;

/// Queue sizes (`ibv_qp_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

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

/// Alternate path information. softhca has no Automatic Path Migration, so supplying it is
/// `NotSupported` (MOD-GEN-9); the type exists so that the tables can be exercised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AltPath {
    pub av: AddressVector,
    pub pkey_index: u16,
    pub port_num: u8,
    pub timeout: u8,
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
                QpType::Rc | QpType::Rd => AttrMask::READ_EN | AttrMask::WRITE_EN | AttrMask::ATOMIC_EN,
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

/// A QP's current attributes, as Query QP returns them (QPS-GEN-2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QpAttrs {
    pub qp_state: QpState,
    /// Inbound enables: REMOTE_READ, REMOTE_WRITE, REMOTE_ATOMIC.
    pub qp_access_flags: Access,
    pub pkey_index: u16,
    pub qkey: u32,
    pub port_num: u8,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub max_dest_rd_atomic: u8,
    pub max_rd_atomic: u8,
    pub av: Option<AddressVector>,
    pub dest_qp_num: u32,
    pub min_rnr_timer: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub path_mig_state: MigState,
    /// In SQD with messages still in progress.
    pub sq_draining: bool,
    pub en_sqd_async_notify: bool,
    pub cap: QpCap,
}

impl QpAttrs {
    fn reset(cap: QpCap) -> Self {
        QpAttrs {
            qp_state: QpState::Reset,
            qp_access_flags: Access::empty(),
            pkey_index: 0,
            qkey: 0,
            port_num: 1,
            rq_psn: 0,
            sq_psn: 0,
            max_dest_rd_atomic: 0,
            max_rd_atomic: 0,
            av: None,
            dest_qp_num: 0,
            min_rnr_timer: 0,
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
            path_mig_state: MigState::Migrated,
            sq_draining: false,
            en_sqd_async_notify: false,
            cap,
        }
    }

    fn set_enable(&mut self, right: Access, on: bool) {
        self.qp_access_flags.set(right, on);
    }
}

pub(crate) struct QpCore {
    pub attrs: QpAttrs,
    /// The engine's ends of the rings `QpInner::sq_ring` and `QpInner::rq_ring`.
    pub sq: Consumer<SendWqe>,
    pub rq: Consumer<RecvWqe>,
    /// The SRQ WQE an inbound message of this QP is using, when `srq_bound`; the slot is
    /// reused so that taking SRQ WQEs does not allocate.
    pub srq_wqe: RecvWqe,
    pub srq_bound: bool,
    /// The IP header toward the connected peer, with the GID generation and address it was
    /// built for: every packet of an RC or UC QP needs it, and the GID table's lock is not free.
    pub route: Option<(u64, super::types::AhAttr, crate::wire::IpRepr)>,
    /// The SQ Logic; its `started` count is the in-progress messages SQD drains.
    pub req: crate::transport::requester::ReqState,
    /// The RQ Logic.
    pub resp: crate::transport::responder::RespState,
    /// The SQ Drained event was requested at RTS→SQD and not yet raised (EVT-SQD-5).
    pub sqd_event_pending: bool,
    /// RD: the message an EEC carries for this QP and the receive WQEs channels hold.
    pub rd: crate::transport::rd::RdQp,
    /// Responses sent in a row (see `transport::engine::RESPONSE_BURST`).
    pub resp_streak: u8,
}

pub(crate) struct QpInner {
    pub qpn: u32,
    pub qp_type: QpType,
    pub dev: Arc<DeviceInner>,
    pub pd: Pd,
    pub send_cq: Cq,
    pub recv_cq: Cq,
    pub sq_sig_all: bool,
    pub srq: Option<super::srq::Srq>,
    pub rdd: Option<super::eec::Rdd>,
    /// RD: bumped whenever the QP drops the message an EEC carries for it (flush, Reset,
    /// Destroy), so that the EEC, which must not take the QP's lock, sees it is orphaned.
    pub rd_epoch: std::sync::atomic::AtomicU64,
    pub stats: crate::transport::engine::Stats,
    /// Fixed at creation (Modify QP resizes only the queues), so posters check WRs against
    /// them without `core`.
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
    /// The posting ends of the SQ and the RQ.
    pub sq_ring: Arc<Ring<SendWqe>>,
    pub rq_ring: Arc<Ring<RecvWqe>>,
    /// `core.attrs.qp_state` as a `QpState` discriminant, for posters; stored only with `core`
    /// held, right after the state changes.
    state: AtomicU8,
    /// Set by Destroy QP, with `core` and both producer locks held.
    pub destroyed: AtomicBool,
    pub core: Mutex<QpCore>,
}

/// A queue pair (`ibv_qp`). Cloning gives another handle to the same QP.
#[derive(Clone)]
pub struct Qp {
    pub(crate) inner: Arc<QpInner>,
}

impl std::fmt::Debug for Qp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qp").field("qpn", &self.inner.qpn).field("type", &self.inner.qp_type).finish()
    }
}

impl Context {
    /// Create QP (CRT-QP-*). A failed call creates nothing (CRT-QP-13).
    pub fn create_qp(&self, pd: &Pd, init: &QpInitAttr) -> Result<Qp> {
        self.inner.check_open()?;
        if !self.same_device(&pd.inner.dev) {
            return Err(VerbsError::InvalidPd);
        }
        pd.inner.check()?;
        match init.qp_type {
            QpType::Rc | QpType::Uc | QpType::Ud => {}
            QpType::Rd => match &init.rdd {
                Some(rdd) if Arc::ptr_eq(&rdd.inner.dev, &self.inner) => {}
                _ => return Err(VerbsError::InvalidRdd), // CRT-QP-12
            },
            QpType::RawIpv6 | QpType::RawEthertype => {
                return Err(VerbsError::InvalidServiceType("Raw QPs are not implemented yet"))
            }
        }
        for cq in [&init.send_cq, &init.recv_cq] {
            if !self.same_device(&cq.inner.dev) {
                return Err(VerbsError::InvalidCqHandle);
            }
            cq.query().map_err(|_| VerbsError::InvalidCqHandle)?;
        }
        let attr = &self.inner.attr;
        let cap = init.cap;
        if cap.max_send_wr > attr.max_qp_wr || cap.max_recv_wr > attr.max_qp_wr {
            return Err(VerbsError::MaxWrExceeded);
        }
        if cap.max_send_wr == 0 || (cap.max_recv_wr == 0 && init.srq.is_none()) {
            return Err(VerbsError::InvalidArgument("a work queue holds at least one WR"));
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
        let release_rdd = || {
            if let Some(rdd) = &rdd {
                rdd.inner.release();
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
        if let Err(e) = init.send_cq.attach() {
            pd.inner.release();
            undo_count();
            return Err(e);
        }
        if let Err(e) = init.recv_cq.attach() {
            init.send_cq.detach();
            pd.inner.release();
            undo_count();
            return Err(e);
        }
        if let Some(srq) = &init.srq {
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
        let rq_len = if init.srq.is_some() { 0 } else { cap.max_recv_wr as usize };
        let (rq_ring, rq) = Ring::with_slots(rq_len, prepare_recv(cap.max_recv_sge));
        let qpn = self.inner.alloc_qpn();
        let inner = Arc::new(QpInner {
            qpn,
            qp_type: init.qp_type,
            dev: self.inner.clone(),
            pd: pd.clone(),
            send_cq: init.send_cq.clone(),
            recv_cq: init.recv_cq.clone(),
            sq_sig_all: init.sq_sig_all,
            srq: init.srq.clone(),
            rdd,
            rd_epoch: Default::default(),
            stats: Default::default(),
            max_send_sge: cap.max_send_sge,
            max_recv_sge: cap.max_recv_sge,
            max_inline_data: cap.max_inline_data,
            sq_ring,
            rq_ring,
            state: AtomicU8::new(QpState::Reset as u8),
            destroyed: AtomicBool::new(false),
            core: Mutex::new(QpCore {
                attrs: QpAttrs::reset(cap),
                sq,
                rq,
                route: None,
                srq_wqe: RecvWqe::default(),
                srq_bound: false,
                req: Default::default(),
                resp: Default::default(),
                sqd_event_pending: false,
                rd: Default::default(),
                resp_streak: 0,
            }),
        });
        self.inner.qps.write().unwrap_or_else(|e| e.into_inner()).insert(qpn, inner.clone());
        tracing::debug!(device = %self.inner.name, qpn, qp_type = ?init.qp_type, "QP created");
        Ok(Qp { inner })
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

/// Readies an SQ slot so that filling it never allocates: room for the most SGEs and inline
/// bytes a WR may carry.
fn prepare_send(cap: &QpCap) -> impl FnMut(&mut SendWqe) {
    let (sges, inline) = (cap.max_send_sge.max(1) as usize, cap.max_inline_data as usize);
    move |w| {
        w.sges.reserve(sges);
        w.inline.reserve(inline);
    }
}

/// Readies an RQ (or SRQ) slot for `max_sge` SGEs.
pub(crate) fn prepare_recv(max_sge: u32) -> impl FnMut(&mut RecvWqe) {
    let sges = max_sge.max(1) as usize;
    move |w| w.sges.reserve(sges)
}

/// Posts one CQE for a WQE that did not execute. Error CQEs are solicited events (EVT-SOL-2,
/// EVT-SOL-5). False when the CQ was full: it has raised its CQ Error, and the caller moves
/// the QP to Error unless it is there already (CQ-OVF-2).
fn flush_cqe(cq: &Cq, qpn: u32, wr_id: u64, opcode: WcOpcode) -> bool {
    let wc = Wc { wr_id, status: WcStatus::WrFlushErr, opcode, qp_num: qpn, ..Default::default() };
    cq.push(wc, true).is_ok()
}

pub(crate) fn wc_opcode_of(op: WrOpcode) -> WcOpcode {
    match op {
        WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv | WrOpcode::Resync => WcOpcode::Send,
        WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm => WcOpcode::RdmaWrite,
        WrOpcode::RdmaRead => WcOpcode::RdmaRead,
        WrOpcode::AtomicCmpSwp => WcOpcode::CompSwap,
        WrOpcode::AtomicFetchAdd => WcOpcode::FetchAdd,
        WrOpcode::BindMw => WcOpcode::BindMw,
        WrOpcode::LocalInv => WcOpcode::LocalInv,
    }
}

impl QpInner {
    /// Counts an event on this QP and on its device.
    pub fn bump(&self, counter: impl Fn(&crate::transport::engine::Stats) -> &crate::transport::engine::Counter) {
        counter(&self.dev.stats).inc();
        counter(&self.stats).inc();
    }

    pub fn lock(&self) -> Result<MutexGuard<'_, QpCore>> {
        self.dev.check_open()?;
        let core = self.core.lock().unwrap_or_else(|e| e.into_inner());
        if self.destroyed.load(Ordering::Acquire) {
            return Err(VerbsError::InvalidQpHandle);
        }
        Ok(core)
    }

    /// `core` and both producer locks, in the one order (module doc): for the verbs that change
    /// what a post may do.
    fn exclusive(&self) -> Result<(MutexGuard<'_, QpCore>, Producer<'_, SendWqe>, Producer<'_, RecvWqe>)> {
        let core = self.lock()?;
        Ok((core, self.sq_ring.producer(), self.rq_ring.producer()))
    }

    /// The state as a poster sees it, without `core`.
    fn posted_state(&self) -> QpState {
        // SeqCst: the poster's half of the handshake in the module doc.
        let s = self.state.load(Ordering::SeqCst);
        QpState::ALL.get(s as usize).copied().unwrap_or(QpState::Error)
    }

    /// Makes `core.attrs.qp_state` visible to posters. It must come before any flush that
    /// follows the change: the engine's half of the handshake in the module doc.
    fn mirror_state(&self, core: &QpCore) {
        self.state.store(core.attrs.qp_state as u8, Ordering::SeqCst);
    }

    /// The end of a post that published through `producer`: the engine may have moved the QP
    /// to Error since the poster read the state, and its flush may have missed what was just
    /// published (module doc), so `flush` (under `core`) takes whatever is left. Nothing to do
    /// if a Reset or a Destroy discarded it first.
    fn finish_post<T>(&self, producer: Producer<'_, T>, flush: impl FnOnce(&Self, &mut QpCore)) {
        let raced = self.posted_state() == QpState::Error;
        drop(producer);
        if !raced {
            return;
        }
        let Ok(mut core) = self.lock() else { return };
        if core.attrs.qp_state == QpState::Error {
            flush(self, &mut core);
        }
    }

    /// Flushes every outstanding WQE of both queues, each queue in post order (ERR-FLUSH-1,
    /// ERR-FLUSH-3, ERR-FLUSH-5, ERR-FLUSH-6).
    pub fn flush_all(&self, core: &mut QpCore) {
        self.flush_sq(core);
        // WQEs held by RD channels were bound before those still on the RQ.
        crate::transport::rd::release(self, core, true);
        core.req.started = 0;
        core.req.cursor = 0;
        core.req.cursor_off = 0;
        self.flush_rq(core);
        if std::mem::take(&mut core.srq_bound) {
            flush_cqe(&self.recv_cq, self.qpn, core.srq_wqe.wr_id, WcOpcode::Recv);
        }
        self.last_wqe_reached();
    }

    /// Flushes every SQ WQE, in post order.
    fn flush_sq(&self, core: &mut QpCore) {
        self.flush_sq_first(core, usize::MAX);
    }

    /// Flushes the `n` oldest SQ WQEs (or as many as there are), in post order.
    /// False when a flush CQE did not fit in the CQ.
    fn flush_sq_first(&self, core: &mut QpCore, n: usize) -> bool {
        if core.rd.active.take().is_some() {
            self.rd_epoch.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
        let mut fitted = true;
        for _ in 0..n {
            let Some(w) = core.sq.get(0) else { break };
            let (wr_id, opcode) = (w.wr_id, wc_opcode_of(w.opcode));
            core.sq.pop();
            fitted &= flush_cqe(&self.send_cq, self.qpn, wr_id, opcode);
        }
        fitted
    }

    /// Flushes every RQ WQE, in post order.
    fn flush_rq(&self, core: &mut QpCore) {
        while let Some(w) = core.rq.get(0) {
            let wr_id = w.wr_id;
            core.rq.pop();
            self.flush_recv_cqe(core, wr_id, 1);
        }
    }

    /// Flushes one receive WQE. An RD QP's CQE carries the freed resource count (CQE-15): the
    /// `slots` this WQE frees now (1 from the RQ, 0 when a channel held it) plus those channels
    /// freed at bind since the last receive CQE.
    pub(crate) fn flush_recv_cqe(&self, core: &mut QpCore, wr_id: u64, slots: u32) -> bool {
        let freed = if self.qp_type == QpType::Rd { slots + std::mem::take(&mut core.rd.freed) } else { 0 };
        let wc = Wc {
            wr_id,
            status: WcStatus::WrFlushErr,
            opcode: WcOpcode::Recv,
            qp_num: self.qpn,
            freed,
            ..Default::default()
        };
        self.recv_cq.push(wc, true).is_ok()
    }

    /// Checks every value a Modify QP request supplies against the device and the QP
    /// (MOD-GEN-8..11, MOD-GEN-13 via the `Mtu` type, MOD-SQD-RTS-RC-1).
    fn check_values(&self, core: &QpCore, attr: &QpAttr, supplied: AttrMask) -> Result<()> {
        let dev = &self.dev;
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
            if sizes.max_send_wr == 0 || sizes.max_recv_wr == 0 {
                return bad(AttrMask::CAP, "a work queue holds at least one WR");
            }
            if sizes.max_send_wr > dev.attr.max_qp_wr || sizes.max_recv_wr > dev.attr.max_qp_wr {
                return bad(AttrMask::CAP, "above max_qp_wr");
            }
            if (sizes.max_send_wr as usize) < core.sq.len() || (sizes.max_recv_wr as usize) < core.rq.len() {
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
            path_mig_state,
            en_sqd_async_notify
        );
        if let Some(sizes) = attr.cap {
            a.cap.max_send_wr = sizes.max_send_wr;
            a.cap.max_recv_wr = sizes.max_recv_wr;
        }
    }

    /// Moves the QP to Error outside Modify QP (QPT-AUTO-3, QPT-AUTO-4, QPT-AUTO-6). With
    /// `flush` every outstanding WQE is flushed (ERR-FLUSH-1); without it (Class G, ERR-G-2)
    /// they are discarded with no CQE. Responses already queued (the NAK of the error) still
    /// go out.
    pub fn enter_error(&self, core: &mut QpCore, flush: bool) {
        if core.attrs.qp_state != QpState::Error {
            tracing::debug!(qpn = self.qpn, from = %core.attrs.qp_state, "QP → Error");
        }
        core.attrs.qp_state = QpState::Error;
        self.mirror_state(core);
        core.attrs.sq_draining = false;
        core.sqd_event_pending = false;
        core.req.ack_deadline = None;
        core.req.rnr_deadline = None;
        if flush {
            self.flush_all(core);
        } else {
            core.sq.discard();
            core.rq.discard();
            core.srq_bound = false;
            core.req.started = 0;
            core.req.cursor = 0;
            crate::transport::rd::release(self, core, false);
            self.last_wqe_reached();
        }
    }

    /// EVT-LWR-1: a QP on an SRQ that enters Error reports Last WQE Reached once its last
    /// SRQ WQE has its CQE; here that CQE (if any) was just written by the flush.
    fn last_wqe_reached(&self) {
        if self.srq.is_some() {
            self.dev.raise(AsyncEvent {
                event_type: AsyncEventType::QpLastWqeReached,
                element: EventElement::Qp(self.qpn),
            });
        }
    }

    /// A UC, UD or RD SQ WQE completed in error: the QP moves to SQE and the WQEs queued
    /// behind it are flushed (ERR-SQ-1, ERR-SQE-1, QPT-AUTO-1, QPT-AUTO-2); WRs posted from now
    /// on wait for SQE→RTS. This is the first half, done before the error CQE is written: from
    /// here on a
    /// poster sees SQE and its WR waits for SQE→RTS. Returns how many WQEs were published
    /// before (SeqCst, against the poster's publish-then-look): those, and only those, are
    /// flushed by [`QpInner::finish_sqe`]. An application that polled the error CQE and then
    /// posted must find its WR held, not flushed (QPS-SQE, ERR-SQ-1).
    pub fn begin_sqe(&self, core: &mut QpCore) -> usize {
        tracing::debug!(qpn = self.qpn, from = %core.attrs.qp_state, "QP → SQE");
        core.attrs.qp_state = QpState::Sqe;
        self.mirror_state(core);
        core.attrs.sq_draining = false;
        core.sqd_event_pending = false;
        core.sq.len()
    }

    /// The second half: flushes the `queued` WQEs that preceded the move to SQE.
    pub fn finish_sqe(&self, core: &mut QpCore, queued: usize) {
        if !self.flush_sq_first(core, queued) {
            self.enter_error(core, false); // CQ-OVF-2: a flush CQE did not fit
            return;
        }
        let psn = core.req.psn;
        let (retry, rnr) = (core.attrs.retry_cnt, core.attrs.rnr_retry);
        core.req.start(psn, retry, rnr);
    }

    /// Raises SQ Drained once the drain a RTS→SQD asked about is over (EVT-SQD-1, -3, -4, -5).
    pub fn check_drained(&self, core: &mut QpCore) {
        if core.attrs.qp_state == QpState::Sqd && core.req.started == 0 {
            core.attrs.sq_draining = false;
            if core.sqd_event_pending {
                core.sqd_event_pending = false;
                self.dev
                    .raise(AsyncEvent { event_type: AsyncEventType::SqDrained, element: EventElement::Qp(self.qpn) });
            }
        }
    }
}

impl Qp {
    /// The 24-bit QP number.
    pub fn qp_num(&self) -> u32 {
        self.inner.qpn
    }

    pub fn qp_type(&self) -> QpType {
        self.inner.qp_type
    }

    pub fn pd(&self) -> &Pd {
        &self.inner.pd
    }

    pub fn send_cq(&self) -> &Cq {
        &self.inner.send_cq
    }

    pub fn recv_cq(&self) -> &Cq {
        &self.inner.recv_cq
    }

    /// The current state.
    pub fn state(&self) -> Result<QpState> {
        Ok(self.inner.lock()?.attrs.qp_state)
    }

    /// Query QP: the current state and attributes (QPS-GEN-2).
    pub fn query(&self) -> Result<QpAttrs> {
        Ok(self.inner.lock()?.attrs.clone())
    }

    /// Modify QP. Either everything the request asks happens, or (on error) nothing at all
    /// (MOD-GEN-5).
    pub fn modify(&self, attr: &QpAttr) -> Result<()> {
        super::callbacks::scope(|| self.modify_locked(attr))
    }

    fn modify_locked(&self, attr: &QpAttr) -> Result<()> {
        let q = &self.inner;
        // Posters wait until the change is complete: none may publish into a queue that a
        // Reset is discarding or a resize is moving, nor post in a state that no longer holds.
        let (mut core, mut sq, mut rq) = q.exclusive()?;
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
        q.check_values(&core, attr, supplied)?;

        let mut next = core.attrs.clone();
        q.apply(&mut next, attr, supplied);
        next.qp_state = to;
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
                core.sqd_event_pending = false;
                q.send_cq.purge_qp(q.qpn);
                q.recv_cq.purge_qp(q.qpn);
                let cap = core.attrs.cap;
                core.attrs = QpAttrs::reset(cap);
                q.mirror_state(&core);
            }
            // QPT-SW-9: Error → Error changes nothing (no second flush, no second Last WQE
            // Reached, no response dropped).
            QpState::Error if from == QpState::Error => {}
            QpState::Error => {
                next.sq_draining = false;
                core.attrs = next;
                q.mirror_state(&core);
                core.sqd_event_pending = false;
                core.resp.out.clear();
                core.req.ack_deadline = None;
                core.req.rnr_deadline = None;
                q.flush_all(&mut core);
            }
            _ => {
                if let Some(sizes) = attr.cap {
                    let cap = core.attrs.cap;
                    core.sq.resize(&mut sq, sizes.max_send_wr as usize, prepare_send(&cap));
                    core.rq.resize(&mut rq, sizes.max_recv_wr as usize, prepare_recv(cap.max_recv_sge));
                }
                if from == QpState::Rts && to == QpState::Sqd {
                    next.sq_draining = core.req.started > 0;
                    core.sqd_event_pending = next.en_sqd_async_notify;
                }
                if to != QpState::Sqd {
                    next.sq_draining = false;
                }
                match (from, to) {
                    (QpState::Init, QpState::Rtr) => core.resp.start(next.rq_psn),
                    (QpState::Rtr, QpState::Rts) => core.req.start(next.sq_psn, next.retry_cnt, next.rnr_retry),
                    (QpState::Sqe, QpState::Rts) => core.req.halted = false,
                    _ => {}
                }
                core.attrs = next;
                q.mirror_state(&core);
                q.check_drained(&mut core);
            }
        }
        tracing::debug!(qpn = q.qpn, %from, %to, ?supplied, "modify QP");
        drop((rq, sq, core));
        q.dev.ring();
        Ok(())
    }

    /// Post Send: validates every WR first and queues all or none (an immediate error queues
    /// nothing). In Error each WR is flushed at once, in post order (QPS-ERR-3).
    pub fn post_send(&self, wrs: &[SendWr<'_>]) -> std::result::Result<(), PostError> {
        super::callbacks::scope(|| self.post_send_locked(wrs))
    }

    fn post_send_locked(&self, wrs: &[SendWr<'_>]) -> std::result::Result<(), PostError> {
        let q = &self.inner;
        q.dev.check_open().map_err(at(0))?;
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
        q.finish_post(sq, |q, core| q.flush_sq(core));
        q.dev.ring();
        Ok(())
    }

    /// Post Send holding `core`, where the state cannot change under it: for posting in Error.
    fn post_send_with_core(&self, wrs: &[SendWr<'_>]) -> std::result::Result<(), PostError> {
        let q = &self.inner;
        let mut core = q.lock().map_err(at(0))?;
        let mut sq = q.sq_ring.producer();
        let state = core.attrs.qp_state;
        if state == QpState::Error {
            self.check_sends(wrs, None)?;
            q.flush_sq(&mut core);
            for wr in wrs {
                flush_cqe(&q.send_cq, q.qpn, wr.wr_id, wc_opcode_of(wr.opcode));
            }
        } else {
            // Out of Error again (a Reset and back) since the state was first read.
            self.queue_send(state, &mut sq, wrs)?;
        }
        drop((sq, core));
        q.dev.ring();
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
        if matches!(wr.opcode, WrOpcode::LocalInv | WrOpcode::SendWithInv) {
            return Err(VerbsError::NotSupported("invalidation is not implemented yet"));
        }
        if wr.opcode == WrOpcode::BindMw && wr.bind.is_none() {
            return Err(VerbsError::InvalidWr("a Bind MW work request needs its window and region"));
        }
        let inline = wr.send_flags.contains(SendFlags::INLINE) && wr.opcode.gathers();
        if inline_bytes(wr).is_none() && wr.sg_list.len() > q.max_send_sge as usize {
            return Err(VerbsError::MaxSgeExceeded);
        }
        if inline && wr_length(wr) > q.max_inline_data as u64 {
            return Err(VerbsError::InvalidWr("inline data above max_inline_data"));
        }
        let length = wr_length(wr);
        if length > MAX_MSG_SIZE {
            return Err(VerbsError::InvalidWr("message longer than 2^31 bytes"));
        }
        if wr.opcode.is_atomic() && (wr.sg_list.len() != 1 || wr.sg_list[0].length != 8) {
            return Err(VerbsError::InvalidWr("an atomic takes exactly one 8-byte scatter entry"));
        }
        if q.qp_type == QpType::Ud {
            let ah = wr.ah.ok_or(VerbsError::InvalidWr("a UD send needs an address handle"))?;
            ah.check()?;
            if !Arc::ptr_eq(&ah.inner.pd, &q.pd.inner) {
                return Err(VerbsError::InvalidWr("address handle of another protection domain"));
            }
            if wr.remote_qpn > 0xFF_FFFF {
                return Err(VerbsError::InvalidWr("remote QPN above 2^24-1"));
            }
        }
        if q.qp_type == QpType::Rd && (wr.remote_qpn > 0xFF_FFFF || wr.eecn > 0xFF_FFFF) {
            return Err(VerbsError::InvalidWr("remote QPN and EECN are 24-bit"));
        }
        Ok(())
    }

    /// Post Receive: all or none, like [`Qp::post_send`]. Refused only in Reset (QPS-RESET-3);
    /// held in Init, flushed at once in Error (QPS-ERR-4).
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError> {
        super::callbacks::scope(|| self.post_recv_locked(wrs))
    }

    fn post_recv_locked(&self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError> {
        let q = &self.inner;
        q.dev.check_open().map_err(at(0))?;
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
        q.finish_post(rq, |q, core| q.flush_rq(core));
        // No doorbell: the RQ Logic is passive. It takes a WQE when a request arrives, and a
        // requester held off by an RNR NAK retries on its own timer (PKT-RNR-2).
        Ok(())
    }

    /// Post Receive holding `core`: for posting in Error.
    fn post_recv_with_core(&self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError> {
        let q = &self.inner;
        let mut core = q.lock().map_err(at(0))?;
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
        if self.inner.srq.is_some() {
            return Err(at(0)(VerbsError::InvalidWr("the QP receives through an SRQ")));
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
            "{:?} req {:?} resp epsn {:#x} out {} sq {} rq {} head {:?}",
            core.attrs.qp_state,
            core.req,
            core.resp.epsn,
            core.resp.out.len(),
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
        let core = self.inner.lock()?;
        Ok((core.sq.len(), core.rq.len()))
    }

    /// Destroy QP: accepted in every state (QPT-SW-12). Outstanding WQEs are discarded; CQEs
    /// already on the CQs stay there to be polled.
    pub fn destroy(&self) -> Result<()> {
        super::callbacks::scope(|| self.destroy_locked())
    }

    fn destroy_locked(&self) -> Result<()> {
        let q = &self.inner;
        let (mut core, sq, rq) = q.exclusive()?;
        // The ACKs this QP owes outlive it: the application may have seen the completions they
        // acknowledge, and a peer waiting for them would retry into a missing QP. Built now,
        // sent by the next transmit (the doorbell below asks for it).
        let owed = crate::transport::engine::owed_acks(q, &mut core);
        q.destroyed.store(true, Ordering::Release);
        crate::transport::rd::release(q, &mut core, false);
        core.sq.discard();
        core.rq.discard();
        drop((rq, sq, core));
        q.dev.qps.write().unwrap_or_else(|e| e.into_inner()).remove(&q.qpn);
        q.send_cq.detach();
        q.recv_cq.detach();
        if let Some(srq) = &q.srq {
            srq.detach();
        }
        q.pd.inner.release();
        if let Some(rdd) = &q.rdd {
            rdd.inner.release();
        }
        // Its unread asynchronous events name a QP that no longer exists: dropped, as the
        // kernel drops them.
        q.dev.purge_async_events(super::types::EventElement::Qp(q.qpn));
        give(&q.dev.counts.qp);
        q.dev.orphan(owed);
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

/// Copies an INLINE WR's gather list into `out`, each piece checked against its L_Key.
fn inline_from_sges(q: &QpInner, sges: &[crate::types::Sge], out: &mut Vec<u8>) -> bool {
    for s in sges {
        let Ok(m) =
            super::mr::check_access(&q.dev, s.lkey, q.pd.inner.handle, s.addr, s.length as u64, Access::empty())
        else {
            return false;
        };
        let at = out.len();
        out.resize(at + s.length as usize, 0);
        if m.read(0, &mut out[at..]).is_err() {
            return false;
        }
    }
    true
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
            slot.sges.extend_from_slice(wr.sg_list);
        }
    }
    slot.length = wr_length(wr);
    slot.imm_data = wr.imm_data;
    slot.invalidate_rkey = wr.invalidate_rkey;
    slot.remote_addr = wr.remote_addr;
    slot.rkey = wr.rkey;
    slot.compare_add = wr.compare_add;
    slot.swap = wr.swap;
    slot.ah = wr.ah.map(|a| a.attr());
    slot.remote_qpn = wr.remote_qpn;
    slot.remote_qkey = wr.remote_qkey;
    slot.eecn = wr.eecn;
    slot.bind = wr.bind.map(|b| BindRequest {
        mw: b.mw.inner.clone(),
        rkey: b.rkey,
        mr_key: b.mr.lkey(),
        addr: b.addr,
        length: b.length,
        access: b.access,
        new_key: b.new_key,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{AhAttr, Gid, Mtu};
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
            let enter_error = || q.enter_error(&mut q.lock().unwrap(), true);

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
            q.finish_post(sq, |q, core| q.flush_sq(core));
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
            q.finish_post(rq, |q, core| q.flush_rq(core));
            let wc = cq.poll_one().unwrap().unwrap();
            assert_eq!((wc.wr_id, wc.status, wc.opcode), (8, WcStatus::WrFlushErr, WcOpcode::Recv));
            assert_eq!(cq.poll_one().unwrap(), None);
            assert_eq!(qp.outstanding().unwrap(), (0, 0));
        }
    }
}
