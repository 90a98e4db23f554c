//! The software HCA: its attributes, its port, and the per-device tables (QPNs, keys, resource
//! counts, asynchronous events). A [`Context`] is the open device (`ibv_context`).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock, Weak};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::cq::CqInner;
use super::error::{Result, VerbsError};
use super::mr::KeyTable;
use super::srq::SrqInner;
use super::types::{Access, AsyncEvent, EventElement, Gid, Mtu, QpType, WcStatus};
use crate::mem::{AccessError, MemRef};
use crate::transport::engine::{DeviceCounters, Engine};
use crate::transport::hca::{Hca, InvalidateError, SharedReceiveQueue};
use crate::transport::wqe::{BindRequest, FastRegRequest};

/// `ibv_atomic_cap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomicCap {
    None,
    /// Atomic against this HCA's own atomics only.
    Hca,
    /// Atomic against the HCA and the CPU: softhca uses real 64-bit CAS/FAA on host memory.
    Glob,
}

/// Device attributes (`ibv_device_attr`). The defaults are softhca's real limits; each is
/// enforced by the verb it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAttr {
    pub fw_ver: String,
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub max_qp: u32,
    pub max_qp_wr: u32,
    pub max_sge: u32,
    pub max_sge_rd: u32,
    pub max_cq: u32,
    pub max_cqe: u32,
    pub max_mr: u32,
    pub max_pd: u32,
    pub max_qp_rd_atom: u32,
    pub max_qp_init_rd_atom: u32,
    pub max_res_rd_atom: u32,
    pub max_ah: u32,
    pub max_srq: u32,
    pub max_srq_wr: u32,
    pub max_srq_sge: u32,
    pub max_mw: u32,
    /// End-to-end contexts (RD).
    pub max_ee: u32,
    /// Reliable datagram domains.
    pub max_rdd: u32,
    pub max_inline_data: u32,
    pub atomic_cap: AtomicCap,
    pub max_pkeys: u16,
    pub phys_port_cnt: u8,
    /// Resize CQ is supported (CQ-RESIZE-2 when not).
    pub resize_cq: bool,
    /// Modify QP may change the SQ/RQ size (MOD-GEN-8 when not).
    pub resize_wq: bool,
    /// Automatic Path Migration (MOD-GEN-9 when not). softhca has one port and no APM.
    pub auto_path_mig: bool,
    /// Modify QP may move a QP to another port at SQD→RTS (MOD-SQD-RTS-RC-1).
    pub port_change: bool,
    /// XRC (IBA Annex A14): XRC domains, XRC SRQs and XRC initiator and target QPs.
    pub xrc: bool,
    /// Raw IPv6 and Raw Ethertype QPs the device may have: nonzero only where the link
    /// carries raw packets (the sim fabric does; a link that does not leaves them 0, and
    /// Create QP refuses the type).
    pub max_raw_ipv6_qp: u32,
    pub max_raw_ethy_qp: u32,
    /// Multicast groups the device's UD QPs may be attached to, QPs per group, and
    /// attachments in all (Attach QP to Multicast Group); 0 on a link that carries no
    /// multicast, and the verb refuses.
    pub max_mcast_grp: u32,
    pub max_mcast_qp_attach: u32,
    pub max_total_mcast_qp_attach: u32,
}

impl Default for DeviceAttr {
    fn default() -> Self {
        DeviceAttr {
            fw_ver: concat!("softhca ", env!("CARGO_PKG_VERSION")).to_string(),
            node_guid: 0,
            sys_image_guid: 0,
            // No IEEE OUI (as Linux rxe reports), and a part number of softhca's own, so that
            // a program that recognises devices by part number (perftest) sees an unknown one
            // rather than mistaking softhca for some vendor's part 0.
            vendor_id: 0xFFFFFF,
            vendor_part_id: 0x5CA0,
            hw_ver: 0,
            max_mr_size: 1 << 40,
            page_size_cap: 0xFFFF_F000,
            max_qp: 1 << 16,
            max_qp_wr: 1 << 14,
            max_sge: 32,
            max_sge_rd: 32,
            max_cq: 1 << 14,
            max_cqe: 1 << 20,
            max_mr: 1 << 18,
            max_pd: 1 << 16,
            max_qp_rd_atom: 128,
            max_qp_init_rd_atom: 128,
            max_res_rd_atom: (1 << 16) * 128,
            max_ah: 1 << 16,
            max_srq: 1 << 14,
            max_srq_wr: 1 << 14,
            max_srq_sge: 32,
            max_mw: 1 << 16,
            max_ee: 1 << 12,
            max_rdd: 1 << 12,
            max_inline_data: 512,
            atomic_cap: AtomicCap::Glob,
            max_pkeys: 1,
            phys_port_cnt: 1,
            resize_cq: true,
            resize_wq: true,
            auto_path_mig: false,
            port_change: false,
            xrc: true,
            max_raw_ipv6_qp: 0,
            max_raw_ethy_qp: 0,
            // Linux rxe's limits.
            max_mcast_grp: 8192,
            max_mcast_qp_attach: 56,
            max_total_mcast_qp_attach: 0x70000,
        }
    }
}

