//! Reliable Datagram Domains and End-to-End Contexts (EECs): the objects of the RD service.
//!
//! An RD QP names, in each Send WR, the local EEC its message goes through (WR-SEND-6). The
//! EEC holds what a connected QP would: the path, the PSNs, the timers and retry counts, the
//! P_Key; the QP holds the queues, the Q_Key and the inbound enables. An EEC and the QPs that
//! use it belong to one RDD. A pair of EECs on two devices is a Reliable Datagram Channel.
//!
//! Locking: a QP's lock is always taken before an EEC's lock, never the other way round.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::device::{give, take, Context, DeviceInner};
use super::error::{Result, VerbsError};
use super::types::{AddressVector, QpState};
pub use crate::transport::rd::eec::EecAttrs;
use crate::transport::rd::eec::{EecCore, EecInner};
use crate::transport::rd::EecEngine;

pub(crate) struct RddInner {
    pub handle: u32,
    pub dev: Arc<DeviceInner>,
    destroyed: AtomicBool,
    /// QPs and EECs in this domain.
    users: AtomicU32,
}

/// A reliable datagram domain (`ibv_rdd` of the IBA verbs; libibverbs has none).
#[derive(Clone)]
pub struct Rdd {
    pub(crate) inner: Arc<RddInner>,
}

impl std::fmt::Debug for Rdd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rdd").field("handle", &self.inner.handle).finish()
    }
}

impl PartialEq for Rdd {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl RddInner {
    /// Records one more QP or EEC in the domain; `InvalidRdd` once it was deallocated.
    pub fn hold(&self) -> Result<()> {
        self.dev.check_open()?;
        self.users.fetch_add(1, Ordering::AcqRel);
        if self.destroyed.load(Ordering::Acquire) {
            self.users.fetch_sub(1, Ordering::AcqRel);
            return Err(VerbsError::InvalidRdd);
        }
        Ok(())
    }

    pub fn release(&self) {
        self.users.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Context {
    /// Allocate Reliable Datagram Domain.
    pub fn alloc_rdd(&self) -> Result<Rdd> {
        self.inner.check_open()?;
        take(&self.inner.counts.rdd, self.inner.attr.max_rdd)?;
        Ok(Rdd {
            inner: Arc::new(RddInner {
                handle: self.inner.new_handle(),
                dev: self.inner.clone(),
                destroyed: AtomicBool::new(false),
                users: AtomicU32::new(0),
            }),
        })
    }
}

impl Rdd {
    pub fn handle(&self) -> u32 {
        self.inner.handle
    }

    /// Deallocate Reliable Datagram Domain; refused with `InUse` while a QP or EEC is in it.
    pub fn dealloc(&self) -> Result<()> {
        self.inner.dev.check_open()?;
        if self.inner.destroyed.swap(true, Ordering::AcqRel) {
            return Err(VerbsError::InvalidRdd);
        }
        if self.inner.users.load(Ordering::Acquire) != 0 {
            self.inner.destroyed.store(false, Ordering::Release);
            return Err(VerbsError::InUse("reliable datagram domain has QPs or EECs"));
        }
        give(&self.inner.dev.counts.rdd);
        Ok(())
    }
}

bitflags::bitflags! {
    /// The parameters a Modify EEC request supplies.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct EecAttrMask: u32 {
        const PKEY_INDEX = 1 << 0;
        const PORT = 1 << 1;
        const AV = 1 << 2;
        const DEST_EECN = 1 << 3;
        const RQ_PSN = 1 << 4;
        const MAX_DEST_RD_ATOMIC = 1 << 5;
        const SQ_PSN = 1 << 6;
        const TIMEOUT = 1 << 7;
        const RETRY_CNT = 1 << 8;
        const RNR_RETRY = 1 << 9;
        const MAX_RD_ATOMIC = 1 << 10;
    }
}

/// Required and optional parameters of each EEC transition, as the QP tables are for RC: the
/// path and the receive side at Init→RTR, the send side at RTR→RTS.
fn eec_rule(from: QpState, to: QpState) -> Option<(EecAttrMask, EecAttrMask)> {
    use EecAttrMask as M;
    use QpState as S;
    let none = M::empty();
    Some(match (from, to) {
        (S::Sqe, _) | (_, S::Sqe) => return None, // QPS-RD-6: an EEC has no SQE state
        (_, S::Reset) | (_, S::Error) => (none, none),
        (S::Reset, S::Init) => (M::PKEY_INDEX | M::PORT, none),
        (S::Init, S::Init) => (none, M::PKEY_INDEX | M::PORT),
        (S::Init, S::Rtr) => (M::AV | M::DEST_EECN | M::RQ_PSN | M::MAX_DEST_RD_ATOMIC, M::PKEY_INDEX),
        (S::Rtr, S::Rts) => (M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_RD_ATOMIC, M::empty()),
        (S::Rts, S::Rts) => (none, M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY),
        (S::Rts, S::Sqd) => (none, none),
        (S::Sqd, S::Rts) | (S::Sqd, S::Sqd) => {
            (none, M::AV | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::PKEY_INDEX | M::MAX_RD_ATOMIC)
        }
        _ => return None,
    })
}

/// A Modify EEC request: the next state plus the parameters supplied.
#[derive(Debug, Clone, Default)]
pub struct EecAttr {
    pub state: QpState,
    pub pkey_index: Option<u16>,
    pub port_num: Option<u8>,
    pub av: Option<AddressVector>,
    /// The EECN of the remote EEC of the channel: every packet's RDETH carries it.
    pub dest_eecn: Option<u32>,
    pub rq_psn: Option<u32>,
    pub max_dest_rd_atomic: Option<u8>,
    pub sq_psn: Option<u32>,
    pub timeout: Option<u8>,
    pub retry_cnt: Option<u8>,
    pub rnr_retry: Option<u8>,
    pub max_rd_atomic: Option<u8>,
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

impl EecAttr {
    pub fn new(state: QpState) -> Self {
        EecAttr { state, ..Default::default() }
    }

