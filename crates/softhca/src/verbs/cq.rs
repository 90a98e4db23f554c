//! Completion Queues and completion channels: create, query, resize, destroy, poll, request
//! notification, and overflow detection (CQ, CRT-CQ and EVT-CN rules).

use std::cell::UnsafeCell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::Duration;

use super::device::{give, take, Context, DeviceInner};
use super::error::{Result, VerbsError};
use super::types::{AsyncEvent, AsyncEventType, EventElement, NotifyKind, Wc};

use crate::transport::hca::CompletionQueue;
pub use crate::transport::hca::CqOverflow;

/// The CQEs, as a ring with one producer side and one consumer side. Producers (the engine,
/// or a verb that flushes) serialize on `producer`; pollers serialize on `consumer`; neither
/// ever takes the other's lock, so polling never waits for the engine (issue 5). The slots
/// and both indices are shared through the Acquire/Release protocol below. Resize, purge and
/// destroy take both locks.
struct Ring {
    /// One cell per slot: a producer writing slot t and a consumer reading slot h never hold
    /// references to the same memory (the box as a whole is only replaced under both locks).
    slots: UnsafeCell<Box<[UnsafeCell<Wc>]>>,
    /// Next slot to poll (written by the consumer side).
    head: AtomicUsize,
    /// Next slot to fill (written by the producer side).
    tail: AtomicUsize,
}

// SAFETY: a slot is written only by the producer side, holding `producer`, before it publishes
// it with a Release store of `tail`; it is read only by the consumer side, holding `consumer`,
// after an Acquire load of `tail` shows it, and handed back with a Release store of `head`,
// which the producer loads with Acquire before reusing the slot. `slots` itself is replaced
// only with both locks held.
unsafe impl Sync for Ring {}

const ARMED_NEXT: u8 = 1;
const ARMED_SOLICITED: u8 = 2;

pub(crate) struct CqInner {
    /// This CQ, for the handle an event hands out when a CQE fires it: QPs write their CQEs
    /// through the `CqInner` every one of them shares (see [`Cq::as_completion_queue`]).
    me: Weak<CqInner>,
    pub handle: u32,
    pub dev: Arc<DeviceInner>,
    ring: Ring,
    /// The producer side's lock, and what it guards beside the ring: whether the CQEs refused
    /// since the last one that fit are an overflow under way (one overflow, one CQ Error).
    producer: Mutex<bool>,
    consumer: Mutex<()>,
    /// The actual size: the ring holds this many CQEs (a power of two).
    size: AtomicU32,
    /// ARMED_NEXT | ARMED_SOLICITED: outstanding notification requests.
    armed: AtomicU8,
    /// Work queues (SQs and RQs) associated with this CQ.
    users: AtomicU32,
    /// Associated with a special QP, which keeps it to itself (CRT-QP-14).
    special: AtomicBool,
    destroyed: AtomicBool,
    /// A CQE was ever refused for lack of room.
    overflowed: AtomicBool,
    /// The last poll found completions waiting and returned them without driving the device
    /// (see [`Cq::poll`]).
    skipped_progress: AtomicBool,
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
        let mut q = self.inner.events.lock().unwrap_or_else(|e| e.into_inner());
        let cq = q.pop_front();
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

    /// Drops the events of `cq` still queued (its destruction: nobody can take them any more).
    fn purge(&self, cq: &Cq) {
        let mut q = self.inner.events.lock().unwrap_or_else(|e| e.into_inner());
        let before = q.len();
        q.retain(|c| c != cq);
        for _ in q.len()..before {
            self.inner.fd.consume();
        }
    }

    fn push(&self, cq: Cq) {
        // The descriptor moves with the queue, under its lock: a reader that takes an event
        // also takes its count, never leaving the descriptor readable over an empty queue.
        let mut q = self.inner.events.lock().unwrap_or_else(|e| e.into_inner());
        q.push_back(cq);
        self.inner.fd.notify();
        drop(q);
        self.inner.ready.notify_all();
    }
}