/// `ibv_port_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortState {
    Down,
    Init,
    Armed,
    Active,
}

/// `ibv_port_attr`, for the single RoCEv2 port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortAttr {
    pub state: PortState,
    pub max_mtu: Mtu,
    pub active_mtu: Mtu,
    pub gid_tbl_len: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_msg_sz: u32,
    pub link_layer_ethernet: bool,
    pub active_speed_gbps: u32,
}

impl Default for PortAttr {
    fn default() -> Self {
        PortAttr {
            state: PortState::Active,
            max_mtu: Mtu::Mtu4096,
            active_mtu: Mtu::Mtu4096,
            gid_tbl_len: 1,
            pkey_tbl_len: 1,
            lid: 0,
            sm_lid: 0,
            lmc: 0,
            max_msg_sz: 1 << 31,
            link_layer_ethernet: true,
            active_speed_gbps: 100,
        }
    }
}

/// Everything that makes one software device: name, attributes, port, tables.
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    pub name: String,
    pub attr: DeviceAttr,
    pub port: PortAttr,
    /// The port's P_Key table; index 0 is the default full-membership P_Key.
    pub pkeys: Vec<u16>,
    /// GID 0; the link layer fills it with its address.
    pub gid0: Gid,
    /// Seed of the key generator; `None` takes one from the OS. Simulations set it so that
    /// runs repeat exactly.
    pub seed: Option<u64>,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig {
            name: "softhca0".to_string(),
            attr: DeviceAttr::default(),
            port: PortAttr::default(),
            pkeys: vec![0xFFFF],
            gid0: Gid::default(),
            seed: None,
        }
    }
}

impl DeviceConfig {
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    pub fn gid0(mut self, gid: Gid) -> Self {
        self.gid0 = gid;
        self
    }

    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }
}

/// Resource counts against the device maxima (CRT-QP-5 and friends).
#[derive(Debug, Default)]
pub(crate) struct Counts {
    pub qp: AtomicU32,
    pub cq: AtomicU32,
    pub mr: AtomicU32,
    pub pd: AtomicU32,
    pub ah: AtomicU32,
    pub srq: AtomicU32,
    pub mw: AtomicU32,
    pub eec: AtomicU32,
    pub rdd: AtomicU32,
}

/// Takes one unit of a resource counted in `counter` up to `max`.
pub(crate) fn take(counter: &AtomicU32, max: u32) -> Result<()> {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1))
        .map(|_| ())
        .map_err(|_| VerbsError::InsufficientResources)
}

pub(crate) fn give(counter: &AtomicU32) {
    counter.fetch_sub(1, Ordering::AcqRel);
}

pub type CompletionHandler = Arc<dyn Fn(&super::cq::Cq) + Send + Sync>;
pub type AsyncEventHandler = Arc<dyn Fn(&AsyncEvent) + Send + Sync>;
/// A driver's hook: the doorbell, the progress hook.
pub type Hook = dyn Fn() + Send + Sync;
/// Called by Poll for Completion before it looks at the CQ, so that a driver can make progress
/// on the polling thread (run-to-completion, for busy-polling on few cores).
pub type Progress = Arc<Hook>;
/// Where the device keeps a hook it calls on a hot path (the doorbell after every post, the
/// progress hook on every poll): read with one atomic load, no lock taken and no reference
/// counted (under emulation each locked instruction is a helper call, and the lock and the
/// count were four of an idle busy poll's seven). A hook replaced or removed is kept until the
/// device drops, so a caller that read it may run it for as long as it takes; drivers set
/// their hooks a few times in a device's life (install, uninstall).
pub(crate) struct HookSlot<T: ?Sized> {
    /// Null, or one of `kept`'s boxes.
    current: std::sync::atomic::AtomicPtr<Arc<T>>,
    kept: Mutex<Vec<Box<Arc<T>>>>,
}

impl<T: ?Sized> Default for HookSlot<T> {
    fn default() -> Self {
        HookSlot { current: std::sync::atomic::AtomicPtr::new(std::ptr::null_mut()), kept: Mutex::default() }
    }
}

impl<T: ?Sized> HookSlot<T> {
    /// Installs `hook`, or with `None` removes the current one. Callers that read the old one
    /// may still be running it.
    pub fn set(&self, hook: Option<Arc<T>>) {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let ptr = match hook {
            Some(h) => {
                let boxed = Box::new(h);
                let p = &*boxed as *const Arc<T> as *mut Arc<T>;
                kept.push(boxed);
                p
            }
            None => std::ptr::null_mut(),
        };
        self.current.store(ptr, Ordering::Release);
    }

