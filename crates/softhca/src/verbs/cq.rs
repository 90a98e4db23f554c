//! Completion Queues and completion channels: create, query, resize, destroy, poll, request
//! notification, and overflow detection (CQ, CRT-CQ and EVT-CN rules).

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::device::{give, take, Context, DeviceInner};
use super::error::{Result, VerbsError};
use super::types::{AsyncEvent, AsyncEventType, EventElement, NotifyKind, Wc};

/// The CQ already holds as many unpolled CQEs as its size (CQ-OVF-1): the CQE was not written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqOverflow;

struct CqCore {
    entries: VecDeque<Wc>,
    size: u32,
    armed_next: bool,
    armed_solicited: bool,
    /// Work queues (SQs and RQs) associated with this CQ.
    users: u32,
    destroyed: bool,
    overflowed: bool,
}

pub(crate) struct CqInner {
    pub handle: u32,
    pub dev: Arc<DeviceInner>,
    core: Mutex<CqCore>,
    channel: Option<CompChannel>,
}

/// A completion queue (`ibv_cq`). Cloning gives another handle to the same CQ.
#[derive(Clone)]
pub struct Cq {
    pub(crate) inner: Arc<CqInner>,
}

impl std::fmt::Debug for Cq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cq").field("handle", &self.inner.handle).finish()
    }
}

impl PartialEq for Cq {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

struct ChannelInner {
    events: Mutex<VecDeque<Cq>>,
    ready: Condvar,
    /// Readable while events are pending.
    fd: super::eventfd::EventFd,
}

/// A completion event channel (`ibv_comp_channel`): CQs created with it report their
/// notifications here, in order.
#[derive(Clone)]
pub struct CompChannel {
    inner: Arc<ChannelInner>,
}

impl CompChannel {
    /// The next completion event, if one is waiting.
    pub fn try_get_cq_event(&self) -> Option<Cq> {
        let cq = self.inner.events.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
        if cq.is_some() {
            self.inner.fd.consume();
        }
        cq
    }

    /// A descriptor that is readable while a completion event is waiting, for poll/epoll
    /// (`ibv_comp_channel::fd`). Take the events with [`CompChannel::try_get_cq_event`].
    pub fn fd(&self) -> std::os::fd::RawFd {
        self.inner.fd.raw()
    }

    /// Waits up to `timeout` for the next completion event (`ibv_get_cq_event`).
    pub fn get_cq_event(&self, timeout: Duration) -> Option<Cq> {
        let q = self.inner.events.lock().unwrap_or_else(|e| e.into_inner());
        let (mut q, _) =
            self.inner.ready.wait_timeout_while(q, timeout, |q| q.is_empty()).unwrap_or_else(|e| e.into_inner());
        let cq = q.pop_front();
        if cq.is_some() {
            self.inner.fd.consume();
        }
        cq
    }

    fn push(&self, cq: Cq) {
        self.inner.events.lock().unwrap_or_else(|e| e.into_inner()).push_back(cq);
        self.inner.fd.notify();
        self.inner.ready.notify_all();
    }
}

fn actual_size(requested: u32) -> u32 {
    requested.max(1).next_power_of_two()
}

impl Context {
    /// Create Completion Event Channel.
    pub fn create_comp_channel(&self) -> Result<CompChannel> {
        self.inner.check_open()?;
        let fd = super::eventfd::EventFd::new().map_err(|_| VerbsError::InsufficientResources)?;
        Ok(CompChannel {
            inner: Arc::new(ChannelInner { events: Mutex::new(VecDeque::new()), ready: Condvar::new(), fd }),
        })
    }

    /// Create CQ holding at least `cqe` entries (CRT-CQ-1..4).
    pub fn create_cq(&self, cqe: u32) -> Result<Cq> {
        self.create_cq_with_channel(cqe, None)
    }

