//! Memory Regions and the key table. Every local and remote access the transport makes goes
//! through [`Context::check_access`]: key, PD, bounds and rights, in that order (DESIGN rule 5).
//! The memory itself, and the only code that touches it, is [`crate::mem`].

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use rand::Rng;

use super::device::{give, take, Context, DeviceInner};
use super::error::{Result, VerbsError};
use super::pd::{Pd, PdInner};
use super::types::{Access, MwType, Sge};
use crate::mem::Region;
pub use crate::mem::{AccessError, MemRef};
use crate::transport::wqe::FastRegRequest;
use crate::types::WcStatus;

/// What a key names: a memory region, or a memory window (one key space for both, so their
/// keys never collide).
#[derive(Clone)]
pub(crate) enum KeyEntry {
    Mr(Arc<MrInner>),
    Mw(Arc<super::mw::MwInner>),
}

/// The keys of one device. A key is `slot << 8 | key byte`; the key byte is random and never
/// repeats the previous one of its slot, so a stale or guessed key misses.
#[derive(Default)]
pub(crate) struct KeyTable {
    slots: Vec<Option<(u32, KeyEntry)>>,
    last_key_byte: Vec<u8>,
    free: Vec<u32>,
}

impl KeyTable {
    fn fresh_byte(&mut self, rng: &mut impl Rng, slot: u32) -> u32 {
        let prev = self.last_key_byte[slot as usize];
        let mut byte = prev.wrapping_add(rng.random_range(1..=255u8));
        if slot == 0 && byte == 0 {
            // Key 0 is never handed out: programs take an L_Key or R_Key of 0 for "none".
            byte = prev.wrapping_add(1).max(1);
        }
        self.last_key_byte[slot as usize] = byte;
        slot << 8 | byte as u32
    }

    pub(crate) fn insert(&mut self, rng: &mut impl Rng, make: impl FnOnce(u32) -> KeyEntry) -> Result<(u32, KeyEntry)> {
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                let s = self.slots.len() as u32;
                if s >= 1 << 24 {
                    return Err(VerbsError::InsufficientResources);
                }
                self.slots.push(None);
                self.last_key_byte.push(rng.random());
                s
            }
        };
        let key = self.fresh_byte(rng, slot);
        let entry = make(key);
        self.slots[slot as usize] = Some((key, entry.clone()));
        Ok((key, entry))
    }

    /// Gives the entry behind `key` a new key in the same slot (a memory window's R_Key changes
    /// at every bind), so the old key stops working: with key byte `byte` when the consumer
    /// chose one (it must differ from the current one), else a fresh random one.
    pub(crate) fn rekey(&mut self, rng: &mut impl Rng, key: u32, byte: Option<u8>) -> Option<u32> {
        let slot = key >> 8;
        if self.slots.get(slot as usize)?.as_ref().is_none_or(|(k, _)| *k != key) {
            return None;
        }
        let new = match byte {
            Some(b) if u32::from(b) == key & 0xff => return None,
            Some(b) => {
                self.last_key_byte[slot as usize] = b;
                slot << 8 | u32::from(b)
            }
            None => self.fresh_byte(rng, slot),
        };
        if let Some((k, _)) = self.slots[slot as usize].as_mut() {
            *k = new;
        }
        Some(new)
    }

    /// Puts `entry` behind `key` in its place (Reregister Memory Region: same key, new
    /// region); false when `key` is not live.
    pub(crate) fn replace(&mut self, key: u32, entry: KeyEntry) -> bool {
        match self.slots.get_mut((key >> 8) as usize) {
            Some(Some((k, e))) if *k == key => {
                *e = entry;
                true
            }
            _ => false,
        }
    }

    pub(crate) fn remove(&mut self, key: u32) -> Option<KeyEntry> {
        let slot = (key >> 8) as usize;
        let entry = self.slots.get_mut(slot)?;
        if entry.as_ref().is_some_and(|(k, _)| *k == key) {
            self.free.push(slot as u32);
            entry.take().map(|(_, e)| e)
        } else {
            None
        }
    }

    pub fn lookup(&self, key: u32) -> Option<&KeyEntry> {
        self.slots.get((key >> 8) as usize)?.as_ref().filter(|(k, _)| *k == key).map(|(_, e)| e)
    }

    /// The region behind an L_Key (or MR key).
    pub fn mr(&self, key: u32) -> Option<&Arc<MrInner>> {
        match self.lookup(key)? {
            KeyEntry::Mr(m) => Some(m),
            KeyEntry::Mw(_) => None,
        }
    }
}

