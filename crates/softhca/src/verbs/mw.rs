//! Memory windows: a remote-access view of part of a registered region, bound by Bind MW work
//! requests; its R_Key changes at every bind (WR-BIND). Type 1 windows are rebound at will;
//! a type 2 window is bound to the QP that bound it, which alone may use its R_Key, until a
//! Local Invalidate or an inbound Send with Invalidate frees it (IBA 10.6.7, [`MwType`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::device::{give, DeviceInner};
use super::error::{Result, VerbsError};
use super::mr::{new_key, KeyEntry, MrInner};
use super::pd::{Pd, PdInner};
use super::types::{Access, MwType, WcStatus};
use crate::transport::hca::InvalidateError;
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
    /// Type 2: the QP the window is bound to, while it is.
    pub qp: Option<u32>,
}

pub(crate) struct MwInner {
    pub pd: Arc<PdInner>,
    pub kind: MwType,
    pub state: Mutex<MwState>,
    dealloced: AtomicBool,
}

/// A memory window (`ibv_mw`).
#[derive(Clone)]
pub struct Mw {
    pub(crate) inner: Arc<MwInner>,
    dev: Arc<DeviceInner>,
    /// Deallocates the window with its last handle (see [`super::LastHandle`]).
    _last: Arc<super::LastHandle>,
}

impl std::fmt::Debug for Mw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mw").field("rkey", &format_args!("{:#x}", self.rkey())).finish()
    }
}

impl Pd {
    /// Allocate Memory Window (type 1). It grants nothing until a Bind MW work request binds it.
    pub fn alloc_mw(&self) -> Result<Mw> {
        self.alloc_mw_of(MwType::Type1)
    }

    /// Allocate Memory Window of type `kind`.
    pub fn alloc_mw_of(&self, kind: MwType) -> Result<Mw> {
        self.inner.check()?;
        let dev = &self.inner.dev;
        let inner = new_key(&self.inner, &dev.counts.mw, dev.attr.max_mw, |key| {
            let mw = Arc::new(MwInner {
                pd: self.inner.clone(),
                kind,
                state: Mutex::new(MwState { key, binding: None, qp: None }),
                dealloced: AtomicBool::new(false),
            });
            (KeyEntry::Mw(mw.clone()), mw)
        })?;
        let (held, held_dev) = (inner.clone(), dev.clone());
        let _last = super::LastHandle::new(move || {
            let _ = release(&held, &held_dev);
        });
        Ok(Mw { inner, dev: dev.clone(), _last })
    }
}

impl Mw {
    pub fn mw_type(&self) -> MwType {
        self.inner.kind
    }

    /// The window's current R_Key: a new one after every bind.
    pub fn rkey(&self) -> u32 {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner()).key
    }

    /// Deallocate Memory Window: its key stops working and its region is free again.
    pub fn dealloc(&self) -> Result<()> {
        self.dev.check_open()?;
        release(&self.inner, &self.dev)
    }
}

/// Deallocate Memory Window on an open device, or with the window's last handle on any.
fn release(mw: &MwInner, dev: &DeviceInner) -> Result<()> {
    if mw.dealloced.swap(true, Ordering::AcqRel) {
        return Err(VerbsError::InvalidArgument("memory window already deallocated"));
    }
    // The key table before the window's state, as in check_access and bind.
    let mut keys = dev.keys.write().unwrap_or_else(|e| e.into_inner());
    let mut st = mw.state.lock().unwrap_or_else(|e| e.into_inner());
    keys.remove(st.key);
    drop(keys);
    dev.key_gen.fetch_add(1, Ordering::AcqRel);
    if let Some(b) = st.binding.take() {
        b.mr.windows.fetch_sub(1, Ordering::AcqRel);
    }
    drop(st);
    mw.pd.release();
    give(&dev.counts.mw);
    Ok(())
}

