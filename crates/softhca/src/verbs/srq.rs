//! Shared Receive Queues: one pool of receive WQEs for many QPs, with the SRQ limit event
//! (EVT-SRQ-1, EVT-SRQ-2). An XRC SRQ (IBA Annex A14) belongs to an XRC domain and has a CQ
//! of its own: the XRC target QPs of its domain take its WQEs for the messages that name it,
//! and complete them there.
//!
//! The WQEs are a ring (`transport::wq`) like a QP's RQ: Post SRQ Receive takes only the ring's
//! producer lock; the engines of the QPs that share the SRQ take WQEs from the consumer end,
//! under the SRQ's own lock, which posters never take. Modify SRQ and Destroy SRQ hold both,
//! the SRQ's lock first.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::device::{give, take, DeviceInner};
use super::error::{PostError, Result, VerbsError};
use super::pd::Pd;
use super::types::{AsyncEvent, AsyncEventType, EventElement};
use super::wr::{prepare_recv, RecvWr};
use crate::transport::hca::{CompletionQueue, SharedReceiveQueue};
use crate::transport::wq::{Consumer, Producer, Ring};
use crate::transport::wqe::RecvWqe;

/// Create SRQ input (`ibv_srq_init_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqInitAttr {
    pub max_wr: u32,
    pub max_sge: u32,
    /// 0 leaves the limit unarmed.
    pub srq_limit: u32,
}

impl Default for SrqInitAttr {
    fn default() -> Self {
        SrqInitAttr { max_wr: 128, max_sge: 4, srq_limit: 0 }
    }
}

/// Query SRQ result (`ibv_srq_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqAttr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

pub(crate) struct SrqCore {
    /// The consumer end of `SrqInner::ring`.
    rq: Consumer<RecvWqe>,
    limit: u32,
    qps: u32,
}

/// What an XRC SRQ has beside a basic one.
struct XrcPart {
    xrcd: super::xrcd::Xrcd,
    cq: super::cq::Cq,
    /// `cq` as the transport pushes completions into it.
    sink: Arc<dyn CompletionQueue>,
}

pub(crate) struct SrqInner {
    pub handle: u32,
    /// The SRQ's number (`ibv_get_srq_num`), 24 bits, unique on the device.
    pub srqn: u32,
    pub pd: Pd,
    xrc: Option<XrcPart>,
    pub dev: Arc<DeviceInner>,
    /// Fixed at creation.
    max_sge: u32,
    /// The posting end.
    ring: Arc<Ring<RecvWqe>>,
    /// Set by Destroy SRQ, with both ends held.
    destroyed: AtomicBool,
    core: Mutex<SrqCore>,
}

/// A shared receive queue (`ibv_srq`).
#[derive(Clone)]
pub struct Srq {
    pub(crate) inner: Arc<SrqInner>,
}

impl std::fmt::Debug for Srq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Srq").field("handle", &self.inner.handle).finish()
    }
}

impl Pd {
    /// Create SRQ.
    pub fn create_srq(&self, init: &SrqInitAttr) -> Result<Srq> {
        self.new_srq(init, None)
    }

    /// Create SRQ of type XRC (`IBV_SRQT_XRC`) in XRC domain `xrcd`, its receives completing
    /// on `cq`. Its WQEs' keys belong to this PD, as does every key of a message that names it.
    pub fn create_xrc_srq(&self, xrcd: &super::xrcd::Xrcd, cq: &super::cq::Cq, init: &SrqInitAttr) -> Result<Srq> {
        self.inner.check()?;
        let dev = &self.inner.dev;
        if !Arc::ptr_eq(&xrcd.inner.dev, dev) || !Arc::ptr_eq(&cq.inner.dev, dev) {
            return Err(VerbsError::InvalidArgument("XRC domain or CQ of another device"));
        }
        xrcd.inner.hold()?;
        if let Err(e) = cq.attach(false) {
            xrcd.inner.release();
            return Err(e);
        }
        let part = XrcPart { xrcd: xrcd.clone(), cq: cq.clone(), sink: cq.as_completion_queue() };
        self.new_srq(init, Some(part)).inspect_err(|_| {
            cq.detach();
            xrcd.inner.release();
        })
    }

