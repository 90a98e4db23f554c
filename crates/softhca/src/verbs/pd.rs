//! Protection Domains: the scope in which keys, QPs and address handles meet.

use std::sync::Arc;

use super::device::{give, take, Context, DeviceInner};
use super::error::{Result, VerbsError};
use super::{Retire, Users};

pub(crate) struct PdInner {
    pub handle: u32,
    pub dev: Arc<DeviceInner>,
    /// MRs, QPs, AHs and SRQs created in this PD and not yet destroyed.
    users: Users,
}

impl PdInner {
    pub fn check(&self) -> Result<()> {
        self.dev.check_open()?;
        if self.users.gone() {
            return Err(VerbsError::InvalidPd);
        }
        Ok(())
    }

    /// Records one more object using this PD; fails if the PD was deallocated meanwhile.
    pub fn hold(&self) -> Result<()> {
        self.users.hold().then_some(()).ok_or(VerbsError::InvalidPd)
    }

    pub fn release(&self) {
        self.users.release();
    }
}

/// A protection domain (`ibv_pd`).
#[derive(Clone)]
pub struct Pd {
    pub(crate) inner: Arc<PdInner>,
}

impl std::fmt::Debug for Pd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pd").field("handle", &self.inner.handle).finish()
    }
}

impl PartialEq for Pd {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Context {
    /// Allocate Protection Domain.
    pub fn alloc_pd(&self) -> Result<Pd> {
        self.inner.check_open()?;
        take(&self.inner.counts.pd, self.inner.attr.max_pd)?;
        Ok(Pd {
            inner: Arc::new(PdInner {
                handle: self.inner.new_handle(),
                dev: self.inner.clone(),
                users: Users::default(),
            }),
        })
    }
}

impl Pd {
    pub fn handle(&self) -> u32 {
        self.inner.handle
    }

    pub fn context(&self) -> Context {
        Context { inner: self.inner.dev.clone() }
    }

    /// Deallocate Protection Domain; refused with `InUse` while an MR, QP, AH or SRQ still uses
    /// it.
    pub fn dealloc(&self) -> Result<()> {
        self.inner.check()?;
        match self.inner.users.retire() {
            Ok(()) => {}
            Err(Retire::Gone) => return Err(VerbsError::InvalidPd),
            Err(Retire::InUse) => return Err(VerbsError::InUse("protection domain has MRs, QPs or AHs")),
        }
        give(&self.inner.dev.counts.pd);
        Ok(())
    }
}
