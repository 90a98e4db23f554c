//! An open context and the process's one device behind it: `Ctx` (the `verbs_context` a
//! program holds), the shared device (`Shared`, on the UDP or the shared-memory link) that
//! routes its asynchronous events to the contexts, each context's event queue and the objects
//! an event can name, and the helpers every verb's file reaches them through ([`ctx`]) or
//! waits on acknowledgements with. The device-level verbs that open and query them are in
//! `device.rs`, which is the only file that names the other verbs' files (its ops tables).

use std::collections::{HashMap, VecDeque};
use std::ffi::c_int;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};

use softhca::link::shm::{ShmConfig, ShmDevice};
use softhca::link::udp::{UdpConfig, UdpDevice};
use softhca::{AsyncEvent, Context, EventElement};

use crate::abi::*;

pub(crate) const DEVICE_NAME: &str = "softhca0";

/// The link the process's device is on: UDP sockets (the default), or shared-memory rings
/// with `SOFTHCA_LINK=shm` (processes of one host).
pub enum LinkDevice {
    Udp(UdpDevice),
    Shm(ShmDevice),
}

impl LinkDevice {
    pub fn context(&self) -> &Context {
        match self {
            LinkDevice::Udp(d) => d.context(),
            LinkDevice::Shm(d) => d.context(),
        }
    }

    /// The device's address (its GID 0).
    pub fn addr(&self) -> IpAddr {
        match self {
            LinkDevice::Udp(d) => d.addr(),
            LinkDevice::Shm(d) => IpAddr::V4(d.addr()),
        }
    }
}

/// The process's open device, shared by its contexts.
pub struct Shared {
    pub dev: LinkDevice,
    /// The open contexts (their addresses): where the device's asynchronous events go.
    pub(crate) contexts: Mutex<Vec<usize>>,
    /// `SOFTHCA_STATS=1` printed the counters at exit: a close after that (a library's own
    /// exit handler) prints them no second time.
    stats_printed: std::sync::atomic::AtomicBool,
    /// The fork generation that opened it (`fork::generation`): a device a fork left in a
    /// child is not the child's.
    generation: u32,
    /// Bytes of the device's memory allocated (`dm::MAX_DM_SIZE` at most), shared with each
    /// allocation, which gives its bytes back when it goes.
    pub(crate) dm_pool: Arc<std::sync::atomic::AtomicUsize>,
}

/// The shared device behind `slot`, if this process opened it: one a fork left behind is
/// kept from being freed (its threads are the parent's; dropping it would join them) and
/// taken for none.
fn own(slot: &Weak<Shared>) -> Option<Arc<Shared>> {
    let s = slot.upgrade()?;
    if !s.inherited() {
        return Some(s);
    }
    std::mem::forget(s);
    None
}

/// The shared device while any context holds it.
static SHARED: Mutex<Weak<Shared>> = Mutex::new(Weak::new());