pub(crate) struct MrInner {
    /// The region's L_Key and R_Key (one key): fixed, except for a fast-registration region,
    /// whose Fast Register work request gives it a new key byte.
    pub key: AtomicU32,
    /// A fast-registration region (IBA's Allocate L_Key): its keys are valid only between a
    /// Fast Register work request and an invalidation, with the rights the work request gave.
    pub fast: Option<Mutex<FastReg>>,
    /// Memory windows bound to this region: it cannot be deregistered while any is.
    pub windows: std::sync::atomic::AtomicU32,
    /// The `Mr` was dropped with windows still bound: its memory may be gone, so the windows
    /// no longer reach it.
    pub revoked: std::sync::atomic::AtomicBool,
    pub pd: Arc<PdInner>,
    pub access: Access,
    /// The region's memory, and the virtual address keys name it from (its host address,
    /// unless registered at another: `Pd::reg_mr_raw_iova`).
    pub mem: Arc<Region>,
}

/// The state of a fast-registration region: Free (its keys reach nothing) or Valid with the
/// rights its last Fast Register gave.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct FastReg {
    pub valid: bool,
    pub access: Access,
}

impl MrInner {
    pub fn key(&self) -> u32 {
        self.key.load(Ordering::Acquire)
    }

    pub fn addr(&self) -> u64 {
        self.mem.addr()
    }

    /// The rights the region's keys grant now: those it was registered with, or a
    /// fast-registration region's Fast Register's (None while it is Free).
    pub(crate) fn rights(&self) -> Option<Access> {
        match &self.fast {
            None => Some(self.access),
            Some(f) => {
                let st = *f.lock().unwrap_or_else(|e| e.into_inner());
                st.valid.then_some(st.access)
            }
        }
    }

    pub(crate) fn range_offset(&self, addr: u64, len: u64) -> Option<usize> {
        self.mem.range_offset(addr, len)
    }

    /// `len` bytes at `offset` of the region, for an access already checked.
    fn mem_ref(&self, offset: usize, len: usize) -> MemRef {
        MemRef::new(&self.mem, self.key(), offset, len)
    }
}

/// A registered memory region (`ibv_mr`). Memory it owns (`Pd::reg_mr`) stays alive until it is
/// deregistered (or dropped) and no access holds it; memory the caller lent
/// (`Pd::reg_mr_raw`) is the caller's again once Deregister returns (see [`Mr::dereg`]).
pub struct Mr {
    pub(crate) inner: Arc<MrInner>,
    dev: Arc<DeviceInner>,
    deregistered: AtomicBool,
}

impl std::fmt::Debug for Mr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mr")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .field("lkey", &format_args!("{:#x}", self.lkey()))
            .finish()
    }
}

fn check_access_flags(access: Access) -> Result<()> {
    if access.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC) && !access.contains(Access::LOCAL_WRITE) {
        return Err(VerbsError::InvalidAccess("remote write and remote atomic require local write"));
    }
    Ok(())
}

impl Pd {
    /// Register Memory Region over a buffer the region takes ownership of.
    pub fn reg_mr(&self, buf: Vec<u8>, access: Access) -> Result<Mr> {
        self.inner.check()?;
        check_access_flags(access)?;
        self.register(Region::owned(buf), access)
    }

    /// Register Memory Region with `len` zeroed bytes.
    pub fn alloc_mr(&self, len: usize, access: Access) -> Result<Mr> {
        self.reg_mr(vec![0; len], access)
    }