    setters! {
        pkey_index: u16,
        port_num: u8,
        av: AddressVector,
        dest_eecn: u32,
        rq_psn: u32,
        max_dest_rd_atomic: u8,
        sq_psn: u32,
        timeout: u8,
        retry_cnt: u8,
        rnr_retry: u8,
        max_rd_atomic: u8,
    }

    fn mask(&self) -> EecAttrMask {
        let mut m = EecAttrMask::empty();
        for (present, bit) in [
            (self.pkey_index.is_some(), EecAttrMask::PKEY_INDEX),
            (self.port_num.is_some(), EecAttrMask::PORT),
            (self.av.is_some(), EecAttrMask::AV),
            (self.dest_eecn.is_some(), EecAttrMask::DEST_EECN),
            (self.rq_psn.is_some(), EecAttrMask::RQ_PSN),
            (self.max_dest_rd_atomic.is_some(), EecAttrMask::MAX_DEST_RD_ATOMIC),
            (self.sq_psn.is_some(), EecAttrMask::SQ_PSN),
            (self.timeout.is_some(), EecAttrMask::TIMEOUT),
            (self.retry_cnt.is_some(), EecAttrMask::RETRY_CNT),
            (self.rnr_retry.is_some(), EecAttrMask::RNR_RETRY),
            (self.max_rd_atomic.is_some(), EecAttrMask::MAX_RD_ATOMIC),
        ] {
            if present {
                m |= bit;
            }
        }
        m
    }
}

/// An End-to-End Context. Cloning gives another handle to the same EEC.
#[derive(Clone)]
pub struct Eec {
    pub(crate) inner: Arc<EecInner>,
    dev: Arc<DeviceInner>,
    rdd: Rdd,
    /// Destroys the EEC with its last handle (see [`super::LastHandle`]).
    _last: Arc<super::LastHandle>,
}

impl std::fmt::Debug for Eec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Eec").field("eecn", &self.inner.eecn).finish()
    }
}

impl Context {
    /// Create EEC in `rdd`. EECNs come from their own 24-bit space.
    pub fn create_eec(&self, rdd: &Rdd) -> Result<Eec> {
        self.inner.check_open()?;
        if !Arc::ptr_eq(&rdd.inner.dev, &self.inner) {
            return Err(VerbsError::InvalidRdd);
        }
        take(&self.inner.counts.eec, self.inner.attr.max_ee)?;
        if let Err(e) = rdd.inner.hold() {
            give(&self.inner.counts.eec);
            return Err(e);
        }
        // EECNs come from their own 24-bit space.
        let next = || self.inner.next_eecn.fetch_add(1, Ordering::Relaxed) & 0xFF_FFFF;
        let inner = self.inner.engine.add_eec(next, |eecn| {
            Arc::new(EecInner {
                eecn,
                dev: self.inner.clone(),
                rdd: rdd.inner.handle,
                core: Mutex::new(EecCore {
                    destroyed: false,
                    attrs: EecAttrs::default(),
                    engine: EecEngine::default(),
                }),
            })
        });
        tracing::debug!(device = %self.inner.name, eecn = inner.eecn, "EEC created");
        let (held, held_dev, held_rdd) = (inner.clone(), self.inner.clone(), rdd.clone());
        let _last = super::LastHandle::new(move || {
            let _ = release(&held, &held_dev, &held_rdd);
        });
        Ok(Eec { inner, dev: self.inner.clone(), rdd: rdd.clone(), _last })
    }
}

impl Eec {
    pub fn eecn(&self) -> u32 {
        self.inner.eecn
    }

    pub fn rdd(&self) -> &Rdd {
        &self.rdd
    }

    fn locked(&self) -> Result<MutexGuard<'_, EecCore>> {
        self.dev.check_open()?;
        live_core(&self.inner)
    }

    /// Query EEC.
    pub fn query(&self) -> Result<EecAttrs> {
        Ok(self.locked()?.attrs.clone())
    }