/// The open device, or a new one (then its asynchronous events are routed to the contexts),
/// on `addr` if given, else on `SOFTHCA_ADDR` or the first free 127.0.0.x. An open device
/// keeps its address: `addr` only chooses for a device not yet open.
pub(crate) fn shared_device(addr: Option<IpAddr>) -> std::io::Result<Arc<Shared>> {
    let mut slot = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(s) = own(&slot) {
        return Ok(s);
    }
    let generation = crate::fork::generation();
    let busy = std::env::var("SOFTHCA_BUSY_POLL").is_ok_and(|v| v == "1");
    let dev = match std::env::var("SOFTHCA_LINK").as_deref() {
        Ok("shm") => {
            let mut cfg = ShmConfig::default().name(DEVICE_NAME).busy_poll(busy);
            cfg.addr = match addr {
                None => None,
                Some(IpAddr::V4(a)) => Some(a),
                Some(IpAddr::V6(_)) => return Err(std::io::Error::from_raw_os_error(libc::EAFNOSUPPORT)),
            };
            LinkDevice::Shm(ShmDevice::open(cfg)?)
        }
        Ok("udp") | Err(_) => {
            let mut cfg = UdpConfig::default().name(DEVICE_NAME).busy_poll(busy);
            cfg.addr = addr;
            LinkDevice::Udp(UdpDevice::open(cfg)?)
        }
        Ok(other) => {
            eprintln!("softhca: SOFTHCA_LINK={other:?}: the link is udp or shm");
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
    };
    let s = Arc::new(Shared {
        dev,
        contexts: Mutex::new(Vec::new()),
        stats_printed: Default::default(),
        generation,
        dm_pool: Default::default(),
    });
    let weak = Arc::downgrade(&s);
    let routed = s.dev.context().set_async_event_handler(move |ev| {
        if let Some(s) = weak.upgrade() {
            s.route(ev);
        }
    });
    if routed.is_err() {
        return Err(std::io::Error::from_raw_os_error(libc::ENODEV));
    }
    *slot = Arc::downgrade(&s);
    // At exit, what the program posted leaves first (see `drain_at_exit`); once a process.
    static DRAIN: std::sync::Once = std::sync::Once::new();
    // SAFETY: registers a plain extern "C" function with no arguments.
    DRAIN.call_once(|| unsafe {
        libc::atexit(drain_at_exit);
    });
    if std::env::var("SOFTHCA_STATS").is_ok_and(|v| v == "1") {
        // Once a process: a program that opens the device again (UCX probes it first) would
        // otherwise print the last one's counters once per open.
        static AT_EXIT: std::sync::Once = std::sync::Once::new();
        // SAFETY: registers a plain extern "C" function with no arguments.
        AT_EXIT.call_once(|| unsafe {
            libc::atexit(print_stats);
        });
        STATS_DEV.lock().unwrap_or_else(|e| e.into_inner()).clone_from(&Arc::downgrade(&s));
    }
    Ok(s)
}

/// At exit with the device open, its engine gets up to a second to send what the program posted
/// (and destroyed nothing of): on Linux rxe did it in `ibv_post_send`, so a program that posts
/// unsignaled sends and exits loses none. Runs after the thread-locals are gone: a lock, the
/// engine's atomics and a clock only.
extern "C" fn drain_at_exit() {
    let dev = own(&SHARED.lock().unwrap_or_else(|e| e.into_inner()));
    if let Some(s) = dev {
        crate::settle(|| s.dev.context().unsent(), crate::SETTLE_MAX);
    }
}

/// The device whose counters `SOFTHCA_STATS=1` prints at exit.
static STATS_DEV: Mutex<Weak<Shared>> = Mutex::new(Weak::new());

/// `SOFTHCA_STATS=1`: the device's counters (the transport's and the link's) on stderr when
/// the process exits with the device open, for a look at what a program did without a
/// debugger, as rxe's `hw_counters` in sysfs give. A device closed before (perftest closes its
/// own before it exits) printed them as it closed (`Drop for Shared`).
extern "C" fn print_stats() {
    let dev = own(&STATS_DEV.lock().unwrap_or_else(|e| e.into_inner()));
    if let Some(s) = dev {
        s.print_stats();
    }
}

impl Shared {
    /// Opened by the process a fork made this one from (see `fork`).
    pub(crate) fn inherited(&self) -> bool {
        self.generation != crate::fork::generation()
    }

    fn print_stats(&self) {
        if self.stats_printed.swap(true, std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let link = match &self.dev {
            LinkDevice::Udp(d) => format!("{:?}", d.counters()),
            LinkDevice::Shm(d) => format!("{:?}", d.counters()),
        };
        // One write for both lines: stderr is unbuffered, and `eprintln!` writes a formatted
        // line piece by piece, so the lines of processes sharing a stderr (MPI ranks under
        // mpirun) came out interleaved mid-line, unreadable to whoever parses them.
        let text = format!("softhca stats: {:?}\nsofthca stats: {link}\n", self.dev.context().counters());
        let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), text.as_bytes());
    }
}

impl Drop for Shared {
    /// The last context closed the device: its counters, if `SOFTHCA_STATS=1` asked for them.
    fn drop(&mut self) {
        if std::env::var("SOFTHCA_STATS").is_ok_and(|v| v == "1") {
            self.print_stats();
        }
    }
}