    fn new_srq(&self, init: &SrqInitAttr, xrc: Option<XrcPart>) -> Result<Srq> {
        self.inner.check()?;
        let dev = &self.inner.dev;
        if init.max_wr == 0 || init.max_wr > dev.attr.max_srq_wr {
            return Err(VerbsError::MaxWrExceeded);
        }
        if init.max_sge > dev.attr.max_srq_sge {
            return Err(VerbsError::MaxSgeExceeded);
        }
        if init.srq_limit > init.max_wr {
            return Err(VerbsError::InvalidArgument("SRQ limit above its size"));
        }
        take(&dev.counts.srq, dev.attr.max_srq)?;
        if let Err(e) = self.inner.hold() {
            give(&dev.counts.srq);
            return Err(e);
        }
        let (ring, rq) = Ring::with_slots(init.max_wr as usize, prepare_recv(init.max_sge));
        let inner = dev.add_srq(|srqn| {
            Arc::new(SrqInner {
                handle: dev.new_handle(),
                srqn,
                pd: self.clone(),
                xrc,
                dev: dev.clone(),
                max_sge: init.max_sge,
                ring,
                destroyed: AtomicBool::new(false),
                core: Mutex::new(SrqCore { rq, limit: init.srq_limit, qps: 0 }),
            })
        });
        Ok(Srq { inner })
    }
}

impl Srq {
    /// The SRQ as its QPs take WQEs from it: every QP gets the same allocation (no per-QP
    /// handle to load first, as for CQs: see `Cq::as_completion_queue`).
    pub(crate) fn as_shared_receive_queue(&self) -> Arc<dyn SharedReceiveQueue> {
        self.inner.clone()
    }

    pub fn handle(&self) -> u32 {
        self.inner.handle
    }

    /// The SRQ's number (`ibv_get_srq_num`): what an XRC initiator's work request names.
    pub fn srq_num(&self) -> u32 {
        self.inner.srqn
    }

    /// An XRC SRQ's domain; `None` for a basic SRQ.
    pub fn xrcd(&self) -> Option<super::xrcd::Xrcd> {
        self.inner.xrc.as_ref().map(|x| x.xrcd.clone())
    }

    fn check(&self) -> Result<()> {
        self.inner.dev.check_open()?;
        if self.inner.destroyed.load(Ordering::Acquire) {
            return Err(VerbsError::InvalidArgument("destroyed SRQ"));
        }
        Ok(())
    }