    /// A fast-registration region over `buf` (IBA's Allocate L_Key, the kernel's
    /// `ib_alloc_mr`): its keys exist but reach nothing until a Fast Register work request
    /// ([`super::wr::SendWr::fast_reg`]) makes them valid, with a key byte and rights the
    /// consumer chooses; Local Invalidate or a peer's Send with Invalidate naming its key makes
    /// it Free again. libibverbs has no such region (user memory regions are registered whole
    /// and cannot be invalidated): this is the Rust API's.
    pub fn alloc_fast_reg_mr(&self, buf: Vec<u8>) -> Result<Mr> {
        self.inner.check()?;
        self.register_as(Region::owned(buf), Access::empty(), true)
    }

    /// Register Memory Region over memory the caller owns (the C ABI's `ibv_reg_mr`).
    ///
    /// # Safety
    /// `addr..addr+len` must be valid for reads and writes until the returned `Mr` is
    /// deregistered or dropped (each returns once no access of the device's is left in
    /// flight), and any [`MemRef`] the caller took into it (`Context::check_access`) is not
    /// used after that; the caller accepts that softhca and remote peers write it
    /// concurrently, as a DMA engine would.
    pub unsafe fn reg_mr_raw(&self, addr: *mut u8, len: usize, access: Access) -> Result<Mr> {
        // SAFETY: the caller's contract.
        unsafe { self.reg_mr_raw_iova(addr, len, addr as u64, access) }
    }

    /// [`Pd::reg_mr_raw`] with the region's virtual addresses starting at `iova` instead of
    /// `addr` (`ibv_reg_mr_iova2`): local SGEs and remote accesses name the memory by them.
    ///
    /// # Safety
    /// As [`Pd::reg_mr_raw`].
    pub unsafe fn reg_mr_raw_iova(&self, addr: *mut u8, len: usize, iova: u64, access: Access) -> Result<Mr> {
        self.inner.check()?;
        check_access_flags(access)?;
        // SAFETY: the caller's contract is `Region::borrowed`'s.
        let mem = unsafe { Region::borrowed(addr, len, iova) }.ok_or(VerbsError::InvalidArgument("null address"))?;
        self.register(mem, access)
    }

    /// Register Memory Region with on-demand paging (`IBV_ACCESS_ON_DEMAND`) over
    /// `addr..addr+len` of the process, addressed from `iova` on: the memory need not be mapped
    /// now, nor stay mapped; an access to a page that is not mapped with the right it needs
    /// fails as an HCA's unserved page fault (a local protection error, a remote access error),
    /// never with a signal (see `mem::odp`). Errors: `NotSupported` where the kernel does not
    /// let the process copy its own memory ([`crate::mem::odp::supported`]).
    ///
    /// # Safety
    /// The caller does not unmap memory under an atomic in flight (atomics run in place), and
    /// accepts that softhca and remote peers write the memory concurrently, as a DMA engine
    /// would.
    pub unsafe fn reg_mr_on_demand(&self, addr: *mut u8, len: usize, iova: u64, access: Access) -> Result<Mr> {
        self.check_on_demand(access)?;
        // SAFETY: the caller's contract is `Region::on_demand`'s.
        let mem = unsafe { Region::on_demand(addr, len, iova) }.ok_or(VerbsError::InvalidArgument("null address"))?;
        self.register(mem, access)
    }

    /// The implicit region of on-demand paging (`ibv_reg_mr(pd, NULL, SIZE_MAX, … |
    /// IBV_ACCESS_ON_DEMAND)`): the whole address space under one key, addressed by virtual
    /// address; as [`Pd::reg_mr_on_demand`] otherwise. It is larger than `max_mr_size`, which
    /// bounds the regions of a range.
    ///
    /// # Safety
    /// As [`Pd::reg_mr_on_demand`].
    pub unsafe fn reg_mr_implicit(&self, access: Access) -> Result<Mr> {
        self.check_on_demand(access)?;
        // SAFETY: the caller's contract is `Region::implicit`'s.
        self.register(unsafe { Region::implicit() }, access)
    }

    /// What both on-demand registrations check first: the PD, the rights, and that the
    /// kernel lets the process copy its own memory.
    fn check_on_demand(&self, access: Access) -> Result<()> {
        self.inner.check()?;
        check_access_flags(access)?;
        if !crate::mem::odp::supported() {
            return Err(VerbsError::NotSupported("on-demand paging: process_vm_readv is not allowed here"));
        }
        Ok(())
    }

