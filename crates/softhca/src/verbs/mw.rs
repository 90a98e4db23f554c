//! Memory windows (type 1): a remote-access view of part of a registered region, bound and
//! re-bound by Bind MW work requests; its R_Key changes at every bind (WR-BIND).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::device::{give, DeviceInner};
use super::error::{Result, VerbsError};
use super::mr::{new_key, KeyEntry, MrInner};
use super::pd::{Pd, PdInner};
use super::types::{Access, WcStatus};
use crate::transport::wqe::BindRequest;

/// What a window currently grants.
pub(crate) struct Binding {
    pub mr: Arc<MrInner>,
    pub addr: u64,
    pub len: u64,
    pub access: Access,
}

pub(crate) struct MwState {
    pub key: u32,
    pub binding: Option<Binding>,
}

pub(crate) struct MwInner {
    pub pd: Arc<PdInner>,
    pub state: Mutex<MwState>,
    dealloced: AtomicBool,
}

/// A memory window (`ibv_mw`, type 1).
#[derive(Clone)]
pub struct Mw {
    pub(crate) inner: Arc<MwInner>,
    dev: Arc<DeviceInner>,
}

impl std::fmt::Debug for Mw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mw").field("rkey", &format_args!("{:#x}", self.rkey())).finish()
    }
}

impl Pd {
    /// Allocate Memory Window. It grants nothing until a Bind MW work request binds it.
    pub fn alloc_mw(&self) -> Result<Mw> {
        self.inner.check()?;
        let dev = &self.inner.dev;
        let inner = new_key(&self.inner, &dev.counts.mw, dev.attr.max_mw, |key| {
            let mw = Arc::new(MwInner {
                pd: self.inner.clone(),
                state: Mutex::new(MwState { key, binding: None }),
                dealloced: AtomicBool::new(false),
            });
            (KeyEntry::Mw(mw.clone()), mw)
        })?;
        Ok(Mw { inner, dev: dev.clone() })
    }
}

impl Mw {
    /// The window's current R_Key: a new one after every bind.
    pub fn rkey(&self) -> u32 {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner()).key
    }

    /// Deallocate Memory Window: its key stops working and its region is free again.
    pub fn dealloc(&self) -> Result<()> {
        self.dev.check_open()?;
        if self.inner.dealloced.swap(true, Ordering::AcqRel) {
            return Err(VerbsError::InvalidArgument("memory window already deallocated"));
        }
        // The key table before the window's state, as in check_access and bind.
        let mut keys = self.dev.keys.write().unwrap_or_else(|e| e.into_inner());
        let mut st = self.inner.state.lock().unwrap_or_else(|e| e.into_inner());
        keys.remove(st.key);
        drop(keys);
        self.dev.key_gen.fetch_add(1, Ordering::AcqRel);
        if let Some(b) = st.binding.take() {
            b.mr.windows.fetch_sub(1, Ordering::AcqRel);
        }
        drop(st);
        self.inner.pd.release();
        give(&self.dev.counts.mw);
        Ok(())
    }
}

/// Executes a bind for a QP of PD `pd_handle` (WR-BIND-2..5); a failure is Memory Window Bind
/// Error.
pub(crate) fn bind(dev: &DeviceInner, pd_handle: u32, b: &BindRequest) -> std::result::Result<(), WcStatus> {
    let fail = Err(WcStatus::MwBindErr);
    let Some(mw) = b.mw.downcast_ref::<MwInner>() else { return fail };
    if mw.dealloced.load(Ordering::Acquire) || mw.pd.handle != pd_handle {
        return fail;
    }
    let remote = Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC;
    if !remote.contains(b.access) {
        return fail; // WR-BIND-2: remote rights only
    }
    let mut rng = dev.rng.lock().unwrap_or_else(|e| e.into_inner());
    let mut keys = dev.keys.write().unwrap_or_else(|e| e.into_inner());
    let Some(mr) = keys.mr(b.mr_key).cloned() else { return fail };
    if mr.pd.handle != pd_handle || !mr.access.contains(Access::MW_BIND) {
        return fail;
    }
    if b.access.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC) && !mr.access.contains(Access::LOCAL_WRITE) {
        return fail; // WR-BIND-3, WR-BIND-4
    }
    if mr.range_offset(b.addr, b.length).is_none() {
        return fail; // WR-BIND-5
    }
    let mut st = mw.state.lock().unwrap_or_else(|e| e.into_inner());
    // A consumer that chooses its R_Keys (libibverbs) may post several binds before the first
    // runs: each names the key it gives, and only has to change it (checked by the rekey).
    if b.new_key.is_none() && st.key != b.rkey {
        return fail;
    }
    let Some(new_key) = keys.rekey(&mut *rng, st.key, b.new_key) else { return fail };
    dev.key_gen.fetch_add(1, Ordering::AcqRel);
    st.key = new_key;
    mr.windows.fetch_add(1, Ordering::AcqRel);
    if let Some(old) = st.binding.replace(Binding { mr: mr.clone(), addr: b.addr, len: b.length, access: b.access }) {
        old.mr.windows.fetch_sub(1, Ordering::AcqRel);
    }
    Ok(())
}