    /// Create CQ whose notifications go to `channel`.
    pub fn create_cq_with_channel(&self, cqe: u32, channel: Option<&CompChannel>) -> Result<Cq> {
        self.inner.check_open()?;
        if cqe == 0 {
            return Err(VerbsError::InvalidCqSize("a CQ holds at least one CQE"));
        }
        if cqe > self.inner.attr.max_cqe {
            return Err(VerbsError::CqSizeTooLarge);
        }
        take(&self.inner.counts.cq, self.inner.attr.max_cq)?;
        let size = actual_size(cqe).min(self.inner.attr.max_cqe);
        let inner = Arc::new(CqInner {
            handle: self.inner.new_handle(),
            dev: self.inner.clone(),
            core: Mutex::new(CqCore {
                entries: VecDeque::with_capacity(size as usize),
                size,
                armed_next: false,
                armed_solicited: false,
                users: 0,
                destroyed: false,
                overflowed: false,
            }),
            channel: channel.cloned(),
        });
        self.inner.cqs.write().unwrap_or_else(|e| e.into_inner()).insert(inner.handle, Arc::downgrade(&inner));
        Ok(Cq { inner })
    }
}

impl Cq {
    pub fn handle(&self) -> u32 {
        self.inner.handle
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, CqCore>> {
        self.inner.dev.check_open()?;
        let core = self.inner.core.lock().unwrap_or_else(|e| e.into_inner());
        if core.destroyed {
            return Err(VerbsError::InvalidCqHandle);
        }
        Ok(core)
    }

    /// Query CQ: the actual size (CQ-QUERY-1).
    pub fn query(&self) -> Result<u32> {
        Ok(self.lock()?.size)
    }

    /// The number of CQEs waiting to be polled.
    pub fn len(&self) -> Result<usize> {
        Ok(self.lock()?.entries.len())
    }

    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Resize CQ (CQ-RESIZE-1..5): the CQEs it holds stay, in order.
    pub fn resize(&self, cqe: u32) -> Result<u32> {
        let dev = &self.inner.dev;
        let mut core = self.lock()?;
        if !dev.attr.resize_cq {
            return Err(VerbsError::NotSupported("resize CQ"));
        }
        if cqe > dev.attr.max_cqe {
            return Err(VerbsError::CqSizeTooLarge);
        }
        if cqe == 0 || (cqe as usize) < core.entries.len() {
            return Err(VerbsError::InvalidCqSize("smaller than the CQEs it holds"));
        }
        let size = actual_size(cqe).min(dev.attr.max_cqe);
        let extra = (size as usize).saturating_sub(core.entries.capacity());
        core.entries.reserve(extra);
        core.size = size;
        Ok(size)
    }

    /// Destroy CQ; `CqInUse` while a work queue still uses it (CQ-DESTROY-2).
    pub fn destroy(&self) -> Result<()> {
        let mut core = self.lock()?;
        if core.users > 0 {
            return Err(VerbsError::CqInUse);
        }
        core.destroyed = true;
        core.entries = VecDeque::new();
        drop(core);
        let dev = &self.inner.dev;
        dev.cqs.write().unwrap_or_else(|e| e.into_inner()).remove(&self.inner.handle);
        give(&dev.counts.cq);
        Ok(())
    }

    /// Poll for Completion: moves up to `wcs.len()` of the oldest CQEs into `wcs` and returns
    /// how many (CQ-POLL-1..4). An empty CQ gives 0.
    pub fn poll(&self, wcs: &mut [Wc]) -> Result<usize> {
        self.progress();
        let mut core = self.lock()?;
        let n = wcs.len().min(core.entries.len());
        for (slot, wc) in wcs.iter_mut().zip(core.entries.drain(..n)) {
            *slot = wc;
        }
        Ok(n)
    }

    /// Polls one CQE.
    pub fn poll_one(&self) -> Result<Option<Wc>> {
        self.progress();
        Ok(self.lock()?.entries.pop_front())
    }

    fn progress(&self) {
        let hook = self.inner.dev.progress.read().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(hook) = hook {
            super::callbacks::scope(|| hook());
        }
    }

    /// Request Completion Notification (CQ-NOTIFY-1, EVT-CN-*).
    pub fn req_notify(&self, kind: NotifyKind) -> Result<()> {
        let mut core = self.lock()?;
        match kind {
            NotifyKind::NextCompletion => core.armed_next = true,
            NotifyKind::Solicited => core.armed_solicited = true,
        }
        Ok(())
    }

    /// Whether a CQE was ever refused for lack of room.
    pub fn overflowed(&self) -> Result<bool> {
        Ok(self.lock()?.overflowed)
    }

    /// Associates one more work queue with this CQ.
    pub(crate) fn attach(&self) -> Result<()> {
        self.lock()
            .map_err(|e| match e {
                VerbsError::InvalidHcaHandle => e,
                _ => VerbsError::InvalidCqHandle,
            })?
            .users += 1;
        Ok(())
    }

    pub(crate) fn detach(&self) {
        let mut core = self.inner.core.lock().unwrap_or_else(|e| e.into_inner());
        core.users = core.users.saturating_sub(1);
    }

    /// Adds a CQE. `solicited` says whether it is a solicited event (EVT-SOL-*). On overflow
    /// the CQE is not written and a CQ Error is raised on the CQ (CQ-OVF-1, CQ-OVF-2); moving
    /// the QP to Error is the caller's part.
    pub(crate) fn push(&self, wc: Wc, solicited: bool) -> std::result::Result<(), CqOverflow> {
        let notify = {
            let mut core = self.inner.core.lock().unwrap_or_else(|e| e.into_inner());
            if core.destroyed || core.entries.len() >= core.size as usize {
                core.overflowed = true;
                None
            } else {
                core.entries.push_back(wc);
                let fire = core.armed_next || (core.armed_solicited && solicited);
                if fire {
                    // EVT-CN-4, EVT-CN-6: one call consumes every outstanding request.
                    core.armed_next = false;
                    core.armed_solicited = false;
                }
                Some(fire)
            }
        };
        match notify {
            None => {
                self.inner.dev.raise(AsyncEvent {
                    event_type: AsyncEventType::CqErr,
                    element: EventElement::Cq(self.inner.handle),
                });
                Err(CqOverflow)
            }
            Some(fire) => {
                if fire {
                    self.fire();
                }
                Ok(())
            }
        }
    }

    fn fire(&self) {
        let handler = self.inner.dev.comp_handler.read().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(h) = handler {
            let cq = self.clone();
            super::callbacks::call(move || h(&cq));
        }
        if let Some(ch) = &self.inner.channel {
            ch.push(self.clone());
        }
    }

    /// Removes every unpolled CQE of QP `qpn`, keeping the others in order (QPS-RESET-6/7).
    pub(crate) fn purge_qp(&self, qpn: u32) {
        let mut core = self.inner.core.lock().unwrap_or_else(|e| e.into_inner());
        core.entries.retain(|wc| wc.qp_num != qpn);
    }
}