    /// The current hook, if any.
    #[inline]
    pub fn get(&self) -> Option<&T> {
        let p = self.current.load(Ordering::Acquire);
        // SAFETY: `p` is null or points at an `Arc` in one of `kept`'s boxes (the Release
        // store in `set` published it after the box was written). Boxes are never removed
        // or replaced while `self` lives, and moving the Vec does not move what they point
        // at, so the `Arc` outlives the borrow of `self` this reference carries.
        unsafe { p.as_ref() }.map(|a| &**a)
    }
}

/// Called when the device gets its first Raw QP of a type (`true`) or loses its last (`false`),
/// on the thread of Create or Destroy QP and before the verb returns: a link that hears raw
/// packets only while such QPs exist starts or stops hearing them then. Returning false when
/// it cannot start makes Create QP fail.
pub type RawListener = Arc<dyn Fn(QpType, bool) -> bool + Send + Sync>;

/// Called when a multicast group gets its first attached QP (`true`) or loses its last
/// (`false`), on the thread of the verb and before it returns: a link that must join a group
/// to hear it (the UDP link binds a socket to the group's address and joins it on its
/// interface) does so then. Returning false when it cannot join makes the attach fail.
pub type GroupListener = Arc<dyn Fn(Gid, bool) -> bool + Send + Sync>;

pub(crate) struct AsyncQueue {
    pub events: Mutex<VecDeque<AsyncEvent>>,
    pub ready: Condvar,
    pub handler: RwLock<Option<AsyncEventHandler>>,
    /// Readable while events are pending (`ibv_context::async_fd`).
    pub fd: Option<super::eventfd::EventFd>,
}

impl AsyncQueue {
    /// Queues `event`, makes the descriptor readable, wakes waiters and calls the handler.
    fn deliver(&self, event: AsyncEvent) {
        let handler = self.handler.read().unwrap_or_else(|e| e.into_inner()).clone();
        {
            // The descriptor's count moves with the queue, under its lock (see `consumed`).
            let mut q = self.events.lock().unwrap_or_else(|e| e.into_inner());
            q.push_back(event);
            if let Some(fd) = &self.fd {
                fd.notify();
            }
        }
        self.ready.notify_all();
        if let Some(h) = handler {
            super::effects::call(move || h(&event));
        }
    }
}

/// A value on a cache line of its own: one the engine reads for every packet must not share a
/// line with counters the application's threads write at every poll (`handed`).
#[repr(align(64))]
pub(crate) struct OwnLine<T>(pub T);

impl<T> std::ops::Deref for OwnLine<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

static NEXT_DEVICE_ID: AtomicU64 = AtomicU64::new(1);
static DEVICES: Mutex<Vec<Weak<DeviceInner>>> = Mutex::new(Vec::new());

pub(crate) struct DeviceInner {
    pub name: String,
    pub attr: DeviceAttr,
    pub port: PortAttr,
    pub pkeys: Vec<u16>,
    pub gids: RwLock<Vec<Gid>>,
    /// Bumped by every GID change, so that cached routes know to recompute.
    pub gid_gen: std::sync::atomic::AtomicU64,
    pub closed: AtomicBool,
    pub counts: Counts,
    next_handle: AtomicU32,
    pub keys: RwLock<KeyTable>,
    /// Bumped by every change that can revoke or move a key's access (deregistration,
    /// reregistration, Fast Register, window bind or deallocation, invalidation), so that a
    /// transfer in progress checks its keys again only when one happened: read for every
    /// request packet and every Send packet received.
    pub key_gen: OwnLine<std::sync::atomic::AtomicU64>,
    /// Bumped by every Request Completion Notification: a driver tells a program that waits
    /// for completion events (it arms its CQs) from one that spins on them.
    pub notify_requests: AtomicU64,
    /// Bumped by every CQ poll that hands the program completions: a driver tells a program
    /// that has what it waited for (and may turn to other work, spinning on memory) from one
    /// still waiting on its CQ.
    pub handed: AtomicU64,
    pub rng: Mutex<StdRng>,
    pub next_eecn: AtomicU32,
    next_qpn: Mutex<u32>,
    pub cqs: RwLock<HashMap<u32, Weak<CqInner>>>,
    /// Every SRQ by its number (`ibv_get_srq_num`): an XRC request names its SRQ so.
    pub srqs: RwLock<HashMap<u32, Weak<SrqInner>>>,
    next_srqn: Mutex<u32>,
    pub async_events: Arc<AsyncQueue>,
    pub comp_handler: RwLock<Option<CompletionHandler>>,
    /// Called after every verb that gives the engine new work (a post, a Modify QP).
    pub doorbell: HookSlot<Hook>,
    pub progress: HookSlot<Hook>,
    pub raw_listener: RwLock<Option<RawListener>>,
    pub group_listener: RwLock<Option<GroupListener>>,
    /// The transport's state of the device: QPs, EECs, counters, timers (DESIGN rule 1).
    pub engine: Engine,
}