    /// Every registration's one size check and key allocation.
    fn register(&self, mem: Region, access: Access) -> Result<Mr> {
        self.register_as(mem, access, false)
    }

    fn register_as(&self, mem: Region, access: Access, fast: bool) -> Result<Mr> {
        let dev = &self.inner.dev;
        if mem.len() as u64 > dev.attr.max_mr_size && !mem.is_implicit() {
            return Err(VerbsError::InvalidArgument("region larger than max_mr_size"));
        }
        let inner = new_key(&self.inner, &dev.counts.mr, dev.attr.max_mr, |key| {
            let mr = Arc::new(MrInner {
                key: AtomicU32::new(key),
                fast: fast.then(|| Mutex::new(FastReg::default())),
                windows: Default::default(),
                revoked: Default::default(),
                pd: self.inner.clone(),
                access,
                mem: Arc::new(mem),
            });
            (KeyEntry::Mr(mr.clone()), mr)
        })?;
        Ok(Mr { inner, dev: dev.clone(), deregistered: AtomicBool::new(false) })
    }
}

/// Counts one more `counter` resource (up to `max`) in PD `pd` and gives it a fresh key, for
/// regions and windows alike; a failure undoes both.
pub(crate) fn new_key<T>(
    pd: &Arc<PdInner>,
    counter: &std::sync::atomic::AtomicU32,
    max: u32,
    make: impl FnOnce(u32) -> (KeyEntry, T),
) -> Result<T> {
    let dev = &pd.dev;
    take(counter, max)?;
    if let Err(e) = pd.hold() {
        give(counter);
        return Err(e);
    }
    let mut made = None;
    let inserted = {
        let mut rng = dev.rng.lock().unwrap_or_else(|e| e.into_inner());
        let mut keys = dev.keys.write().unwrap_or_else(|e| e.into_inner());
        keys.insert(&mut *rng, |key| {
            let (entry, handle) = make(key);
            made = Some(handle);
            entry
        })
    };
    match (inserted, made) {
        (Ok(_), Some(handle)) => Ok(handle),
        (result, _) => {
            pd.release();
            give(counter);
            Err(result.err().unwrap_or(VerbsError::InsufficientResources))
        }
    }
}

impl Mr {
    /// The L_Key (for a fast-registration region, the one its last Fast Register gave).
    pub fn lkey(&self) -> u32 {
        self.inner.key()
    }

    pub fn rkey(&self) -> u32 {
        self.inner.key()
    }

    /// The region's first virtual address (its host address, unless registered with another:
    /// [`Pd::reg_mr_raw_iova`]).
    pub fn addr(&self) -> u64 {
        self.inner.addr()
    }

    pub fn len(&self) -> usize {
        self.inner.mem.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn access(&self) -> Access {
        self.inner.access
    }

    /// Whether the region pages on demand ([`Pd::reg_mr_on_demand`], [`Pd::reg_mr_implicit`]).
    pub fn is_on_demand(&self) -> bool {
        self.inner.mem.is_on_demand()
    }

    /// Faults in `len` bytes at virtual address `addr` of the region, for writing if `write`
    /// (`ibv_advise_mr`'s prefetch; best effort: the pages may go again). BadKey once the
    /// region is deregistered (its memory may be the program's again, remapped), MissingRight
    /// for writing without Local Write (rights a reregistration took since the caller looked),
    /// OutOfBounds outside the region, PageFault where a page is not mapped so.
    pub fn prefetch(&self, addr: u64, len: u64, write: bool) -> std::result::Result<(), AccessError> {
        if self.deregistered.load(Ordering::Acquire) {
            return Err(AccessError::BadKey);
        }
        if write && !self.inner.access.contains(Access::LOCAL_WRITE) {
            return Err(AccessError::MissingRight);
        }
        self.inner.mem.prefetch(addr, len, write)
    }

    /// An SGE for `range` (byte offsets into the region).
    pub fn sge(&self, range: std::ops::Range<usize>) -> Sge {
        Sge {
            // Wrapping: a nonsense range gives an SGE that the key check refuses, not a panic.
            addr: self.addr().wrapping_add(range.start as u64),
            length: range.end.saturating_sub(range.start) as u32,
            lkey: self.lkey(),
        }
    }

    fn local(&self, offset: usize, len: usize) -> Result<MemRef> {
        if self.deregistered.load(Ordering::Acquire) {
            return Err(VerbsError::InvalidMrHandle);
        }
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => Ok(self.inner.mem_ref(offset, len)),
            _ => Err(VerbsError::InvalidArgument("range outside the region")),
        }
    }