/// Executes a bind for QP `qpn` of PD `pd_handle` (WR-BIND-2..5); a failure is Memory Window
/// Bind Error. A type 2 window must be free (invalidated since its last bind) and is then bound
/// to `qpn`; it cannot be bound with zero length (that would be an unbind, which a type 2
/// window does by invalidation). A type 1 window bound with zero length is unbound (IBA
/// 10.6.7, rxe's `rxe_do_bind_mw`): a new R_Key, no region, whatever region the request
/// names.
pub(crate) fn bind(dev: &DeviceInner, pd_handle: u32, qpn: u32, b: &BindRequest) -> std::result::Result<(), WcStatus> {
    let fail = Err(WcStatus::MwBindErr);
    let Some(mw) = b.mw.downcast_ref::<MwInner>() else { return fail };
    if mw.dealloced.load(Ordering::Acquire) || mw.pd.handle != pd_handle {
        return fail;
    }
    if !Access::REMOTE.contains(b.access) {
        return fail; // WR-BIND-2: remote rights only
    }
    let mut rng = dev.rng.lock().unwrap_or_else(|e| e.into_inner());
    let mut keys = dev.keys.write().unwrap_or_else(|e| e.into_inner());
    let unbind = b.length == 0 && mw.kind == MwType::Type1;
    let mr = if unbind {
        None
    } else {
        let Some(mr) = keys.mr(b.mr_key).cloned() else { return fail };
        // A fast-registration region's rights are its Fast Register's; a Free one has none.
        let rights = mr.rights().unwrap_or(Access::empty());
        if mr.pd.handle != pd_handle || !rights.contains(Access::MW_BIND) {
            return fail;
        }
        if b.access.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC) && !rights.contains(Access::LOCAL_WRITE) {
            return fail; // WR-BIND-3, WR-BIND-4
        }
        if mr.range_offset(b.addr, b.length).is_none() {
            return fail; // WR-BIND-5
        }
        Some(mr)
    };
    let mut st = mw.state.lock().unwrap_or_else(|e| e.into_inner());
    if mw.kind == MwType::Type2 && (st.binding.is_some() || b.length == 0) {
        return fail;
    }
    // A consumer that chooses its R_Keys (libibverbs) may post several binds before the first
    // runs: each names the key it gives, and only has to change it (checked by the rekey).
    if b.new_key.is_none() && st.key != b.rkey {
        return fail;
    }
    let Some(new_key) = keys.rekey(&mut *rng, st.key, b.new_key) else { return fail };
    dev.key_gen.fetch_add(1, Ordering::AcqRel);
    st.key = new_key;
    st.qp = (mw.kind == MwType::Type2).then_some(qpn);
    let binding = mr.map(|mr| {
        mr.windows.fetch_add(1, Ordering::AcqRel);
        Binding { mr, addr: b.addr, len: b.length, access: b.access }
    });
    if let Some(old) = std::mem::replace(&mut st.binding, binding) {
        old.mr.windows.fetch_sub(1, Ordering::AcqRel);
    }
    Ok(())
}

/// Invalidates `rkey` for QP `qpn` of PD `pd_handle`: a type 2 window of that PD bound to that
/// QP, or a valid fast-registration region of that PD (a region registered by Register Memory
/// Region cannot be, nor can a type 1 window). The window or region keeps its key and is free
/// to be bound or registered again, which changes it. With `apply` false nothing changes: the
/// answer is whether it could be invalidated now.
pub(crate) fn invalidate(
    dev: &DeviceInner,
    pd_handle: u32,
    qpn: u32,
    rkey: u32,
    apply: bool,
) -> std::result::Result<(), InvalidateError> {
    let keys = dev.keys.read().unwrap_or_else(|e| e.into_inner());
    let mw = match keys.lookup(rkey) {
        Some(KeyEntry::Mw(mw)) if mw.pd.handle == pd_handle => mw.clone(),
        Some(KeyEntry::Mr(mr)) if mr.pd.handle == pd_handle => {
            // A valid fast-registration region becomes Free; any other region cannot be.
            let mut st =
                mr.fast.as_ref().ok_or(InvalidateError::NotInvalidatable)?.lock().unwrap_or_else(|e| e.into_inner());
            if !st.valid {
                return Err(InvalidateError::NotInvalidatable);
            }
            if !apply {
                return Ok(());
            }
            st.valid = false;
            drop(st);
            drop(keys);
            dev.key_gen.fetch_add(1, Ordering::AcqRel);
            return Ok(());
        }
        _ => return Err(InvalidateError::BadKey),
    };
    let mut st = mw.state.lock().unwrap_or_else(|e| e.into_inner());
    if mw.kind != MwType::Type2 || st.qp != Some(qpn) {
        return Err(InvalidateError::NotInvalidatable);
    }
    if !apply {
        return Ok(());
    }
    if let Some(b) = st.binding.take() {
        b.mr.windows.fetch_sub(1, Ordering::AcqRel);
    }
    st.qp = None;
    drop(st);
    drop(keys);
    dev.key_gen.fetch_add(1, Ordering::AcqRel);
    Ok(())
}