impl DeviceInner {
    pub fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            Err(VerbsError::InvalidHcaHandle)
        } else {
            Ok(())
        }
    }

    pub fn new_handle(&self) -> u32 {
        self.next_handle.fetch_add(1, Ordering::Relaxed)
    }

    /// A fresh 24-bit QPN: never 0, 1 (special QPs) or 0xFFFFFF (multicast), never one in use,
    /// and not reused soon after destroy (CRT-QP-4, CRT-QP-15).
    pub fn alloc_qpn(&self) -> u32 {
        let qps = self.engine.qps.read().unwrap_or_else(|e| e.into_inner());
        let mut next = self.next_qpn.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let qpn = *next;
            *next = if qpn >= 0xFF_FFFE { 2 } else { qpn + 1 };
            if qps.is_free(qpn) {
                return qpn;
            }
        }
    }

    /// A fresh 24-bit SRQ number, never 0 and never one in use, for `srq`, which it names in
    /// [`DeviceInner::srqs`] from now on.
    pub fn add_srq(&self, srq: impl FnOnce(u32) -> Arc<SrqInner>) -> Arc<SrqInner> {
        let mut srqs = self.srqs.write().unwrap_or_else(|e| e.into_inner());
        let mut next = self.next_srqn.lock().unwrap_or_else(|e| e.into_inner());
        let srqn = loop {
            let n = *next;
            *next = if n >= 0xFF_FFFF { 1 } else { n + 1 };
            if srqs.get(&n).is_none_or(|w| w.strong_count() == 0) {
                break n;
            }
        };
        let srq = srq(srqn);
        srqs.insert(srqn, Arc::downgrade(&srq));
        srq
    }

    /// Queues an asynchronous event and calls the registered handler (EVT-ASYNC-1).
    pub fn raise(&self, event: AsyncEvent) {
        tracing::debug!(device = %self.name, ?event, "async event");
        // Raised by an engine step, the event is queued once the step is over: writing the
        // descriptor and waking waiters are system calls (see `effects`).
        let queue = self.async_events.clone();
        super::effects::wake(move || queue.deliver(event));
    }

    /// Drops the queued asynchronous events that name `element` (it is being destroyed).
    pub(crate) fn purge_async_events(&self, element: EventElement) {
        let mut q = self.async_events.events.lock().unwrap_or_else(|e| e.into_inner());
        let before = q.len();
        q.retain(|e| e.element != element);
        if let Some(fd) = &self.async_events.fd {
            for _ in q.len()..before {
                fd.consume();
            }
        }
    }

    /// Hands datagrams a destroyed QP still owed to the next `transmit` and rings the doorbell.
    pub(crate) fn orphan(&self, datagrams: Vec<Vec<u8>>) {
        if self.engine.orphan(datagrams) {
            self.ring();
        }
    }

    /// Rings the doorbell, if a driver installed one, so that it runs the engine.
    pub fn ring(&self) {
        if let Some(bell) = self.doorbell.get() {
            bell();
        }
    }

    /// Tells the link that the device now has Raw QPs of `qp_type` (`on`) or no longer has
    /// (see [`RawListener`]); true without a link that listens.
    pub(crate) fn raw_listen(&self, qp_type: QpType, on: bool) -> bool {
        let hook = self.raw_listener.read().unwrap_or_else(|e| e.into_inner()).clone();
        hook.is_none_or(|h| h(qp_type, on))
    }

    /// Tells the link that the device joins (`on`) or leaves multicast group `mgid` (see
    /// [`GroupListener`]); true without a link that listens.
    pub(crate) fn group_listen(&self, mgid: Gid, on: bool) -> bool {
        let hook = self.group_listener.read().unwrap_or_else(|e| e.into_inner()).clone();
        hook.is_none_or(|h| h(mgid, on))
    }

    pub fn pkey(&self, index: u16) -> Option<u16> {
        self.pkeys.get(index as usize).copied()
    }
}

/// The transport's narrow interface to the device (see `transport::hca`).
impl Hca for DeviceInner {
    fn engine(&self) -> &Engine {
        &self.engine
    }

    fn xrc_srq(&self, srqn: u32, xrcd: u32) -> Option<Arc<dyn SharedReceiveQueue>> {
        let srqs = self.srqs.read().unwrap_or_else(|e| e.into_inner());
        let srq = srqs.get(&srqn)?.upgrade()?;
        srq.in_xrcd(xrcd).then_some(srq as Arc<dyn SharedReceiveQueue>)
    }

    fn active_mtu(&self) -> Mtu {
        self.port.active_mtu
    }

    fn pkey(&self, index: u16) -> Option<u16> {
        DeviceInner::pkey(self, index)
    }

    fn gid(&self, index: u8) -> Option<Gid> {
        self.gids.read().unwrap_or_else(|e| e.into_inner()).get(index as usize).copied()
    }

    fn gid_generation(&self) -> u64 {
        self.gid_gen.load(Ordering::Acquire)
    }

    fn key_generation(&self) -> u64 {
        self.key_gen.load(Ordering::Acquire)
    }