    /// Copies bytes out of the region (a snapshot: a peer may be writing meanwhile). One
    /// access: a Deregister on another thread waits for it (see `mem::inflight`).
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        super::effects::access(|| {
            let m = self.local(offset, dst.len())?;
            m.read(0, dst).map_err(|_| VerbsError::InvalidArgument("range outside the region"))
        })
    }

    /// Copies bytes into the region, as one access (see [`Mr::read`]).
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        super::effects::access(|| {
            let m = self.local(offset, src.len())?;
            m.write(0, src).map_err(|_| VerbsError::InvalidArgument("range outside the region"))
        })
    }

    /// A copy of the whole region.
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        let mut v = vec![0; self.len()];
        self.read(0, &mut v)?;
        Ok(v)
    }

    /// Reregister Memory Region (`ibv_rereg_mr` with `IBV_REREG_MR_CHANGE_PD` and
    /// `IBV_REREG_MR_CHANGE_ACCESS`): the region moves to PD `pd`, or takes rights `access`
    /// (checked as Register's: remote write and atomic need local write), or both; its keys
    /// stay, as rxe's and mlx5's do. What a key reaches is decided anew at its next use, an
    /// access in flight included (it re-checks its key). Refused while memory windows are bound
    /// to the region (as Deregister is), for a fast-registration region (whose rights its Fast
    /// Register work requests give), and for a deregistered one.
    pub fn rereg(&mut self, pd: Option<&Pd>, access: Option<Access>) -> Result<()> {
        self.rereg_with(pd, access, None)
    }

    /// [`Mr::rereg`], and with `mem` (`IBV_REREG_MR_CHANGE_TRANSLATION`, as mlx5 has it; rxe
    /// has not) the region's memory becomes `mem.0..mem.0 + mem.1` under the same keys.
    ///
    /// # Safety
    /// `mem`, when given, is as [`Pd::reg_mr_raw`]'s memory: valid for reads and writes until
    /// the region is deregistered, dropped or moved again. The memory it replaces, if the
    /// caller lent it, is the caller's again once this returns (the accesses in flight have
    /// ended, as at Deregister).
    pub unsafe fn rereg_raw(
        &mut self,
        pd: Option<&Pd>,
        access: Option<Access>,
        mem: Option<(*mut u8, usize)>,
    ) -> Result<()> {
        let on_demand = self.inner.mem.is_on_demand();
        let region = match mem {
            // SAFETY: the caller's contract is `Region::borrowed`'s, or `Region::on_demand`'s
            // for a region of on-demand paging, which stays one.
            Some((addr, len)) => Some(
                unsafe {
                    match on_demand {
                        true => Region::on_demand(addr, len, addr as u64),
                        false => Region::borrowed(addr, len, addr as u64),
                    }
                }
                .ok_or(VerbsError::InvalidArgument("null address"))?,
            ),
            None => None,
        };
        self.rereg_with(pd, access, region)
    }

    fn rereg_with(&mut self, pd: Option<&Pd>, access: Option<Access>, mem: Option<Region>) -> Result<()> {
        self.dev.check_open()?;
        let moved = mem.is_some();
        if let Some(p) = pd {
            p.inner.check()?;
            if !Arc::ptr_eq(&p.inner.dev, &self.dev) {
                return Err(VerbsError::InvalidPd);
            }
        }
        if let Some(a) = access {
            check_access_flags(a)?;
        }
        if self.inner.fast.is_some() {
            return Err(VerbsError::InvalidArgument("a fast-registration region's rights are its Fast Register's"));
        }
        if mem.as_ref().is_some_and(|m| m.len() as u64 > self.dev.attr.max_mr_size) {
            return Err(VerbsError::InvalidArgument("region larger than max_mr_size"));
        }
        let new_pd = pd.map(|p| p.inner.clone());
        if let Some(p) = &new_pd {
            p.hold()?;
        }
        let undo = |e| {
            if let Some(p) = &new_pd {
                p.release();
            }
            Err(e)
        };
        let mut keys = self.dev.keys.write().unwrap_or_else(|e| e.into_inner());
        if self.deregistered.load(Ordering::Acquire) {
            return undo(VerbsError::InvalidMrHandle);
        }
        // A bind counts its window under the table's write lock, held here.
        if self.inner.windows.load(Ordering::Acquire) > 0 {
            return undo(VerbsError::InUse("memory windows are bound to the region"));
        }
        let key = self.inner.key();
        let next = Arc::new(MrInner {
            key: AtomicU32::new(key),
            fast: None,
            windows: Default::default(),
            revoked: Default::default(),
            pd: new_pd.clone().unwrap_or_else(|| self.inner.pd.clone()),
            access: access.unwrap_or(self.inner.access),
            mem: mem.map(Arc::new).unwrap_or_else(|| self.inner.mem.clone()),
        });
        if !keys.replace(key, KeyEntry::Mr(next.clone())) {
            return undo(VerbsError::InvalidMrHandle);
        }
        self.dev.key_gen.fetch_add(1, Ordering::AcqRel);
        drop(keys);
        if moved && self.inner.mem.is_borrowed() {
            // The program may free the old memory once this returns.
            super::effects::quiesce();
        }
        if new_pd.is_some() {
            self.inner.pd.release();
        }
        self.inner = next;
        Ok(())
    }

    /// Deregister Memory Region. New accesses miss the key; over memory the caller owns
    /// ([`Pd::reg_mr_raw`]) this returns once the accesses in flight have ended, so that the
    /// memory is the caller's again, as after Linux's `ibv_dereg_mr` (see `mem::inflight`).
    pub fn dereg(&self) -> Result<()> {
        self.dev.check_open()?;
        self.remove_key(false)
    }

    /// Takes the region's key out of the table. A bind increments `windows` under the table's
    /// write lock, so looking at it under that lock leaves no gap for a bind to slip into.
    /// `force` (the `Mr` is being dropped) removes it even with windows bound, and cuts them
    /// off the memory too.
    fn remove_key(&self, force: bool) -> Result<()> {
        let mut keys = self.dev.keys.write().unwrap_or_else(|e| e.into_inner());
        if self.deregistered.load(Ordering::Acquire) {
            return Err(VerbsError::InvalidMrHandle);
        }
        if self.inner.windows.load(Ordering::Acquire) > 0 {
            if !force {
                return Err(VerbsError::InUse("memory windows are bound to the region"));
            }
            self.inner.revoked.store(true, Ordering::Release);
        }
        self.deregistered.store(true, Ordering::Release);
        let removed = keys.remove(self.inner.key());
        self.dev.key_gen.fetch_add(1, Ordering::AcqRel);
        drop(keys);
        if self.inner.mem.is_borrowed() {
            super::effects::quiesce();
        }
        if removed.is_some() {
            self.inner.pd.release();
            give(&self.dev.counts.mr);
        }
        Ok(())
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // The handle is gone, so is the application's hold on the memory: no key may reach it.
        let _ = self.remove_key(true);
    }
}