impl Shared {
    /// Hands `ev` to the context that owns the object it names (every context for a port or
    /// device event). The device also queues each event for readers of its own, which the
    /// drop-in has none of: those copies are dropped here, so that queue stays empty.
    fn route(&self, ev: &AsyncEvent) {
        while self.dev.context().get_async_event().is_some() {}
        let contexts = self.contexts.lock().unwrap_or_else(|e| e.into_inner());
        for &c in contexts.iter() {
            // SAFETY: a context is in the list from its open until its close, which takes it
            // out under this lock before freeing it.
            let c = unsafe { &*(c as *const Ctx) };
            // Pushed under the objects lock: a destroy takes its object out of the map under
            // that lock and purges the queue after, so no event of a destroyed object stays.
            let o = c.objects.lock().unwrap_or_else(|e| e.into_inner());
            let mine = match ev.element {
                EventElement::Qp(qpn) => o.qps.contains_key(&qpn),
                EventElement::Cq(h) => o.cqs.contains_key(&h),
                EventElement::Srq(h) => o.srqs.contains_key(&h),
                EventElement::Port(_) | EventElement::Device => true,
            };
            if mine {
                c.events.push(*ev);
            }
            drop(o);
        }
    }
}

/// A context's asynchronous events, with the descriptor (`async_fd`) that is readable while
/// any wait: an eventfd in semaphore mode, blocking until the program makes it non-blocking,
/// as libibverbs' is. Its count moves with the queue, under the queue's lock.
pub(crate) struct EventQueue {
    queue: Mutex<VecDeque<AsyncEvent>>,
    pub(crate) fd: OwnedFd,
    /// Set (under the queue's lock) when the context closes: waiters return, no one enters.
    closed: AtomicBool,
    /// The threads inside `ibv_get_async_event` of this context; its close waits for none.
    inside: Mutex<usize>,
    left: Condvar,
}