    fn check_access(
        &self,
        key: u32,
        pd: u32,
        qpn: u32,
        addr: u64,
        len: u64,
        access: Access,
    ) -> std::result::Result<MemRef, AccessError> {
        super::mr::check_access(self, key, pd, Some(qpn), addr, len, access)
    }

    fn bind_mw(&self, pd: u32, qpn: u32, bind: &BindRequest) -> std::result::Result<(), WcStatus> {
        super::mw::bind(self, pd, qpn, bind)
    }

    fn fast_reg(&self, pd: u32, req: &FastRegRequest) -> std::result::Result<(), WcStatus> {
        super::mr::fast_reg(self, pd, req)
    }

    fn invalidate(&self, pd: u32, qpn: u32, rkey: u32, apply: bool) -> std::result::Result<(), InvalidateError> {
        super::mw::invalidate(self, pd, qpn, rkey, apply)
    }

    fn raise(&self, event: AsyncEvent) {
        DeviceInner::raise(self, event)
    }
}

/// An open software HCA (`ibv_context`). Cloning gives another handle to the same device.
#[derive(Clone)]
pub struct Context {
    pub(crate) inner: Arc<DeviceInner>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("name", &self.inner.name).finish()
    }
}

/// One entry of the device list (`ibv_get_device_list`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub name: String,
    pub node_guid: u64,
}

/// The softhca devices alive in this process.
pub fn device_list() -> Vec<DeviceInfo> {
    let mut list = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    list.retain(|w| w.strong_count() > 0);
    list.iter()
        .filter_map(Weak::upgrade)
        .filter(|d| !d.closed.load(Ordering::Acquire))
        .map(|d| DeviceInfo { name: d.name.clone(), node_guid: d.attr.node_guid })
        .collect()
}

/// Opens a device of the list by name (`ibv_open_device`).
pub fn open_device(name: &str) -> Result<Context> {
    let list = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    list.iter()
        .filter_map(Weak::upgrade)
        .find(|d| d.name == name && !d.closed.load(Ordering::Acquire))
        .map(|inner| Context { inner })
        .ok_or(VerbsError::InvalidHcaHandle)
}

impl Context {
    /// Creates a software device and adds it to the device list.
    pub fn create(config: DeviceConfig) -> Result<Context> {
        if config.pkeys.is_empty() || config.pkeys.len() > u16::MAX as usize {
            return Err(VerbsError::InvalidArgument("P_Key table size"));
        }
        let id = NEXT_DEVICE_ID.fetch_add(1, Ordering::Relaxed);
        let mut rng = match config.seed {
            Some(s) => StdRng::seed_from_u64(s),
            None => StdRng::from_os_rng(),
        };
        let mut attr = config.attr;
        let mut port = config.port;
        if attr.node_guid == 0 {
            // A locally administered EUI-64 that differs per device.
            attr.node_guid = 0x0200_00FF_FE00_0000 | (id & 0xFF_FFFF) | ((rng.random::<u64>() & 0xFF) << 24);
        }
        if attr.sys_image_guid == 0 {
            attr.sys_image_guid = attr.node_guid;
        }
        attr.max_pkeys = config.pkeys.len() as u16;
        port.pkey_tbl_len = config.pkeys.len() as u16;
        let first_qpn = rng.random_range(0x10..0x1000);
        let first_eecn = rng.random_range(0x10..0x1000);
        let gid_slots = (port.gid_tbl_len as usize).max(1);
        let inner = Arc::new(DeviceInner {
            name: config.name,
            attr,
            port,
            pkeys: config.pkeys,
            // GID 0 and, up to the port's table length, empty slots the link layer may fill.
            gids: RwLock::new(
                std::iter::once(config.gid0).chain(std::iter::repeat(Gid::default())).take(gid_slots).collect(),
            ),
            gid_gen: std::sync::atomic::AtomicU64::new(1),
            closed: AtomicBool::new(false),
            counts: Counts::default(),
            next_handle: AtomicU32::new(1),
            keys: RwLock::new(KeyTable::default()),
            key_gen: OwnLine(std::sync::atomic::AtomicU64::new(0)),
            notify_requests: AtomicU64::new(0),
            handed: AtomicU64::new(0),
            rng: Mutex::new(rng),
            next_eecn: AtomicU32::new(first_eecn),
            next_qpn: Mutex::new(first_qpn),
            cqs: RwLock::new(HashMap::new()),
            srqs: RwLock::new(HashMap::new()),
            next_srqn: Mutex::new(1),
            async_events: Arc::new(AsyncQueue {
                events: Mutex::new(VecDeque::new()),
                ready: Condvar::new(),
                handler: RwLock::new(None),
                fd: super::eventfd::EventFd::new().ok(),
            }),
            comp_handler: RwLock::new(None),
            doorbell: HookSlot::default(),
            progress: HookSlot::default(),
            raw_listener: RwLock::new(None),
            group_listener: RwLock::new(None),
            engine: Engine::default(),
        });
        let mut list = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
        // A dead device's entry still holds its allocation (a `Weak` does): gone here, so that
        // a process that makes devices one after another keeps only the live ones.
        list.retain(|w| w.strong_count() > 0);
        list.push(Arc::downgrade(&inner));
        drop(list);
        tracing::info!(device = %inner.name, "device created");
        Ok(Context { inner })
    }

    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Closes the device: every later verb on it, or on its objects, returns
    /// `InvalidHcaHandle`.
    pub fn close(&self) {
        self.inner.closed.store(true, Ordering::Release);
    }