impl Context {
    /// The access check of every local (L_Key) and remote (R_Key) memory access: the key must
    /// name a live region of this PD that holds `[addr, addr + len)` and grants `access`.
    pub fn check_access(
        &self,
        key: u32,
        pd: &Pd,
        addr: u64,
        len: u64,
        access: Access,
    ) -> std::result::Result<MemRef, AccessError> {
        check_access(&self.inner, key, pd.inner.handle, None, addr, len, access)
    }
}

/// The access check (see [`Context::check_access`]) by QP `qpn` (`None`: by no QP, which no
/// type 2 window grants).
pub(crate) fn check_access(
    dev: &DeviceInner,
    key: u32,
    pd_handle: u32,
    qpn: Option<u32>,
    addr: u64,
    len: u64,
    access: Access,
) -> std::result::Result<MemRef, AccessError> {
    let keys = dev.keys.read().unwrap_or_else(|e| e.into_inner());
    match keys.lookup(key).ok_or(AccessError::BadKey)? {
        KeyEntry::Mr(mr) => {
            if mr.pd.handle != pd_handle {
                return Err(AccessError::WrongPd);
            }
            // None: a Free fast-registration region (invalidated, or never registered).
            let rights = mr.rights().ok_or(AccessError::BadKey)?;
            let offset = mr.range_offset(addr, len).ok_or(AccessError::OutOfBounds)?;
            if !rights.contains(access) {
                return Err(AccessError::MissingRight);
            }
            Ok(mr.mem_ref(offset, len as usize))
        }
        KeyEntry::Mw(mw) => {
            // A window's R_Key is for remote access only.
            if access.is_empty() || !Access::REMOTE.contains(access) {
                return Err(AccessError::BadKey);
            }
            if mw.pd.handle != pd_handle {
                return Err(AccessError::WrongPd);
            }
            let state = mw.state.lock().unwrap_or_else(|e| e.into_inner());
            let b = state.binding.as_ref().ok_or(AccessError::BadKey)?;
            if mw.kind == MwType::Type2 && (qpn.is_none() || state.qp != qpn) {
                return Err(AccessError::BadKey); // bound to another QP (IBA 10.6.7.2)
            }
            let inside = addr.checked_sub(b.addr).and_then(|o| o.checked_add(len)).is_some_and(|end| end <= b.len);
            if !inside {
                return Err(AccessError::OutOfBounds);
            }
            if !b.access.contains(access) {
                return Err(AccessError::MissingRight);
            }
            if b.mr.revoked.load(Ordering::Acquire) {
                return Err(AccessError::BadKey);
            }
            let offset = b.mr.range_offset(addr, len).ok_or(AccessError::OutOfBounds)?;
            Ok(b.mr.mem_ref(offset, len as usize))
        }
    }
}