    /// Modify EEC: the transition must exist, required parameters must be supplied and no
    /// other ones; an EEC has no SQE state (QPS-RD-6).
    pub fn modify(&self, attr: &EecAttr) -> Result<()> {
        let dev = &self.dev;
        let mut core = self.locked()?;
        let from = core.attrs.state;
        let to = attr.state;
        let (required, optional) = eec_rule(from, to).ok_or(VerbsError::InvalidTransition)?;
        let supplied = attr.mask();
        if !(required - supplied).is_empty() {
            return Err(VerbsError::InvalidArgument("a parameter this EEC transition requires is missing"));
        }
        if !(supplied - required - optional).is_empty() {
            return Err(VerbsError::InvalidArgument("a parameter this EEC transition does not take"));
        }
        if attr.pkey_index.is_some_and(|i| dev.pkey(i).is_none()) {
            return Err(VerbsError::InvalidArgument("P_Key index outside the table"));
        }
        if attr.port_num.is_some_and(|p| p == 0 || p > dev.attr.phys_port_cnt) {
            return Err(VerbsError::InvalidArgument("no such port"));
        }
        if attr.dest_eecn.is_some_and(|n| n > 0xFF_FFFF) || attr.rq_psn.is_some_and(|p| p > 0xFF_FFFF) {
            return Err(VerbsError::InvalidArgument("EECNs and PSNs are 24-bit"));
        }
        if attr.sq_psn.is_some_and(|p| p > 0xFF_FFFF) {
            return Err(VerbsError::InvalidArgument("EECNs and PSNs are 24-bit"));
        }
        if attr.retry_cnt.is_some_and(|n| n > 7) || attr.rnr_retry.is_some_and(|n| n > 7) {
            return Err(VerbsError::InvalidArgument("retry counts are 3-bit"));
        }
        if attr.timeout.is_some_and(|t| t > 31) {
            return Err(VerbsError::InvalidArgument("the timeout is 5-bit"));
        }
        let max = dev.attr.max_qp_rd_atom;
        if [attr.max_rd_atomic, attr.max_dest_rd_atomic].iter().flatten().any(|&d| d as u32 > max) {
            return Err(VerbsError::InvalidArgument("RDMA Read / Atomic depth above the device's"));
        }
        if let Some(av) = &attr.av {
            super::ah::validate_ah_attr(dev, &av.ah, crate::types::AttrMask::AV)?;
        }
        let a = &mut core.attrs;
        macro_rules! apply {
            ($($f:ident),*) => { $( if let Some(v) = attr.$f { a.$f = v; } )* };
        }
        apply!(pkey_index, port_num, dest_eecn, rq_psn, max_dest_rd_atomic, sq_psn, timeout, retry_cnt, rnr_retry);
        apply!(max_rd_atomic);
        if attr.av.is_some() {
            a.av = attr.av;
        }
        a.state = to;
        if to == QpState::Reset {
            *a = EecAttrs::default(); // the attributes return to their Reset values
        }
        let attrs = a.clone();
        // As for a QP (and at Destroy EEC): the ACKs the channel already owes leave, though
        // the move to Error drops its other responses (PKT-ACK-13).
        let owed = match (from, to) {
            (QpState::Error, _) | (_, QpState::Reset) => Vec::new(),
            (_, QpState::Error) => crate::transport::rd::owed_acks(&self.inner, &mut core),
            _ => Vec::new(),
        };
        let counts_set = attr.retry_cnt.is_some() || attr.rnr_retry.is_some();
        core.engine.on_modify(from, &attrs, counts_set);
        tracing::debug!(eecn = self.inner.eecn, %from, %to, "modify EEC");
        drop(core);
        if !owed.is_empty() {
            dev.orphan(owed);
        }
        dev.ring();
        Ok(())
    }

    /// Destroy EEC. A message it was carrying completes in error at its QP's next turn.
    pub fn destroy(&self) -> Result<()> {
        super::effects::scope(|| self.destroy_locked())
    }

    fn destroy_locked(&self) -> Result<()> {
        self.dev.check_open()?;
        release(&self.inner, &self.dev, &self.rdd)
    }
}

/// The EEC's core, locked; refused once the EEC is destroyed.
fn live_core(eec: &EecInner) -> Result<MutexGuard<'_, EecCore>> {
    let core = eec.lock();
    if core.destroyed {
        return Err(VerbsError::InvalidArgument("EEC destroyed"));
    }
    Ok(core)
}

/// Destroy EEC on an open device, or with the EEC's last handle on any.
fn release(eec: &EecInner, dev: &DeviceInner, rdd: &Rdd) -> Result<()> {
    let mut core = live_core(eec)?;
    // The ACKs the channel owes outlive it (see Qp::destroy).
    let owed = crate::transport::rd::owed_acks(eec, &mut core);
    core.destroyed = true;
    core.attrs.state = QpState::Error;
    drop(core);
    dev.engine.remove_eec(eec.eecn);
    rdd.inner.release();
    give(&dev.counts.eec);
    dev.orphan(owed);
    dev.ring();
    Ok(())
}