/// A CQ's size for a request, as Linux's rxe and mlx5 report it: a ring of the next power of
/// two above the request with one slot kept free, so `2^k - 1` CQEs (5 gives 7, 64 gives
/// 127), at most `max` (never below the request, which the caller has checked against `max`).
/// Returns the ring's length and the CQ's size.
fn actual_size(requested: u32, max: u32) -> (u64, u32) {
    let ring = (u64::from(requested.max(1)) + 1).next_power_of_two();
    (ring, (ring - 1).min(u64::from(max)) as u32)
}

/// The slot of CQE number `i` in a ring of `len` slots, a power of two ([`actual_size`]).
fn slot_of(i: usize, len: usize) -> usize {
    i & (len - 1)
}

/// `size` empty slots, or `InsufficientResources` when the memory is not there (a caller may
/// ask for up to `max_cqe`, and a failed allocation must not abort the process).
fn new_slots(size: u64) -> Result<Box<[UnsafeCell<Wc>]>> {
    let size = usize::try_from(size).map_err(|_| VerbsError::InsufficientResources)?;
    let mut v: Vec<UnsafeCell<Wc>> = Vec::new();
    v.try_reserve_exact(size).map_err(|_| VerbsError::InsufficientResources)?;
    v.extend((0..size).map(|_| UnsafeCell::new(Wc::default())));
    Ok(v.into_boxed_slice())
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
        let (ring, size) = actual_size(cqe, self.inner.attr.max_cqe);
        let slots = match new_slots(ring) {
            Ok(s) => s,
            Err(e) => {
                give(&self.inner.counts.cq);
                return Err(e);
            }
        };
        let handle = self.inner.new_handle();
        let inner = Arc::new_cyclic(|me| CqInner {
            me: me.clone(),
            handle,
            dev: self.inner.clone(),
            ring: Ring { slots: UnsafeCell::new(slots), head: AtomicUsize::new(0), tail: AtomicUsize::new(0) },
            producer: Mutex::new(false),
            consumer: Mutex::new(()),
            size: AtomicU32::new(size),
            armed: AtomicU8::new(0),
            users: AtomicU32::new(0),
            special: AtomicBool::new(false),
            destroyed: AtomicBool::new(false),
            overflowed: AtomicBool::new(false),
            skipped_progress: AtomicBool::new(false),
            channel: channel.cloned(),
        });
        self.inner.cqs.write().unwrap_or_else(|e| e.into_inner()).insert(inner.handle, Arc::downgrade(&inner));
        Ok(Cq { inner })
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Cq {
    /// The CQ as a QP's work queues write to it: every QP gets the same allocation, so that
    /// with thousands of QPs a CQE does not first load a per-QP handle (a cache miss a CQE
    /// at 10,000 QPs when each QP wrapped its own `Cq`).
    pub(crate) fn as_completion_queue(&self) -> Arc<dyn CompletionQueue> {
        self.inner.clone()
    }

    pub fn handle(&self) -> u32 {
        self.inner.handle
    }

    fn check(&self) -> Result<()> {
        self.inner.dev.check_open()?;
        if self.inner.destroyed.load(Ordering::Acquire) {
            return Err(VerbsError::InvalidCqHandle);
        }
        Ok(())
    }

    /// Both sides locked, for the verbs that rework the ring; consumer first, always.
    fn exclusive(&self) -> Result<(MutexGuard<'_, ()>, MutexGuard<'_, bool>)> {
        let c = lock(&self.inner.consumer);
        let p = lock(&self.inner.producer);
        self.check()?;
        Ok((c, p))
    }

    fn held(&self) -> usize {
        let r = &self.inner.ring;
        r.tail.load(Ordering::Acquire).wrapping_sub(r.head.load(Ordering::Acquire))
    }

    /// Query CQ: the actual size (CQ-QUERY-1).
    pub fn query(&self) -> Result<u32> {
        self.check()?;
        Ok(self.inner.size.load(Ordering::Acquire))
    }

    /// The number of CQEs waiting to be polled.
    pub fn len(&self) -> Result<usize> {
        self.check()?;
        Ok(self.held())
    }

    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// The CQEs held, oldest first, with both locks held.
    fn drain_all(&self) -> Vec<Wc> {
        let r = &self.inner.ring;
        let (h, t) = (r.head.load(Ordering::Acquire), r.tail.load(Ordering::Acquire));
        // SAFETY: both locks are held by the caller: nobody else touches the box or a slot.
        let slots = unsafe { &*r.slots.get() };
        // SAFETY: as above, every slot is ours to read.
        (h..t).map(|i| unsafe { *slots[slot_of(i, slots.len())].get() }).collect()
    }

    /// Refills the ring (both locks held) with `wcs`, oldest first, in the slots `fresh`, for
    /// a CQ of `size` CQEs.
    fn refill(&self, wcs: &[Wc], mut fresh: Box<[UnsafeCell<Wc>]>, size: u32) {
        let r = &self.inner.ring;
        for (slot, wc) in fresh.iter_mut().zip(wcs) {
            *slot.get_mut() = *wc;
        }
        // SAFETY: both locks are held by the caller: no producer or consumer can see the old
        // or the new slots until the locks are released, and the indices are reset with them.
        unsafe { *r.slots.get() = fresh };
        r.head.store(0, Ordering::Release);
        r.tail.store(wcs.len(), Ordering::Release);
        self.inner.size.store(size, Ordering::Release);
    }

    /// Resize CQ (CQ-RESIZE-1..5): the CQEs it holds stay, in order.
    pub fn resize(&self, cqe: u32) -> Result<u32> {
        let dev = &self.inner.dev;
        let _both = self.exclusive()?;
        if !dev.attr.resize_cq {
            return Err(VerbsError::NotSupported("resize CQ"));
        }
        if cqe > dev.attr.max_cqe {
            return Err(VerbsError::CqSizeTooLarge);
        }
        if cqe == 0 || (cqe as usize) < self.held() {
            return Err(VerbsError::InvalidCqSize("smaller than the CQEs it holds"));
        }
        let (ring, size) = actual_size(cqe, dev.attr.max_cqe);
        let fresh = new_slots(ring)?;
        let held = self.drain_all();
        self.refill(&held, fresh, size);
        Ok(size)
    }

    /// Destroy CQ; `CqInUse` while a work queue still uses it (CQ-DESTROY-2).
    pub fn destroy(&self) -> Result<()> {
        let both = self.exclusive()?;
        if self.inner.users.load(Ordering::Acquire) > 0 {
            return Err(VerbsError::CqInUse);
        }
        self.inner.destroyed.store(true, Ordering::Release);
        self.refill(&[], Box::new([UnsafeCell::new(Wc::default())]), 1);
        drop(both);
        // Its unread completion events and asynchronous events go with it, as the kernel
        // drops them: they would name a CQ that no longer exists.
        if let Some(ch) = &self.inner.channel {
            ch.purge(self);
        }
        let dev = &self.inner.dev;
        dev.purge_async_events(EventElement::Cq(self.inner.handle));
        dev.cqs.write().unwrap_or_else(|e| e.into_inner()).remove(&self.inner.handle);
        give(&dev.counts.cq);
        Ok(())
    }

    /// Poll for Completion: moves up to `wcs.len()` of the oldest CQEs into `wcs` and returns
    /// how many (CQ-POLL-1..4). An empty CQ gives 0. Takes only the pollers' lock, never one
    /// the engine holds.
    pub fn poll(&self, wcs: &mut [Wc]) -> Result<usize> {
        self.poll_with(wcs.len(), |k, w| wcs[k] = *w)
    }

    /// [`Cq::poll`] for up to `max` CQEs, each handed to `take(k, cqe)` (k counting from 0)
    /// where it goes, with no array of them in between: the C ABI converts each straight
    /// into the program's `ibv_wc` (an array of 16 to fill first cost a kilobyte of stores
    /// on every poll, an empty one included).
    pub fn poll_with(&self, max: usize, mut take: impl FnMut(usize, &Wc)) -> Result<usize> {
        // A link driven by its pollers (busy-poll) runs an engine turn here. Completions
        // already waiting are returned first, without one: a turn would take in (and handle)
        // whatever arrived behind the packet that completed them, on the way to an
        // application that is waiting to answer it. Never twice in a row, so that a poller
        // that always finds completions still drives the device.
        let waiting = {
            let r = &self.inner.ring;
            r.tail.load(Ordering::Acquire) != r.head.load(Ordering::Relaxed)
        };
        if !(waiting && max > 0 && !self.inner.skipped_progress.swap(true, Ordering::Relaxed)) {
            self.inner.skipped_progress.store(false, Ordering::Relaxed);
            self.progress();
        }
        self.check()?;
        let r = &self.inner.ring;
        // Empty (head read first: a tail equal to it means the ring was empty when the tail
        // was read): no lock, the commonest answer to a busy poll.
        let h = r.head.load(Ordering::Acquire);
        if max == 0 || r.tail.load(Ordering::Acquire) == h {
            return Ok(0);
        }
        let _consumer = lock(&self.inner.consumer);
        let h = r.head.load(Ordering::Relaxed);
        let t = r.tail.load(Ordering::Acquire);
        let n = max.min(t.wrapping_sub(h));
        // SAFETY: the box is only replaced under both locks, and we hold the consumer lock;
        // a shared reference to it creates none into the slots' contents (they are cells).
        let slots = unsafe { &*r.slots.get() };
        for k in 0..n {
            // SAFETY: slots h..h+n were published by the producer's Release store of `tail`
            // (seen by the Acquire load above) and stay ours until `head` moves past them.
            take(k, unsafe { &*slots[slot_of(h + k, slots.len())].get() });
        }
        r.head.store(h.wrapping_add(n), Ordering::Release);
        // A load and a store, no locked add: pollers of two CQs racing may lose a count,
        // which a driver reads only as "moved or not" (see `Context::handed`).
        let handed = &self.inner.dev.handed;
        handed.store(handed.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
        Ok(n)
    }

    /// Polls one CQE.
    pub fn poll_one(&self) -> Result<Option<Wc>> {
        let mut one = [Wc::default()];
        Ok((self.poll(&mut one)? == 1).then_some(one[0]))
    }

    fn progress(&self) {
        if let Some(hook) = self.inner.dev.progress.get() {
            super::effects::scope(hook);
        }
    }

    /// Request Completion Notification (CQ-NOTIFY-1, EVT-CN-*).
    pub fn req_notify(&self, kind: NotifyKind) -> Result<()> {
        self.check()?;
        let bit = match kind {
            NotifyKind::NextCompletion => ARMED_NEXT,
            NotifyKind::Solicited => ARMED_SOLICITED,
        };
        self.inner.armed.fetch_or(bit, Ordering::AcqRel);
        self.inner.dev.notify_requests.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Whether a CQE was ever refused for lack of room.
    pub fn overflowed(&self) -> Result<bool> {
        self.check()?;
        Ok(self.inner.overflowed.load(Ordering::Acquire))
    }

    /// Associates one more work queue with this CQ; `special` for a special QP's. A CQ of a
    /// special QP serves no other QP, and a special QP takes no CQ another QP uses (CRT-QP-14).
    pub(crate) fn attach(&self, special: bool) -> Result<()> {
        let _both = self.exclusive().map_err(|e| match e {
            VerbsError::InvalidHcaHandle => e,
            _ => VerbsError::InvalidCqHandle,
        })?;
        let (users, claimed) = (self.inner.users.load(Ordering::Acquire), self.inner.special.load(Ordering::Acquire));
        if claimed != special && (claimed || users > 0) {
            return Err(VerbsError::InvalidCqHandle);
        }
        self.inner.special.store(special, Ordering::Release);
        self.inner.users.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    pub(crate) fn detach(&self) {
        let _both = self.exclusive();
        let n = self.inner.users.load(Ordering::Acquire).saturating_sub(1);
        self.inner.users.store(n, Ordering::Release);
        if n == 0 {
            self.inner.special.store(false, Ordering::Release);
        }
    }

    /// Removes every unpolled CQE of QP `qpn`, keeping the others in order (QPS-RESET-6/7).
    pub(crate) fn purge_qp(&self, qpn: u32) {
        let Ok(_both) = self.exclusive() else { return };
        let mut held = self.drain_all();
        held.retain(|wc| wc.qp_num != qpn);
        let r = &self.inner.ring;
        // SAFETY: both locks are held: nobody else touches the box or a slot, and `held` is
        // no longer than the ring it came from.
        let slots = unsafe { &*r.slots.get() };
        for (slot, wc) in slots.iter().zip(&held) {
            // SAFETY: as above.
            unsafe { *slot.get() = *wc };
        }
        r.head.store(0, Ordering::Release);
        r.tail.store(held.len(), Ordering::Release);
    }
}

impl CqInner {
    /// Adds a CQE. `solicited` says whether it is a solicited event (EVT-SOL-*). On overflow
    /// the CQE is not written and a CQ Error is raised on the CQ (CQ-OVF-1, CQ-OVF-2); moving
    /// the QP to Error is the caller's part.
    fn write(&self, wc: Wc, solicited: bool) -> std::result::Result<(), CqOverflow> {
        // Whether it was written, and for a refused one whether it starts an overflow: one CQ
        // Error per overflow, the CQEs refused until one fits again belonging to it. Both are
        // decided under the producer lock, so that producers on several threads agree on
        // where an overflow starts and ends.
        let (written, starts_overflow) = {
            let mut overflowing = lock(&self.producer);
            let r = &self.ring;
            let t = r.tail.load(Ordering::Relaxed);
            let h = r.head.load(Ordering::Acquire);
            let size = self.size.load(Ordering::Acquire) as usize;
            if self.destroyed.load(Ordering::Acquire) || t.wrapping_sub(h) >= size {
                (false, !std::mem::replace(&mut *overflowing, true))
            } else {
                // SAFETY: the box is only replaced under both locks, and we hold the producer
                // lock; a shared reference to it creates none into the slots' contents.
                let slots = unsafe { &*r.slots.get() };
                // SAFETY: slot t is free (the consumer moved `head` past its last use, seen by
                // the Acquire load) and not yet published: only we touch it.
                unsafe { *slots[slot_of(t, slots.len())].get() = wc };
                r.tail.store(t.wrapping_add(1), Ordering::Release);
                *overflowing = false;
                (true, false)
            }
        };
        if !written {
            self.overflowed.store(true, Ordering::Release);
            if starts_overflow {
                let element = EventElement::Cq(self.handle);
                self.dev.raise(AsyncEvent { event_type: AsyncEventType::CqErr, element });
            }
            return Err(CqOverflow);
        }
        // EVT-CN-1, EVT-CN-2, EVT-CN-4, EVT-CN-6: a CQE of the kind asked for consumes every
        // outstanding request in one call.
        let fired = self
            .armed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |a| {
                let fire = a & ARMED_NEXT != 0 || (a & ARMED_SOLICITED != 0 && solicited);
                fire.then_some(0)
            })
            .is_ok();
        if fired {
            self.fire();
        }
        Ok(())
    }

    fn fire(&self) {
        // The CQ is alive while a QP writes to it (the QP holds it).
        let Some(inner) = self.me.upgrade() else { return };
        let cq = Cq { inner };
        if let Some(ch) = &self.channel {
            // The channel's descriptor and waiters are woken once an engine step is over.
            let (ch, cq) = (ch.clone(), cq.clone());
            super::effects::wake(move || ch.push(cq));
        }
        let handler = self.dev.comp_handler.read().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(h) = handler {
            super::effects::call(move || h(&cq));
        }
    }
}

/// How a QP's work queues write their CQEs (see `transport::hca`).
impl CompletionQueue for CqInner {
    fn push(&self, wc: Wc, solicited: bool) -> std::result::Result<(), CqOverflow> {
        self.write(wc, solicited)
    }
}