/// Executes a Fast Register work request of a QP of PD `pd_handle` (IBA 10.6.3's Fast
/// Registration): the region named by its current key must be a fast-registration region of
/// that PD and Free; its keys get the consumer's key byte (the one they have, too, as rxe's
/// `rxe_reg_fast_mr` takes it; a memory window's bind must change its key) and it becomes
/// Valid with the request's rights. Anything else fails the WQE with Local QP Operation Error,
/// as rxe completes a Register MR it refuses.
pub(crate) fn fast_reg(dev: &DeviceInner, pd_handle: u32, req: &FastRegRequest) -> std::result::Result<(), WcStatus> {
    let fail = Err(WcStatus::LocQpOpErr);
    if check_access_flags(req.access).is_err() {
        return fail;
    }
    let mut rng = dev.rng.lock().unwrap_or_else(|e| e.into_inner());
    let mut keys = dev.keys.write().unwrap_or_else(|e| e.into_inner());
    let Some(mr) = keys.mr(req.key).cloned() else { return fail };
    let Some(fast) = mr.fast.as_ref().filter(|_| mr.pd.handle == pd_handle) else { return fail };
    let mut st = fast.lock().unwrap_or_else(|e| e.into_inner());
    if st.valid {
        return fail;
    }
    let new_key = if u32::from(req.new_key) == req.key & 0xff {
        req.key
    } else {
        let Some(k) = keys.rekey(&mut *rng, req.key, Some(req.new_key)) else { return fail };
        k
    };
    mr.key.store(new_key, Ordering::Release);
    *st = FastReg { valid: true, access: req.access };
    dev.key_gen.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// Every fresh key of a slot differs from the slot's previous one, and slot 0 never gives
    /// key 0 (programs read an L_Key or R_Key of 0 as "none").
    #[test]
    fn fresh_keys_change_and_are_never_zero() {
        let mut t = KeyTable::default();
        t.slots.push(None);
        t.last_key_byte.push(0);
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let mut prev = 0;
        for _ in 0..100_000 {
            let key = t.fresh_byte(&mut rng, 0);
            assert!(key != 0 && key != prev);
            prev = key;
        }
    }
}