    fn lock(&self) -> Result<MutexGuard<'_, SrqCore>> {
        let core = self.inner.core.lock().unwrap_or_else(|e| e.into_inner());
        self.check()?;
        Ok(core)
    }

    /// Both ends, in the one order: the SRQ's lock, then the producer lock.
    fn exclusive(&self) -> Result<(MutexGuard<'_, SrqCore>, Producer<'_, RecvWqe>)> {
        let core = self.lock()?;
        Ok((core, self.inner.ring.producer()))
    }

    /// Query SRQ.
    pub fn query(&self) -> Result<SrqAttr> {
        let c = self.lock()?;
        Ok(SrqAttr { max_wr: c.rq.capacity() as u32, max_sge: self.inner.max_sge, srq_limit: c.limit })
    }

    /// Modify SRQ: arm the limit (0 disarms it), and optionally resize.
    pub fn modify(&self, max_wr: Option<u32>, srq_limit: Option<u32>) -> Result<()> {
        let (mut c, mut p) = self.exclusive()?;
        let size = max_wr.unwrap_or(c.rq.capacity() as u32);
        if size == 0 || size > self.inner.dev.attr.max_srq_wr {
            return Err(VerbsError::MaxWrExceeded);
        }
        if (size as usize) < c.rq.len() {
            return Err(VerbsError::InvalidArgument("smaller than the WQEs it holds"));
        }
        let limit = srq_limit.unwrap_or(c.limit);
        if limit > size {
            return Err(VerbsError::InvalidArgument("SRQ limit above its size"));
        }
        if max_wr.is_some() {
            c.rq.resize(&mut p, size as usize, prepare_recv(self.inner.max_sge));
        }
        c.limit = limit;
        Ok(())
    }

    /// Post SRQ Receive: all or none, like `Qp::post_recv`. Takes only the producer lock.
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError> {
        let at = |index: usize| move |error: VerbsError| PostError { index, error };
        let mut p = self.inner.ring.producer();
        self.check().map_err(at(0))?;
        let free = p.free();
        for (i, wr) in wrs.iter().enumerate() {
            wr.check(self.inner.max_sge).map_err(at(i))?;
            if i >= free {
                return Err(at(i)(VerbsError::QueueFull));
            }
        }
        for wr in wrs {
            let Some(slot) = p.next_slot() else { break };
            slot.fill(wr.wr_id, wr.sg_list);
            p.commit();
        }
        p.publish();
        // No doorbell, as for a QP's RQ: nothing in the engine waits for a receive WQE.
        Ok(())
    }

    /// WQEs waiting on the SRQ.
    pub fn len(&self) -> Result<usize> {
        Ok(self.lock()?.rq.len())
    }

    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Destroy SRQ; `InUse` while a QP uses it.
    pub fn destroy(&self) -> Result<()> {
        let (mut c, p) = self.exclusive()?;
        if c.qps > 0 {
            return Err(VerbsError::InUse("shared receive queue has QPs"));
        }
        self.inner.destroyed.store(true, Ordering::Release);
        c.rq.discard();
        drop((p, c));
        let mut srqs = self.inner.dev.srqs.write().unwrap_or_else(|e| e.into_inner());
        srqs.remove(&self.inner.srqn);
        drop(srqs);
        if let Some(x) = &self.inner.xrc {
            x.cq.detach();
            x.xrcd.inner.release();
        }
        self.inner.dev.purge_async_events(super::types::EventElement::Srq(self.inner.handle));
        self.inner.pd.inner.release();
        give(&self.inner.dev.counts.srq);
        Ok(())
    }

    pub(crate) fn attach(&self) -> Result<()> {
        self.lock()?.qps += 1;
        Ok(())
    }

    pub(crate) fn detach(&self) {
        let mut c = self.inner.core.lock().unwrap_or_else(|e| e.into_inner());
        c.qps = c.qps.saturating_sub(1);
    }
}

impl SrqInner {
    /// Whether this is a live XRC SRQ of XRC domain `xrcd`.
    pub fn in_xrcd(&self, xrcd: u32) -> bool {
        self.xrc.as_ref().is_some_and(|x| x.xrcd.inner.handle == xrcd) && !self.destroyed.load(Ordering::Acquire)
    }

    /// The consumer end for a QP's engine, unless the SRQ is destroyed.
    fn consumer(&self) -> Option<MutexGuard<'_, SrqCore>> {
        let core = self.core.lock().unwrap_or_else(|e| e.into_inner());
        (!self.destroyed.load(Ordering::Acquire)).then_some(core)
    }
}

/// How the QPs attached to an SRQ take its WQEs (see `transport::hca`). Every QP holds the
/// same `SrqInner` (see [`Srq::as_shared_receive_queue`]).
impl SharedReceiveQueue for SrqInner {
    fn pd(&self) -> u32 {
        self.pd.inner.handle
    }

    fn xrc(&self) -> Option<(u32, &dyn CompletionQueue, bool)> {
        let x = self.xrc.as_ref()?;
        Some((self.srqn, &*x.sink, !self.destroyed.load(Ordering::Acquire)))
    }

    fn has_wqe(&self) -> bool {
        self.consumer().is_some_and(|c| !c.rq.is_empty())
    }

    /// Takes the head WQE for a QP's inbound message. Leaving fewer than an armed limit raises
    /// SRQ Limit Reached once and disarms the limit.
    fn take_into(&self, slot: &mut RecvWqe) -> bool {
        let fire = {
            let Some(mut c) = self.consumer() else { return false };
            let Some(w) = c.rq.get(0) else { return false };
            slot.fill(w.wr_id, &w.sges);
            c.rq.pop();
            let fire = c.limit > 0 && (c.rq.len() as u32) < c.limit;
            if fire {
                c.limit = 0;
            }
            fire
        };
        if fire {
            self.dev.raise(AsyncEvent {
                event_type: AsyncEventType::SrqLimitReached,
                element: EventElement::Srq(self.handle),
            });
        }
        true
    }
}