impl EventQueue {
    pub(crate) fn new() -> std::io::Result<EventQueue> {
        // SAFETY: eventfd takes no pointers; it returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a descriptor just opened and owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(EventQueue {
            queue: Mutex::new(VecDeque::new()),
            fd,
            closed: AtomicBool::new(false),
            inside: Mutex::new(0),
            left: Condvar::new(),
        })
    }

    /// Takes one count off the descriptor; the caller holds the queue's lock and has just
    /// removed an event, so the count is at least one and the read does not block.
    fn take_count(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live local from our own eventfd.
        unsafe { libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }

    fn push(&self, ev: AsyncEvent) {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        q.push_back(ev);
        self.notify();
    }

    /// One count more on the descriptor.
    fn notify(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live local to our own eventfd.
        unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Drops the waiting events that name `element` (it is being destroyed), as the kernel
    /// drops a destroyed object's unread events.
    fn purge(&self, element: EventElement) {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let before = q.len();
        q.retain(|e| e.element != element);
        for _ in q.len()..before {
            self.take_count();
        }
    }

    /// The oldest event; waits for one unless `nonblocking`. `Err(errno)`: EIO once the
    /// context closes, EINTR when a signal ended the wait (see `crate::wait_event`).
    pub(crate) fn pop(&self, nonblocking: bool) -> Result<Option<AsyncEvent>, c_int> {
        loop {
            {
                let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
                if self.closed.load(Ordering::SeqCst) {
                    return Err(libc::EIO);
                }
                if let Some(ev) = q.pop_front() {
                    self.take_count();
                    return Ok(Some(ev));
                }
                if nonblocking {
                    return Ok(None);
                }
            }
            crate::wait_event(self.fd.as_raw_fd())?;
        }
    }

    /// Counts the caller in as a thread inside `ibv_get_async_event`; false once closed.
    pub(crate) fn enter(&self) -> bool {
        let mut n = self.inside.lock().unwrap_or_else(|e| e.into_inner());
        if self.closed.load(Ordering::SeqCst) {
            return false;
        }
        *n += 1;
        true
    }

    /// Counts the caller out; the context may be freed as soon as this returns.
    pub(crate) fn leave(&self) {
        let mut n = self.inside.lock().unwrap_or_else(|e| e.into_inner());
        *n -= 1;
        if *n == 0 {
            self.left.notify_all();
        }
    }

    /// Closes the queue, as the kernel closes a context's async event file with it: threads
    /// waiting for an event return (EIO), and this returns once none is inside any more.
    pub(crate) fn close(&self) {
        {
            let _q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            self.closed.store(true, Ordering::SeqCst);
        }
        // A count for the waiters blocked in their read: each puts it back for the next (see
        // `crate::wait_event`) and finds the queue closed.
        self.notify();
        let mut n = self.inside.lock().unwrap_or_else(|e| e.into_inner());
        while *n > 0 {
            n = self.left.wait(n).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// An open context: the `struct verbs_context` the program sees (the extended ops, then the
/// `ibv_context` it holds a pointer to), the shared device and its verbs context, the objects
/// an asynchronous event can name, by handle, and the events for them.
#[repr(C)]
pub struct Ctx {
    pub ops_ex: verbs_context_ops,
    pub ibv: ibv_context,
    pub shared: Arc<Shared>,
    pub ctx: Context,
    pub(crate) objects: Mutex<Objects>,
    pub(crate) events: EventQueue,
    /// What `cmd_fd` shows: softhca has no uverbs command channel, but programs dup the
    /// descriptor to import the context elsewhere (then told EOPNOTSUPP), so it is a real one.
    pub(crate) cmd: OwnedFd,
}

/// An anonymous file of its own for a context's `cmd_fd`.
pub(crate) fn cmd_file() -> std::io::Result<OwnedFd> {
    // SAFETY: a NUL-terminated name; memfd_create returns a new descriptor or -1.
    let fd = unsafe { libc::memfd_create(c"softhca-cmd".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor just opened and owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The file (device, inode) behind a descriptor.
fn file_id(fd: c_int) -> Option<(u64, u64)> {
    // SAFETY: fstat writes into a local buffer; a bad descriptor gives -1.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

/// Whether `fd` is (a duplicate of) the `cmd_fd` of one of this process's open contexts.
pub(crate) fn is_context_cmd_fd(fd: c_int) -> bool {
    let Some(id) = file_id(fd) else { return false };
    let Some(shared) = own(&SHARED.lock().unwrap_or_else(|e| e.into_inner())) else { return false };
    let contexts = shared.contexts.lock().unwrap_or_else(|e| e.into_inner());
    contexts.iter().any(|&c| {
        // SAFETY: a context in the list is open (see `Shared::route`).
        file_id(unsafe { &*(c as *const Ctx) }.cmd.as_raw_fd()) == Some(id)
    })
}

/// What `pick` takes from an object of `c`'s user context: of `c`, or of a context imported
/// from it or from which it was imported (they share one command file, as contexts sharing a
/// kernel ucontext do). `pick` runs under that context's objects lock, and must take there
/// all it needs of an object it finds: the verbs that free a PD or MR take it out of the map
/// under that lock, then free it, so an object in the map is live only while the lock is held.
pub(crate) fn find_shared<T>(c: &Ctx, pick: impl Fn(&Objects) -> Option<T>) -> Option<T> {
    let id = file_id(c.cmd.as_raw_fd())?;
    let contexts = c.shared.contexts.lock().unwrap_or_else(|e| e.into_inner());
    contexts.iter().find_map(|&p| {
        // SAFETY: a context in the list is open (see `Shared::route`).
        let other = unsafe { &*(p as *const Ctx) };
        if file_id(other.cmd.as_raw_fd()) != Some(id) {
            return None;
        }
        pick(&other.objects.lock().unwrap_or_else(|e| e.into_inner()))
    })
}

/// The C objects of a context an event can name (their addresses, by QPN or handle).
#[derive(Default)]
pub(crate) struct Objects {
    pub qps: HashMap<u32, usize>,
    pub cqs: HashMap<u32, usize>,
    pub srqs: HashMap<u32, usize>,
    /// PDs and MRs by handle: what `ibv_import_pd` / `ibv_import_mr` find from a context
    /// that shares this one's command file (see [`find_shared`]).
    pub pds: HashMap<u32, usize>,
    pub mrs: HashMap<u32, usize>,
    /// Asynchronous events handed out per object (by address): its destroy waits until the
    /// program acknowledged as many (see [`wait_for_acks`]).
    pub delivered: HashMap<usize, u32>,
    /// Device memory by handle: what `ibv_import_dm` finds (see `dm`).
    pub dms: HashMap<u32, usize>,
}

impl Ctx {
    /// Takes the CQ, QP or SRQ `element` names out of this context's objects, then drops its
    /// unread events. In that order: the router queues an event only under the objects lock
    /// and only for an object still in the map, so nothing of it can arrive after the purge.
    pub(crate) fn forget(&self, element: EventElement) {
        {
            let mut o = self.objects.lock().unwrap_or_else(|e| e.into_inner());
            match element {
                EventElement::Qp(qpn) => o.qps.remove(&qpn),
                EventElement::Cq(h) => o.cqs.remove(&h),
                EventElement::Srq(h) => o.srqs.remove(&h),
                EventElement::Port(_) | EventElement::Device => None,
            };
        }
        self.events.purge(element);
    }
}

/// Takes `object` out of the event bookkeeping and waits, as libibverbs does, until the
/// program acknowledged every asynchronous event it was handed for it: the counter at
/// `acked` under the object's `mutex`, signalled on `cond` by `ibv_ack_async_event` (`device.rs`).
/// The caller has already removed the object from its map, so no event can name it any more.
///
/// # Safety
/// The three pointers are fields of the live C object at address `object`.
pub(crate) unsafe fn wait_for_acks(
    c: &Ctx,
    object: usize,
    mutex: *mut libc::pthread_mutex_t,
    cond: *mut libc::pthread_cond_t,
    acked: *const u32,
) {
    let delivered = c.objects.lock().unwrap_or_else(|e| e.into_inner()).delivered.remove(&object).unwrap_or(0);
    // SAFETY: as the caller promises.
    unsafe { wait_until(mutex, cond, acked, delivered) };
}

/// Waits, under `mutex`, until the counter at `acked` reaches `target` (signalled on `cond`
/// by [`acknowledge`]).
///
/// # Safety
/// The pointers are fields of a live C object (its own mutex, condition and counter).
pub(crate) unsafe fn wait_until(
    mutex: *mut libc::pthread_mutex_t,
    cond: *mut libc::pthread_cond_t,
    acked: *const u32,
    target: u32,
) {
    // SAFETY: as the caller promises; the counter is read under the mutex that guards it.
    unsafe {
        libc::pthread_mutex_lock(mutex);
        while acked.read() != target {
            libc::pthread_cond_wait(cond, mutex);
        }
        libc::pthread_mutex_unlock(mutex);
    }
}

/// Adds `n` acknowledgements to the counter at `acked` under `mutex` and signals `cond`.
///
/// # Safety
/// The pointers are fields of a live C object.
pub(crate) unsafe fn acknowledge(
    mutex: *mut libc::pthread_mutex_t,
    cond: *mut libc::pthread_cond_t,
    acked: *mut u32,
    n: u32,
) {
    // SAFETY: as the caller promises.
    unsafe {
        libc::pthread_mutex_lock(mutex);
        acked.write(acked.read().wrapping_add(n));
        libc::pthread_cond_signal(cond);
        libc::pthread_mutex_unlock(mutex);
    }
}

/// The context behind an `ibv_context` pointer.
///
/// # Safety
/// `c` comes from `ibv_open_device` (`device.rs`) and is not closed.
pub(crate) unsafe fn ctx<'a>(c: *mut ibv_context) -> &'a Ctx {
    // SAFETY: the pointer is the `ibv` field of a repr(C) Ctx (container_of).
    unsafe { &*c.cast::<u8>().sub(std::mem::offset_of!(Ctx, ibv)).cast::<Ctx>() }
}

/// Whether the objects of context `c` are the parent's, left in this child by a fork (see
/// `fork`). Their device's threads stayed with the parent and its locks are as they were at
/// the fork, perhaps held by one of those threads for ever, so a destroy of such an object
/// touches nothing and returns 0, as closing the context does: the child's copy is left to
/// its exit. (Before, about one child in a hundred that cleaned up while the parent's engine
/// was busy hung in Destroy QP.)
///
/// # Safety
/// As [`ctx`].
pub(crate) unsafe fn left_by_fork(c: *mut ibv_context) -> bool {
    // SAFETY: as the caller promises.
    unsafe { ctx(c) }.shared.inherited()
}