    /// Query Device.
    pub fn query_device(&self) -> Result<DeviceAttr> {
        self.inner.check_open()?;
        Ok(self.inner.attr.clone())
    }

    /// Query Port. softhca has one port, number 1.
    pub fn query_port(&self, port_num: u8) -> Result<PortAttr> {
        self.inner.check_open()?;
        self.check_port(port_num)?;
        Ok(self.inner.port.clone())
    }

    /// Query GID.
    pub fn query_gid(&self, port_num: u8, index: u32) -> Result<Gid> {
        self.inner.check_open()?;
        self.check_port(port_num)?;
        let gids = self.inner.gids.read().unwrap_or_else(|e| e.into_inner());
        gids.get(index as usize).copied().ok_or(VerbsError::InvalidArgument("GID index"))
    }

    /// Query P_Key.
    pub fn query_pkey(&self, port_num: u8, index: u16) -> Result<u16> {
        self.inner.check_open()?;
        self.check_port(port_num)?;
        self.inner.pkey(index).ok_or(VerbsError::InvalidArgument("P_Key index"))
    }

    /// Sets GID `index` of the port; the link layer calls it with its address.
    pub fn set_gid(&self, index: u32, gid: Gid) -> Result<()> {
        self.inner.check_open()?;
        let mut gids = self.inner.gids.write().unwrap_or_else(|e| e.into_inner());
        let slot = gids.get_mut(index as usize).ok_or(VerbsError::InvalidArgument("GID index"))?;
        *slot = gid;
        self.inner.gid_gen.fetch_add(1, Ordering::AcqRel);
        drop(gids);
        // QPs waiting for an addressable GID may send now: the driver hears of it as of a post.
        self.inner.engine.wake_all();
        self.inner.ring();
        Ok(())
    }

    fn check_port(&self, port_num: u8) -> Result<()> {
        if port_num == 0 || port_num > self.inner.attr.phys_port_cnt {
            return Err(VerbsError::InvalidArgument("port number"));
        }
        Ok(())
    }

    /// Set Asynchronous Event Handler (EVT-ASYNC-1). Events are also queued for
    /// [`Context::get_async_event`].
    pub fn set_async_event_handler(&self, handler: impl Fn(&AsyncEvent) + Send + Sync + 'static) -> Result<()> {
        self.inner.check_open()?;
        *self.inner.async_events.handler.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(handler));
        Ok(())
    }

    /// The oldest queued asynchronous event, if any (`ibv_get_async_event` without blocking).
    pub fn get_async_event(&self) -> Option<AsyncEvent> {
        let mut q = self.inner.async_events.events.lock().unwrap_or_else(|e| e.into_inner());
        let ev = q.pop_front();
        self.consumed(&ev);
        ev
    }

    fn consumed(&self, ev: &Option<AsyncEvent>) {
        if let (Some(_), Some(fd)) = (ev, &self.inner.async_events.fd) {
            fd.consume();
        }
    }

    /// A descriptor readable while an asynchronous event is queued (`ibv_context::async_fd`),
    /// if the system gave one.
    pub fn async_fd(&self) -> Option<std::os::fd::RawFd> {
        self.inner.async_events.fd.as_ref().map(|f| f.raw())
    }

    /// Waits up to `timeout` for an asynchronous event.
    pub fn wait_async_event(&self, timeout: std::time::Duration) -> Option<AsyncEvent> {
        let q = self.inner.async_events.events.lock().unwrap_or_else(|e| e.into_inner());
        let (mut q, _) = self
            .inner
            .async_events
            .ready
            .wait_timeout_while(q, timeout, |q| q.is_empty())
            .unwrap_or_else(|e| e.into_inner());
        let ev = q.pop_front();
        self.consumed(&ev);
        drop(q);
        ev
    }

    /// Set Completion Event Handler (CQ-HANDLER-1): called with the CQ that received a CQE
    /// for which notification was requested (CQ-HANDLER-2).
    pub fn set_completion_handler(&self, handler: impl Fn(&super::cq::Cq) + Send + Sync + 'static) -> Result<()> {
        self.inner.check_open()?;
        *self.inner.comp_handler.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(handler));
        Ok(())
    }

    /// Installs the doorbell a driver (the UDP link's engine thread) wants rung whenever a
    /// verb gives the engine new work: Post Send, Post Receive, Modify QP.
    pub fn set_doorbell(&self, bell: impl Fn() + Send + Sync + 'static) {
        self.inner.doorbell.set(Some(Arc::new(bell)));
    }

    /// Installs (or with `None` removes) the progress hook a driver wants called by Poll for
    /// Completion on this device's CQs, so that the polling thread itself can run the engine
    /// (inline progress): before the CQ is read, except that a poll finding completions
    /// waiting returns them first, without the hook, at most every other time (see
    /// [`super::cq::Cq::poll`]). The hook must not poll a CQ.
    pub fn set_progress(&self, hook: Option<Progress>) {
        self.inner.progress.set(hook);
    }

    /// Installs (or with `None` removes) the hook a link that carries Raw QPs' packets wants
    /// called when the device gets its first Raw QP of a type or loses its last (see
    /// [`RawListener`]): a Raw QP hears its port from the moment Create QP returns, not from
    /// the link's next turn, which may come after a peer's first frame.
    pub fn set_raw_listener(&self, hook: Option<RawListener>) {
        *self.inner.raw_listener.write().unwrap_or_else(|e| e.into_inner()) = hook;
    }

    /// Whether work posted to this device has yet to leave it: a QP with something to send,
    /// or a UC or UD send whose datagram the link has not sent yet (its completion waits for
    /// that, see [`Context::defer_unreliable_completions`]). The drop-in's Resize CQ waits for
    /// it to clear: Linux's rxe has completed a UD send by the time `ibv_post_send` returns.
    pub fn unsent(&self) -> bool {
        // The ready list first: a send WQE is marked as awaiting the wire before its QP leaves
        // the list, so one read after the other cannot miss it in between.
        let e = &self.inner.engine;
        e.may_transmit() || e.unsent_unreliable()
    }

    /// Installs (or with `None` removes) the hook a link that must join a multicast group to
    /// hear it wants called when a group gets its first attached QP or loses its last (see
    /// [`GroupListener`]).
    pub fn set_group_listener(&self, hook: Option<GroupListener>) {
        *self.inner.group_listener.write().unwrap_or_else(|e| e.into_inner()) = hook;
    }

    /// Removes the doorbell.
    pub fn clear_doorbell(&self) {
        self.inner.doorbell.set(None);
    }

    pub(crate) fn same_device(&self, other: &Arc<DeviceInner>) -> bool {
        Arc::ptr_eq(&self.inner, other)
    }

    /// Feeds one inbound RoCEv2 datagram, from its IP header on, to the transport. Anything
    /// malformed is dropped and counted, never trusted (PKT-VAL-2, PKT-ROCE-10). An IPv6
    /// datagram that is not RoCE goes to the Raw IPv6 QPs.
    pub fn receive(&self, now: u64, datagram: &[u8]) {
        super::effects::step(|| self.inner.engine.receive(&*self.inner, now, datagram, true))
    }

    /// Hints that `datagram` will be received next: the QP it is for is brought toward the
    /// cache (a link with a batch in hand calls this for datagram i + 1 before receiving i).
    /// Changes nothing.
    pub fn prefetch_receive(&self, datagram: &[u8]) {
        self.inner.engine.prefetch_dest(datagram)
    }

    /// Runs `f`, which feeds the device datagrams that arrived together (a GRO buffer, a GSO
    /// message), as one engine step: the completion events they raise are raised once all of
    /// them are in. An answer and the ACK that travels with it complete a receive and a send;
    /// a program woken by either event finds both CQEs, as it would after an HCA's burst
    /// (perftest's `ib_send_lat -e` polls each CQ once per event of its one channel, and lost
    /// step when the second CQE came after the first event).
    /// An associated function: a link calls it once per received message, and needs no
    /// handle (a clone of one per message was an atomic add and subtract on the hot path).
    pub fn together<R>(f: impl FnOnce() -> R) -> R {
        super::effects::step(f)
    }

    /// [`Context::receive`] for a link that has already verified the ICRC over the header the
    /// datagram really had (the UDP link rebuilds or captures it): everything else is checked
    /// as usual, the CRC is not computed a second time.
    pub fn receive_icrc_checked(&self, now: u64, datagram: &[u8]) {
        super::effects::step(|| self.inner.engine.receive(&*self.inner, now, datagram, false))
    }

    /// Writes the next outbound datagram (IP header on, ICRC included) into `buf`, which holds
    /// at least [`crate::transport::MAX_DATAGRAM`] bytes, and returns its length; `None` when
    /// nothing is ready. QPs take turns, and a QP's responses go before its requests.
    pub fn transmit(&self, now: u64, buf: &mut [u8]) -> Option<usize> {
        if !self.may_transmit() {
            return None; // an idle device (asked on every busy poll): no step opened
        }
        super::effects::step(|| self.inner.engine.transmit(&*self.inner, now, buf))
    }

    /// Whether [`Context::transmit`] may have a datagram; false is an idle device, told from
    /// flags without a lock (a link asks before setting up a flush).
    pub fn may_transmit(&self) -> bool {
        self.inner.engine.may_transmit()
    }

    /// Writes the next outbound Ethernet frame of a Raw Ethertype QP (destination MAC on, no
    /// FCS) into `buf` (at least [`crate::transport::MAX_DATAGRAM`] bytes) and returns its
    /// length. Only a link that carries raw packets (its devices have
    /// `DeviceAttr::max_raw_ethy_qp` > 0) calls it; Raw IPv6 packets come out of
    /// [`Context::transmit`] as the IPv6 datagrams they are.
    pub fn transmit_frame(&self, now: u64, buf: &mut [u8]) -> Option<usize> {
        super::effects::step(|| self.inner.engine.transmit_frame(now, buf))
    }

    /// Whether the device has a Raw QP of `qp_type` (Raw Ethertype or Raw IPv6): a link
    /// listens for such packets only then.
    pub fn has_raw_qps(&self, qp_type: crate::types::QpType) -> bool {
        self.inner.engine.has_raw_qps(qp_type)
    }

    /// Whether the device has a UD QP of a consumer's (the GSI not counted): the 40 bytes in
    /// front of a UD message show the IP header it came with (PKT-ROCE-11), so a link that
    /// rebuilds inbound headers has the kernel report their TOS and TTL only while this holds.
    pub fn has_ud_qps(&self) -> bool {
        self.inner.engine.has_ud_qps()
    }

    /// Feeds one inbound Ethernet frame (destination MAC on) that is not a RoCE datagram for
    /// this device to its Raw Ethertype QPs; dropped and counted when none takes it.
    pub fn receive_frame(&self, frame: &[u8]) {
        super::effects::step(|| self.inner.engine.receive_frame(frame))
    }

    /// For a link that sends what [`Context::transmit`] writes later (in batches): from now
    /// on a UC or UD send completes only at [`Context::sent`], once its datagram has left,
    /// never while it still sits in the link's batch.
    pub fn defer_unreliable_completions(&self) {
        self.inner.engine.defer_unreliable.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// For a link whose receiver takes datagrams in one by one as they arrive (UDP: a spinning
    /// `recvmmsg` finds what the peer's `sendmmsg` has delivered so far): from now on a QP's
    /// plain ACK waits behind up to 16 of the QP's own request packets instead of going first.
    /// The answer an ACK rides with then reaches the peer before the ACK: the peer, polling its
    /// CQ for that ACK, has taken the answer in by the time it gets its completion, where it
    /// took the ACK alone and went to spin on memory for an RDMA Write that only its engine
    /// thread was left to take in (perftest's `ib_write_lat` 64 KiB over UDP, 2026-11-30 on
    /// the AMD EPYC, six interleaved rounds: busy-poll 53.6-60.8 -> 41.2-53.8 µs, blocking
    /// 52.5-66.7 -> 46.8-53.0; 8 B level). The shared-memory link does not ask: a peer there
    /// takes a ring's datagrams in order and finds the two together (its `Pair`), and there
    /// its Sends lost 0.68 -> 0.77 µs a hop with the order turned. PKT-ACK-13 holds: the ACK
    /// waits for nothing not yet received, only behind request packets ready to go now.
    pub fn acks_after_requests(&self) {
        self.inner.engine.acks_after_requests.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// For a link that prepares something per flow before it can send on it (the UDP link's
    /// socket, connected, its IPv4 Identification learned): from now on an RC or UC QP's flow
    /// is announced when Modify QP sets its path (Init → RTR), and its end when the QP is
    /// reset or destroyed, for [`Context::take_flows`].
    pub fn announce_flows(&self) {
        self.inner.engine.announce_flows.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// The flows opened and closed since the last call, in order (see
    /// [`Context::announce_flows`]), into `out` (emptied first); no lock while there are none.
    #[inline]
    pub fn take_flows(&self, out: &mut Vec<crate::transport::FlowChange>) {
        self.inner.engine.take_flows(out)
    }

    /// The link has sent every datagram [`Context::transmit`] wrote so far (see
    /// [`Context::defer_unreliable_completions`]).
    pub fn sent(&self) {
        if self.inner.engine.awaits_wire() {
            super::effects::step(|| self.inner.engine.sent())
        }
    }

    /// How many times a CQ of this device was armed (Request Completion Notification).
    pub fn notify_requests(&self) -> u64 {
        self.inner.notify_requests.load(Ordering::Relaxed)
    }

    /// How many CQ polls of this device handed the program completions.
    pub fn handed(&self) -> u64 {
        self.inner.handed.load(Ordering::Relaxed)
    }

    /// The earliest time at which [`Context::handle_timeout`] has work, if any.
    /// It may be earlier than the next timer (a timer disarmed since), never later.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.inner.engine.poll_timeout()
    }

    /// Runs every timer that has expired at `now`: RNR waits end, ACK timeouts retry
    /// (PKT-RTY-1) or fail (PKT-RTY-4).
    pub fn handle_timeout(&self, now: u64) {
        super::effects::step(|| self.inner.engine.handle_timeout(&*self.inner, now))
    }

    /// A snapshot of the device's counters.
    pub fn counters(&self) -> DeviceCounters {
        self.inner.engine.counters()
    }
}
